"""Time GPT index building (document, sample and shuffle indices) and blending on synthetic data.

The reference point is Megatron-LM's C++ helpers on this machine kind: 1,000,000 documents
(993 M tokens), seq 2048, 1 M train samples requested (1,425,866 built) plus valid: 0.25 s;
3 M requested: 0.73 s; seq 1024 and 5 M requested: 0.56 s.

    python bench/index_build.py            # prints one line per case, seconds
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gptrain.data.blended import blending_indices, normalize
from gptrain.data.gpt_dataset import build_gpt_indices
from gptrain.data.splits import split_indices
from gptrain.errors import GptrainError


def time_gpt_case(
    lengths: np.ndarray, seq_length: int, train_samples: int, valid_samples: int
) -> tuple[float, int]:
    """Seconds to build train + valid indices of a "98,2,0" split; and the train sample count."""
    train, valid, _ = split_indices("98,2,0", len(lengths))
    start = time.perf_counter()
    _, sample_index, _ = build_gpt_indices(lengths, train, train_samples, seq_length, seed=1234)
    build_gpt_indices(lengths, valid, valid_samples, seq_length, seed=1234)
    return time.perf_counter() - start, sample_index.shape[0] - 1


def time_blend(num_datasets: int, size: int) -> float:
    weights = normalize(np.random.default_rng(0).random(num_datasets).tolist())
    start = time.perf_counter()
    blending_indices(weights, size)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="report the best of this many runs")
    args = parser.parse_args()
    lengths = np.random.default_rng(0).integers(1, 1987, size=args.documents).astype(np.int32)
    print(f"{args.documents:,} documents, {int(lengths.sum(dtype=np.int64)):,} tokens")
    for seq_length, train_samples in ((2048, 1_000_000), (2048, 3_000_000), (1024, 5_000_000)):
        runs = [time_gpt_case(lengths, seq_length, train_samples, 10_000) for _ in range(args.repeat)]
        seconds, built = min(runs)
        print(
            f"gpt indices  seq {seq_length}  {train_samples:>9,} requested ({built:,} built) + valid: {seconds:.3f} s"
        )
    for num_datasets, size in ((2, 10_000_000), (10, 1_000_000)):
        seconds = min(time_blend(num_datasets, size) for _ in range(args.repeat))
        print(f"blending     {num_datasets:>2} datasets  {size:>10,} samples: {seconds:.3f} s")


if __name__ == "__main__":
    try:
        main()
    except GptrainError as error:  # too few --documents for a split: one line, no traceback
        raise SystemExit(f"index_build.py: {error}") from None
