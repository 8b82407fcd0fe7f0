"""build_gpt_datasets end to end against Megatron's builder restated from megatron-data-format.md
(sections 6-8): the split string read as Megatron reads it (any run of digits and dots, fewer than three
numbers padded with 0, normalised), each split's sequence range rounded from the bookends, the weights
of `--data-path` (strings or numbers) normalised, each dataset asked for ceil(ceil(n w) * 1.005)
samples, the blend's size the sum of ceil(n w) and its order the greedy rule. Every item of every
split is compared, on real .bin/.idx files with empty documents. Drawn by hypothesis."""

from __future__ import annotations

import math
import re

import numpy as np
from gpt_data_helpers import fixture_token, write_dataset
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_gpt_indices_spec_property import spec_indices

from gptrain.data.builder import build_gpt_datasets
from gptrain.errors import DataError

SURPLUS = 0.005


def spec_normalize(weights: list[float]) -> list[float]:
    array = np.array(weights, dtype=np.float64)
    return (array / np.sum(array)).tolist()


def spec_bookends(split: str) -> list[tuple[float, float] | None]:
    values = [float(v) for v in re.findall(r"[.0-9]+", split)]
    values += [0.0] * (3 - len(values))
    cumulative = [0.0]
    for weight in spec_normalize(values):
        cumulative.append(cumulative[-1] + weight)
    return [(lo, hi) if hi > lo else None for lo, hi in zip(cumulative[:-1], cumulative[1:], strict=True)]


def spec_blend_order(weights: list[float], size: int) -> list[tuple[int, int]]:
    counts = [0] * len(weights)
    order = []
    for k in range(size):
        errors = [w * max(k, 1) - c for w, c in zip(weights, counts, strict=True)]
        chosen = errors.index(max(errors))
        order.append((chosen, counts[chosen]))
        counts[chosen] += 1
    return order


def spec_items(documents: list[list[int]], bookend: tuple[float, float], count: int, seq: int, seed: int):
    """The items of one dataset's split: its non-empty documents are its sequences."""
    sequences = [d for d in documents if d]
    lengths = [len(s) for s in sequences]
    lo, hi = round(bookend[0] * float(len(sequences))), round(bookend[1] * float(len(sequences)))
    assert hi > lo and sum(lengths[lo:hi]) > 1, "drawn to have tokens in every split"
    document_index, sample_index, shuffle_index = spec_indices(
        lengths, list(range(lo, hi)), count, seq, seed, 1
    )
    items = []
    for j in shuffle_index.tolist():
        (first, start), (last, end) = sample_index[j].tolist(), sample_index[j + 1].tolist()
        tokens: list[int] = []
        for position in range(first, last + 1):
            sequence = sequences[document_index[position]]
            tokens += sequence[
                start if position == first else 0 : end + 1 if position == last else len(sequence)
            ]
        items.append(tokens + [-1] * (seq + 1 - len(tokens)))
    return items


@st.composite
def cases(draw: st.DrawFn) -> dict:
    datasets = draw(st.integers(1, 3))
    weighted = datasets > 1 or draw(st.booleans())  # one weighted prefix: a blend of one, as Megatron's
    return {
        "lengths": [
            draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 9, 17, 40]), min_size=8, max_size=24))
            for _ in range(datasets)
        ],
        "weights": [draw(st.sampled_from([1, 3, "30", "0.5", 7.5, "1e-1"])) for _ in range(datasets)]
        if weighted
        else None,
        "split": draw(st.sampled_from(["969, 30, 1", "98,2", "1", "50 50", "80,10,10", "0.7,0.3"])),
        "seq": draw(st.integers(2, 9)),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "counts": (draw(st.integers(0, 60)), draw(st.integers(0, 20)), draw(st.integers(0, 10))),
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_every_split_is_megatrons_builder_restated(tmp_path_factory, case):
    root = tmp_path_factory.mktemp("blend")
    documents = [
        [[fixture_token(d, t) for t in range(length)] for d, length in enumerate(lengths)]
        for lengths in case["lengths"]
    ]
    prefixes = [write_dataset(root / f"d{i}", lengths) for i, lengths in enumerate(case["lengths"])]
    spec: str | list = prefixes[0]
    if case["weights"] is not None:
        spec = [
            entry
            for weight, prefix in zip(case["weights"], prefixes, strict=True)
            for entry in (weight, prefix)
        ]
    bookends = spec_bookends(case["split"])
    for bookend in bookends:  # a split without sequences or tokens is refused: that is another test's
        for lengths in case["lengths"]:
            sequences = [n for n in lengths if n]
            lo, hi = (round(b * float(len(sequences))) for b in bookend or (0.0, 0.0))
            assume(bookend is None or (hi > lo and sum(sequences[lo:hi]) > 1))
    try:
        built = build_gpt_datasets(
            spec, case["split"], case["seq"], case["seed"], case["counts"], str(root / "c")
        )
    except DataError as error:
        raise AssertionError(f"refused a case Megatron builds: {error}") from None
    for split, (bookend, count, dataset) in enumerate(zip(bookends, case["counts"], built, strict=True)):
        if bookend is None:
            assert dataset is None, split
            continue
        if case["weights"] is None:
            expected = spec_items(documents[0], bookend, count, case["seq"], case["seed"])
        else:
            weights = spec_normalize([float(w) for w in case["weights"]])
            children = [
                spec_items(
                    docs, bookend, math.ceil(math.ceil(count * w) * (1 + SURPLUS)), case["seq"], case["seed"]
                )
                for docs, w in zip(documents, weights, strict=True)
            ]
            size = sum(math.ceil(count * w) for w in weights)
            expected = [children[i][j] for i, j in spec_blend_order(spec_normalize(weights), size)]
        assert len(dataset) == len(expected), split
        assert [dataset[i].tolist() for i in range(len(dataset))] == expected, split
