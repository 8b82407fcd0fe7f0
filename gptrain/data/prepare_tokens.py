"""A prepare worker's state and the numpy steps of a chunk's tokens: EOD placement, dtype check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gptrain.data.jsonl import Chunk
from gptrain.data.tokenizer_wrappers import Tokenizer
from gptrain.errors import DataError


@dataclass
class ChunkResult:
    tokens: list[np.ndarray]  # per json key, all documents back to back
    lengths: list[np.ndarray]  # per json key, tokens per text: a string value, or a sentence of a list
    sentences: list[np.ndarray | None]  # per json key, texts per document; None: one each (no lists)
    documents: int
    bad_lines: int
    nbytes: int
    path: str  # the input file the chunk's lines come from
    error: str | None = None


@dataclass
class WorkerState:
    tokenizer: Tokenizer
    keys: tuple[str, ...]
    eod: int | None
    dtype: np.dtype
    skip_bad_lines: bool

    @property
    def reads_ids(self) -> bool:
        """NullTokenizer: a JSON array of ids is a document's ids, not its sentences."""
        from gptrain.data.null_tokenizer import NullTokenizer

        return isinstance(self.tokenizer, NullTokenizer)


def last_sentences(lengths: np.ndarray, sentences: np.ndarray | None) -> np.ndarray:
    """Which texts end a non-empty document: the last non-empty sentence of each (every
    non-empty text when each document is one), where --append-eod puts the EOD."""
    nonempty = lengths > 0
    if sentences is None:
        return nonempty
    kept = np.flatnonzero(nonempty)
    document_of = np.repeat(np.arange(len(sentences)), sentences)[kept]
    last = np.ones(len(kept), dtype=bool)
    last[:-1] = document_of[1:] != document_of[:-1]
    ends = np.zeros(len(lengths), dtype=bool)
    ends[kept[last]] = True
    return ends


def with_eod(
    tokens: np.ndarray, lengths: np.ndarray, eod: int, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Append `eod` to the texts marked in `ends`, as preprocess_data --append-eod does."""
    new_lengths = lengths + ends
    out = np.full(int(new_lengths.sum()), eod, dtype=tokens.dtype)
    keep = np.ones(len(out), dtype=bool)
    keep[np.cumsum(new_lengths)[ends] - 1] = False
    out[keep] = tokens
    return out, new_lengths


def encode_texts(
    tokenizer: Tokenizer, texts: list[str], chunk: Chunk, key: str
) -> tuple[np.ndarray, np.ndarray]:
    """`encode_flat`, with a tokenizer's own failure turned into a DataError naming the lines."""
    from gptrain.data.null_tokenizer import IdsRefused

    try:
        return tokenizer.encode_flat(texts)
    except (MemoryError, IdsRefused):  # NullTokenizer's: the caller finds the line
        raise
    except Exception as error:  # whatever a tokenizer library raises on text that parsed
        last = chunk.first_line + max(0, chunk.data.count(b"\n", 0, len(chunk.data) - 1))
        raise DataError(
            f"{chunk.path}:{chunk.first_line}-{last}: the tokenizer cannot encode the {key!r} value of "
            f"a line here ({type(error).__name__}: {error}); find and fix or remove that line"
        ) from None


def check_chunk_ids_fit(tokens: np.ndarray, state: WorkerState, chunk: Chunk, key: str) -> None:
    """An id past what the token dtype holds would be written wrapped (70000 as 4464 in uint16),
    silently another token: the dtype follows the tokenizer's vocabulary size (Megatron's rule), and
    a tokenizer.json may give ids beyond it (added tokens with a gap before them)."""
    largest = int(tokens.max()) if len(tokens) else 0
    if largest <= np.iinfo(state.dtype).max:
        return
    last = chunk.first_line + max(0, chunk.data.count(b"\n", 0, len(chunk.data) - 1))
    raise DataError(
        f"{chunk.path}:{chunk.first_line}-{last}: the tokenizer gives id {largest:,} for the {key!r} value of "
        f"a line here, past the {state.dtype} tokens its vocabulary size ({state.tokenizer.vocab_size:,}) "
        "chose (Megatron's rule: uint16 below 65,500 entries); its ids run past its size: fix the "
        "tokenizer's ids (its added tokens) or use another tokenizer"
    )
