"""How a job's log says it ended: its batch script's last line, and the training's stop during start-up;
what `gptrain status` falls back on where Slurm no longer knows the job."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptrain.launch.job_states import JobState, summarize
from gptrain.launch.run_dirs import log_files, stderr_logs

# The training's line for a stop signal during start-up (gptrain.train.loop.stop_before_training),
# and for a stop that saved a checkpoint (stop_for_requeue); both exit 75.
STOPPED_EARLY = re.compile(
    r"stopping before the first step: (?P<why>.*?); nothing trained since "
    r"(?:no checkpoint|iteration (?P<step>\d+)'s checkpoint)"
)
STOPPED_SAVED = re.compile(r"stopping at iteration \d+: ")


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
# The line just before the exit line of a job Slurm requeued itself (a preemption): it runs again,
# appending to the same log after that exit line.
REQUEUED_BY_SLURM = "gptrain: Slurm requeued the job itself"
# How much of a log's end `ends_with_exit_line` reads: its last two lines, whatever the log's size.
TAIL_BYTES = 8192


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


def ended_for_good(record: dict[str, Any]) -> bool:
    """Whether the job's log (an array: every task's) ends as a job that is over ends: with its batch
    script's exit line, the last thing the job writes, not just after Slurm requeued it (a preempted
    job runs again). What `gptrain logs -f` goes by while Slurm does not answer."""
    logs = log_files(record)
    if not logs or len(logs) < int(record.get("array") or 1):
        return False
    return all(ends_with_exit_line(log) for log in logs)


def ends_with_exit_line(log: Path) -> bool:
    """Whether the batch script's lines (in the stderr file, where the job has one) end with its exit
    line and no requeue by Slurm before it; a requeued job's next attempt writes after it."""
    lines = last_lines(next((err for err in stderr_logs(log) if err.exists()), log), 2)
    if not lines or not STEP_FINISHED.match(lines[-1]):
        return False
    return len(lines) < 2 or REQUEUED_BY_SLURM not in lines[-2]


def last_lines(path: Path, count: int) -> list[str]:
    """The file's last `count` non-blank lines, from its last TAIL_BYTES only (a log can hold
    gigabytes, and `logs -f` asks every 0.5 s); [] for a file that cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - TAIL_BYTES))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in tail.splitlines() if line.strip()][-count:]
