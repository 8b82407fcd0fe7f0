"""Slurm executor: preflight against sinfo, then one `sbatch --parsable` per stage.

Later stages wait for earlier ones with `--dependency=afterok:<id>` (an array job counts as
done when all its tasks succeeded); if a stage fails, the next stays PENDING with reason
DependencyNeverSatisfied, which `gptrain status` reports.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from gptrain.errors import LaunchError
from gptrain.launch.container_env import check_srun_reads_container_env
from gptrain.launch.preflight import check_cluster, check_exclusive_mode, query_nodes, sbatch_version
from gptrain.launch.records import LAUNCHER_LOG, append_record
from gptrain.launch.sbatch import Job
from gptrain.launch.sbatch_directives import DIRECTIVE_KEYS, sbatch_directives
from gptrain.launch.sbatch_env import sbatch_environment, sbatch_variables_note, srun_variables_note
from gptrain.launch.stages import LaunchPlan


def preflight_cluster(plan: LaunchPlan) -> list[str]:
    """sinfo's fit of each job; an --exclusive mode this sbatch's version refuses; a pyxis that does
    not know the --container-env the jobs' srun lines pass."""
    nodes = query_nodes()
    check_sbatch_reads_exclusive(plan.cluster)
    if plan.top.get("container"):
        check_srun_reads_container_env(plan.cluster)
    return [check_cluster(job, plan.cluster, nodes) for job in plan.jobs]


def check_sbatch_reads_exclusive(cluster: dict) -> None:
    """An --exclusive mode this sbatch's version refuses (topo before 24.05), before anything is
    submitted: the launch's stages and `gptrain plan`'s trials. sbatch is asked only for a mode."""
    if isinstance(cluster.get("exclusive"), str):
        check_exclusive_mode(cluster, sbatch_version())


def sbatch_variables_notes(plan: LaunchPlan) -> list[str]:
    """The note on SBATCH_* variables in this shell (sbatch() leaves out those that override a line)."""
    note = sbatch_variables_note([(job.stage, sbatch_directives(job, plan.cluster)) for job in plan.jobs])
    return [line for line in (note, srun_variables_note()) if line]


# Slurm's reasons for refusing a job (slurm_strerror's text, which sbatch prints after "Batch job
# submission failed: ") and the keys that set what each names: the error line ends naming them.
SBATCH_REFUSALS = (
    ("Invalid partition name", "cluster.partition"),
    ("not permitted to use this partition", "cluster.partition"),
    ("Required partition not available", "cluster.partition (it is inactive or drained)"),
    ("Invalid account", "cluster.account and cluster.partition"),
    ("Invalid qos", "cluster.qos"),
    ("Requested time limit is invalid", "{stage}.run.time_limit (at most the partition's MaxTime)"),
    ("Invalid time specified", "{stage}.run.time_limit"),
    ("reservation", "cluster.reservation"),
    ("Invalid feature specification", "cluster.constraint"),
    ("Invalid generic resource", "cluster.gres"),
    ("Invalid GRES specification", "cluster.gres"),
    ("Invalid node name", "cluster.nodelist, cluster.exclude and validation.exclude_file"),
    ("Memory required by task", "cluster.mem"),
    ("Node count specification invalid", "{nodes} and cluster.nodelist"),
    ("More processors requested than permitted", "{stage}'s tasks and CPUs per node"),
    (
        "Requested node configuration is not available",
        "cluster.gres, cluster.gpus_per_node, cluster.constraint, cluster.mem and the tasks per node",
    ),
    (
        "accounting/QOS policy",
        "cluster.qos and cluster.account, or ask for fewer nodes or less {stage}.run.time_limit",
    ),
    ("Invalid job array specification", "data_preparation's shards (the cluster's MaxArraySize)"),
    ("Job dependency problem", "{stage}.run.dependency"),
    # sbatch's own reading of an #SBATCH line: only cluster.additional_parameters passes options unchecked
    ("unrecognized option", "cluster.additional_parameters (an option this sbatch does not know)"),
    (
        "an argument",
        "cluster.additional_parameters (true for a bare flag, a value for an option that takes one)",
    ),
    ("mutually exclusive", "cluster.additional_parameters against the other cluster keys"),
)
INVALID_OPTION = re.compile(r"Invalid --([\w-]+)", re.IGNORECASE)


def refusal_keys(message: str, job: Job) -> str:
    """'; check KEYS' for a refusal Slurm names a reason for, else ''. sbatch's "Invalid --<option>"
    names the keys whose values make that option (`cluster.mem=16Gi`; --exclude's nodes come from
    cluster.exclude and validation.exclude_file), or else the additional parameters."""
    nodes = "training.trainer.num_nodes" if job.stage == "training" else f"{job.stage}'s nodes"
    invalid = INVALID_OPTION.search(message)
    if invalid:
        from gptrain.launch.additional_parameters import SBATCH_OWNED

        option = invalid.group(1)
        owner = SBATCH_OWNED.get(option, "cluster.additional_parameters").replace("<stage>", "{stage}")
        return f"; check {DIRECTIVE_KEYS.get(option, owner).format(stage=job.stage)}"
    for reason, keys in SBATCH_REFUSALS:
        if reason.lower() in message.lower():
            return f"; check {keys.format(stage=job.stage, nodes=nodes)}"
    return ""


SBATCH_TIMEOUT_S = 60


def sbatch(job: Job, dependency: str | None) -> str:
    command = ["sbatch", "--parsable"]
    if dependency:  # on the command line it replaces the script's --dependency: keep both (AND)
        extra = f",{job.dependency}" if job.dependency else ""
        command.append(f"--dependency=afterok:{dependency}{extra}")
    command.append(str(job.script_path))
    environment = sbatch_environment(script_lines(job.script_path))
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S, env=environment
        )
    except subprocess.TimeoutExpired:  # the controller may have taken the job before it went quiet
        raise LaunchError(
            f"sbatch gave no answer in {SBATCH_TIMEOUT_S} s for {job.script_path} (a busy or failing-over"
            f" controller); its job may be queued all the same: look for job name {job.job_name!r} in squeue"
            " before launching again"
        ) from None
    except OSError as error:
        raise LaunchError(f"sbatch did not run ({error}); is Slurm installed here?") from None
    if out.returncode != 0:
        message = sbatch_error_line(out.stderr) or f"exit {out.returncode}"
        raise LaunchError(f"sbatch refused {job.script_path}: {message}{refusal_keys(message, job)}")
    return job_id_from(out.stdout, job)


def script_lines(path: Path) -> list[str]:
    """The written script's lines; none where it cannot be read (sbatch then says why)."""
    try:
        return path.read_text(errors="replace").split("\n")
    except OSError:
        return []


def sbatch_error_line(stderr: str) -> str:
    """sbatch's last line of complaint: not the 'Try "sbatch --help"' it prints after an option it
    cannot read (`unrecognized option '--x'`), which says nothing of what was wrong."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith('Try "sbatch --help"')]
    return said[-1] if said else ""


# sbatch --parsable's line: "<id>" or "<id>;<cluster>"; a site's wrapper may print lines around it,
# or (ignoring --parsable) Slurm's "Submitted batch job <id>".
PARSABLE = re.compile(r"^(\d+)(?:;\S+)?$")
SUBMITTED = re.compile(r"\bSubmitted batch job (\d+)\b")


def job_id_from(stdout: str, job: Job) -> str:
    """The job id sbatch printed; a one-line error when there is none (the job may be queued all
    the same: nothing after it is submitted, and the user is told where to look)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    for line in reversed(lines):
        found = PARSABLE.match(line) or SUBMITTED.search(line)
        if found:
            return found.group(1)
    shown = " | ".join(lines)[:200] or "nothing"
    raise LaunchError(
        f"sbatch accepted {job.script_path} but printed no job id (it printed: {shown}); its job may be"
        f" queued: look for job name {job.job_name!r} in squeue"
    )


def record_submission(
    job: Job, job_id: str, dependency: str | None, dependency_dir: Path | None = None
) -> None:
    """The run directory's launcher.log line that `gptrain status/logs/cancel` read; `dependency_dir`:
    the run dir of the job it waits for where that is another (`gptrain cancel` of this run reaches it);
    `array`: an array's task count (status counts their logs once Slurm has forgotten the job)."""
    fields: dict[str, object] = (
        {"dependency_dir": str(dependency_dir)} if dependency_dir and dependency_dir != job.run_dir else {}
    )
    if job.array:
        fields["array"] = job.array
    if job.blend:  # a later data preparation into the same blend checks whether this job took its copy
        fields.update(blend=job.blend, frozen_blend=str(job.frozen_blend_path))
    append_record(
        job.run_dir,
        "submitted",
        stage=job.stage,
        executor="slurm",
        job_id=job_id,
        job_name=job.job_name,
        script=str(job.script_path),
        config=str(job.config_path),
        log=str(job.log_pattern()).replace("%%", "%"),
        dependency=dependency,
        **fields,
    )


def withdraw(jobs: list[Job], ids: list[str], unrecorded: str | None = None) -> str:
    """Cancel the stages this launch submitted before one sbatch refused (or whose record could not
    be written, job `unrecorded`): they would run without the stages after them (data preparation
    for no training) and hold the run dirs against the corrected launch. The end of the error line,
    saying what was done; `gptrain cancel` cannot reach an unrecorded job, so scancel is named."""
    if not ids:
        return ""
    named = ", ".join(f"{job_id} ({job.stage})" for job, job_id in zip(jobs, ids, strict=False))
    try:
        done = subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    word = "job" if len(ids) == 1 else "jobs"
    if (done is None or done.returncode != 0) and unrecorded is not None:
        return f"; {word} {named} of this launch may still be queued, {unrecorded} unrecorded: scancel {' '.join(ids)}"
    if done is None or done.returncode != 0:
        return f"; {word} {named} of this launch may still be queued: gptrain cancel {shlex.quote(str(jobs[0].run_dir))}"
    return f"; cancelled {word} {named}, which this launch had submitted"


def submit(plan: LaunchPlan) -> list[str]:
    """Submit every stage in order, chained; return the job ids."""
    ids: list[str] = []
    previous: str | None = None
    previous_dir = None
    for job in plan.jobs:
        try:
            job_id = sbatch(job, previous)
        except LaunchError as error:
            raise LaunchError(f"{error}{withdraw(plan.jobs, ids)}") from None
        ids.append(job_id)
        record_or_withdraw(plan, job, ids, previous, previous_dir)
        previous_dir = job.run_dir
        after = f" (after {previous})" if previous else ""
        print(f"gptrain: submitted {job.stage} as Slurm job {job_id}{after}: {job.job_name}", file=sys.stderr)
        previous = job_id
    return ids


def record_or_withdraw(
    plan: LaunchPlan, job: Job, ids: list[str], previous: str | None, previous_dir: Path | None
) -> None:
    """Record the job sbatch just accepted (the last of `ids`). Where its line cannot be written (a
    full disk, a quota, a run dir made read-only), the launch is withdrawn as when sbatch refuses:
    the OSError escaped, the job kept running unseen by `gptrain status` and `cancel`, and the
    relaunch the error invited put a second job on the same run dir."""
    job_id, where = ids[-1], job.run_dir / LAUNCHER_LOG
    try:
        record_submission(job, job_id, previous, previous_dir)
        if (
            previous and previous_dir and previous_dir != job.run_dir
        ):  # `gptrain cancel` of that run reaches it
            where = previous_dir / LAUNCHER_LOG
            append_record(
                previous_dir, "waited_on_by", after=previous, job_id=job_id, waiting_dir=str(job.run_dir)
            )
    except OSError as error:
        reason = error.strerror or error
        raise LaunchError(
            f"{error.filename or where}: cannot record Slurm job {job_id} ({job.stage}), which sbatch accepted "
            f"({reason}){withdraw(plan.jobs, ids, job_id)}"
        ) from None
