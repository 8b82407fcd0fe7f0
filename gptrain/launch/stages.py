"""Turn a composed launch config into Jobs (one per stage) and their files in the run dirs.

Each stage's directory follows the NeMo launcher: `<base_results_dir>/<run.name>/` with the
resolved config `<name>_hydra.yaml`, the script `<prefix><name>_submission.sh`,
`launcher_cmd.log` (the command that launched it) and `launcher.log` (job ids, JSON lines).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.config.yamlio import dump_config
from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.additional_parameters import check_data_preparation_cpus
from gptrain.launch.compose import Composition, group_file
from gptrain.launch.gres import gres_gpus
from gptrain.launch.mounts import container_mounts, with_absolute_paths
from gptrain.launch.preflight import DEFAULT_MAX_ARRAY_SIZE
from gptrain.launch.sbatch import Job, rank_command, render_local, render_slurm
from gptrain.launch.script_quoting import Raw, dash_safe
from gptrain.launch.script_values import check_launch_values
from gptrain.launch.sections import check_launch_sections
from gptrain.launch.validation_stage import apply_exclude_file, stage_config, validation_job
from gptrain.utils.atomic import atomic_write_text
from gptrain.utils.paths import directory_blocker, look_up

if TYPE_CHECKING:
    from gptrain.config import TrainingConfig

# A dry run writes its files here, inside each stage's run directory (see dry_run_path).
DRY_RUN_DIR = "dry-run"
# The line after a dry run's script's shebang; an earlier preview is known by it.
PREVIEW_NOTE = "# gptrain launch --dry-run: a preview, not for sbatch."


@dataclass
class LaunchPlan:
    """Everything a launch needs: resolved sections, jobs in stage order, their configs."""

    resolved: dict[str, Any]
    cluster: dict[str, Any]
    top: dict[str, Any]
    jobs: list[Job] = field(default_factory=list)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> resolved section
    # (key, host dir) of each directory gptrain mounts into the container: made before writing
    mount_dirs: list[tuple[str, str]] = field(default_factory=list)
    training_overrides: dict[str, str] = field(default_factory=dict)  # key in training -> as typed
    training_origin: str | None = None  # the training group file, named by errors about its values
    notes: list[str] = field(default_factory=list)  # preflight lines about what the plan decided
    # the blend file data preparation writes, which the training reads in place of its data_prefix
    training_blend: str | None = None

    @property
    def cluster_type(self) -> str:
        return str(self.resolved["cluster_type"])


def build_plan(composition: Composition, max_array_size: int = DEFAULT_MAX_ARRAY_SIZE) -> LaunchPlan:
    """`max_array_size`: the cluster's MaxArraySize (preflight.max_array_size), which bounds the data
    preparation's array."""
    resolved = composition.resolved()
    check_launch_values(resolved)  # before anything is written: no newline reaches a script
    check_launch_sections(
        resolved, composition.interpolated_roots(), composition.source_of
    )  # types of the keys read below
    if resolved.get("container") and resolved["cluster_type"] != "local":
        resolved = with_absolute_paths(resolved)  # pyxis starts in the image's WORKDIR, not --chdir's
    # In a container the launching interpreter's path means nothing: use the image's python. The
    # local executor runs no container (a NeMo tree names one): the launching interpreter there.
    in_container = bool(resolved.get("container")) and resolved["cluster_type"] != "local"
    python = str(resolved.get("python") or ("python" if in_container else sys.executable))
    cluster = dict(resolved.get("cluster") or {})
    top = {**resolved, "env_vars": job_environment(cluster.get("env_vars"), resolved.get("env_vars"))}
    apply_exclude_file(cluster, resolved.get("validation"))  # nodes a failed validation blamed
    plan = LaunchPlan(
        resolved,
        cluster,
        top,
        training_overrides=composition.training_overrides(),
        training_origin=composition.origin("training"),
        notes=nested_copy_notes(composition),
    )
    stages = list(resolved["stages"])
    local = resolved["cluster_type"] == "local"
    if resolved.get("container") and not local:  # the jobs' own dirs first, then container_mounts
        mounts = container_mounts(resolved, composition.config_root)
        top["container_mounts"], plan.mount_dirs = mounts.items, mounts.added
    if "data_preparation" in stages:
        plan.configs["data_preparation"] = resolved["data_preparation"]
        prep = data_preparation_job(resolved["data_preparation"], cluster, python, local, max_array_size)
        plan.jobs.append(prep)
    if "validation" in stages:  # after data preparation, right before the training it guards
        add_validation_job(plan, python, local)
    if "training" in stages:
        training = resolved["training"]
        plan.training_blend = training_blend(resolved, stages, plan.notes)
        plan.configs["training"] = training
        plan.jobs.append(training_job(training, cluster, python, local, plan.training_blend))
    if not local:
        for job in plan.jobs:
            check_one_gpu_per_task(job, cluster)
        for before, job in zip(plan.jobs, plan.jobs[1:], strict=False):
            check_dependency_joins(job, before)
    return plan


def nested_copy_notes(composition: Composition) -> list[str]:
    """`cp -R conf.template/cluster conf/cluster` (as one tutorial copies its bcm.yaml) puts the copy
    inside the existing directory, where `cluster=bcm` never reads it: said where that file differs."""
    notes = []
    for group, choice in composition.choices.items():
        read = group_file(group, choice, composition.config_root)
        nested = composition.config_root / group / group / f"{choice}.yaml"
        if nested != read and look_up(nested).kind == "file" and nested.read_bytes() != read.read_bytes():
            notes.append(
                f"note  {group}={choice} reads {read}; {nested} beside it differs (`cp -R` of a {group}/"
                f" directory onto the existing one puts the copy inside it): copy that file over"
                f" {group}/{choice}.yaml, or pick {group}={group}/{choice}"
            )
    return notes


def job_environment(profile: dict[str, Any] | None, given: dict[str, Any] | None) -> dict[str, Any]:
    """cluster.env_vars, then the top-level env_vars over it. A null there is "not set by this file",
    as NeMo renders nothing for one: its config.yaml ships NCCL_TOPO_FILE, NCCL_IB_TIMEOUT, ... as
    null, which must not wipe the profile's interconnect settings. Removing a profile's variable is
    `cluster.env_vars.NAME=null` (or `~cluster.env_vars.NAME`). The profile's variables the user
    does not set come first, then the user's in the user's order: one that overrides the profile's
    kept the profile's place, so a `$IFACE` in it read an IFACE the user set before it unset."""
    set_here = {name: value for name, value in (given or {}).items() if value is not None}
    env = {name: value for name, value in (profile or {}).items() if name not in set_here}
    env.update(set_here)
    return env


def check_dependency_joins(job: Job, before: Job) -> None:
    """A later stage's run.dependency is joined to the afterok on the stage before it with ',' (all of
    them); Slurm refuses a list mixing ',' with '?' (any of them), which sbatch said only once the
    earlier stages were queued."""
    if job.dependency and "?" in str(job.dependency):
        raise ConfigError(
            f"{job.stage}.run.dependency={job.dependency!r}: '?' (any of) cannot be joined to the afterok on"
            f" the {before.stage} stage this launch adds (Slurm takes one kind of separator in a"
            f" dependency); use ',' (all of), or launch the {job.stage} stage on its own (stages=[{job.stage}])"
        )


def training_blend(resolved: dict[str, Any], stages: list[str], notes: list[str]) -> str | None:
    """The blend file the training reads in place of its data_prefix after data preparation (every
    prepared shard, weighted by data_preparation.blend.weights), or None: the training's own
    data_prefix names only prepared shards (all or some), and its weights are the user's (the NeMo tutorial's
    [0.5, my-gpt3_00, 0.5, my-gpt3_01], as NeMo reads it). A data_prefix replaced is said in a note."""
    if "data_preparation" not in stages:
        return None
    from gptrain.data.blend_spec import prefixes_of, strip_suffix
    from gptrain.launch.shards import parse_shards
    from gptrain.launch.tokenize_step import output_prefix

    prep, data = resolved["data_preparation"], resolved["training"].get("model", {}).get("data", {})
    prepared = {
        os.path.abspath(output_prefix(prep, shard)) for shard in parse_shards(prep.get("shards") or [])
    }
    own = {os.path.abspath(strip_suffix(str(p))) for p in prefixes_of(data.get("data_prefix"))}
    if own and own <= prepared:  # every prefix it names is prepared here: read as written
        return None
    others = own - prepared
    if others and data.get("data_impl") != "mock":
        weights = {"tokens": "weighted by tokens", "equal": "weighted equally"}.get(
            prep["blend"].get("weights"), ""
        )
        notes.append(
            f"note  training: reads the blend data_preparation writes ({prep['blend']['file']}, {weights}),"
            f" not training.model.data.data_prefix, which names {len(others)} prefix(es) data_preparation"
            " does not write"
        )
    return str(prep["blend"]["file"])


def check_one_gpu_per_task(job: Job, cluster: dict[str, Any]) -> None:
    """srun starts trainer.devices tasks per node, one per GPU: more tasks than the node's GPUs
    would only fail after the queue wait ("invalid device ordinal")."""
    if not job.gpus or job.stage not in ("training", "validation"):
        return
    for key, gpus in (
        ("cluster.gpus_per_node", int(cluster.get("gpus_per_node") or 0)),
        ("cluster.gres", gres_gpus(cluster.get("gres")) or 0),
        ("cluster.gpus_per_task", int(cluster.get("gpus_per_task") or 0) * job.tasks_per_node),
    ):
        if gpus:  # the first of these that is set is what each node gives the job
            if job.tasks_per_node > gpus:
                raise ConfigError(
                    f"training.trainer.devices={job.tasks_per_node} tasks per node, but {key} gives"
                    f" {gpus} GPUs per node (one task per GPU); lower training.trainer.devices or"
                    f" raise {key} (CPU nodes: training.trainer.accelerator=cpu)"
                )
            return


def add_validation_job(plan: LaunchPlan, python: str, local: bool) -> None:
    section, training = plan.resolved["validation"], plan.resolved["training"]
    plan.configs["validation"] = stage_config(section, plan.cluster)
    run = stage_run(training, "training")  # in the training's run dir: one status for both
    plan.jobs.append(validation_job(section, training, plan.cluster, python, local, run))


def job_name(cluster: dict[str, Any], run_name: str) -> str:
    return f"{cluster.get('job_name_prefix') or ''}{run_name}"


def stage_run(section: dict[str, Any], stage: str) -> tuple[str, Path]:
    run = section.get("run") or {}
    name, results_dir = run.get("name"), run.get("results_dir")
    for key, value in (("name", name), ("results_dir", results_dir)):
        if not value:
            raise ConfigError(f"{stage}.run.{key} is empty: set it (it names the run's directory and job)")
    if "/" in str(name) or str(name) in (".", ".."):
        raise ConfigError(
            f"{stage}.run.name '{name}' must not contain '/' or be '.' or '..'"
            " (it names the run's directory under base_results_dir, its files and jobs)"
        )
    # absolute: the job starts in the launch's directory anyway, and a relative `-r` would be an
    # option to bash, sbatch and each command that names a file of it
    return str(name), Path(os.path.abspath(str(results_dir)))


def config_path(job: Job) -> Path:
    return job.config_path


def rank_cpus(cluster: dict[str, Any]) -> int | None:
    """The CPUs of each training rank (its data loader's too): cluster.cpus_per_task, NeMo's
    SlurmLauncher --cpus-per-task, for the training and for what runs its step (plan's trials);
    None: Slurm's one CPU per task."""
    return cluster.get("cpus_per_task")


def training_job(
    training: dict[str, Any], cluster: dict[str, Any], python: str, local: bool, blend: str | None
) -> Job:
    name, run_dir = stage_run(training, "training")
    trainer = training.get("trainer") or {}
    devices, nodes = int(trainer.get("devices", 1)), int(trainer.get("num_nodes", 1))
    job = Job("training", name, job_name(cluster, name), run_dir, [], nodes=nodes, tasks_per_node=devices)
    job.gpus = trainer.get("accelerator", "auto") != "cpu"
    job.time_limit = (training.get("run") or {}).get("time_limit")
    job.dependency = (training.get("run") or {}).get("dependency")
    job.requeue = True
    job.cpus_per_task = rank_cpus(cluster)
    job.workdir = str(Path.cwd())
    train = ["-m", "gptrain", "train", "--config-file", str(config_path(job))]
    if local and nodes != 1:
        raise LaunchError(
            f"training.trainer.num_nodes={nodes}: the local executor runs one node;"
            " set cluster_type=slurm or training.trainer.num_nodes=1"
        )
    job.command = rank_command(python, train, devices, local)
    job.blend = blend
    if blend:
        apply = [
            "-m",
            "gptrain.launch.download",
            "apply-blend",
            "--blend",
            dash_safe(blend),
            "--config",
            str(config_path(job)),
        ]
        if not local:  # a requeue runs the script again: it reads the copy the first start took
            apply += ["--frozen", str(job.frozen_blend_path)]
        job.setup.append([python, *apply])
    return job


def tokenizer_workers(value: Any) -> int | str:
    """data_preparation.workers (checked by gptrain.launch.sections): a count, 1 when unset, or
    `auto` (every CPU the task is given, as NeMo's `--workers $SLURM_CPUS_ON_NODE`)."""
    if value is None:
        return 1
    return "auto" if str(value).strip().lower() == "auto" else int(value)


def data_preparation_job(
    section: dict[str, Any],
    cluster: dict[str, Any],
    python: str,
    local: bool,
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE,
) -> Job:
    """One array task per shard; past the cluster's MaxArraySize, task i prepares shards i, i + n, ...
    of n tasks. data_preparation.run.node_array_size (NeMo's key) caps the tasks running at once."""
    name, run_dir = stage_run(section, "data_preparation")
    shards = section.get("shards") or []
    if not shards:
        raise ConfigError(
            "data_preparation.shards is empty: list the shard URLs"
            " (e.g. 'data_preparation.shards=[https://host/a.jsonl.zst]')"
        )
    job = Job("data_preparation", name, job_name(cluster, name), run_dir, [])
    workers = tokenizer_workers(section.get("workers"))
    job.cpus_per_task, job.all_node_cpus = (None, True) if workers == "auto" else (workers, False)
    check_data_preparation_cpus(cluster, job.cpus_per_task)
    job.time_limit = (section.get("run") or {}).get("time_limit")
    job.dependency = (section.get("run") or {}).get("dependency")  # NeMo's Pile config: singleton
    job.workdir = str(Path.cwd())
    base = [python, "-m", "gptrain.launch.download"]
    if local:
        job.command = [*base, "all", "--config", str(config_path(job))]
    else:
        if max_array_size < 1:
            raise LaunchError(
                "data_preparation: this Slurm cluster allows no job arrays (MaxArraySize=0 in `scontrol show"
                " config`); prepare the shards with cluster_type=local, or ask its admins for MaxArraySize"
            )
        job.array = min(len(shards), max_array_size)
        job.array_throttle = (section.get("run") or {}).get("node_array_size")
        job.command = [
            *base,
            "shard",
            "--config",
            str(config_path(job)),
            "--index",
            Raw('"$SLURM_ARRAY_TASK_ID"'),
        ]
        if job.array < len(shards):
            job.command += ["--stride", str(job.array)]
    return job


@dataclass
class RunFile:
    """One file a launch writes, rendered in memory first so that nothing is written before it is checked."""

    path: Path
    text: str
    executable: bool = False


def render_run_files(plan: LaunchPlan, argv: list[str]) -> list[RunFile]:
    """Each stage's resolved config, script and launcher_cmd.log (`gptrain launch ARGV`), in memory."""
    command_line = " ".join(shlex.quote(a) for a in ["gptrain", "launch", *argv])
    files = []
    for job in plan.jobs:
        section = plan.configs[job.stage]
        # the training reads its config with OmegaConf (the others with plain YAML)
        config = dump_config(as_omegaconf_text(section) if job.stage == "training" else section)
        if plan.cluster_type == "slurm":
            script = render_slurm(job, plan.cluster, plan.top)
        else:
            script = render_local(job, plan.top)
        files.append(RunFile(config_path(job), config))
        files.append(RunFile(job.script_path, script, executable=True))
        files.append(RunFile(job.run_dir / "launcher_cmd.log", command_line + "\n"))
    return files


# `${`, with the backslashes right before it: OmegaConf reads `\${` as text, `\\` there as `\`.
INTERPOLATION_START = re.compile(r"(\\*)\$\{")


def as_omegaconf_text(value: Any) -> Any:
    """`value` (resolved: a `${` left in it is text the user escaped) written so that OmegaConf,
    which the training reads its config with, reads back this text and resolves nothing."""
    if isinstance(value, dict):
        return {key: as_omegaconf_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_omegaconf_text(item) for item in value]
    if isinstance(value, str):
        return INTERPOLATION_START.sub(lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", value)
    return value


def dry_run_path(path: Path) -> Path:
    """Where a dry run puts a run file: `<run dir>/dry-run/<name>`, never over a live run's files."""
    return path.parent / DRY_RUN_DIR / path.name


def preview_note(script: str) -> str:
    """A dry run's script, said to be a preview after its header: it names the live run's config,
    which only a launch writes, so `sbatch` on this copy would fail at the job's start."""
    head, sep, rest = script.partition("\n")  # the shebang stays first
    note = (
        f"{PREVIEW_NOTE} It reads the config a launch writes;"
        " submit with the same gptrain launch command without --dry-run.\n"
    )
    return head + sep + note + rest


# The key that names each stage's run directory (the validation job runs in the training's).
RUN_DIR_KEYS = {
    "data_preparation": "data_preparation.run.results_dir",
    "validation": "training.run.results_dir",
    "training": "training.run.results_dir",
}


def check_run_dirs(plan: LaunchPlan, dry_run: bool = False) -> None:
    """Each stage's run directory can be made and written (a dry run writes under it too): a file
    or a read-only directory there is one line naming the key, not an OSError from deep inside."""
    for job in plan.jobs:
        why = directory_blocker(job.run_dir / DRY_RUN_DIR if dry_run else job.run_dir, must_write=True)
        if why:
            key = RUN_DIR_KEYS[job.stage]
            raise LaunchError(
                f"{key}: cannot write the run directory {job.run_dir} ({why});"
                f" set base_results_dir or {key} to a directory you can write"
            )


def write_files(files: list[RunFile], dry_run: bool = False) -> list[Path]:
    """Write the rendered files (under dry-run/ for a dry run); return the scripts' paths."""
    scripts = []
    if dry_run:
        clear_earlier_previews({dry_run_path(file.path) for file in files})
    for file in files:
        path = dry_run_path(file.path) if dry_run else file.path
        path.parent.mkdir(parents=True, exist_ok=True)
        text = preview_note(file.text) if dry_run and file.executable else file.text
        atomic_write_text(path, text)
        if file.executable:
            path.chmod(0o755)
            scripts.append(path)
    return scripts


def clear_earlier_previews(previews: set[Path]) -> None:
    """A dry-run/ folder shows what this launch would submit: an earlier dry run's files there (a
    stage this launch does not run) read as part of it, told apart only by their times. Only what a
    dry run writes goes (a config, a script carrying the preview note); a user's own file stays."""
    for folder in {path.parent for path in previews}:
        if folder.is_dir() and not folder.is_symlink():
            for old in folder.iterdir():
                if old not in previews and is_earlier_preview(old):
                    old.unlink(missing_ok=True)


def is_earlier_preview(path: Path) -> bool:
    """A file a dry run wrote: `<name>_hydra.yaml`, launcher_cmd.log, or a script with the preview note."""
    if not path.is_file() or path.is_symlink():
        return False
    if path.name == "launcher_cmd.log" or path.name.endswith("_hydra.yaml"):
        return True
    if not path.name.endswith("_submission.sh"):
        return False
    with open(path, encoding="utf-8", errors="replace") as script:
        return PREVIEW_NOTE in script.read(4096)


def write_run_files(plan: LaunchPlan, argv: list[str], dry_run: bool = False) -> list[Path]:
    """Render and write each stage's resolved config, script and launcher_cmd.log; return the scripts."""
    return write_files(render_run_files(plan, argv), dry_run)


def claim_run_dirs(plan: LaunchPlan) -> None:
    """unique_output=true chose directory names that did not exist when the config was composed;
    two launches started together (a sweep run in the background) may have chosen the same. Each
    directory is created here, exclusively, before anything is written: the second launch stops
    instead of sharing the first's."""
    if not plan.resolved.get("unique_output"):
        return
    for run_dir in sorted({job.run_dir for job in plan.jobs}):  # a parent before a directory in it
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()
        except FileExistsError:
            raise LaunchError(
                f"{run_dir}: another launch took this directory after this one chose it "
                "(unique_output=true, launches in the same second); launch again"
            ) from None


def validate_training(plan: LaunchPlan, files: list[RunFile]) -> TrainingConfig | None:
    """Check the training config the job will read, as written, with the training loader (no torch);
    return it (None without a training stage) for the preflight's file and layout checks."""
    from gptrain.config import load_training_config

    texts = {file.path: file.text for file in files}
    for job in plan.jobs:
        if job.stage == "training":
            path = config_path(job)
            return load_training_config(
                config_file=str(path),
                config_text=texts[path],
                given=plan.training_overrides,
                origin=plan.training_origin,  # the config file itself is not written yet
            )
    return None
