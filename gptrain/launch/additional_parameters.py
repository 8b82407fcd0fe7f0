"""cluster.additional_parameters: an #SBATCH option gptrain renders itself, or sbatch refuses, is refused."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gptrain.errors import ConfigError
from gptrain.launch.gres import gres_gpus
from gptrain.launch.key_types import count, mapping, slurm_time, type_name
from gptrain.launch.sbatch_option_names import SBATCH_OPTION_ALIASES, SBATCH_SHORT_OPTIONS, options_meant

# sbatch options gptrain renders itself, and the key that sets each: one from
# cluster.additional_parameters would override or contradict it (sbatch takes the last one given).
SBATCH_OWNED = {
    "job-name": "cluster.job_name_prefix or <stage>.run.name",
    "nodes": "training.trainer.num_nodes",
    "ntasks": "training.trainer.num_nodes and training.trainer.devices",
    "ntasks-per-node": "training.trainer.devices",
    "output": "base_results_dir or <stage>.run.results_dir",
    "error": "cluster.stderr_to_stdout",
    "chdir": "the current directory (launch from another one)",
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "reservation": "cluster.reservation",
    "constraint": "cluster.constraint",
    "nodelist": "cluster.nodelist",
    "exclude": "cluster.exclude",
    "time": "<stage>.run.time_limit",
    "mem": "cluster.mem",
    "exclusive": "cluster.exclusive",
    "cpus-per-task": "cluster.cpus_per_task (data_preparation.workers for the data preparation)",
    "gres": "cluster.gres",
    "gpus": "cluster.gpus_per_node",
    "gpus-per-node": "cluster.gpus_per_node",
    "gpus-per-task": "cluster.gpus_per_task",
    "array": "data_preparation.run.node_array_size",
    "dependency": "<stage>.run.dependency",
    "signal": "cluster.signal_seconds",
    "requeue": "cluster.max_requeues",
    "no-requeue": "cluster.max_requeues",
}
# sbatch options no key sets, which gptrain renders or submits with itself: why each must stay as is.
SBATCH_RESERVED = {
    "open-mode": "logs are appended, so a requeued run continues its log",
    "parsable": "gptrain submits with it and reads the job id from sbatch's reply",
    "wait": "gptrain launch would wait for the job to end",
    "test-only": "no job would be queued",
    "wrap": "the stage's script is the job",
}
# sbatch options no key sets that would break the job: why, and what to use instead.
SBATCH_REFUSED = {
    # --export=NONE (or a list) sets SLURM_EXPORT_ENV, which the srun in the batch script inherits:
    # the ranks would start without the script's exports (env_vars, MASTER_ADDR/MASTER_PORT) or PATH.
    "export": (
        "the srun in the batch script inherits it, so the ranks would start without env_vars,"
        " the rendezvous variables or PATH",
        "use env_vars or cluster.env_vars instead",
    ),
    # sbatch (22.05+): "--ntasks-per-node is mutually exclusive with --ntasks-per-gpu".
    "ntasks-per-gpu": (
        "sbatch refuses it beside --ntasks-per-node, which gptrain renders on every stage"
        " (training.trainer.devices)",
        "give the ranks per node as training.trainer.devices and their GPUs as cluster.gpus_per_node"
        " or cluster.gpus_per_task",
    ),
}


def keeps_the_environment(option: str, value: Any) -> bool:
    """`export: ALL` (or `ALL,NAME=value`, `NAME=value,ALL`): Slurm's default, the whole environment
    kept, harmless. srun and sbatch read the whole list: any item ALL (any case) keeps it, and they
    stop reading at an item NONE; only the first item was looked at, so `NAME=value,ALL` was refused."""
    if option != "export":
        return False
    for item in str(value).split(","):
        word = item.strip().upper()
        if word == "NONE":
            return False
        if word == "ALL":
            return True
    return False


# sbatch's options besides --mem (cluster.mem): it refuses any two of the three ("mutually exclusive").
SBATCH_MEM_OPTIONS = ("mem-per-cpu", "mem-per-gpu")
SBATCH_OPTION_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def sbatch_option(key: object) -> str:
    """The sbatch option of a cluster.additional_parameters key, as submitit writes it: `mail_type`
    -> `mail-type`."""
    return str(key).replace("_", "-")


def owned_option(option: str) -> str | None:
    """The option gptrain renders or refuses that `option` is (a full name, as options_meant reads
    it); None for any other."""
    return option if option in (*SBATCH_OWNED, *SBATCH_RESERVED, *SBATCH_REFUSED) else None


def long_option(where: str, option: str) -> tuple[str, str]:
    """The sbatch option a key renders, as sbatch reads it, and how to name it in an error. A
    one-letter key renders `--N`, which sbatch refuses: an option gptrain renders itself is named
    (so its own key is the advice), any other is refused naming its long form. An ambiguous prefix
    is refused as sbatch would refuse it, when the job is submitted."""
    if len(option) == 1:
        meant = SBATCH_SHORT_OPTIONS.get(option)
        if meant and owned_option(meant):
            return meant, f"--{meant} (sbatch's -{option})"
        short = f"-{option} is its short form of --{meant}" if meant else f"it has no -{option} either"
        fix = f"write the long name, {meant.replace('-', '_')}" if meant else "write the long option's name"
        raise ConfigError(f"{where}: the key renders --{option}, which sbatch does not read ({short}); {fix}")
    meant = options_meant(option)
    if len(meant) > 1:
        raise ConfigError(
            f"{where}: --{option} abbreviates several sbatch options ({', '.join('--' + m for m in meant)}),"
            " and sbatch refuses it as ambiguous; write the full name"
        )
    alias = [name for name in SBATCH_OPTION_ALIASES if name.startswith(option) and name != option]
    how = "is another name of" if option in SBATCH_OPTION_ALIASES else "abbreviates"
    if alias and SBATCH_OPTION_ALIASES[alias[0]] == meant[0]:
        how = f"abbreviates --{alias[0]}, another name of it"
    spelt = f"--{meant[0]}" if meant[0] == option else f"--{meant[0]} (which --{option} {how})"
    return meant[0], spelt


def reserved_reason(option: str) -> str:
    return f" ({SBATCH_RESERVED[option]})" if option in SBATCH_RESERVED else ""


def additional_parameters(key: str, value: Any) -> dict[str, Any] | None:
    """Extra #SBATCH options (NeMo/submitit's additional_parameters): option names that are not
    gptrain's own, each a single value (true: a bare flag, null: left out)."""
    options: dict[str, str] = {}
    for name, item in (mapping(key, value) or {}).items():
        where = f"{key}.{name}"
        if not SBATCH_OPTION_KEY.match(str(name)):
            raise ConfigError(
                f"{where}: not an sbatch option name; give the long option without dashes"
                " (letters, digits, _ or -, e.g. mail_type for --mail-type)"
            )
        option, spelt = long_option(where, sbatch_option(name))
        if option in options:  # sbatch would take the last one, silently
            raise ConfigError(f"{where}: {spelt} is given twice (also as {key}.{options[option]}); keep one")
        options[option] = str(name)
        owned = owned_option(option)
        if owned in SBATCH_REFUSED:
            if not keeps_the_environment(owned, item):
                why, fix = SBATCH_REFUSED[owned]
                raise ConfigError(f"{where}: {spelt} is refused: {why}; {fix}")
            owned = None  # passed as given
        if owned:
            fix = f"use {SBATCH_OWNED[owned]} instead" if owned in SBATCH_OWNED else "leave it out"
            raise ConfigError(f"{where}: gptrain renders {spelt} itself; {fix}{reserved_reason(owned)}")
        if option == "time-min":
            time_min_value(where, item)
        one_value(where, option, item, bare=True)
    return value


def time_min_value(key: str, value: Any) -> Any:
    """--time-min's value: a Slurm time. sbatch refuses true (a bare --time-min: 'requires an
    argument'), false (`--time-min=False`) and blank (`--time-min=''`); null leaves it out."""
    if value is True:
        raise ConfigError(
            f"{key}: --time-min needs a time (sbatch: 'requires an argument'); give one, e.g. 04:00:00,"
            " or null to leave it out"
        )
    if value is False or (isinstance(value, str) and not value.strip()):
        shown = "false" if value is False else "a blank value"
        raise ConfigError(
            f"{key}: --time-min needs a time, not {shown}; give one, e.g. 04:00:00, or null to leave it out"
        )
    return value if value is None else slurm_time(key, value)


def one_value(key: str, option: str, value: Any, bare: bool) -> Any:
    """One value for --`option`: false would render `--option=False`, a list or mapping its Python
    text; true is a bare flag where `bare`, else refused too (the option needs a value)."""
    if value is False or isinstance(value, dict | list) or (value is True and not bare):
        flag = f", true (a bare --{option})" if bare else ""
        raise ConfigError(f"{key}: expected one value{flag} or null (left out), got {type_name(value)}")
    return value


def time_min_parameter(cluster: dict[str, Any]) -> tuple[str, int | str] | None:
    """cluster.additional_parameters' --time-min (under any prefix sbatch reads as it): its key and
    value. Slurm may start the job with its limit lowered down to it, so what must fit a partition's
    MaxTime, or the requeue signal's lead, is this."""
    for name, value in (cluster.get("additional_parameters") or {}).items():
        if options_meant(sbatch_option(name)) == ["time-min"] and value is not None and value is not True:
            return f"cluster.additional_parameters.{name}", value if isinstance(value, int) else str(value)
    return None


def nemo_value(key: str, value: Any) -> Any:
    """A NeMo SlurmLauncher key's value (cluster.comment): its option needs one, so true (a bare
    option, which sbatch refuses) is refused as false is."""
    return one_value(key, sbatch_option(key.rsplit(".", 1)[-1]), value, bare=False)


def nemo_memory(key: str, value: Any) -> Any:
    """Blank is no option, as for cluster.mem (`--mem-per-cpu=''` is refused by sbatch)."""
    return None if isinstance(value, str) and not value.strip() else nemo_value(key, value)


# NeMo's SlurmLauncher parameters that are sbatch options no gptrain key renders: a NeMo cluster file
# may set them beside bcm.yaml's keys; rendered as NeMo renders them (null: no line), each checked.
NEMO_SBATCH_KEYS: dict[str, Callable[[str, Any], Any]] = {
    "comment": nemo_value,
    "cpus_per_gpu": count,
    "mem_per_cpu": nemo_memory,
    "mem_per_gpu": nemo_memory,
}


# Extra options that need GPUs, left out of the script of a job that asks for none (the data
# preparation; a training or validation with trainer.accelerator=cpu): sbatch refuses either without a
# GPU ('Invalid generic resource (gres) specification'), and Slurm 23.11+ refuses --cpus-per-gpu beside
# the data preparation's --cpus-per-task (data_preparation.workers). GPU jobs keep them.
PER_GPU_OPTIONS = ("cpus-per-gpu", "mem-per-gpu")


def per_gpu_option(option: str) -> str | None:
    """The per-GPU option `option` is (as a key renders it: `cpus_per_g` too), or None."""
    meant = options_meant(option)[0]
    return meant if meant in PER_GPU_OPTIONS else None


def left_out_reason(option: str, gpus: bool, cluster: dict[str, Any], cpus_per_task: bool) -> str | None:
    """Why extra option `option` is left out of a job's script (None: it is kept). `gpus`: the job
    asks for GPUs through gptrain's keys; additional_parameters may ask for them on every stage, and
    then the per-GPU options stay, but --cpus-per-gpu not beside a --cpus-per-task (`cpus_per_task`)."""
    meant = per_gpu_option(option)
    if meant is None:
        return None
    if not (gpus or gpus_asked_in_additional_parameters(cluster)):
        return NO_GPU
    return BESIDE_CPUS_PER_TASK if meant == "cpus-per-gpu" and cpus_per_task else None


NO_GPU, BESIDE_CPUS_PER_TASK = "no GPU", "beside --cpus-per-task"
# sbatch's options that allocate GPUs; --gpu-bind, --gpu-freq, --cpus-per-gpu and --mem-per-gpu only
# say how to use the GPUs a job asked for elsewhere (--ntasks-per-gpu is refused: additional_parameters).
GPU_ASKING_OPTIONS = ("gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task")


def gpus_asked_in_additional_parameters(cluster: dict[str, Any]) -> bool:
    """Whether an additional_parameters option asks Slurm for one GPU or more (`gpus_per_socket: 1`,
    `G`, `tres_per_task: gres/gpu:1`, ...), which gptrain does not count but Slurm allocates; a
    count of 0 asks for none."""
    for key, value in (cluster.get("additional_parameters") or {}).items():
        option = sbatch_option(key)
        meant = [SBATCH_SHORT_OPTIONS[option]] if option in SBATCH_SHORT_OPTIONS else options_meant(option)
        if len(meant) != 1 or value in (None, False, 0, ""):
            continue
        if meant[0] in GPU_ASKING_OPTIONS and gres_gpus(f"gpu:{value}"):  # [type:]count
            return True
        if meant[0] in ("tres-per-task", "gres") and gres_gpus(value):
            return True
    return False


def extra_options(cluster: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(key, option, value) of every extra #SBATCH option: NEMO_SBATCH_KEYS', then additional_parameters'."""
    nemo = [
        (f"cluster.{key}", sbatch_option(key), cluster.get(key)) for key in NEMO_SBATCH_KEYS if key in cluster
    ]
    extra = cluster.get("additional_parameters") or {}
    return nemo + [
        (f"cluster.additional_parameters.{name}", sbatch_option(name), item) for name, item in extra.items()
    ]


def check_extra_options(cluster: dict[str, Any]) -> None:
    """A NeMo cluster key beside an additional_parameters key for its option (sbatch would take the
    last one, silently); options sbatch refuses together ('mutually exclusive'): any two of --mem
    (cluster.mem), --mem-per-cpu and --mem-per-gpu; any two of cluster.cpus_per_task's --cpus-per-task,
    --cpus-per-gpu and a --tres-per-task cpu count."""
    given = given_extra_options(cluster)
    memory = [("mem", "cluster.mem", cluster.get("mem"))] if cluster.get("mem") is not None else []
    refuse_together([*memory, *given_of(given, SBATCH_MEM_OPTIONS)], "set cluster.mem=null to use it")
    per_task = cluster.get("cpus_per_task")
    cpus = [("cpus-per-task", "cluster.cpus_per_task", per_task)] if per_task is not None else []
    refuse_together([*cpus, *given_of(given, ("cpus-per-gpu",)), *cpu_tres(given)])


def cpu_tres(given: dict[str, tuple[str, Any]]) -> list[tuple[str, str, Any]]:
    """The --tres-per-task given that counts CPUs (`cpu:4` or `cpu=4` in its list), which sbatch
    takes as --cpus-per-task: Slurm 23.02+ refuses the two together, 23.11+ --cpus-per-gpu with
    either ('mutually exclusive')."""
    key, value = given.get("tres-per-task", (None, None))
    items = str(value).replace(" ", "").lower().split(",")
    counts_cpus = key is not None and any(item.startswith(("cpu:", "cpu=")) for item in items)
    return [("tres-per-task", key, value)] if counts_cpus else []


def check_data_preparation_cpus(cluster: dict[str, Any], workers: int | None) -> None:
    """A --tres-per-task cpu count beside the data preparation's --cpus-per-task (`workers`, None
    where none is rendered), refused as check_extra_options refuses it beside cluster.cpus_per_task's."""
    tres = cpu_tres(given_extra_options(cluster))
    if workers and tres:
        _, key, value = tres[0]
        raise ConfigError(
            f"{key}: sbatch refuses it together with --cpus-per-task, which data_preparation.workers={workers}"
            f" renders for the data preparation ({value} asks for CPUs per task too); give the training's"
            " CPUs as cluster.cpus_per_task instead"
        )


def given_extra_options(cluster: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The option (as sbatch reads it: `mem_per_c` is --mem-per-cpu) of every extra option given a
    value, with its key and value. additional_parameters refuses its own twice: an option given
    twice here is a NeMo key beside an additional_parameters key, refused."""
    given: dict[str, tuple[str, Any]] = {}
    for key, option, item in extra_options(cluster):
        if item is None:
            continue
        meant = options_meant(option)[0]
        if meant in given:
            raise ConfigError(f"{given[meant][0]}: --{meant} is given twice (also as {key}); keep one")
        given[meant] = (key, item)
    return given


def given_of(given: dict[str, tuple[str, Any]], options: tuple[str, ...]) -> list[tuple[str, str, Any]]:
    """(option, key, value) of those of `options` given, in their order."""
    return [(option, *given[option]) for option in options if option in given]


def refuse_together(asked: list[tuple[str, str, Any]], fix_beside_own: str = "give one of them") -> None:
    """(option, key, value) of options sbatch refuses any two of: the second is refused naming the
    first; `fix_beside_own`: the advice where the first is an option gptrain renders from its key."""
    if len(asked) < 2:
        return
    (first, first_key, first_value), (_, key, _) = asked[:2]
    fix = fix_beside_own if first in SBATCH_OWNED else "give one of them"
    raise ConfigError(
        f"{key}: sbatch refuses it together with --{first}, which {first_key}={first_value} renders; {fix}"
    )
