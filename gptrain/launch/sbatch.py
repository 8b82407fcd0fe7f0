"""Render the shell scripts a launch runs: sbatch scripts for Slurm, plain bash for local.

Every value that comes from a config is quoted with shlex.quote (sbatch parses quoted
`#SBATCH` values the way a shell does), so a run named `a b;touch x` is a job named exactly
that and runs nothing else. Only fixed text of this module, script_quoting.py (the quoting) and
sbatch_directives.py (the #SBATCH lines) reaches the scripts unquoted.

Inside a Slurm job, training runs as `srun` with one task per GPU (or per CPU process):
the rank comes from SLURM_PROCID, MASTER_ADDR is the address of the first node of the
allocation. One task per GPU (rather than torchrun per node) means Slurm itself starts,
signals and accounts every rank: srun forwards the batch shell's USR1/TERM to all ranks at
once, and there is no second rendezvous layer to time out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gptrain.errors import EXIT_HUNG, EXIT_REQUEUE, SIGNAL_SECONDS_ENV
from gptrain.launch.container_env import (
    container_env_on,
    container_env_option,
    exported_names,
    without_container_env,
)
from gptrain.launch.rendezvous import rendezvous
from gptrain.launch.sbatch_directives import sbatch_directives, signal_seconds
from gptrain.launch.script_quoting import env_lines, escape_percent, quote, quote_command, wandb_key_lines


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
    time_limit_key: str = ""  # the key or flag that set time_limit, for errors ("": <stage>.run.time_limit)
    blend: str | None = None  # the blend file a training reads in place of its data_prefix (data_blend.py)

    @property
    def time_limit_source(self) -> str:
        """The key or flag an error about the time limit names: `gptrain plan`'s trials have no run keys."""
        return self.time_limit_key or f"{self.stage}.run.time_limit"

    @property
    def script_path(self) -> Path:
        return self.run_dir / f"{self.job_name}_submission.sh"

    @property
    def config_path(self) -> Path:
        """The resolved config the job reads: `<run name>_hydra.yaml`, without the job-name prefix
        the script and logs carry, where the NeMo launcher writes it (scripts that read it work)."""
        return self.run_dir / f"{self.run_name}_hydra.yaml"

    @property
    def frozen_blend_path(self) -> Path:
        """The copy of the blend a training's job took at its first start, which its requeues read."""
        return self.run_dir / f"{self.run_name}_blend.yaml"

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


# srun reads SLURM_EXPORT_ENV and SLURM_DISTRIBUTION as --export and --distribution, and sbatch's
# --export=ALL brings them from a launching shell inside a Slurm job or step (a driver job submitted
# with --export=NONE, `srun -m cyclic --pty bash`): the step could not find bash, or its ranks were
# placed cyclically, tensor-parallel groups across nodes (parallel/mesh.py places them by block). An
# option on the command line beats the variable; cluster.srun_args, after these, still wins.
SRUN_PINNED = ("--export=ALL", "--distribution=block")


def srun_prefix(
    job: Job, cluster: dict, container: str | None, mounts: list[str], exported: list[str]
) -> str:
    """srun with the container options (pyxis) when a container is set; `exported`: the variables the
    script exported before it (container_env)."""
    parts = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={job.nodes}",
        f"--ntasks-per-node={job.tasks_per_node}",
        *SRUN_PINNED,
    ]
    if job.cpus_per_task:  # Slurm 22.05's srun does not inherit sbatch's --cpus-per-task
        parts.append(f"--cpus-per-task={job.cpus_per_task}")
    elif job.all_node_cpus:  # NeMo's data preparation: every CPU of the node (with cluster.exclusive)
        parts.append('--cpus-per-task="$SLURM_CPUS_ON_NODE"')
    return " ".join(parts + srun_options(cluster, container, mounts, exported))


def srun_options(cluster: dict, container: str | None, mounts: list[str], exported: list[str]) -> list[str]:
    """The container options (pyxis) when a container is set, then cluster.srun_args; quoted. In a
    container, --container-env names `exported` and srun_args' own (container_env.py)."""
    parts = []
    args = [str(a) for a in cluster.get("srun_args") or []]
    if container:
        parts.append(f"--container-image={quote(container, 'container')}")
        if mounts:
            parts.append(f"--container-mounts={quote(','.join(mounts), 'container_mounts')}")
        if container_env_on(cluster):
            args, given = without_container_env(args)
            parts += container_env_option(exported, given)
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


def setup_line(
    command: list[str], cluster: dict, container: str | None, mounts: list[str], exported: list[str]
) -> str:
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
        SRUN_PINNED[0],
        *srun_options(cluster, container, mounts, exported),
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
    exported = exported_names("\n".join(lines))
    lines += [setup_line(command, cluster, container, mounts, exported) for command in job.setup]
    if job.stage not in ("training", "validation"):
        srun = srun_prefix(job, cluster, container, mounts, exported)
        lines += [f"{srun} {quote_command(job.command)}", FINISH_LINES]
        return "\n".join(lines) + "\n"
    meeting = rendezvous(top.get("env_vars"), ranks=job.stage == "training")
    lines += ["", *meeting.lines, ""]
    srun = srun_prefix(job, cluster, container, mounts, exported_names("\n".join(lines)))
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
