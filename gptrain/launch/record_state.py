"""The state of a launcher.log record's job: a local one by its pid and recorded exit, a Slurm one by
asking Slurm (its log where Slurm has forgotten it), exits 75/76 explained."""

from __future__ import annotations

import os
from typing import Any

from gptrain.errors import EXIT_HUNG, EXIT_REQUEUE
from gptrain.launch.job_states import JobState
from gptrain.launch.log_endings import (
    EarlyStop,
    early_stop_of,
    ended_by_log,
    interval_exit_of,
    log_ending_text,
)
from gptrain.launch.records import process_start_time
from gptrain.launch.slurm_queries import asked_slurm_state

# Why a Slurm job that ended with a code the batch script requeues was not requeued, and what to do.
STOPPED_WITH_CHECKPOINT = {
    str(EXIT_REQUEUE): "checkpoint saved but not requeued: max_requeues reached or the requeue failed;"
    " launch again to resume",
    str(EXIT_HUNG): "a rank hung, see the log; not requeued: launch again to resume from the last checkpoint",
}


def explain_stop(state: JobState, record: dict[str, Any] | None = None) -> JobState:
    """A FAILED job with exit 75 or 76 stopped with a checkpoint to resume from: say so, as for local
    runs; a 75 for a stop during start-up (the record's log says) saved nothing: say that instead.
    A COMPLETED one that exited at trainer.exit_interval is not finished: say so."""
    if state.state == "COMPLETED" and (stop := interval_exit_of(record)):
        said = state.reason not in ("", "None", "(null)")  # Slurm's Reason=None says nothing
        return JobState(state.state, f"{state.reason}; {stop}" if said else stop, state.exit_code)
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


def ended_state(code: int, early: EarlyStop | None = None, interval_exit: str | None = None) -> JobState:
    """A local job's state from its exit code: 75 and 76 stopped with a checkpoint to resume from,
    except a 75 for a stop during start-up (`early`), which saved nothing; a 0 at
    trainer.exit_interval (`interval_exit`, what to say of it) is no finished run."""
    if code == 0:
        return JobState("COMPLETED", interval_exit or "")
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
            early = early_stop_of(record) if code == EXIT_REQUEUE else None
            return ended_state(code, early, interval_exit_of(record) if code == 0 else None)
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
