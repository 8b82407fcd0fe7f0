"""Checks before anything is submitted, one line each.

Slurm accepts requests it can never satisfy (more tasks than a node has CPUs, more GPUs
than its gres) and leaves them PENDING forever; a missing data file only shows after the
job waited in the queue. Both are cheap to check on the login node.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError, DataError, LaunchError
from gptrain.launch.additional_parameters import sbatch_option
from gptrain.launch.compose import closest
from gptrain.launch.key_types import slurm_time_seconds
from gptrain.launch.sbatch import Job
from gptrain.launch.sbatch_option_names import SBATCH_SHORT_OPTIONS, options_meant
from gptrain.utils.hostlist import expand_hostlist
from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import hub_name_advice

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


def parse_gpus(gres: str | None) -> int:
    """GPUs in a gres string (sinfo's, or a --gres value): 'gpu:8', 'gpu:a100:8(S:0-1)', 'gpu:4,shard:8'
    -> 8, 8, 4; 'gpu', 'gpu:a100' -> 1 (Slurm's count where none is given); '(null)' -> 0."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", str(gres or "")).split(","):  # sinfo's '(S:0-1)' socket note
        name, *rest = item.strip().split(":")  # name[:type][:count]
        if name == "gpu":
            total += int(rest[-1]) if rest and rest[-1].isdigit() else 1
    return total


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
        node = Node(name, partition.rstrip("*"), default, int(cpus), parse_gpus(gres), state.lower())
        node.max_time = max_time[0] if max_time else None
        nodes.append(node)
    return nodes


def requested_gpus_per_node(job: Job, cluster: dict[str, Any]) -> int:
    if not job.gpus:
        return 0
    return max(
        int(cluster.get("gpus_per_node") or 0),
        parse_gpus(cluster.get("gres")),
        int(cluster.get("gpus_per_task") or 0) * job.tasks_per_node,
    )


def gpus_asked_in_additional_parameters(cluster: dict[str, Any]) -> bool:
    """Whether an additional_parameters option asks Slurm for GPUs (`gpus_per_socket`, `G`,
    `tres_per_task: gres/gpu:1`, ...), which gptrain does not count but Slurm allocates."""
    for key, value in (cluster.get("additional_parameters") or {}).items():
        option = str(key).replace("_", "-")
        meant = [SBATCH_SHORT_OPTIONS[option]] if option in SBATCH_SHORT_OPTIONS else options_meant(option)
        if len(meant) == 1 and value not in (None, False, 0, ""):
            name = meant[0]
            if "gpu" in name or (name in ("tres-per-task", "gres") and "gpu" in str(value)):
                return True
    return False


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
    needed = job.tasks_per_node * (job.cpus_per_task or 1)
    if needed > cpus:
        raise LaunchError(
            f"{job.stage}: {needed} CPUs per node requested ({job.tasks_per_node} tasks x"
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
    for name, value in (cluster.get("additional_parameters") or {}).items():
        if options_meant(sbatch_option(name)) == ["time-min"] and value is not None and value is not True:
            time_min = value if isinstance(value, int) else str(value)
            refused = (
                "Slurm would refuse the job when it is submitted (a --time-min over the partition's MaxTime)"
            )
            return f"cluster.additional_parameters.{name}", time_min, refused
    pending = "Slurm would leave the job pending for ever (PartitionTimeLimit)"
    return f"{job.stage}.run.time_limit", job.time_limit, pending


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
    """The data's recorded --legacy-tokenizer against training.model.tokenizer.legacy, refused here
    as the job refuses it as it starts, after the queue wait (the job warns where
    exp_manager.allow_tokenizer_change lets it go on)."""
    from gptrain.data.blend_spec import prefixes_of
    from gptrain.data.tokenizer_record import legacy_conflict

    tok = cfg.model.tokenizer
    conflict = legacy_conflict(
        prefixes_of(cfg.model.data.data_prefix, splits), tok.legacy, tok.type, "training."
    )
    if conflict is not None and not cfg.exp_manager.allow_tokenizer_change:
        raise LaunchError(f"{conflict[0]}; {conflict[1]}")


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
    if not data.builds_tokenizer():
        lines.append("ok  training: model.data.mock_vocab_size set, no tokenizer files needed")
    else:
        lines.append(check_tokenizer_files(asdict(cfg.model.tokenizer), "training.model.tokenizer", fetched))
    check_vocabulary_rows(cfg)
    return lines


def check_vocabulary_rows(cfg: TrainingConfig) -> None:
    """model.padded_vocab_size under the tokenizer's ids, refused in the job's words (as it starts,
    after the queue wait): the ids counted from vocab.json or tokenizer.json without the tokenizer
    library; left to the job where they cannot be (SentencePiece, tiktoken, a file fetched later).
    The config refuses one under model.data.mock_vocab_size as it loads."""
    from gptrain.utils.vocab_rows import vocab_rows

    m = cfg.model
    if m.padded_vocab_size is None:
        return
    if not m.data.builds_tokenizer():
        ids, source = int(m.data.mock_vocab_size), "model.data.mock_vocab_size"
    else:
        ids, source = tokenizer_ids(m.tokenizer), "the tokenizer"
    if ids is None:
        return
    try:
        vocab_rows(
            ids, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size, m.padded_vocab_size, source
        )
    except ConfigError as error:
        raise LaunchError(f"training: {error}") from None


def tokenizer_ids(tok: Any) -> int | None:
    """The ids of a GPT-2 BPE or HuggingFaceTokenizer tokenizer as the job's tokenizer counts them
    (the highest id + 1: a vocabulary may skip ids), or None where its files do not tell them here."""
    kind = _kind(tok.type)
    if kind == "gpt2":
        directory = tok.model if not (tok.vocab_file or tok.merge_file) and tok.model else None
        vocab = _json_file(str(Path(directory) / "vocab.json") if directory else tok.vocab_file)
        ids = list(vocab.values()) if isinstance(vocab, dict) else []
    elif kind == "huggingface" and tok.model:
        path = Path(str(tok.model))
        data = _json_file(str(path / "tokenizer.json" if path.is_dir() else path))
        ids = _tokenizer_json_ids(data) if isinstance(data, dict) else []
    else:
        return None
    ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
    return max(ids) + 1 if ids else None


def _tokenizer_json_ids(data: dict[str, Any]) -> list[Any]:
    """A tokenizer.json's ids: its model's vocabulary (a {token: id} mapping, or Unigram's list of
    [piece, score], numbered in order) and its added tokens."""
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab or [])))
    added = data.get("added_tokens") or []
    return ids + [token.get("id") for token in added if isinstance(token, dict)]


def _json_file(path: str | None) -> Any:
    """A JSON file's content, or None where it is not there or does not parse (the job says why)."""
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_fresh_start(cfg: TrainingConfig) -> list[str]:
    """resume_if_exists=false over a run directory that holds complete checkpoints (the Azure
    tutorial's benchmark, launched again under the same run.name): the job refuses it as it starts,
    after the queue wait; said here instead, in the job's words."""
    em = cfg.exp_manager
    if em.resume_if_exists or em.move_aside_earlier_run:
        return []
    from gptrain.train.run_lock import earlier_run_checkpoints, earlier_run_error

    holder, found = earlier_run_checkpoints(Path(em.explicit_log_dir), Path(em.checkpoints_dir))
    if found:
        raise earlier_run_error(holder, found)
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
    """The parallel layout on trainer.num_nodes x trainer.devices ranks and the learning-rate
    schedule, checked as the job will check them (gptrain.parallel.layout, gptrain.train.schedule;
    no torch), so an impossible one fails before the queue wait."""
    from gptrain.config.normalize import data_parallel_sharding
    from gptrain.parallel.layout import check_layout
    from gptrain.train.schedule import spec_from_config

    try:
        dims = check_layout(cfg.model, cfg.world_size(), cfg.trainer.devices)
        spec_from_config(cfg)
    except ConfigError as error:  # its keys are the training section's (training.model.*)
        raise ConfigError(f"training: {error}") from None
    sharding = f" ({data_parallel_sharding(cfg.model)})" if dims.dp > 1 else ""
    return [
        f"ok  training: layout TP {dims.tp} x PP {dims.pp} x DP {dims.dp}{sharding} on {cfg.world_size()} ranks"
        f" ({cfg.trainer.num_nodes} node(s) x {cfg.trainer.devices})"
    ]


def check_tokenizer_files(
    tokenizer: dict[str, Any], where: str, fetched: dict[str, str] | None = None
) -> str:
    """The tokenizer's files exist, or are among `fetched` ({path: URL} the data preparation
    stage downloads when missing)."""
    urls = fetched or {}
    found, to_fetch = [], []
    in_directory = _model_directory_file(tokenizer.get("type"))
    for key in _file_keys_read(tokenizer):
        value = tokenizer.get(key)
        if value and ("/" in str(value) or str(value).endswith((".json", ".txt", ".model"))):
            if _is_file(str(value), f"{where}.{key}", in_directory if key == "model" else ()):
                found.append(key)
            elif str(value) in urls:
                to_fetch.append(f"{key} from {urls[str(value)]}")
            elif key == "model" and (advice := hub_name_advice(value)) is not None:
                raise LaunchError(f"{where}.{key}: {value} is not a local file or directory; {advice}")
            else:
                raise LaunchError(f"{where}.{key}: {value} not found")
    if "model" in found:
        check_tiktoken_vocabulary(tokenizer, where)
    line = f"ok  {where}: {', '.join(found) or 'no files'} present"
    return line + (f"; data_preparation fetches {', '.join(to_fetch)}" if to_fetch else "")


def check_tiktoken_vocabulary(tokenizer: dict[str, Any], where: str) -> None:
    """Megatron's TikTokenizer vocabulary file read with its settings as the job reads it (stdlib
    only), so that a file too short for vocab_size, or a bad entry, is said before the queue."""
    model = str(tokenizer.get("model"))
    if not _is_tiktoken(tokenizer.get("type")) or not model.endswith(".json"):
        return
    from gptrain.data.tiktoken_file import TiktokenFileOptions, read_ranks
    from gptrain.errors import GptrainError

    specials = tokenizer.get("special_tokens")
    options = TiktokenFileOptions(
        tokenizer.get("tiktoken_pattern"),
        tokenizer.get("vocab_size"),
        tokenizer.get("tiktoken_num_special_tokens"),
        tuple(specials) if specials is not None else None,
    )
    try:
        _, vocab_size, count, _ = options.resolved()
        read_ranks(model, vocab_size - count, count)
    except GptrainError as error:
        raise LaunchError(f"{where}: {_keys_under(str(error), where)}") from None


def _is_tiktoken(kind: object) -> bool:
    """TikTokenizer by any spelling data prepare and training take (`tiktoken`, `tiktokenizer`); an
    unknown type is for data prepare or the config to refuse."""
    from gptrain.data.tokenizer_args import canonical_type

    try:
        return kind is not None and canonical_type(str(kind)) == "tiktoken"
    except ConfigError:
        return False


def _keys_under(message: str, where: str) -> str:
    """The tokenizer's keys named where this config holds them (data_preparation.tokenizer.vocab_size),
    not under the training config's model.tokenizer, as the reader names them."""
    return message.replace("model.tokenizer.", f"{where}.")


def _is_file(path: str, name: str, in_directory: tuple[str, ...] = ()) -> bool:
    """Whether `path` is a file (or a directory holding every file of `in_directory`, as the job
    reads it); one under a directory this user may not search is a LaunchError naming `name`
    (Path.is_file raised PermissionError there: a traceback, even under --dry-run), as is a
    directory without one of them."""
    found = look_up(path)
    if found.kind == "unreachable":
        raise LaunchError(f"{name}: {path} {found.why}")
    if found.kind == "directory" and in_directory:
        for file in in_directory:
            if not _is_file(os.path.join(path, file), name):
                raise LaunchError(f"{name}: {path} is a directory with no {file} in it")
        return True
    return found.kind == "file"


def _kind(tokenizer_type: object) -> str | None:
    """gptrain's kind of a tokenizer type by any spelling, or None for an unknown one (the config's
    or data prepare's to refuse)."""
    from gptrain.data.tokenizer_args import canonical_type

    try:
        return canonical_type(str(tokenizer_type)) if tokenizer_type is not None else None
    except ConfigError:
        return None


def _file_keys_read(tokenizer: dict[str, Any]) -> tuple[str, ...]:
    """The tokenizer keys whose files its type reads, as the job picks them
    (gptrain.train.tokenizer_setup.tokenizer_file_keys): a preset's GPT-2 vocab_file and merge_file stay in
    the config of a run of another type, which never reads them; all where the type is unknown."""
    kind = _kind(tokenizer.get("type"))
    if kind is None:
        return ("vocab_file", "merge_file", "model")
    if kind == "gpt2" and (tokenizer.get("vocab_file") or tokenizer.get("merge_file")):
        return ("vocab_file", "merge_file")  # the job reads no model beside them
    return ("model",)


def _model_directory_file(tokenizer_type: object) -> tuple[str, ...]:
    """The files the type reads in a directory given as its model: a HuggingFaceTokenizer's
    tokenizer.json, GPT-2 BPE's vocab.json and merges.txt; none: a directory is no model of it."""
    files = {"huggingface": ("tokenizer.json",), "gpt2": ("vocab.json", "merges.txt")}
    return files.get(_kind(tokenizer_type) or "", ())
