"""The rendered sbatch script's signal forwarding and requeue logic, run with stub srun/scontrol.

The real-Slurm tests cover the same path end to end; these run in milliseconds on any machine
and reach the cases a real run rarely does (max_requeues reached, a plain failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gptrain.launch.compose import compose
from gptrain.launch.stages import build_plan, write_run_files

STEP = """
import os, signal, sys, time, pathlib
mode = sys.argv[1]
if mode == "wait":  # before the marker, which tells the test to signal
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(signum, lambda *_: sys.exit(75))
names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
marker = pathlib.Path(sys.argv[-1] + ".started")  # whole when it appears: the test signals at once
pathlib.Path(str(marker) + ".tmp").write_text(" ".join(os.environ[n] for n in names))
os.replace(str(marker) + ".tmp", marker)
if mode == "wait":
    time.sleep(30)
sys.exit(int(mode))
"""


def stub(path: Path, text: str) -> None:
    """Written beside and renamed over: the script's background nudge may still be running the old
    stub, and writing an executable in use fails (ETXTBSY)."""
    fresh = path.with_name(f".{path.name}.new")
    fresh.write_text("#!/bin/bash\n" + text)
    fresh.chmod(0o755)
    fresh.replace(path)


@pytest.fixture
def batch(tmp_path):
    """Render a training script whose step is a small Python program; return a runner."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir / "srun", 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    calls = tmp_path / "scontrol.calls"
    stub(
        bin_dir / "scontrol",
        f'echo "$*" >> {calls}\ncase "$1 $2" in\n  "show hostnames") echo n1 ;;\n'
        '  "show node") echo "NodeName=n1 NodeAddr=10.0.0.7 State=IDLE" ;;\n'
        '  "show job") echo "JobId=42 JobState=PENDING" ;;\nesac\n',
    )
    (tmp_path / "step.py").write_text(STEP)
    args = [
        f"base_results_dir={tmp_path}",
        "cluster_type=slurm",
        "cluster.max_requeues=2",
        f"python={bin_dir}/py",
    ]
    script = write_run_files(build_plan(compose(args)), args)[0]

    def run(
        mode: str,
        restarts: int,
        send_usr1: bool = False,
        send: int | None = None,
        requeued: int | None = None,
    ) -> tuple[int, str]:
        """`restarts`: Slurm's count; `requeued`: gptrain's own requeues of the job (default: all)."""
        stub(bin_dir / "py", f'exec {sys.executable} {tmp_path / "step.py"} {mode} "$@"\n')
        record = script.parent / "requeues.txt"
        record.write_text(f"7 9\n42 {restarts if requeued is None else requeued}\n")  # job 7: another job's
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
        env.update(SLURM_JOB_NODELIST="n1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="1")
        env.update(SLURM_NTASKS_PER_NODE="1", SLURM_RESTART_COUNT=str(restarts))
        marker = Path(str(next(script.parent.glob("*_hydra.yaml"))) + ".started")
        marker.unlink(missing_ok=True)
        process = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
        if send_usr1 or send is not None:
            wait_until(marker.exists)
            process.send_signal(send or signal.SIGUSR1)  # what --signal=B:USR1@N does to the batch shell
        _, err = process.communicate(timeout=30)
        assert marker.read_text() == "10.0.0.7 20042 0 0 1"  # rendezvous and rank from Slurm's variables
        return process.returncode, err

    return run, calls


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_exit_75_requeues_and_resets_the_start_time(batch):
    run, calls = batch
    code, err = run("75", restarts=0)
    assert code == 0 and "requeueing (restart 1 of 2)" in err
    wait_until(lambda: "update JobId=42 StartTime=now" in calls.read_text())  # the detached nudge
    lines = calls.read_text().splitlines()
    assert "requeue 42" in lines and lines.index("requeue 42") < lines.index("update JobId=42 StartTime=now")


def test_exit_76_of_the_hang_watchdog_requeues_too(batch):
    """Issue 14, case 8: a hung rank ends the step with 76; the job requeues and resumes."""
    run, calls = batch
    code, err = run("76", restarts=0)
    assert code == 0 and "a rank hung (see the line above); requeueing (restart 1 of 2)" in err
    assert "requeue 42" in calls.read_text().splitlines()


@pytest.mark.parametrize("mode", ["75", "76"])
def test_max_requeues_reached_keeps_the_exit_code(batch, mode):
    run, calls = batch
    code, err = run(mode, restarts=2)
    assert code == int(mode) and "max_requeues=2 reached" in err
    assert "requeue" not in calls.read_text()


def test_requeues_slurm_made_on_preemption_do_not_spend_max_requeues(batch):
    """Slurm's restart count counts its own requeues (preemptions) too: after two preemptions a
    run with max_requeues 2 stopped for good at its first time limit. gptrain counts its own."""
    run, calls = batch
    code, err = run("75", restarts=2, requeued=0)
    assert code == 0 and "requeueing (restart 1 of 2)" in err
    assert "requeue 42" in calls.read_text().splitlines()
    record = next(calls.parent.rglob("requeues.txt"))
    assert record.read_text().splitlines()[-1] == "42 1"


def test_a_requeue_that_cannot_be_recorded_is_not_made(batch, monkeypatch):
    """An unwritable requeues.txt (read-only run dir, quota) read as 0 requeues every time: the job
    requeued for ever. It now ends with the step's code and says why."""
    run, calls = batch
    original = Path.write_text

    def record_as_a_directory(path, text, *args, **kwargs):
        if path.name != "requeues.txt":
            return original(path, text, *args, **kwargs)
        path.mkdir(exist_ok=True)  # the append then fails, as on a read-only directory
        return 0

    monkeypatch.setattr(Path, "write_text", record_as_a_directory)
    code, err = run("75", restarts=0)
    assert code == 75 and "cannot record the requeue" in err
    assert "requeue" not in calls.read_text().replace("cannot record the requeue", "")


@pytest.mark.parametrize("mode", ["0", "3"])
def test_finished_or_failed_runs_are_never_requeued(batch, mode):
    run, calls = batch
    code, err = run(mode, restarts=0)
    assert code == int(mode) and f"step finished with exit code {mode}" in err
    assert "requeue" not in calls.read_text()


def test_usr1_is_forwarded_to_the_step_and_leads_to_a_requeue(batch):
    run, calls = batch
    code, err = run("wait", restarts=1, send_usr1=True)
    assert "got SIGUSR1, forwarding it" in err and "requeueing (restart 2 of 2)" in err
    assert code == 0 and "requeue 42" in calls.read_text().splitlines()


def test_a_requeue_slurm_refuses_is_retried_then_ends_the_job_with_the_steps_code(batch):
    """`scontrol requeue` failing (a controller that times out) ended the job with 0: Slurm called
    a run that had only saved a checkpoint COMPLETED, and nothing told anyone to resume it."""
    run, calls = batch
    bin_dir = calls.parent / "bin"
    stub(bin_dir / "sleep", "")  # the retries' waits
    original = (bin_dir / "scontrol").read_text().removeprefix("#!/bin/bash\n")
    refused = original.replace("esac\n", "  requeue*) exit 1 ;;\nesac\n")
    stub(bin_dir / "scontrol", refused.replace("JobState=PENDING", "JobState=RUNNING"))
    code, err = run("75", restarts=0)
    assert code == 75 and "scontrol requeue failed: launch again to resume" in err
    assert calls.read_text().splitlines().count("requeue 42") == 3
    # the controller took the requeue but its reply timed out: queued again, not a failure
    calls.write_text("")
    stub(bin_dir / "scontrol", refused)
    code, err = run("75", restarts=0)
    assert code == 0 and "requeue failed" not in err
    assert calls.read_text().splitlines().count("requeue 42") == 1


# `scontrol show job` of a job COMPLETING with Reason=None (as Slurm 23-25 print it); Restarts=N
SHOW_JOB = """JobId=42 JobName=gptrain-r
   UserId=u(1000) GroupId=u(1000) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=normal
   JobState=COMPLETING Reason=None Dependency=(null)
   Requeue=1 Restarts={restarts} BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:01:10 TimeLimit=01:00:00 TimeMin=N/A
"""


@pytest.mark.parametrize(("restarts", "slurm_restarts", "said"), [
    (0, 1, "gptrain: Slurm requeued the job itself (preemption): it resumes when it starts again"),
    (3, 4, "gptrain: Slurm requeued the job itself (preemption): it resumes when it starts again"),
    (1, 1, "gptrain: the job was cancelled (scancel): not requeueing; launch again to resume"),
])  # fmt: skip
def test_a_job_slurm_requeued_on_preemption_is_not_called_cancelled(batch, restarts, slurm_restarts, said):
    """PreemptMode=REQUEUE: slurmctld requeues the job (PENDING|COMPLETING, which scontrol shows as
    COMPLETING, Reason unchanged: None), then slurmd SIGTERMs the batch shell. The run saved and
    exited 75 and the script told the user it was cancelled and to launch again, though Slurm runs
    it again by itself; the requeue Slurm did raised Restarts past the job's SLURM_RESTART_COUNT,
    which a scancel does not (the last case: a job requeued once before, then cancelled)."""
    run, calls = batch
    bin_dir = calls.parent / "bin"
    original = (bin_dir / "scontrol").read_text().removeprefix("#!/bin/bash\n")
    shown = SHOW_JOB.format(restarts=slurm_restarts)
    stub(
        bin_dir / "scontrol",
        original.replace('echo "JobId=42 JobState=PENDING"', f"cat <<'OUT'\n{shown}OUT\n"),
    )
    code, err = run("wait", restarts=restarts, send=signal.SIGTERM)
    assert code == 75 and said in err.splitlines()
    assert "requeue 42" not in calls.read_text().splitlines()  # the job is queued already (or cancelled)
    assert "requeueing" not in err.replace("not requeueing", "")


def test_a_job_its_user_cancelled_is_not_requeued(batch):
    """scancel SIGTERMs the batch shell and the job is COMPLETING; the run checkpoints and exits 75,
    and the script requeued it: Slurm took that requeue (seen on a real slurmctld), the run went on."""
    run, calls = batch
    bin_dir = calls.parent / "bin"
    original = (bin_dir / "scontrol").read_text().removeprefix("#!/bin/bash\n")
    cancelled = original.replace("JobState=PENDING", "JobState=COMPLETING Reason=None Dependency=(null)")
    stub(bin_dir / "scontrol", cancelled)
    code, err = run("wait", restarts=0, send=signal.SIGTERM)
    assert code == 75 and "the job was cancelled (scancel): not requeueing; launch again to resume" in err
    assert "requeue 42" not in calls.read_text().splitlines()
    code, err = run("wait", restarts=0, send=signal.SIGUSR1)  # the time limit's warning: requeued
    assert code == 0 and "requeueing (restart 1 of 2)" in err
    stub(bin_dir / "scontrol", cancelled.replace("Reason=None", "Reason=TimeLimit"))
    code, err = run("wait", restarts=0, send=signal.SIGTERM)  # the hard time limit, checkpoint saved
    assert code == 0 and "requeueing (restart 1 of 2)" in err
