"""Two gloo ranks saving a checkpoint that fails on one rank only (a full disk under one node's file)."""

import json
from pathlib import Path

import gloo_ranks
import pytest

from gptrain.checkpoint.directory import LATEST
from gptrain.checkpoint.integrity import complete_steps

WORKER = Path(__file__).with_name("save_failure_worker.py")
FULL = "OSError: [Errno 28] No space left on device"


def outcomes(root: Path, out: Path, mode: str, how: str) -> list[dict]:
    gloo_ranks.run_ranks(WORKER, root, out, mode, how)
    return [json.loads((out / f"rank_{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_full_disk_under_one_ranks_file_stops_every_rank_with_its_cause(tmp_path, how):
    """rank_1.pt was written before DCP's save, outside its agreement: rank 1 stopped with the full
    disk while rank 0 waited in DCP's first collective until the process group timed out, and then
    named the timeout. Every rank now stops at once with rank 1's cause, in step with the others."""
    root = tmp_path / "checkpoints"
    for result in outcomes(root, tmp_path, "rankfile", how):
        assert result["error"].startswith(
            f"CheckpointWriteError: checkpoint {root / 'step_4'} could not be written"
        )
        assert FULL in result["error"] and "\n" not in result["error"]
        assert result["next_collective"] == 2.0
    assert complete_steps(root) == [2] and not (root / "step_4").exists()
    assert (root / LATEST).read_text() == "step_2\n"


@pytest.mark.distributed
def test_a_full_disk_under_complete_stops_every_rank_with_rank_0s_line(tmp_path):
    """Rank 0 could not write COMPLETE: it stopped with the full disk while rank 1 waited in the gather
    after it until the process group timed out (a RuntimeError, not a line). Every rank now stops with
    rank 0's line, and the unmarked save is removed."""
    root = tmp_path / "checkpoints"
    first, second = outcomes(root, tmp_path, "complete", "sync")
    assert first["error"] == second["error"]
    assert first["error"].startswith(
        f"CheckpointWriteError: checkpoint {root / 'step_4'} could not be written"
    )
    assert FULL in first["error"]
    assert first["next_collective"] == second["next_collective"] == 2.0
    assert complete_steps(root) == [2] and not (root / "step_4").exists()
    assert (root / LATEST).read_text() == "step_2\n"
