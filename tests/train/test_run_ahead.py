"""trainer.run_ahead: with fused AdamW (run here on the CPU) the loop queues the next step's
forward/backward before reading a step's results. The run must be the same run bit for bit:
losses, skips, checkpoints, and a stop that comes while a step is queued ahead."""

import json
import math
from pathlib import Path

import pytest
import torch
from gloo_ranks import free_port, run_ranks
from train_e2e_helpers import (
    MOCK,
    RUN_AHEAD_SHAPE,
    RUNS_AHEAD_AFTER,
    log_lines,
    record_runs_ahead,
    run_recording,
    tiny_config,
)

from gptrain.checkpoint.integrity import complete_steps
from gptrain.errors import EXIT_REQUEUE
from gptrain.train import builders
from gptrain.train.step import StepOptions, masked_lm_loss

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
WORKER = Path(__file__).with_name("run_ahead_worker.py")


@pytest.fixture
def fused_adamw(monkeypatch):
    """The optimizer gptrain builds on a GPU (fused AdamW), here on the CPU; records which steps
    returned with the next one queued ahead."""
    real = builders.build_optimizer
    monkeypatch.setattr(builders, "build_optimizer", lambda *args: real(*args[:-1], "cuda"))
    return record_runs_ahead(monkeypatch.setattr)


def weights(log_dir, step):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = log_dir / f"weights_{step}.pt"
    dcp_to_torch_save(log_dir / "checkpoints" / f"step_{step}", target)
    return torch.load(target, weights_only=False)


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_state(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_running_ahead_is_the_same_run_bit_for_bit(tmp_path, monkeypatch, fused_adamw):
    code, behind = run_recording(
        monkeypatch, tiny_config(tmp_path / "behind", *MOCK, *RUN_AHEAD_SHAPE, "trainer.run_ahead=false")
    )
    assert code == 0 and fused_adamw == []
    code, ahead = run_recording(monkeypatch, tiny_config(tmp_path / "ahead", *MOCK, *RUN_AHEAD_SHAPE))
    assert code == 0 and fused_adamw == RUNS_AHEAD_AFTER
    assert ahead == behind  # every iteration's loss, exactly
    for step in (4, 8, 12):  # weights, AdamW moments and step counts, schedule, counters
        assert_same_state(weights(tmp_path / "ahead", step), weights(tmp_path / "behind", step))
    validation = [
        [line for line in log_lines(tmp_path / d) if "validation loss" in line] for d in ("ahead", "behind")
    ]
    assert (
        validation[0] == validation[1] and len(validation[0]) == 4
    )  # iteration 6, iteration 12, the end on validation and test sets


def test_a_nonfinite_step_queued_behind_its_successor_is_skipped_the_same(tmp_path, monkeypatch, fused_adamw):
    """Step 3's loss is NaN; step 4's forward/backward is already queued when that is read."""

    def nan_at_step_3(model, batch):
        calls.append(1)
        loss = masked_lm_loss(model, batch)
        return loss * float("nan") if len(calls) in (5, 6) else loss  # 2 micro-batches a step

    real = builders.build_step_options
    monkeypatch.setattr(
        builders,
        "build_step_options",
        lambda cfg, dp: StepOptions(**{**vars(real(cfg, dp)), "loss_fn": nan_at_step_3}),
    )
    runs = {}
    for name, run_ahead in (("behind", "false"), ("ahead", "true")):
        calls: list[int] = []
        cfg = tiny_config(tmp_path / name, *MOCK, *RUN_AHEAD_SHAPE, f"trainer.run_ahead={run_ahead}")
        runs[name] = run_recording(monkeypatch, cfg)
    assert 3 in fused_adamw  # the NaN step was read with step 4 queued
    (code_a, ahead), (code_b, behind) = runs["ahead"], runs["behind"]
    assert code_a == code_b == 0 and math.isnan(ahead[3]) and math.isnan(behind[3])
    assert {k: v for k, v in ahead.items() if k != 3} == {k: v for k, v in behind.items() if k != 3}
    for step in (4, 12):
        a, b = weights(tmp_path / "ahead", step), weights(tmp_path / "behind", step)
        assert a["train"]["nan_iterations"] == 1
        assert_same_state(a, b)


def test_a_stop_while_a_step_is_queued_ahead_stops_after_it_and_resumes_bit_exact(
    tmp_path, monkeypatch, fused_adamw
):
    code, full = run_recording(monkeypatch, tiny_config(tmp_path / "full", *MOCK, *RUN_AHEAD_SHAPE))
    assert code == 0
    cfg = tiny_config(tmp_path / "split", *MOCK, *RUN_AHEAD_SHAPE)
    code, first = run_recording(monkeypatch, cfg, signal_at=2)  # step 3 is queued when it is seen
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert complete_steps(tmp_path / "split" / "checkpoints") == [3]
    assert any(line.startswith("stopping at iteration 3: ") for line in log_lines(tmp_path / "split"))
    code, second = run_recording(monkeypatch, tiny_config(tmp_path / "split", *MOCK, *RUN_AHEAD_SHAPE))
    assert code == 0 and first | second == full
    assert_same_state(weights(tmp_path / "split", 12), weights(tmp_path / "full", 12))


def ranks(out, world: int = 2) -> list[dict]:
    found = [json.loads((out / f"rank_{rank}.json").read_text()) for rank in range(world)]
    for rank in found:
        rank["losses"] = {int(step): loss for step, loss in rank["losses"].items()}
    return found


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_running_ahead_stop_at_the_same_step_and_resume_to_the_same_run(tmp_path, two_rank_layouts):
    """DDP over gloo: the stop flag of rank 1's request at step 2 is read at step 3 (one step late,
    unlogged), when step 4 is already queued; both ranks finish step 4 and stop there."""
    # the uninterrupted run and the stopped one in the launch of the two-rank layouts: one start-up
    root = two_rank_layouts.parent
    behind = ranks(two_rank_layouts / "behind")
    assert [r["code"] for r in behind] == [0, 0] and behind[0]["ahead"] == []
    first = ranks(two_rank_layouts / "split")
    assert [r["code"] for r in first] == [EXIT_REQUEUE, EXIT_REQUEUE]
    # srun's SIGTERM to the ranks still shutting down when the first exits 75 must not make it 143
    assert [r["sigterm_ignored"] for r in first] == [True, True]
    assert [r["sigterm_ignored"] for r in behind] == [False, False]  # a finished run restores the default
    assert [r["ahead"] for r in first] == [[2, 3], [2, 3]] and sorted(first[0]["losses"]) == [1, 2, 3, 4]
    assert complete_steps(root / "split" / "checkpoints") == [4]
    run_ranks(WORKER, tmp_path / "out_second", root, "split:true:0")  # a fresh process resumes
    second = ranks(tmp_path / "out_second" / "split")
    assert [r["code"] for r in second] == [0, 0] and second[0]["ahead"] == [7, 9, 11]
    for rank in range(2):  # bit for bit, on every rank
        assert first[rank]["losses"] | second[rank]["losses"] == behind[rank]["losses"]


LAYOUTS = {
    "shard_grad_op": [
        "model.data_parallel_sharding=shard_grad_op",
        "model.micro_batch_size=1",
    ],  # 2 micro batches
    "tp2_sp": ["model.tensor_model_parallel_size=2", "model.sequence_parallel=true"],
    "pp2_dp2_fsdp": [
        "trainer.devices=4",
        "model.pipeline_model_parallel_size=2",
        "model.data_parallel_sharding=full_shard",
        "model.micro_batch_size=1",  # 2 micro batches per DP rank: the pipeline needs 2
    ],
}


@pytest.fixture(scope="module")
def two_rank_layouts(tmp_path_factory) -> Path:
    """Each two-rank layout's runs, behind and ahead, then DDP's uninterrupted run and the one rank 1
    stops at step 2 (last: a rank exits after a stop), all in one process per rank (one start-up):
    OUT/NAME_behind, OUT/NAME_ahead, OUT/behind and OUT/split under the returned OUT, each run's
    directory under its parent."""
    root = tmp_path_factory.mktemp("run_ahead_layouts")
    runs = []
    for name, layout in LAYOUTS.items():
        if "trainer.devices=4" not in layout:
            for run in (f"{name}_behind:false:0", f"{name}_ahead:true:0"):
                runs.append("|".join([f"{run}:{free_port()}", *layout]))
    runs += [f"behind:false:0:{free_port()}", f"split:true:2:{free_port()}"]
    run_ranks(WORKER, root / "out", root, ",".join(runs), timeout_s=480)
    return root / "out"


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dtensor_parameters_update_on_the_device_and_run_ahead(tmp_path, request, name):
    """FSDP2's and TP's DTensor parameters took the host-decided update, so no step ran ahead there:
    fused AdamW applies the clip factor and the non-finite skip to them on the device too. Queued
    ahead or not, every rank trains bit for bit alike."""
    layout = LAYOUTS[name]
    world = 4 if "trainer.devices=4" in layout else 2
    if world == 2:  # shared with the other two-rank layout
        out = request.getfixturevalue("two_rank_layouts")
    else:  # both runs in one process per rank: one start-up
        out = tmp_path / "out"
        runs = f"{name}_behind:false:0,{name}_ahead:true:0:{free_port()}"
        run_ranks(WORKER, out, tmp_path, runs, *layout, world=world, timeout_s=240)
    behind, ahead = ranks(out / f"{name}_behind", world), ranks(out / f"{name}_ahead", world)
    assert [r["code"] for r in behind + ahead] == [0] * 2 * world
    assert behind[0]["ahead"] == [] and ahead[0]["ahead"] == [2, 3, 7, 9, 11]
    for rank in range(world):
        assert ahead[rank]["losses"] == behind[rank]["losses"] and len(behind[rank]["losses"]) == 12


def test_no_step_runs_ahead_during_a_batch_size_ramp_up(tmp_path, monkeypatch, fused_adamw):
    """The next batch's size depends on the samples consumed up to it: no step is queued ahead
    until the ramp has reached the full global batch (2 samples a step for the first 4 steps)."""
    ramp = "model.rampup_batch_size=[2,2,8]"
    cfg = tiny_config(tmp_path / "behind", *MOCK, *RUN_AHEAD_SHAPE, ramp, "trainer.run_ahead=false")
    code, behind = run_recording(monkeypatch, cfg)
    code, ahead = run_recording(monkeypatch, tiny_config(tmp_path / "ahead", *MOCK, *RUN_AHEAD_SHAPE, ramp))
    assert code == 0 and fused_adamw == [7, 9, 11]  # 2 and 3 are quiet, but ramping
    assert ahead == behind
    assert_same_state(weights(tmp_path / "ahead", 12), weights(tmp_path / "behind", 12))
