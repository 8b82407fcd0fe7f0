"""Two gloo ranks resuming checkpoints that are damaged for one of them only."""

import json
from pathlib import Path

import gloo_ranks
import pytest
import torch

WORKER = Path(__file__).with_name("rank_load_worker.py")


def run_ranks(*args: str | Path) -> None:
    gloo_ranks.run_ranks(WORKER, *args)


@pytest.mark.distributed
def test_every_rank_passes_over_a_checkpoint_whose_rank_file_fails_on_one_rank(tmp_path):
    """Rank 1's file of step_4 does not load (a checkpoint without a CRC-32 for it) and rank 0's does:
    both ranks resume step_2 (rank 0 went on with step_4 alone and the job hung in its first
    collective). Rank 1's damaged file of step_6 is found by its CRC-32 before anything is loaded."""
    root = tmp_path / "checkpoints"
    run_ranks(root, tmp_path)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert result["resumed"] == "step_2" and result["w"] == [2.0] * 4 and result["ranks"] == 2
        assert result["extra"] == {"step": 2, "rank": rank}
        six, four = result["warnings"][:2]
        assert six.startswith(f"checkpoint step_6 is damaged: {root / 'step_6' / 'rank_1.pt'} has CRC-32 ")
        assert four.startswith(
            f"checkpoint step_4 is damaged: {root / 'step_4' / 'rank_1.pt'} does not load ("
        )
    assert sorted(p.name.split(".")[0] for p in root.iterdir()) == ["latest", "step_2", "step_4", "step_6"]
    assert len(list(root.glob("step_[46].damaged-*/rank_1.pt"))) == 2  # kept for inspection


def results(out: Path) -> list[dict]:
    return [json.loads((out / f"rank_{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
def test_every_rank_passes_over_a_checkpoint_whose_metadata_fails_on_one_rank(tmp_path):
    """Rank 1 cannot read step_6's .metadata (an I/O error on one node): both ranks pass over step_6
    and resume step_4. Rank 1's agreement used to meet rank 0's config check: rank 0 raised a config
    mismatch quoting the OSError, and rank 1 waited in a collective."""
    root = tmp_path / "checkpoints"
    run_ranks(root, tmp_path, "meta")
    for rank, result in enumerate(results(tmp_path)):
        assert result["resumed"] == "step_4" and result["w"] == [4.0] * 4 and result["ranks"] == 2, result
        assert result["extra"] == {"step": 4, "rank": rank}
        assert result["warnings"][0].startswith(
            f"checkpoint step_6 is damaged: {root / 'step_6'} does not load ("
        )
        assert "OSError" in result["warnings"][0]


@pytest.mark.distributed
def test_running_out_of_memory_on_one_rank_stops_every_rank_and_moves_nothing(tmp_path):
    """Rank 1 runs out of memory building the state for step_6: not damage, so every rank stops with
    one line naming step_6 and rank 1, and step_6 stays where it is."""
    root = tmp_path / "checkpoints"
    run_ranks(root, tmp_path, "oom")
    for result in results(tmp_path):
        assert result["error"].startswith(
            "CheckpointOutOfMemoryError: out of memory while loading step_6 on rank 1 (OutOfMemoryError: CUDA out"
        ), result
        assert "pipeline_model_parallel_size" in result["error"] and "\n" not in result["error"]
        assert result["warnings"] == []
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_2", "step_4", "step_6"]


@pytest.mark.distributed
def test_every_rank_loads_the_steps_rank_0_lists(tmp_path):
    """Rank 1's listing lacks step_6 (a node's stale view of the directory): both ranks load step_6,
    as rank 0 lists it (rank 1 used to load step_4 while rank 0 loaded step_6, silently)."""
    run_ranks(tmp_path / "checkpoints", tmp_path, "list")
    for rank, result in enumerate(results(tmp_path)):
        assert result["resumed"] == "step_6" and result["w"] == [6.0] * 4 and result["ranks"] == 2, result
        assert result["extra"] == {"step": 6, "rank": rank} and result["warnings"] == []


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["own", "source", "requeued"])
def test_every_rank_starts_from_the_checkpoint_rank_0_finds(tmp_path, mode):
    """A run started from another run's checkpoint decides on every rank whether it has checkpoints
    of its own, and which of the source's is newest. Rank 1's stale listing (own: none of the run's
    own; source: not the source's newest) had it load another checkpoint than rank 0 in lock step
    (the source's step_2 against its own step_1, or the source's step_2 against its step_4).
    requeued: rank 1 skipped the broadcast of whether the run has its own, so its next one paired
    with rank 0's first and took the list of steps for a checkpoint path."""
    from gptrain.checkpoint.manager import CheckpointManager

    run, source = tmp_path / "run", tmp_path / "source"
    for root, steps in (
        (source / "checkpoints", [2, 4]),
        (run / "checkpoints", [1] if mode in ("own", "requeued") else []),
    ):
        for step in steps:
            CheckpointManager(root, keep_last=None).save(step, {"model": {"w": torch.zeros(2)}}, {})
    gloo_ranks.run_ranks(WORKER.with_name("start_from_worker.py"), run, source, tmp_path, mode)
    expected = "None" if mode in ("own", "requeued") else str(source / "checkpoints" / "step_4")
    assert [(tmp_path / f"rank_{rank}.txt").read_text() for rank in range(2)] == [expected, expected]


def test_a_checkpoint_directory_rank_0_cannot_read_stops_every_rank(tmp_path):
    """rank_0s forwarded only gptrain's errors: a PermissionError on rank 0 left the other ranks in
    the broadcast until the collective timeout. Every rank now stops with rank 0's reason."""
    run, source = tmp_path / "run", tmp_path / "source"
    from gptrain.checkpoint.manager import CheckpointManager

    CheckpointManager(source / "checkpoints", keep_last=None).save(2, {"model": {"w": torch.zeros(2)}}, {})
    gloo_ranks.run_ranks(WORKER.with_name("start_from_worker.py"), run, source, tmp_path, "unreadable")
    answers = [(tmp_path / f"rank_{rank}.txt").read_text() for rank in range(2)]
    assert answers[0] == answers[1] and answers[0].startswith("error: rank 0 could not read the checkpoints")
    assert "Permission denied" in answers[0]


@pytest.mark.distributed
def test_a_file_named_as_the_step_being_saved_stops_every_rank_in_one_line(tmp_path):
    """A plain file checkpoints/step_8 where step 8 is saved: rank 0 failed with
    "step_8/COMPLETE: Not a directory" before the barrier rank 1 then waited in. Every rank now gets one
    line saying what to do, and the file is left as it was."""
    root = tmp_path / "checkpoints"
    run_ranks(root, tmp_path, "file")
    for result in results(tmp_path):
        assert result["error"] == (
            f"CheckpointWriteError: checkpoint {root / 'step_8'} cannot be saved: a file of that name is in "
            f"the way; move it out of {root}, then run the same command again (it resumes from the newest "
            "complete checkpoint)"
        )
    assert (root / "step_8").read_text() == "notes\n" and (root / "latest").read_text() == "step_6\n"
