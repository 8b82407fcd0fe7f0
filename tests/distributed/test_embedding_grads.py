"""Under TP the token embedding's gradient is this rank's vocabulary rows, as its weight is.

Megatron's vocabulary-parallel embedding: each tensor rank looks its own rows up and the outputs are
summed over the ranks, so the weight gradient holds only those rows. DTensor's embedding backward
built the whole-vocabulary gradient (Replicate) on every rank instead: vocab x hidden x (1 - 1/TP)
numbers more kept until the optimizer step, which the planner does not count, and carried by the
data-parallel all-reduce of TP + DDP. One forward/backward of parallel_worker's model (float64) per
layout: the placements and local shapes, the whole gradient against one process's, and the numbers
the DP all-reduce carries.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
from parallel_harness import SharedLaunches, share_launch

pytestmark = pytest.mark.distributed

TP2 = {"tensor_model_parallel_size": 2}
TP2_SP = {**TP2, "sequence_parallel": True}
PROBE = {"probe": "embedding_grads"}
TWO: dict[str, dict[str, Any]] = {
    "tp2_untied": {**PROBE, "tied": False, "model": TP2},
    "tp2_sp_untied": {**PROBE, "tied": False, "model": TP2_SP},
    "tp2_sp_tied": {**PROBE, "tied": True, "model": TP2_SP},
}
FOUR: dict[str, dict[str, Any]] = {  # data_parallel_sharding=ddp under TP: GradAllReduce
    "dp2_tp2_ddp_untied": {**PROBE, "tied": False, "model": TP2_SP},
}
VOCAB_ROWS, HIDDEN = 96 // 2, 32  # parallel_worker's vocabulary over TP=2; its hidden size


share_launch(2, __name__, lambda _: list(TWO.items()))
share_launch(4, __name__, lambda _: list(FOUR.items()))


@pytest.fixture(scope="module")
def results(shared_launches: SharedLaunches) -> dict[str, dict]:
    return shared_launches.get(2, __name__) | shared_launches.get(4, __name__)


def single_process(spec: dict[str, Any]) -> dict[str, Any]:
    import parallel_worker

    assert "WORLD_SIZE" not in os.environ, "the single-process reference must not see a distributed env"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parallel_worker.train({**spec, "model": {}})["ranks"][0]


@pytest.mark.parametrize("name", [*TWO, *FOUR])
def test_the_tensor_parallel_embedding_gradient_is_this_ranks_rows(results: dict, name: str) -> None:
    for rank, record in enumerate(results[name]["ranks"]):
        for module, layout in record["embeddings"].items():
            assert layout["weight"] == ["Shard(dim=0)"], (name, rank, module)
            assert layout["weight_local"] == [VOCAB_ROWS, HIDDEN], (name, rank, module)
            where = (name, rank, module, layout["grad"], layout["grad_local"])
            assert (layout["grad"], layout["grad_local"]) == (layout["weight"], layout["weight_local"]), where


@pytest.mark.parametrize("name", [*TWO, *FOUR])
def test_the_tensor_parallel_embedding_gradient_is_one_processs(results: dict, name: str) -> None:
    """float64: the layouts only reorder sums, so the whole gradients agree to ~1e-16 relative."""
    spec = {**TWO, **FOUR}[name]
    expected = single_process(spec)["embeddings"]
    for rank, record in enumerate(results[name]["ranks"]):
        assert set(record["embeddings"]) == set(expected)
        for module, layout in record["embeddings"].items():
            reference = expected[module]["grad_full"]
            scale = max(abs(x) for x in reference)
            assert scale > 0
            error = max(abs(a - e) for a, e in zip(layout["grad_full"], reference, strict=True))
            assert error <= 1e-12 * scale, (name, rank, module, error, scale)


def test_the_data_parallel_all_reduce_carries_this_ranks_shards_only(results: dict) -> None:
    """dp2 x tp2 with DDP: GradAllReduce sends each rank's gradient shards, no more (it carried the
    other tensor rank's 48 x 32 embedding rows too)."""
    for rank, record in enumerate(results["dp2_tp2_ddp_untied"]["ranks"]):
        assert record["dp_all_reduce"] == record["shards"], rank
