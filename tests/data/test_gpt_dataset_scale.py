"""Sequence ids past int32: Megatron's document index is int32, and ids from 2**31 on wrapped to
negative ones that picked other sequences, silently."""

from __future__ import annotations

import numpy as np
import pytest

from gptrain.data.gpt_dataset import build_document_index
from gptrain.errors import DataError

INT32_MAX = np.iinfo(np.int32).max


def test_ids_up_to_int32_max_are_kept_exactly():
    rng = np.random.RandomState(0)
    index = build_document_index(range(INT32_MAX - 2, INT32_MAX + 1), 1, rng, separate_final=False)
    assert sorted(index.tolist()) == [INT32_MAX - 2, INT32_MAX - 1, INT32_MAX]


@pytest.mark.parametrize("documents", [range(INT32_MAX - 1, INT32_MAX + 3), np.array([5, INT32_MAX + 1])])
def test_ids_past_int32_are_refused_not_wrapped(documents):
    with pytest.raises(DataError, match=r"past the int32 ids of Megatron's document index .*shards"):
        build_document_index(documents, 2, np.random.RandomState(0), separate_final=True)
