"""Render the shell scripts a launch runs: sbatch scripts for Slurm, plain bash for local.

Every value that comes from a config is quoted with shlex.quote (sbatch parses quoted
`#SBATCH` values the way a shell does), so a run named `a b;touch x` is a job named exactly
that and runs nothing else. Only fixed text of this module reaches the scripts unquoted.

Inside a Slurm job, training runs as `srun` with one task per GPU (or per CPU process):
the rank comes from SLURM_PROCID, MASTER_ADDR is the address of the first node of the
allocation. One task per GPU (rather than torchrun per node) means Slurm itself starts,
signals and accounts every rank: srun forwards the batch shell's USR1/TERM to all ranks at
once, and there is no second rendezvous layer to time out.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptrain.errors import EXIT_HUNG, EXIT_REQUEUE, SIGNAL_SECONDS_ENV, ConfigError
from gptrain.launch.additional_parameters import SBATCH_OWNED, sbatch_option
from gptrain.launch.key_types import ENV_NAME, non_negative, slurm_time_seconds
from gptrain.launch.rendezvous import rendezvous
from gptrain.launch.script_values import CONTROL, describe

# Seconds of warning (USR1) before the time limit when cluster.signal_seconds is null.
DEFAULT_SIGNAL_SECONDS = 300


class Raw(str):
    """A piece of fixed script text (e.g. `"$SLURM_ARRAY_TASK_ID"`) that must not be quoted."""


@dataclass
class Job:
    """One stage of a launch: what to run, where it logs, and what it asks of the cluster."""

    stage: str
    run_name: str
    job_name: str
    run_dir: Path
    command: list[str]
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int | None = None
    all_node_cpus: bool = False  # the task takes every CPU Slurm gives the job on its node (workers: auto)
    gpus: bool = False
    array: int | None = None  # number of array tasks (one per shard, or a stride of them), None: not an array
    array_throttle: int | None = None  # at most this many array tasks at once (NeMo's node_array_size)
    time_limit: str | None = None
    requeue: bool = False
    setup: list[list[str]] = field(default_factory=list)
    workdir: str = "."
    dependency: str | None = None  # run.dependency, e.g. "singleton" (one job of this name at a time)

    @property
    def script_path(self) -> Path:
        return self.run_dir / f"{self.job_name}_submission.sh"

    @property
    def config_path(self) -> Path:
        """The resolved config the job reads: `<run name>_hydra.yaml`, without the job-name prefix
        the script and logs carry, where the NeMo launcher writes it (scripts that read it work)."""
        return self.run_dir / f"{self.run_name}_hydra.yaml"

    def log_pattern(self, suffix: str = "out") -> Path:
        """sbatch output pattern: %j (or %A_%a for arrays) becomes the job id.

        Slurm expands `%` anywhere in the path, so every `%` of the run directory and the job
        name is doubled (`run%j` stays `run%j`, not the job id).
        """
        jobid = "%A_%a" if self.array else "%j"
        return (
            Path(escape_percent(str(self.run_dir))) / f"log-{escape_percent(self.job_name)}_{jobid}.{suffix}"
        )

    def log_path(self, job_id: str, suffix: str = "out") -> Path:
        """The file Slurm writes for a (non-array) job id: the pattern as Slurm expands it."""
        return self.run_dir / f"log-{self.job_name}_{job_id}.{suffix}"


def escape_percent(text: str) -> str:
    """Text that Slurm's filename patterns (--output, --error) read back as itself."""
    return text.replace("%", "%%")


def rank_command(python: str, args: list[str], devices: int, local: bool) -> list[str]:
    """`python ARGS` once per rank: srun starts one per task; locally torchrun starts `devices` of them."""
    if not local:
        return [python, *args]
    # torchrun itself, passing on the workers' 75 (requeue) or 76 (hang), where it would end with 1
    torchrun = [
        "-m",
        "gptrain.parallel.torchrun",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={devices}",
    ]
    return [python, *torchrun, *args]


def dash_safe(path: str) -> str:
    """A relative path as a command's argument: `-x` as `./-x` (the same file), which no parser
    takes for an option."""
    return f"./{path}" if path.startswith("-") else path


def quote(value: object, what: str) -> str:
    """shlex.quote, refusing control characters: a newline inside quotes still ends an #SBATCH line.

    The launcher checks the config keys first (script_values); this is the last line of defence.
    """
    text = str(value)
    if CONTROL.search(text):
        raise ConfigError(
            f"{what}: the value {text!r} contains {describe(text)}; it cannot go into a job script"
        )
    return shlex.quote(text)


def quote_command(command: list[str]) -> str:
    """Fixed text and paths (checked by key in script_values); quoted, so one word each for bash."""
    return " ".join(part if isinstance(part, Raw) else shlex.quote(str(part)) for part in command)


def env_lines(env_vars: dict[str, object] | None) -> list[str]:
    lines = []
    for key, value in (env_vars or {}).items():
        if not ENV_NAME.match(str(key)):
            raise ConfigError(f"env_vars key '{key}' is not a valid environment variable name")
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"export {key}={env_value(text, f'env_vars.{key}')}")
    return lines


# `$NAME` or `${NAME}` inside an env_vars value: expanded when the job starts, as NeMo's unquoted export does.
# (`$_`, bash's last argument, is no name: it stays text.)
ENV_REFERENCE = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|((?!_(?![A-Za-z0-9_]))[A-Za-z_][A-Za-z0-9_]*))"
)


# `\$` is a literal `$`, as in NeMo's unquoted export (`pa\$word`: no reference to expand); a run
# of backslashes before `$` escapes it only when odd (`\\$HOME` is a backslash pair, then $HOME).
ENV_TOKEN = re.compile(r"(?<!\\)(?:\\\\)*\\\$|" + ENV_REFERENCE.pattern)


def env_value(text: str, what: str) -> str:
    """`text` for `export NAME=...`: variable references expand (unset: empty, as without `set -u`),
    `\\$` is `$`, everything else is quoted literally, so `$(...)`, backticks and `;` run nothing."""
    parts, literal, position = [], "", 0
    for token in ENV_TOKEN.finditer(text):
        literal += text[position : token.start()]
        position = token.end()
        if token.group().endswith("\\$"):  # an odd run of backslashes: the last one escapes the `$`
            literal += token.group()[:-2] + "$"
            continue
        if literal:
            parts.append(quote(literal, what))
            literal = ""
        parts.append(f'"${{{token.group(1) or token.group(2)}-}}"')
    literal += text[position:]
    if literal or not parts:
        parts.append(quote(literal, what))
    return "".join(parts)


def wandb_key_lines(key_file: object) -> list[str]:
    """NeMo's wandb_api_key_file: the job reads the W&B key when it starts; the key never enters the
    script. As in NeMo, the key is the file's first line, without its line ending (a CRLF file's `\r`
    or a second line would otherwise be part of the key, which W&B refuses)."""
    if not key_file:
        return []
    first_line = f"head -n 1 -- {quote(key_file, 'wandb_api_key_file')} | tr -d '[:space:]'"
    return [f'export WANDB_API_KEY="$({first_line})"']


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
    if cluster.get("mem") is not None:
        lines.append(directive("mem", cluster["mem"], job.stage))
    if cluster.get("exclusive"):  # true: whole nodes; a mode (user, mcs, topo): --exclusive=<mode>
        mode = cluster["exclusive"]
        lines.append(directive("exclusive", None if mode is True else mode, job.stage))
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
        check_signal_fits_time_limit(job, seconds)
        lines.append(directive("signal", f"B:USR1@{seconds}"))
        lines.extend(requeue_directive(cluster))
    return lines + additional_directives(cluster, job.stage)


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


def additional_directives(cluster: dict, stage: str) -> list[str]:
    """cluster.additional_parameters (checked in additional_parameters.py: none of the options above),
    as submitit renders them: `mail_type: END` is `--mail-type=END`, true a bare flag, null no line;
    quoted."""
    lines = []
    for key, value in (cluster.get("additional_parameters") or {}).items():
        if value is not None:
            flag_value = None if value is True else value
            lines.append(
                directive(sbatch_option(key), flag_value, stage, f"cluster.additional_parameters.{key}")
            )
    return lines


# The least time a requeueable job must train before Slurm's warning signal, which Slurm may
# send up to 60 s before the time it was asked for.
MIN_SECONDS_BEFORE_SIGNAL = 120


def check_signal_fits_time_limit(job: Job, signal_seconds: int) -> None:
    """A warning signal due (nearly) as soon as the job starts would checkpoint and requeue it at
    once, every time, until max_requeues is spent: refused at launch, naming both keys."""
    limit = slurm_time_seconds(job.time_limit)
    if limit is not None and limit - signal_seconds < MIN_SECONDS_BEFORE_SIGNAL:
        fix = (
            f"or a smaller cluster.signal_seconds (at most {limit - MIN_SECONDS_BEFORE_SIGNAL} here)"
            if limit > MIN_SECONDS_BEFORE_SIGNAL
            else f"of more than {MIN_SECONDS_BEFORE_SIGNAL} s"
        )
        raise ConfigError(
            f"{job.stage}.run.time_limit={job.time_limit} leaves {max(limit - signal_seconds, 0)} s before the "
            f"checkpoint-and-requeue signal, which comes cluster.signal_seconds={signal_seconds} s before the "
            f"limit (and up to 60 s earlier): give a longer time limit {fix}"
        )


def gres_gpus(gres: object) -> int | None:
    """GPUs per node a --gres value asks for ('gpu:8', 'gpu:a100:8,nvme:1' -> 8; 'gpu' -> 1, as Slurm
    reads it), or None where it asks for none."""
    text = re.sub(r"\([^)]*\)", "", str(gres or ""))  # sinfo's '(S:0-1)' socket note
    gpus = [item.strip().split(":") for item in text.split(",") if item.strip().split(":")[0] == "gpu"]
    if not gpus:
        return None
    return int(gpus[0][-1]) if len(gpus[0]) > 1 and gpus[0][-1].isdigit() else 1


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


def srun_prefix(job: Job, cluster: dict, container: str | None, mounts: list[str]) -> str:
    """srun with the container options (pyxis) when a container is set."""
    parts = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={job.nodes}",
        f"--ntasks-per-node={job.tasks_per_node}",
    ]
    if job.cpus_per_task:  # Slurm 22.05's srun does not inherit sbatch's --cpus-per-task
        parts.append(f"--cpus-per-task={job.cpus_per_task}")
    elif job.all_node_cpus:  # NeMo's data preparation: every CPU of the node (with cluster.exclusive)
        parts.append('--cpus-per-task="$SLURM_CPUS_ON_NODE"')
    return " ".join(parts + srun_options(cluster, container, mounts))


def srun_options(cluster: dict, container: str | None, mounts: list[str]) -> list[str]:
    """The container options (pyxis) when a container is set, then cluster.srun_args; quoted."""
    parts = []
    args = [str(a) for a in cluster.get("srun_args") or []]
    if container:
        parts.append(f"--container-image={quote(container, 'container')}")
        if mounts:
            parts.append(f"--container-mounts={quote(','.join(mounts), 'container_mounts')}")
    else:  # pyxis options make srun fail where there is no container
        args = without_pyxis_options(args)
    return parts + [quote(a, "cluster.srun_args") for a in args]


# pyxis's options that take a value, which an sbatch script's srun line often gives as the next
# word (`--container-mounts /fsx`).
PYXIS_VALUE_OPTIONS = (
    "--container-image",
    "--container-mounts",
    "--container-workdir",
    "--container-name",
    "--container-save",
    "--container-env",
)


def without_pyxis_options(args: list[str]) -> list[str]:
    """srun arguments less pyxis's options, each with its value where that is the next word: left
    behind, the value would be the first word srun does not know, which it runs as the command.
    Slurm's own --container (an OCI bundle, no pyxis) stays, with its value."""
    kept, value_next = [], False
    for arg in args:
        if value_next:
            value_next = False
        elif arg.startswith(("--container-", "--no-container-")):
            value_next = arg in PYXIS_VALUE_OPTIONS
        else:
            kept.append(arg)
    return kept


def setup_line(command: list[str], cluster: dict, container: str | None, mounts: list[str]) -> str:
    """A step before the stage's own (training: applying the data blend to its config). In a
    container it runs there too, as one task with the stage's container options: the compute
    host itself need not have gptrain, or any Python."""
    if not container:
        return f"{quote_command(command)} || exit 1"
    srun = [
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=1",
        "--ntasks=1",
        *srun_options(cluster, container, mounts),
    ]
    return f"{' '.join(srun)} {quote_command(command)} || exit 1"


# Run the step in the background so the batch shell can receive Slurm's warning signal
# (--signal=B:USR1@N) and forward it; srun passes it on to every rank.
STEP_LINES = """\
got_signal= last_signal=
forward() { got_signal=$1; last_signal=$1; echo "gptrain: got SIG$1, forwarding it to the training step" >&2; kill -"$1" "$step" 2>/dev/null; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
wait "$step"; status=$?
while [ -n "$got_signal" ] && [ "$status" -gt 128 ]; do got_signal=; wait "$step"; status=$?; done"""

# Exit 75 (gptrain.errors.EXIT_REQUEUE): a checkpoint was saved (or a stop signal came during start-up,
# with nothing to save), requeue up to max_requeues.
# Exit 76 (EXIT_HUNG): the hang watchdog ended a stuck step; requeue the same way, so the job
# resumes from the last complete checkpoint (on other nodes, where Slurm allows it).
# A requeued job waits ~2 min (BeginTime) unless its StartTime is reset once it is PENDING
# again; a detached helper does that (where proctrack/cgroup kills it, the job just waits).
# It waits 2 s after PENDING: slurmd compares job credentials with the requeue's revocation
# time in whole seconds, and a restart within the same second is killed ("credential revoked").
# `scontrol requeue` is tried 3 times (a busy or failing-over controller times out); if it never
# succeeds the job ends with the step's code, not 0: Slurm would call a stopped run COMPLETED.
# A job its user cancelled (scancel: SIGTERM to the batch shell, which the run checkpoints on, the job
# COMPLETING with Reason=None at once) is not requeued: Slurm took that requeue, and the cancelled run
# went on. The hard time limit (Reason=TimeLimit) still requeues a run that saved its checkpoint.
# A job Slurm requeued itself (PreemptMode=REQUEUE: the SIGTERM of the preemption comes after the
# requeue, the job then PENDING|COMPLETING, shown as COMPLETING with Reason=None too) is told from a
# cancelled one by its Restarts, which the requeue raised past this run's SLURM_RESTART_COUNT: it
# will run again, and a second requeue is neither needed nor taken (the job is pending).
REQUEUE_RECORD = "requeues.txt"  # in the run directory: gptrain's own requeues per job id
REQUEUE_LINES = """\
restarts=${SLURM_RESTART_COUNT:-0}
# gptrain's own requeues of this job (Slurm's restart count also counts its preemptions, which
# would spend max_requeues): "JOBID N" lines in the run directory
requeued=$(sed -n "s/^$SLURM_JOB_ID \\([0-9][0-9]*\\)$/\\1/p" "$requeue_file" 2>/dev/null | tail -n 1); requeued=${requeued:-0}
if [ "$status" = {exit_requeue} ] || [ "$status" = {exit_hung} ]; then
  job_info=; [ "$last_signal" = TERM ] && job_info=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)
  slurm_restarts=$(sed -n 's/.*[[:space:]]Restarts=\\([0-9][0-9]*\\).*/\\1/p' <<< "$job_info" | head -n 1)
  if [ -n "$slurm_restarts" ] && [ "$slurm_restarts" -gt "$restarts" ]; then
    echo "gptrain: Slurm requeued the job itself (preemption): it resumes when it starts again" >&2
  elif grep -qE "JobState=(COMPLETING|CANCELLED) Reason=None( |$)" <<< "$job_info"; then
    echo "gptrain: the job was cancelled (scancel): not requeueing; launch again to resume" >&2
  elif [ "$requeued" -lt "$max_requeues" ]; then
    reason="the run stopped to be requeued (its line above says what it saved)"; [ "$status" = {exit_hung} ] && reason="a rank hung (see the line above)"
    echo "gptrain: $reason; requeueing (restart $((requeued + 1)) of $max_requeues)" >&2
    if ! echo "$SLURM_JOB_ID $((requeued + 1))" >> "$requeue_file"; then
      echo "gptrain: cannot record the requeue in $requeue_file (read-only, full?): not requeueing, as max_requeues could not hold; launch again to resume" >&2
      echo "gptrain: step finished with exit code $status" >&2
      exit "$status"
    fi
    setsid bash -c 'for i in $(seq 1 200); do sleep 0.3; if scontrol show job "$1" | grep -q "JobState=PENDING"; then sleep 2; scontrol update JobId="$1" StartTime=now; exit; fi; done' gptrain-nudge "$SLURM_JOB_ID" </dev/null >/dev/null 2>&1 &
    for try in 1 2 3; do
      scontrol requeue "$SLURM_JOB_ID" && exit 0
      # a reply that timed out after the controller took the requeue: the job is queued again
      scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -qE "JobState=(PENDING|REQUEUE)" && exit 0
      [ "$try" = 3 ] || sleep 5
    done
    echo "gptrain: scontrol requeue failed: launch again to resume" >&2
  else
    echo "gptrain: exit $status but max_requeues=$max_requeues reached; not requeueing" >&2
  fi
fi
echo "gptrain: step finished with exit code $status" >&2
exit "$status"
"""


# The end of a stage other than the training, as the training's REQUEUE_LINES end: its exit code in
# its log (each array task's own), from which `gptrain status` tells how it ended once Slurm has
# forgotten the job (past MinJobAge, without accounting). A cancel or the time limit kills the batch
# shell first: no line, and the state stays unknown.
FINISH_LINES = "\n".join(
    ["status=$?", 'echo "gptrain: step finished with exit code $status" >&2', 'exit "$status"']
)


def header(job: Job, where: str) -> list[str]:
    return [
        "#!/bin/bash",
        f"# Rendered by `gptrain launch` ({where}): stage {job.stage} of run {job.run_name!r}.",
    ]


def render_slurm(job: Job, cluster: dict, top: dict) -> str:
    """The sbatch script of one stage."""
    lines = header(job, "slurm") + sbatch_directives(job, cluster)
    lines += ["", "set -uo pipefail", "export PYTHONUNBUFFERED=1"]
    if job.requeue:  # for the run's warning about a save longer than the signal's lead
        lines.append(f"export {SIGNAL_SECONDS_ENV}={signal_seconds(cluster)}")
    lines += env_lines(top.get("env_vars"))
    lines += wandb_key_lines(top.get("wandb_api_key_file"))
    lines += [f'echo "gptrain: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, stage {job.stage}" >&2']
    container, mounts = top.get("container"), list(top.get("container_mounts") or [])
    lines += [setup_line(command, cluster, container, mounts) for command in job.setup]
    srun = srun_prefix(job, cluster, container, mounts)
    if job.stage not in ("training", "validation"):
        lines += [f"{srun} {quote_command(job.command)}", FINISH_LINES]
        return "\n".join(lines) + "\n"
    meeting = rendezvous(top.get("env_vars"), ranks=job.stage == "training")
    lines += ["", *meeting.lines, ""]
    srun = " ".join(part for part in (srun, meeting.wrapper) if part)
    if job.stage == "validation":  # its ranks rendezvous as the training's do
        lines += [f"{srun} {quote_command(job.command)}", FINISH_LINES]
        return "\n".join(lines) + "\n"
    lines += [f"max_requeues={int(cluster.get('max_requeues') or 0)}"]
    lines += [f"requeue_file={quote(str(Path(job.run_dir) / REQUEUE_RECORD), 'run directory')}", ""]
    lines.append(f"{srun} {quote_command(job.command)} &")
    lines += [
        "step=$!",
        STEP_LINES,
        REQUEUE_LINES.replace("{exit_requeue}", str(EXIT_REQUEUE))
        .replace("{exit_hung}", str(EXIT_HUNG))
        .rstrip(),
    ]
    return "\n".join(lines) + "\n"


def render_local(job: Job, top: dict) -> str:
    """A bash script running the stage on this machine (torchrun for training)."""
    lines = header(job, "local") + ["set -euo pipefail", f"cd {quote(job.workdir, 'working directory')}"]
    lines += ["export PYTHONUNBUFFERED=1"] + env_lines(top.get("env_vars"))
    lines += wandb_key_lines(top.get("wandb_api_key_file"))
    for command in job.setup:
        lines.append(quote_command(command))
    lines.append(f"exec {quote_command(job.command)}")
    return "\n".join(lines) + "\n"


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
