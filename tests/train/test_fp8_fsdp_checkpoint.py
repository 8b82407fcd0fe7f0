"""Checkpoints of FSDP2 + FP8 runs whose weights FSDP gathers as float8 (torchao's weight wrapper)."""

import json
from pathlib import Path

import pytest
from gloo_ranks import free_port, run_ranks

pytest.importorskip("torchao")

WORKER = Path(__file__).with_name("fp8_fsdp_async_worker.py")


@pytest.fixture(scope="module")
def fp8_fsdp_runs(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("fp8_fsdp")
    run_ranks(WORKER, root / "out", root, free_port(), timeout_s=480)
    results = {
        name: [json.loads((root / "out" / f"{name}_rank_{rank}.json").read_text()) for rank in range(2)]
        for name in ("full", "resumed")
    }
    return root, results


@pytest.mark.distributed
@pytest.mark.slow
def test_a_resume_from_a_background_save_of_float8_gathered_weights_is_exact(fp8_fsdp_runs):
    """The background (CPU) save copied each float8-gathered shard storage by storage: torchao's wrapper
    holds its values in an inner tensor, so the checkpoint held uninitialised memory for every block
    weight and the resumed run trained from it."""
    _, results = fp8_fsdp_runs
    assert [r["code"] for run in results.values() for r in run] == [0] * 4
    for rank in range(2):
        full, resumed = results["full"][rank]["losses"], results["resumed"][rank]["losses"]
        assert sorted(resumed) == ["3", "4"]
        assert {step: full[step] for step in resumed} == resumed, rank


@pytest.mark.distributed
@pytest.mark.slow
def test_float8_gathered_weights_are_saved_as_plain_tensors(fp8_fsdp_runs, tmp_path):
    """No record names torchao's class: DCP's own conversion (weights-only unpickling) reads the
    checkpoint, and loading it needs no torchao."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root, _ = fp8_fsdp_runs
    for run in ("full", "resumed"):  # a background save (DCP writes a copy) and one written in place
        checkpoint = root / run / "checkpoints" / ("step_2" if run == "full" else "step_4")
        named = [f.name for f in checkpoint.iterdir() if f.is_file() and b"torchao" in f.read_bytes()]
        assert named == [], run
        dcp_to_torch_save(checkpoint, tmp_path / f"{run}.pt")
