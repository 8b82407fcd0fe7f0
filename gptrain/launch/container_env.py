"""pyxis's --container-env: the variables a job script exports keep their values inside the container.

pyxis sets the job's environment in the container after the image's entrypoint, but a variable the
image also defines keeps the image's value unless --container-env names it (NVIDIA/pyxis#124): NGC's
pytorch images set NCCL_IB_PCI_RELAXED_ORDERING=0, so the azure_nd_a100_v4 profile's 1 did nothing.
Every srun line with a container therefore names each variable the script exported before it: read
off the script's own `export` lines, so a variable gptrain exports later is named without a second
list. RANK, LOCAL_RANK, ... are set by the per-task wrapper inside the container and need nothing.

pyxis reads the option from 0.15.0 (March 2023); an older one refuses it as the step starts, so
`cluster.container_env=false` leaves it out (preflight says so where `srun --help` shows a pyxis
without it). A --container-env of cluster.srun_args is merged into the one rendered, as is the
job's PYXIS_CONTAINER_ENV, which pyxis reads only where no option is given.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.key_types import boolean
from gptrain.launch.script_quoting import env_lines
from gptrain.launch.srun_args import srun_long_option, srun_option_words

CONTAINER_ENV_KEY = "cluster.container_env"
# `export NAME=...` (or `export NAME` alone) opening a script line.
EXPORT_LINE = re.compile(r"^export ([A-Za-z_][A-Za-z0-9_]*)\b(.*)$", re.MULTILINE)
# pyxis reads it as its option where srun has none: kept beside the names rendered.
PYXIS_ENV_VARIABLE = "PYXIS_CONTAINER_ENV"


def container_env_on(cluster: dict[str, Any]) -> bool:
    """cluster.container_env: absent is on; false (pyxis before 0.15) leaves the option out."""
    return bool(boolean(CONTAINER_ENV_KEY, cluster.get("container_env", True)))


def exported_names(script: str) -> list[str]:
    """The variables `script` (the lines so far) exports, in order, once each. A value built from the
    variable itself (`PATH: /opt/x:$PATH`) is left out: the batch shell expands the host's value, which
    inside the image would replace the image's own (its PATH, its LD_LIBRARY_PATH)."""
    names: list[str] = []
    for name, value in EXPORT_LINE.findall(script):
        if not _from_own_value(name, value) and name not in names:
            names.append(name)
    return names


def _from_own_value(name: str, exported: str) -> bool:
    """Whether an export line's value (as env_lines renders it) reads the variable itself."""
    return f'"${{{name}-}}"' in exported


def own_value_note(top: dict[str, Any], cluster: dict[str, Any]) -> str | None:
    """A launch note naming the env_vars built from their own host value where a container is used:
    left out of --container-env, the image's value wins inside it and the user's part is lost unsaid."""
    if not top.get("container") or not container_env_on(cluster):
        return None
    lines = "\n".join(env_lines(top.get("env_vars")))
    names = list(
        dict.fromkeys(name for name, value in EXPORT_LINE.findall(lines) if _from_own_value(name, value))
    )
    if not names:
        return None
    many = len(names) > 1
    return (
        f"note  env_vars {', '.join(names)} {'are' if many else 'is'} built from {'their' if many else 'its'} own"
        f" host value (${names[0]}), so not named in --container-env (the host's whole value would replace the"
        f" image's): in container {top['container']} the image's value is kept; set {'them' if many else 'it'}"
        " in the image, or give the whole value without the reference to have it win"
    )


def without_container_env(args: list[str]) -> tuple[list[str], list[str]]:
    """cluster.srun_args less its --container-env options (`--container-env=A,B`, `--container-env
    A`), and the names they gave; only srun's own options, not a wrapper's after them."""
    options = len(srun_option_words(args))
    kept, names, value_next = [], [], False
    for index, arg in enumerate(args):
        if value_next:
            names += arg.split(",")
            value_next = False
            continue
        name, equals, value = arg[2:].partition("=")
        if index < options and arg.startswith("--") and srun_long_option(name) == "container-env":
            names += value.split(",") if equals else []
            value_next = not equals
            continue
        kept.append(arg)
    return kept, [name for name in names if name]


def container_env_option(exported: list[str], given: list[str]) -> list[str]:
    """One --container-env naming `exported` then `given` (srun_args'), once each, and the job's
    PYXIS_CONTAINER_ENV where it is set; one shell word (the names are checked identifiers). No
    names: no option (an empty one is refused by pyxis), and pyxis reads PYXIS_CONTAINER_ENV itself."""
    names = list(dict.fromkeys([*exported, *given]))
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(
                f"cluster.srun_args: --container-env names {name!r}, which is no environment variable"
                " name; give names separated by commas (--container-env=NAME1,NAME2)"
            )
    variable = f"${{{PYXIS_ENV_VARIABLE}:+,${PYXIS_ENV_VARIABLE}}}"
    return [f'--container-env="{",".join(names)}{variable}"'] if names else []


SRUN_HELP_TIMEOUT = 10.0


def check_srun_reads_container_env(cluster: dict[str, Any], timeout: float = SRUN_HELP_TIMEOUT) -> None:
    """`srun --help` lists pyxis's options: one that has --container-image but no --container-env is
    older than 0.15 and would refuse every step as it starts, after the queue wait. Where srun does not
    answer, or lists no pyxis at all (the plugin loaded only on the compute nodes), nothing is said."""
    if not container_env_on(cluster):
        return
    try:
        out = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return
    text = out.stdout + out.stderr
    if "--container-image" in text and "--container-env" not in text:
        raise LaunchError(
            f"{CONTAINER_ENV_KEY}: this srun's pyxis has no --container-env (pyxis 0.15 added it), which"
            " the job's srun lines pass so that env_vars win over the image's own values; upgrade pyxis,"
            f" or set {CONTAINER_ENV_KEY}=false (a variable the image also sets then keeps the image's value)"
        )
