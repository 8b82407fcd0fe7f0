"""The #SBATCH lines of a stage's script: its resources, the site's settings, the requeue signal."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError
from gptrain.launch.additional_parameters import (
    SBATCH_OWNED,
    extra_options,
    left_out_reason,
    sbatch_option,
    time_min_parameter,
    time_min_value,
)
from gptrain.launch.gres import gres_gpus
from gptrain.launch.key_types import non_negative, slurm_time_seconds
from gptrain.launch.sbatch_option_names import options_meant
from gptrain.launch.script_quoting import quote

if TYPE_CHECKING:  # sbatch.py renders the whole script with these lines, so imports this module
    from gptrain.launch.sbatch import Job


# Seconds of warning (USR1) before the time limit when cluster.signal_seconds is null.
DEFAULT_SIGNAL_SECONDS = 300


# The #SBATCH options whose value is the config key that sets them (additional_parameters.SBATCH_OWNED).
VALUE_OF_THE_OWNING_KEY = (
    "job-name", "chdir", "partition", "account", "qos", "reservation", "constraint", "nodelist",
    "time", "mem", "gres", "dependency", "exclusive",
)  # fmt: skip


# The config keys behind each #SBATCH option whose value comes from a config, for error messages;
# the log paths' and the excluded nodes' values come from more keys than the one that sets them.
DIRECTIVE_KEYS = {
    **{option: SBATCH_OWNED[option].replace("<stage>", "{stage}") for option in VALUE_OF_THE_OWNING_KEY},
    "output": "base_results_dir, {stage}.run.results_dir or {stage}.run.name",
    "error": "base_results_dir, {stage}.run.results_dir or {stage}.run.name",
    "exclude": "cluster.exclude or validation.exclude_file",
}


def directive(option: str, value: object = None, stage: str = "training", keys: str | None = None) -> str:
    """One #SBATCH line. A backslash is refused: sbatch reads it as an escape in #SBATCH lines.
    `keys`: the config key the value comes from, where DIRECTIVE_KEYS does not know it."""
    if value is None:
        return f"#SBATCH --{option}"
    text = str(value)
    if "\\" in text:
        keys = keys or DIRECTIVE_KEYS.get(option, "the config").format(stage=stage)
        raise ConfigError(
            f"{keys}: the value {text!r} reaches '#SBATCH --{option}' and contains a backslash,"
            " which sbatch reads as an escape character; remove it"
        )
    return f"#SBATCH --{option}={quote(text, f'#SBATCH --{option}')}"


def sbatch_directives(job: Job, cluster: dict) -> list[str]:
    """The #SBATCH lines: resources from the job, site settings from the cluster profile."""
    lines = [directive("job-name", job.job_name, job.stage), directive("nodes", job.nodes)]
    lines.append(directive("ntasks-per-node", job.tasks_per_node, job.stage))
    lines.append(directive("output", job.log_pattern("out"), job.stage))
    if not cluster.get("stderr_to_stdout", True):
        lines.append(directive("error", job.log_pattern("err"), job.stage))
    lines.append(directive("open-mode", "append"))  # a requeued run continues the same log
    lines.append(directive("chdir", job.workdir, job.stage))
    for key, option in (
        ("partition", "partition"),
        ("account", "account"),
        ("qos", "qos"),
        ("reservation", "reservation"),
        ("constraint", "constraint"),
        ("nodelist", "nodelist"),
        ("exclude", "exclude"),
    ):
        if cluster.get(key):
            lines.append(directive(option, cluster[key], job.stage))
    if job.time_limit not in (None, ""):  # 0 too: Slurm's "no limit", not the partition's DefaultTime
        lines.append(directive("time", job.time_limit, job.stage))
    check_time_min_fits(job, time_min_given(cluster))
    if cluster.get("mem") is not None:
        lines.append(directive("mem", cluster["mem"], job.stage))
    if cluster.get("exclusive"):  # true: whole nodes; a mode (user, mcs, topo): --exclusive=<mode>
        mode = cluster["exclusive"]
        lines.append(directive("exclusive", None if mode is True else mode, job.stage))
    if cluster.get("overcommit"):  # bignlp-scripts 22.x rendered it for every stage
        lines.append(directive("overcommit"))
    if job.cpus_per_task:
        lines.append(directive("cpus-per-task", job.cpus_per_task, job.stage))
    lines.extend(gpu_directives(job, cluster))
    if job.array:
        throttle = f"%{job.array_throttle}" if job.array_throttle else ""
        lines.append(directive("array", f"0-{job.array - 1}{throttle}", job.stage))
    if job.dependency:
        lines.append(directive("dependency", job.dependency, job.stage))
    if job.requeue:
        seconds = signal_seconds(cluster)
        check_signal_fits_time_limit(job, seconds, time_min_parameter(cluster))
        lines.append(directive("signal", f"B:USR1@{seconds}"))
        lines.extend(requeue_directive(cluster))
    return lines + additional_directives(cluster, job)


def signal_seconds(cluster: dict) -> int:
    """The warning signal's lead before the time limit: cluster.signal_seconds (checked: 1..65535) or
    the default for null."""
    seconds = cluster.get("signal_seconds")
    return DEFAULT_SIGNAL_SECONDS if seconds is None else int(seconds)


def requeue_directive(cluster: dict) -> list[str]:
    """--requeue where the script requeues the job itself (cluster.max_requeues of 1 or more: its
    `scontrol requeue` fails on a job that is not requeueable, as under JobRequeue=0); --no-requeue
    for 0, which asks for no requeue at all: Slurm's default (JobRequeue=1) would still requeue the
    job after a node failure or a preemption and start the batch script over. Unset: neither, the
    site's default, as the NeMo launcher's scripts leave it."""
    requeues = cluster.get("max_requeues")
    if requeues is None:
        return []
    return [directive("requeue" if int(requeues) > 0 else "no-requeue")]


def additional_directives(cluster: dict, job: Job) -> list[str]:
    """cluster.additional_parameters, after NeMo's SlurmLauncher keys of a cluster file (comment,
    mem_per_cpu, ...; checked in additional_parameters.py: none of the options above), as submitit
    renders them: `mail_type: END` is `--mail-type=END`, true a bare flag, null no line; quoted.
    --cpus-per-gpu and --mem-per-gpu are left out of a job that asks for no GPU (left_out_reason)."""
    lines = []
    for key, option, value in extra_options(cluster):
        if value is not None and not left_out_reason(option, job.gpus, cluster, bool(job.cpus_per_task)):
            lines.append(directive(option, None if value is True else value, job.stage, key))
    return lines


# The least time a requeueable job must train before Slurm's warning signal, which Slurm may
# send up to 60 s before the time it was asked for.
MIN_SECONDS_BEFORE_SIGNAL = 120


def check_signal_fits_time_limit(
    job: Job, signal_seconds: int, time_min: tuple[str, int | str] | None = None
) -> None:
    """A warning signal due (nearly) as soon as the job starts would checkpoint and requeue it at
    once, every time, until max_requeues is spent: refused at launch, naming both keys. The signal
    comes before the limit the job started with, which Slurm may lower down to a --time-min
    (`time_min`: its key and value), so each limit the job may get must leave the time; each read as
    Slurm reads it, in whole minutes."""
    limits = [(f"{job.time_limit_source}={job.time_limit}", job.time_limit)]
    if time_min:
        key, value = time_min
        limits.append(
            (f"{key}={value} (--time-min: Slurm may start the job with its limit lowered to it)", value)
        )
    for given, value in limits:
        try:
            limit = slurm_limit_seconds(value)
        except ValueError:  # a --time-min sbatch will refuse (it says why), or one this does not read
            continue
        if limit is not None and limit - signal_seconds < MIN_SECONDS_BEFORE_SIGNAL:
            fix = (
                f"or a smaller cluster.signal_seconds (at most {limit - MIN_SECONDS_BEFORE_SIGNAL} here)"
                if limit > MIN_SECONDS_BEFORE_SIGNAL
                else f"of more than {MIN_SECONDS_BEFORE_SIGNAL} s"
            )
            raise ConfigError(
                f"{given} leaves {max(limit - signal_seconds, 0)} s before the checkpoint-and-requeue signal,"
                f" which comes cluster.signal_seconds={signal_seconds} s before the limit (and up to 60 s"
                f" earlier): give a longer time limit {fix}"
            )


def time_min_given(cluster: dict) -> tuple[str, Any] | None:
    """cluster.additional_parameters' --time-min (any prefix sbatch reads as it), checked: a Slurm
    time (not true, false or blank, which sbatch refuses)."""
    for name, value in (cluster.get("additional_parameters") or {}).items():
        if options_meant(sbatch_option(name)) == ["time-min"]:
            time_min_value(f"cluster.additional_parameters.{name}", value)
    return time_min_parameter(cluster)


def check_time_min_fits(job: Job, time_min: tuple[str, Any] | None) -> None:
    """sbatch refuses a --time-min longer than the job's --time ('Invalid time-min specification'), and
    one --time-min reaches every stage: the validation's 30 minutes beside the training's day were refused
    at submission, after the stages before it were queued. Read as Slurm keeps both, in whole minutes;
    a stage without a --time (the partition's default) is left to Slurm."""
    if not time_min or job.time_limit in (None, ""):
        return
    limit = slurm_limit_seconds(job.time_limit)
    key, value = time_min
    asked = slurm_limit_seconds(value)
    if limit is None or (asked is not None and asked <= limit):
        return
    longer = "asks for no time limit, which is longer than" if asked is None else "is longer than"
    raise ConfigError(
        f"{key}={value} {longer} {job.time_limit_source}={job.time_limit}, and sbatch refuses a"
        " --time-min over the job's --time ('Invalid time-min specification'): --time-min reaches every"
        f" stage's script; give at most {job.time_limit}, or a longer {job.time_limit_source}"
    )


def slurm_limit_seconds(value: object) -> int | None:
    """The seconds of a time limit as Slurm keeps it: whole minutes, rounded up (its time_str2mins),
    so `06:59` (MM:SS) is a 7-minute limit. None: no limit."""
    seconds = slurm_time_seconds(value)
    return None if seconds is None else math.ceil(seconds / 60) * 60


def gpu_directives(job: Job, cluster: dict) -> list[str]:
    """--gres and --gpus-per-node; where both ask for GPUs, --gres only (NeMo's bcm.yaml sets both):
    Slurm 26.05 refuses the two together ('mutually exclusive'), and every version reads --gres."""
    if not job.gpus:
        return []
    lines = []
    per_node, via_gres = cluster.get("gpus_per_node"), gres_gpus(cluster.get("gres"))
    if per_node and via_gres is not None:
        if via_gres != int(per_node):
            raise ConfigError(
                f"cluster.gres={cluster['gres']} asks for {via_gres} GPUs per node and cluster.gpus_per_node"
                f" for {per_node}; give one of them (the other null)"
            )
        per_node = None
    if cluster.get("gres"):
        lines.append(directive("gres", cluster["gres"], job.stage))
    if per_node:
        lines.append(directive("gpus-per-node", per_node, job.stage))
    if cluster.get("gpus_per_task"):
        lines.append(directive("gpus-per-task", cluster["gpus_per_task"], job.stage))
    return lines


def node_gpus(cluster: dict[str, Any], where: str = "") -> int | None:
    """The GPUs of one node of a cluster file (or of a stage config that carries them): its
    gpus_per_node, read as the launcher reads it (`"8"` is 8), else (null or 0) the count its gres
    asks for (gpu:8, as its jobs ask for GPUs); None where neither says. A value the launcher
    refuses is a ConfigError starting with `where`: read as none, it left the inter-node threshold a
    whole node's for `srun -N2 -n2`, failing both nodes."""
    try:
        gpus = non_negative("gpus_per_node", cluster.get("gpus_per_node"))
    except ConfigError as error:
        raise ConfigError(f"{where}{error}") from None
    if not gpus:  # null or 0 (no --gpus-per-node asked for): the GPUs its gres asks for
        return gres_gpus(cluster.get("gres")) or None
    return gpus
