"""Checks of single launch keys (counts, seconds, Slurm times, env var names); an error names the key."""

from __future__ import annotations

import math
import re
from typing import Any

from gptrain.errors import ConfigError

# Environment variable names bash accepts in `export NAME=value`.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A `~` opening an env_vars value or a part of it after `:`, up to the next `/` or `:`: NeMo's
# unquoted `export NAME=value` expands it as it assigns (`~/hf`, `~/bin:$PATH`); gptrain renders a
# bare `~` as $HOME (script_quoting.env_value).
TILDE_PREFIX = r"(?:^|(?<=:))~[^/:]*"
# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (and its words for none).
SLURM_TIME = re.compile(r"^(?:\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2})$")
SLURM_TIME_WORDS = ("INFINITE", "UNLIMITED")
# sbatch --signal takes at most 65535 seconds; 0 would leave no time to save a checkpoint.
MAX_SIGNAL_SECONDS = 65535


def type_name(value: Any) -> str:
    """A value and its type, for an error: `2.5 (float)`."""
    return f"{value!r} ({type(value).__name__})"


def _integer(key: str, value: Any, low: int, high: int | None = None) -> int | None:
    """An int, text that is one (`${oc.env:NODES}` resolves to text) or a whole float (`2.0`, `1e3`:
    a NeMo config's DictConfig passes it to Lightning, which counts with it), as the training
    loader reads it; kept as the int, so a script never renders `--nodes=2.0`."""
    if value is None:
        return None
    if isinstance(value, str) and not value.strip():  # `num_nodes=$NN`, NN unset
        raise ConfigError(
            f"{key}: empty; give a whole number (on the command line, a $VARIABLE the shell found unset is empty)"
        )
    from gptrain.config.yamlio import as_int  # the config package loads omegaconf: not at start-up

    whole_float = isinstance(value, float) and value.is_integer()
    number = int(value) if whole_float else as_int(value)
    if number is None:
        raise ConfigError(f"{key}: expected a whole number, got {type_name(value)}")
    value = number
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise ConfigError(f"{key}: expected a whole number {bound}, got {value}")
    return value


def count(key: str, value: Any) -> int | None:
    """A whole number >= 1 (None: the default applies)."""
    return _integer(key, value, 1)


def count_given(key: str, value: Any) -> int:
    """A whole number >= 1 that has no default to fall back on (training.trainer.devices and
    num_nodes, which the launcher renders as tasks and nodes): null is refused, as the training's
    loader refuses it."""
    if value is None:
        raise ConfigError(f"{key}: must not be null; give a whole number 1 or more")
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
        raise ConfigError(f"{key}: expected a number of seconds, got {type_name(value)}")
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
        raise ConfigError(f"{key}: expected a mapping of keys (key.sub=value), got {type_name(value)}")
    return value


def scalar(key: str, value: Any) -> Any:
    """One value (a name, a path, a number), not a list or a mapping."""
    if isinstance(value, dict | list):
        raise ConfigError(f"{key}: expected a single value, got {type_name(value)}")
    return value


def boolean(key: str, value: Any) -> bool | None:
    """true/false as OmegaConf reads a bool field: also 1/0 (`cluster.exclusive=1`), yes/no, on/off."""
    if value is None:
        return None
    from gptrain.config.yamlio import as_switch  # the config package loads omegaconf: not at start-up

    switch = as_switch(value)
    if switch is None:
        raise ConfigError(f"{key}: expected true or false, got {type_name(value)}")
    return switch


def switch_of(section: Any, key: str, default: bool, where: str) -> bool:
    """An on/off key of a stage's section as the job reads it: `no`, `off`, a quoted 'false' are off
    (truthiness read the text as on); absent is `default`, null off; anything else a ConfigError."""
    return bool(boolean(f"{where}.{key}", section.get(key, default)))


# sbatch's --exclusive=<mode>: nodes shared only with the user's own jobs (user), jobs of the same
# MCS label (mcs), or within a topology segment (topo, Slurm 24.05+: preflight.EXCLUSIVE_MODE_SINCE).
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
            f" got {type_name(value)}"
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
        f"{key}: expected a string or a list of strings (e.g. {key}=[a,b]), got {type_name(value)}"
    )


def shard_list(key: str, value: Any) -> list[Any] | None:
    """data_preparation.shards: a list (each entry checked by shards.parse_shards); one URL as text is
    a one-item list, as a single word is elsewhere (iterated, it was one 'shard' per character)."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, str):
        return [value]
    raise ConfigError(
        f"{key}: expected a list of shard URLs (or mappings with url), e.g. {key}=[https://host/a.jsonl.zst],"
        f" got {type_name(value)}"
    )


# data_preparation.blend.weights: each shard weighed by its tokens, or all equally (data_blend.py).
BLEND_WEIGHTS = ("tokens", "equal")


def blend_weights(key: str, value: Any) -> str | None:
    """Checked at launch: the blend is written only once the last shard is prepared, hours later."""
    if value is None or (isinstance(value, str) and value in BLEND_WEIGHTS):
        return value
    shown = f"'{value}'" if isinstance(value, str) else type_name(value)
    raise ConfigError(f"{key} must be 'tokens' or 'equal', got {shown}")


def directory(key: str, value: Any) -> str:
    """A directory a stage's job writes into (no default to fall back on); a YAML int names one."""
    if value is None:
        raise ConfigError(f"{key}: must not be null; give a directory")
    if isinstance(value, bool | dict | list):
        raise ConfigError(f"{key}: expected a directory, got {type_name(value)}")
    return str(not_a_float(key, value))


def path_name(key: str, value: Any) -> Any:
    """A file or directory name: one value, not a float (see not_a_float)."""
    return scalar(key, not_a_float(key, value))


def not_a_float(key: str, value: Any) -> Any:
    """A path YAML read as a float is refused: `1e3` and `1.50` become 1000.0 and 1.5, another name
    than the one written (an exclude_file was then missing, silently). An int spelled otherwise than
    its digits (`2024_11_29`, `0123`) is refused where it is read (yamlio.NAME_KEYS)."""
    if isinstance(value, float):
        raise ConfigError(
            f"{key}: read as the number {value!r} (YAML reads 1e3 or 1.50 as a float), which names another"
            f" path than the one written; quote it: \"{key}='...'\" on the command line, '...' in a YAML file"
        )
    return value


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
        check_home_prefixes(f"{key}.{name}", str(item))
    return value


def check_home_prefixes(key: str, text: str) -> None:
    """`~user` (or bash's `~+`, `~-`) is another directory than the job's home, which is all a `~`
    of an env_vars value is rendered as: one line, as for a `~` on the command line."""
    for prefix in re.findall(TILDE_PREFIX, text):
        if prefix != "~":
            raise ConfigError(
                f"{key}: {text!r} starts a path with {prefix!r}, which gptrain does not expand (only ~ and"
                " ~/, as $HOME); write that directory in full"
            )


def workers(key: str, value: Any) -> Any:
    """A process count, or `auto` (every CPU the task is given)."""
    return value if str(value).strip().lower() == "auto" else count(key, value)
