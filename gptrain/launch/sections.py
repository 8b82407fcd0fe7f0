"""Types of the launch config's own keys, checked once right after composing.

The training section is checked by the training loader (it knows the full schema), but the
launcher reads a few keys itself before that (`training.trainer.devices`, `cluster.srun_args`,
`cluster.signal_seconds`, ...) and renders others into scripts. A wrong type there would be a
traceback, a script Slurm rejects after the job queued, or a string iterated as characters
(`--container-mounts=/,d,a,...`). Each key below gets one ConfigError naming it and what it
expects; a single string where a list is expected is a one-item list.
The checks of single keys live in key_types.py, srun_args.py and additional_parameters.py;
this module says which key gets which.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from gptrain.errors import ConfigError
from gptrain.launch.additional_parameters import NEMO_SBATCH_KEYS, additional_parameters, check_extra_options
from gptrain.launch.key_types import (
    blend_weights,
    boolean,
    count,
    count_given,
    directory,
    env_vars,
    exclusive,
    mapping,
    memory,
    non_negative,
    path_name,
    scalar,
    seconds,
    shard_list,
    signal_seconds,
    slurm_time,
    timeout_seconds,
    type_name,
    words,
    workers,
)
from gptrain.launch.srun_args import check_one_container_image, command_words

Check = Callable[[str, Any], Any]  # (dotted key, value) -> the value to keep, or ConfigError


TOP: dict[str, Check] = {
    "base_results_dir": path_name,
    "data_dir": path_name,
    "python": scalar,
    "container": scalar,
    "container_mounts": words,
    "wandb_api_key_file": path_name,
    "env_vars": env_vars,
    "unique_output": boolean,  # compose reads it first (compose.unique_output)
}
CLUSTER: dict[str, Check] = {
    "partition": scalar,
    "account": scalar,
    "qos": scalar,
    "reservation": scalar,
    "constraint": scalar,
    "nodelist": scalar,
    "exclude": scalar,
    "gres": scalar,
    "mem": memory,
    "job_name_prefix": scalar,
    "exclusive": exclusive,
    "overcommit": boolean,  # bignlp-scripts 22.x's bcm.yaml
    "stderr_to_stdout": boolean,
    "gpus_per_node": non_negative,
    "gpus_per_task": non_negative,
    "cpus_per_task": count,  # NeMo's SlurmLauncher: the training's and validation's --cpus-per-task
    "srun_args": command_words,
    "container_env": boolean,  # pyxis's --container-env naming the exported variables (container_env.py)
    "signal_seconds": signal_seconds,
    "max_requeues": non_negative,
    "env_vars": env_vars,
    "additional_parameters": additional_parameters,
    **NEMO_SBATCH_KEYS,  # NeMo's SlurmLauncher renders them
    "validation": mapping,
}
RUN: dict[str, Check] = {
    "name": path_name,  # the default results_dir is ${base_results_dir}/${.name}
    "results_dir": path_name,
    "time_limit": slurm_time,
    "dependency": scalar,
}
STAGE: dict[str, dict[str, Check]] = {
    "training": {"trainer": mapping, "trainer.num_nodes": count_given, "trainer.devices": count_given},
    "data_preparation": {
        "shards": shard_list,
        "download_dir": directory,
        "output_dir": directory,
        "tokenizer": mapping,
        "workers": workers,
        "blend": mapping,
        "blend.weights": blend_weights,
        "run.node_array_size": count,
        "retries": non_negative,  # attempts; 0 makes one, as 1 does
        "backoff_seconds": seconds,
        "timeout_seconds": timeout_seconds,
        "extract": boolean,
        "keep_compressed": boolean,
        "keep_extracted": boolean,
        "append_eod": boolean,
    },
    "validation": {"checks": scalar, "exclude_failed": boolean},
}


# A top-level key in capitals that no interpolation reads is an environment variable (NCCL_TOPO_FILE).
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]+")

# Every top-level key the launcher reads (TOP's, the stage switches and paths, the group sections).
# Any other is left alone, as a root the user interpolates from (`${my_root}/data`) may be, unless
# it is a letter or two from one of these: `env_var:` for env_vars would export nothing, unseen.
TOP_READ = (
    *TOP, "stages", "cluster_type", "launcher_scripts_path", "bignlp_path",
    "cluster", "data_preparation", "validation", "training",
)  # fmt: skip


def _check_misspelt_top_keys(resolved: dict[str, Any], roots: set[str]) -> None:
    """`roots`: the top-level keys an interpolation reads (`${data_dir2}/x`): kept, however close."""
    unread = [key for key in resolved if key not in TOP_READ and key not in roots]
    for key in unread:
        close = difflib.get_close_matches(str(key), TOP_READ, n=1, cutoff=0.85)
        if close:
            raise ConfigError(f"{key}: not a key the launcher reads; did you mean '{close[0]}'?")
    _check_flush_left_env_vars([str(key) for key in unread])


def _check_flush_left_env_vars(unread: list[str]) -> None:
    """`env_vars:` with its entries written flush left (as one tutorial prints its edit) is null, and
    NCCL_TOPO_FILE beside it a top-level key nothing reads: the jobs would run without it, unseen."""
    named = [key for key in unread if ENV_NAME.fullmatch(key)]
    if not named:
        return
    one = len(named) == 1
    raise ConfigError(
        f"{', '.join(named)}: {'a top-level key' if one else 'top-level keys'} the launcher does not read,"
        f" named as {'an environment variable' if one else 'environment variables'}; to export"
        f" {'it' if one else 'them'} to the jobs put {'it' if one else 'them'} under env_vars (indented"
        " below `env_vars:` in config.yaml, or env_vars.NAME=VALUE)"
    )


def check_launch_sections(
    resolved: dict[str, Any], roots: set[str] = frozenset(), source_of: Callable[[str], str] | None = None
) -> None:
    """Check (and normalize in place: a string -> a one-item list) the keys the launcher reads itself;
    `roots` are the top-level keys interpolations read (see _check_misspelt_top_keys); `source_of`
    names what set a dotted key (its override or file), for an unknown cluster key."""
    _check_misspelt_top_keys(resolved, roots)
    _check_keys(resolved, "", TOP)
    cluster = mapping("cluster", resolved.get("cluster"))
    if cluster is not None:
        check_cluster_section(cluster, source_of)
        check_one_container_image(resolved.get("container"), cluster.get("srun_args") or [])
    stages = list(resolved.get("stages") or [])
    needed = set(stages) | ({"training"} if "validation" in stages else set())
    for stage in sorted(needed):
        section = resolved.get(stage)
        if not isinstance(section, dict):
            raise ConfigError(
                f"{stage}: expected a mapping (the stage's config), got {type_name(section)};"
                f" pick a file with {stage}=<name> or set keys with {stage}.<key>=value"
            )
        run = mapping(f"{stage}.run", section.get("run"))
        if run is not None:
            _check_keys(run, f"{stage}.run.", RUN)
        _check_keys(section, f"{stage}.", STAGE.get(stage, {}))


def check_cluster_section(cluster: dict[str, Any], source_of: Callable[[str], str] | None = None) -> None:
    """A cluster file's keys: spelling and types (normalized in place). `gptrain plan --measure
    --cluster-type slurm` renders its trial jobs from one too."""
    try:
        check_unknown_cluster_keys(cluster)
    except ConfigError as error:  # name the file (or override) to edit
        key = str(error).split(":", 1)[0]
        raise ConfigError(f"{source_of(key)}: {error}" if source_of else str(error)) from None
    _check_keys(cluster, "cluster.", CLUSTER)
    check_extra_options(cluster)


# Read from a cluster file besides the keys above: `gptrain plan`'s hardware profile.
CLUSTER_OTHER_KEYS = ("plan",)


def check_cluster_file_keys(cluster: dict[str, Any], path: object, block: str, block_keys: set[str]) -> None:
    """The top-level keys of a cluster file that a command reads one block of (`gptrain validate
    --profile` its validation:, `gptrain plan --cluster` its plan:): a key of that block written
    beside it instead of under it, or a misspelt key, was ignored; one line naming file and key."""
    for key in cluster:
        if key in block_keys:
            raise ConfigError(
                f"{path}: {key} is a key of the {block} block; put it under {block}: ({block}.{key})"
            )
    try:
        check_unknown_cluster_keys(cluster)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def check_unknown_cluster_keys(cluster: dict[str, Any]) -> None:
    """A misspelt cluster key (`partitoin`) would send the job to the default partition unseen; a
    run_* switch there (as one tutorial edits bcm.yaml) selects nothing."""
    known = [*CLUSTER, *CLUSTER_OTHER_KEYS]
    for key in cluster:
        if key in known:
            continue
        if str(key).startswith("run_"):
            raise ConfigError(
                f"cluster.{key}: the run_* switches belong at the top level of config.yaml (or give "
                "stages=[...]), not in the cluster file; move it there"
            )
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.75)
        hint = (
            f"; did you mean 'cluster.{close[0]}'?" if close else f"; the cluster keys are {', '.join(known)}"
        )
        raise ConfigError(f"cluster.{key}: unknown cluster key{hint}")


def _check_keys(section: dict[str, Any], prefix: str, checks: dict[str, Check]) -> None:
    for dotted, check in checks.items():
        *parents, last = dotted.split(".")
        node: Any = section
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            node[last] = check(prefix + dotted, node[last])
