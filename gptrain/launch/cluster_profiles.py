"""Cluster profiles by name: the bundled files (aws_p5, bcm, ...) and a user's own, resolved alike
for `validate --profile` and `plan --cluster` (one resolver, so both take the same names).

Standard library only: both commands run on login nodes without torch."""

from __future__ import annotations

from pathlib import Path

from gptrain.errors import ConfigError
from gptrain.utils.paths import look_up

CLUSTER_DIR = Path(__file__).resolve().parent.parent / "configs" / "cluster"


def profile_names() -> list[str]:
    return sorted(p.stem for p in CLUSTER_DIR.glob("*.yaml"))


YAML_SUFFIXES = (".yaml", ".yml")


def cluster_profile_path(name: str, option: str = "--profile") -> Path:
    """The cluster file `name` means, for `validate --profile` and `plan --cluster` alike: a bundled
    profile by name (`bcm`, `bcm.yaml`, NeMo's `cluster=bcm`) or a file of one's own, its .yaml
    optional as in the launcher's cluster=<name> (`conf/cluster/site`); one resolver, so both commands
    take the same names. Not found: one line naming `option` and the bundled profiles."""
    name = name.removeprefix("cluster=")
    given = Path(name)
    own = [given] if given.suffix in YAML_SUFFIXES else [*(Path(f"{name}{s}") for s in YAML_SUFFIXES), given]
    bundled = [CLUSTER_DIR / f"{given.stem if given.suffix in YAML_SUFFIXES else name}.yaml"]
    bundled = bundled if given.name == name and name not in ("", ".", "..") else []  # a bare name only
    # a path ending in .yaml is the user's file first; a bare name the bundled profile first
    for path in (own + bundled) if given.suffix in YAML_SUFFIXES else (bundled + own):
        if _is_file(path, option, name):
            return path
    known = ", ".join(profile_names())
    if _is_file(given, option, name) is None:  # a directory
        raise ConfigError(
            f"{option} {name}: is a directory; give a cluster file (YAML) or a profile name ({known})"
        )
    raise ConfigError(
        f"{option} {name}: no file {own[0]}{' and no bundled profile of that name' if bundled else ''};"
        f" give a bundled profile ({known}) or the path of a cluster file"
    )


def _is_file(path: Path, option: str, name: str) -> bool | None:
    """Whether `path` is a file (None: a directory); a directory above it that this user may not
    search is one line (Path.is_file raises PermissionError there)."""
    found = look_up(path)
    if found.kind == "unreachable":
        raise ConfigError(f"{option} {name}: {path} {found.why}")
    return None if found.kind == "directory" else found.kind == "file"
