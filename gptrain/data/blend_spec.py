"""A data_prefix's blend, read as Megatron reads it: one prefix, or [weight, prefix, ...] pairs.

Nothing but the standard library: `gptrain launch` checks a blend on the login node with it
before the job waits in the queue, and the job itself builds its datasets from it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gptrain.errors import DataError

__all__ = [
    "MAX_BLEND_DATASETS",
    "check_data_prefix",
    "is_number",
    "parse_blend",
    "prefixes_of",
    "strip_suffix",
    "text_document_hint",
    "unweighted_list_error",
    "yaml_number_note",
    "with_prefixes",
]

# Megatron's blend index names a dataset in an int16: at most 32,766 datasets in one blend.
MAX_BLEND_DATASETS = 32766


def strip_suffix(path_prefix: str) -> str:
    """Accept `data.bin` or `data.idx` where a prefix `data` is meant."""
    return path_prefix[:-4] if path_prefix.endswith((".bin", ".idx")) else path_prefix


def text_document_hint(prefix: str) -> str:
    """Where `prefix` names no dataset but `<prefix>_text_document` does, the question that says so:
    Megatron's preprocess_data.py, like `gptrain data prepare`, names the output of `--output-prefix
    P` P_text_document, and scripts often pass P itself on to --data-path. Else ''."""
    meant = strip_suffix(prefix) + "_text_document"
    if not all(os.path.isfile(meant + suffix) for suffix in (".bin", ".idx")):
        return ""
    return (
        f"did you mean {meant}? (preprocess_data.py and gptrain data prepare name their output"
        " <--output-prefix>_text_document)"
    )


def parse_blend(
    data_prefix: str | float | Sequence[str | float],
) -> tuple[list[str], list[float] | None]:
    """(prefixes, weights or None) from one prefix or a flat [w1, p1, w2, p2, ...] list. A number
    alone is a prefix too (YAML reads `data_prefix: 2024` as an int; Megatron reads the word `2024`).
    A weight of 0 is taken, as Megatron takes it: the dataset is opened and indexed but asked for no
    samples (the greedy blend still draws from it on an exact tie of errors, as Megatron's does)."""
    if isinstance(data_prefix, (str, int, float)):
        return [str(data_prefix)], None
    entries = list(data_prefix)
    if len(entries) == 1:
        return [str(entries[0])], None
    if not entries:
        raise DataError("data prefix list is empty; give one prefix or pairs 'WEIGHT PREFIX ...'")
    if len(entries) % 2 or not any(is_number(raw) for raw in entries[::2]):
        raise unweighted_list_error(entries)
    prefixes, weights = [], []
    for position in range(0, len(entries), 2):
        raw, prefix = entries[position], entries[position + 1]
        try:
            weight = float(raw)
        except (TypeError, ValueError):
            raise DataError(
                f"data prefix entry {position + 1} ({raw!r}) is not a weight; write pairs 'WEIGHT PREFIX ...'"
            ) from None
        if not weight >= 0 or not math.isfinite(weight):
            raise DataError(
                f"data prefix entry {position + 1}: weight {raw!r} of {prefix} must be 0 or more (0 asks "
                "the dataset for no samples, as in Megatron)"
            )
        prefixes.append(str(prefix).strip())
        weights.append(weight)
    if not sum(weights) > 0:  # Megatron divides by the sum: every weight NaN, and no sample drawn
        raise DataError(f"data prefix list {entries}: the weights sum to 0; give a dataset a positive weight")
    if len(prefixes) > MAX_BLEND_DATASETS:  # said before the datasets are opened and indexed one by one
        raise DataError(
            f"data prefix list blends {len(prefixes):,} datasets; a blend holds at most "
            f"{MAX_BLEND_DATASETS:,} (its index names a dataset in an int16, as Megatron's): merge "
            "shards first (gptrain data merge)"
        )
    return prefixes, weights


def check_data_prefix(data_prefix: Any, key: str = "model.data.data_prefix") -> None:
    """Each blend of a data_prefix (one, or one per split) read as the datasets' builder reads it, and
    each prefix's .bin/.idx looked up, in one line naming `key`: a job says so before it starts its
    process group, run directory, tokenizer and model, not minutes later as it builds its data."""
    from gptrain.data.pair_check import pair_problem  # it imports this module

    specs = data_prefix.items() if isinstance(data_prefix, Mapping) else [(None, data_prefix)]
    for split, spec in specs:
        if spec is None or spec == "" or isinstance(spec, Mapping):  # none, or the builder's to refuse
            continue
        where = key if split is None else f"{key}.{split}"
        try:
            prefixes, _ = parse_blend(spec)
        except DataError as error:
            raise DataError(f"{where}: {error}") from None
        for prefix in prefixes:
            if (problem := pair_problem(prefix)) is not None:
                raise DataError(f"{where}: {problem}{yaml_number_note(data_prefix, prefix)}")


def prefixes_of(data_prefix: Any, splits: Collection[str] | None = None) -> list[str]:
    """The dataset prefixes a data_prefix names (one prefix, a [weight, prefix, ...] blend, or either
    per split; only the `splits` of a per-split one, where given), numbers as the words Megatron
    reads. Launch, eval and the checks before them walk the shapes here alone: a walker of their own
    missed a shape (a number was a TypeError). A blend that does not parse names none, for the
    builder (or launch's blend check) to refuse in its own words."""
    if isinstance(data_prefix, Mapping):
        chosen = [spec for key, spec in data_prefix.items() if splits is None or key in splits]
        return [prefix for spec in chosen for prefix in prefixes_of(spec)]
    return [prefix for prefix, _ in _prefix_positions(data_prefix)]


def with_prefixes(data_prefix: Any, change: Callable[[str], str]) -> Any:
    """`data_prefix` in its own shape with each prefix `p` (as prefixes_of reads it) replaced by
    change(p); weights, and a blend that does not parse, are left as they are."""
    if isinstance(data_prefix, Mapping):
        return {key: with_prefixes(spec, change) for key, spec in data_prefix.items()}
    positions = _prefix_positions(data_prefix)
    if not positions:
        return data_prefix
    if isinstance(data_prefix, (str, int, float)):
        return change(positions[0][0])
    entries = list(data_prefix)
    for prefix, position in positions:
        entries[position] = change(prefix)
    return entries


def yaml_number_note(data_prefix: Any, prefix: str) -> str:
    """Where `prefix` (or its last name, made absolute since) is a number's word in `data_prefix`,
    the note for its not-found line: YAML reads an unquoted 007 as 7 (and 0x10 as 16, 2024_01 as
    202401, 1.50 as 1.5, 1e3 as 1000.0), so the dataset named is another than the file's. Else ''."""
    name = os.path.basename(strip_suffix(str(prefix)))
    if name not in _number_words(data_prefix):
        return ""
    return (
        f"; YAML read this prefix as the number {name} (an unquoted 007 is 7, 0x10 is 16, 2024_01 is "
        '202401, 1e3 is 1000.0): quote the name as the file has it, e.g. data_prefix: "007"'
    )


def _number_words(data_prefix: Any) -> set[str]:
    """The words of the prefixes that YAML gave as numbers (not strings) in a data_prefix."""
    if isinstance(data_prefix, Mapping):
        return {word for spec in data_prefix.values() for word in _number_words(spec)}
    entries = [data_prefix] if isinstance(data_prefix, (str, int, float)) else list(data_prefix or [])
    return {
        prefix
        for prefix, position in _prefix_positions(data_prefix)
        if isinstance(entries[position], (int, float)) and not isinstance(entries[position], bool)
    }


def _prefix_positions(spec: Any) -> list[tuple[str, int]]:
    """(prefix, its index in the blend list) of one split's data_prefix; none where it is empty,
    a mapping or does not parse."""
    if spec is None or spec == "" or isinstance(spec, Mapping):
        return []
    try:
        prefixes, weights = parse_blend(spec)
    except (DataError, TypeError):
        return []
    return list(zip(prefixes, range(1, 2 * len(prefixes), 2) if weights else [0], strict=True))


def is_number(raw: str | float) -> bool:
    """A weight's spelling (`0.3`, `1e-2`, `3`), as Megatron tells weights from prefixes."""
    try:
        float(raw)
    except (TypeError, ValueError):
        return False
    return True


def unweighted_list_error(entries: list[str | float]) -> DataError:
    """Megatron reads an odd-length list, or one without any weight, as 'each dataset once'."""
    example = " ".join(f"1 {str(entry).strip()}" for entry in entries[:3]) + (
        " ..." if len(entries) > 3 else ""
    )
    return DataError(
        f"data prefix list {entries} is Megatron's unweighted form (every dataset once, mixed in proportion "
        f"to its size), which gptrain does not support; put a weight before each prefix instead, "
        f"e.g. '{example}' (weights proportional to the datasets' token counts give Megatron's mix)"
    )
