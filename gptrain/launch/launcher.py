"""`gptrain launch`: compose, render, check, then run locally or submit to Slurm."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gptrain.errors import ConfigError, GptrainError, LaunchError
from gptrain.launch.additional_parameters import (
    NO_GPU,
    extra_options,
    gpus_asked_in_additional_parameters,
    left_out_reason,
    per_gpu_option,
)
from gptrain.launch.compose import CONFIG_ROOT, STAGES, compose
from gptrain.launch.container_env import own_value_note
from gptrain.launch.download import tokenizer_downloads
from gptrain.launch.key_types import switch_of
from gptrain.launch.live_jobs import blend_readers, cancel_never_starting, refuse_launch_into_live_run
from gptrain.launch.mounts import check_mount_dirs, make_mount_dirs
from gptrain.launch.preflight import (
    DEFAULT_MAX_ARRAY_SIZE,
    check_export_file,
    check_fresh_start,
    check_training_files,
    check_training_layout,
    check_wandb_key_file,
    max_array_size,
    requested_gpus_per_node,
)
from gptrain.launch.script_values import check_arguments
from gptrain.launch.shards import parse_shards
from gptrain.launch.stages import (
    LaunchPlan,
    build_plan,
    check_run_dirs,
    claim_run_dirs,
    config_path,
    dry_run_path,
    render_run_files,
    validate_training,
    write_files,
)
from gptrain.launch.tokenizer_preflight import check_tokenizer_files

if TYPE_CHECKING:
    from gptrain.config import TrainingConfig


def preflight(plan: LaunchPlan, dry_run: bool, training: TrainingConfig | None = None) -> list[str]:
    """File and layout checks always; cluster checks where Slurm answers (a dry run elsewhere skips them).

    Under --dry-run a failed check is a warning line and the scripts are still shown: a dry run
    is how one looks at the scripts before the data exists. Without it, the first failure stops.
    `training`: the training config as the job will load it (validate_training).
    """
    lines: list[str] = []
    stages = [job.stage for job in plan.jobs]
    fetched: dict[str, str] = {}  # tokenizer files the data preparation downloads: {path: URL}
    if "data_preparation" in stages:
        section = plan.configs["data_preparation"]
        count = len(parse_shards(section.get("shards") or []))
        job = plan.jobs[stages.index("data_preparation")]
        spread = (
            f" over {job.array} array tasks (the cluster's MaxArraySize)"
            if (job.array or count) < count
            else ""
        )
        lines.append(f"ok  data_preparation: {count} shard(s){spread}")
        fetched = tokenizer_downloads(section)
        lines += _checked(
            lambda: [
                check_tokenizer_files(section.get("tokenizer") or {}, "data_preparation.tokenizer", fetched)
            ],
            dry_run,
        )
    if training is not None:
        lines += _checked(lambda: check_training_layout(training), dry_run, (LaunchError, ConfigError))
        lines += _checked(
            lambda: check_training_files(
                training, "data_preparation" in stages, fetched, plan.training_blend
            ),
            dry_run,
        )
        lines += _checked(lambda: check_wandb_key_file(plan.top.get("wandb_api_key_file"), training), dry_run)
        lines += _checked(lambda: check_fresh_start(training), dry_run, (ConfigError,))
    lines += _checked(lambda: check_mount_dirs(plan.mount_dirs), dry_run)
    lines += stage_order_notes(list(plan.resolved.get("stages") or []))
    lines += launch_notes(plan, stages)
    if plan.cluster_type == "slurm":
        from gptrain.launch.executors.slurm import sbatch_variables_notes

        lines += sbatch_variables_notes(plan)
        lines += _checked(lambda: check_export_file(plan.cluster), dry_run)
        if dry_run and shutil.which("sinfo") is None:
            lines.append("skipped  cluster checks: no sinfo here")
        else:
            lines += _checked(lambda: _cluster_checks(plan, dry_run), dry_run)
    return lines


# Images of NeMo's launcher (NGC's nemo, bignlp, the tutorials' .sqsh of them): no gptrain inside.
NEMO_IMAGE_WORDS = ("nemo", "bignlp")


def launch_notes(plan: LaunchPlan, stages: list[str]) -> list[str]:
    """What a NeMo tree carries over that the user may not mean: its container, no requeues."""
    notes = list(plan.notes)
    container = str(plan.top.get("container") or "")
    if container and plan.cluster_type == "local":
        notes.append(
            f"note  container {container} is not used by cluster_type=local: the stages run here, with "
            f"{plan.jobs[0].command[0] if plan.jobs else 'this Python'}"
        )
    elif container and any(word in container.lower() for word in NEMO_IMAGE_WORDS):
        notes.append(
            f"note  container {container} looks like NeMo's image, which has no gptrain: the job runs "
            "`python -m gptrain` inside it; set container=null or an image with gptrain installed"
        )
    if plan.cluster_type == "slurm" and (own := own_value_note(plan.top, plan.cluster)) is not None:
        notes.append(own)
    exp_manager = (plan.configs.get("training") or {}).get("exp_manager") or {}
    saving = switch_of(exp_manager, "create_checkpoint_callback", True, "training.exp_manager")
    if (
        plan.cluster_type == "slurm"
        and "training" in stages
        and saving
        and not plan.cluster.get("max_requeues")
    ):
        value = plan.cluster.get("max_requeues")
        given = "unset (Slurm's own requeue is the site's)" if value is None else f"{value} (--no-requeue)"
        notes.append(
            f"note  training: cluster.max_requeues is {given}: a stop at the time limit checkpoints and ends "
            "the job without requeueing it; give +cluster.max_requeues=N to go on by itself"
        )
    return notes + no_gpus_asked_notes(plan) + left_out_without_gpus_notes(plan)


def stage_order_notes(stages: list[str]) -> list[str]:
    """NeMo submits the stages in the order listed, each after the one before; gptrain runs each once,
    data preparation before the validation and training that read its output: say so where the list
    reads otherwise (`stages=[training,data_preparation]`, a stage twice)."""
    run = [stage for stage in STAGES if stage in stages]
    if list(stages) == run:
        return []
    return [
        f"note  stages [{', '.join(map(str, stages))}] run as {', '.join(run)}: each stage runs once,"
        " after the ones it needs"
    ]


# Why a stage asks for no GPU, and what it gets in place of each per-GPU option left out of its script.
NO_GPU_REASONS = {
    "data_preparation": "it asks for no GPU",
    "validation": "training.trainer.accelerator=cpu asks for no GPU",
    "training": "training.trainer.accelerator=cpu asks for no GPU",
}
CPUS_PER_TASK_KEYS = {
    "data_preparation": "data_preparation.workers",
    "validation": "cluster.cpus_per_task",
    "training": "cluster.cpus_per_task",
}
INSTEAD_OF_PER_GPU = {
    ("data_preparation", "cpus-per-gpu"): "its CPUs per task are data_preparation.workers",
    ("validation", "cpus-per-gpu"): "its ranks' CPUs are cluster.cpus_per_task (one each where null)",
    ("training", "cpus-per-gpu"): "its ranks' CPUs are cluster.cpus_per_task (one each where null)",
}


def left_out_without_gpus_notes(plan: LaunchPlan) -> list[str]:
    """An extra option of the cluster file left out of a stage that asks for no GPU: said, as a cluster
    file that sets cpus_per_gpu or mem_per_gpu for the GPU training would otherwise seem to set it there too."""
    if plan.cluster_type != "slurm":
        return []
    notes = []
    for job in plan.jobs:
        for key, option, value in extra_options(plan.cluster):
            reason = (
                None
                if value is None
                else left_out_reason(option, job.gpus, plan.cluster, bool(job.cpus_per_task))
            )
            if reason is None:
                continue
            meant = per_gpu_option(option)
            instead = INSTEAD_OF_PER_GPU.get((job.stage, meant), "its memory is the partition's default")
            why = (
                f"{NO_GPU_REASONS[job.stage]} (sbatch refuses --{meant} without one)"
                if reason == NO_GPU
                else f"sbatch refuses --{meant} beside the --cpus-per-task that {CPUS_PER_TASK_KEYS[job.stage]}"
                f"={job.cpus_per_task} renders (Slurm 23.11+)"
            )
            notes.append(f"note  {job.stage}: {key}={value} is left out of its script: {why}; {instead}")
    return notes


def no_gpus_asked_notes(plan: LaunchPlan) -> list[str]:
    """A GPU training whose job asks Slurm for no GPU (a cluster file without gres, gpus_per_node=null):
    where Slurm constrains devices, its ranks see none and fail at start, after the queue wait."""
    if plan.cluster_type != "slurm":
        return []
    jobs = [job for job in plan.jobs if job.stage == "training" and job.gpus]
    if not jobs or requested_gpus_per_node(jobs[0], plan.cluster):
        return []
    if gpus_asked_in_additional_parameters(plan.cluster):
        return []
    return [
        f"note  training: training.trainer.accelerator is not cpu, but the job asks Slurm for no GPU"
        f" (cluster.gpus_per_node, cluster.gres and cluster.gpus_per_task are null or 0): where Slurm"
        f" constrains devices its {jobs[0].tasks_per_node} ranks per node see none; give"
        f" cluster.gpus_per_node={jobs[0].tasks_per_node} (CPU nodes: training.trainer.accelerator=cpu)"
    ]


def _checked(
    check: Callable[[], list[str]],
    dry_run: bool,
    errors: tuple[type[GptrainError], ...] = (LaunchError,),
) -> list[str]:
    """Run one check; under --dry-run its error (LaunchError, or those named) becomes a warning line."""
    try:
        return check()
    except errors as error:
        if not dry_run:
            raise
        return [f"warning  {error} (a real launch stops here)"]


def _cluster_checks(plan: LaunchPlan, dry_run: bool) -> list[str]:
    """sinfo checks; a dry run renders anyway when the controller does not answer."""
    from gptrain.launch.executors.slurm import preflight_cluster

    try:
        return preflight_cluster(plan)
    except LaunchError as error:
        if not dry_run or not str(error).startswith(("sinfo failed", "sinfo did not answer")):
            raise
        return [f"skipped  cluster checks: {error}"]


def array_limit(resolved: dict, dry_run: bool) -> int:
    """The cluster's MaxArraySize when a Slurm launch prepares data (asked only then: a controller
    that does not answer costs seconds); Slurm's default otherwise, as on a dry run away from it."""
    stages = resolved.get("stages") or []
    if resolved.get("cluster_type") != "slurm" or "data_preparation" not in stages:
        return DEFAULT_MAX_ARRAY_SIZE
    if dry_run and shutil.which("scontrol") is None:
        return DEFAULT_MAX_ARRAY_SIZE
    return max_array_size()


def blend_notes(plan: LaunchPlan, run_dirs: list[Path]) -> list[str]:
    """A data preparation's blend file that a live training of another run under base_results_dir
    reads: refused while one that has not started would read it, else noted (live_jobs.blend_readers)."""
    prep = plan.configs.get("data_preparation")
    if not prep or not (prep.get("blend") or {}).get("file"):
        return []
    return blend_readers(str(prep["blend"]["file"]), Path(str(plan.resolved["base_results_dir"])), run_dirs)


def summary(plan: LaunchPlan, scripts: list[Path]) -> list[str]:
    """Per stage: the written script and config (the dry run's copies) and the script's key lines."""
    lines = []
    for job, script in zip(plan.jobs, scripts, strict=True):
        lines.append(f"{job.stage}: {script}")
        lines.append(f"  config: {dry_run_path(config_path(job))}")
        text = script.read_text().split("\n")  # bash's lines (a value may hold \x85 or \u2028)
        lines += [f"  {line}" for line in text if line.startswith(("#SBATCH", "srun", "exec"))]
    return lines


def tree_options(root: Path | None, config_name: str) -> list[str]:
    """The options that chose the conf tree, for launcher_cmd.log: the recorded command composes
    the same config when run again (from the launch's directory, for relative overrides)."""
    options = []
    if root is not None and root.resolve() != CONFIG_ROOT.resolve():
        options += ["--config-dir", str(root.resolve())]
    if config_name != "config":
        options += ["--config-name", config_name]
    return options


def launch(
    argv: list[str],
    dry_run: bool = False,
    echo: bool = True,
    root: Path | None = None,
    config_name: str = "config",
) -> int:
    """Compose, plan, render and check everything in memory, then write and run or submit.

    Nothing is written before every check passed. A dry run writes its files under each run
    directory's `dry-run/` (the scripts as a launch would write them, marked as a preview), so it never
    touches the files of a run that is live there (a requeued job re-reads its _hydra.yaml).
    """
    check_arguments(argv)
    composition = compose(argv, root or CONFIG_ROOT, config_name=config_name)
    plan = build_plan(composition, array_limit(composition.resolved(), dry_run))
    files = render_run_files(plan, [*tree_options(root, config_name), *argv])
    training = validate_training(plan, files)
    check_run_dirs(plan, dry_run)
    for line in preflight(plan, dry_run, training):
        print(f"preflight: {line}", file=sys.stderr)
    run_dirs = sorted({job.run_dir for job in plan.jobs})
    if dry_run:
        try:
            refuse_launch_into_live_run(run_dirs)
            for line in blend_notes(plan, run_dirs):
                print(f"dry run: note: {line}", file=sys.stderr)
            for line in cancel_never_starting(run_dirs, dry_run=True):
                print(f"dry run: {line}", file=sys.stderr)
        except LaunchError as error:
            print(f"dry run: the launch itself would be refused: {error}", file=sys.stderr)
        scripts = write_files(files, dry_run=True)
        print("\n".join(["dry run: nothing submitted; rendered:"] + summary(plan, scripts)))
        return 0
    refuse_launch_into_live_run(run_dirs)  # before anything is written
    for line in blend_notes(plan, run_dirs):
        print(f"gptrain: note: {line}", file=sys.stderr)
    if plan.cluster_type == "slurm":  # a cancel that fails (another user's job) leaves nothing written
        for line in cancel_never_starting(run_dirs):
            print(f"gptrain: {line}", file=sys.stderr)
    claim_run_dirs(plan)  # unique_output: a launch started in the same second took none of them
    make_mount_dirs(plan.mount_dirs)  # a directory that cannot be made leaves nothing written
    write_files(files)
    if plan.cluster_type == "slurm":
        from gptrain.launch.executors.slurm import submit

        submit(plan)
        return 0
    from gptrain.launch.executors.local import run

    return run(plan, echo)
