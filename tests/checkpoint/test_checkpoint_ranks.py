"""Two gloo ranks resuming checkpoints that are damaged for one of them only.

Every scenario (rank_load_worker's modes, start_from_worker's) runs in one launch of two ranks, each
in directories of its own (`scenarios`): a torch start-up per test cost seconds each."""

import json
from pathlib import Path

import gloo_ranks
import pytest
import torch

WORKER = Path(__file__).with_name("checkpoint_ranks_worker.py")
LOAD_MODES = ("damaged", "meta", "oom", "list", "file")
START_MODES = ("own", "source", "requeued", "unreadable")


def start_from_dirs(base: Path, mode: str) -> tuple[Path, Path]:
    """(run, source) of a start_from scenario: the source's step_2 (and 4), the run's own step_1."""
    from gptrain.checkpoint.manager import CheckpointManager

    run, source = base / "run", base / "source"
    source_steps = [2] if mode == "unreadable" else [2, 4]
    for root, steps in (
        (source / "checkpoints", source_steps),
        (run / "checkpoints", [1] if mode in ("own", "requeued") else []),
    ):
        for step in steps:
            CheckpointManager(root, keep_last=None).save(step, {"model": {"w": torch.zeros(2)}}, {})
    return run, source


def streams_checkpoint(base: Path) -> dict:
    """A checkpoint one process saved after some dropout draws (TP 1, PP 1), in base/checkpoints; what
    that process, run on uninterrupted, draws next."""
    import random

    import numpy as np

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.train.state import rank_state, set_rng_state

    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    torch.rand(100)  # iterations' dropout before the save
    one = {"world_size": 1, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1}
    extra = rank_state({**one, "sequence_parallel": False})
    CheckpointManager(base / "checkpoints", keep_last=-1).save(6, {"model": {"w": torch.zeros(2)}}, extra)
    set_rng_state(extra["rng"])  # the uninterrupted run goes on from here
    return {"torch": torch.rand(4).tolist(), "python": random.random(), "numpy": float(np.random.rand())}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each scenario's directory (mode: base), after one launch ran them all."""
    bases = {mode: tmp_path_factory.mktemp(mode) for mode in (*LOAD_MODES, *START_MODES)}
    runs = [
        {"worker": "rank_load", "args": [str(bases[m] / "checkpoints"), str(bases[m]), m]} for m in LOAD_MODES
    ]
    for mode in START_MODES:
        run, source = start_from_dirs(bases[mode], mode)
        runs.append({"worker": "start_from", "args": [str(run), str(source), str(bases[mode]), mode]})
    bases["streams"] = tmp_path_factory.mktemp("streams")
    (bases["streams"] / "expected.json").write_text(json.dumps(streams_checkpoint(bases["streams"])))
    runs.append(
        {"worker": "streams", "args": [str(bases["streams"] / "checkpoints"), str(bases["streams"]), "dp"]}
    )
    gloo_ranks.run_ranks(WORKER, json.dumps(runs), timeout_s=240)
    return bases


@pytest.mark.distributed
def test_every_rank_passes_over_a_checkpoint_whose_rank_file_fails_on_one_rank(scenarios):
    """Rank 1's file of step_4 does not load (a checkpoint without a CRC-32 for it) and rank 0's does:
    both ranks resume step_2 (rank 0 went on with step_4 alone and the job hung in its first
    collective). Rank 1's damaged file of step_6 is found by its CRC-32 before anything is loaded."""
    tmp_path = scenarios["damaged"]
    root = tmp_path / "checkpoints"
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
def test_every_rank_passes_over_a_checkpoint_whose_metadata_fails_on_one_rank(scenarios):
    """Rank 1 cannot read step_6's .metadata (an I/O error on one node): both ranks pass over step_6
    and resume step_4. Rank 1's agreement used to meet rank 0's config check: rank 0 raised a config
    mismatch quoting the OSError, and rank 1 waited in a collective."""
    tmp_path = scenarios["meta"]
    root = tmp_path / "checkpoints"
    for rank, result in enumerate(results(tmp_path)):
        assert result["resumed"] == "step_4" and result["w"] == [4.0] * 4 and result["ranks"] == 2, result
        assert result["extra"] == {"step": 4, "rank": rank}
        assert result["warnings"][0].startswith(
            f"checkpoint step_6 is damaged: {root / 'step_6'} does not load ("
        )
        assert "OSError" in result["warnings"][0]


@pytest.mark.distributed
def test_running_out_of_memory_on_one_rank_stops_every_rank_and_moves_nothing(scenarios):
    """Rank 1 runs out of memory building the state for step_6: not damage, so every rank stops with
    one line naming step_6 and rank 1, and step_6 stays where it is."""
    tmp_path = scenarios["oom"]
    root = tmp_path / "checkpoints"
    for result in results(tmp_path):
        assert result["error"].startswith(
            "CheckpointOutOfMemoryError: out of memory while loading step_6 on rank 1 (OutOfMemoryError: CUDA out"
        ), result
        assert "pipeline_model_parallel_size" in result["error"] and "\n" not in result["error"]
        assert result["warnings"] == []
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_2", "step_4", "step_6"]


@pytest.mark.distributed
def test_every_rank_loads_the_steps_rank_0_lists(scenarios):
    """Rank 1's listing lacks step_6 (a node's stale view of the directory): both ranks load step_6,
    as rank 0 lists it (rank 1 used to load step_4 while rank 0 loaded step_6, silently)."""
    tmp_path = scenarios["list"]
    for rank, result in enumerate(results(tmp_path)):
        assert result["resumed"] == "step_6" and result["w"] == [6.0] * 4 and result["ranks"] == 2, result
        assert result["extra"] == {"step": 6, "rank": rank} and result["warnings"] == []


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["own", "source", "requeued"])
def test_every_rank_starts_from_the_checkpoint_rank_0_finds(scenarios, mode):
    """A run started from another run's checkpoint decides on every rank whether it has checkpoints
    of its own, and which of the source's is newest. Rank 1's stale listing (own: none of the run's
    own; source: not the source's newest) had it load another checkpoint than rank 0 in lock step
    (the source's step_2 against its own step_1, or the source's step_2 against its step_4).
    requeued: rank 1 skipped the broadcast of whether the run has its own, so its next one paired
    with rank 0's first and took the list of steps for a checkpoint path."""
    tmp_path = scenarios[mode]
    source = tmp_path / "source"
    expected = "None" if mode in ("own", "requeued") else str(source / "checkpoints" / "step_4")
    assert [(tmp_path / f"rank_{rank}.txt").read_text() for rank in range(2)] == [expected, expected]


def test_a_checkpoint_directory_rank_0_cannot_read_stops_every_rank(scenarios):
    """rank_0s forwarded only gptrain's errors: a PermissionError on rank 0 left the other ranks in
    the broadcast until the collective timeout. Every rank now stops with rank 0's reason."""
    tmp_path = scenarios["unreadable"]
    answers = [(tmp_path / f"rank_{rank}.txt").read_text() for rank in range(2)]
    assert answers[0] == answers[1] and answers[0].startswith("error: rank 0 could not read the checkpoints")
    assert "Permission denied" in answers[0]


@pytest.mark.distributed
def test_a_file_named_as_the_step_being_saved_stops_every_rank_in_one_line(scenarios):
    """A plain file checkpoints/step_8 where step 8 is saved: rank 0 failed with
    "step_8/COMPLETE: Not a directory" before the barrier rank 1 then waited in. Every rank now gets one
    line saying what to do, and the file is left as it was."""
    tmp_path = scenarios["file"]
    root = tmp_path / "checkpoints"
    for result in results(tmp_path):
        assert result["error"] == (
            f"CheckpointWriteError: checkpoint {root / 'step_8'} cannot be saved: a file of that name is in "
            f"the way; move it out of {root}, then run the same command again (it resumes from the newest "
            "complete checkpoint)"
        )
    assert (root / "step_8").read_text() == "notes\n" and (root / "latest").read_text() == "step_6\n"


@pytest.mark.distributed
def test_two_ranks_resuming_one_processs_checkpoint_go_on_with_its_streams(scenarios):
    """Only the data-parallel size changed (1 process to 2 ranks, TP 1, PP 1): each rank restores the
    stream the one process saved, and draws what that process, run on uninterrupted, draws next
    (Megatron restores the same (pp, tp) rank's streams). They restarted from the seed, as a fresh run's
    (review C25 F2)."""
    tmp_path = scenarios["streams"]
    expected = json.loads((tmp_path / "expected.json").read_text())
    for rank in range(2):
        result = json.loads((tmp_path / f"streams_rank_{rank}.json").read_text())
        assert result["resumed"] == "step_6" and result["lines"] == [], result
        assert result["restored"] and result["draws"] == expected, (rank, result)
