"""Train/valid/test split strings ("98,2,0") parsed and applied exactly as Megatron-LM does.

The same string must carve the same sequence ranges out of a dataset as Megatron, or a
run resumed across the two systems would train on validation data.
"""

from __future__ import annotations

import re

import numpy as np

from gptrain.errors import ConfigError

SPLIT_NAMES = ("train", "valid", "test")

# Megatron's default when --data-path is given without --split.
LEGACY_DEFAULT_SPLIT = "969, 30, 1"

_NUMBER = re.compile(r"[.0-9]+")


def parse_split_string(splits_string: str | None) -> list[float]:
    """Weights of train/valid/test normalised to sum 1 (missing entries are 0).

    Like Megatron, every run of digits and dots counts as a number, so "98,2,0",
    "98 2 0" and "98/2" all parse; more than three numbers is an error.
    """
    text = LEGACY_DEFAULT_SPLIT if splits_string is None else splits_string
    stray = next((item for item in re.split(r"[,/\s]+", text) if re.search(r"[^0-9.]", item)), None)
    if stray:  # "nan,2,0" or "-1,2,0" would lose a sign or a word and mean other weights
        raise ConfigError(
            f"split string {text!r}: {stray!r} is not a weight; give non-negative numbers like '98,2,0'"
        )
    try:
        values = [float(match) for match in _NUMBER.findall(text)]
    except ValueError as error:
        raise ConfigError(f"split string {text!r}: {error}; write it like '98,2,0'") from error
    if len(values) > len(SPLIT_NAMES):
        raise ConfigError(
            f"split string {text!r} has {len(values)} numbers; give at most 3 (train,valid,test)"
        )
    values += [0.0] * (len(SPLIT_NAMES) - len(values))
    total = float(np.sum(np.array(values, dtype=np.float64)))
    if total <= 0:
        raise ConfigError(f"split string {text!r} sums to 0; give positive weights like '98,2,0'")
    return (np.array(values, dtype=np.float64) / total).tolist()


def split_bookends(weights: list[float]) -> list[tuple[float, float] | None]:
    """Cumulative (lo, hi) fraction per split; an empty interval means no dataset (None)."""
    bookends: list[tuple[float, float] | None] = []
    lo = 0.0
    for weight in weights:
        hi = lo + weight
        bookends.append((lo, hi) if hi > lo else None)
        lo = hi
    return bookends


def split_ranges(splits_string: str | None, num_elements: int) -> list[tuple[int, int] | None]:
    """[begin, end) of sequence indices per split (None where the split is empty)."""
    ranges: list[tuple[int, int] | None] = []
    for bookend in split_bookends(parse_split_string(splits_string)):
        if bookend is None:
            ranges.append(None)
            continue
        lo, hi = bookend
        ranges.append((int(round(lo * float(num_elements))), int(round(hi * float(num_elements)))))
    return ranges


def split_indices(splits_string: str | None, num_elements: int) -> list[np.ndarray | None]:
    """The int32 sequence indices each split exposes, as Megatron's builder makes them."""
    return [
        None if bounds is None else np.arange(bounds[0], bounds[1], dtype=np.int32)
        for bounds in split_ranges(splits_string, num_elements)
    ]
