"""GPT-2 byte-level BPE from vocab.json + merges.txt: tiktoken ranks where they match, else HF BPE."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gptrain.data.tokenizer_paths import file_stamp, missing_tokenizer_file
from gptrain.data.tokenizer_wrappers import HFTokenizer, TiktokenTokenizer, Tokenizer
from gptrain.errors import DataError, excerpt

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


def _merges_lines(merge_file: str) -> list[str]:
    """The merges file's text split at each newline (its last element: the text after the last one)."""
    path = Path(merge_file)
    if (problem := missing_tokenizer_file(merge_file)) is not None:
        raise DataError(f"merge file {problem} (pass --merge-file path/to/merges.txt)")
    try:
        return path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{merge_file}: not UTF-8 text (offset {error.start}); expected GPT-2's merges.txt"
        ) from None


def _legacy_skipped(lines: list[str]) -> list[int]:
    """The line numbers of merges Megatron's legacy GPT-2 BPE (and transformers 4's slow GPT2Tokenizer)
    never reads: it takes `read().split("\n")[1:-1]`, so line 1 even when it is no #version header,
    and the text after the last newline (the last line of a file without a final newline)."""
    first = [1] if lines[0].strip() and not lines[0].startswith("#version") else []
    return first + ([len(lines)] if len(lines) > 1 and lines[-1].strip() else [])


def _not_a_merge(merge_file: str, number: int, line: str) -> str:
    json_vocab = line.lstrip().startswith("{")
    return f"{merge_file}:{number}: expected two space-separated tokens, got {excerpt(line)}" + (
        "; it looks like a JSON vocab file: --merge-file takes merges.txt (lines such as 'Ġ t')"
        if json_vocab
        else ""
    )


def _read_merges(merge_file: str, legacy: bool = False) -> tuple[list[tuple[str, str]], list[int]]:
    """The merges in priority order, and the line number of each (for error messages); `legacy`: as
    Megatron's legacy BPE reads them (_legacy_skipped; a line split at any whitespace)."""
    lines = _merges_lines(merge_file)
    skipped = _legacy_skipped(lines) if legacy else []
    merges, numbers = [], []
    for number, line in enumerate(lines, start=1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split() if legacy else line.split(" ")
        if legacy and not parts:
            continue
        if len(parts) != 2:
            raise DataError(_not_a_merge(merge_file, number, line))
        if number not in skipped:  # still checked: a vocab.json given as merges.txt is one line
            merges.append((parts[0], parts[1]))
            numbers.append(number)
    return merges, numbers


def legacy_merges_note(merge_file: str) -> str | None:
    """One line where --legacy-tokenizer leaves out a merge that the reading without it (and Hugging
    Face's) takes; None elsewhere, and for a file the loader refuses (it names the file)."""
    try:
        lines = _merges_lines(merge_file)
    except DataError:
        return None
    why = {len(lines): "the file does not end in a newline", 1: "the file has no #version header"}
    left_out = [  # a line that is no merge is refused by the loader, which names it
        f"merge {lines[n - 1]!r} (line {n}; {why[n]})"
        for n in _legacy_skipped(lines)
        if len(lines[n - 1].split()) == 2
    ]
    if not left_out:
        return None
    return (
        f"note: {merge_file}: --legacy-tokenizer reads it as Megatron's legacy GPT-2 BPE does, which never "
        f"reads the first line nor the text after the last newline, so it leaves out {' and '.join(left_out)}: "
        "without --legacy-tokenizer (and in Hugging Face's GPT-2 tokenizer) "
        f"{'they are merges' if len(left_out) > 1 else 'it is a merge'}, and the ids differ"
    )


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
    vocab, (merges, numbers) = _read_vocab(vocab_file), _read_merges(merge_file, legacy)
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


def gpt2_tokenizer_json(vocab_file: str, merge_file: str, legacy: bool = False) -> str:
    """GPT-2 BPE as a `tokenizers` tokenizer.json (what transformers' fast tokenizers load); `legacy`:
    with the merges --legacy-tokenizer reads (legacy_merges_note)."""
    vocab, (merges, _) = _read_vocab(vocab_file), _read_merges(merge_file, legacy)
    return _hf_gpt2(vocab, merges).to_str()
