"""Why a tokenizer file cannot be read, and its stamp: shared by every loader, so all say it alike."""

from __future__ import annotations

import os

from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import hub_name_advice


def missing_tokenizer_file(path: str, in_directory: str | None = None) -> str | None:
    """Why a tokenizer cannot read `path` ('<path> not found', '<path> is a directory ...'), or None;
    a directory holding `in_directory` will do. A directory was said to be "not found", and one the
    user may not search to have no `in_directory` in it."""
    found = look_up(path)
    if found.kind == "unreachable":
        return f"{path} {found.why}"
    if found.kind == "directory":
        if in_directory is None:
            return f"{path} is a directory, not a file"
        inner = look_up(os.path.join(path, in_directory))
        if inner.kind == "unreachable":
            return f"{os.path.join(path, in_directory)} {inner.why}"
        return None if inner.kind == "file" else f"{path} is a directory with no {in_directory} in it"
    return None if found.kind == "file" else f"{path} not found"


def hub_name_line(model: str, pass_as: str = "pass the local directory DIR") -> str | None:
    """The one line for a --tokenizer-model that is not there and reads as a hub name, or None."""
    advice = hub_name_advice(model, pass_as)
    return None if advice is None else f"--tokenizer-model {model} is not a local file or directory; {advice}"


def unreachable(path: str) -> str | None:
    """Why `path` cannot even be looked up, or None (also where it is not there): a directory above
    it that this user may not search (EACCES), which pathlib raised as a bare PermissionError."""
    found = look_up(path)
    return f"{path} {found.why}" if found.kind == "unreachable" else None


def file_stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
