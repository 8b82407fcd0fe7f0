"""The `validation` stage: `gptrain validate` as a job sized like the training it guards.

It runs in the training's run directory (so `gptrain status` shows both stages) and writes
its reports under `<run dir>/validation/`. Its resolved config carries the cluster file's
thresholds, and the job reads them back with `--profile <that file>`, so a `cluster.validation.*`
override on the launch line reaches the check. Nodes a failed validation blames can be kept
for later launches in `validation.exclude_file`, merged here into `cluster.exclude`.
No torch here: this runs on login nodes.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from pathlib import Path
from typing import Any

from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.key_types import not_a_float, type_name
from gptrain.launch.sbatch import Job, rank_command
from gptrain.launch.script_quoting import dash_safe
from gptrain.utils.hostlist import read_hostlist_file
from gptrain.utils.paths import look_up

VALIDATION_DIR = "validation"
CHECKS = ("collectives", "pairwise", "gpus", "all")
# validation.<key> -> `gptrain validate` option, for the keys that are passed when set
OPTIONS = {
    "min_bytes": "--min-bytes",
    "max_bytes": "--max-bytes",
    "iters": "--iters",
    "warmup": "--warmup",
    "pair_bytes": "--pair-bytes",
    "min_busbw_GBps": "--min-busbw-GBps",
    "dcgm_level": "--dcgm-level",
    "xid_since": "--xid-since",
}


def stage_config(section: dict[str, Any], cluster: dict[str, Any]) -> dict[str, Any]:
    """What the job's `<name>_hydra.yaml` holds: the stage's keys, the cluster's thresholds and its
    GPUs a node (the node the inter-node threshold is set for: fewer ranks a node scale it)."""
    from gptrain.launch.sbatch_directives import node_gpus

    return {
        **section,
        "thresholds": dict(cluster.get("validation") or {}),
        "gpus_per_node": node_gpus(cluster),
    }


def validation_job(
    section: dict[str, Any],
    training: dict[str, Any],
    cluster: dict[str, Any],
    python: str,
    local: bool,
    run: tuple[str, Path],
) -> Job:
    """The job: same nodes, processes per node and accelerator as the training."""
    name, run_dir = run
    trainer = training.get("trainer") or {}
    devices, nodes = int(trainer.get("devices", 1)), int(trainer.get("num_nodes", 1))
    check = str(section.get("checks") or "all")
    if check not in CHECKS:
        raise ConfigError(f"validation.checks={check!r}: choose one of {', '.join(CHECKS)}")
    if local and nodes != 1:
        raise LaunchError(
            f"training.trainer.num_nodes={nodes}: the local executor validates one node;"
            " set cluster_type=slurm or training.trainer.num_nodes=1"
        )
    check_validation_section(section, cluster)
    stage_name = f"{name}_validation"
    prefix = cluster.get("job_name_prefix") or ""
    job = Job(
        "validation", stage_name, f"{prefix}{stage_name}", run_dir, [], nodes=nodes, tasks_per_node=devices
    )
    job.gpus = trainer.get("accelerator", "auto") != "cpu"
    # the training's ranks' CPUs, as NeMo renders cpus_per_task for every job
    job.cpus_per_task = cluster.get("cpus_per_task")
    job.time_limit = (section.get("run") or {}).get("time_limit")
    if job.gpus and check in ("gpus", "all"):  # where dcgmi runs
        check_time_for_dcgmi(section, int(section.get("dcgm_level") or 0))
    job.workdir = str(Path.cwd())
    config = job.config_path
    args = ["-m", "gptrain", "validate", check, "--output-dir", str(run_dir / VALIDATION_DIR)]
    args += ["--profile", str(config)]
    for key, option in OPTIONS.items():
        if section.get(key) is not None:
            args += [option, str(section[key])]
    if job.gpus:
        args.append("--expect-gpus")
    if section.get("exclude_failed"):
        args += ["--exclude-file", dash_safe(str(section.get("exclude_file") or ""))]
    job.command = rank_command(python, args, devices, local)
    return job


def check_validation_section(section: dict[str, Any], cluster: dict[str, Any]) -> None:
    """What the job's `gptrain validate` would refuse at its start, after the queue wait: an option
    value, a threshold of cluster.validation, an exclude_file it cannot use."""
    from gptrain.validate.bandwidth import size_sweep
    from gptrain.validate.cli import OPTION_TYPES
    from gptrain.validate.thresholds import threshold_values

    parsed = {}
    for key, option in OPTIONS.items():
        if section.get(key) is not None:
            try:
                parsed[key] = OPTION_TYPES[option](str(section[key]))
            except ArgumentTypeError as error:
                raise ConfigError(f"validation.{key}={section[key]!r}: {error}") from None
    if "min_bytes" in parsed and "max_bytes" in parsed:
        try:
            size_sweep(parsed["min_bytes"], parsed["max_bytes"])
        except ValueError:
            raise ConfigError(
                f"validation.min_bytes={section['min_bytes']!r} is above validation.max_bytes="
                f"{section['max_bytes']!r}; lower min_bytes or raise max_bytes"
            ) from None
    threshold_values(dict(cluster.get("validation") or {}), "", prefix="cluster.validation.")
    if section.get("exclude_failed") and not section.get("exclude_file"):
        raise ConfigError(
            "validation.exclude_failed=true needs validation.exclude_file: the file the blamed nodes"
            " go to (e.g. ${base_results_dir}/exclude_nodes.txt)"
        )


# What a `dcgmi diag -r LEVEL` may take (NVIDIA's figures: level 3 15 to 30 minutes, level 4 an
# hour or more; gptrain.validate.gpus has its limits)
DCGM_LEAST_S = {3: 30 * 60, 4: 60 * 60}


def check_time_for_dcgmi(section: dict[str, Any], level: int) -> None:
    """A validation job whose time limit ends before its dcgmi level usually does: Slurm would kill
    it midway, and the training waiting on it (afterok) would never start."""
    from gptrain.launch.key_types import slurm_time_seconds

    least = DCGM_LEAST_S.get(min(level, 4))
    time_limit = (section.get("run") or {}).get("time_limit")
    limit = slurm_time_seconds(time_limit)
    if least and limit is not None and limit <= least:
        raise ConfigError(
            f"validation.dcgm_level={level} may take {least // 60} minutes or more, and"
            f" validation.run.time_limit={time_limit} ends the job by then (the training waiting on it"
            " would never start): give a longer time limit or a lower dcgm_level"
        )


def read_exclude_file(path: object, key: str = "validation.exclude_file") -> str | None:
    """The host list a failed validation left for later launches, or None; one that is a directory
    or does not parse is a ConfigError naming `key` (the key or flag that gave it), as is one under
    a directory this user may not search (Path.exists raised PermissionError there, said as a bare
    '<path>: Permission denied')."""
    if isinstance(path, bool) or not isinstance(path, str | int | float | None):  # a YAML int names a file
        raise ConfigError(f"{key}: expected a file name, got {type_name(path)}")
    not_a_float(key, path)
    path = None if path is None else str(path)
    if path and "\x00" in str(path):  # no file can have that name, and bash drops it from the script
        raise ConfigError(f"{key}: the path {str(path)!r} contains a NUL byte; give the file's real name")
    found = look_up(path) if path else None
    if found is None or found.kind == "missing":
        return None
    if found.kind == "unreachable":
        raise ConfigError(f"{key} {path}: {found.why}")
    if found.kind == "directory":
        raise ConfigError(
            f"{key} {path}: is a directory; give a file name (the nodes a failed"
            " validation blames go there, one Slurm host list)"
        )
    return read_hostlist_file(Path(path), key) or None


def apply_exclude_file(cluster: dict[str, Any], validation: dict[str, Any] | None) -> str | None:
    """Merge validation.exclude_file into cluster['exclude']; return the nodes added, if any."""
    added = read_exclude_file((validation or {}).get("exclude_file"))
    if added:
        current = cluster.get("exclude")
        cluster["exclude"] = f"{current},{added}" if current else added
    return added
