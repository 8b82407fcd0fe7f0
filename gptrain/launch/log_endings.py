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
