"""Small datasets and slow, obviously-correct references for the GPT sampling tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).parent / "fixtures" / "megatron_gpt_indices.json"


def fixture_token(doc: int, position: int) -> int:
    """Token `position` of document `doc` in the Megatron fixture datasets (see its note)."""
    return (doc * 1009 + position * 7 + 1) % 50000


def write_dataset(prefix: Path, lengths: list[int]) -> str:
    """A real .bin/.idx pair whose document d holds fixture_token(d, 0..len-1)."""
    from gptrain.data.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        for doc, length in enumerate(lengths):
            writer.add_document(np.array([fixture_token(doc, j) for j in range(length)], dtype=np.int64))
    return str(prefix)


def load_fixture() -> dict:
    return json.loads(FIXTURE.read_text())["cases"]


class InMemorySequences:
    """The part of IndexedDataset a GPTDataset reads, over Python lists of tokens."""

    def __init__(self, documents: list[list[int]], path_prefix: str = "/nonexistent/in-memory") -> None:
        self.documents = documents
        self.path_prefix = path_prefix
        self.sequence_lengths = np.array([len(d) for d in documents], dtype=np.int32)

    def verify(self) -> None:
        """Python lists are consistent by construction."""

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        doc = self.documents[idx]
        end = len(doc) if length is None else offset + length
        assert 0 <= offset <= end <= len(doc)
        return np.array(doc[offset:end], dtype=np.int64)


def slow_sample_index(lengths: list[int], document_index: list[int], seq: int, extra: int) -> list[list[int]]:
    """Megatron's sample-index walk, one token at a time (the documented C++ semantics)."""
    total = sum(lengths[d] for d in document_index)
    count = (total - extra) // seq
    rows = [[0, 0]]
    position, offset = 0, 0
    for _ in range(count):
        need = seq + extra
        while True:
            available = lengths[document_index[position]] - offset
            if need <= available:
                offset += need - extra  # the last token is shared with the next sample
                break
            need -= available
            position, offset = position + 1, 0
        rows.append([position, offset])
    return rows


def slow_blend(weights: list[float], size: int) -> tuple[list[int], list[int]]:
    """Megatron's greedy blending rule, one sample at a time in plain Python floats."""
    counts = [0] * len(weights)
    chosen, within = [], []
    for k in range(size):
        scale = float(max(k, 1))
        errors = [w * scale - c for w, c in zip(weights, counts, strict=True)]
        best = max(range(len(weights)), key=lambda i: (errors[i], -i))
        chosen.append(best)
        within.append(counts[best])
        counts[best] += 1
    return chosen, within
