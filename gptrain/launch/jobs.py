"""Job control for launched runs: status, cancel, logs, and a one-line progress summary.

A run is a directory with a `launcher.log` (see records.py). Slurm state comes from
`squeue`, then `scontrol show job` (finished jobs, kept MinJobAge seconds), then `sacct`
where accounting exists; local runs are checked by pid.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptrain.errors import EXIT_HUNG, EXIT_REQUEUE, LaunchError
from gptrain.launch.compose import STAGES, closest
from gptrain.launch.records import LAUNCHER_LOG, process_start_time, read_records
from gptrain.launch.stragglers import stragglers_for
from gptrain.utils.progress import format_duration

# the training process's first line (gptrain.train.loop): each requeue of a job prints it again;
# `srun --label` (cluster.srun_args, as the Megatron tutorial's srun -l) puts the task id before it
PROCESS_START = re.compile(r"^(?:\s*\d+: )?gptrain: [\d,]+ parameters \|")
ITERATION = re.compile(
    r"iteration\s+(?P<step>\d+)/\s*(?P<max>\d+) \|.*?"
    r"elapsed time per iteration \(ms\): (?P<ms>[\d.]+) \|(?:.*?lm loss: (?P<loss>[\d.Ee+-]+) \|)?"
)
# the training's own ETA at the end of its line (gptrain.train.meter): the wall-clock pace,
# validations and saves included, which the time per iteration leaves out
LINE_ETA = re.compile(r" ETA (?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d) \|\s*$")


# The training's line for a stop signal during start-up (gptrain.train.loop.stop_before_training),
# and for a stop that saved a checkpoint (stop_for_requeue); both exit 75.
STOPPED_EARLY = re.compile(
    r"stopping before the first step: (?P<why>.*?); nothing trained since "
    r"(?:no checkpoint|iteration (?P<step>\d+)'s checkpoint)"
)
STOPPED_SAVED = re.compile(r"stopping at iteration \d+: ")


# Slurm states of a job that may still run (or run again, after a requeue). squeue and scontrol name
# a state flag before the base state: a running job is SIGNALING while a SIGSTOP/SIGCONT is on its way
# (suspension, gang scheduling, a preemption's grace), a requeued one EXPEDITING (Slurm 25.11) or
# REQUEUE_HOLD/SPECIAL_EXIT/RESV_DEL_HOLD (held), a finished one STAGE_OUT until its burst buffer is out.
ACTIVE_STATES = (
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUE",
    "SUSPENDED",
    "RESIZING",
    "STOPPED",
    "SIGNALING",
    "EXPEDITING",
    "SPECIAL_EXIT",
    "RESV_DEL_HOLD",
    "STAGE_OUT",
)

# The reason of a job pending on a stage that failed (afterok): it stays PENDING and never starts.
NEVER_SATISFIED = "DependencyNeverSatisfied"

# The reason of a job whose state Slurm could not be asked for (controller down, squeue timed out).
NO_ANSWER = "Slurm did not answer"

# The reason of a Slurm job looked at from a machine without Slurm's commands (a run dir seen from
# outside the cluster): nothing here can ask about it or cancel it.
NO_SLURM_HERE = "no Slurm commands on this machine: run gptrain status/cancel on the cluster"


@dataclass
class JobState:
    state: str
    reason: str = ""
    exit_code: str = ""

    @property
    def active(self) -> bool:
        """Queued or running (for an array: any task still is)."""
        return any(word in self.state for word in ACTIVE_STATES)

    @property
    def may_run(self) -> bool:
        """Active and able to start, or perhaps so (Slurm did not answer: `gptrain logs -f` keeps
        following). A job pending on a failed stage stays PENDING for ever, so nothing (a
        relaunch, `gptrain logs -f`) should wait for it."""
        return (self.active and self.reason != NEVER_SATISFIED) or self.unanswered

    @property
    def unanswered(self) -> bool:
        """Slurm could not be asked: the job may still be queued or running."""
        return self.state == "UNKNOWN" and self.reason.startswith(NO_ANSWER)

    @property
    def slurm_absent(self) -> bool:
        """Slurm's commands are not on this machine: nothing here can ask about the job or cancel it."""
        return self.state == "UNKNOWN" and self.reason.startswith(NO_SLURM_HERE)

    def describe(self) -> str:
        text = self.state
        if self.reason and self.reason not in ("None", "(null)"):
            text += f" ({self.reason})"
        if self.exit_code and self.exit_code not in ("0:0", "0"):
            text += f" exit {self.exit_code}"
        return text


@dataclass
class EarlyStop:
    """A training that exited 75 for a stop signal during its start-up: it saved nothing."""

    why: str  # 'received SIGUSR1'
    step: int | None  # the checkpoint it had loaded; None: there is none, the next start is a fresh one

    def describe(self) -> str:
        if self.step is None:
            return f"{self.why} during start-up: stopped before step 1, no checkpoint exists"
        return (
            f"{self.why} during start-up: nothing trained or saved since iteration {self.step}'s checkpoint"
        )

    @property
    def then(self) -> str:
        """What a relaunch (or a requeue) does."""
        return "start it afresh" if self.step is None else f"resume from iteration {self.step}"


def early_stop(log: Path) -> EarlyStop | None:
    """The log's last stop, when it came before the first step (a requeue appends to the same log:
    an earlier attempt's stop is superseded by a later one's)."""
    found = None
    try:
        with open(log, errors="replace") as handle:
            for line in handle:
                if "stopping " not in line:
                    continue
                match = STOPPED_EARLY.search(line)
                if match:
                    step = int(match["step"]) if match["step"] else None
                    found = EarlyStop(match["why"], step)
                elif STOPPED_SAVED.search(line):
                    found = None
    except OSError:
        return None
    return found


def early_stop_of(record: dict[str, Any] | None) -> EarlyStop | None:
    """The early stop in a training record's log, if that is how it last stopped."""
    if not record or record.get("stage") != "training":
        return None
    logs = log_files(record)
    return early_stop(logs[-1]) if logs else None


def run_dirs(base: Path) -> list[Path]:
    """Every directory under `base` holding a launcher.log (unique_output runs are nested)."""
    if not base.is_dir():
        return []
    return sorted(p.parent for p in base.glob(f"**/{LAUNCHER_LOG}"))


def find_run(run: str, base: Path) -> Path:
    """A run given as a directory or a run name under `base` (newest timestamped dir if nested)."""
    for candidate in (Path(run), base / run):
        if (candidate / LAUNCHER_LOG).is_file():
            return candidate
        nested = run_dirs(candidate) if candidate.is_dir() else []
        if nested:
            return max(nested, key=lambda p: (p / LAUNCHER_LOG).stat().st_mtime)
    given = Path(run)
    names = sorted({str(p.relative_to(base)).split("/")[0] for p in run_dirs(base)})
    if given.is_file() or (given.is_dir() and given.resolve() != base.resolve()):
        nearby = closest(run, names) if names else ""  # a run name that is also a path here
        also = f"; of the runs in {base}{nearby}" if nearby.startswith(" (did you mean") else ""
        raise LaunchError(f"{run}: {not_launched(given)}{also}")
    raise LaunchError(
        f"no launched run '{run}' in {base}{closest(run, names)}; pass a run dir or --results-dir"
    )


def not_launched(path: Path) -> str:
    """Why `path`, which exists, is no launched run: status, logs and cancel follow `gptrain launch`'s
    runs (its launcher.log); a `gptrain train` run's own log is where to look instead."""
    if path.is_file():
        return f"not a run directory; pass the directory `gptrain launch` wrote ({LAUNCHER_LOG} in it)"
    from gptrain.train.results import log_file_name  # torch-free

    train_log = log_file_name(0, 0)  # rank 0's log of a `gptrain train` run
    logs = [d / train_log for d in (path, path / "results") if (d / train_log).is_file()]
    where = f"; its training log is {logs[0]}" if logs else ""
    return (
        f"no {LAUNCHER_LOG} here or below: not a run started by `gptrain launch` (status, logs and "
        f"cancel follow those){where}"
    )


def run_command(command: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """`scontrol show job` output (one record per array task) -> key=value dicts."""
    jobs = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(re.findall(r"(\w+)=(\S*)", block))
        if fields:
            jobs.append(fields)
    return jobs


def summarize(states: list[JobState]) -> JobState:
    if len(states) == 1:
        return states[0]
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    text = ", ".join(f"{n} {state}" for state, n in counts.items())
    failed = [s for s in states if s.state not in ("COMPLETED", "RUNNING", "PENDING")]
    return JobState(
        f"ARRAY[{text}]", failed[0].reason if failed else "", failed[0].exit_code if failed else ""
    )


# Why a Slurm job that ended with a code the batch script requeues was not requeued, and what to do.
STOPPED_WITH_CHECKPOINT = {
    str(EXIT_REQUEUE): "checkpoint saved but not requeued: max_requeues reached or the requeue failed;"
    " launch again to resume",
    str(EXIT_HUNG): "a rank hung, see the log; not requeued: launch again to resume from the last checkpoint",
}


def explain_stop(state: JobState, record: dict[str, Any] | None = None) -> JobState:
    """A FAILED job with exit 75 or 76 stopped with a checkpoint to resume from: say so, as for local
    runs; a 75 for a stop during start-up (the record's log says) saved nothing: say that instead."""
    code = state.exit_code.split(":")[0]
    why = STOPPED_WITH_CHECKPOINT.get(code) if state.state == "FAILED" else None
    early = early_stop_of(record) if why and code == str(EXIT_REQUEUE) else None
    if early:
        why = f"{early.describe()}; not requeued: max_requeues reached or the requeue failed; launch again to {early.then}"
    return JobState(state.state, why, state.exit_code) if why else state


def slurm_state(job_id: str, stage: str | None = None, record: dict[str, Any] | None = None) -> JobState:
    """The job's state; a training's exit 75/76 explained (another stage's 75 is EX_TEMPFAIL's). A
    job Slurm has forgotten (past MinJobAge, without accounting) ended as its log says."""
    state = asked_slurm_state(job_id)
    if record and (state.unanswered or state.slurm_absent):
        state = with_log_ending(state, record)
    elif state.state == "UNKNOWN" and record:
        state = ended_by_log(record) or state
    return explain_stop(state, record) if stage == "training" else state


def with_log_ending(state: JobState, record: dict[str, Any]) -> JobState:
    """A job Slurm did not answer about (or could not be asked about here), with how its log says the
    last attempt ended beside it: the log does not settle the state, as a job preempted and requeued
    is queued again after its exit line."""
    ended = ended_by_log(record)
    return JobState(state.state, f"{state.reason}; {log_ending_text(ended)}") if ended else state


def log_ending_text(ended: JobState) -> str:
    """'its log's last attempt ended with exit code 75', from `ended_by_log`'s state."""
    if ended.state.startswith("ARRAY["):
        return f"its tasks' logs say their last attempts ended: {ended.state[len('ARRAY[') : -1]}"
    if ended.state == "CANCELLED":
        return "its log's last attempt was cancelled"
    return f"its log's last attempt ended with exit code {ended.exit_code.split(':')[0]}"


# Each stage's batch script's last lines (sbatch.REQUEUE_LINES, FINISH_LINES): the job's end as it saw it.
STEP_FINISHED = re.compile(r"gptrain: step finished with exit code (\d+)")
CANCEL_SEEN = "gptrain: the job was cancelled (scancel)"
FORGOTTEN = "Slurm no longer knows the job; from its log"


def ended_by_log(record: dict[str, Any]) -> JobState | None:
    """How a job ended by its batch script's last line (an array: each task's log), or None where a
    log has no such line (still running when Slurm was asked, or killed before it) or a task's log
    is missing."""
    logs = log_files(record)
    if not logs or len(logs) < int(record.get("array") or 1):
        return None
    states = [log_ending(log) for log in logs]
    if None in states:
        return None
    state = summarize(states)
    return state if state.reason else JobState(state.state, FORGOTTEN, state.exit_code)


def log_ending(log: Path) -> JobState | None:
    """The end one batch script's log records (its stderr file, where it has one), or None. A
    requeue appends to the same log and prints no such line: only the job's last attempt does."""
    code, cancelled = None, False
    try:
        for path in (log, *(err for err in stderr_logs(log) if err.exists())):
            with open(path, errors="replace") as handle:
                for line in handle:
                    if "gptrain: " not in line:
                        continue
                    cancelled = cancelled or CANCEL_SEEN in line
                    found = STEP_FINISHED.search(line)
                    if found:
                        code = int(found.group(1))
    except OSError:
        return None
    if code is None:
        return None
    if cancelled:
        return JobState("CANCELLED", f"{FORGOTTEN}: cancelled, launch again to resume", f"{code}:0")
    return JobState("COMPLETED" if code == 0 else "FAILED", FORGOTTEN, f"{code}:0")


def asked_slurm_state(job_id: str) -> JobState:
    out = run_command(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r"])
    if out is not None and out.returncode == 0 and out.stdout.strip():
        listed = [line.split("|", 2) for line in out.stdout.strip().splitlines()]
        # squeue lists an array's live tasks only: one that failed already showed as RUNNING
        every = scontrol_states(job_id) if any("_" in task for task, *_ in listed) else None
        return summarize(every or [JobState(*rest) for _, *rest in listed])
    every = scontrol_states(job_id)
    if every:
        return summarize(every)
    silence = squeue_silence(out)
    accounted = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"])
    if accounted is not None and accounted.returncode == 0 and accounted.stdout.strip():
        lines = accounted.stdout.strip().splitlines()
        states = [JobState(*(line.split("|") + [""])[:2]) for line in lines]
        return summarize([JobState(s.state, "", s.reason) for s in states])
    if silence:
        return JobState("UNKNOWN", f"{NO_ANSWER}: {silence}" if slurm_commands_here() else NO_SLURM_HERE)
    return JobState("UNKNOWN", "no longer known to Slurm; no accounting to ask")


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
    return [JobState(r["JobState"], r.get("Reason", ""), r.get("ExitCode", "")) for r in records]


def ended_state(code: int, early: EarlyStop | None = None) -> JobState:
    """A local job's state from its exit code: 75 and 76 stopped with a checkpoint to resume from,
    except a 75 for a stop during start-up (`early`), which saved nothing."""
    if code == 0:
        return JobState("COMPLETED")
    if code == EXIT_REQUEUE and early:
        return JobState("INTERRUPTED", f"{early.describe()}; launch the same command again to {early.then}")
    if code == EXIT_REQUEUE:
        return JobState("INTERRUPTED", "checkpoint saved; launch the same command again to resume")
    if code == EXIT_HUNG:
        return JobState("HUNG", "a rank hung, see the log; launch again to resume from the last checkpoint")
    if code == 130:  # Ctrl-C (python -m gptrain.parallel.torchrun ends so)
        return JobState("CANCELLED", "stopped by Ctrl-C; launch again to resume from the last checkpoint")
    return JobState("FAILED", exit_code=str(code))


def local_state(record: dict[str, Any], records: list[dict[str, Any]]) -> JobState:
    for other in records:
        if other.get("event") == "finished" and other.get("job_id") == record["job_id"]:
            code = int(other.get("exit_code", 1))
            return ended_state(code, early_stop_of(record) if code == EXIT_REQUEUE else None)
    gone = JobState("UNKNOWN", "process gone without a recorded exit")
    try:
        pid = int(record["pid"])
        if pid <= 0:  # never signal a process group by accident
            raise ValueError(pid)
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError):
        return gone
    except PermissionError:
        pass
    # Records of older launches have no start time: their pid is trusted as before.
    if "start_time" in record and process_start_time(pid) != record["start_time"]:
        return JobState("UNKNOWN", f"process gone without a recorded exit (pid {pid} is another process now)")
    return JobState("RUNNING")


def job_state(record: dict[str, Any], records: list[dict[str, Any]]) -> JobState:
    if record.get("executor") == "local":
        return local_state(record, records)
    return slurm_state(str(record["job_id"]), record.get("stage"), record)


def queued_jobs(run_dir: Path) -> list[tuple[dict[str, Any], JobState]]:
    """The jobs of the latest launch in this dir (those `gptrain cancel` acts on) that are queued or
    running. Slurm's are asked of squeue in one call: a job it does not list is over (sacct can
    keep a vanished job RUNNING). A squeue here that does not answer is an error: its jobs may run."""
    records = read_records(run_dir)
    latest = [r for r in latest_jobs(run_dir) if r.get("job_id")]
    queued = [(r, job_state(r, records)) for r in latest if r.get("executor") == "local"]
    slurm = {str(r["job_id"]): r for r in latest if r.get("executor") != "local"}
    if slurm:
        out = run_command(["squeue", "-h", "-j", ",".join(slurm), "-o", "%i|%T|%r"])
        silence = squeue_silence(out)
        if silence and slurm_commands_here():  # no squeue at all: a run dir from another cluster
            raise LaunchError(
                f"{run_dir}: cannot tell whether Slurm job {', '.join(slurm)} of this run is still queued"
                f" or running ({silence}); launch again once Slurm answers"
            )
        listed: dict[str, list[JobState]] = {}
        for line in out.stdout.splitlines() if out is not None and out.returncode == 0 else []:
            job, _, rest = line.strip().partition("|")
            listed.setdefault(job.split("_")[0], []).append(JobState(*rest.split("|", 1)))  # array tasks
        queued += [(slurm[job], summarize(states)) for job, states in listed.items() if job in slurm]
    return [(r, state) for r, state in queued if state.active]


def live_jobs(run_dir: Path) -> list[tuple[dict[str, Any], JobState]]:
    """The queued jobs of the latest launch that may still run: one pending on a failed stage
    (DependencyNeverSatisfied) never runs, so it does not hold the run."""
    return [(r, state) for r, state in queued_jobs(run_dir) if state.may_run]


def cancel_never_starting(run_dirs: list[Path], dry_run: bool = False) -> list[str]:
    """A relaunch supersedes the latest launch's jobs that wait on a failed stage: they would stay
    PENDING for ever, and `gptrain status`/`cancel` then see only the new launch. Cancel them."""
    lines = []
    for run_dir in run_dirs:
        for record, state in queued_jobs(run_dir):
            if state.reason != NEVER_SATISFIED or record.get("executor") == "local":
                continue
            if not dry_run:
                scancel(str(record["job_id"]))
            lines.append(
                f"{'would cancel' if dry_run else 'cancelled'} {record.get('stage')} job {record['job_id']}"
                f" of the previous launch: it waited on job {record.get('dependency')}, which failed"
            )
    return lines


def refuse_launch_into_live_run(run_dirs: list[Path]) -> None:
    """A launch rewrites the run's config and scripts, which a live job re-reads at its requeue
    (and `status`/`cancel` would then see only the new launch): refuse while one is queued or runs."""
    for run_dir in run_dirs:
        live = live_jobs(run_dir)
        if live:
            record, state = live[-1]
            raise LaunchError(
                f"{run_dir}: job {record['job_id']} ({record.get('stage', '?')}) of this run is "
                f"{state.describe()}; wait for it, `gptrain cancel {shlex.quote(str(run_dir))}`, or launch under another "
                "training.run.name"
            )


def latest_jobs(run_dir: Path) -> list[dict[str, Any]]:
    """The submitted records of the latest launch in this dir (one per stage)."""
    records = [r for r in read_records(run_dir) if r.get("event") == "submitted"]
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        latest[record.get("stage", "?")] = record
    return list(latest.values())


def launches(run_dir: Path) -> list[list[dict[str, Any]]]:
    """The submitted records of each launch into this dir, oldest first: `gptrain logs --launch N`
    counts them from 1. Separate launches have separate jobs (a Slurm requeue keeps its job id and
    log), so a record joins the launch before it only when it ran after one of its jobs."""
    found: list[list[dict[str, Any]]] = []
    for record in read_records(run_dir):
        if record.get("event") != "submitted":
            continue
        if found and ran_after(record, found[-1]):
            found[-1].append(record)
        else:
            found.append([record])
    return found


def ran_after(record: dict[str, Any], launch: list[dict[str, Any]]) -> bool:
    """Whether a stage's record belongs to `launch`: its `dependency` is a job of it. Local
    records written before they named one join when their stage comes later in stage order."""
    if "dependency" in record:
        after = record["dependency"]
        return after is not None and str(after) in {str(r.get("job_id")) for r in launch}

    def order(r: dict[str, Any]) -> int:
        return STAGES.index(r["stage"]) if r.get("stage") in STAGES else len(STAGES)

    return order(record) > order(launch[-1])


def launch_number(found: list[list[dict[str, Any]]], number: int, run_dir: Path) -> list[dict[str, Any]]:
    """Launch `number` (1 the first, -1 the latest), or a one-line error naming the valid range."""
    total = len(found)
    if not total:
        raise LaunchError(f"--launch {number}: nothing launched yet in {run_dir}")
    if number == 0 or not -total <= number <= total:
        raise LaunchError(
            f"--launch {number}: {run_dir} has {total} launch{'es' if total > 1 else ''};"
            f" pass 1..{total} (1 the first) or -{total}..-1 (-1 the latest)"
        )
    return found[number - 1 if number > 0 else number]


def launch_header(number: int, total: int, records: list[dict[str, Any]]) -> str:
    """'==> launch 2 of 3, 2026-11-26T10:00:00: training job 1234 <==' (the launch's first record time)."""
    stages = ", ".join(f"{r.get('stage')} job {r.get('job_id')}" for r in records)
    return f"==> launch {number} of {total}, {records[0].get('time', '?')}: {stages} <=="


def logs_to_show(
    run_dir: Path, number: int | None = None, every: bool = False, stage: str | None = None
) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """What `gptrain logs` prints, as (header line or None, records): by default the latest job of
    each stage, else launch `number`, or with `every` each launch under its header."""

    def kept(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if stage in (None, r.get("stage"))]

    chosen: list[tuple[str | None, list[dict[str, Any]]]]
    if every:
        found = launches(run_dir)
        if not found:
            raise LaunchError(nothing_launched(run_dir))
        shown = [(n, kept(records)) for n, records in enumerate(found, 1)]
        chosen = [(launch_header(n, len(found), records), records) for n, records in shown if records]
    elif number is None:
        latest = latest_jobs(run_dir)
        if not latest:
            raise LaunchError(nothing_launched(run_dir))
        chosen = [(None, kept(latest))]
    else:  # launch_number refuses a run dir with no launch itself
        chosen = [(None, kept(launch_number(launches(run_dir), number, run_dir)))]
    if stage and not any(records for _, records in chosen):
        raise LaunchError(missing_stage(run_dir, stage, number))
    return chosen


def nothing_launched(run_dir: Path) -> str:
    """Why `gptrain logs` has no log to show (a launch that stopped before it submitted a job):
    said, where printing nothing read as an empty log."""
    return f"{run_dir}: nothing launched yet ({LAUNCHER_LOG} records no job), so there is no log to show"


def missing_stage(run_dir: Path, stage: str, number: int | None) -> str:
    """The line for `--stage S` where the launches asked for have no such job: a data preparation
    runs in a run dir of its own, which the stage of its launch that waited on it names."""
    where = f"launch {number} of {run_dir}" if number is not None else str(run_dir)
    upstream = [
        str(r["dependency_dir"])
        for r in read_records(run_dir)
        if r.get("event") == "submitted" and r.get("dependency_dir")
    ]
    elsewhere = (
        f"; this run's data preparation ran in {upstream[-1]}: gptrain logs {shlex.quote(upstream[-1])}"
        if upstream and stage == "data_preparation"
        else ""
    )
    return f"--stage {stage}: no {stage} job in {where}{elsewhere}"


def log_files(record: dict[str, Any]) -> list[Path]:
    """The log files of a record; only the job-id slot at the end of a Slurm pattern is filled in
    (a run named `run%j` keeps its name)."""
    pattern = Path(str(record.get("log", "")))
    job_id = str(record.get("job_id", ""))
    if record.get("executor") == "local":
        return [pattern]
    head, array, tail = pattern.name.rpartition("%A_%a")
    if array:  # in task order: _2 before _10
        prefix = f"{head}{job_id}_"
        found = pattern.parent.glob(f"{glob.escape(prefix)}*{glob.escape(tail)}")
        return sorted(found, key=lambda path: task_order(path.name[len(prefix) : len(path.name) - len(tail)]))
    head, slot, tail = pattern.name.rpartition("%j")
    return [pattern.parent / (f"{head}{job_id}{tail}" if slot else pattern.name)]


def log_header(record: dict[str, Any], path: Path) -> str:
    """'==> training job 1234: <path> <==', the line `gptrain logs` prints before each of several logs
    (as `tail` does); an array task's job as Slurm writes it: 1234_5."""
    job = str(record.get("job_id", "?"))
    head, array, _ = Path(str(record.get("log", ""))).name.rpartition("%A_%a")
    if array and path.stem.startswith(f"{head}{job}_"):
        job = path.stem[len(head) :]
    return f"==> {record.get('stage', '?')} job {job}: {path} <=="


def stderr_logs(log: Path) -> list[Path]:
    """Where the job's stderr goes with cluster.stderr_to_stdout=false: log-<job>_<id>.err beside its
    .out (the batch script's own lines, a traceback, the training's one-line error); [] for a log
    that is no .out."""
    return [log.with_suffix(".err")] if log.suffix == ".out" else []


def output_files(record: dict[str, Any]) -> list[Path]:
    """Every file a record's job writes its output to: each log, then its stderr file (which exists
    only with cluster.stderr_to_stdout=false)."""
    return [path for log in log_files(record) for path in (log, *stderr_logs(log))]


def task_order(index: str) -> tuple[int, str]:
    """An array task's log sorted by its task id as a number (anything else after them)."""
    return (int(index), "") if index.isdigit() else (1 << 62, index)


def progress(log: Path, now: float | None = None, running: bool = True) -> str | None:
    """'step 120/1000 | loss 3.21 | 812 ms/step | ETA 00:11:54' from the last iteration line."""
    match, lines, last = None, 0, ""
    try:
        with open(log, errors="replace") as handle:
            for line in handle:
                found = ITERATION.search(line)
                if found:
                    match, lines, last = found, lines + 1, line
                elif PROCESS_START.match(line):  # a process (re)starts: a requeue appends to the same log
                    lines = 0
    except OSError:
        return None
    if match is None:
        return None
    step, total, ms = int(match["step"]), int(match["max"]), float(match["ms"])
    parts = [f"step {step}/{total}"]
    if match["loss"]:
        parts.append(f"loss {float(match['loss']):.4f}")
    parts.append(f"{ms:.0f} ms/step")
    if running and lines > 1:  # a process's first line is its first step alone (compilation): no ETA from it
        own = LINE_ETA.search(last)
        eta = 3600 * int(own["h"]) + 60 * int(own["m"]) + int(own["s"]) if own else (total - step) * ms / 1000
        parts.append(f"ETA {format_duration(max(0, eta))}")
    return " | ".join(parts)


def status_lines(run_dir: Path) -> list[str]:
    records = read_records(run_dir)
    lines = []
    for record in latest_jobs(run_dir):
        state = job_state(record, records)
        line = f"{run_dir.name}  {record.get('stage')}  job {record.get('job_id')}  {state.describe()}"
        if state.reason == NEVER_SATISFIED:
            line += f": the stage it waits for (job {record.get('dependency')}) failed; gptrain cancel it"
        logs = log_files(record)
        summary = (
            progress(logs[-1], running=state.active) if logs and record.get("stage") == "training" else None
        )
        if summary:
            line += f"  | {summary}"
        lines.append(line)
        if record.get("stage") == "training":
            lines += [f"  {text}" for text in [stragglers_for(record)] if text]
    return lines or [f"{run_dir.name}  nothing launched yet"]


def cancel(run_dir: Path) -> list[str]:
    """Cancel every stage of the run that may still be queued or running, and the stages of the
    same launch in other run dirs that wait for them (a training after this data preparation)."""
    lines, cancelled = [], set()
    records = read_records(run_dir)
    latest = latest_jobs(run_dir)
    for record in latest:
        state = job_state(record, records)
        if state.slurm_absent:
            raise LaunchError(f"{run_dir}: {NO_SLURM_HERE}")
        if not (state.active or state.unanswered):  # unanswered: scancel says why it cannot either
            continue
        if record.get("executor") == "local":
            try:
                os.kill(int(record["pid"]), signal.SIGTERM)
            except ProcessLookupError:  # it ended between the state check and the signal
                lines.append(f"{record.get('stage')} job {record.get('job_id')} had already ended")
                continue
        else:
            scancel(str(record["job_id"]))
            cancelled.add(str(record["job_id"]))
        lines.append(f"cancelled {record.get('stage')} job {record.get('job_id')}")
    lines += cancel_waiting_stages(run_dir, {str(r.get("job_id")) for r in latest}, cancelled)
    lines += cancel_stage_waited_on(latest, cancelled)
    return lines or ["nothing to cancel"]


def cancel_stage_waited_on(latest: list[dict[str, Any]], cancelled: set[str]) -> list[str]:
    """The stage of the same launch in another run dir that a job cancelled here waited on (the data
    preparation, `dependency_dir`), still queued or running, would go on for hours for a training
    that no longer comes: cancel it too, unless some other pending job still waits on it."""
    lines = []
    for record in latest:
        after, where = str(record.get("dependency")), record.get("dependency_dir")
        if str(record.get("job_id")) not in cancelled or not where or after in cancelled:
            continue
        upstream = next(
            (
                r
                for r in read_records(Path(where))
                if r.get("event") == "submitted" and str(r.get("job_id")) == after
            ),
            None,
        )
        state = slurm_state(after) if upstream else None
        if upstream is None or state is None or not state.active:
            continue
        what = f"{upstream.get('stage')} job {after} of {where}"
        others = jobs_waiting_on(after, cancelled)
        if others is None:
            lines.append(f"left {what} {state.describe()}: squeue did not say which jobs wait on it")
        elif others:
            lines.append(f"left {what} {state.describe()}: job {', '.join(others)} waits on it too")
        else:
            scancel(after)
            cancelled.add(after)
            lines.append(f"cancelled {what}, which no other job waited on")
    return lines


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


def waiting_stages(run_dir: Path, job_ids: set[str]) -> list[tuple[Path, dict[str, Any]]]:
    """The Slurm jobs submitted into other run dirs after one of `job_ids` (the `waited_on_by` notes
    a launch leaves here), and those after them there, in submission order."""
    found = []
    for note in read_records(run_dir):
        if note.get("event") != "waited_on_by" or str(note.get("after")) not in job_ids:
            continue
        chain, other = {str(note.get("after"))}, Path(str(note.get("waiting_dir")))
        for record in read_records(other):
            if record.get("event") == "submitted" and str(record.get("dependency")) in chain:
                chain.add(str(record.get("job_id")))
                found.append((other, record))
    return found


def cancel_waiting_stages(run_dir: Path, job_ids: set[str], cancelled: set[str]) -> list[str]:
    """A stage pending on a job cancelled here, or on one that failed, would stay PENDING for ever
    (DependencyNeverSatisfied), out of sight of `gptrain cancel` of this run: cancel it too. One
    already running, or waiting on a job that completed, is another run's business: left alone."""
    lines = []
    for other, record in waiting_stages(run_dir, job_ids):
        job_id, state = str(record["job_id"]), slurm_state(str(record["job_id"]), record.get("stage"))
        waits_on_cancelled = str(record.get("dependency")) in cancelled
        if state.state == "PENDING" and (waits_on_cancelled or state.reason == NEVER_SATISFIED):
            scancel(job_id)
            cancelled.add(job_id)
            lines.append(f"cancelled {record.get('stage')} job {job_id} of {other}, which waited on it")
    return lines


# While Slurm does not answer, `follow` asks it again after twice as many quiet reads each time,
# up to this many (30 s at the default 0.5 s): a controller that is down is not asked (squeue,
# scontrol, sacct) every half second for as long as the user follows; the log is still read.
MAX_QUIET_READS_BETWEEN_ASKS = 60
SLURM_SILENT = "gptrain: Slurm did not answer: still following; Ctrl-C to stop"
SLURM_BACK = "gptrain: Slurm answers again"


def follow(
    paths: Callable[[], list[Path]],
    is_done: Callable[[], bool | None],
    poll: float = 0.5,
    header: Callable[[Path], str] | None = None,
) -> None:
    """Print new lines of the files `paths()` names (array tasks appear late) until `is_done()`;
    with several files, `header(path)`'s line before text from a file other than the last one's.
    `is_done()` is True once the jobs ended, False while they may run, None when Slurm did not
    answer (they may run: following goes on, asking less and less often, and says so on stderr).

    The job's state (a squeue per job) is asked only when a read found nothing new, so a chatty
    log does not poll the controller in a loop; once it says done, one more read prints what the
    job wrote just before it ended."""
    followed = _Followed(header=header)
    finished, silent = False, False
    reads_between_asks, quiet_reads = 1, 0
    while True:
        if _print_new_text(paths(), followed):
            continue
        if finished:
            return
        quiet_reads += 1
        if quiet_reads >= reads_between_asks:
            done, quiet_reads = is_done(), 0
            finished = bool(done)
            if (done is None) != silent:
                silent = done is None
                print(SLURM_SILENT if silent else SLURM_BACK, file=sys.stderr, flush=True)
            reads_between_asks = min(2 * reads_between_asks, MAX_QUIET_READS_BETWEEN_ASKS) if silent else 1
        if not finished:
            time.sleep(poll)


@dataclass
class _Followed:
    """Where `follow` is: the offset reached in each file, and the file and character it printed last."""

    header: Callable[[Path], str] | None = None
    offsets: dict[Path, int] = field(default_factory=dict)
    last_path: Path | None = None
    last_char: str = ""


def _print_new_text(paths: list[Path], followed: _Followed) -> bool:
    """Print what each file gained since its offset; whether any did."""
    grew = False
    existing = [path for path in paths if path.exists()]  # a .err stderr_to_stdout never writes is none
    for path in existing:
        offset = followed.offsets.get(path, 0)
        if path.stat().st_size <= offset:
            continue
        switched = path != followed.last_path and (followed.last_path is not None or len(existing) > 1)
        if followed.header and switched:
            newline = "\n" if followed.last_char not in ("", "\n") else ""
            sys.stdout.write(f"{newline}{followed.header(path)}\n")
        followed.offsets[path], last = print_text(path, offset)
        if last:
            followed.last_path, followed.last_char = path, last
            grew = True
    return grew


# How much of a log `gptrain logs` holds at once: a job of many ranks (NCCL_DEBUG=INFO, a warning
# per rank per step) writes gigabytes, more memory than a login node gives one command.
PRINT_CHUNK = 1 << 20


def print_text(path: Path, offset: int = 0) -> tuple[int, str]:
    """Print the file from `offset` on, a piece at a time; return the offset reached and the last
    character printed ('' where there was nothing new)."""
    last = ""
    with open(path, errors="replace") as handle:
        handle.seek(offset)
        for piece in iter(lambda: handle.read(PRINT_CHUNK), ""):
            sys.stdout.write(piece)
            last = piece[-1]
        sys.stdout.flush()
        return handle.tell(), last
