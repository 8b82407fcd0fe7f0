"""Megatron-LM's TikTokenizer: a tiktoken vocabulary file read as Megatron reads it (no torch).

The file is a JSON list of {"rank", "token_bytes" (base64), "token_str"}: entry i has rank i, and
the first 256 are the single bytes in order. Megatron puts `num_special_tokens` (1000) special
tokens first, the given ones (default <unk> <s> </s> <mask> <pad> <cls> <sep>) then <SPECIAL_i>
fillers, and shifts every rank by that count; it keeps the file's first `vocab_size` -
`num_special_tokens` ranks (vocab_size 2**17 unless --vocab-size), which the file must hold. Text is
split by pattern v1 or v2 (v2 by default), a literal special token in it is that token's id, and
</s> ends a document: Megatron core's TikTokenTokenizer, the default since core 0.15 and the only
one since 0.17 (the legacy one before it kept a literal special token as text).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptrain.errors import ConfigError, DataError
from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import TIKTOKEN_COUNT_KEY as COUNT_KEY
from gptrain.utils.tokenizer_types import TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS as DEFAULT_NUM_SPECIAL_TOKENS
from gptrain.utils.tokenizer_types import TIKTOKEN_PATTERN_KEY as PATTERN_KEY
from gptrain.utils.tokenizer_types import TIKTOKEN_SIZE_KEY as SIZE_KEY
from gptrain.utils.tokenizer_types import TIKTOKEN_SPECIALS_KEY as SPECIALS_KEY
from gptrain.utils.tokenizer_types import tiktoken_settings_given

PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}
"""Megatron's PATTERN_TIKTOKEN (v1) and PATTERN_TIKTOKEN_V2 pre-tokenizer splits."""
DEFAULT_PATTERN = "v2"
DEFAULT_VOCAB_SIZE = 2**17
REQUIRED_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
END_OF_DOCUMENT = "</s>"
BEGINNING_OF_SEQUENCE = "<s>"
ENTRY_KEYS = {"rank", "token_bytes", "token_str"}


@dataclass(frozen=True)
class TiktokenFileOptions:
    """Megatron's --tiktoken-pattern, --vocab-size, --tiktoken-num-special-tokens and
    --tokenizer-special-tokens (None: Megatron's default); picklable for prepare's workers."""

    pattern: str | None = None
    vocab_size: int | None = None
    num_special_tokens: int | None = None
    special_tokens: tuple[str, ...] | None = None

    def settings_given(self) -> list[str]:
        """The settings that differ from Megatron's defaults, by name (for a tiktoken encoding name,
        which reads none of them)."""
        return tiktoken_settings_given(
            self.pattern, self.vocab_size, self.num_special_tokens, self.special_tokens
        )

    def resolved(self) -> tuple[str, int, int, tuple[str, ...]]:
        """(pattern, vocab_size, num_special_tokens, special tokens with fillers), checked as
        Megatron checks them; a ConfigError naming the setting otherwise."""
        pattern = self.pattern or DEFAULT_PATTERN
        if pattern not in PATTERNS:
            raise ConfigError(f"{PATTERN_KEY} {pattern!r}: use v1 or v2")
        vocab_size = self.vocab_size or DEFAULT_VOCAB_SIZE  # Megatron reads --vocab-size 0 as absent
        count = DEFAULT_NUM_SPECIAL_TOKENS if self.num_special_tokens is None else self.num_special_tokens
        given = REQUIRED_SPECIAL_TOKENS if self.special_tokens is None else tuple(self.special_tokens)
        if "" in given:  # tiktoken would find it between every two characters
            raise ConfigError(f"{SPECIALS_KEY}: an empty token; each needs at least one character")
        if len(set(given)) != len(given):
            repeated = next(token for token in given if given.count(token) > 1)
            raise ConfigError(f"{SPECIALS_KEY}: {repeated!r} is given twice; each must be unique")
        missing = [token for token in REQUIRED_SPECIAL_TOKENS if token not in given]
        if missing:
            raise ConfigError(
                f"{SPECIALS_KEY}: {' '.join(missing)} missing; Megatron's TikTokenizer needs "
                f"{' '.join(REQUIRED_SPECIAL_TOKENS)} among them"
            )
        if not len(given) <= count < vocab_size:
            raise ConfigError(
                f"{COUNT_KEY} {count}: needs at least the {len(given)} special tokens "
                f"given and fewer than {SIZE_KEY} {vocab_size}"
            )
        fillers = tuple(f"<SPECIAL_{i}>" for i in range(len(given), count))
        specials = given + fillers
        if len(set(specials)) != count:
            clash = next(token for token in given if token in fillers)
            raise ConfigError(
                f"{SPECIALS_KEY}: {clash!r} is also the name of a filler Megatron adds "
                "(<SPECIAL_i> for each id past those given); rename it"
            )
        return pattern, vocab_size, count, specials


def load_tiktoken_file(path: str, options: TiktokenFileOptions | None = None) -> Any:
    """Megatron's TikTokenizer from its vocabulary file (cached by path, options and file stamp)."""
    options = options or TiktokenFileOptions()
    try:
        stat = os.stat(path)
        stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None
    return _load(path, options, stamp)


@functools.lru_cache(maxsize=4)
def _load(path: str, options: TiktokenFileOptions, _stamp: object) -> Any:
    import tiktoken

    from gptrain.data.tokenizer_wrappers import TiktokenTokenizer

    pattern, vocab_size, count, specials = options.resolved()
    ranks = read_ranks(path, vocab_size - count, count)
    special_ids = {token: index for index, token in enumerate(specials)}
    encoding = tiktoken.Encoding(
        name=f"megatron-tiktoken:{path}",
        pat_str=PATTERNS[pattern],
        mergeable_ranks=ranks,
        special_tokens=special_ids,
    )
    eod, bos = special_ids[END_OF_DOCUMENT], special_ids[BEGINNING_OF_SEQUENCE]
    return TiktokenTokenizer(encoding, eod, vocab_size, frozenset(specials), bos_id=bos)


def read_ranks(path: str, kept: int, shift: int) -> dict[bytes, int]:
    """The file's first `kept` tokens -> rank + `shift`, each entry checked as Megatron asserts it;
    a DataError naming the file and the entry otherwise."""
    if kept < 256:
        raise DataError(
            f"{path}: vocabulary size {kept + shift} keeps {kept} of its tokens, fewer than the 256 single "
            f"bytes every text needs; raise {SIZE_KEY}"
        )
    entries = _entries(path)
    if len(entries) < kept:
        raise DataError(
            f"{path}: holds {len(entries)} tokens, but vocabulary size {kept + shift} less {shift} special "
            f"tokens needs {kept}; set {SIZE_KEY} to {len(entries) + shift} or fewer"
        )
    ranks: dict[bytes, int] = {}
    for index, entry in enumerate(entries[:kept]):
        token = _token_bytes(path, index, entry)
        if token in ranks:
            raise DataError(
                f"{path}: entry {index}: token_bytes {entry['token_bytes']!r} repeats entry "
                f"{ranks[token] - shift}; each token must be in the file once"
            )
        ranks[token] = index + shift
    return ranks


def _entries(path: str) -> list[Any]:
    """The file's JSON list, or a DataError saying why it is not one (without numpy: the launch's
    preflight reads it on the login node)."""
    found = look_up(path)
    if found.kind != "file":
        why = {"unreachable": found.why, "directory": "is a directory, not a file"}.get(
            found.kind, "not found"
        )
        raise DataError(f"tiktoken vocabulary {path} {why} (pass --tokenizer-model path/to/tokenizer.json)")
    if not path.endswith(".json"):
        raise DataError(
            f"{path}: Megatron's TikTokenizer reads a .json vocabulary (a JSON list of rank, token_bytes, "
            "token_str); for one of tiktoken's encodings give its name, e.g. cl100k_base"
        )
    try:
        entries = json.loads(Path(path).read_bytes())
    except OSError as error:
        raise DataError(f"{path}: cannot read the tiktoken vocabulary ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: not UTF-8 JSON (byte {error.start}); expected a tiktoken vocabulary"
        ) from None
    except json.JSONDecodeError as error:
        raise DataError(
            f"{path}:{error.lineno}: not JSON ({error.msg}, column {error.colno}); expected a list of "
            "rank, token_bytes, token_str entries"
        ) from None
    if not isinstance(entries, list):
        raise DataError(
            f"{path}: a JSON {type(entries).__name__}, not a list of rank, token_bytes, token_str entries "
            "(Megatron's tiktoken vocabulary)"
        )
    return entries


def _token_bytes(path: str, index: int, entry: Any) -> bytes:
    """Entry `index`'s token, after the checks Megatron asserts: its three keys, rank = position,
    the first 256 the single bytes in order."""
    where = f"{path}: entry {index}"
    if not isinstance(entry, dict) or set(entry) != ENTRY_KEYS:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise DataError(f"{where}: expected keys rank, token_bytes, token_str, got {keys}")
    if type(entry["rank"]) is not int or entry["rank"] != index:
        raise DataError(f"{where}: rank {entry['rank']!r}, not {index}; ranks must count up from 0 in order")
    try:
        token = base64.b64decode(entry["token_bytes"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise DataError(f"{where}: token_bytes {entry['token_bytes']!r} is not base64") from None
    if not token:
        raise DataError(f"{where}: token_bytes is empty; every token is at least one byte")
    if index < 256 and token != bytes([index]):
        raise DataError(
            f"{where}: token_bytes {token!r}, not {bytes([index])!r}; the first 256 are the single bytes"
        )
    return token
