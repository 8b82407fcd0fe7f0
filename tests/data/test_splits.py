"""Split strings carve the same sequence ranges as Megatron-LM."""

from __future__ import annotations

import numpy as np
import pytest

from gptrain.data.splits import (
    LEGACY_DEFAULT_SPLIT,
    parse_split_string,
    split_bookends,
    split_indices,
    split_ranges,
)
from gptrain.errors import ConfigError


def test_parse_pads_and_normalises():
    assert parse_split_string("98,2,0") == pytest.approx([0.98, 0.02, 0.0], abs=1e-15)
    assert parse_split_string("98 2") == parse_split_string("98,2,0")
    assert parse_split_string("1") == [1.0, 0.0, 0.0]
    assert parse_split_string("0.5, 0.25,0.25") == [0.5, 0.25, 0.25]
    assert parse_split_string(None) == parse_split_string(LEGACY_DEFAULT_SPLIT) == [0.969, 0.03, 0.001]


def test_weights_are_megatrons_numpy_normalisation_bit_for_bit():
    """Megatron normalises with numpy (np.array(weights) / np.sum(...)); gptrain's plain-Python
    arithmetic must give the same float64 bits, or a split boundary could move by one sequence."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        weights = [float(x) for x in np.round(rng.uniform(0, 1000, size=3) * rng.integers(0, 2, size=3), 3)]
        if sum(weights) <= 0:
            continue
        text = ",".join(repr(w) for w in weights)
        expected = (
            np.array(weights, dtype=np.float64) / float(np.sum(np.array(weights, dtype=np.float64)))
        ).tolist()
        assert parse_split_string(text) == expected, text


@pytest.mark.parametrize(
    "bad", ["", "0,0,0", "a,b", "1,2,3,4", "1.2.3,1", "nan,2,0", "inf,2,0", "-1,2,0", "98,2,1e-3"]
)
def test_bad_split_strings_are_config_errors(bad):
    with pytest.raises(ConfigError, match="split string"):
        parse_split_string(bad)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("nan,2,0", "nan"),
        ("inf,2,0", "inf"),
        ("98,-1,1", "-1"),
        ("98,2,1e-3", "1e-3"),
        ("a, b", "a"),
        ("98/2x", "2x"),
    ],
)
def test_a_word_that_is_no_weight_is_quoted_as_written(bad, named):
    """'inf,2,0' said "'fin' is not part of a weight" (the sorted set of stray letters), 'nan,2,0'
    "'an'": the item is now quoted as the user wrote it."""
    with pytest.raises(ConfigError) as error:
        parse_split_string(bad)
    assert (
        str(error.value)
        == f"split string {bad!r}: {named!r} is not a weight; give non-negative numbers like '98,2,0'"
    )


def test_empty_interval_is_no_split():
    assert split_bookends([1.0, 0.0, 0.0]) == [(0.0, 1.0), None, None]
    assert split_bookends([0.5, 0.0, 0.5]) == [(0.0, 0.5), None, (0.5, 1.0)]


def test_ranges_round_the_bookends():
    # Verified with Megatron: 14,207 sequences, "98,2,0" -> train [0, 13923), valid [13923, 14207).
    assert split_ranges("98,2,0", 14207) == [(0, 13923), (13923, 14207), None]
    assert split_ranges(None, 1000) == [(0, 969), (969, 999), (999, 1000)]
    # 10/3 = 3.33 -> 3 and 20/3 = 6.67 -> 7; 2.5 rounds half to even like Python's round.
    assert split_ranges("1,1,1", 10) == [(0, 3), (3, 7), (7, 10)]
    assert split_ranges("1,1", 5) == [(0, 2), (2, 5), None]


def test_indices_are_int32_ranges():
    train, valid, test = split_indices("80,20", 10)
    assert train.dtype == np.int32 and train.tolist() == list(range(8))
    assert valid.tolist() == [8, 9] and test is None
