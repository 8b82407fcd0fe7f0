"""`gptrain data inspect`: what is in a `.bin`/`.idx` pair, in numbers and decoded text."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from gptrain.data.indexed import IndexedDataset
from gptrain.data.tokenizers import Tokenizer
from gptrain.errors import DataError

PERCENTILES = (0, 50, 90, 99, 100)


def document_lengths(dataset: IndexedDataset) -> np.ndarray:
    """Tokens per document (a document may hold several sequences, or none)."""
    seq_ends = np.zeros(len(dataset) + 1, dtype=np.int64)
    np.cumsum(dataset.sequence_lengths, dtype=np.int64, out=seq_ends[1:])
    docs = dataset.document_indices
    return seq_ends[docs[1:]] - seq_ends[docs[:-1]]


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
    if len(lengths):
        values = np.percentile(lengths, PERCENTILES)
        stats = {f"p{p}": float(v) for p, v in zip(PERCENTILES, values, strict=True)}
        stats["mean"] = float(lengths.mean())
        info["document_length"] = stats
    if dataset.num_documents and num_tokens > 0:
        ids = document_tokens(dataset, document, num_tokens)
        peek: dict[str, Any] = {"index": document, "num_tokens": int(lengths[document]), "ids": ids.tolist()}
        if tokenizer is not None:
            peek["text"] = tokenizer.decode(ids)
        info["document"] = peek
    return info


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
