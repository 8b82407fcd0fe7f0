"""`gptrain plan --measure --cluster-type slurm`: each trial as a Slurm job, through the launcher.

The job is the launcher's training stage (gptrain.launch.sbatch.render_slurm: quoted #SBATCH
lines from the cluster profile, one srun task per GPU or CPU process, rank variables, the
rendezvous), submitted by its executor (`sbatch --parsable`), recorded in the trial directory's
launcher.log (so `gptrain status/logs/cancel DIR` work on a trial) and followed with the
launcher's job-state query (squeue, then scontrol, then sacct) until it ends. Trials run one
after another, so that no two share nodes while they are timed. Each rank writes its JSON
result into the shared trial directory (gptrain.plan.trial).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gptrain.config.nemo_launcher import slurm_launcher_keys
from gptrain.config.yamlio import load_file
from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.cluster_profiles import cluster_profile_path
from gptrain.launch.executors.slurm import check_sbatch_reads_exclusive, record_submission, sbatch
from gptrain.launch.gres import gres_gpus, gres_with_gpus
from gptrain.launch.job_states import JobState
from gptrain.launch.preflight import check_cluster, query_nodes
from gptrain.launch.record_state import slurm_state
from gptrain.launch.sbatch import Job, render_slurm
from gptrain.launch.script_values import check_value
from gptrain.launch.sections import check_cluster_section
from gptrain.launch.slurm_queries import run_command
from gptrain.launch.stages import rank_cpus
from gptrain.plan.measure import read_results, trial_args, trial_env, write_trial_config
from gptrain.plan.rank import Candidate
from gptrain.plan.report import Plan
from gptrain.utils.atomic import atomic_write_text

POLL_S = 0.5


def slurm_profile(name: str | None) -> dict[str, Any]:
    """The cluster profile's Slurm keys (partition, account, gres, srun_args, env_vars, ...)."""
    if name is None:
        return {}
    path = cluster_profile_path(name, "--cluster")
    data = load_file(path) or {}  # as build_cluster read it (libyaml where PyYAML has it)
    if not isinstance(data, dict):
        raise ConfigError(f"--cluster {name}: {path} must be a mapping of cluster keys")
    try:  # as `gptrain launch` checks a cluster file: the trial scripts are rendered from it
        slurm_launcher_keys(data)  # NeMo's num_gpus, setup, array, heterogeneous
        check_value("cluster", data)
        check_cluster_section(data)
    except ConfigError as error:
        raise ConfigError(f"--cluster {name}: {error}") from None
    return data


def trial_profile(profile: dict[str, Any], gpus_per_node: int, gpus: bool = True) -> dict[str, Any]:
    """The profile asking for the plan's GPUs per node: a profile written for whole nodes
    (`gres: gpu:8`, `gpus_per_node: 8`) would hold 8 GPUs for a 4-GPU trial, or find no node;
    one asking for none (no --cluster) would get a GPU plan's trial no GPU at all."""
    profile = dict(profile)
    asks = profile.get("gpus_per_node") or gres_gpus(profile.get("gres")) or profile.get("gpus_per_task")
    if profile.get("gpus_per_node") or (gpus and not asks):
        profile["gpus_per_node"] = gpus_per_node
    if gres_gpus(profile.get("gres")) is not None:
        profile["gres"] = gres_with_gpus(profile["gres"], gpus_per_node)
    return profile


def trial_job(plan: Plan, args: argparse.Namespace, candidate: Candidate, trial_dir: Path) -> Job:
    """The trial as the launcher's training stage: nodes x tasks per node = the plan's cluster."""
    profile = slurm_profile(args.cluster)
    config = write_trial_config(plan, args, candidate, trial_dir)
    name = "plan-" + trial_dir.name
    job = Job(
        "training",
        name,
        f"{profile.get('job_name_prefix') or ''}{name}",
        trial_dir,
        [sys.executable, *trial_args(trial_dir, config)],
        nodes=plan.cluster.nodes,
        tasks_per_node=plan.cluster.gpus_per_node,
    )
    job.gpus = plan.cluster.gpu.name != "cpu"
    job.cpus_per_task = rank_cpus(profile)  # as the training's ranks get them
    job.time_limit, job.time_limit_key = args.trial_time_limit, "--trial-time-limit"
    job.workdir = str(Path.cwd())
    return job


def submit_trial(job: Job, profile: dict[str, Any]) -> str:
    """Render, write and submit the job script; record it as `gptrain launch` does."""
    top = {"env_vars": {**(profile.get("env_vars") or {}), **trial_env()}}
    atomic_write_text(job.script_path, render_slurm(job, profile, top))
    job.script_path.chmod(0o755)
    job_id = sbatch(job, None)
    record_submission(job, job_id, None)
    return job_id


def wait_for_job(job_id: str, timeout_s: float) -> JobState:
    """Poll the launcher's job state until the job is no longer queued or running. A job past
    `timeout_s`, or still queued or running when the planner stops (Ctrl-C, SIGTERM), is cancelled:
    left alone, it held its nodes for --trial-time-limit after the planner had exited."""
    deadline = time.monotonic() + timeout_s
    try:
        state = slurm_state(job_id)
        while state.active:
            if time.monotonic() > deadline:
                run_command(["scancel", job_id])
                return JobState("TIMEOUT", f"cancelled by gptrain plan after {timeout_s:.0f} s")
            time.sleep(POLL_S)
            state = slurm_state(job_id)
    except BaseException:
        run_command(["scancel", job_id])
        raise
    return state


def run_slurm_trial(plan: Plan, args: argparse.Namespace, candidate: Candidate, trial_dir: Path) -> None:
    from gptrain.launch.validation_stage import apply_exclude_file

    gpus = plan.cluster.gpu.name != "cpu"
    profile = trial_profile(slurm_profile(args.cluster), plan.cluster.gpus_per_node, gpus)
    apply_exclude_file(profile, {"exclude_file": args.exclude_file})  # nodes a validation blamed
    job = trial_job(plan, args, candidate, trial_dir)
    try:
        check_sbatch_reads_exclusive(profile)  # as the launch: sbatch would refuse each trial in turn
        check_cluster(job, profile, query_nodes())  # a request the partition cannot hold waits forever
        job_id = submit_trial(job, profile)
    except LaunchError as error:
        candidate.error = str(error)[:160]
        return
    print(f"plan: {candidate.layout.label()} is Slurm job {job_id} ({trial_dir})", file=sys.stderr)
    state = wait_for_job(job_id, args.trial_timeout)
    world = plan.cluster.nodes * plan.cluster.gpus_per_node
    log = str(job.log_path(job_id))
    read_results(trial_dir, world, candidate, f"job {job_id} {state.describe()}, see {log}")
