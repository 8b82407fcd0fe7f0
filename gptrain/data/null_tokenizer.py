"""Megatron's NullTokenizer: a vocabulary of `vocab_size` ids and no files, for data already tokenized
(no torch).

As Megatron-LM core 0.18 on builds it from --vocab-size N: N ids, the end of document N - 1 (or
--null-tokenizer-eod-id), padding -1, which no id is, so nothing is masked as padding (or
--null-tokenizer-pad-id). Up to core 0.17 it added one id, the end of document N: --vocab-size N + 1
here gives that vocabulary. Text is token ids separated by spaces, both ways, as Megatron's
text_to_ids/ids_to_text: `gptrain generate` then takes and prints ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gptrain.data.tokenizer_wrappers import flat_ids
from gptrain.errors import ConfigError, excerpt
from gptrain.utils.tokenizer_types import NO_PAD, check_null_settings

# What plain id text holds: ASCII digits and the ASCII whitespace both str.split and numpy skip.
_PLAIN_ID_BYTES = np.zeros(256, dtype=bool)
_PLAIN_ID_BYTES[list(b"0123456789 \t\n\r\x0b\x0c")] = True
_INT64_SAFE_DIGITS = 18  # a longer number may not fit int64: read word by word, exactly


class IdsRefused(ConfigError):
    """A word that is no token id, or an id past the vocabulary: prepare then checks line by line."""


@dataclass(frozen=True)
class NullOptions:
    """NullTokenizer's settings (model.tokenizer.vocab_size, null_eod_id, null_pad_id)."""

    vocab_size: int | None
    eod_id: int | None = None
    pad_id: int | None = None


class NullTokenizer:
    """`vocab_size` ids with no tokens behind them; `eod` ends documents (loss masks), `pad` labels
    left out of the loss (-1: none)."""

    def __init__(self, vocab_size: int, eod_id: int | None = None, pad_id: int | None = None) -> None:
        self.vocab_size = int(vocab_size)
        self._eod = self.vocab_size - 1 if eod_id is None else int(eod_id)
        self.pad = NO_PAD if pad_id is None else int(pad_id)

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        """Token ids written as text, separated by whitespace; anything else refused in one line."""
        ids = []
        for word in text.split():
            try:
                token_id = int(word)
            except ValueError:
                raise IdsRefused(
                    f"{excerpt(word)} is not a token id: NullTokenizer reads text as token ids separated by spaces "
                    f"(e.g. '17 4 2051'), each from 0 to {self.vocab_size - 1}"
                ) from None
            if not 0 <= token_id < self.vocab_size:
                raise IdsRefused(
                    f"token id {token_id} is not in NullTokenizer's vocabulary of {self.vocab_size} ids "
                    f"(0 to {self.vocab_size - 1})"
                )
            ids.append(token_id)
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode_flat(self, texts: Sequence[str | np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids read by numpy in one pass and range-checked as one array; the per-word
        `encode` (Python's int() per word) only for any other text, or to name what is wrong. An
        int64 array is a text's ids already (a JSON array of them). More lenient than Megatron's
        NullTokenizer, whose int() of each text.split(' ') raises at an empty text, a double, leading
        or trailing space, a tab or a newline: ids here are separated by any whitespace."""
        if any(type(text) is np.ndarray for text in texts):
            return self._with_arrays(texts)
        plain = plain_ids(list(texts))
        if plain is not None:
            tokens, lengths = plain
            if not len(tokens) or int(tokens.max()) < self.vocab_size:  # no '-': none below 0
                return tokens, lengths
        return flat_ids(self.encode_batch(list(texts)))

    def _with_arrays(self, texts: Sequence[str | np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Texts some of which are arrays of ids: the arrays checked at once, the strings read each."""
        parts = [text if type(text) is np.ndarray else self.encode_flat([text])[0] for text in texts]
        tokens = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            bad = next(p for p in parts if len(p) and (p.min() < 0 or p.max() >= self.vocab_size))
            self.encode(" ".join(map(str, bad.tolist())))  # raises, naming the id
        return tokens.astype(np.int64, copy=False), np.fromiter(map(len, parts), np.int64, len(parts))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return " ".join(str(int(i)) for i in ids)


def plain_ids(texts: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids back to back, ids per text) of texts of ASCII digits and whitespace, as int() of each
    word reads them; None for any other text (a sign, a Unicode digit or space, a long number)."""
    if not texts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    joined = " ".join(texts)
    try:
        raw = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    except UnicodeEncodeError:
        return None
    if not _PLAIN_ID_BYTES[raw].all():
        return None
    digit = (raw >= ord("0")) & (raw <= ord("9"))
    edges = np.diff(digit.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if len(starts) and int((ends - starts).max()) > _INT64_SAFE_DIGITS:
        return None
    tokens = np.fromstring(joined, dtype=np.int64, sep=" ")
    if len(tokens) != len(starts):  # numpy reads text of only whitespace as one 0: read word by word
        return None
    text_starts = np.cumsum([0, *(len(text) + 1 for text in texts[:-1])])
    lengths = np.diff(np.searchsorted(starts, text_starts), append=len(starts)).astype(np.int64)
    return tokens, lengths


def build_null_tokenizer(options: NullOptions | None) -> NullTokenizer:
    """The NullTokenizer of `options`, its ids checked: a ConfigError naming the key otherwise."""
    if options is None:
        options = NullOptions(None)
    check_null_settings(options.vocab_size, options.eod_id, options.pad_id)
    assert options.vocab_size is not None  # checked
    return NullTokenizer(options.vocab_size, options.eod_id, options.pad_id)
