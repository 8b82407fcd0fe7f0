"""Types of the launch config's own keys, checked once right after composing.

The training section is checked by the training loader (it knows the full schema), but the
launcher reads a few keys itself before that (`training.trainer.devices`, `cluster.srun_args`,
`cluster.signal_seconds`, ...) and renders others into scripts. A wrong type there would be a
traceback, a script Slurm rejects after the job queued, or a string iterated as characters
(`--container-mounts=/,d,a,...`). Each key below gets one ConfigError naming it and what it
expects; a single string where a list is expected is a one-item list.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Callable
from typing import Any

from gptrain.errors import ConfigError
from gptrain.launch.sbatch_option_names import SBATCH_SHORT_OPTIONS, options_meant

# Environment variable names bash accepts in `export NAME=value`.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (and its words for none).
SLURM_TIME = re.compile(r"^(?:\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2})$")
SLURM_TIME_WORDS = ("INFINITE", "UNLIMITED")
# sbatch --signal takes at most 65535 seconds; 0 would leave no time to save a checkpoint.
MAX_SIGNAL_SECONDS = 65535

Check = Callable[[str, Any], Any]  # (dotted key, value) -> the value to keep, or ConfigError


def _type_name(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _integer(key: str, value: Any, low: int, high: int | None = None) -> int | None:
    """An int, text that is one (`${oc.env:NODES}` resolves to text) or a whole float (`2.0`, `1e3`:
    a NeMo config's DictConfig passes it to Lightning, which counts with it), as the training
    loader reads it; kept as the int, so a script never renders `--nodes=2.0`."""
    if value is None:
        return None
    from gptrain.config.yamlio import as_int  # the config package loads omegaconf: not at start-up

    whole_float = isinstance(value, float) and value.is_integer()
    number = int(value) if whole_float else as_int(value)
    if number is None:
        raise ConfigError(f"{key}: expected a whole number, got {_type_name(value)}")
    value = number
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise ConfigError(f"{key}: expected a whole number {bound}, got {value}")
    return value


def count(key: str, value: Any) -> int | None:
    """A whole number >= 1 (None: the default applies)."""
    return _integer(key, value, 1)


def non_negative(key: str, value: Any) -> int | None:
    return _integer(key, value, 0)


def signal_seconds(key: str, value: Any) -> int | None:
    """Seconds of warning before the time limit; 0 or less leaves no time to checkpoint."""
    return _integer(key, value, 1, MAX_SIGNAL_SECONDS)


def _seconds(key: str, value: Any, zero_allowed: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a number of seconds, got {_type_name(value)}")
    if value < 0 or (value == 0 and not zero_allowed):
        bound = "0 or more seconds" if zero_allowed else "more than 0 seconds"
        raise ConfigError(f"{key}: expected {bound}, got {value}")
    return value


def seconds(key: str, value: Any) -> float | None:
    """A wait, 0 or more seconds (None: the default applies)."""
    return _seconds(key, value, zero_allowed=True)


def timeout_seconds(key: str, value: Any) -> float | None:
    """A time limit of more than 0 seconds (a socket timeout of 0 fails every read at once)."""
    return _seconds(key, value, zero_allowed=False)


def mapping(key: str, value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping of keys (key.sub=value), got {_type_name(value)}")
    return value


def scalar(key: str, value: Any) -> Any:
    """One value (a name, a path, a number), not a list or a mapping."""
    if isinstance(value, dict | list):
        raise ConfigError(f"{key}: expected a single value, got {_type_name(value)}")
    return value


def boolean(key: str, value: Any) -> bool | None:
    """true/false as OmegaConf reads a bool field: also 1/0 (`cluster.exclusive=1`), yes/no, on/off."""
    if value is None:
        return None
    from gptrain.config.yamlio import as_switch  # the config package loads omegaconf: not at start-up

    switch = as_switch(value)
    if switch is None:
        raise ConfigError(f"{key}: expected true or false, got {_type_name(value)}")
    return switch


# sbatch's --exclusive=<mode>: nodes shared only with the user's own jobs (user), jobs of the same
# MCS label (mcs), or within a topology segment (topo, Slurm 24.11+).
EXCLUSIVE_MODES = ("user", "mcs", "topo")


def exclusive(key: str, value: Any) -> bool | str | None:
    """true/false, or one of sbatch's --exclusive modes, which submitit and the NeMo launcher pass
    as `--exclusive=user` where the key is text."""
    if isinstance(value, str) and value.strip().lower() in EXCLUSIVE_MODES:
        return value.strip().lower()
    try:
        return boolean(key, value)
    except ConfigError:
        raise ConfigError(
            f"{key}: expected true, false or an sbatch --exclusive mode ({', '.join(EXCLUSIVE_MODES)}),"
            f" got {_type_name(value)}"
        ) from None


def memory(key: str, value: Any) -> Any:
    """--mem's value; blank text is no --mem, as a blank partition or account is none (`--mem=''` is
    refused by sbatch). 0 stays: every node's whole memory."""
    if isinstance(value, str) and not value.strip():
        return None
    return scalar(key, value)


def words(key: str, value: Any) -> list[str] | None:
    """A list of strings; one string is a one-item list (`container_mounts=/data:/data`)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise ConfigError(
        f"{key}: expected a string or a list of strings (e.g. {key}=[a,b]), got {_type_name(value)}"
    )


def command_words(key: str, value: Any) -> list[str] | None:
    """srun's options: a list, one word each, or one string read as a shell reads it, as it stands on
    a hand-written srun line (`--mpi=pmix --label`; quote a value with a space). Kept whole, such a
    string reached srun as one word, which srun cannot read."""
    if not isinstance(value, str):
        args = words(key, value)
        check_one_word_per_item(key, args or [])
    else:
        try:
            args = shlex.split(value)
        except ValueError as error:  # an unclosed quote
            raise ConfigError(
                f"{key}: {value!r} cannot be split into options ({error}); close the quote, or give a list"
                f" ({key}=[a,b])"
            ) from None
        check_each_word_is_an_option(key, value, args)
    check_no_task_layout_option(key, args or [])
    return args


# srun's options for the step's nodes and tasks, which gptrain renders on every srun line itself,
# and the key behind each.
SRUN_OWNED = {
    "nodes": "training.trainer.num_nodes",
    "ntasks": "training.trainer.num_nodes and training.trainer.devices",
    "ntasks-per-node": "training.trainer.devices",
    "tasks-per-node": "training.trainer.devices",  # srun's other name of --ntasks-per-node
}
SRUN_OWNED_SHORT = {"N": "nodes", "n": "ntasks"}


def check_no_task_layout_option(key: str, args: list[str]) -> None:
    """srun takes the last of an option given twice, and srun_args come after gptrain's own: `-N 1`
    (an srun line's options copied whole) ran the training on one node of the allocation, fewer ranks
    than its config has, found only as it started after the queue wait; a one-task step (the blend,
    a data preparation task) could run several times at once."""
    for arg in args:
        if arg.startswith("--"):
            option = srun_long_option(arg[2:].partition("=")[0])
        else:
            option = owned_short_option(arg) if arg.startswith("-") else None
        if option in SRUN_OWNED:
            raise ConfigError(
                f"{key}: {arg!r} sets srun's --{option}, which gptrain renders on each srun line itself;"
                f" use {SRUN_OWNED[option]} instead"
            )


def owned_short_option(word: str) -> str | None:
    """The SRUN_OWNED option a short-option word sets (`-N2`, `-lN 2`: nodes); the letters after
    one that takes a value are its value, not options."""
    for letter in word[1:]:
        if letter in SRUN_OWNED_SHORT:
            return SRUN_OWNED_SHORT[letter]
        if letter not in SRUN_SHORT_WITHOUT_VALUE:
            return None  # its value is the rest of the word (or it is unknown here)
    return None


def check_one_word_per_item(key: str, args: list[str]) -> None:
    """A list is srun's words, one per item, as the NeMo launcher's shlex.join renders it: an item
    holding several options (`--mpi=pmix -l`) reached srun as one it cannot read, found only once the
    job left the queue. Words that are no option stay: a list may end in a wrapper srun runs
    (`[--mpi=pmix, nsys, profile]`), as on NeMo's srun line."""
    for arg in args:
        try:
            split = shlex.split(arg)
        except ValueError:  # an unpaired quote is part of the one word
            split = [arg]
        if arg.startswith("-") and any(is_srun_option(word) for word in split[1:]):
            raise ConfigError(
                f"{key}: the item {arg!r} reaches srun as one word (a list gives one word per item); give"
                f" each option its own item, or all of them as one string ({key}='{arg}')"
            )


def is_srun_option(word: str) -> bool:
    """Whether `word` is one of srun's options (`--label`, `--lab`, `-l`), not a value that starts
    with a dash (`--comment=ablation -3`)."""
    if word.startswith("--"):
        return srun_long_option(word[2:].partition("=")[0]) in SRUN_LONG_OPTIONS
    known = SRUN_SHORT_WITH_VALUE + SRUN_SHORT_WITHOUT_VALUE + SRUN_SHORT_OPTIONAL_VALUE
    return len(word) > 1 and word[0] == "-" and word[1] in known


def check_each_word_is_an_option(key: str, value: str, split: list[str]) -> None:
    """A word of a split srun_args string that is no option must be the value of the option just
    before it (`--mpi pmix`): one more would be srun's command (`--container-mounts=/lustre/My
    Data:/data` unquoted runs `Data:/data` on every node, and only after the queue wait), as would a
    word after an srun option that takes no value (`-l Data`) or has its value already (`-N2 x`)."""
    for before, word in zip([None, *split], split, strict=False):  # each word with the one before it
        if word.startswith("-") or (before is not None and takes_the_next_word(before)):
            continue
        if before is None or not before.startswith("-") or "=" in before:
            raise ConfigError(
                f"{key}: {value!r} splits into {word!r}, which is neither an option nor the value of the"
                f" option before it (srun would run it as the command); quote a value with a space, or give"
                f" a list ({key}=[a,b])"
            )
        raise ConfigError(
            f"{key}: {value!r} splits into {word!r} after {before!r}, which {complete_without_it(before)}:"
            f" srun would run {word!r} as the command; remove it, or attach an optional value (--nice=5, -I5)"
        )


# srun's short options that take a value (`-N 2`, `-N2`), and those that take none or only an
# attached one (`-l`, `-I5`), as srun 22.05 parses them (and srun(1) up to 25.x lists them). Any
# other letter is unknown here: a word after it may be its value.
SRUN_SHORT_WITH_VALUE = "ABbCcDdeFGiJLMmNnopqrSTtWwx"
SRUN_SHORT_WITHOUT_VALUE = "EHhlOQsuVvXZ"
SRUN_SHORT_OPTIONAL_VALUE = "IKk"  # -I[secs], -K[0|1], -k[off]: a value only in the same word
# srun's long options that take no value, or only an attached one (`--nice=5`: `--nice 5` runs `5`),
# and pyxis's flags; a word after any other long option may be its value (pyxis's --container-image,
# options this table does not know).
SRUN_LONG_WITHOUT_VALUE = frozenset((
    "async", "bcast", "compress", "consolidate-segments", "contiguous", "debugger-test", "disable-status",
    "exact", "exclusive", "external-launcher", "help", "hold", "immediate", "interactive",
    "kill-on-bad-exit", "label", "multi-prog", "nice", "no-allocate", "no-kill", "oom-kill-step",
    "overcommit", "overlap", "oversubscribe", "parsable", "preserve-env", "propagate", "pty", "quiet",
    "quit-on-interrupt", "reboot", "resv-ports", "send-libs", "spread-job", "spread-segments", "stepmgr",
    "test-only", "unbuffered", "usage", "use-min-nodes", "verbose", "version", "wait-for-children",
    "whole", "x11",
    # pyxis
    "container-mount-home", "no-container-mount-home", "container-remap-root", "no-container-remap-root",
    "container-writable", "container-readonly", "container-entrypoint", "no-container-entrypoint",
    "container-entrypoint-log",
))  # fmt: skip


# Every long option of srun (22.05 to 25.x, slurm_opt.c's and srun's own) and pyxis, to read a prefix
# against: one left out could make an ambiguous prefix look unique here, so the list errs on the side
# of more names (older ones srun no longer has stay).
SRUN_LONG_OPTIONS = SRUN_LONG_WITHOUT_VALUE | frozenset(SRUN_OWNED) | frozenset((
    "accel-bind", "account", "acctg-freq", "autocomplete", "bb", "bbf", "bcast-exclude", "begin", "chdir",
    "cluster", "cluster-constraint", "clusters", "comment", "constraint", "container", "container-id", "context",
    "core-spec", "cores-per-socket", "cpu-bind", "cpu_bind", "cpu-freq", "cpus-per-gpu", "cpus-per-task",
    "deadline", "delay-boot", "dependency", "distribution", "epilog", "error", "exclude", "export",
    "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket",
    "gpus-per-task", "gres", "gres-flags", "het-group", "hint", "ignore-signals", "input", "jobid", "job-name", "licenses",
    "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem_bind", "mem-update", "mem-per-cpu", "mem-per-gpu",
    "mincpus", "mpi", "msg-timeout", "network", "nodefile", "nodelist", "ntasks-per-core",
    "ntasks-per-gpu", "ntasks-per-socket", "ntasks-per-tres", "open-mode", "output", "pack-group",
    "partition", "power", "prefer", "priority", "profile", "prolog", "qos", "relative", "reservation",
    "resources", "runtime", "segment", "signal",
    "slurmd-debug", "sockets-per-node", "switches", "task-epilog", "task-prolog", "thread-spec", "threads",
    "threads-per-core", "time", "time-min", "tmp", "treewidth", "tres-bind", "tres-per-task", "uid", "wait", "wckey",
    # pyxis
    "container-image", "container-mounts", "container-workdir", "container-name", "container-save",
    "container-env",
))  # fmt: skip


def srun_long_option(name: str) -> str:
    """The long option srun reads `--name` as: its getopt takes a unique prefix (`--lab` is --label,
    `--ntasks-per-n` --ntasks-per-node), so the checks here must too. A full name, an ambiguous
    prefix (srun refuses it) or an unknown one is returned as given."""
    if name in SRUN_LONG_OPTIONS:
        return name
    matches = [option for option in SRUN_LONG_OPTIONS if name and option.startswith(name)]
    return matches[0] if len(matches) == 1 else name


def takes_the_next_word(option: str) -> bool:
    """Whether srun may read the word after `option` as its value: not after `--` (the command
    follows), `--name=value`, a flag (bundled ones too: `-lu`), or a short option with its value in
    the same word (`-N2`); yes after any option the tables above do not know."""
    if option == "--" or not option.startswith("-") or "=" in option:
        return False
    if option.startswith("--"):
        return srun_long_option(option[2:]) not in SRUN_LONG_WITHOUT_VALUE
    for position, letter in enumerate(option[1:], start=2):
        if letter in SRUN_SHORT_OPTIONAL_VALUE:
            return False
        if letter in SRUN_SHORT_WITH_VALUE:
            return position == len(option)  # `-N` alone: the value is the next word
        if letter not in SRUN_SHORT_WITHOUT_VALUE:
            return True
    return False


def complete_without_it(option: str) -> str:
    """Why the word after `option` is not its value, for the error."""
    if option == "--":
        return "ends srun's options"
    if any(letter in SRUN_SHORT_WITH_VALUE for letter in option[1:]) and not option.startswith("--"):
        return "has its value already"
    return "takes no value, or only one in the same word"


def slurm_time(key: str, value: Any) -> Any:
    """sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    if value in (None, "") or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, str) and (SLURM_TIME.match(value) or value.upper() in SLURM_TIME_WORDS):
        return value
    raise ConfigError(
        f"{key}: {value!r} is not a Slurm time; use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
        " (e.g. 04:00:00)"
    )


def slurm_time_seconds(value: Any) -> int | None:
    """Seconds of a Slurm time (`slurm_time`'s forms; a bare number is minutes); None: no limit
    (as Slurm reads 0, UNLIMITED and INFINITE)."""
    seconds = _slurm_time_seconds(value)
    return seconds or None


def _slurm_time_seconds(value: Any) -> int | None:
    if value in (None, "") or (isinstance(value, str) and value.upper() in SLURM_TIME_WORDS):
        return None
    if isinstance(value, int):
        return 60 * value
    days, _, clock = value.rpartition("-") if "-" in value else ("", "", value)
    parts = [int(part) for part in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:  # minutes
        return 60 * parts[0]
    if len(parts) == 2:  # MM:SS
        return 60 * parts[0] + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def env_vars(key: str, value: Any) -> dict[str, Any] | None:
    """Names bash can export ([A-Za-z_][A-Za-z0-9_]*), each with one value."""
    for name, item in (mapping(key, value) or {}).items():
        if not ENV_NAME.match(str(name)):
            raise ConfigError(
                f"{key}.{name}: not a valid environment variable name (letters, digits and _, not first a digit)"
            )
        scalar(f"{key}.{name}", item)
    return value


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
    "cpus-per-task": "data_preparation.workers (the training stage has no such key)",
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
}


def keeps_the_environment(option: str, value: Any) -> bool:
    """`export: ALL` (or `ALL,NAME=value`): Slurm's default, the whole environment kept, harmless."""
    return option == "export" and str(value).split(",")[0].strip().upper() == "ALL"


# sbatch's options with --mem (cluster.mem), which it refuses together ("mutually exclusive").
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
    spelt = f"--{meant[0]}" if meant[0] == option else f"--{meant[0]} (which --{option} abbreviates)"
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
        if item is False or isinstance(item, dict | list):
            raise ConfigError(
                f"{where}: expected one value, true (a bare --{option}) or null (left out), got {_type_name(item)}"
            )
    return value


def check_memory_options(cluster: dict[str, Any]) -> None:
    """--mem-per-cpu/--mem-per-gpu with cluster.mem's --mem: sbatch refuses the job ('mutually exclusive')."""
    extra = cluster.get("additional_parameters") or {}
    for name, item in extra.items():
        meant = options_meant(sbatch_option(name))  # `mem_per_c` is --mem-per-cpu to sbatch
        if meant[0] in SBATCH_MEM_OPTIONS and item is not None and cluster.get("mem") is not None:
            raise ConfigError(
                f"cluster.additional_parameters.{name}: sbatch refuses it together with --mem, which"
                f" cluster.mem={cluster['mem']} renders; set cluster.mem=null to use it"
            )


def workers(key: str, value: Any) -> Any:
    """A process count, or `auto` (every CPU the task is given)."""
    return value if str(value).strip().lower() == "auto" else count(key, value)


TOP: dict[str, Check] = {
    "base_results_dir": scalar,
    "data_dir": scalar,
    "python": scalar,
    "container": scalar,
    "container_mounts": words,
    "wandb_api_key_file": scalar,
    "env_vars": env_vars,
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
    "stderr_to_stdout": boolean,
    "gpus_per_node": non_negative,
    "gpus_per_task": non_negative,
    "srun_args": command_words,
    "signal_seconds": signal_seconds,
    "max_requeues": non_negative,
    "env_vars": env_vars,
    "additional_parameters": additional_parameters,
    "validation": mapping,
}
RUN: dict[str, Check] = {
    "name": scalar,
    "results_dir": scalar,
    "time_limit": slurm_time,
    "dependency": scalar,
}
STAGE: dict[str, dict[str, Check]] = {
    "training": {"trainer": mapping, "trainer.num_nodes": count, "trainer.devices": count},
    "data_preparation": {
        "workers": workers,
        "blend": mapping,
        "run.node_array_size": count,
        "retries": non_negative,  # attempts; 0 makes one, as 1 does
        "backoff_seconds": seconds,
        "timeout_seconds": timeout_seconds,
    },
    "validation": {"checks": scalar},
}


# Every top-level key the launcher reads (TOP's, the stage switches and paths, the group sections).
# Any other is left alone, as a root the user interpolates from (`${my_root}/data`) may be, unless
# it is a letter or two from one of these: `env_var:` for env_vars would export nothing, unseen.
TOP_READ = (
    *TOP, "stages", "cluster_type", "unique_output", "launcher_scripts_path", "bignlp_path",
    "cluster", "data_preparation", "validation", "training",
)  # fmt: skip


def _check_misspelt_top_keys(resolved: dict[str, Any], roots: set[str]) -> None:
    """`roots`: the top-level keys an interpolation reads (`${data_dir2}/x`): kept, however close."""
    for key in resolved:
        if key in TOP_READ or key in roots:
            continue
        close = difflib.get_close_matches(str(key), TOP_READ, n=1, cutoff=0.85)
        if close:
            raise ConfigError(f"{key}: not a key the launcher reads; did you mean '{close[0]}'?")


def check_launch_sections(resolved: dict[str, Any], roots: set[str] = frozenset()) -> None:
    """Check (and normalize in place: a string -> a one-item list) the keys the launcher reads itself;
    `roots` are the top-level keys interpolations read (see _check_misspelt_top_keys)."""
    _check_misspelt_top_keys(resolved, roots)
    _check_keys(resolved, "", TOP)
    cluster = mapping("cluster", resolved.get("cluster"))
    if cluster is not None:
        check_cluster_section(cluster)
        check_one_container_image(resolved.get("container"), cluster.get("srun_args") or [])
    stages = list(resolved.get("stages") or [])
    needed = set(stages) | ({"training"} if "validation" in stages else set())
    for stage in sorted(needed):
        section = resolved.get(stage)
        if not isinstance(section, dict):
            raise ConfigError(
                f"{stage}: expected a mapping (the stage's config), got {_type_name(section)};"
                f" pick a file with {stage}=<name> or set keys with {stage}.<key>=value"
            )
        run = mapping(f"{stage}.run", section.get("run"))
        if run is not None:
            _check_keys(run, f"{stage}.run.", RUN)
        _check_keys(section, f"{stage}.", STAGE.get(stage, {}))


def check_one_container_image(container: Any, srun_args: list[str]) -> None:
    """An image in cluster.srun_args (copied from a tutorial's srun line) beside `container`: pyxis
    refuses a second, different --container-image ('specified multiple times') as the step starts,
    after the queue wait; refused here, naming both."""
    if not container:
        return  # without a container, srun_args' pyxis options are left out of the job
    for index, arg in enumerate(srun_args):  # (zip with the words before failed on an empty list)
        before = srun_args[index - 1] if index else ""
        image = arg.removeprefix("--container-image=") if arg.startswith("--container-image=") else None
        image = arg if before == "--container-image" else image
        if image is not None and image != str(container):
            raise ConfigError(
                f"cluster.srun_args: --container-image {image} beside container={container}: pyxis refuses"
                " a second image when the job starts ('--container-image specified multiple times'); give"
                " the image as container only"
            )


def check_cluster_section(cluster: dict[str, Any]) -> None:
    """A cluster file's keys: spelling and types (normalized in place). `gptrain plan --measure
    --cluster-type slurm` renders its trial jobs from one too."""
    check_unknown_cluster_keys(cluster)
    _check_keys(cluster, "cluster.", CLUSTER)
    check_memory_options(cluster)


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
