"""Build the train/valid/test datasets from a prefix or a weighted blend, as Megatron-LM does.

No torch here: training wraps these numpy datasets in a torch Dataset, and the `data
sample` command must start fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gptrain.config.schema import PER_SPLIT_KEYS
from gptrain.data.blend_spec import parse_blend, yaml_number_note
from gptrain.data.blended import BlendedDataset, normalize
from gptrain.data.gpt_dataset import GPTDataset
from gptrain.data.map_limit import OutOfMemoryMaps
from gptrain.data.mock import MockGPTDataset
from gptrain.data.split_sizes import sample_counts  # noqa: F401  (its home before; callers import it here)
from gptrain.data.splits import LEGACY_DEFAULT_SPLIT, SPLIT_NAMES, split_ranges
from gptrain.errors import ConfigError, DataError

Dataset = GPTDataset | BlendedDataset | MockGPTDataset
DataPrefix = str | Sequence[str | float] | Mapping[str, "str | Sequence[str | float] | None"]


# The default of Megatron's --mid-level-dataset-surplus (model.data.mid_level_dataset_surplus): each
# blended child builds 0.5% more samples than its share, so rounding in the greedy blend seldom asks
# a child for a sample it lacks.
MID_LEVEL_SURPLUS = 0.005
# How errors name the surplus in a training config; `data sample` names its flag.
SURPLUS_KEY = "model.data.mid_level_dataset_surplus"

# The most tokens one split may ask for. Its index arrays (16 bytes a sample, 4 a document per
# epoch) must stay sizes numpy can address (2**63 bytes) and count (len()); past that numpy's
# ValueError or OverflowError was a traceback. The largest pretraining runs ask for under 2**45.
MAX_SPLIT_TOKENS = 2**58


def samples_per_dataset(
    weights: Sequence[float], num_samples: Sequence[int], surplus: float = 0.0
) -> list[list[int]]:
    """Samples each blended dataset contributes (surplus 0) or builds, per split.

    ceil(ceil(size * w) * (1 + surplus)): 8000 samples at [0.3, 0.7] take 2400 + 5600 and
    build 2412 + 5628 with Megatron's 0.5% surplus.
    """
    return [[math.ceil(math.ceil(size * w) * (1 + surplus)) for size in num_samples] for w in weights]


def _check_index_sizes(num_samples: Sequence[int], seq_length: int, asked_by: Sequence[str]) -> None:
    for name, count, source in zip(SPLIT_NAMES, num_samples, asked_by, strict=True):
        if count * seq_length > MAX_SPLIT_TOKENS:
            raise ConfigError(
                f"{source}: the {name} split asks for {count:,} samples of {seq_length} tokens "
                f"({count * seq_length:,} tokens), past the {MAX_SPLIT_TOKENS:,} (2**58) that its sample "
                "indices can address; ask for fewer"
            )


def _check_blend_requests(
    prefixes: Sequence[str], weights: Sequence[float], num_samples: Sequence[int], seq_length: int,
    surplus: float, surplus_named: str, only_split: str | None,
) -> None:  # fmt: skip
    """Each dataset's share grown by the surplus, checked in floats before math.ceil: a surplus of
    1e308 made it an OverflowError, 1e20 numpy's ValueError, both tracebacks blaming no setting."""
    for prefix, weight in zip(prefixes, weights, strict=True):
        for name, size in zip(SPLIT_NAMES, num_samples, strict=True):
            share = math.ceil(size * weight)
            request = share * (1 + surplus)
            if only_split in (None, name) and not request * seq_length <= MAX_SPLIT_TOKENS:
                raise ConfigError(
                    f"{surplus_named} {surplus}: {prefix} ({name} split) of {share:,} samples builds "
                    f"{request:.3g} samples of {seq_length} tokens, past the {MAX_SPLIT_TOKENS:,} (2**58) "
                    "tokens its sample indices can address; give a surplus nearer Megatron's default 0.005"
                )


def _check_prefixes(prefixes: list[str], data_prefix: DataPrefix) -> None:
    """Every prefix of a blend named before any is opened and indexed."""
    from gptrain.data.pair_check import pair_problem

    for prefix in prefixes:
        if (problem := pair_problem(prefix)) is not None:
            raise DataError(f"data prefix {prefix}: {problem}{yaml_number_note(data_prefix, prefix)}")


def _single_prefix_splits(
    prefix: str, splits_string: str | None, seq_length: int, seed: int, num_samples: Sequence[int | None],
    cache_dir: str | None, skip_unused: bool = False, only_split: str | None = None,
) -> list[GPTDataset | None]:  # fmt: skip
    from gptrain.data.indexed import IndexedDataset

    indexed = IndexedDataset(prefix)
    datasets: list[GPTDataset | None] = []
    # Ranges, not Megatron's int32 arrays of the same ids: a split of 10^9 documents is 4 GB per rank.
    for name, bounds, count in zip(
        SPLIT_NAMES, split_ranges(splits_string, len(indexed)), num_samples, strict=True
    ):
        if bounds is None or (skip_unused and count == 0) or only_split not in (None, name):
            datasets.append(None)
            continue
        if bounds[0] == bounds[1]:
            raise DataError(_no_sequences_text(prefix, len(indexed), name, splits_string))
        datasets.append(GPTDataset(indexed, range(*bounds), count, seq_length, seed, name, cache_dir))
    return datasets


def _no_sequences_text(prefix: str, sequences: int, split: str, splits_string: str | None) -> str:
    """Why a split that is asked for samples gets none of the dataset's sequences, and what to do:
    the index build's 'a split of 0 sequences holds 0 tokens' told an empty corpus to change its split
    string, and a small one neither which split string nor that its share rounds to nothing."""
    if sequences == 0:
        return (
            f"{prefix}: the dataset holds no sequences (an empty corpus); prepare it from documents with text"
        )
    text = LEGACY_DEFAULT_SPLIT if splits_string is None else splits_string
    return (
        f"{prefix}: the split string {text!r} gives the {split} split 0 of the dataset's {sequences:,} "
        "sequences (its share, rounded as Megatron rounds it); give that split a larger share, or the "
        "dataset more documents"
    )


def _blend_splits(
    prefixes: list[str], weights: list[float], splits_string: str | None, seq_length: int, seed: int,
    num_samples: tuple[int, int, int], cache_dir: str | None, skip_unused: bool = False,
    only_split: str | None = None, surplus: float = MID_LEVEL_SURPLUS, surplus_named: str = SURPLUS_KEY,
) -> list[BlendedDataset | None]:  # fmt: skip
    weights = normalize(weights)
    _check_blend_requests(prefixes, weights, num_samples, seq_length, surplus, surplus_named, only_split)
    targets = samples_per_dataset(weights, num_samples)
    requests = samples_per_dataset(weights, num_samples, surplus)
    children = []
    for prefix, request, target in zip(prefixes, requests, targets, strict=True):
        try:
            children.append(_single_prefix_splits(
                prefix, splits_string, seq_length, seed, request, cache_dir, skip_unused, only_split
            ))  # fmt: skip
        except MemoryError as error:
            raise _surplus_memory_error(error, prefix, request, target, num_samples, only_split, surplus_named,
                                        surplus) from None  # fmt: skip
    blends: list[BlendedDataset | None] = []
    for i, name in enumerate(SPLIT_NAMES):
        split_children = [child[i] for child in children]
        if any(c is None for c in split_children):
            blends.append(None)
            continue
        size = sum(row[i] for row in targets)
        names = [f"{prefix} ({name} split)" for prefix in prefixes]
        blends.append(BlendedDataset(split_children, weights, size, name, cache_dir, names=names))  # type: ignore[arg-type]
    return blends


def _surplus_memory_error(
    error: MemoryError, prefix: str, request: Sequence[int], target: Sequence[int], num_samples: Sequence[int],
    only_split: str | None, surplus_named: str, surplus: float,
) -> BaseException:  # fmt: skip
    """The surplus named when it grew a dataset's share past its whole split's count (no share is larger
    without it): the out-of-memory line blamed the sample count, 90 where a surplus of 1e9 asked 2.3e10."""
    rows = zip(SPLIT_NAMES, request, target, num_samples, strict=True)
    name, count, share, size = max((r for r in rows if only_split in (None, r[0])), key=lambda r: r[1])
    if count <= size:
        return error
    reason = (str(error).splitlines() or ["no detail"])[0]
    return ConfigError(
        f"{surplus_named} {surplus}: out of memory building the sample indices of {prefix} ({name} split), "
        f"{count:,} samples (its share {share:,} with the surplus; {reason}); give a surplus nearer "
        "Megatron's default 0.005"
    )


def build_gpt_datasets(
    data_prefix: DataPrefix,
    splits_string: str | None,
    seq_length: int,
    seed: int,
    num_samples: tuple[int, int, int],
    cache_dir: str | None = None,
    mock: bool = False,
    vocab_size: int | None = None,
    skip_unused: bool = False,
    only_split: str | None = None,
    asked_by: Sequence[str] = ("num_samples",) * 3,
    surplus: float = MID_LEVEL_SURPLUS,
    surplus_named: str = SURPLUS_KEY,
) -> tuple[Dataset | None, Dataset | None, Dataset | None]:
    """(train, valid, test): plain GPTDatasets for one prefix, BlendedDatasets for a weighted
    list, MockGPTDatasets with `mock`; None for a split the split string leaves empty.
    A mapping {train, validation, test} (NeMo's per-split form) gives each split its own prefix or
    weighted list, all of whose documents it takes; the split string is not used then.

    `skip_unused`: a split asked for 0 samples is not built (training with limit_test_batches=0
    must not fail because a small dataset's test split holds no whole sequence).
    `only_split` ("train", "valid" or "test"): build that split alone, the others are None.
    `asked_by` names, per split, what the user set to ask for its samples (for the errors).
    `surplus`: Megatron's --mid-level-dataset-surplus, the fraction more samples each blended dataset builds;
    `surplus_named` is how errors name it."""
    try:
        return _build_splits(
            data_prefix, splits_string, seq_length, seed, num_samples, cache_dir, mock, vocab_size,
            skip_unused, only_split, asked_by, surplus, surplus_named,
        )  # fmt: skip
    except MemoryError as error:  # numpy's "Unable to allocate 1.42 PiB ...": a count too large for this host
        raise ConfigError(_out_of_memory_text(error, num_samples, seq_length, asked_by, only_split)) from None


def _out_of_memory_text(
    error: MemoryError,
    num_samples: Sequence[int],
    seq_length: int,
    asked_by: Sequence[str],
    only_split: str | None,
) -> str:
    """The line for index arrays this host cannot hold, naming what asked for the largest split built:
    the generic "out of memory: ask for less" left the user to guess which flag or key that was."""
    built = [s for s in zip(SPLIT_NAMES, num_samples, asked_by, strict=True) if only_split in (None, s[0])]
    name, count, source = max(built, key=lambda split: split[1])
    reason = (str(error).splitlines() or ["no detail"])[0]
    return (
        f"{source}: out of memory building the sample indices of the {name} split, {count:,} samples of "
        f"{seq_length} tokens ({reason}); ask for fewer"
    )


def _build_splits(
    data_prefix: DataPrefix, splits_string: str | None, seq_length: int, seed: int,
    num_samples: tuple[int, int, int], cache_dir: str | None, mock: bool, vocab_size: int | None,
    skip_unused: bool, only_split: str | None, asked_by: Sequence[str], surplus: float, surplus_named: str,
) -> tuple[Dataset | None, Dataset | None, Dataset | None]:  # fmt: skip
    if only_split not in (None, *SPLIT_NAMES):
        raise ConfigError(f"only_split must be one of {', '.join(SPLIT_NAMES)}, got {only_split!r}")
    if len(num_samples) != 3 or any(n is None or n < 0 for n in num_samples):
        raise ConfigError(
            f"num_samples must be three non-negative counts (train, valid, test), got {num_samples}"
        )
    _check_index_sizes(num_samples, seq_length, asked_by)
    if mock:
        if not vocab_size:
            raise ConfigError("mock data needs a vocab_size (--vocab-size)")
        mocks = [MockGPTDataset(n, seq_length, vocab_size, seed, name) if n and only_split in (None, name)
                 else None for name, n in zip(SPLIT_NAMES, num_samples, strict=True)]  # fmt: skip
        return mocks[0], mocks[1], mocks[2]
    if isinstance(data_prefix, Mapping):
        return _per_split(
            data_prefix, seq_length, seed, num_samples, cache_dir, skip_unused, only_split, asked_by, surplus,
            surplus_named,
        )  # fmt: skip
    prefixes, weights = parse_blend(data_prefix)
    _check_prefixes(prefixes, data_prefix)
    if weights is None:
        datasets: list = _single_prefix_splits(
            prefixes[0], splits_string, seq_length, seed, num_samples, cache_dir, skip_unused, only_split
        )
    else:
        try:
            datasets = _blend_splits(prefixes, weights, splits_string, seq_length, seed, num_samples,
                                     cache_dir, skip_unused, only_split, surplus, surplus_named)  # fmt: skip
        except OutOfMemoryMaps as error:
            raise error.of_blend(len(prefixes)) from None
    return datasets[0], datasets[1], datasets[2]


def _per_split(
    data_prefix: Mapping[str, str | Sequence[str | float] | None], seq_length: int, seed: int,
    num_samples: tuple[int, int, int], cache_dir: str | None, skip_unused: bool, only_split: str | None,
    asked_by: Sequence[str], surplus: float, surplus_named: str,
) -> tuple[Dataset | None, Dataset | None, Dataset | None]:  # fmt: skip
    """Each split built from its own datasets, every document of them in that split."""
    unknown = sorted(str(key) for key in data_prefix if key not in PER_SPLIT_KEYS)
    if unknown:
        raise ConfigError(
            f"data prefix keys {unknown}: a per-split data prefix has the keys {', '.join(PER_SPLIT_KEYS)}"
        )
    datasets: list[Dataset | None] = []
    for position, (key, name) in enumerate(zip(PER_SPLIT_KEYS, SPLIT_NAMES, strict=True)):
        spec, count = data_prefix.get(key), num_samples[position]
        if not spec or only_split not in (None, name) or (skip_unused and count == 0):
            datasets.append(None)
            continue
        if isinstance(spec, Mapping):
            raise ConfigError(f"data prefix {key}: give a prefix or [weight, prefix, ...], not a mapping")
        whole = ",".join("100" if i == position else "0" for i in range(len(SPLIT_NAMES)))
        counts = tuple(count if i == position else 0 for i in range(len(SPLIT_NAMES)))
        built = build_gpt_datasets(
            _lone_prefix(spec), whole, seq_length, seed, counts, cache_dir, only_split=name, asked_by=asked_by,
            surplus=surplus, surplus_named=surplus_named,
        )  # fmt: skip
        datasets.append(built[position])
    return datasets[0], datasets[1], datasets[2]


def built_split_lines(datasets: Sequence[Dataset | None]) -> list[str]:
    """What each built split holds: its samples and, as Megatron logs them ("total number of
    epochs"), the passes over its documents they take, so a run that repeats a small corpus says so.
    `datasets` are (train, valid, test); a split not built and mock data say nothing."""
    lines: list[str] = []
    for name, dataset in zip(SPLIT_NAMES, datasets, strict=True):
        if isinstance(dataset, GPTDataset):
            lines.append(f" > {name} split: {_gpt_split_text(dataset)}")
        elif isinstance(dataset, BlendedDataset):
            count = len(dataset.datasets)
            lines.append(
                f" > {name} split: {len(dataset):,} samples blended from {count} dataset{'s' if count != 1 else ''}"
            )
            for weight, child in zip(dataset.weights, dataset.datasets, strict=True):
                lines.append(f"    weight {weight:.4f}: {_gpt_split_text(child)}")  # type: ignore[arg-type]
    return lines


def _gpt_split_text(dataset: GPTDataset) -> str:
    epochs = dataset.num_epochs
    where = (
        ""
        if dataset.cache_dir is None
        else f" {'loaded from' if dataset.cache_hit else 'built in'} {dataset.cache_dir}"
    )
    return (
        f"{len(dataset):,} samples of {dataset.seq_length} tokens, {epochs:,} epoch{'s' if epochs != 1 else ''} "
        f"of its {len(dataset.indices):,} sequences of {dataset.dataset.path_prefix} (indices{where})"
    )


def _lone_prefix(spec: str | Sequence[str | float]) -> str | Sequence[str | float]:
    """A split's one weighted prefix (`--valid-data-path 1.0 X`, or `0 X`: the weight is unused) as the
    prefix alone, as Megatron builds it since core 0.7 (April 2024): for the split's own sample count. A
    one-dataset blend would build 0.5% more, which can take one more epoch and then shuffles every
    sample otherwise."""
    prefixes, weights = parse_blend(spec, one_split=True)
    if weights is None or len(prefixes) != 1:
        return spec
    given = list(spec)[1]
    return given if isinstance(given, (int, float)) else prefixes[0]  # a number: its line says YAML's
