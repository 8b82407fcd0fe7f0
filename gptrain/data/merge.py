"""`gptrain data merge`: concatenate indexed datasets, as Megatron's tools/merge_datasets.py does.

Inputs are prefixes, or directories (every dataset in them, sorted by name, as Megatron's
tool takes them). The result is byte-identical to writing all documents of the inputs, in the order
given, into one dataset; the `.bin` files are copied in large blocks. Every input is opened and
verified before the first byte is copied; progress (bytes of all input `.bin` files) goes to stderr.
The inputs' common tokenizer record (gptrain.data.tokenizer_record) goes with the result.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from gptrain.data.finalize import Companion, finalize_together, state_after
from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter, strip_suffix
from gptrain.data.jsonl import file_identity
from gptrain.data.record_mix import mixed_preparation_lines
from gptrain.data.tokenizer_fingerprint import describe
from gptrain.data.tokenizer_record import (
    SUFFIX,
    TOKENIZER_APPENDS_EOD,
    merged_record,
    new_record,
    read_tokenizer_record,
    record_companion,
    refuse_foreign_record_file,
)
from gptrain.errors import DataError
from gptrain.utils.progress import Progress

# Seconds between progress lines while copying (a merge may copy terabytes).
PROGRESS_SECONDS = 10.0


def _expand(path: str) -> list[str]:
    """A directory stands for every dataset in it, in sorted order (as merge_datasets.py does).

    A prefix whose .bin/.idx exist is that dataset, though a directory has its name too: Megatron
    keeps its index cache in `<prefix>/cache/`, and such a prefix was 'directory holds no .bin/.idx
    datasets'. Where that directory holds datasets as well, the user says which is meant."""
    if not os.path.isdir(path):
        return [strip_suffix(path)]
    prefixes = sorted(
        {os.path.join(path, name[:-4]) for name in _listing(path) if name.endswith((".bin", ".idx"))}
    )
    if IndexedDataset.exists(path):
        if prefixes:
            raise DataError(
                f"--input {path}: both the dataset {path}.bin/.idx and a directory of {len(prefixes)} "
                f"datasets; write {path}.idx for the dataset, or {path}{os.sep} for the directory"
            )
        return [path]
    if not prefixes:
        raise DataError(f"--input {path}: directory holds no .bin/.idx datasets")
    return prefixes


def _listing(directory: str) -> list[str]:
    """The names in an input directory; one this user may not read was a bare 'Permission denied'."""
    try:
        return os.listdir(directory)
    except OSError as error:
        raise DataError(
            f"--input {directory}: the directory cannot be listed ({error.strerror or error}); check its "
            "permissions, or give the prefixes of its datasets"
        ) from None


@dataclass(frozen=True)
class MergeResult:
    """What `merge_datasets` wrote, for the summary line."""

    datasets: int  # inputs after directories are expanded
    documents: int
    tokens: int
    path_prefix: str


def merge_datasets(inputs: list[str], output_prefix: str, stream: TextIO | None = None) -> MergeResult:
    """Write `output_prefix.bin/.idx` from `inputs` in order, with progress lines on `stream`."""
    if not inputs:
        raise DataError("--input: give at least one dataset prefix to merge")
    prefixes = [prefix for p in inputs for prefix in _expand(p)]
    output_prefix = strip_suffix(output_prefix)
    _refuse_a_directory_as_output(output_prefix)
    for prefix in prefixes:
        if Path(prefix).resolve() == Path(output_prefix).resolve():
            raise DataError(f"--output-prefix {output_prefix} is also an input; choose a new name")
    _refuse_repeated_inputs(prefixes)
    dtype, total_bytes = _check_inputs(prefixes)
    record = merged_record(prefixes)  # inputs of both --legacy-tokenizer settings refused here
    for line in mixed_preparation_lines(prefixes, "--input"):  # with and without --append-eod
        print(line, file=sys.stderr)
    if record is not None:  # a file of the user's where the record goes: said before writing
        refuse_foreign_record_file(output_prefix, "--output-prefix", "merge")
    progress = Progress(
        "merge", "datasets", total_bytes=total_bytes, interval=PROGRESS_SECONDS, stream=stream
    )
    try:
        with IndexedDatasetWriter(output_prefix, dtype) as writer:
            for prefix in prefixes:
                writer.add_index(prefix, on_copied=lambda size: progress.update(0, size))
                progress.update(1)
            finalize_together([writer], [_carried_record(output_prefix, record)])
    except OSError as error:  # disk full, permissions: the inputs were validated on open
        if (state := state_after(error)) is not None:  # past the first rename: the new data may be in place
            raise DataError(f"--output-prefix {output_prefix}: {error}, {state}") from None
        raise DataError(f"--output-prefix {output_prefix}: cannot write ({error})") from None
    IndexedDataset(output_prefix).verify()  # reads only the .idx, ~1/1000 of the copied bytes
    return MergeResult(len(prefixes), writer.num_documents, writer.num_tokens, writer.path_prefix)


def _carried_record(output_prefix: str, record: dict | None) -> Companion:
    """The inputs' common tokenizer record, finished with the merged dataset (gptrain.data.tokenizer_record),
    so training still checks it; where they have none in common, none (an older one removed)."""
    if record is None:
        return record_companion(output_prefix, None)
    carried = new_record(
        record["type"],
        record["legacy"],
        record.get("vocabulary"),
        record.get("append_eod"),
        record.get(TOKENIZER_APPENDS_EOD) is True,
    )
    return record_companion(output_prefix, carried)


def _refuse_a_directory_as_output(output_prefix: str) -> None:
    """A prefix that names a directory (`out/`, `.`) wrote the hidden files out/.bin and out/.idx,
    which `ls` does not show: the merge seemed to have written nothing."""
    if os.path.basename(output_prefix) in ("", ".", ".."):
        example = os.path.join(output_prefix, "merged")
        raise DataError(
            f"--output-prefix {output_prefix}: names a directory, not a dataset; add the dataset's name "
            f"(--output-prefix {example} writes {example}.bin/.idx)"
        )


def _refuse_repeated_inputs(prefixes: list[str]) -> None:
    """A dataset named twice (or by its name and its directory) would be copied twice."""
    seen: dict[tuple[int, int], str] = {}
    for prefix in prefixes:
        index = Path(prefix + ".idx")
        if not os.path.isfile(index):  # False too where a directory may not be searched (EACCES)
            continue  # named as missing, or unreachable, by the checks that follow
        identity = file_identity(index)
        if identity in seen:
            first = seen[identity]
            same = "given twice" if first == prefix else f"the same dataset as {first}"
            raise DataError(
                f"--input {prefix}: {same}; its documents would be in the merged dataset twice: "
                "name each dataset once"
            )
        seen[identity] = prefix


def _check_inputs(prefixes: list[str]) -> tuple[np.dtype, int]:
    """(token dtype, total .bin bytes) of the inputs, every one opened and verified before a byte
    is copied: a wrong dtype or index in the last input must not cost a copy of all the others.
    None stays open: thousands of inputs would hold two file descriptors each."""
    first = IndexedDataset(prefixes[0])
    dtype, total_bytes = first.dtype, 0
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)
        if dataset.dtype != dtype:
            raise DataError(_dtype_mismatch(first, dataset))
        dataset.verify()
        total_bytes += dataset.num_tokens * dtype.itemsize
    return dtype, total_bytes


def _dtype_mismatch(first: IndexedDataset, other: IndexedDataset) -> str:
    """Inputs of two token dtypes: two tokenizers, or uint16 and int32 of one vocabulary numbered
    with a gap, which gptrain wrote int32 by its highest id before it took Megatron's rule (the
    count: optimal_dtype); the int32 one is then the older, to prepare again. The inputs' tokenizer
    records tell which where both have one: other vocabularies are said as such (preparing again
    gives the same dtype again), and NullTokenizer, whose ids have no gaps, gets no such note."""
    line = f"{other.idx_path}: tokens are {other.dtype}, {first.idx_path} holds {first.dtype}; "
    line += "merge only datasets made with the same tokenizer"
    if {first.dtype.name, other.dtype.name} != {"uint16", "int32"}:
        return line
    older = first if first.dtype == np.int32 else other
    prefixes = [first.path_prefix, other.path_prefix]
    records = [read_tokenizer_record(prefix) for prefix in prefixes]
    if records[0] is None or records[1] is None:
        missing = prefixes[records.index(None)]
        return line + _perhaps_gapped(older, f"{missing} has no {SUFFIX} record to tell")
    merged_record(prefixes)  # other vocabularies (or --legacy-tokenizer settings): that line
    vocabularies = [record.get("vocabulary") for record in records]
    if isinstance(vocabularies[0], dict) and isinstance(vocabularies[1], dict):  # the same: compared
        size = vocabularies[0].get("size")
        if not (isinstance(size, int) and 65500 <= size <= 65536):
            return line
        described = describe(records[0]["type"], vocabularies[0])
        return (
            f"{other.idx_path}: tokens are {other.dtype}, {first.idx_path} holds {first.dtype}, both of one "
            f"vocabulary ({described}, ids to {size - 1}, by their {SUFFIX} records): prepare "
            f"{older.path_prefix} again: {_WHY_INT32}"
        )
    types = [record["type"] for record in records]
    if types == ["NullTokenizer", "NullTokenizer"]:
        return line + (
            f" (both NullTokenizer by their {SUFFIX} records, its dtype uint16 for a --vocab-size below "
            "65,500: prepare one again with the other's --vocab-size)"
        )
    if "NullTokenizer" in types:
        return line + f" (by their {SUFFIX} records: {types[0]} and {types[1]})"
    lacking = prefixes[0] if not isinstance(vocabularies[0], dict) else prefixes[1]
    return line + _perhaps_gapped(older, f"the {SUFFIX} record of {lacking} keeps no vocabulary to tell")


_WHY_INT32 = (
    "gptrain wrote such a vocabulary's tokens as int32 before it took Megatron's rule for the .bin dtype "
    "(the count of tokens, not the highest id + 1), and writes uint16 now, as Megatron does"
)


def _perhaps_gapped(older: IndexedDataset, unknown: str) -> str:
    return (
        f", or, where they were (a vocabulary of fewer than 65,500 tokens whose ids reach 65,499..65,535; "
        f"{unknown}), prepare {older.path_prefix} again: {_WHY_INT32}"
    )
