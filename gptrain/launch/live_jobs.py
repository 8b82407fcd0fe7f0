"""A launch's look at the previous launch into its run directory: refused while a job of it may still
run, and its jobs that never start (pending on a failed stage) cancelled."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import yaml

from gptrain.errors import LaunchError
from gptrain.launch.job_states import NEVER_SATISFIED, JobState, summarize
from gptrain.launch.record_state import job_state
from gptrain.launch.records import read_records
from gptrain.launch.run_dirs import latest_jobs
from gptrain.launch.run_dirs import run_dirs as launched_runs
from gptrain.launch.slurm_queries import scancel, slurm_commands_here, squeue_tasks


def queued_jobs(run_dir: Path) -> list[tuple[dict[str, Any], JobState]]:
    """The jobs of the latest launch in this dir (those `gptrain cancel` acts on) that are queued or
    running. Slurm's are asked of squeue in one call: a job it does not list is over (sacct can
    keep a vanished job RUNNING). A squeue here that does not answer is an error: its jobs may run."""
    records = read_records(run_dir)
    latest = [r for r in latest_jobs(run_dir) if r.get("job_id")]
    queued = [(r, job_state(r, records)) for r in latest if r.get("executor") == "local"]
    slurm = {str(r["job_id"]): r for r in latest if r.get("executor") != "local"}
    if slurm:
        listed, silence = squeue_tasks(list(slurm))
        if silence and slurm_commands_here():  # no squeue at all: a run dir from another cluster
            raise LaunchError(
                f"{run_dir}: cannot tell whether Slurm job {', '.join(slurm)} of this run is still queued"
                f" or running ({silence}); launch again once Slurm answers"
            )
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


def blend_readers(blend: str, base: Path, own: list[Path]) -> list[str]:
    """A data preparation about to rewrite `blend` while a live training of another run under `base`
    reads it (its launcher.log says so, or, launched by an older gptrain, its script: refused, as it
    re-reads the blend at each requeue). One queued that has not started yet reads it at its start:
    refused, as that run would train on this launch's data. One that took its copy of the blend at its
    start (data_blend.frozen_prefixes) keeps its data through requeues: a note, as preparing the
    next dataset while a long run trains is a normal thing to do."""
    target, mine = os.path.realpath(blend), {d.resolve() for d in own}
    notes = []
    for run_dir in launched_runs(base):
        reads = [r for r in latest_jobs(run_dir) if r.get("stage") == "training" and read_blend_of(r)]
        if run_dir.resolve() in mine or not any(os.path.realpath(read_blend_of(r)) == target for r in reads):
            continue
        for record, state in live_jobs(run_dir):
            if record.get("stage") != "training":
                continue
            job = f"training job {record['job_id']} of {run_dir}"
            if not record.get("blend") and script_blend(record) == target:
                raise LaunchError(
                    f"data_preparation.blend.file={blend}: {job} ({state.describe()}) re-reads this blend at"
                    f" each start (its script {record['script']}, from an older gptrain, runs apply-blend"
                    " without --frozen): rewritten now, that run would train on this launch's data from its"
                    f" next requeue; wait for it to end, `gptrain cancel {shlex.quote(str(run_dir))}`, or"
                    " prepare into another data_dir (or data_preparation.blend.file)"
                )
            if not took_its_copy(record):
                raise LaunchError(
                    f"data_preparation.blend.file={blend}: {job} is {state.describe()} and reads this blend"
                    " when it starts: rewritten now, that run would train on this launch's data; wait until"
                    f" it has started, `gptrain cancel {shlex.quote(str(run_dir))}`, or prepare into another"
                    " data_dir (or data_preparation.blend.file)"
                )
            notes.append(
                f"{job} ({state.describe()}) reads {blend}, which this data preparation rewrites: it keeps"
                f" the copy it took at its start ({record['frozen_blend']}), and with it its data"
            )
    return notes


def read_blend_of(record: dict[str, Any]) -> str | None:
    """The blend a training job reads: its launcher.log record's, or (a job an older gptrain launched,
    whose record names none) the one its script's apply-blend line re-reads at each start."""
    return str(record["blend"]) if record.get("blend") else script_blend(record)


def script_blend(record: dict[str, Any]) -> str | None:
    """The real path of the blend a Slurm job's script applies without --frozen (so at each start, its
    requeues too), if any; a local run applies it once, as it starts."""
    if record.get("executor") == "local":
        return None
    try:
        text = Path(str(record.get("script"))).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        try:
            words = shlex.split(line) if "apply-blend" in line else []
        except ValueError:
            continue
        if "apply-blend" in words and "--frozen" not in words and "--blend" in words[:-1]:
            return os.path.realpath(words[words.index("--blend") + 1])
    return None


def took_its_copy(record: dict[str, Any]) -> bool:
    """Whether a training job's start copied the blend into its run dir (its requeues read the copy)."""
    try:
        copy = yaml.safe_load(Path(str(record.get("frozen_blend"))).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(copy, dict) and str(copy.get("job")) == str(record["job_id"])
