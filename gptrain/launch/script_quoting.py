"""Config values made script text: one quoted shell word each, so a value never runs as a command."""

from __future__ import annotations

import re
import shlex

from gptrain.errors import ConfigError
from gptrain.launch.key_types import ENV_NAME, TILDE_PREFIX, check_home_prefixes
from gptrain.launch.script_values import CONTROL, describe


class Raw(str):
    """A piece of fixed script text (e.g. `"$SLURM_ARRAY_TASK_ID"`) that must not be quoted."""


def escape_percent(text: str) -> str:
    """Text that Slurm's filename patterns (--output, --error) read back as itself."""
    return text.replace("%", "%%")


def dash_safe(path: str) -> str:
    """A relative path as a command's argument: `-x` as `./-x` (the same file), which no parser
    takes for an option."""
    return f"./{path}" if path.startswith("-") else path


def quote(value: object, what: str) -> str:
    """shlex.quote, refusing control characters: a newline inside quotes still ends an #SBATCH line.

    The launcher checks the config keys first (script_values); this is the last line of defence.
    """
    text = str(value)
    if CONTROL.search(text):
        raise ConfigError(
            f"{what}: the value {text!r} contains {describe(text)}; it cannot go into a job script"
        )
    return shlex.quote(text)


def quote_command(command: list[str]) -> str:
    """Fixed text and paths (checked by key in script_values); quoted, so one word each for bash."""
    return " ".join(part if isinstance(part, Raw) else shlex.quote(str(part)) for part in command)


def env_lines(env_vars: dict[str, object] | None) -> list[str]:
    lines = []
    for key, value in (env_vars or {}).items():
        if not ENV_NAME.match(str(key)):
            raise ConfigError(f"env_vars key '{key}' is not a valid environment variable name")
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"export {key}={env_value(text, f'env_vars.{key}')}")
    return lines


# `$NAME` or `${NAME}` inside an env_vars value: expanded when the job starts, as NeMo's unquoted export does.
# (`$_`, bash's last argument, is no name: it stays text.)
ENV_REFERENCE = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|((?!_(?![A-Za-z0-9_]))[A-Za-z_][A-Za-z0-9_]*))"
)


# `\$` is a literal `$`, as in NeMo's unquoted export (`pa\$word`: no reference to expand); a run
# of backslashes before `$` escapes it only when odd (`\\$HOME` is a backslash pair, then $HOME).
# A bare `~` opening the value or a part after `:` is $HOME, as that export expands it (key_types).
ENV_TOKEN = re.compile(r"(?<!\\)(?:\\\\)*\\\$|" + ENV_REFERENCE.pattern + f"|{TILDE_PREFIX}")


def env_value(text: str, what: str) -> str:
    """`text` for `export NAME=...`: variable references expand (unset: empty, as without `set -u`),
    a tilde prefix `~` is $HOME, `\\$` is `$`, everything else is quoted literally, so `$(...)`,
    backticks and `;` run nothing."""
    check_home_prefixes(what, text)  # `~user`: refused
    parts, literal, position = [], "", 0
    for token in ENV_TOKEN.finditer(text):
        literal += text[position : token.start()]
        position = token.end()
        if token.group().endswith("\\$"):  # an odd run of backslashes: the last one escapes the `$`
            literal += token.group()[:-2] + "$"
            continue
        if literal:
            parts.append(quote(literal, what))
            literal = ""
        parts.append(f'"${{{token.group(1) or token.group(2) or "HOME"}-}}"')
    literal += text[position:]
    if literal or not parts:
        parts.append(quote(literal, what))
    return "".join(parts)


def wandb_key_lines(key_file: object) -> list[str]:
    """NeMo's wandb_api_key_file: the job reads the W&B key when it starts; the key never enters the
    script. As in NeMo, the key is the file's first line, without its line ending (a CRLF file's `\r`
    or a second line would otherwise be part of the key, which W&B refuses)."""
    if not key_file:
        return []
    first_line = f"head -n 1 -- {quote(key_file, 'wandb_api_key_file')} | tr -d '[:space:]'"
    return [f'export WANDB_API_KEY="$({first_line})"']
