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
    data_prefix: str | float | Sequence[str | float], *, one_split: bool = False
) -> tuple[list[str], list[float] | None]:
    """(prefixes, weights or None) from one prefix or a flat [w1, p1, w2, p2, ...] list. A number
    alone is a prefix too (YAML reads `data_prefix: 2024` as an int; Megatron reads the word `2024`).
    Every weight must be positive: Megatron-core's BlendedDataset asserts it (only the legacy
    blendable_dataset.py took a 0). `one_split`: the spec is one split's own (NeMo's per-split form,
    --valid-data-path), whose lone `[WEIGHT, PREFIX]` Megatron builds as the plain dataset, its
    weight unused: any weight of 0 or more is taken there."""
    prefixes, weights = _read_blend(data_prefix)
    if weights is None:
        return prefixes, None
    lone = one_split and len(weights) == 1
    for number, (prefix, weight) in enumerate(zip(prefixes, weights, strict=True)):
        if not math.isfinite(weight) or not (weight >= 0 if lone else weight > 0):
            raw = list(data_prefix)[2 * number]  # type: ignore[arg-type]
            raise DataError(
                f"data prefix entry {2 * number + 1}: {_weight_problem(raw, weight, prefix, lone)}"
            )
    if len(prefixes) > MAX_BLEND_DATASETS:  # said before the datasets are opened and indexed one by one
        raise DataError(
            f"data prefix list blends {len(prefixes):,} datasets; a blend holds at most "
            f"{MAX_BLEND_DATASETS:,} (its index names a dataset in an int16, as Megatron's): merge "
            "shards first (gptrain data merge)"
        )
    return prefixes, weights


def _read_blend(data_prefix: str | float | Sequence[str | float]) -> tuple[list[str], list[float] | None]:
    """parse_blend's (prefixes, weights) by the list's shape alone, whatever the weights' values: the
    prefixes a blend names, which launch reads before its weights are judged."""
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
            weights.append(float(raw))
        except (TypeError, ValueError):
            raise DataError(
                f"data prefix entry {position + 1} ({raw!r}) is not a weight; write pairs 'WEIGHT PREFIX ...'"
            ) from None
        prefixes.append(str(prefix).strip())
    return prefixes, weights


def _weight_problem(raw: str | float, weight: float, prefix: str | float, lone: bool) -> str:
    """Why a weight is refused, and what to do instead."""
    if lone:  # a split's one prefix: built alone, its weight unused, yet a negative one is a typo
        return f"weight {raw!r} of {prefix} must be 0 or more (a split's one prefix is built alone, as in Megatron)"
    if weight == 0:
        return (
            f"weight {raw!r} of {prefix} must be positive: Megatron-core's BlendedDataset refuses a weight "
            "of 0 too; drop the entry, or give it a positive weight"
        )
    return f"weight {raw!r} of {prefix} must be positive"


def check_data_prefix(
    data_prefix: Any, key: str = "model.data.data_prefix", splits: Collection[str] | None = None
) -> None:
    """Each blend of a data_prefix (one, or one per split) read as the datasets' builder reads it, and
    each prefix's .bin/.idx looked up, in one line naming `key`: a job says so before it starts its
    process group, run directory, tokenizer and model, not minutes later as it builds its data.
    `splits`: the per-split keys the job builds (target_sizes.built_split_keys); the files of another
    split are not looked up, as the builder does not open them (its weights are still read)."""
    from gptrain.data.pair_check import pair_problem  # it imports this module

    specs = data_prefix.items() if isinstance(data_prefix, Mapping) else [(None, data_prefix)]
    for split, spec in specs:
        if spec is None or spec == "" or isinstance(spec, Mapping):  # none, or the builder's to refuse
            continue
        where = key if split is None else f"{key}.{split}"
        try:
            prefixes, _ = parse_blend(spec, one_split=split is not None)
        except DataError as error:
            raise DataError(f"{where}: {error}") from None
        if split is not None and splits is not None and split not in splits:
            continue
        for prefix in prefixes:
            if (problem := pair_problem(prefix)) is not None:
                raise DataError(f"{where}: {problem}{yaml_number_note(data_prefix, prefix)}")


def prefixes_of(data_prefix: Any, splits: Collection[str] | None = None) -> list[str]:
    """The dataset prefixes a data_prefix names (one prefix, a [weight, prefix, ...] blend, or either
    per split; only the `splits` of a per-split one, where given), numbers as the words Megatron
    reads. Launch, eval and the checks before them walk the shapes here alone: a walker of their own
    missed a shape (a number was a TypeError). A blend's prefixes are named whatever its weights (launch
    reads them before it judges the weights); a list not of a blend's shape names none, for the builder
    (or launch's blend check) to refuse in its own words."""
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
    """(prefix, its index in the blend list) of one split's data_prefix, whatever its weights' values;
    none where it is empty, a mapping or not the shape of a blend."""
    if spec is None or spec == "" or isinstance(spec, Mapping):
        return []
    try:
        prefixes, weights = _read_blend(spec)
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
    pairs = [str(entry).split() for entry in entries]
    if all(len(words) == 2 and is_number(words[0]) for words in pairs):  # "0.3 a" per item: weighted
        return DataError(
            f"data prefix list {entries} holds a weight and its prefix in one string per entry, which "
            "Megatron too reads as one prefix (a dataset named after both); give them as separate entries: "
            f"[{','.join(word for words in pairs for word in words)}] in a config, unquoted words on a command line"
        )
    head = (
        f"data prefix list {entries} is Megatron's unweighted form (every dataset once, mixed in proportion "
        "to its size), which gptrain does not support; "
    )
    if any(is_number(entry) for entry in entries):
        return DataError(head + _numbers_note(entries))
    example = " ".join(f"1 {str(entry).strip()}" for entry in entries[:3]) + (
        " ..." if len(entries) > 3 else ""
    )
    return DataError(
        head + f"put a weight before each prefix instead, e.g. '{example}' (weights proportional to the "
        "datasets' token counts give about Megatron's proportions, not its samples or their order)"
    )


def _numbers_note(entries: list[str | float]) -> str:
    """That a list's numbers are read as prefixes, and the blend they more likely meant: `0.3 a 0.7` is
    a blend short of a prefix, and `a 0.3 b 0.7` one with its weights after their prefixes (Megatron's
    get_blend_from_list reads an even list with no weight at its odd entries as prefixes alone), rather
    than datasets named 0.3 and 0.7. The example had turned the numbers into prefixes: '1 0.3 1 a 1 0.7'."""
    numbered = [(position, entry) for position, entry in enumerate(entries, 1) if is_number(entry)]
    words = [str(position) for position, _ in numbered]
    positions = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
    values = ", ".join(str(entry).strip() for _, entry in numbered)
    read = f"entry {positions} ({values}) read as a prefix" if len(numbered) == 1 else (
        f"entries {positions} ({values}) read as prefixes"
    )  # fmt: skip
    they = "it is a weight" if len(numbered) == 1 else "they are weights"
    if len(entries) % 2:
        fix = f"as Megatron reads an odd list: if {they}, a prefix or a weight is missing"
    else:
        fix = f"as Megatron reads an even list with no weight at its odd entries (1, 3, ...): if {they}, put {'it' if len(numbered) == 1 else 'each'} before its prefix"
    return f"{read}, {fix}, e.g. '{_likely_blend(entries)}'"


def _likely_blend(entries: list[str | float]) -> str:
    """The weighted list the entries most likely meant (its first 3 pairs): each number the weight of the
    prefix next to it (before or after), WEIGHT or PREFIX where one has none."""
    pairs: list[tuple[str, str]] = []
    weight: str | None = None
    prefix: str | None = None
    for entry in (str(raw).strip() for raw in entries):
        if is_number(entry):
            if weight is not None:
                pairs.append((weight, "PREFIX"))
            weight = entry
        else:
            if prefix is not None:
                pairs.append(("WEIGHT", prefix))
            prefix = entry
        if weight is not None and prefix is not None:
            pairs.append((weight, prefix))
            weight = prefix = None
    if weight is not None or prefix is not None:
        pairs.append((weight or "WEIGHT", prefix or "PREFIX"))
    return " ".join(f"{w} {p}" for w, p in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
