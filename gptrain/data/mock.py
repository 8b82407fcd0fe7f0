"""Random-token GPT samples for benchmarks and smoke tests: no files, no index building.

Each sample is generated from (seed, index) alone, so any rank or dataloader worker
produces the same sample i without shared state, and a resumed run sees the same data.
"""

from __future__ import annotations

import json

import numpy as np

from gptrain.errors import ConfigError


class MockGPTDataset:
    """`length` samples of `seq_length + 1` ids uniform in [0, vocab_size)."""

    def __init__(
        self, length: int, seq_length: int, vocab_size: int, seed: int = 1234, split: str = "train"
    ) -> None:
        if length < 0 or seq_length < 1 or vocab_size < 1:
            raise ConfigError(
                f"mock data needs length >= 0, seq_length >= 1, vocab_size >= 1; got {length}, {seq_length}, {vocab_size}"
            )
        self.length, self.seq_length, self.vocab_size = length, seq_length, vocab_size
        self.seed, self.split = seed, split
        self._split_key = (
            ("train", "valid", "test").index(split) if split in ("train", "valid", "test") else 3
        )
        self.description = json.dumps(
            {"class": type(self).__name__, "length": length, "sequence_length": seq_length,
             "vocab_size": vocab_size, "random_seed": seed, "index_split": split},
            indent=4,
        )  # fmt: skip

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> np.ndarray:
        idx = int(idx)
        if idx < 0:
            idx += self.length
        if not 0 <= idx < self.length:
            raise IndexError(f"sample {idx} out of range for {self.length} mock samples")
        # One independent stream per (seed, split, index): no state shared between samples.
        rng = np.random.default_rng([self.seed, self._split_key, idx])
        return rng.integers(0, self.vocab_size, size=self.seq_length + 1, dtype=np.int64)
