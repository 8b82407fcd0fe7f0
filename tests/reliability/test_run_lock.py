"""Issue 14, cases 4 and 5: one run per results directory, and no silent restart over an earlier run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from reliability_helpers import PYTHON_GPTRAIN, files_cannot_grow, start_ranks, subprocess_env, train_args

from gptrain.cli import main
from gptrain.errors import EXIT_REQUEUE, ConfigError
from gptrain.launch.job_states import ACTIVE_STATES
from gptrain.train.earlier_run import check_fresh_start
from gptrain.train.run_lock import LOCK_NAME, Holder, RunLockedError, acquire

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def holder(**changes) -> Holder:
    return replace(Holder.current(), **changes)


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid  # reaped: no process has this pid now (pids are not reused this fast)


def test_second_holder_is_refused_in_one_line_naming_the_first(tmp_path):
    lock = acquire(tmp_path)
    data = json.loads((tmp_path / LOCK_NAME).read_text())
    assert data["host"] == socket.gethostname() and data["pid"] == os.getpid()
    with pytest.raises(RunLockedError) as error:
        acquire(tmp_path, holder(pid=os.getpid() + 100000, start_time="1"))
    message = str(error.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message and "\n" not in message
    assert "another run.name" in message
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_whose_process_is_gone_is_taken_over(tmp_path):
    acquire(tmp_path, holder(pid=dead_pid()))
    lock = acquire(tmp_path)
    assert "no longer runs" in lock.notes[0]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    acquire(tmp_path, holder(pid=os.getppid(), start_time="0"))  # alive, but started at another time
    assert "another process now" in acquire(tmp_path).notes[0]


def slurm_holder(job: str, step: str | None, restarts: int, **changes) -> Holder:
    """A process of Slurm job `job` (attempt `restarts`), in srun step `step` (None: the batch script)."""
    return holder(slurm_job_id=job, slurm_step_id=step, slurm_restart_count=restarts, **changes)


def fake_squeue(bin_dir: Path, monkeypatch, steps: str | None) -> Path:
    """An squeue on PATH listing `steps` (None: squeue fails); returns the file its arguments go to."""
    bin_dir.mkdir(exist_ok=True)
    asked = bin_dir / "asked"
    body = f"echo {steps!r}" if steps is not None else "echo 'slurm_load_jobs error: timeout' >&2; exit 1"
    (bin_dir / "squeue").write_text(f'#!/bin/bash\necho "$@" >> {asked}\n{body}\n')
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return asked


def test_a_requeued_slurm_job_takes_over_its_own_lock_from_another_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # a requeue needs no Slurm command
    acquire(tmp_path, slurm_holder("42", "0", 0, host="node-a", pid=1))
    lock = acquire(tmp_path, slurm_holder("42", "0", 1, host="node-b"))
    assert "this Slurm job (42) before a requeue" in lock.notes[0]


def test_a_lock_file_of_an_earlier_version_keeps_its_rules(tmp_path, monkeypatch):
    """Written before steps and restart counts were recorded: the same job is taken as its requeue."""
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    old = {"host": "node-a", "pid": 1, "start_time": "5", "slurm_job_id": "42", "since": "earlier"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(old) + "\n")
    lock = acquire(tmp_path, slurm_holder("42", "1", 0, host="node-b"))
    assert "this Slurm job (42) before a requeue" in lock.notes[0]


def test_another_step_of_the_same_slurm_job_on_another_host_keeps_its_lock_while_it_runs(
    tmp_path, monkeypatch
):
    """srun -w node-a gptrain train, then srun -w node-b gptrain checkpoint rewind in one salloc: the
    second took the live run's lock as its requeue's, and its release then deleted the run's lock."""
    first = slurm_holder("42", "0", 0, host="node-a", pid=4242, start_time="123")
    acquire(tmp_path, first)
    second = slurm_holder("42", "1", 0, host="node-b")
    asked = fake_squeue(tmp_path / "bin", monkeypatch, "42.0 42.1 42.batch")
    with pytest.raises(RunLockedError) as error:
        acquire(tmp_path, second)
    message = str(error.value)
    assert "pid 4242 on host node-a, Slurm job 42.0" in message and "squeue -s -j 42" in message
    assert "\n" not in message
    assert asked.read_text().split() == ["--noheader", "--steps", "--jobs", "42", "--format", "%i"]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == 4242
    fake_squeue(tmp_path / "bin", monkeypatch, None)  # Slurm cannot tell: refused, the lock kept
    with pytest.raises(RunLockedError, match="node-a, Slurm job 42.0"):
        acquire(tmp_path, second)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(RunLockedError, match="node-a, Slurm job 42.0"):
        acquire(tmp_path, second)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == 4242
    fake_squeue(tmp_path / "bin", monkeypatch, "42.1 42.batch")  # step 42.0 has ended
    lock = acquire(tmp_path, second)
    assert lock.notes[0].endswith("its step 42.0 of this Slurm job has ended")
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_an_array_tasks_live_step_keeps_its_lock(tmp_path, monkeypatch):
    """An array task's SLURM_JOB_ID is its own id (1240), but squeue names its steps 1234_5.0: the
    live step 1240.0 was not found, read as ended, and its lock taken over by another step."""
    for name, value in {
        "SLURM_JOB_ID": "1240",
        "SLURM_ARRAY_JOB_ID": "1234",
        "SLURM_ARRAY_TASK_ID": "5",
    }.items():
        monkeypatch.setenv(name, value)
    acquire(tmp_path, slurm_holder("1240", "0", 0, host="node-a", pid=4242))
    second = slurm_holder("1240", "1", 0, host="node-b")
    fake_squeue(tmp_path / "bin", monkeypatch, "1234_5.0 1234_5.1 1234_5.batch")
    with pytest.raises(RunLockedError, match="node-a, Slurm job 1240.0"):
        acquire(tmp_path, second)
    fake_squeue(tmp_path / "bin", monkeypatch, "1234_5.1 1234_5.batch")  # step 0 has ended
    assert acquire(tmp_path, second).notes[0].endswith("its step 1240.0 of this Slurm job has ended")


def test_steps_listed_in_a_form_not_understood_are_not_read_as_ended(tmp_path, monkeypatch):
    """A heterogeneous job's steps (1234+0.0): unknown, so the lock is kept, never taken over."""
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    acquire(tmp_path, slurm_holder("1234", "0", 0, host="node-a", pid=4242))
    fake_squeue(tmp_path / "bin", monkeypatch, "1234+0.0 1234+0.1")
    with pytest.raises(RunLockedError, match="node-a, Slurm job 1234.0"):
        acquire(tmp_path, slurm_holder("1234", "1", 0, host="node-b"))
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == 4242


def test_a_same_job_holder_that_ran_in_no_step_is_not_taken_over_from_another_host(tmp_path, monkeypatch):
    """A batch script's or salloc shell's process has no SLURM_STEP_ID: Slurm cannot say it ended."""
    acquire(tmp_path, slurm_holder("42", None, 0, host="node-a", pid=4242))
    fake_squeue(tmp_path / "bin", monkeypatch, "")
    with pytest.raises(RunLockedError, match=r"pid 4242 on host node-a, Slurm job 42, since"):
        acquire(tmp_path, slurm_holder("42", "1", 0, host="node-b"))


def test_a_holder_of_an_earlier_boot_of_this_host_is_gone(tmp_path):
    """A pid and start time (clock ticks since boot) can repeat after a reboot; the boot id cannot."""
    from gptrain.train.run_lock import process_start_time

    here = holder()
    assert here.boot_id
    alive = holder(start_time=process_start_time(os.getpid()))
    acquire(tmp_path, replace(alive, boot_id="an-earlier-boot"))
    lock = acquire(tmp_path, holder(since="after the reboot"))
    assert "has booted since" in lock.notes[0]


def test_a_live_run_of_the_same_slurm_job_on_this_host_keeps_its_lock(tmp_path):
    """Two `srun gptrain train` (or a train and a `checkpoint rewind`) in one salloc share SLURM_JOB_ID:
    the second took over the live first's lock as a requeue would, and both wrote the directory."""
    live = subprocess.Popen(["sleep", "60"])
    try:
        from gptrain.train.run_lock import process_start_time

        first = slurm_holder("42", "0", 0, pid=live.pid, start_time=process_start_time(live.pid))
        acquire(tmp_path, first)
        with pytest.raises(RunLockedError, match=f"pid {live.pid} on host") as error:
            acquire(tmp_path, slurm_holder("42", "1", 0))
        assert "\n" not in str(error.value)
    finally:
        live.kill()
        live.wait()
    assert "this Slurm job (42)" in acquire(tmp_path, slurm_holder("42", "0", 1)).notes[0]  # its requeue


def test_another_host_is_refused_unless_slurm_says_its_job_ended(tmp_path, monkeypatch):
    acquire(tmp_path, holder(host="node-a", pid=1, slurm_job_id="41"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no scontrol: cannot know, so refuse
    with pytest.raises(RunLockedError, match="Slurm job 41"):
        acquire(tmp_path, holder(host="node-b", slurm_job_id="42"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 'JobId=41 JobState=RUNNING'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(RunLockedError):
        acquire(tmp_path, holder(host="node-b", slurm_job_id="42"))
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 'JobId=41 JobState=TIMEOUT'\n")
    assert "no longer running" in acquire(tmp_path, holder(host="node-b", slurm_job_id="42")).notes[0]


def scontrol_says(tmp_path: Path, monkeypatch, state: str) -> None:
    """An scontrol on PATH whose `show job` gives job 41 in `state`, as Slurm's job_state_string
    prints it (a state flag such as STOPPED in place of the base state)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = f"JobId=41 JobName=train\n   UserId=u(1) GroupId=g(1)\n   JobState={state} Reason=None Dependency=(null)"
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\necho '{record}'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


# Every state gptrain status counts as active, and Slurm's other holds: processes may still write.
STILL_LIVE = sorted(
    {*ACTIVE_STATES, "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "UPDATE_DB", "POWER_UP_NODE", "RECONFIG_FAIL"}
)
ENDED = (
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
)


@pytest.mark.parametrize("state", STILL_LIVE)
def test_a_job_slurm_shows_by_a_state_flag_keeps_its_lock(tmp_path, monkeypatch, state):
    """A running job shown STOPPED (SIGSTOPped, allocation kept), SIGNALING or STAGE_OUT was read as
    'no longer running' and its lock taken over: two runs writing one directory."""
    acquire(tmp_path, holder(host="node-a", pid=1, slurm_job_id="41"))
    scontrol_says(tmp_path, monkeypatch, state)
    with pytest.raises(RunLockedError, match="Slurm job 41"):
        acquire(tmp_path, holder(host="node-b", slurm_job_id="42"))


@pytest.mark.parametrize("state", ENDED)
def test_a_job_in_a_terminal_state_gives_up_its_lock(tmp_path, monkeypatch, state):
    acquire(tmp_path, holder(host="node-a", pid=1, slurm_job_id="41"))
    scontrol_says(tmp_path, monkeypatch, state)
    assert (
        "Slurm job 41 is no longer running"
        in acquire(tmp_path, holder(host="node-b", slurm_job_id="42")).notes[0]
    )


def test_a_job_slurm_no_longer_knows_gives_up_its_lock_and_an_answer_without_a_state_does_not(
    tmp_path, monkeypatch
):
    acquire(tmp_path, holder(host="node-a", pid=1, slurm_job_id="41"))
    scontrol_says(tmp_path, monkeypatch, "RUNNING")
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/bash\necho 'JobId=41 JobName=train'\n")
    with pytest.raises(RunLockedError, match="Slurm job 41"):  # no JobState: not understood, kept
        acquire(tmp_path, holder(host="node-b", slurm_job_id="42"))
    gone = "#!/bin/bash\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
    (tmp_path / "bin" / "scontrol").write_text(gone)
    assert "no longer running" in acquire(tmp_path, holder(host="node-b", slurm_job_id="42")).notes[0]


def test_release_leaves_a_lock_taken_over_by_someone_else(tmp_path):
    mine = acquire(tmp_path, holder(pid=dead_pid()))
    acquire(tmp_path)  # takes over
    mine.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_of_two_runs_that_find_one_stale_lock_only_one_takes_it_over(tmp_path, monkeypatch):
    """Before, both replaced the lock and both ran: the second run's takeover began while the first's was done."""
    import gptrain.train.run_lock as run_lock

    acquire(tmp_path, holder(pid=dead_pid()))
    first, second = holder(pid=os.getpid(), since="first"), holder(pid=os.getpid(), since="second")
    real_stale_reason, raced = run_lock.stale_reason, []

    def second_run_takes_over_meanwhile(other, me):
        reason = real_stale_reason(other, me)
        if me == first and not raced:  # the first run has judged the lock stale; the second now does it all
            raced.append(acquire(tmp_path, second))
        return reason

    monkeypatch.setattr(run_lock, "stale_reason", second_run_takes_over_meanwhile)
    with pytest.raises(RunLockedError, match="at the same moment"):
        acquire(tmp_path, first)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["since"] == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # no marker left behind


def test_a_takeover_under_way_is_not_joined_and_a_dead_takers_marker_is_taken_over(tmp_path):
    from gptrain.train.run_lock import takeover_marker

    stale = holder(pid=dead_pid())
    acquire(tmp_path, stale)
    marker = takeover_marker(tmp_path / LOCK_NAME, stale)
    marker.write_text(json.dumps(vars(holder(since="taking over"))))  # a live process is taking over
    with pytest.raises(RunLockedError, match="taking over the stale lock") as error:
        acquire(tmp_path, holder(since="late"))
    assert "\n" not in str(error.value)
    marker.write_text(json.dumps(vars(holder(pid=dead_pid()))))  # the taker died before it finished
    lock = acquire(tmp_path, holder(since="late"))
    assert "no longer runs" in lock.notes[0]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["since"] == "late"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def test_a_taker_that_died_after_replacing_the_lock_is_taken_over_in_turn(tmp_path):
    """A run that found the lock stale while another took it over and died (its marker left) was
    refused with exit 2, which Slurm does not requeue."""
    from gptrain.train.run_lock import takeover_marker

    stale, taker = holder(pid=dead_pid(), since="stale"), holder(pid=dead_pid(), since="taker")
    acquire(tmp_path, taker)  # the taker's lock is in place ...
    takeover_marker(tmp_path / LOCK_NAME, stale).write_text(json.dumps(vars(taker)))  # ... its marker left
    import gptrain.train.run_lock as run_lock

    first = [True]
    real_read = run_lock.read_holder

    def reads_the_stale_holder_first(path):  # this run read the lock before the taker replaced it
        if path.name == LOCK_NAME and first[0]:
            first[0] = False
            return stale
        return real_read(path)

    run_lock.read_holder = reads_the_stale_holder_first
    try:
        lock = acquire(tmp_path, holder(since="late"))
    finally:
        run_lock.read_holder = real_read
    assert json.loads((tmp_path / LOCK_NAME).read_text())["since"] == "late"
    assert "since taker" in lock.notes[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_second_run_in_the_same_directory_is_refused(tmp_path, capsys):
    """Case 4: before, both runs wrote checkpoints and logs into one directory."""
    log_dir = tmp_path / "run"
    first = subprocess.Popen(
        [*PYTHON_GPTRAIN, *train_args(log_dir, "trainer.max_steps=100000", "trainer.log_every_n_steps=50")],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (log_dir / "checkpoints" / "latest").exists())
        assert main(train_args(log_dir, "trainer.max_steps=100000")) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gptrain: error: ") and "\n" not in err
        assert f"in use by another run (pid {first.pid} on host {socket.gethostname()}" in err
        assert json.loads((log_dir / LOCK_NAME).read_text())["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGTERM)  # checkpoints and exits 75
        _, first_err = first.communicate(timeout=120)
    assert first.returncode == EXIT_REQUEUE, first_err[-2000:]
    assert not (log_dir / LOCK_NAME).exists()  # released at the end


def checkpoint_files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_fresh_start_into_a_directory_with_checkpoints_is_refused_with_the_choices(tmp_path, capsys):
    """Case 5: before, the new run overwrote step_2, moved `latest` back and kept the old later steps."""
    log_dir = tmp_path / "run"
    assert main(train_args(log_dir, "trainer.max_steps=4")) == 0
    before = checkpoint_files(log_dir / "checkpoints")
    assert main(train_args(log_dir, "trainer.max_steps=2", "exp_manager.resume_if_exists=false")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "exp_manager.resume_if_exists=false" in err and "step_4" in err
    assert "exp_manager.resume_if_exists=true" in err and "another run.name" in err
    assert "exp_manager.move_aside_earlier_run=true" in err and "nothing is deleted" in err
    assert checkpoint_files(log_dir / "checkpoints") == before
    assert not (log_dir / LOCK_NAME).exists()


def test_a_requeued_job_resumes_its_own_checkpoints_even_with_resume_if_exists_false(
    tmp_path, capsys, monkeypatch
):
    """The Azure tutorial passes resume_if_exists=False; a requeue of that job is the same run and
    must resume (it was refused with exit 2, which is not requeued). Another job is still refused."""
    log_dir = tmp_path / "run"
    fresh = ["trainer.max_steps=4", "exp_manager.resume_if_exists=false"]
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert main(train_args(log_dir, *fresh, "trainer.max_time=00:00:00:00.001")) == EXIT_REQUEUE
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # what Slurm sets in the requeued job
    assert main(train_args(log_dir, *fresh)) == 0
    log = (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "this is Slurm job 4242 requeued and step_1 is its own checkpoint: resuming it" in log
    assert "resuming from" in log and (log_dir / "checkpoints" / "latest").read_text().strip() == "step_4"
    monkeypatch.setenv("SLURM_JOB_ID", "4343")  # another job, even a requeued one, is another run
    assert main(train_args(log_dir, *fresh)) == 2
    assert "holds an earlier run's checkpoints" in capsys.readouterr().err


def test_a_requeued_job_finds_its_own_checkpoint_by_complete_when_latest_was_not_written(
    tmp_path, capsys, monkeypatch
):
    """A job killed between a save's COMPLETE and its `latest` (always so on its first save): the
    requeue was refused (exit 2, not requeued), or with move_aside it moved its own progress away."""
    log_dir = tmp_path / "run"
    fresh = ["trainer.max_steps=4", "exp_manager.resume_if_exists=false"]
    monkeypatch.setenv("SLURM_JOB_ID", "4444")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert main(train_args(log_dir, *fresh, "trainer.max_time=00:00:00:00.001")) == EXIT_REQUEUE
    (log_dir / "checkpoints" / "latest").unlink()  # as if killed before it was written
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert main(train_args(log_dir, *fresh, "exp_manager.move_aside_earlier_run=true")) == 0
    log = (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "this is Slurm job 4444 requeued and step_1 is its own checkpoint: resuming it" in log
    assert not list(tmp_path.glob("run.earlier-*"))


def test_move_aside_keeps_the_earlier_run_whole(tmp_path, capsys):
    log_dir = tmp_path / "run"
    assert main(train_args(log_dir, "trainer.max_steps=4")) == 0
    before = checkpoint_files(log_dir / "checkpoints")
    events_before = sorted(p.name for p in log_dir.glob("events.out.tfevents*"))
    fresh = [
        "trainer.max_steps=2",
        "exp_manager.resume_if_exists=false",
        "exp_manager.move_aside_earlier_run=true",
    ]
    assert main(train_args(log_dir, *fresh)) == 0
    [aside] = tmp_path.glob("run.earlier-*")
    assert checkpoint_files(aside / "checkpoints") == before
    assert sorted(p.name for p in aside.glob("events.out.tfevents*")) == events_before
    assert (log_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert not (log_dir / "checkpoints" / "step_4").exists()
    assert not set(p.name for p in log_dir.glob("events.out.tfevents*")) & set(events_before)
    assert "moved the earlier run's" in (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text()


def test_fresh_start_into_a_directory_without_complete_checkpoints_needs_nothing(tmp_path):
    log_dir = tmp_path / "run"
    assert check_fresh_start(log_dir, move_aside=False) is None
    (log_dir / "checkpoints" / "step_2").mkdir(parents=True)  # a save that died: nothing to resume
    assert check_fresh_start(log_dir, move_aside=False) is None
    assert check_fresh_start(log_dir, move_aside=True) is None and not list(tmp_path.glob("run.earlier-*"))
    (log_dir / "checkpoints" / "step_2" / "COMPLETE").write_text("{}")
    with pytest.raises(ConfigError, match="step_2"):
        check_fresh_start(log_dir, move_aside=False)


def test_a_requeue_after_its_first_attempt_died_in_its_first_save_starts_over_in_place(tmp_path, monkeypatch):
    """resume_if_exists=false, and attempt 1 was killed while writing its first checkpoint: the torn
    step_1/ is no earlier run's, so the requeue starts over in its own directory (it was refused with
    exit 2, which is not requeued; with move_aside_earlier_run its own logs were moved away)."""
    log_dir = tmp_path / "run"
    fresh = ["exp_manager.resume_if_exists=false", "exp_manager.move_aside_earlier_run=true"]
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert main(train_args(log_dir, *fresh, "trainer.max_time=00:00:00:00.001")) == EXIT_REQUEUE
    (log_dir / "checkpoints" / "step_1" / "COMPLETE").unlink()  # killed before the marker
    (log_dir / "checkpoints" / "latest").unlink()
    log = log_dir / "nemo_log_globalrank-0_localrank-0.txt"
    first_attempt = log.read_text()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert main(train_args(log_dir, *fresh)) == 0
    assert not list(tmp_path.glob("run.earlier-*"))
    assert log.read_text().startswith(first_attempt)
    assert (
        "exp_manager.resume_if_exists=false: starting from scratch" in log.read_text()[len(first_attempt) :]
    )
    assert (log_dir / "checkpoints" / "latest").read_text() == "step_4\n"
    assert not (log_dir / "checkpoints" / "step_1").exists()  # removed by retention like any torn save


@pytest.mark.distributed
def test_every_rank_of_a_refused_run_ends_with_the_same_one_line_error(tmp_path):
    """Rank 0 takes the lock for the job; the other ranks learn the refusal from it and end too."""
    log_dir = tmp_path / "run"
    held = acquire(log_dir)  # this test process: alive, on this host
    try:
        processes = start_ranks(log_dir, [])
        outputs = [p.communicate(timeout=120) for p in processes]
    finally:
        held.release()
    for process, (_, err) in zip(processes, outputs, strict=True):
        last = err.strip().splitlines()[-1]
        assert process.returncode == 2, err[-2000:]
        assert last.startswith("gptrain: error: ") and f"in use by another run (pid {os.getpid()}" in last
    assert sorted(p.name for p in log_dir.iterdir()) == []  # nothing written by the refused run


def test_a_run_directory_that_cannot_be_made_is_one_line_naming_the_key(tmp_path):
    """Under a regular file, or where the job may not write: a ConfigError (told to every rank), not
    rank 0's traceback and the others' 'connection closed by peer'."""
    from gptrain.errors import ConfigError
    from gptrain.train.run_directory import claim_run_directory

    (tmp_path / "file").write_text("x")
    with pytest.raises(
        ConfigError, match=r"^exp_manager.explicit_log_dir .*/file/run: cannot claim it"
    ) as error:
        claim_run_directory(tmp_path / "file" / "run", 0, 1, resume=True, move_aside=False)
    assert "\n" not in str(error.value)


def test_a_checkpoint_directory_that_takes_no_files_is_refused_at_start(tmp_path, monkeypatch):
    """It was found at the first save, after hours of training (every_n_train_steps=2000)."""
    import errno

    from gptrain.errors import ConfigError
    from gptrain.train.run_directory import claim_run_directory

    real_write = Path.write_bytes

    def read_only(path, data):
        if path.name.startswith(".gptrain-write-check"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(ConfigError, match=r"checkpoints: checkpoints cannot be written there") as error:
        claim_run_directory(tmp_path / "run", 0, 1, resume=True, move_aside=False)
    assert "\n" not in str(error.value) and "Permission denied" in str(error.value)
    assert not (tmp_path / "run" / LOCK_NAME).exists()  # the lock given back
    lock = claim_run_directory(tmp_path / "run", 0, 1, resume=True, move_aside=False, saves=False)
    lock.release()  # a run that saves nothing is not held to it


def test_a_lock_that_cannot_be_written_is_not_left_behind(tmp_path):
    """A full disk at start: the lock file was created (O_EXCL) but its holder could not be written,
    and the empty file refused every later run ("an unreadable lock file") until deleted by hand,
    the same command after space was freed included."""
    from gptrain.train.run_directory import claim_run_directory

    (tmp_path / "run").mkdir()
    with files_cannot_grow(), pytest.raises(ConfigError, match="cannot claim it .*File too large") as error:
        claim_run_directory(tmp_path / "run", 0, 1, resume=True, move_aside=False)
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []
    lock = claim_run_directory(tmp_path / "run", 0, 1, resume=True, move_aside=False)  # space freed
    assert lock.notes == [] and json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_takeover_that_cannot_be_written_leaves_no_marker(tmp_path):
    """Taking over a dead run's lock on a full disk: no takeover marker or temporary may stay behind
    empty, where the marker refused every later run as "taking over the stale lock at the same moment"."""
    dead = holder(pid=dead_pid())
    acquire(tmp_path, dead)
    with files_cannot_grow(), pytest.raises(OSError, match="File too large"):
        acquire(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]
    assert "no longer runs" in acquire(tmp_path).notes[0]  # space freed: the takeover goes ahead


def killed_while_creating(path: Path) -> None:
    """What a SIGKILL between the lock's O_EXCL create and its write leaves: an empty file."""
    code = f"import os, signal; os.open({str(path)!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644); "
    code += "os.kill(os.getpid(), signal.SIGKILL)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL


@pytest.mark.parametrize("torn", ["killed", "garbled"])
def test_a_torn_lock_whose_writer_is_gone_is_removed_and_a_live_ones_refuses(tmp_path, torn):
    """A run killed between creating its lock and writing it left an empty (or, torn mid-write,
    garbled) gptrain.lock that refused every later run as "an unreadable lock file" until deleted by
    hand. Liveness is the lock's flock, held by its run for its life: no holder, no lock."""
    import fcntl

    path = tmp_path / LOCK_NAME
    if torn == "killed":
        killed_while_creating(path)
    else:
        path.write_text('{"host": "n1", "pi')
    lock = acquire(tmp_path)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    with open(path) as other, pytest.raises(BlockingIOError):  # the run holds it
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.release()
    path.write_text("")
    with open(path) as live:  # a live writer's, empty for an instant: held, so never removed
        fcntl.flock(live.fileno(), fcntl.LOCK_EX)
        with pytest.raises(RunLockedError, match="an unreadable lock file"):
            acquire(tmp_path)
    assert path.read_text() == ""


def test_a_torn_takeover_marker_whose_writer_is_gone_is_removed(tmp_path):
    """The same for the marker of a takeover: its empty file refused every later run."""
    from gptrain.train.run_lock import takeover_marker

    stale = holder(pid=dead_pid())
    acquire(tmp_path, stale)
    killed_while_creating(takeover_marker(tmp_path / LOCK_NAME, stale))
    assert "no longer runs" in acquire(tmp_path, holder(since="late")).notes[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def test_a_torn_lock_is_removed_where_flock_is_nfs_posix_locking(tmp_path, monkeypatch):
    """Over NFS, Linux's flock is a POSIX lock: an exclusive one needs a file open for writing
    (flock(2)), so the torn-lock check, which opened the file read-only, was refused there (EBADF)
    and the torn lock refused every run, on the shared file systems run directories live on."""
    import errno
    import fcntl

    from gptrain.train import run_lock

    real = fcntl.flock

    def nfs_flock(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        real(fd, operation)

    monkeypatch.setattr(run_lock.fcntl, "flock", nfs_flock)
    killed_while_creating(tmp_path / LOCK_NAME)
    lock = acquire(tmp_path)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_every_rank_of_a_run_says_what_rank_0_moved_aside(tmp_path):
    """Rank 0 alone claims the directory, and of a run of several ranks only the last prints to the
    console: 'moved the earlier run's entries to ...' stayed in rank 0's log file, and the job's
    output never said where the earlier run went. Rank 0's notes now reach every rank."""
    from gloo_ranks import run_ranks

    log_dir = tmp_path / "run"
    (log_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (log_dir / "checkpoints" / "step_2" / "COMPLETE").write_text("{}")
    run_ranks(Path(__file__).with_name("run_lock_notes_worker.py"), log_dir, tmp_path)
    [aside] = tmp_path.glob("run.earlier-*")
    notes = [json.loads((tmp_path / f"notes-{rank}.json").read_text()) for rank in (0, 1)]
    assert (
        notes[0]
        == notes[1]
        == [f"exp_manager.move_aside_earlier_run: moved the earlier run's 1 entries to {aside}"]
    )
