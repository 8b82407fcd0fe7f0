"""`gptrain data inspect`: what is in a `.bin`/`.idx` pair, in numbers and decoded text."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from gptrain.data.indexed import IndexedDataset
from gptrain.data.tokenizer_wrappers import Tokenizer
from gptrain.errors import DataError

PERCENTILES = (0, 50, 90, 99, 100)
DOCUMENTS_PER_PASS = 1 << 22  # bounds the temporaries: a corpus of 10^9 documents on a login node


def document_lengths(dataset: IndexedDataset) -> np.ndarray:
    """Tokens per document (a document may hold several sequences, or none): 8 bytes a document,
    plus a pass's temporaries, where whole-corpus prefix sums took about five times that."""
    docs, sequences = dataset.document_indices, dataset.sequence_lengths
    count = len(docs) - 1
    lengths = np.empty(max(count, 0), dtype=np.int64)
    for start in range(0, count, DOCUMENTS_PER_PASS):
        bounds = np.asarray(docs[start : min(start + DOCUMENTS_PER_PASS, count) + 1], dtype=np.int64)
        first = int(bounds[0])
        ends = np.zeros(int(bounds[-1]) - first + 1, dtype=np.int64)
        np.cumsum(sequences[first : int(bounds[-1])], dtype=np.int64, out=ends[1:])
        lengths[start : start + len(bounds) - 1] = ends[bounds[1:] - first] - ends[bounds[:-1] - first]
    return lengths


def document_tokens(dataset: IndexedDataset, document: int, limit: int) -> np.ndarray:
    """The first `limit` tokens of one document, across its sequences."""
    if not 0 <= document < dataset.num_documents:
        raise DataError(f"--document {document}: the dataset has {dataset.num_documents} documents (0-based)")
    start, end = (int(i) for i in dataset.document_indices[document : document + 2])
    parts: list[np.ndarray] = []
    remaining = limit
    for sequence in range(start, end):
        if remaining <= 0:
            break
        part = dataset.get(sequence, 0, min(remaining, int(dataset.sequence_lengths[sequence])))
        parts.append(part)
        remaining -= len(part)
    return np.concatenate(parts) if parts else np.empty(0, dtype=dataset.dtype)


def summarize(
    prefix: str, tokenizer: Tokenizer | None = None, document: int = 0, num_tokens: int = 32
) -> dict[str, Any]:
    """Counts, dtype, document-length percentiles and a peek at one document."""
    dataset = IndexedDataset(prefix)
    dataset.verify()
    lengths = document_lengths(dataset)
    info: dict[str, Any] = {
        "prefix": dataset.path_prefix,
        "documents": dataset.num_documents,
        "empty_documents": int(np.count_nonzero(lengths == 0)),
        "sequences": len(dataset),
        "tokens": dataset.num_tokens,
        "dtype": str(dataset.dtype),
        "document_length": None,
    }
    peeked = int(lengths[document]) if 0 <= document < len(lengths) else 0
    if len(lengths):
        mean = float(lengths.mean())
        values = np.percentile(lengths, PERCENTILES, overwrite_input=True)  # reorders: read last
        stats = {f"p{p}": float(v) for p, v in zip(PERCENTILES, values, strict=True)}
        stats["mean"] = mean
        info["document_length"] = stats
    if dataset.num_documents and num_tokens > 0:
        ids = document_tokens(dataset, document, num_tokens)
        peek: dict[str, Any] = {"index": document, "num_tokens": peeked, "ids": ids.tolist()}
        if tokenizer is not None:
            where = f"{dataset.path_prefix}: document {document}"
            check_ids_in_vocabulary(where, ids, int(tokenizer.vocab_size), "inspect")
            peek["text"] = tokenizer.decode(ids)
        info["document"] = peek
    return info


def check_ids_in_vocabulary(where: str, ids: np.ndarray, vocab_size: int, command: str) -> None:
    """A Hugging Face tokenizer decodes an id it lacks as nothing: the text shown would hide that
    the data was tokenized with another tokenizer. `where`: 'prefix: document 3'. A negative id
    (a signed token dtype over unsigned tokens) made its decode raise OverflowError, a traceback."""
    if ids.size and int(ids.min()) < 0:
        raise DataError(
            f"{where} holds token id {int(ids.min())}, and no token id is negative: the .bin is damaged, "
            "or the .idx names a signed token dtype the tokens were not written in; prepare the data again"
        )
    foreign = ids[ids >= vocab_size]
    if foreign.size:
        raise DataError(
            f"{where} holds token id {int(foreign.max())}, not in the tokenizer's {vocab_size}-token "
            f"vocabulary: the data was tokenized with another tokenizer; {command} it with that one, "
            "or without a tokenizer"
        )


def format_summary(info: dict[str, Any], as_json: bool = False) -> str:
    if as_json:
        return json.dumps(info, ensure_ascii=False)
    lines = [
        f"dataset     {info['prefix']}",
        f"documents   {info['documents']:,} ({info['empty_documents']:,} empty)",
        f"sequences   {info['sequences']:,}",
        f"tokens      {info['tokens']:,} ({info['dtype']})",
    ]
    if info["document_length"]:
        parts = "  ".join(f"{k} {v:,.1f}" for k, v in info["document_length"].items())
        lines.append(f"doc length  {parts}")
    peek = info.get("document")
    if peek:
        lines.append(f"document {peek['index']}: first {len(peek['ids'])} of {peek['num_tokens']:,} tokens")
        lines.append(f"  ids   {peek['ids']}")
        if "text" in peek:
            lines.append(f"  text  {peek['text']!r}")
    return "\n".join(lines)
