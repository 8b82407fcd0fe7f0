"""Loaders of a SentencePiece tokenizer.model, an HF tokenizer.json and a named tiktoken encoding."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from gptrain.data.gpt2_bpe import ENDOFTEXT
from gptrain.data.tokenizer_paths import file_stamp, hub_name_line, missing_tokenizer_file
from gptrain.data.tokenizer_wrappers import (
    EOS_CANDIDATES,
    HFTokenizer,
    SentencePieceTokenizer,
    TiktokenTokenizer,
    Tokenizer,
)
from gptrain.errors import DataError
from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import NO_PAD, hub_name_advice

# Megatron's SentencePieceTokenizer adds these (those the model lacks get the next ids), then the
# model's pad, bos and eos pieces (named so when the model has none).
MEGATRON_SP_SPECIALS = ("<CLS>", "<SEP>", "<EOD>", "<MASK>")


def load_sentencepiece(model: str, kind: str) -> Tokenizer:
    """A SentencePiece `tokenizer.model` as Megatron's `kind` wrapper encodes it (cached as load_gpt2_bpe)."""
    return _load_sentencepiece(model, kind, file_stamp(model))


@functools.lru_cache(maxsize=4)
def _load_sentencepiece(model: str, kind: str, *_stamps: object) -> Tokenizer:
    path = Path(model)
    if (problem := missing_tokenizer_file(model)) is not None:
        raise DataError(
            hub_name_line(model, "pass DIR/tokenizer.model")
            or f"tokenizer model {problem} (pass --tokenizer-model path/to/tokenizer.model)"
        )
    try:
        import sentencepiece
    except ImportError:
        raise DataError(
            f"{model}: SentencePiece tokenizers need the sentencepiece package: pip install sentencepiece"
        ) from None
    processor = sentencepiece.SentencePieceProcessor()
    try:  # from bytes: a path it cannot encode is no concern of the library's
        processor.LoadFromSerializedProto(path.read_bytes())
    except (RuntimeError, OSError) as error:  # the library's text names its own source line only
        reason = error.strerror if isinstance(error, OSError) else "its bytes do not parse as a model"
        raise DataError(f"{model}: not a SentencePiece tokenizer.model ({reason})") from None
    pieces = processor.get_piece_size()
    if pieces == 0:
        raise DataError(f"{model}: not a SentencePiece tokenizer.model (it holds no pieces)")
    eos = processor.eos_id() if processor.eos_id() >= 0 else None
    if kind == "gptsentencepiece":
        return SentencePieceTokenizer(processor, model, eos, pieces)
    if kind == "llama2":
        if processor.bos_id() < 0:
            raise DataError(
                f"{model}: the SentencePiece model has no beginning-of-sentence piece (bos_id=-1), which "
                "Llama2Tokenizer puts before every text; use GPTSentencePieceTokenizer"
            )
        return SentencePieceTokenizer(processor, model, eos, pieces, bos=processor.bos_id())
    vocab, specials = _megatron_specials(processor)
    return SentencePieceTokenizer(processor, model, specials["<EOD>"], len(vocab), specials=specials)


def _megatron_specials(processor: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Megatron SentencePieceTokenizer's vocabulary and special tokens, in the order it adds them."""
    count = processor.get_piece_size()
    vocab = {processor.id_to_piece(i): i for i in range(count)}
    specials: dict[str, int] = {}
    named = ((processor.pad_id(), "<PAD>"), (processor.bos_id(), "<BOS>"), (processor.eos_id(), "<EOS>"))
    for token in (
        *MEGATRON_SP_SPECIALS,
        *(processor.id_to_piece(i) if 0 <= i < count else n for i, n in named),
    ):
        vocab.setdefault(token, len(vocab))
        specials[token] = vocab[token]
    return vocab, specials


def config_value(directory: Path, key: str) -> Any:
    """`key` of the tokenizer_config.json in `directory` (None when it or the file is absent)."""
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text(encoding="utf-8")).get(key)
    except (ValueError, AttributeError) as error:
        raise DataError(f"{config}: not a JSON object ({error})") from None


def _json_object(file: Path) -> dict[str, Any]:
    """The JSON object in `file` ({} when absent); one line naming the file when it is not one."""
    if not file.is_file():
        return {}
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:
        raise DataError(f"{file}: not a JSON object ({error})") from None
    if not isinstance(value, dict):
        raise DataError(f"{file}: not a JSON object (it holds a {type(value).__name__})")
    return value


def special_token(directory: Path, key: str) -> tuple[str | None, Path]:
    """`key` (eos_token, pad_token) as AutoTokenizer reads it, and the file that names it: a
    special_tokens_map.json's value overrides tokenizer_config.json's unless that file has
    added_tokens_decoder (transformers then reads no special_tokens_map.json); {"content": ...}
    gives its content."""
    config_file = directory / "tokenizer_config.json"
    config = _json_object(config_file)
    source, value = config_file, config.get(key)
    if "added_tokens_decoder" not in config:
        legacy_file = directory / "special_tokens_map.json"
        legacy = _json_object(legacy_file)
        if key in legacy:
            source, value = legacy_file, legacy[key]
    value = value.get("content") if isinstance(value, dict) else value
    return (value if isinstance(value, str) and value else None), source


SAME_IDS_SLOW_CLASSES = ("GPT2Tokenizer", "PreTrainedTokenizer")
"""transformers' slow tokenizer classes that encode as gptrain reads the tokenizer.json: GPT-2's
(the same byte-level BPE, split and <|endoftext|>: checked against transformers 4.46 on GPT-2's
vocabulary; like the fast class, it takes add_prefix_space from tokenizer_config.json, false when
absent, which load_huggingface applies, so a tokenizer.json that disagrees is not read as it is),
and PreTrainedTokenizerFast's, which has no slow class (AutoTokenizer loads it fast)."""

BYTE_LEVEL_CLASSES = ("GPT2Tokenizer", "GPTNeoXTokenizer")
"""Tokenizer classes (_class_name: tokenizer_config.json's, else config.json's) for which transformers 4
and 5 set the ByteLevel pre-tokenizer's add_prefix_space to tokenizer_config.json's, false when absent,
whatever tokenizer.json says (PreTrainedTokenizerFast keeps tokenizer.json's: checked on 5.24)."""


_GPT2_MODEL_TYPES = (
    *("blip-2", "codegen", "dbrx", "emu3", "gpt2", "gpt_neo", "gptj", "hyperclovax_vision_v2"),
    *("instructblip", "instructblipvideo", "jais2", "opt", "phi", "starcoder2"),
)
_NEOX_MODEL_TYPES = ("falcon_mamba", "gpt_neox", "mamba", "mamba2", "mpt", "olmo", "olmoe", "rwkv", "xlstm")
MODEL_TYPE_CLASSES = {
    **dict.fromkeys(_GPT2_MODEL_TYPES, "GPT2Tokenizer"),
    **dict.fromkeys(_NEOX_MODEL_TYPES, "GPTNeoXTokenizer"),
}
"""config.json model types whose tokenizer class has rules here (BYTE_LEVEL_CLASSES), as transformers
5.24's TOKENIZER_MAPPING_NAMES names them (4.x maps phi and codegen to CodeGenTokenizer); the four of gpt2,
gpt_neo, gptj and gpt_neox alone left OPT, MPT, OLMo, ... encoded otherwise than AutoTokenizer. A table,
not the installed transformers' mapping: importing it imports torch, in every data-prepare worker."""


def _class_name(config: dict[str, Any], directory: Path) -> str:
    """The class AutoTokenizer (transformers 4 and 5) builds for the tokenizer in `directory`,
    without its Fast: tokenizer_config.json's (`config`) tokenizer_class; where it names none,
    config.json's tokenizer_class, else its model_type's class (MODEL_TYPE_CLASSES; "" for others).
    A config.json that does not read as a JSON object names none."""
    name = config.get("tokenizer_class")
    if not isinstance(name, str) or not name:
        try:
            model = _json_object(directory / "config.json")
        except DataError:
            model = {}
        name, model_type = model.get("tokenizer_class"), model.get("model_type")
        if (not isinstance(name, str) or not name) and isinstance(model_type, str):
            name = MODEL_TYPE_CLASSES.get(model_type)
    return name.removesuffix("Fast") if isinstance(name, str) else ""


def _apply_class_settings(tokenizer: Any, directory: Path) -> None:
    """What AutoTokenizer's class does to tokenizer.json where transformers 4 and 5 agree:
    add_prefix_space on a ByteLevel pre-tokenizer (BYTE_LEVEL_CLASSES), and GPTNeoXTokenizer's
    post-processor rebuilt from add_bos_token/add_eos_token, which 5 reads as false (a template's
    bos is dropped; class_setting_note names the keys 4 would honour)."""
    from tokenizers import pre_tokenizers, processors

    config = _json_object(directory / "tokenizer_config.json")
    name = _class_name(config, directory)
    if name in BYTE_LEVEL_CLASSES and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.ByteLevel):
        tokenizer.pre_tokenizer.add_prefix_space = config.get("add_prefix_space") is True
    if name == "GPTNeoXTokenizer":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)


def class_setting_note(model: str) -> str | None:
    """One line where tokenizer_config.json's class would have transformers encode otherwise than
    gptrain (as transformers 5.24 does) and the version Megatron runs decides: None elsewhere."""
    path = Path(model)
    if not (path.is_dir() or path.is_file()):
        return None  # load_huggingface names it
    file = path / "tokenizer_config.json" if path.is_dir() else path.parent / "tokenizer_config.json"
    try:
        config = _json_object(file)
    except DataError:
        return None  # load_huggingface names it
    name = _class_name(config, file.parent)
    keys = [k for k in ("add_bos_token", "add_eos_token") if config.get(k) is True]
    if name == "GPTNeoXTokenizer" and keys:
        return (
            f"note: {file}: {' and '.join(keys)} true with tokenizer_class {name}: transformers 5 (and "
            "gptrain) adds no bos/eos for this class, transformers 4 adds them: if Megatron runs on 4, "
            "its ids have them and these do not"
        )
    return None


def slow_class_that_differs(model: str) -> str | None:
    """The slow class transformers 4's AutoTokenizer(use_fast=False) builds for the tokenizer at
    `model` (its tokenizer_config.json's tokenizer_class), when its ids may differ from
    tokenizer.json's; None when they are the same (transformers 5 ignores use_fast). A class named
    `...Fast` there is loaded as named whatever use_fast says, so it reads the same tokenizer.json."""
    path = Path(model)
    config = (path if path.is_dir() else path.parent) / "tokenizer_config.json"
    try:
        name = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        name = None
    if not isinstance(name, str) or not name:
        return f"the model type's slow tokenizer ({config} names no tokenizer_class)"
    if name.endswith("Fast"):
        return None
    return None if name in SAME_IDS_SLOW_CLASSES else name


def _megatron_hint(data: bytes) -> str:
    """What a JSON list given as a tokenizer.json is: Megatron's tiktoken vocabulary, which the
    type (implied HuggingFaceTokenizer where --tokenizer-type is absent) must name."""
    if data.lstrip()[:1] != b"[":
        return ""
    return "; a JSON list is Megatron's tiktoken vocabulary: pass --tokenizer-type TikTokenizer"


def load_huggingface(model: str) -> Tokenizer:
    """A `tokenizer.json` file (or a directory holding one, plus tokenizer_config.json)."""
    if (problem := missing_tokenizer_file(model, "tokenizer.json")) is not None:
        raise DataError(
            hub_name_line(model)
            or f"tokenizer model {problem} (pass --tokenizer-model path/to/tokenizer.json)"
        )
    path = Path(model)
    file = path / "tokenizer.json" if path.is_dir() else path
    from tokenizers import Tokenizer

    data = file.read_bytes()
    try:
        tokenizer = Tokenizer.from_buffer(data)  # from_file takes UTF-8 paths only
    except Exception as error:
        raise DataError(
            f"{file}: not a Hugging Face tokenizer.json ({error}){_megatron_hint(data)}"
        ) from None
    # as transformers' tokenizer(text) (Megatron's call) encodes: a truncation or padding the file carries
    # (BERT-style files often save max_length 512) would cut or pad every document
    tokenizer.no_truncation()
    tokenizer.no_padding()
    # as AutoTokenizer (and so Megatron's HuggingFaceTokenizer) reads it: a literal special token's text
    # stays text (what gptrain's export of a legacy GPT-2 or a SentencePiece run writes)
    tokenizer.encode_special_tokens = config_value(file.parent, "split_special_tokens") is True
    _apply_class_settings(tokenizer, file.parent)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    eos, eos_file = special_token(file.parent, "eos_token")
    candidates = [eos] if eos else [c for c in EOS_CANDIDATES if c in vocab]
    eod = vocab.get(candidates[0]) if candidates else None
    no_eod = _eos_not_held(file, eos, eos_file) if eos and eod is None else None
    return HFTokenizer(tokenizer, eod, str(file), no_eod, _pad_from_config(file.parent, vocab))


def _pad_from_config(directory: Path, vocab: dict[str, int]) -> int:
    """The pad_token's id (special_token), which Megatron's GPT dataset masks in the loss (its HF
    tokenizer's pad, core 0.15 on); -1 (none) without one, or for one tokenizer.json does not hold
    (transformers would add it as a new id, which no data holds)."""
    pad, _ = special_token(directory, "pad_token")
    return vocab.get(pad, NO_PAD) if pad is not None else NO_PAD


def _eos_not_held(file: Path, eos: str, source: Path) -> str:
    """Why the eos_token (named in `source`) gives no id: tokenizer.json does not hold it."""
    return (
        f"{source}: its eos_token {eos!r} is not a token of {file} (transformers "
        "would add it as a new id; gptrain reads tokenizer.json as it is): add it to tokenizer.json's "
        "added_tokens, or name one of its tokens as eos_token"
    )


def _not_an_encoding(name: str, known: str) -> str:
    """Why `name` is no tiktoken encoding: a directory there is neither an encoding nor Megatron's
    vocabulary file (which is_vocabulary_file sends to its own reader)."""
    if look_up(name).kind in ("missing", "unreachable"):
        hub = hub_name_advice(name)
        return f"unknown tiktoken encoding {name!r} for --tokenizer-model (known: {known})" + (
            f"; {hub}" if hub else ""
        )
    return (
        f"tokenizer model {name} is a directory; TikTokenizer takes Megatron's tiktoken vocabulary file "
        f"(path/to/tokenizer.json) or a tiktoken encoding name ({known})"
    )


def load_tiktoken(name: str) -> Tokenizer:
    """A named tiktoken encoding (e.g. cl100k_base); needs network or TIKTOKEN_CACHE_DIR."""
    import tiktoken

    if name not in tiktoken.list_encoding_names():
        raise DataError(_not_an_encoding(name, ", ".join(tiktoken.list_encoding_names())))
    try:
        encoding = tiktoken.get_encoding(name)
    except Exception as error:
        message = re.sub(r"\s+", " ", str(error))[:200]
        raise DataError(
            f"cannot load tiktoken encoding {name!r} ({type(error).__name__}: {message}); "
            "offline, put its file in TIKTOKEN_CACHE_DIR"
        ) from None
    if ENDOFTEXT not in encoding.special_tokens_set:
        raise DataError(f"tiktoken encoding {name!r} has no {ENDOFTEXT} token to end documents")
    return TiktokenTokenizer(encoding, encoding.eot_token, encoding.n_vocab, frozenset({ENDOFTEXT}))
