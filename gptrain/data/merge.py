"""`gptrain data merge`: concatenate indexed datasets, as Megatron's tools/merge_datasets.py does.

Inputs are prefixes, or directories (every dataset in them, sorted by name, as Megatron's
tool takes them). The result is byte-identical to writing all documents of the inputs, in the order
given, into one dataset; the `.bin` files are copied in large blocks.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter, strip_suffix
from gptrain.errors import DataError


def _expand(path: str) -> list[str]:
    """A directory stands for every dataset in it, in sorted order (as merge_datasets.py does)."""
    if not os.path.isdir(path):
        return [strip_suffix(path)]
    prefixes = sorted(
        {os.path.join(path, name[:-4]) for name in os.listdir(path) if name.endswith((".bin", ".idx"))}
    )
    if not prefixes:
        raise DataError(f"--input {path}: directory holds no .bin/.idx datasets")
    return prefixes


def merge_datasets(inputs: list[str], output_prefix: str) -> IndexedDatasetWriter:
    """Write `output_prefix.bin/.idx` from `inputs` in order; returns the finished writer (counts)."""
    if not inputs:
        raise DataError("--input: give at least one dataset prefix to merge")
    prefixes = [prefix for p in inputs for prefix in _expand(p)]
    output_prefix = strip_suffix(output_prefix)
    for prefix in prefixes:
        if Path(prefix).resolve() == Path(output_prefix).resolve():
            raise DataError(f"--output-prefix {output_prefix} is also an input; choose a new name")
    dtype = IndexedDataset(prefixes[0]).dtype
    try:
        with IndexedDatasetWriter(output_prefix, dtype) as writer:
            for prefix in prefixes:
                writer.add_index(prefix)
    except OSError as error:  # disk full, permissions: the inputs were validated on open
        raise DataError(f"--output-prefix {output_prefix}: cannot write ({error})") from None
    IndexedDataset(output_prefix).verify()  # reads only the .idx, ~1/1000 of the copied bytes
    return writer
