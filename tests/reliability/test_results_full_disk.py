"""A full disk under the run's own results files (not its checkpoints) while training: said once on
stderr, that output given up, and the run goes on to its next checkpoint save."""

from __future__ import annotations

import json

import pytest
from reliability_helpers import files_cannot_grow

from gptrain.train.step_times import StepTimes


def test_step_times_on_a_full_disk_are_given_up_and_training_goes_on(tmp_path, capsys):
    """Each rank of a multi-rank run appends its step times on logged iterations; on a full disk the
    write raised out of the step-end agreement and ended the run with `gptrain: error: No space left
    on device` (no file named), its peers with gloo's 'Connection closed by peer'."""
    times = StepTimes.open(tmp_path, rank=1, world_size=2)
    assert times.timed_sync(1, True, lambda: "agreed") == "agreed"  # the process's first: no line
    assert times.timed_sync(2, True, lambda: "agreed") == "agreed"
    with files_cannot_grow():
        assert times.timed_sync(3, True, lambda: "agreed") == "agreed"
        assert times.timed_sync(4, True, lambda: None) is None  # given up: not tried again
    assert times.timed_sync(5, True, lambda: None) is None  # nor once there is room again
    lines = (tmp_path / "step_times" / "rank-1.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"gptrain: WARNING: cannot write {tmp_path / 'step_times' / 'rank-1.jsonl'}: ")
    assert "File too large" in err[0] and "gptrain status" in err[0]


def test_a_file_written_atomically_names_itself_when_the_disk_is_full(tmp_path):
    """ENOSPC from a write's flush or close carries no file name: a run whose hparams.yaml met a full
    disk at start ended with `gptrain: error: No space left on device (GPTRAIN_DEBUG=1 shows where)`."""
    from gptrain.train.results import write_run_files

    with files_cannot_grow(), pytest.raises(OSError) as error:
        write_run_files(tmp_path, "trainer: {}\n")
    assert error.value.filename == str(tmp_path / "hparams.yaml")
    assert list(tmp_path.iterdir()) == []  # the temporary removed
