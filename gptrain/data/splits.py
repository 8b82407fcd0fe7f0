"""Train/valid/test split strings ("98,2,0") parsed and applied exactly as Megatron-LM does.

The same string must carve the same sequence ranges out of a dataset as Megatron, or a
run resumed across the two systems would train on validation data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gptrain.config.validate import split_weights

if TYPE_CHECKING:
    import numpy as np

SPLIT_NAMES = ("train", "valid", "test")

# Megatron's default when --data-path is given without --split.
LEGACY_DEFAULT_SPLIT = "969, 30, 1"


def parse_split_string(splits_string: str | None) -> list[float]:
    """Weights of train/valid/test normalised to sum 1 (missing entries are 0); the string is read
    and checked by gptrain.config.validate.split_weights, which the config's check shares."""
    text = LEGACY_DEFAULT_SPLIT if splits_string is None else splits_string
    values = split_weights(text)
    # Megatron's numpy sum over three float64s adds them in order, as sum() does: the same bits,
    # without importing numpy for `gptrain megatron --dry-run` and the launcher
    total = sum(values)
    return [value / total for value in values]


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
    import numpy as np

    return [
        None if bounds is None else np.arange(bounds[0], bounds[1], dtype=np.int32)
        for bounds in split_ranges(splits_string, num_elements)
    ]
