"""Refuse config values that cannot be rendered into a shell script safely.

`shlex.quote` makes any text one shell word, but a newline inside quotes still ends an
`#SBATCH` line: sbatch reads its directives one line at a time, so the rest of the value
would become a line of the batch shell. No control character (C0, DEL) has a use in a
partition, a path, a job name or an environment value, so every value that reaches a
script is checked here, by its key, before the launcher writes anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from gptrain.errors import ConfigError, non_utf8, printable

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
NAMES = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte", "\t": "a tab"}

# Top-level keys of the launch config whose values reach a script (directly or through paths).
TOP_KEYS = ("base_results_dir", "data_dir", "python", "container", "container_mounts", "env_vars")
# Whole subtrees of each stage section that reach a script (names, paths, Slurm time/dependency).
STAGE_KEYS = ("run",)
# Single keys of stage sections that reach a script (the blend file is an argument of a setup line).
STAGE_VALUES = {"data_preparation": ("blend.file",)}


def describe(text: str) -> str:
    """'a newline', 'a NUL byte', or 'control character 0x1b' for the first one in `text`."""
    match = CONTROL.search(text)
    char = match.group() if match else ""
    return NAMES.get(char, f"control character 0x{ord(char):02x}")


def not_utf8(text: str) -> str | None:
    """'the byte 0xff' for the first byte of `text` that was not UTF-8, None when all text is."""
    bad = non_utf8(text)
    return None if bad is None else f"the {bad[1]}"


def utf8_error(where: str, text: str) -> ConfigError | None:
    bad = not_utf8(text)
    if bad is None:
        return None
    return ConfigError(
        f"{where}: '{printable(text)}' is not UTF-8 text ({bad}); the job scripts and configs are UTF-8:"
        " use a name or path in UTF-8"
    )


def check_value(key: str, value: object) -> None:
    """ConfigError naming `key` when `value` (or a dict key or item inside it) holds a control
    character or a byte that is not UTF-8."""
    for where, text in walk(key, value):
        if CONTROL.search(text):
            raise ConfigError(
                f"{where}: the value {text!r} contains {describe(text)}, which would break the rendered"
                " job script; remove it (values reaching sbatch/srun scripts must be one line)"
            )
        error = utf8_error(where, text)
        if error:
            raise error


def check_arguments(arguments: list[str]) -> None:
    """Every launch argument is written to launcher_cmd.log, and most reach a config or script."""
    for argument in arguments:
        error = utf8_error(f"the argument {argument.partition('=')[0]!r}", argument)
        if error:
            raise error


def walk(key: str, value: object) -> Iterator[tuple[str, str]]:
    """(dotted key, text) for every scalar, and every mapping key, under `value`."""
    if isinstance(value, dict):
        for sub, item in value.items():
            yield f"{key}.{sub}", str(sub)
            yield from walk(f"{key}.{sub}", item)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from walk(f"{key}[{index}]", item)
    elif value is not None:
        yield key, str(value)


def dotted_get(section: dict[str, Any], dotted: str) -> object:
    node: object = section
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def check_launch_values(resolved: dict[str, Any]) -> None:
    """Check every key of the resolved launch config that reaches a rendered script."""
    for key in TOP_KEYS:
        check_value(key, resolved.get(key))
    check_value("cluster", resolved.get("cluster"))
    cluster = resolved.get("cluster")
    prefix = cluster.get("job_name_prefix") if isinstance(cluster, dict) else None
    if prefix is not None and "/" in str(prefix):
        raise ConfigError(
            f"cluster.job_name_prefix {str(prefix)!r} must not contain '/' (it names the job's files)"
        )
    for stage in resolved.get("stages") or []:
        section = resolved.get(stage)
        if not isinstance(section, dict):
            continue
        for key in STAGE_KEYS:
            check_value(f"{stage}.{key}", section.get(key))
        for key in STAGE_VALUES.get(stage, ()):
            check_value(f"{stage}.{key}", dotted_get(section, key))
    cwd = os.getcwd()
    if CONTROL.search(cwd):
        raise ConfigError(
            f"the current directory {cwd!r} contains {describe(cwd)}; launch from another directory"
        )
    if not_utf8(cwd):
        raise ConfigError(
            f"the current directory '{printable(cwd)}' is not UTF-8 text ({not_utf8(cwd)}); launch from another directory"
        )
