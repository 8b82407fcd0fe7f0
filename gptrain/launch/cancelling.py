"""`gptrain cancel`: a run's queued or running jobs, and the stages of the same launch in other run
directories that wait on them or that they waited on."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from gptrain.errors import LaunchError
from gptrain.launch.job_states import NEVER_SATISFIED, NO_SLURM_HERE
from gptrain.launch.record_state import job_state, slurm_state
from gptrain.launch.records import read_records
from gptrain.launch.run_dirs import latest_jobs
from gptrain.launch.slurm_queries import jobs_waiting_on, scancel


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
