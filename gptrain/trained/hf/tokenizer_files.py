"""The tokenizer files that travel with a converted model, both directions (no torch).

Export: GPT-2 BPE runs ship their vocab.json + merges.txt, the same as a
tokenizer.json, and a tokenizer_config.json naming `GPT2Tokenizer` and `<|endoftext|>` (runs on a
tiktoken encoding with GPT-2's split, gpt2 or r50k_base, ship the same files made from its ranks); Hugging
Face tokenizer runs ship their tokenizer.json; SentencePiece runs a tokenizer.json written from their
tokenizer.model (sentencepiece_json.py) beside it (and its tokenizer_config.json /
special_tokens_map.json when present, else a tokenizer_config.json naming
PreTrainedTokenizerFast and the special tokens); every tokenizer_config.json written declares the
model's context as model_max_length. Import copies them into the
run directory and returns the `model.tokenizer.*` values that point at the copies: tokenizer.json
when the model has one, unless it is exactly the GPT-2 BPE of its vocab.json + merges.txt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gptrain.data.gpt2_bpe import ENDOFTEXT, gpt2_tokenizer_json
from gptrain.data.tokenizers import SENTENCEPIECE_KINDS, canonical_type
from gptrain.errors import DataError
from gptrain.trained.hf.sentencepiece_json import sentencepiece_problem, write_sentencepiece_files
from gptrain.trained.hf.tiktoken_bpe import write_gpt2_bpe

HF_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")
# transformers' files for chat templates (save_pretrained writes them instead of the config's key)
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
# what decides a tokenizer.json's ids and decoded text
ENCODING_KEYS = ("normalizer", "pre_tokenizer", "model", "added_tokens", "post_processor", "decoder")


def export_tokenizer(
    cfg: Any,
    output: Path,
    context: int,
    token_ids: dict[str, int | None] | None = None,
    tokenizer: Any | None = None,
) -> list[str]:
    """Copy the run's tokenizer files into `output`; the names written (empty for mock data, and
    for a tiktoken `tokenizer` other than GPT-2's split, which has no files transformers reads).
    `context`: the model's longest sequence, a written tokenizer_config.json's model_max_length (an
    imported model's context, not its shorter training samples). `token_ids`: the configs'
    bos/eos/pad ids, declared in a tokenizer_config.json written for a tokenizer.json that comes
    without one."""
    tok = cfg.model.tokenizer
    kind = canonical_type(tok.type)
    if kind == "gpt2" and tok.vocab_file and tok.merge_file:
        shutil.copyfile(tok.vocab_file, output / "vocab.json")
        shutil.copyfile(tok.merge_file, output / "merges.txt")
        return _gpt2_files(output, context, Path(tok.vocab_file).parent, legacy=bool(tok.legacy))
    if kind == "tiktoken" and tokenizer is not None and write_gpt2_bpe(tokenizer, output):
        return _gpt2_files(output, context, None)
    if kind in SENTENCEPIECE_KINDS and tokenizer is not None and sentencepiece_problem(tokenizer) is None:
        return write_sentencepiece_files(tokenizer, kind, output, context, token_ids or {})
    if kind == "huggingface" and tok.model:
        source = Path(tok.model)
        file = source / "tokenizer.json" if source.is_dir() else source
        shutil.copyfile(file, output / "tokenizer.json")
        extras = [name for name in HF_EXTRAS if (file.parent / name).is_file()]
        for name in extras:
            shutil.copyfile(file.parent / name, output / name)
        if "tokenizer_config.json" in extras:
            declare_context(file.parent / "tokenizer_config.json", output / "tokenizer_config.json", context)
        else:
            config = fast_tokenizer_config(file, context, token_ids or {})
            (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
            extras.append("tokenizer_config.json")
        return ["tokenizer.json", *extras, *copy_chat_templates(file.parent, output)]
    return []


def _gpt2_files(output: Path, context: int, source: Path | None, legacy: bool = False) -> list[str]:
    """tokenizer.json and tokenizer_config.json beside the vocab.json + merges.txt in `output`, the
    chat templates of `source` (the run's tokenizer directory) copied; the names written. `legacy`
    (Megatron's --legacy-tokenizer): the run kept a literal <|endoftext|> in text as text, so
    split_special_tokens tells AutoTokenizer to (its fast classes read it since mid-2024), where it
    gave 50256, and tokenizer.json holds the merges that run read (legacy_merges_note)."""
    # tokenizer.json too: transformers' AutoTokenizer then needs no slow-to-fast conversion
    vocab_file, merge_file = str(output / "vocab.json"), str(output / "merges.txt")
    (output / "tokenizer.json").write_text(gpt2_tokenizer_json(vocab_file, merge_file, legacy))
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": ENDOFTEXT,
        "eos_token": ENDOFTEXT,
        "unk_token": ENDOFTEXT,
        "add_prefix_space": False,
        "model_max_length": context,
        **({"split_special_tokens": True} if legacy else {}),
        **(inline_chat_template(source) if source else {}),
    }
    (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    templates = copy_chat_templates(source, output) if source else []
    return ["vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", *templates]


def declare_context(source: Path, copy: Path, context: int) -> None:
    """Set the `copy` of tokenizer_config.json `source` to declare the model's context as its
    model_max_length: the one of the model the tokenizer came from (Llama 3's 131072 beside a GPT-2
    of 2048 positions) let `truncation=True` pass sequences the position table has no rows for."""
    try:
        config = json.loads(source.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{source}: not JSON ({error}); fix it or remove it") from None
    if isinstance(config, dict) and config.get("model_max_length") != context:
        config["model_max_length"] = context
        copy.write_text(json.dumps(config, indent=2) + "\n")


def tokenizer_directory(cfg: Any) -> Path | None:
    """The directory of the run's tokenizer files (None for mock data and tiktoken)."""
    tok = cfg.model.tokenizer
    kind = canonical_type(tok.type)
    if kind == "gpt2" and tok.vocab_file:
        return Path(tok.vocab_file).parent
    if kind == "huggingface" and tok.model:
        return Path(tok.model) if Path(tok.model).is_dir() else Path(tok.model).parent
    return None


def add_source_chat_templates(output: Path, tokenizer_dir: Path, source: Path) -> bool:
    """The chat templates of `source`, the directory a run was imported from, added to the export
    in `output` when the run's tokenizer copy has none (imports before they were copied) and
    `source` still holds that tokenizer, byte for byte; whether any were added."""
    if has_chat_template(tokenizer_dir) or not source.is_dir() or not has_chat_template(source):
        return False
    names = [
        name for name in ("tokenizer.json", "vocab.json", "merges.txt") if (tokenizer_dir / name).is_file()
    ]
    if not names or any(
        not (source / name).is_file() or (source / name).read_bytes() != (tokenizer_dir / name).read_bytes()
        for name in names
    ):
        return False
    copy_chat_templates(source, output)
    if inline := inline_chat_template(source):
        path = output / "tokenizer_config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**config, **inline}, indent=2) + "\n")
    return True


def has_chat_template(directory: Path) -> bool:
    return bool(
        inline_chat_template(directory)
        or (directory / CHAT_TEMPLATE_FILE).is_file()
        or any((directory / CHAT_TEMPLATE_DIR).glob("*.jinja"))
    )


def copy_chat_templates(source: Path, output: Path) -> list[str]:
    """Copy `source`'s chat_template.jinja and additional_chat_templates/*.jinja into `output`; the
    names copied. AutoTokenizer reads these files over tokenizer_config.json's chat_template."""
    names = [CHAT_TEMPLATE_FILE] if (source / CHAT_TEMPLATE_FILE).is_file() else []
    named = [p for p in sorted((source / CHAT_TEMPLATE_DIR).glob("*.jinja")) if p.is_file()]
    if named:
        (output / CHAT_TEMPLATE_DIR).mkdir(exist_ok=True)
        names += [f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in named]
    for name in names:
        shutil.copyfile(source / name, output / name)
    return names


def inline_chat_template(directory: Path) -> dict[str, Any]:
    """{"chat_template": ...} of the tokenizer_config.json in `directory` ({} when it has none): what a
    tokenizer_config.json written anew for GPT-2 BPE keeps of the model's own."""
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: not JSON ({error}); fix it or remove it") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    return {"chat_template": template} if template else {}


def fast_tokenizer_config(tokenizer_json: Path, context: int, token_ids: dict[str, int | None]) -> dict:
    """tokenizer_config.json for a bare tokenizer.json: without one, AutoTokenizer takes the model
    type's class (GPT2Tokenizer for GPT-2), which replaces the file's pre-tokenizer and decoder
    with GPT-2's byte level and encodes other ids; PreTrainedTokenizerFast loads it as it is.
    An id given as a list (Llama 3's several end tokens in config.json) names its first token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context}
    for name in ("bos", "eos", "pad"):
        token_id = token_ids.get(f"{name}_token_id")
        if isinstance(token_id, list):
            token_id = token_id[0] if token_id else None
        token = tokenizer.id_to_token(token_id) if token_id is not None else None
        if token is not None:
            config[f"{name}_token"] = token
    return config


def import_tokenizer(hf_dir: Path, run_tokenizer_dir: Path, final_dir: Path) -> dict[str, Any] | None:
    """Copy `hf_dir`'s tokenizer into `run_tokenizer_dir`; `model.tokenizer` values naming `final_dir`.

    tokenizer.json is the model's tokenizer as transformers loads it, so it is taken
    (HuggingFaceTokenizer) unless it is exactly GPT-2 BPE of the vocab.json + merges.txt beside
    it: then those two are taken (GPT2BPETokenizer), gptrain's fast path and the files Megatron's
    --vocab-file/--merge-file read, legacy where tokenizer_config.json splits special tokens.
    vocab.json + merges.txt alone are GPT-2 BPE; None when the directory has neither.
    """
    has_bpe = (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file()
    has_json = (hf_dir / "tokenizer.json").is_file()
    if has_bpe and (not has_json or is_gpt2_bpe(hf_dir / "tokenizer.json", hf_dir)):
        run_tokenizer_dir.mkdir(parents=True, exist_ok=True)
        for name in ("vocab.json", "merges.txt", *HF_EXTRAS):  # the config: its chat template
            if (hf_dir / name).is_file():
                shutil.copyfile(hf_dir / name, run_tokenizer_dir / name)
        copy_chat_templates(hf_dir, run_tokenizer_dir)
        return {
            "type": "GPT2BPETokenizer",
            "vocab_file": str(final_dir / "vocab.json"),
            "merge_file": str(final_dir / "merges.txt"),
            "model": None,
            "legacy": _splits_special_tokens(hf_dir),
        }
    if has_json:
        run_tokenizer_dir.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", *HF_EXTRAS):
            if (hf_dir / name).is_file():
                shutil.copyfile(hf_dir / name, run_tokenizer_dir / name)
        copy_chat_templates(hf_dir, run_tokenizer_dir)
        return {
            "type": "HuggingFaceTokenizer",
            "vocab_file": None,
            "merge_file": None,
            "model": str(final_dir),
        }
    return None


def _splits_special_tokens(hf_dir: Path) -> bool:
    """Whether tokenizer_config.json says split_special_tokens: true: AutoTokenizer then keeps a
    literal <|endoftext|> as text, as Megatron's legacy GPT-2 BPE does (what gptrain's export of a
    --legacy-tokenizer run writes), so GPT-2's files are taken with model.tokenizer.legacy."""
    from gptrain.data.tokenizer_loaders import config_value

    return config_value(hf_dir, "split_special_tokens") is True


def is_gpt2_bpe(tokenizer_json: Path, bpe_dir: Path) -> bool:
    """Whether `tokenizer_json` encodes and decodes as GPT-2 BPE of bpe_dir's vocab.json + merges.txt.

    Both are read by the `tokenizers` library and compared on what decides ids and decoded text
    (normalizer, pre-tokenizer, BPE model, added tokens, post-processor, decoder); settings that
    only move offsets, and spellings of "nothing" (a ByteLevel post-processor, "" or null
    affixes), are set aside. Any other difference (a Digits pre-tokenizer, another merge, a BOS
    template) means False.
    """
    from tokenizers import Tokenizer

    try:
        theirs = json.loads(Tokenizer.from_file(str(tokenizer_json)).to_str())
        ours = json.loads(gpt2_tokenizer_json(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt")))
    except Exception:  # an unreadable file: tokenizer.json is taken, and loading it says what is wrong
        return False
    return _encoding_parts(theirs) == _encoding_parts(ours)


def _encoding_parts(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The parts of a tokenizer.json that decide ids and decoded text, in one spelling."""
    parts = {key: tokenizer.get(key) for key in ENCODING_KEYS}
    model = dict(parts["model"] or {})
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        model[key] = model.get(key) or ""
    parts["model"] = model
    pre = parts["pre_tokenizer"]
    if isinstance(pre, dict) and pre.get("type") == "ByteLevel":
        parts["pre_tokenizer"] = {k: v for k, v in pre.items() if k != "trim_offsets"}
    if _adds_nothing(parts["post_processor"]):
        parts["post_processor"] = None
    decoder = parts["decoder"]
    if isinstance(decoder, dict) and decoder.get("type") == "ByteLevel":
        parts["decoder"] = {"type": "ByteLevel"}  # its options only apply when encoding
    unnormalized = parts["normalizer"] is None  # then `normalized` matches the same text either way
    parts["added_tokens"] = sorted(
        (
            {k: v for k, v in token.items() if not (unnormalized and k == "normalized")}
            for token in parts["added_tokens"] or []
        ),
        key=lambda token: token.get("id", -1),
    )
    return parts


def _adds_nothing(post_processor: Any) -> bool:
    """A post-processor that leaves the ids alone: none, ByteLevel (offsets only), or a template of
    the sequence alone (what transformers writes for GPT-2)."""
    if post_processor is None:
        return True
    kind = post_processor.get("type")
    if kind == "ByteLevel":
        return True
    if kind == "TemplateProcessing":
        single = post_processor.get("single") or []
        return not post_processor.get("special_tokens") and all("Sequence" in item for item in single)
    return False
