"""Uneven pipeline splits (Megatron's first/last stage layer counts, the embedding and loss counted
as layers): each stage holds the layers Megatron's rules give it, and training is the single
process's (float64, CPU, gloo), also after a checkpoint saved under an uneven split is loaded into
one process or into another uneven layout.

A tiny GPT of 6 layers (parallel_worker's model) trains STEPS AdamW steps with clipping; a layout
only reorders sums, so its losses and gradient norms agree with the reference to float64 round-off
(RTOL: see test_parallel_layouts). A split that fell back to an equal share would train the same
losses, so each run also reports which global layers every rank's chunks hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from parallel_harness import SharedLaunches, run_layouts, share_launch, shared_dir
from test_parallel_layouts import assert_close, run_in_process

pytestmark = pytest.mark.distributed

LAYERS, STEPS, SAVE_AT = 6, 10, 5
PP2_FIRST2 = {"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 2}
TWO_PROCESSES: dict[str, dict[str, Any]] = {
    "pp2_first2": PP2_FIRST2,  # [2, 4]: saves at SAVE_AT
    "pp2_last1": {"pipeline_model_parallel_size": 2, "num_layers_in_last_pipeline_stage": 1},  # [5, 1]
    # interleaved: stages 0..3 = rank 0 chunk 0, rank 1 chunk 0, rank 0 chunk 1, rank 1 chunk 1
    "pp2_v2_first2_last4": {
        **PP2_FIRST2,
        "num_layers_in_last_pipeline_stage": 4,
        "virtual_pipeline_model_parallel_size": 2,
    },
    # (6 layers + embedding + loss) / 8 stages = 1: Megatron's standalone embedding stage (rank 0's
    # first chunk) and loss stage (rank 1's last chunk) hold no transformer layer
    "pp2_v4_accounted": {
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 4,
        "account_for_embedding_in_pipeline_split": True,
        "account_for_loss_in_pipeline_split": True,
    },
}
SAVED = ("pp2_first2", "pp2_v4_accounted")  # checkpoints loaded into one process below
# rank r's chunks, each as its global layer indices
SPLITS = {
    "pp2_first2": [[[0, 1]], [[2, 3, 4, 5]]],
    "pp2_last1": [[[0, 1, 2, 3, 4]], [[5]]],
    "pp2_v2_first2_last4": [[[0], [3]], [[1, 2], [4, 5]]],
    "pp2_v4_accounted": [[[], [1], [3], [5]], [[0], [2], [4], []]],
    # (6 layers + embedding + loss) / 4 stages = 2, less one on the first and last stage
    "pp4_accounted": [[[0]], [[1, 2]], [[3, 4]], [[5]]],
    "pp3_first1_last1": [[[0]], [[1, 2, 3, 4]], [[5]]],
}
ACCOUNTED = {
    "pipeline_model_parallel_size": 4,
    "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True,
}


def spec(model: dict[str, Any], **more: Any) -> dict[str, Any]:
    # micro batch 2: 4 micro-batches per step, so the plain pipelines run 1F1B (not GPipe)
    return {"steps": STEPS, "layers": LAYERS, "mbs": 2, "model": model, **more}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[float]]:
    result = run_in_process(spec({}))
    assert result["losses"][0] - result["losses"][-1] > 0.01  # the curve moves
    assert min(result["grad_norms"]) > 0.5  # clipping at 0.5 is active
    return result


@pytest.fixture(scope="module")
def ckpt(shared_root: Path) -> Path:
    return shared_dir(shared_root, __name__)


def two_process_runs(ckpt: Path) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, spec(model, **({"save_at": SAVE_AT, "save": str(ckpt / name)} if name in SAVED else {})))
        for name, model in TWO_PROCESSES.items()
    ]


def four_process_runs(ckpt: Path) -> list[tuple[str, dict[str, Any]]]:
    return [("pp4_accounted", spec(ACCOUNTED, gbs=8, mbs=1))]


@pytest.fixture(scope="module")
def two_process_results(shared_launches: SharedLaunches) -> dict[str, dict]:
    """In the shared launch of two ranks (conftest.py), beside other modules' runs."""
    return shared_launches.get(2, __name__)


share_launch(2, __name__, two_process_runs)
share_launch(4, __name__, four_process_runs)


def assert_matches(result: dict, expected: dict, name: str, start: int = 0) -> None:
    assert_close(result["losses"], expected["losses"][start:], f"{name} losses")
    assert_close(result["grad_norms"], expected["grad_norms"][start:], f"{name} grad norms")
    assert_close(result["eval_loss"], expected["eval_loss"], f"{name} held-out loss")


@pytest.mark.parametrize("name", list(TWO_PROCESSES))
def test_two_stage_uneven_splits_train_as_one_process(
    name: str, two_process_results: dict, reference: dict
) -> None:
    result = two_process_results[name]
    assert result["stage_layers"] == SPLITS[name]
    assert_matches(result, reference, name)


@pytest.mark.parametrize("name", SAVED)
def test_an_uneven_checkpoint_loads_into_one_process(
    name: str, two_process_results: dict, ckpt: Path, reference: dict
) -> None:
    """Also from the standalone embedding and loss stages, which save the embedding and the output
    layer without a block beside them."""
    resumed = run_in_process(spec({}, start=SAVE_AT, load=str(ckpt / name)))
    assert_matches(resumed, reference, f"{name} -> single", start=SAVE_AT)


def test_three_and_four_stage_splits_and_a_resume_into_another_split(
    two_process_results: dict, shared_launches: SharedLaunches, ckpt: Path, reference: dict
) -> None:
    """PP=3 with the first and last stage at one layer resumes the PP=2 [2, 4] checkpoint; PP=4
    counting the embedding and the loss as layers trains from the start."""
    three = {"pipeline_model_parallel_size": 3, "num_layers_in_first_pipeline_stage": 1}
    three["num_layers_in_last_pipeline_stage"] = 1
    (resumed,) = run_layouts([spec(three, start=SAVE_AT, load=str(ckpt / "pp2_first2"))], 3, ckpt)
    assert resumed["stage_layers"] == SPLITS["pp3_first1_last1"]
    assert_matches(resumed, reference, "pp2_first2 -> pp3_first1_last1", start=SAVE_AT)
    accounted = shared_launches.get(4, __name__)["pp4_accounted"]  # the shared launch of four ranks
    assert accounted["stage_layers"] == SPLITS["pp4_accounted"]
    assert_matches(accounted, reference, "pp4_accounted")
