"""Who holds a run lock, and whether that holder is gone: its process on this host, its Slurm job
and step (asked of scontrol and squeue), and the rules by which gptrain.train.run_lock takes a
stale lock over.

A requeued job keeps its id and counts up SLURM_RESTART_COUNT; two steps of one salloc share the
job id, on any of its nodes; Slurm's answers are read as "ended" only when it says so plainly
(a command that cannot be asked, or a step name not understood, is unknown: the lock is kept).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Slurm's terminal base states: a job shown in one of them runs no process and never will again. Any
# other state counts as live, whatever its name: scontrol shows a state flag in place of the base
# state (a running job is STOPPED, SIGNALING, STAGE_OUT ...; gptrain.launch.job_states lists those
# `gptrain status` counts as active), and a list of the live ones read a flag it missed as ended.
ENDED_JOB_STATES = frozenset(
    (
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
)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: enough to tell whether that process still exists. The fields after `since`
    are absent from the lock files of earlier versions (None), which keep the rules they had."""

    host: str
    pid: int
    start_time: str | None = None  # /proc/<pid>/stat field 22: tells a reused pid apart
    slurm_job_id: str | None = None
    since: str = ""
    slurm_step_id: str | None = None  # which srun of the job; none in a batch script or salloc's shell
    slurm_restart_count: int | None = None  # which attempt of a requeued job (0: the first)
    boot_id: str | None = None  # a pid and start time of an earlier boot name no process now

    @classmethod
    def current(cls) -> Holder:
        pid = os.getpid()
        job = os.environ.get("SLURM_JOB_ID")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        step = os.environ.get("SLURM_STEP_ID") if job else None
        restarts = slurm_restart_count(os.environ) if job else None
        return cls(socket.gethostname(), pid, process_start_time(pid), job, stamp, step, restarts, boot_id())

    def slurm_name(self) -> str:
        """`job.step` as Slurm writes it, or the job alone when the holder ran in no step."""
        step = f".{self.slurm_step_id}" if self.slurm_step_id else ""
        return f"{self.slurm_job_id}{step}"

    def describe(self) -> str:
        job = f", Slurm job {self.slurm_name()}" if self.slurm_job_id else ""
        return f"pid {self.pid} on host {self.host}{job}, since {self.since or '?'}"


def slurm_restart_count(env: dict[str, str] | os._Environ) -> int:
    """SLURM_RESTART_COUNT, which Slurm sets only from a job's first requeue on (unset: 0)."""
    text = env.get("SLURM_RESTART_COUNT", "0")
    return int(text) if text.isdigit() else 0


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_start_time(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]  # fields after the command name; 22nd overall


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def slurm_job_live(job_id: str) -> bool | None:
    """True/False when scontrol answers; None when it cannot be asked or names no state. Ended only
    when Slurm says so: every record in a terminal state, or the job no longer known."""
    try:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return False if "Invalid job id" in out.stderr else None
    states = re.findall(r"\bJobState=(\S+)", out.stdout)  # an array job: a record per task
    if not states:
        return None
    return any(state not in ENDED_JOB_STATES for state in states)


def squeue_job_names(job_id: str) -> set[str]:
    """The names squeue gives job `job_id` in its step ids: the id itself, and for an array task of
    this job (SLURM_JOB_ID is the task's own id) ARRAYJOB_TASK, as in 1234_5.0. squeue has no field
    of a step's raw job id (StepId is printed the same way)."""
    names = {job_id}
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if os.environ.get("SLURM_JOB_ID") == job_id and array and task:
        names.add(f"{array}_{task}")
    return names


def slurm_step_live(job_id: str, step_id: str) -> bool | None:
    """Whether step `job_id.step_id` still runs, as squeue lists the job's steps (an ended step is
    no longer listed); None when squeue cannot be asked or fails, or lists steps under a job name
    not understood (a heterogeneous job's 1234+0.0): unknown, never read as ended."""
    command = ["squeue", "--noheader", "--steps", "--jobs", job_id, "--format", "%i"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    listed = out.stdout.split()
    names = squeue_job_names(job_id)
    if any(f"{name}.{step_id}" in listed for name in names):
        return True
    if any(entry.rpartition(".")[0] not in names for entry in listed):
        return None
    return False


def booted_since(other: Holder, me: Holder) -> bool:
    return bool(other.boot_id and me.boot_id and other.boot_id != me.boot_id)


def runs_here(other: Holder, me: Holder) -> bool:
    """Whether `other` is a process running on this host now (its pid alive, started when it was,
    in this boot)."""
    if other.host != me.host or booted_since(other, me) or not pid_alive(other.pid):
        return False
    return not other.start_time or other.start_time == process_start_time(other.pid)


def requeued_since(other: Holder, me: Holder) -> bool:
    """Whether `me` is a later attempt of the Slurm job `other` ran in: a requeue kills every process
    of the job before it runs again. A lock of an earlier version (no restart count) counts as one."""
    if not other.slurm_job_id or other.slurm_job_id != me.slurm_job_id:
        return False
    return other.slurm_restart_count is None or (me.slurm_restart_count or 0) > other.slurm_restart_count


def stale_reason(other: Holder, me: Holder) -> str | None:
    """Why `other`'s lock may be taken over, or None while it may still be running. Two steps of one
    allocation (two `srun gptrain train`, or a `checkpoint rewind` beside a run, in one salloc) share
    SLURM_JOB_ID and its restart count, on this host or another: only a requeue is this job's
    predecessor, and another step is stale only once it has ended."""
    if runs_here(other, me):
        return None
    if requeued_since(other, me):
        return f"it is this Slurm job ({me.slurm_job_id}) before a requeue"
    if other.host == me.host:
        if booted_since(other, me):
            return f"{me.host} has booted since pid {other.pid} took it"
        if not pid_alive(other.pid):
            return f"pid {other.pid} no longer runs on {me.host}"
        return f"pid {other.pid} on {me.host} is another process now"
    if other.slurm_job_id and other.slurm_job_id == me.slurm_job_id:
        if other.slurm_step_id and slurm_step_live(other.slurm_job_id, other.slurm_step_id) is False:
            return f"its step {other.slurm_name()} of this Slurm job has ended"
        return None
    if other.slurm_job_id and slurm_job_live(other.slurm_job_id) is False:
        return f"Slurm job {other.slurm_job_id} is no longer running"
    return None


def same_job_hint(other: Holder, me: Holder) -> str:
    """Where to look when the holder is another step of this job on another node."""
    if other.host == me.host or not other.slurm_job_id or other.slurm_job_id != me.slurm_job_id:
        return ""
    return f"; another step of this job: squeue -s -j {other.slurm_job_id} lists those still running"
