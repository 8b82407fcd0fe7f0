"""Tokenizers for data preparation, training and generation (no torch).

GPT-2 BPE (`vocab.json` + `merges.txt`) runs on tiktoken, whose Rust BPE is several
times faster than HF `tokenizers`: the byte-level vocab maps one to one onto tiktoken's
byte ranks whenever merge results have increasing ids in merge order (true for GPT-2 and
its derivatives); otherwise the exact HF `tokenizers` BPE is used. Like Megatron (whose
GPT2BPETokenizer is HF's fast GPT-2 tokenizer since core 0.15), a literal "<|endoftext|>" in the
text becomes the single end-of-document id; with `legacy` (its --legacy-tokenizer, and the default
up to core 0.14) it stays ordinary text. A SentencePiece `tokenizer.model` is read by the
`sentencepiece` package (an optional dependency, imported only when one is built).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gptrain.data.tiktoken_file import TiktokenFileOptions, load_tiktoken_file
from gptrain.data.tokenizer_args import canonical_type
from gptrain.errors import ConfigError, DataError
from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import hub_name_advice
from gptrain.utils.tokenizer_types import is_tiktoken_vocabulary_file as is_vocabulary_file

ENDOFTEXT = "<|endoftext|>"
# GPT-2's pre-tokenizer split; the possessive form is equivalent and faster in tiktoken.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# End-of-document candidates for a bare tokenizer.json without tokenizer_config.json.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "<|eot_id|>")
SENTENCEPIECE_KINDS = ("sentencepiece", "gptsentencepiece", "llama2")
# Megatron's SentencePieceTokenizer adds these (those the model lacks get the next ids), then the
# model's pad, bos and eos pieces (named so when the model has none).
MEGATRON_SP_SPECIALS = ("<CLS>", "<SEP>", "<EOD>", "<MASK>")


class Tokenizer(Protocol):
    vocab_size: int  # unpadded: decides the token dtype (Megatron's rule)

    @property
    def eod(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids back to back, and each text's token count (the fast path of prepare)."""
        ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


def flat_ids(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's ids back to back, and each text's count: encode_flat from per-text id lists."""
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    return tokens, lengths


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> character alphabet: printable bytes stand for themselves,
    the others are shifted to code points 256 and up, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    for n, b in enumerate(shifted):
        table[b] = chr(256 + n)
    return dict(sorted(table.items()))


class TiktokenTokenizer:
    """A tiktoken encoding; `decode_table` covers vocab entries tiktoken cannot hold; `bos_id` a
    beginning-of-sequence token distinct from EOD (Megatron's TikTokenizer's <s>), else None."""

    def __init__(
        self,
        encoding: Any,
        eod: int,
        vocab_size: int,
        allowed_special: frozenset[str],
        decode_table: dict[int, bytes] | None = None,
        bos_id: int | None = None,
    ) -> None:
        self.encoding = encoding
        self._eod = eod
        self.vocab_size = vocab_size
        self._special = allowed_special
        self._decode_table = decode_table
        self.bos_id = bos_id

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special=self._special, disallowed_special=())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_batch(texts, allowed_special=self._special, disallowed_special=())

    def _encode_array(self, text: str) -> np.ndarray:
        try:
            return self.encoding.encode_to_numpy(text, allowed_special=self._special, disallowed_special=())
        except UnicodeEncodeError:  # lone surrogates: tiktoken's list path repairs them
            return np.asarray(self.encode(text), dtype=np.uint32)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        arrays = [self._encode_array(text) for text in texts]
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        tokens = np.concatenate(arrays) if arrays else np.empty(0, np.uint32)
        return tokens, lengths

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = [int(i) for i in ids]
        try:
            if self._decode_table is None:
                return self.encoding.decode(ids)
            return b"".join(self._decode_table[i] for i in ids).decode("utf-8", errors="replace")
        except (KeyError, ValueError, OverflowError):
            bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
            raise DataError(
                f"token id {bad} is not in this tokenizer's vocabulary (wrong tokenizer?)"
            ) from None


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer, special tokens added as `AutoTokenizer` does."""

    def __init__(self, tokenizer: Any, eod: int | None, source: str) -> None:
        self.tokenizer = tokenizer
        self._eod = eod
        self.source = source
        # the highest id + 1, not the count: a tokenizer.json may leave ids unassigned (a vocab
        # numbered with gaps), and every id it emits needs an embedding row
        self.vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    @property
    def eod(self) -> int:
        if self._eod is None:
            raise DataError(
                f"{self.source}: no end-of-document token found (none of {', '.join(EOS_CANDIDATES)}); "
                "put a tokenizer_config.json with eos_token next to tokenizer.json"
            )
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat_ids(self.encode_batch(list(texts)))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


class SentencePieceTokenizer:
    """A SentencePiece model encoded as one of Megatron's three wrappers of it encodes.

    GPTSentencePieceTokenizer: the model's ids alone, EOD its eos. Llama2Tokenizer: its bos first,
    EOD its eos. SentencePieceTokenizer: Megatron's added special tokens (`specials`, some past the
    model's pieces, so in vocab_size), a literal one in the text becoming its id, EOD `<EOD>`.
    """

    def __init__(
        self,
        processor: Any,
        source: str,
        eod: int | None,
        vocab_size: int,
        bos: int | None = None,
        specials: dict[str, int] | None = None,
    ) -> None:
        self.processor = processor
        self.source = source
        self._eod = eod
        self.vocab_size = vocab_size
        self._bos = bos
        self._specials = specials or {}
        self._names = {token_id: token for token, token_id in self._specials.items()}
        # leftmost special first and, at one position, the first added: Megatron's search order
        self._split = re.compile("|".join(map(re.escape, self._specials))) if self._specials else None

    @property
    def bos_id(self) -> int | None:
        """The model's bos piece (Megatron's added <BOS> for SentencePieceTokenizer), None if none."""
        if "<BOS>" in self._specials or self.processor.bos_id() < 0:
            return self._specials.get("<BOS>")
        return self.processor.bos_id()

    @property
    def eod(self) -> int:
        if self._eod is None:
            raise DataError(
                f"{self.source}: the SentencePiece model has no end-of-sentence piece (eos_id=-1) to "
                "end documents; train it with an eos piece, or use SentencePieceTokenizer (adds <EOD>)"
            )
        return self._eod

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            ids = self.processor.encode(text)
        else:
            ids, start = [], 0
            for match in self._split.finditer(text):
                ids += self.processor.encode(text[start : match.start()])
                ids.append(self._specials[match.group()])
                start = match.end()
            ids += self.processor.encode(text[start:])
        return ids if self._bos is None else [self._bos, *ids]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat_ids(self.encode_batch(list(texts)))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """As Megatron's detokenize: a special token stands apart, a space either side of it."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise DataError(f"token id {bad} is not in this tokenizer's vocabulary (wrong tokenizer?)")
        text, start = "", 0
        for position, token_id in enumerate(ids):
            if token_id in self._names:
                text += f"{self.processor.decode(ids[start:position])} {self._names[token_id]} "
                start = position + 1
        return text + self.processor.decode(ids[start:])


def missing_tokenizer_file(path: str, in_directory: str | None = None) -> str | None:
    """Why a tokenizer cannot read `path` ('<path> not found', '<path> is a directory ...'), or None;
    a directory holding `in_directory` will do. A directory was said to be "not found", and one the
    user may not search to have no `in_directory` in it."""
    found = look_up(path)
    if found.kind == "unreachable":
        return f"{path} {found.why}"
    if found.kind == "directory":
        if in_directory is None:
            return f"{path} is a directory, not a file"
        inner = look_up(os.path.join(path, in_directory))
        if inner.kind == "unreachable":
            return f"{os.path.join(path, in_directory)} {inner.why}"
        return None if inner.kind == "file" else f"{path} is a directory with no {in_directory} in it"
    return None if found.kind == "file" else f"{path} not found"


def _hub_name_line(model: str, pass_as: str = "pass the local directory DIR") -> str | None:
    """The one line for a --tokenizer-model that is not there and reads as a hub name, or None."""
    advice = hub_name_advice(model, pass_as)
    return None if advice is None else f"--tokenizer-model {model} is not a local file or directory; {advice}"


def unreachable(path: str) -> str | None:
    """Why `path` cannot even be looked up, or None (also where it is not there): a directory above
    it that this user may not search (EACCES), which pathlib raised as a bare PermissionError."""
    found = look_up(path)
    return f"{path} {found.why}" if found.kind == "unreachable" else None


def load_sentencepiece(model: str, kind: str) -> Tokenizer:
    """A SentencePiece `tokenizer.model` as Megatron's `kind` wrapper encodes it (cached as load_gpt2_bpe)."""
    return _load_sentencepiece(model, kind, _stamp(model))


@functools.lru_cache(maxsize=4)
def _load_sentencepiece(model: str, kind: str, *_stamps: object) -> Tokenizer:
    path = Path(model)
    if (problem := missing_tokenizer_file(model)) is not None:
        raise DataError(
            _hub_name_line(model, "pass DIR/tokenizer.model")
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


def drops_runs_of_spaces(tokenizer_type: str, model: str | None) -> bool:
    """Whether the SentencePiece model of `tokenizer_type` folds a run of spaces into one in its
    normalizer (sentencepiece's default), tested as Megatron's wrapper tests it."""
    processor = build_tokenizer(tokenizer_type, model=model).processor  # type: ignore[attr-defined]
    return bool(processor.encode_as_pieces("x  y") == processor.encode_as_pieces("x y"))


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


def _read_vocab(vocab_file: str) -> dict[str, int]:
    path = Path(vocab_file)
    if (problem := missing_tokenizer_file(vocab_file)) is not None:
        raise DataError(f"vocab file {problem} (pass --vocab-file path/to/vocab.json)")
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{vocab_file}: not a JSON vocab ({error})") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise DataError(f"{vocab_file}: expected a JSON object mapping token strings to ids")
    return vocab


def _read_merges(merge_file: str) -> tuple[list[tuple[str, str]], list[int]]:
    """The merges in priority order, and the line number of each (for error messages)."""
    path = Path(merge_file)
    if (problem := missing_tokenizer_file(merge_file)) is not None:
        raise DataError(f"merge file {problem} (pass --merge-file path/to/merges.txt)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{merge_file}: not UTF-8 text (offset {error.start}); expected GPT-2's merges.txt"
        ) from None
    merges, numbers = [], []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise DataError(f"{merge_file}:{number}: expected two space-separated tokens, got {line!r}")
        merges.append((parts[0], parts[1]))
        numbers.append(number)
    return merges, numbers


def _check_merges(
    merges: list[tuple[str, str]], numbers: list[int], vocab: dict[str, int], merge_file: str
) -> None:
    for number, (left, right) in zip(numbers, merges, strict=True):
        for token in (left, right, left + right):
            if token not in vocab:
                raise DataError(
                    f"{merge_file}:{number}: {token!r} is not in the vocab file; "
                    "the merges do not belong to this vocab.json"
                )


class _ByteAlphabet:
    """Converts byte-level token strings to bytes at C speed (str.translate)."""

    def __init__(self) -> None:
        table = bytes_to_unicode()
        self.chars = {ord(c) for c in table.values()}
        self._to_latin1 = {ord(c): chr(b) for b, c in table.items()}
        self._drop = dict.fromkeys(self.chars)

    def is_byte_level(self, token: str) -> bool:
        return not token.translate(self._drop)

    def to_bytes(self, token: str) -> bytes:
        """The bytes a token stands for; tokens outside the alphabet (specials) as UTF-8."""
        if self.is_byte_level(token):
            return token.translate(self._to_latin1).encode("latin-1")
        return token.encode("utf-8")


def _tiktoken_ranks(
    vocab: dict[str, int], merges: list[tuple[str, str]], alphabet: _ByteAlphabet
) -> dict[bytes, int] | None:
    """Byte-level ranks equal to the vocab ids, or None when ids do not follow merge order."""
    ranks: dict[bytes, int] = {}
    for char in alphabet.chars:
        if chr(char) not in vocab:
            return None
        ranks[alphabet.to_bytes(chr(char))] = vocab[chr(char)]
    previous = -1
    for left, right in merges:
        token_id = vocab[left + right]
        merged = alphabet.to_bytes(left + right)
        if token_id <= previous or merged in ranks:
            return None
        ranks[merged] = previous = token_id
    if len(set(ranks.values())) != len(ranks):
        return None
    return ranks


def load_gpt2_bpe(vocab_file: str, merge_file: str, backend: str = "auto", legacy: bool = False) -> Tokenizer:
    """GPT-2 byte-level BPE from vocab.json + merges.txt; backend 'auto', 'tiktoken' or 'hf'.
    `legacy`: as Megatron's legacy GPT2BPETokenizer (its own BPE, no special tokens), a literal
    <|endoftext|> in the text is ordinary text, not the end-of-document id.

    Cached per process by path and file stamp: tokenizers are read-only once built.
    """
    return _load_gpt2_bpe(vocab_file, merge_file, backend, legacy, _stamp(vocab_file), _stamp(merge_file))


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=4)
def _load_gpt2_bpe(
    vocab_file: str, merge_file: str, backend: str, legacy: bool, *_stamps: object
) -> Tokenizer:
    vocab, (merges, numbers) = _read_vocab(vocab_file), _read_merges(merge_file)
    _check_merges(merges, numbers, vocab, merge_file)
    if ENDOFTEXT not in vocab:
        raise DataError(f"{vocab_file}: has no {ENDOFTEXT} token (needed as end of document)")
    eod = vocab[ENDOFTEXT]
    alphabet = _ByteAlphabet()
    ranks = _tiktoken_ranks(vocab, merges, alphabet) if backend != "hf" else None
    if ranks is not None and eod not in ranks.values():
        import tiktoken

        encoding = tiktoken.Encoding(
            name=f"gpt2-bpe:{vocab_file}",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={ENDOFTEXT: eod},
        )
        decode_table = {token_id: alphabet.to_bytes(token) for token, token_id in vocab.items()}
        vocab_size = max(vocab.values()) + 1  # vocab.json may skip ids, as tokenizer.json may
        specials = frozenset() if legacy else frozenset({ENDOFTEXT})  # encoded with disallowed_special=()
        return TiktokenTokenizer(encoding, eod, vocab_size, specials, decode_table)
    if backend == "tiktoken":
        raise DataError(f"{vocab_file}: ids do not follow the merge order of {merge_file}; use backend 'hf'")
    return HFTokenizer(_hf_gpt2(vocab, merges, special=not legacy), eod, vocab_file)


def _hf_gpt2(vocab: dict[str, int], merges: list[tuple[str, str]], special: bool = True) -> Any:
    """The tokenizer transformers' GPT2TokenizerFast builds from vocab.json + merges.txt (without
    `special`, <|endoftext|> only a vocabulary entry, as Megatron's legacy GPT-2 BPE has it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if special:
        tokenizer.add_special_tokens([AddedToken(ENDOFTEXT, special=True)])
    return tokenizer


def gpt2_tokenizer_json(vocab_file: str, merge_file: str) -> str:
    """GPT-2 BPE as a `tokenizers` tokenizer.json (what transformers' fast tokenizers load)."""
    vocab, (merges, _) = _read_vocab(vocab_file), _read_merges(merge_file)
    return _hf_gpt2(vocab, merges).to_str()


def _eos_from_config(directory: Path) -> str | None:
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (ValueError, AttributeError) as error:
        raise DataError(f"{config}: not a JSON object ({error})") from None
    return eos.get("content") if isinstance(eos, dict) else eos


SAME_IDS_SLOW_CLASSES = ("GPT2Tokenizer", "PreTrainedTokenizer")
"""transformers' slow tokenizer classes that encode as the tokenizer.json gptrain reads: GPT-2's
(the same byte-level BPE, split and <|endoftext|>: checked against transformers 4.46 on GPT-2's
vocabulary), and PreTrainedTokenizerFast's, which has no slow class (AutoTokenizer loads it fast)."""


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
            _hub_name_line(model)
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
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    eos = _eos_from_config(file.parent)
    candidates = [eos] if eos else [c for c in EOS_CANDIDATES if c in vocab]
    eod = vocab.get(candidates[0]) if candidates else None
    return HFTokenizer(tokenizer, eod, str(file))


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


def _is_directory(model: str) -> bool:
    """Whether --tokenizer-model names a directory (of a GPT-2 vocab.json and merges.txt); one the
    user may not look up is a DataError (Path.is_dir raised PermissionError there)."""
    found = look_up(model)
    if found.kind == "unreachable":
        raise DataError(
            f"tokenizer model {model} {found.why} (pass --vocab-file and --merge-file, or their directory)"
        )
    return found.kind == "directory"


def build_tokenizer(
    tokenizer_type: str,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    model: str | None = None,
    tiktoken: TiktokenFileOptions | None = None,
    legacy: bool = False,
) -> Tokenizer:
    """Build a tokenizer by its NeMo/Megatron type name (aliases: gpt2bpe, huggingface, tiktoken, llama2);
    `tiktoken` is read only for TikTokenizer with a vocabulary file (Megatron's); `legacy` (Megatron's
    --legacy-tokenizer) only for GPT-2 BPE, the one type whose legacy ids gptrain's others do not already give."""
    kind = canonical_type(tokenizer_type)
    if kind == "gpt2":
        if vocab_file is None and merge_file is None and model and _is_directory(model):
            vocab_file, merge_file = str(Path(model) / "vocab.json"), str(Path(model) / "merges.txt")
        if not vocab_file or not merge_file:
            raise ConfigError("GPT2BPETokenizer needs --vocab-file vocab.json and --merge-file merges.txt")
        return load_gpt2_bpe(vocab_file, merge_file, legacy=legacy)
    if not model:
        examples = {
            "huggingface": "path/to/tokenizer.json",
            "tiktoken": "Megatron's tiktoken vocabulary path/to/tokenizer.json, or an encoding name such as cl100k_base",
        }
        example = examples.get(kind, "path/to/tokenizer.model")
        raise ConfigError(f"{tokenizer_type} needs --tokenizer-model ({example})")
    if kind in SENTENCEPIECE_KINDS:
        return load_sentencepiece(model, kind)
    if kind == "huggingface":
        return load_huggingface(model)
    if is_vocabulary_file(model):
        return load_tiktoken_file(model, tiktoken)
    if tiktoken is not None and (given := tiktoken.settings_given()):
        raise ConfigError(
            f"{', '.join(given)}: read only with Megatron's tiktoken vocabulary file; the tiktoken encoding "
            f"{model!r} has its own split, vocabulary and special tokens: drop the setting"
        )
    return load_tiktoken(model)


@dataclass(frozen=True)
class TokenizerSpec:
    """What a worker process needs to build the same tokenizer (picklable)."""

    tokenizer_type: str
    vocab_file: str | None = None
    merge_file: str | None = None
    model: str | None = None
    tiktoken: TiktokenFileOptions | None = None
    legacy: bool = False
    """Megatron's --legacy-tokenizer: GPT-2 BPE keeps a literal <|endoftext|> as text."""

    def build(self) -> Tokenizer:
        return build_tokenizer(
            self.tokenizer_type, self.vocab_file, self.merge_file, self.model, self.tiktoken, self.legacy
        )
