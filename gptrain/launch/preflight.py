"""Checks before anything is submitted, one line each.

Slurm accepts requests it can never satisfy (more tasks than a node has CPUs, more GPUs
than its gres) and leaves them PENDING forever; a missing data file only shows after the
job waited in the queue. Both are cheap to check on the login node.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError, DataError, LaunchError
from gptrain.launch.additional_parameters import sbatch_option, time_min_parameter
from gptrain.launch.compose import closest
from gptrain.launch.gres import gres_gpus
from gptrain.launch.key_types import slurm_time_seconds
from gptrain.launch.sbatch import Job
from gptrain.launch.sbatch_option_names import options_meant
from gptrain.launch.tokenizer_preflight import check_tokenizer_files, check_vocabulary_rows
from gptrain.utils.hostlist import expand_hostlist
from gptrain.utils.tokenizer_types import NULL_TYPE

if TYPE_CHECKING:
    from gptrain.config import TrainingConfig

# sinfo %T states of nodes that take no new job (a prefix: draining, failing, down~); INVAL is a node
# that registered with less than slurm.conf says (Slurm 21.08+), which Slurm does not schedule on.
UNUSABLE_STATES = ("down", "drain", "fail", "maint", "unknown", "not_responding", "inval")


@dataclass
class Node:
    name: str
    partition: str
    default: bool
    cpus: int
    gpus: int
    state: str
    max_time: str | None = None  # sinfo's %l, its partition's time limit: "2-00:00:00", "infinite"


# Slurm's default MaxArraySize: array task ids 0..1000.
DEFAULT_MAX_ARRAY_SIZE = 1001


def max_array_size(timeout: float = 10.0) -> int:
    """The cluster's MaxArraySize (sbatch refuses an array task id at or above it), from `scontrol show
    config`; Slurm's default where scontrol does not answer (the sinfo checks then say why)."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MAX_ARRAY_SIZE
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", out.stdout, re.MULTILINE)
    return int(match.group(1)) if out.returncode == 0 and match else DEFAULT_MAX_ARRAY_SIZE


# sbatch's --exclusive modes that came after Slurm 22.05 and the release whose sbatch first reads each;
# an older one refuses the line ("Invalid --exclusive specification") only at submission.
# Slurm's NEWS, 24.05.0rc1: "Add --exclusive=topo for use with topology/block".
EXCLUSIVE_MODE_SINCE = {"topo": (24, 5)}
SLURM_VERSION = re.compile(r"\b(\d+)\.(\d+)(?:\.\d+)?\b")


def sbatch_version(timeout: float = 10.0) -> str | None:
    """`sbatch --version`'s release ('slurm 22.05.8', Debian's 'slurm-wlm 22.05.8' -> '22.05.8'): the
    sbatch that reads the script's lines; None where it does not answer or says no version."""
    try:
        out = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = SLURM_VERSION.search(out.stdout) if out.returncode == 0 else None
    return found.group(0) if found else None


def check_exclusive_mode(cluster: dict[str, Any], version: str | None) -> None:
    """A cluster.exclusive mode this sbatch does not read yet (topo before 24.05): refused before
    anything is submitted. An unknown version is left to sbatch."""
    mode = cluster.get("exclusive")
    since = EXCLUSIVE_MODE_SINCE.get(mode) if isinstance(mode, str) else None
    found = SLURM_VERSION.match(version or "")
    if since is None or found is None or (int(found.group(1)), int(found.group(2))) >= since:
        return
    raise LaunchError(
        f"cluster.exclusive={mode}: this sbatch is Slurm {version}, which refuses --exclusive={mode}"
        f" (Slurm {since[0]}.{since[1]:02d} first reads it); give cluster.exclusive=true (whole nodes) or user"
    )


def query_nodes(timeout: float = 10.0) -> list[Node]:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N|%P|%c|%G|%T|%l"], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(
            f"sinfo did not answer ({error}): is Slurm reachable from here? (cluster_type=slurm)"
        ) from None
    if out.returncode != 0:
        raise LaunchError(f"sinfo failed: {out.stderr.strip() or out.returncode}; is slurmctld running?")
    nodes = []
    for line in out.stdout.splitlines():
        name, partition, cpus, gres, state, *max_time = line.split("|")
        default = partition.endswith("*")
        node = Node(name, partition.rstrip("*"), default, int(cpus), gres_gpus(gres) or 0, state.lower())
        node.max_time = max_time[0] if max_time else None
        nodes.append(node)
    return nodes


def requested_gpus_per_node(job: Job, cluster: dict[str, Any]) -> int:
    if not job.gpus:
        return 0
    return max(
        int(cluster.get("gpus_per_node") or 0),
        gres_gpus(cluster.get("gres")) or 0,
        int(cluster.get("gpus_per_task") or 0) * job.tasks_per_node,
    )


def hosts_of(value: Any, key: str) -> set[str]:
    """The hosts of a cluster.exclude / cluster.nodelist value (a Slurm host list, or a list of them)."""
    if not value:
        return set()
    items = value if isinstance(value, list) else [value]
    try:
        return {host for item in items for host in expand_hostlist(str(item))}
    except LaunchError as error:
        raise LaunchError(f"cluster.{key}: {error}") from None


def check_cluster(job: Job, cluster: dict[str, Any], nodes: list[Node]) -> str:
    """One line on the partition's fit for `job`; LaunchError when it can never run. A list of
    partitions (`a,b`, as sbatch takes it: the job starts in whichever can run it first) fits when
    one of them does."""
    partitions = sorted({n.partition for n in nodes})
    given, source = partition_asked(cluster)
    given = given or next((n.partition for n in nodes if n.default), None)
    if given is None:
        raise LaunchError("no default Slurm partition: set cluster.partition")
    wanted = [name.strip() for name in str(given).split(",") if name.strip()]
    for name in wanted:
        if name not in partitions:
            raise LaunchError(f"partition '{name}' does not exist ({source}){closest(name, partitions)}")
    failures = []
    for name in wanted:
        try:
            return partition_fit(job, cluster, nodes, name)
        except LaunchError as error:
            failures.append(error)
    raise failures[0] if len(failures) == 1 else LaunchError("; ".join(map(str, failures)))


def partition_asked(cluster: dict[str, Any]) -> tuple[str | None, str]:
    """The partition the job is submitted to and where it is set: cluster.partition, else this shell's
    SBATCH_PARTITION, which sbatch applies where the script names none (None: the default one)."""
    if cluster.get("partition"):
        return str(cluster["partition"]), "cluster.partition"
    return os.environ.get("SBATCH_PARTITION") or None, "SBATCH_PARTITION in this shell"


def partition_fit(job: Job, cluster: dict[str, Any], nodes: list[Node], wanted: str) -> str:
    """check_cluster's line for one partition."""
    excluded, listed = (
        hosts_of(cluster.get("exclude"), "exclude"),
        hosts_of(cluster.get("nodelist"), "nodelist"),
    )
    usable = [
        n
        for n in nodes
        if n.partition == wanted
        and not n.state.rstrip("*~#").startswith(UNUSABLE_STATES)
        and n.name not in excluded
        and (not listed or n.name in listed)
    ]
    if len(usable) < job.nodes:
        narrowed = " (after cluster.exclude / cluster.nodelist)" if excluded or listed else ""
        raise LaunchError(
            f"{job.stage}: {job.nodes} node(s) requested but partition '{wanted}' has {len(usable)} usable"
            f"{narrowed}; lower training.trainer.num_nodes or pick another cluster.partition"
        )
    check_time_limit(job, cluster, wanted, usable[0].max_time if usable else None)
    cpus = max(n.cpus for n in usable)
    tasks = 1 if overcommits(cluster) else job.tasks_per_node
    needed = tasks * (job.cpus_per_task or 1)
    if needed > cpus:
        raise LaunchError(
            f"{job.stage}: {needed} CPUs per node requested ({tasks} tasks x"
            f" {job.cpus_per_task or 1} CPUs) but nodes of '{wanted}' have {cpus}; Slurm would queue it forever"
        )
    gpus, have = requested_gpus_per_node(job, cluster), max(n.gpus for n in usable)
    if gpus > have:
        raise LaunchError(
            f"{job.stage}: {gpus} GPUs per node requested but nodes of '{wanted}' have {have} (gres);"
            " for CPU nodes set cluster.gpus_per_node=null cluster.gres=null training.trainer.accelerator=cpu"
        )
    fitting = [n for n in usable if n.cpus >= needed and n.gpus >= gpus]
    # a partition of mixed nodes: the largest alone is not enough (a constraint may pick the fitting ones)
    if len(fitting) < job.nodes and not cluster.get("constraint"):
        raise LaunchError(
            f"{job.stage}: {job.nodes} node(s) of {needed} CPUs and {gpus} GPUs requested but partition"
            f" '{wanted}' has {len(fitting)} such (of {len(usable)} usable); Slurm would refuse it or queue it"
            " forever: lower training.trainer.num_nodes or the GPUs/tasks per node, or pick another"
            " cluster.partition"
        )
    count = len(usable) if cluster.get("constraint") else len(fitting)
    return f"ok  {job.stage}: partition {wanted}, {job.nodes}/{count} nodes, {needed}/{cpus} CPUs, {gpus}/{have} GPUs per node"


def overcommits(cluster: dict[str, Any]) -> bool:
    """--overcommit (cluster.overcommit, or any prefix of it in additional_parameters): Slurm then
    allocates each node's CPUs as for one task (sbatch(1)), and runs more tasks than CPUs."""
    extra = cluster.get("additional_parameters") or {}
    asked = [value for name, value in extra.items() if options_meant(sbatch_option(name)) == ["overcommit"]]
    return bool(cluster.get("overcommit")) or any(value not in (None, False) for value in asked)


def check_time_limit(job: Job, cluster: dict[str, Any], partition: str, max_time: str | None) -> None:
    """A run.time_limit over the partition's MaxTime (0: no limit at all, over any) leaves the job
    PENDING for ever (PartitionTimeLimit; Slurm refuses it at submission only under EnforcePartLimits),
    found only after the wait. With a --time-min Slurm may start it with a limit down to that, so the
    time-min is what must fit (Slurm refuses one over MaxTime at submission). A QOS may lift the
    limit (its PartitionTimeLimit flag): with cluster.qos the check is left to Slurm."""
    key, asked_time, outcome = time_checked(job, cluster)
    if asked_time in (None, "") or max_time is None or cluster.get("qos"):
        return
    try:
        allowed, asked = slurm_time_seconds(max_time), slurm_time_seconds(asked_time)
    except ValueError:  # a form this check does not read (sinfo's n/a): left to Slurm
        return
    if allowed is None or (asked is not None and math.ceil(asked / 60) * 60 <= allowed):
        return
    asks = "asks for no time limit, but" if asked is None else "is longer than"
    raise LaunchError(
        f"{key}={asked_time} {asks} partition '{partition}' allows ({max_time}, its time limit in sinfo):"
        f" {outcome}; give at most {max_time}, or pick another cluster.partition"
    )


def time_checked(job: Job, cluster: dict[str, Any]) -> tuple[str, Any, str]:
    """The time limit that must fit the partition's MaxTime, its key, and what Slurm does when it
    does not: cluster.additional_parameters' --time-min (any unique prefix) where given, else the
    stage's run.time_limit."""
    time_min = time_min_parameter(cluster)
    if time_min:
        refused = (
            "Slurm would refuse the job when it is submitted (a --time-min over the partition's MaxTime)"
        )
        return *time_min, refused
    pending = "Slurm would leave the job pending for ever (PartitionTimeLimit)"
    return job.time_limit_source, job.time_limit, pending


def check_blends(data_prefix: Any) -> None:
    """Each blend of the data_prefix (one, or one per split) read as the job will read it: a
    negative weight, an odd-length list or Megatron's unweighted form fail here, not in the job."""
    from gptrain.data.blend_spec import parse_blend

    specs = data_prefix.items() if isinstance(data_prefix, dict) else [(None, data_prefix)]
    for split, spec in specs:
        if spec is None:
            continue
        try:
            parse_blend(spec, one_split=split is not None)
        except DataError as error:
            key = "training.model.data.data_prefix" + (f".{split}" if split else "")
            raise ConfigError(f"{key}: {error}") from None


def check_data_prefixes(data_prefix: Any, splits: list[str] | None = None) -> None:
    """Each prefix names a .bin/.idx pair (x.bin is the prefix x, as the job reads it), or the line
    every data command and the job give: Path.is_file raised PermissionError (a traceback) under a
    directory this user may not search, and told half a pair or a directory from a missing one.
    `splits`: the per-split keys the job builds; another split's prefixes are not opened there."""
    from gptrain.data.blend_spec import prefixes_of, yaml_number_note
    from gptrain.data.pair_check import pair_problem  # standard library only, no numpy

    for prefix in prefixes_of(data_prefix, splits):
        if (problem := pair_problem(prefix)) is not None:
            note = yaml_number_note(data_prefix, prefix)
            raise LaunchError(f"training.model.data.data_prefix: {problem}{note}")


def check_recorded_tokenizer(cfg: TrainingConfig, splits: list[str] | None) -> None:
    """The data's recorded --legacy-tokenizer against training.model.tokenizer.legacy, and its
    recorded vocabulary against the files' (where they tell it without the tokenizer library),
    refused here as the job refuses them as it starts, after the queue wait (the job warns where
    exp_manager.allow_tokenizer_change lets it go on)."""
    from gptrain.data.blend_spec import prefixes_of
    from gptrain.data.tokenizer_record import legacy_conflict
    from gptrain.launch.tokenizer_preflight import vocabulary_conflict

    if cfg.exp_manager.allow_tokenizer_change:
        return
    tok, prefixes = cfg.model.tokenizer, prefixes_of(cfg.model.data.data_prefix, splits)
    conflict = legacy_conflict(prefixes, tok.legacy, tok.type, "training.")
    conflict = conflict or vocabulary_conflict(tok, prefixes)
    if conflict is not None:
        raise LaunchError(f"{conflict[0]}; {conflict[1]}")


def blend_record_warnings(cfg: TrainingConfig, splits: list[str] | None) -> list[str]:
    """The job's warnings at train start for a blend whose datasets were prepared unlike each other
    (--append-eod, split_special_tokens: gptrain.data.record_mix), said here before the queue wait."""
    from gptrain.data.blend_spec import prefixes_of
    from gptrain.data.record_mix import mixed_preparation_lines

    data = cfg.model.data
    mixed = mixed_preparation_lines(
        prefixes_of(data.data_prefix, splits), "training.model.data.data_prefix", data.eod_mask_loss
    )
    return ["warning  " + line.removeprefix("gptrain: warning: ") for line in mixed]


def check_training_files(
    cfg: TrainingConfig,
    prepared_by_stage: bool,
    fetched: dict[str, str] | None = None,
    blend_file: str | None = None,
) -> list[str]:
    """Data prefixes (.bin/.idx) and tokenizer files of the loaded training config (`fetched`:
    tokenizer files the data preparation stage downloads before training starts; `blend_file`: the
    blend it writes, which the job reads in place of the data_prefix: that one's weights go unread).

    Mock data needs no data files; it needs no tokenizer files only with model.data.mock_vocab_size
    (otherwise the job reads them for the vocabulary size: the rule of DataConfig.builds_tokenizer).
    """
    data = cfg.model.data
    lines = []
    if data.is_mock():
        lines.append("ok  training: mock data, no data files needed")
    elif blend_file is None:  # the weights are there before data preparation writes the shards they weigh
        check_blends(data.data_prefix)
    if not data.is_mock() and not prepared_by_stage:
        from gptrain.data.blend_spec import prefixes_of
        from gptrain.train.target_sizes import built_split_keys  # no torch, no numpy

        built = built_split_keys(cfg)  # a split asked for no samples is not built: its files unread
        check_data_prefixes(data.data_prefix, built)
        check_recorded_tokenizer(cfg, built)
        lines.append(f"ok  training: {len(prefixes_of(data.data_prefix, built))} data prefix(es) found")
        lines += blend_record_warnings(cfg, built)
    tok = cfg.model.tokenizer
    if not data.builds_tokenizer():
        lines.append("ok  training: model.data.mock_vocab_size set, no tokenizer files needed")
    elif tok.type == NULL_TYPE:  # ids alone; the data's largest id is checked as the job starts
        lines.append(f"ok  training: {NULL_TYPE} of {tok.vocab_size} ids, no tokenizer files needed")
    else:
        lines.append(check_tokenizer_files(asdict(cfg.model.tokenizer), "training.model.tokenizer", fetched))
    check_vocabulary_rows(cfg)
    return lines


def check_fresh_start(cfg: TrainingConfig) -> list[str]:
    """resume_if_exists=false over a run directory that holds complete checkpoints (the Azure
    tutorial's benchmark, launched again under the same run.name): the job refuses it as it starts,
    after the queue wait; said here instead, in the job's words with the launch's keys. So is a resume
    over a NeMo or Megatron run's checkpoints, which gptrain cannot continue."""
    from gptrain.train.earlier_run import (
        earlier_run_checkpoints,
        earlier_run_error,
        refuse_foreign_checkpoints,
    )

    em = cfg.exp_manager
    if em.resume_if_exists and not em.resume_from_checkpoint:
        refuse_foreign_checkpoints(Path(em.explicit_log_dir), Path(em.checkpoints_dir), "training.")
    if em.resume_if_exists or em.move_aside_earlier_run:
        return []

    holder, found = earlier_run_checkpoints(Path(em.explicit_log_dir), Path(em.checkpoints_dir))
    if found:
        raise earlier_run_error(holder, found, "training.")  # the launch's names of the keys
    return []


def check_wandb_key_file(key_file: Any, cfg: TrainingConfig | None) -> list[str]:
    """NeMo's wandb_api_key_file, which the job reads when it starts: a file that is not there (or
    holds no key) would only show as W&B failing to start after the queue wait. NeMo's launcher
    reads it at launch; so does this check, for a training that logs to W&B (relative paths from
    here: the job starts in this directory)."""
    if not key_file or cfg is None or not cfg.exp_manager.create_wandb_logger:
        return []
    path = Path(str(key_file))
    advice = (
        "give the file whose first line is your W&B API key (or wandb_api_key_file=null to use wandb login)"
    )
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            key = handle.readline().strip()
    except OSError as error:
        raise LaunchError(f"wandb_api_key_file: {path}: {error.strerror}; {advice}") from None
    if not key:
        raise LaunchError(f"wandb_api_key_file: {path} has no key on its first line; {advice}")
    return [f"ok  wandb_api_key_file: {path} holds a key"]


# sbatch's --export-file, which cluster.additional_parameters may give (sbatch takes a unique prefix).
EXPORT_FILE = "export-file"


def check_export_file(cluster: dict[str, Any]) -> list[str]:
    """cluster.additional_parameters.export_file (sbatch's --export-file): sbatch reads the file when
    gptrain submits, from this directory; one it cannot open refused the job only then, after the
    run files were written. A descriptor number names nothing there: gptrain's sbatch has none open."""
    lines = []
    for name, value in (cluster.get("additional_parameters") or {}).items():
        option = str(name).replace("_", "-")
        if value is None or not (option.startswith("export-") and EXPORT_FILE.startswith(option)):
            continue
        key = f"cluster.additional_parameters.{name}"
        advice = (
            "give the path of a file of NAME=value entries (NUL-separated) that sbatch can read from here"
        )
        if value is True:
            raise LaunchError(f"{key}: --{EXPORT_FILE} takes a file; {advice}")
        path = Path(str(value))
        try:
            with path.open("rb"):
                pass
        except OSError as error:
            descriptor = (
                " (a file descriptor: gptrain runs sbatch itself, with none open)"
                if str(value).isdigit()
                else ""
            )
            raise LaunchError(f"{key}: {path}: {error.strerror}{descriptor}; {advice}") from None
        lines.append(f"ok  {key}: {path} can be read")
    return lines


def check_training_layout(cfg: TrainingConfig) -> list[str]:
    """The parallel layout on trainer.num_nodes x trainer.devices ranks and the learning-rate (and
    weight-decay) schedule, checked as the job will check them (gptrain.parallel.layout, gptrain.train.schedule;
    no torch), so an impossible one fails before the queue wait."""
    from gptrain.config.normalize import data_parallel_sharding
    from gptrain.parallel.layout import check_layout
    from gptrain.train.schedule import spec_from_config
    from gptrain.train.weight_decay_schedule import weight_decay_spec

    try:
        dims = check_layout(cfg.model, cfg.world_size(), cfg.trainer.devices)
        spec_from_config(cfg)
        weight_decay_spec(cfg)
    except ConfigError as error:  # its keys are the training section's (training.model.*)
        raise ConfigError(f"training: {error}") from None
    sharding = f" ({data_parallel_sharding(cfg.model)})" if dims.dp > 1 else ""
    return [
        f"ok  training: layout TP {dims.tp} x PP {dims.pp} x DP {dims.dp}{sharding} on {cfg.world_size()} ranks"
        f" ({cfg.trainer.num_nodes} node(s) x {cfg.trainer.devices})"
    ]
