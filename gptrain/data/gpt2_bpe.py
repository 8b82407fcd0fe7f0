"""GPT-2 byte-level BPE from vocab.json + merges.txt: tiktoken ranks where they match, else HF BPE."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gptrain.data.tokenizer_paths import file_stamp, missing_tokenizer_file
from gptrain.data.tokenizer_wrappers import HFTokenizer, TiktokenTokenizer, Tokenizer
from gptrain.errors import DataError

ENDOFTEXT = "<|endoftext|>"


# GPT-2's pre-tokenizer split; the possessive form is equivalent and faster in tiktoken.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


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
    """Byte-level ranks equal to the vocab ids, or None when ids do not follow merge order or a
    merge's part is made by no earlier merge (a merges.txt missing a line): HF's BPE never forms
    such a token, while tiktoken emits any piece it finds whole in its ranks."""
    ranks: dict[bytes, int] = {}
    for char in alphabet.chars:
        if chr(char) not in vocab:
            return None
        ranks[alphabet.to_bytes(chr(char))] = vocab[chr(char)]
    made = {chr(char) for char in alphabet.chars}
    previous = -1
    for left, right in merges:
        if left not in made or right not in made:
            return None
        made.add(left + right)
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
    return _load_gpt2_bpe(
        vocab_file, merge_file, backend, legacy, file_stamp(vocab_file), file_stamp(merge_file)
    )


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
        return TiktokenTokenizer(encoding, eod, vocab_size, specials, decode_table, entries=len(vocab))
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
