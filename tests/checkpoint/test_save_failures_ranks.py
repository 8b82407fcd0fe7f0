"""Two gloo ranks saving a checkpoint that fails on one rank only (a full disk under one node's file)."""

import json
from pathlib import Path

import gloo_ranks
import pytest

from gptrain.checkpoint.directory import LATEST
from gptrain.checkpoint.integrity import complete_steps, recorded_world_size, verify
from gptrain.cli import main

WORKER = Path(__file__).with_name("save_failure_worker.py")
FULL = "OSError: [Errno 28] No space left on device"


# (mode, save): every scenario of this file, in one launch of two ranks
SCENARIOS = [
    ("rankfile", "sync"),
    ("rankfile", "async"),
    ("complete", "sync"),
    ("whole", "sync"),
    ("staging", "async"),
    ("staging", "pinned"),
    ("slowcopy", "pinned"),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """scenario: its directory (checkpoints/ and rank_<r>.json), after one launch ran them all."""
    bases = {scenario: tmp_path_factory.mktemp("_".join(scenario)) for scenario in SCENARIOS}
    runs = [[str(base / "checkpoints"), str(base), mode, how] for (mode, how), base in bases.items()]
    gloo_ranks.run_ranks(WORKER, json.dumps(runs))
    return bases


def outcomes(saved: dict, mode: str, how: str) -> tuple[Path, list[dict]]:
    """(the scenario's checkpoints root, every rank's outcome)."""
    base = saved[(mode, how)]
    return base / "checkpoints", [json.loads((base / f"rank_{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_full_disk_under_one_ranks_file_stops_every_rank_with_its_cause(saved, how):
    """rank_1.pt was written before DCP's save, outside its agreement: rank 1 stopped with the full
    disk while rank 0 waited in DCP's first collective until the process group timed out, and then
    named the timeout. Every rank now stops at once with rank 1's cause, in step with the others."""
    root, results = outcomes(saved, "rankfile", how)
    for result in results:
        assert result["error"].startswith(
            f"CheckpointWriteError: checkpoint {root / 'step_4'} could not be written"
        )
        assert FULL in result["error"] and "\n" not in result["error"]
        assert result["next_collective"] == 2.0
    assert complete_steps(root) == [2] and not (root / "step_4").exists()
    assert (root / LATEST).read_text() == "step_2\n"


@pytest.mark.distributed
def test_a_full_disk_under_complete_stops_every_rank_with_rank_0s_line(saved):
    """Rank 0 could not write COMPLETE: it stopped with the full disk while rank 1 waited in the gather
    after it until the process group timed out (a RuntimeError, not a line). Every rank now stops with
    rank 0's line, and the unmarked save is removed."""
    root, (first, second) = outcomes(saved, "complete", "sync")
    assert first["error"] == second["error"]
    assert first["error"].startswith(
        f"CheckpointWriteError: checkpoint {root / 'step_4'} could not be written"
    )
    assert FULL in first["error"]
    assert first["next_collective"] == second["next_collective"] == 2.0
    assert complete_steps(root) == [2] and not (root / "step_4").exists()
    assert (root / LATEST).read_text() == "step_2\n"


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["async", "pinned"])
def test_a_staging_copy_failing_on_one_rank_stops_every_rank_at_once_with_its_cause(saved, how):
    """Rank 1's staging copy of an async save failed: it raised from the optimizer step's wait for the
    copy, alone, and then waited in the next agreement, while rank 0's writer thread waited in DCP's
    gather of save plans for a rank that never came, both until the process group timed out (10 s
    here; 30 minutes in a run). The ranks now agree on the copy before the write starts: every rank
    stops within seconds (the copy fails after 1 s) with rank 1's line, and meets the others next. The
    copy of a CUDA run's stager (pinned) blocks the training thread: the same, raised from the save."""
    root, results = outcomes(saved, "staging", how)
    expected = (
        f"CheckpointWriteError: checkpoint {root / 'step_4'} could not be written (on rank 1: RuntimeError: "
        "staging copy failed (injected)); the partial directory was removed and earlier checkpoints are "
        f"unchanged: free space or fix permissions under {root}"
    )
    for result in results:
        assert result["error"] == expected, results
        assert result["seconds"] < 8.0, results  # the copy's 1 s and a few small collectives; the hang: 10 s
        assert result["next_collective"] == 2.0
    assert complete_steps(root) == [2] and not (root / "step_4").exists()
    assert (root / LATEST).read_text() == "step_2\n"


@pytest.mark.distributed
def test_the_pinned_copys_agreement_runs_beside_the_training_not_in_it(saved):
    """A CUDA run's staging copy (pinned) blocks the training thread; the agreement on it then ran
    there too, an all-reduce over every rank on every save: rank 0, its copy done, waited in it for
    rank 1's copy (1 s slower here; at scale, the slowest of every rank's, and a ring's latency). The
    agreement now runs in a thread of its own, before DCP's writer thread starts the write: the training
    thread enters no collective of the background group, and rank 0 stalls for its own copy alone
    (of 16 bytes here: well under the second it waited)."""
    root, (first, second) = outcomes(saved, "slowcopy", "pinned")
    for result in (first, second):
        assert result["error"] is None and result["next_collective"] == 2.0, (first, second)
        assert result["all_reduce_threads"], result  # the agreement ran, with its all-reduce recorded
        assert "MainThread" not in result["all_reduce_threads"], result
    assert first["stalled"] < 0.5, first
    assert second["stalled"] >= 1.0, second  # its own copy: what the optimizer step must wait for
    assert complete_steps(root) == [2, 4]


def marker(step_dir: Path) -> dict:
    return json.loads((step_dir / "COMPLETE").read_text())


def rewrite_marker(step_dir: Path, record: dict) -> None:
    (step_dir / "COMPLETE").write_text(json.dumps(record, indent=1) + "\n")


@pytest.mark.distributed
def test_a_two_rank_checkpoint_records_its_world_and_verify_names_a_missing_rank_file(
    saved, tmp_path, capsys
):
    """COMPLETE recorded which files a save wrote, but not how many ranks wrote them: a manifest that
    lost a rank's file (edited, or listed from one node's view as before saves were refused there)
    verified whole. It records the world size; verify names a rank file missing from the directory or
    from the manifest. A marker from before the record verifies as before."""
    root, results = outcomes(saved, "whole", "sync")  # this test alone edits its checkpoint
    assert [result["error"] for result in results] == [None, None]
    step_4 = root / "step_4"
    assert marker(step_4)["world_size"] == 2 and recorded_world_size(step_4) == 2
    assert verify(step_4, checksums=True, named_shards=True) is None
    (step_4 / "rank_1.pt").rename(tmp_path / "rank_1.pt")
    assert main(["checkpoint", "verify", str(root)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == f"step_4: DAMAGED: {step_4 / 'rank_1.pt'} is missing"
    record = marker(step_4)
    del record["files"]["rank_1.pt"]
    rewrite_marker(step_4, record)
    assert verify(step_4) == (
        f"{step_4 / 'COMPLETE'} records a save by 2 ranks, but its manifest lists no rank_1.pt: "
        "the save lost it"
    )
    del record["world_size"]  # as gptrain wrote it before the record: the manifest's files alone
    rewrite_marker(step_4, record)
    assert verify(step_4, checksums=True, named_shards=True) is None and recorded_world_size(step_4) == 1
    rewrite_marker(step_4, {"step": 4})  # before manifests: nothing to compare, said so
    assert main(["checkpoint", "verify", str(root)]) == 0
    assert (
        capsys.readouterr().out.splitlines()[0].startswith("step_4: not checked (its COMPLETE marker is from")
    )
