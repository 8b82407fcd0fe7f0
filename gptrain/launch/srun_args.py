"""cluster.srun_args read as srun reads them: a word that would break the step fails before the queue wait."""

from __future__ import annotations

import shlex
from typing import Any

from gptrain.errors import ConfigError
from gptrain.launch.additional_parameters import keeps_the_environment
from gptrain.launch.key_types import words


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
    check_no_task_layout_option(key, srun_option_words(args or []))  # not a wrapper's own (nsys -n)
    check_export_keeps_the_environment(key, args or [])
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


def check_export_keeps_the_environment(key: str, args: list[str]) -> None:
    """srun's --export without ALL passes only the variables it names (and SLURM_*), and srun_args
    come after gptrain's --export=ALL: every step failed as it started, after the queue wait
    (execve(): bash: No such file or directory), without PATH, env_vars or the rendezvous variables.
    `--export` last takes no value here: srun would read the `bash` that follows as its value. A
    wrapper's own option (`nsys profile --export=sqlite`) is no srun option. Of several, srun takes
    the last."""
    options = srun_option_words(args)
    exports = []  # (the word, its value); srun takes the last one given
    for index, arg in enumerate(options):
        name, equals, value = arg[2:].partition("=")
        if arg.startswith("--") and srun_long_option(name) == "export":
            exports.append((arg, value if equals else (args[index + 1] if index + 1 < len(args) else "")))
    for arg, given in exports[-1:]:
        if not keeps_the_environment("export", given):
            raise ConfigError(
                f"{key}: {arg!r} sets srun's --export without ALL, so the ranks would start without PATH,"
                " env_vars or the rendezvous variables; give the variables as env_vars or cluster.env_vars"
                " (or --export=ALL,NAME=value)"
            )


def srun_option_words(args: list[str]) -> list[str]:
    """The words srun reads as its options: those before a wrapper command the list ends in
    (`[--mpi=pmix, nsys, profile]`: a word that is neither an option nor the value of the one before
    it) or `--`."""
    for index, word in enumerate(args):
        before = args[index - 1] if index else None
        if word == "--" or not (word.startswith("-") or (before is not None and takes_the_next_word(before))):
            return args[:index]
    return args


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
