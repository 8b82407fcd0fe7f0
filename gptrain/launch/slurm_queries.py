"""Every question put to Slurm about a launched job (squeue, then `scontrol show job` for finished jobs,
kept MinJobAge seconds, then sacct where accounting exists) and scancel; a controller that does not
answer is told apart from a job it has forgotten."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from gptrain.errors import LaunchError
from gptrain.launch.job_states import NO_ANSWER, NO_SLURM_HERE, JobState, from_slurm, summarize

# How long a Slurm command may take to answer; a controller that is down makes each call wait it out.
SLURM_TIMEOUT_S = 15.0

# What a Slurm command says when it gave up on its daemon (after its own retries, as slow as a timeout).
UNREACHABLE = re.compile(r"unable to contact|socket timed out|connection refused|persistent connection", re.I)

# The Slurm daemon each command asks: sacct asks slurmdbd, which only the controller feeds (with the
# controller down it says no more than the records do); the others ask the controller.
ASKS = {"squeue": "controller", "scontrol": "controller", "scancel": "controller", "sacct": "accounting"}

# Within one_slurm_look(): each daemon that gave no answer, with why; None outside it.
_silence: dict[str, str] | None = None


@contextmanager
def one_slurm_look() -> Iterator[dict[str, str]]:
    """One command's questions to Slurm (`gptrain status` over every job of every run): a daemon
    that gave no answer is not asked again, nor accounting once the controller gave none (each
    call would wait out its timeout, job by job: minutes for a few jobs with the controller down).
    Yields the daemons that gave no answer, with why, for the command to say once."""
    global _silence
    _silence = {}
    try:
        yield _silence
    finally:
        _silence = None


def run_command(command: list[str], timeout: float | None = None) -> subprocess.CompletedProcess | None:
    """The command's output, or None where it did not run, timed out, or (within one_slurm_look())
    asks a daemon that gave no answer earlier."""
    daemon = ASKS.get(command[0])
    if _silence and daemon and (daemon in _silence or "controller" in _silence):
        return None
    timeout = SLURM_TIMEOUT_S if timeout is None else timeout
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except OSError:
        return None
    except subprocess.TimeoutExpired:
        remember_silence(daemon, f"{command[0]} gave no answer in {timeout:g} s")
        return None
    if out.returncode != 0 and UNREACHABLE.search(out.stderr):
        remember_silence(daemon, f"{command[0]}: {out.stderr.strip().splitlines()[-1]}")
    return out


def remember_silence(daemon: str | None, why: str) -> None:
    if _silence is not None and daemon:
        _silence.setdefault(daemon, why)


def silence_note(silence: dict[str, str]) -> str | None:
    """The one line that says which of Slurm's daemons gave no answer, and where states came from then."""
    if not silence:
        return None
    whys = "; ".join(silence.values())
    return (
        f"note  Slurm did not answer ({whys}): not asked again by this command; the states of its"
        " jobs come from their logs and launcher records"
    )


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """`scontrol show job` output (one record per array task) -> key=value dicts."""
    jobs = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(re.findall(r"(\w+)=(\S*)", block))
        if fields:
            jobs.append(fields)
    return jobs


def asked_slurm_state(job_id: str) -> JobState:
    out = run_command(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r"])
    if out is not None and out.returncode == 0 and out.stdout.strip():
        listed = [line.split("|", 2) for line in out.stdout.strip().splitlines()]
        # squeue lists an array's live tasks only: one that failed already showed as RUNNING
        every = scontrol_states(job_id) if any("_" in task for task, *_ in listed) else None
        return summarize(every or [from_slurm(*rest) for _, *rest in listed])
    every = scontrol_states(job_id)
    if every:
        return summarize(every)
    silence = squeue_silence(out)
    accounted = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"])
    if accounted is not None and accounted.returncode == 0 and accounted.stdout.strip():
        lines = accounted.stdout.strip().splitlines()
        states = [JobState(*(line.split("|") + [""])[:2]) for line in lines]
        return summarize([JobState(s.state, "", s.reason) for s in states])
    if silence and not slurm_commands_here():
        return JobState("UNKNOWN", NO_SLURM_HERE)
    if silence:  # within one_slurm_look(), its note says why once
        return JobState("UNKNOWN", NO_ANSWER if _silence else f"{NO_ANSWER}: {silence}")
    return JobState("UNKNOWN", "no longer known to Slurm; no accounting to ask")


def squeue_tasks(job_ids: list[str]) -> tuple[dict[str, list[JobState]], str | None]:
    """Each listed job's tasks' states (one for a plain job) from one squeue call, and why squeue
    said nothing (None where it answered: a job it does not list is over)."""
    out = run_command(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r"])
    listed: dict[str, list[JobState]] = {}
    for line in out.stdout.splitlines() if out is not None and out.returncode == 0 else []:
        job, _, rest = line.strip().partition("|")
        listed.setdefault(job.split("_")[0], []).append(from_slurm(*rest.split("|", 1)))  # array tasks
    return listed, squeue_silence(out)


def slurm_commands_here() -> bool:
    """Whether this machine has Slurm's commands: without squeue (a run dir looked at from outside
    the cluster) its failing says nothing of the controller, and there is nothing here to ask."""
    return shutil.which("squeue") is not None


def squeue_silence(out: subprocess.CompletedProcess | None) -> str | None:
    """Why squeue said nothing of a job (it did not run or timed out, or could not reach the
    controller), or None where it answered: a job it does not list is one Slurm has forgotten."""
    if out is None:
        return "squeue did not run or gave no answer"
    if out.returncode == 0 or "invalid job id" in out.stderr.lower():
        return None
    return out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"squeue exited {out.returncode}"


def scontrol_states(job_id: str) -> list[JobState] | None:
    """Each task's state (one for a plain job) from `scontrol show job`, or None when it does not answer."""
    out = run_command(["scontrol", "show", "job", job_id])
    if out is None or out.returncode != 0 or "JobState=" not in out.stdout:
        return None
    records = parse_scontrol(out.stdout)
    return [from_slurm(r["JobState"], r.get("Reason", ""), r.get("ExitCode", "")) for r in records]


def jobs_waiting_on(job_id: str, besides: set[str]) -> list[str] | None:
    """Pending jobs (anyone's) whose dependency names `job_id`, other than `besides`; None when squeue
    does not answer. `%E` reads like 'afterok:10(unfulfilled),afterany:11_*(unfulfilled)'."""
    out = run_command(["squeue", "-h", "-t", "PENDING", "-o", "%i|%E"])
    if out is None or out.returncode != 0:
        return None
    found = []
    for line in out.stdout.splitlines():
        job, _, dependency = line.strip().partition("|")
        if job and job.split("_")[0] not in besides and job_id in re.findall(r":(\d+)", dependency):
            found.append(job)
    return found


# What scancel says of a job that ended (or left the controller's memory) before it was cancelled.
_ALREADY_ENDED = ("already completing or completed", "invalid job id")


def scancel(job_id: str) -> None:
    """Cancel a Slurm job; one that ended before the cancel reached it is not an error."""
    out = run_command(["scancel", job_id])
    if out is not None and out.returncode != 0 and any(t in out.stderr.lower() for t in _ALREADY_ENDED):
        return
    if out is None or out.returncode != 0:
        raise LaunchError(f"scancel {job_id} failed: {out.stderr.strip() if out else 'no scancel'}")
