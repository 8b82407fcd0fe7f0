"""Slurm host lists (`n[1-2],gpu-[01-04,07]`) expanded to host names; no torch, no Slurm needed."""

from __future__ import annotations

import re
from pathlib import Path

from gptrain.errors import ConfigError, LaunchError


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a Slurm host list: `n[1-2],gpu-[01-04,07]` -> [n1, n2, gpu-01, ...]."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not match:
            if "[" in item or "]" in item:
                raise LaunchError(
                    f"cannot parse host list item {item!r} (Slurm's form: n[1-3,7],gpu-[01-04])"
                )
            if item:
                hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for name in _expand_ranges(ranges, item):
            hosts.extend(expand_hostlist(prefix + name + suffix))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_ranges(ranges: str, item: str) -> list[str]:
    """`01-03,07` -> [01, 02, 03, 07], keeping zero padding."""
    names: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise LaunchError(f"bad range {part!r} in host list item {item!r}")
        width = len(low)
        names.extend(f"{n:0{width}d}" for n in range(int(low), int(high or low) + 1))
    return names


HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")
"""What a node's name is made of; a comment or a space-separated pair is not one."""


def read_hostlist_file(path: Path, name: str) -> str:
    """The Slurm host list an exclude file holds (its lines joined with commas; "" when empty),
    checked line by line: an unreadable file, or a line that does not parse or names no host (a
    `# comment`, hosts separated by spaces), is a ConfigError naming `name` (the key or flag that
    gave the file), the file and the line. `gptrain validate` writes such files, the launcher reads
    them into cluster.exclude (a comment reached `#SBATCH --exclude` as a node name)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"{name} {path}: cannot read it ({reason}); fix the file or delete it") from None
    for number, line in enumerate(lines, 1):
        problem = _not_a_host_list(line.strip())
        if problem:
            raise ConfigError(f"{name} {path}:{number}: {problem}; fix the file or delete it")
    return ",".join(line.strip() for line in lines if line.strip())


def _not_a_host_list(line: str) -> str | None:
    """Why one line of an exclude file is not a Slurm host list, or None (a blank line is none)."""
    try:
        hosts = expand_hostlist(line)
    except LaunchError as error:
        return str(error)
    odd = next((host for host in hosts if not HOST_NAME.fullmatch(host)), None)
    if odd is not None:
        return (
            f"{odd!r} is not a host name (one Slurm host list a line, n[1-3,7],gpu07; no comments, no spaces)"
        )
    return None
