"""What a container job mounts: the directories the launch wrote for it, then the user's mounts.

A job in a pyxis container sees only what `--container-mounts` brings in, and it fails as it
starts if its resolved config is not there. So, as the NeMo launcher does, every directory a job
reads or writes is mounted at the same path inside the container: `base_results_dir`, `data_dir`,
the `--config-dir` tree, and each stage's own paths (STAGE_PATHS), which a user may point outside
those two, e.g. `training.run.results_dir` or `training.exp_manager.explicit_log_dir` on scratch.
They come ahead of `container_mounts`, so that a user's mount nested inside one lands on top.
One already visible through another mount (inside one of ours, or inside a user mount's
destination, which would cover it anyway) is left out; a user mount over a run directory must show
that same directory, or the job would start without the config the launch wrote there.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptrain.data.blend_spec import prefixes_of, with_prefixes
from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.compose import CONFIG_ROOT
from gptrain.utils.paths import directory_blocker

# Per stage: the dotted keys (from the top of the config) of the directories its job reads or
# writes, and of the files whose directory it reads or writes.
STAGE_PATHS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "data_preparation": (
        (
            "data_preparation.run.results_dir",
            "data_preparation.download_dir",
            "data_preparation.output_dir",
        ),
        (
            "data_preparation.blend.file",
            "data_preparation.tokenizer.vocab_file",
            "data_preparation.tokenizer.merge_file",
        ),
    ),
    "validation": (("training.run.results_dir",), ()),  # it runs in the training's run dir
    "training": (
        (
            "training.run.results_dir",
            "training.exp_manager.explicit_log_dir",
            "training.exp_manager.tensorboard_dir",
            "training.exp_manager.checkpoint_callback_params.dirpath",
            "training.model.data.index_mapping_dir",
        ),
        ("training.model.tokenizer.vocab_file", "training.model.tokenizer.merge_file"),
    ),
}


@dataclass
class Mounts:
    """`--container-mounts` items in order, and the host directories gptrain added with the key
    that names each (the launch creates them: pyxis cannot mount a source that does not exist)."""

    items: list[str] = field(default_factory=list)
    added: list[tuple[str, str]] = field(default_factory=list)


def lookup(resolved: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key, or None where any part is missing."""
    value: Any = resolved
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def parent(path: Any) -> str:
    """The directory of a file key's value ('' when unset)."""
    return os.path.dirname(str(path)) if path else ""


def stage_paths(resolved: dict[str, Any], stage: str) -> list[tuple[str, str]]:
    """(key, directory) of each path of one stage's job that is set."""
    dir_keys, file_keys = STAGE_PATHS[stage]
    paths = [(key, lookup(resolved, key)) for key in dir_keys]
    paths += [(key, parent(lookup(resolved, key))) for key in file_keys]
    return [(key, str(path)) for key, path in paths + optional_paths(resolved, stage) if path]


def optional_paths(resolved: dict[str, Any], stage: str) -> list[tuple[str, str]]:
    """The paths a stage's job uses only in some configs."""
    paths = []
    model_key = f"{'training.model' if stage == 'training' else stage}.tokenizer.model"
    model = lookup(resolved, model_key) if stage != "validation" else None
    if isinstance(model, str) and os.path.isabs(model):  # a relative one may be a name (cl100k_base)
        paths.append((model_key, parent(model)))
    if stage == "validation" and lookup(resolved, "validation.exclude_failed"):  # the job adds to it
        paths.append(("validation.exclude_file", parent(lookup(resolved, "validation.exclude_file"))))
    if stage == "training":
        paths += resume_sources(resolved)
    if stage == "training" and "data_preparation" not in (resolved.get("stages") or []):  # else: the blend's
        key = "training.model.data.data_prefix"
        paths += [(key, parent(prefix)) for prefix in prefixes_of(lookup(resolved, key))]
    return paths


RESUME_KEYS = (
    "training.exp_manager.resume_from_checkpoint",
    "training.model.resume_from_checkpoint",
    "training.model.restore_from_ckpt",
)


def resume_sources(resolved: dict[str, Any]) -> list[tuple[str, str]]:
    """The checkpoint a training starts from (any of NeMo's spellings), where it exists here: a
    path outside the results directories was not mounted, so the job found nothing there. One that
    does not exist is not mounted (pyxis needs the source; creating it would hide the typo), and
    the training then names it."""
    paths = []
    for key in RESUME_KEYS:
        value = lookup(resolved, key)
        if isinstance(value, str) and value and os.path.isdir(value):
            paths.append((key, value))
    return paths


HOME_EXPANDED = (  # the paths training expands ~ in (as Lightning's ModelCheckpoint does dirpath)
    "training.exp_manager.tensorboard_dir",
    "training.exp_manager.checkpoint_callback_params.dirpath",
)


def with_absolute_paths(resolved: dict[str, Any]) -> dict[str, Any]:
    """`resolved` with the relative paths its jobs use (STAGE_PATHS, the data prefixes, a tokenizer
    model file that exists here) made absolute against the launch's working directory. Inside a
    container the job starts in the image's WORKDIR (pyxis ignores srun's --chdir), where
    `data/corpus_text_document` would name nothing; the same directories are mounted there."""
    resolved = copy.deepcopy(resolved)
    _filepath_as_dirpath(resolved)
    keys = [key for stage in STAGE_PATHS.values() for group in stage for key in group]
    for key in keys:  # base_results_dir and data_dir: compose.absolutize_paths made them absolute
        value = lookup(resolved, key)
        if key in HOME_EXPANDED and isinstance(value, str):  # as training reads them: ~ first
            value = os.path.expanduser(value)
        if isinstance(value, str) and value and not os.path.isabs(value):
            value = os.path.abspath(value)
        if value != lookup(resolved, key):
            set_at(resolved, key, value)
    for key in ("training.model.tokenizer.model", "data_preparation.tokenizer.model", *RESUME_KEYS):
        value = lookup(resolved, key)  # a relative one may be a name (cl100k_base): only a path here
        if isinstance(value, str) and not os.path.isabs(value) and os.path.exists(value):
            set_at(resolved, key, os.path.abspath(value))
    key = "training.model.data.data_prefix"
    if lookup(resolved, key) is not None:
        set_at(resolved, key, absolute_prefixes(lookup(resolved, key)))
    return resolved


def _filepath_as_dirpath(resolved: dict[str, Any]) -> None:
    """NeMo's deprecated checkpoint_callback_params.filepath is dirpath=<its directory> where dirpath is
    null, as training reads it: set here so that it is mounted and made absolute as dirpath is."""
    key = "training.exp_manager.checkpoint_callback_params"
    filepath = lookup(resolved, f"{key}.filepath")
    if isinstance(filepath, str) and filepath and not lookup(resolved, f"{key}.dirpath"):
        set_at(resolved, f"{key}.dirpath", os.path.dirname(filepath) or ".")


def absolute_prefixes(data_prefix: Any) -> Any:
    """A data_prefix (one, a [weight, prefix, ...] blend, or per split) with absolute prefixes."""
    return with_prefixes(data_prefix, os.path.abspath)


def set_at(resolved: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = resolved
    for part in parents:
        node = node[part]
    node[last] = value


def job_dirs(resolved: dict[str, Any], config_root: Path) -> list[tuple[str, str]]:
    """(key, absolute path) of each directory a job of this launch reads or writes."""
    dirs = [(key, resolved.get(key)) for key in ("base_results_dir", "data_dir")]
    if config_root != CONFIG_ROOT:
        dirs.append(("--config-dir", str(config_root)))
    for stage in resolved.get("stages") or []:
        dirs += stage_paths(resolved, str(stage)) if stage in STAGE_PATHS else []
    absolute = [(key, os.path.abspath(str(path))) for key, path in dirs if path]
    return [(key, path) for key, path in absolute if path != "/"]  # the root is no mount: a file at /


def parse_mount(text: str) -> tuple[str, str]:
    """pyxis's `SRC[:DST[:FLAGS]]` -> (src, dst); a lone SRC is mounted at the same path."""
    parts = text.split(":")
    return os.path.normpath(parts[0]), os.path.normpath(parts[1] if len(parts) > 1 else parts[0])


# pyxis's mount sources besides paths: a fresh tmpfs, or the removal of an image's mount.
PYXIS_SPECIAL_SOURCES = ("tmpfs", "umount")


def check_pyxis_mount(item: str) -> None:
    """pyxis's own rules for a `--container-mounts` item (SRC[:DST[:FLAGS]], ',' between several),
    which it applies only as the job starts, after the queue wait: no empty entry, source or
    destination; each a path starting with '/' or '.' (`data:/data` or `~/data` is refused there),
    or the source tmpfs or umount."""
    for entry in item.split(","):
        src, colon, rest = entry.partition(":")
        dst = rest.partition(":")[0] if colon else src
        if not src or not dst:
            why = "an empty mount" if not entry else "an empty source or destination"
        elif not src.startswith(("/", ".")) and src not in PYXIS_SPECIAL_SOURCES:
            why = f"its source {src!r} is not a path starting with '/' or '.' (nor tmpfs or umount)"
        elif not dst.startswith(("/", ".")):
            why = f"its destination {dst!r} is not a path starting with '/' or '.'"
        else:
            continue
        raise ConfigError(
            f"container_mounts: {item!r}: {why}, which pyxis refuses as the job starts; give"
            " SRC[:DST[:FLAGS]] with absolute paths (or ./relative ones)"
        )


def is_visible(path: str, mounts: list[tuple[str, str]]) -> bool:
    """Inside a mount's destination already: at `path` in the container, or covered there by a
    mount of something else (which a mount of ours ahead of it could not show)."""
    return any((path + "/").startswith(dst.rstrip("/") + "/") for _, dst in mounts)


def container_mounts(resolved: dict[str, Any], config_root: Path) -> Mounts:
    """gptrain's directories (job_dirs, deduplicated) followed by `container_mounts` as given."""
    user = [str(item) for item in resolved.get("container_mounts") or []]
    for item in user:
        check_pyxis_mount(item)
    entries = [entry for item in user for entry in item.split(",") if entry]
    given = [parse_mount(entry) for entry in entries]
    ours = job_dirs(resolved, config_root)
    check_run_dirs_shown(ours, entries)
    mounts = Mounts()
    for index, (key, path) in enumerate(ours):
        # another of ours that holds this one (or is the same and comes first) brings it in already
        other = [(p, p) for i, (_, p) in enumerate(ours) if p != path or i < index]
        if is_visible(path, given + other):
            continue
        if "," in path or ":" in path:
            raise ConfigError(
                f"{key}: {path!r} cannot be mounted into the container: pyxis --container-mounts"
                " reads ',' between mounts and ':' between source and destination; use a path without them"
            )
        mounts.added.append((key, path))
    mounts.items = [f"{path}:{path}" for _, path in mounts.added] + user
    return mounts


# The directories the launch writes a job's files to for the job to read there (its resolved
# config, requeues.txt, the frozen blend).
RUN_DIR_KEYS = ("training.run.results_dir", "data_preparation.run.results_dir")


def check_run_dirs_shown(ours: list[tuple[str, str]], entries: list[str]) -> None:
    """A user mount over a run directory lands on top of gptrain's (theirs come after), so the job
    found the mount's source there, without its config, after the queue wait. Refused, unless the
    source is that directory (`/fsx` a symlink to `/lustre`); of several over it, pyxis mounts the
    last on top. A read-only one (`/r4:/r4:ro`) shows it but leaves the job unable to write there."""
    for key, path in ours:
        covering = [entry for entry in entries if is_visible(path, [parse_mount(entry)])]
        if key not in RUN_DIR_KEYS or not covering:
            continue
        src, dst = parse_mount(covering[-1])
        shown = os.path.normpath(os.path.join(src, os.path.relpath(path, dst)))
        if os.path.realpath(shown) != os.path.realpath(path):  # tmpfs/umount: never the same
            found = {"tmpfs": "an empty tmpfs", "umount": "the image's own directory"}.get(src, shown)
            raise ConfigError(
                f"container_mounts: {covering[-1]!r} is mounted over {key} ({path}), so the job would find"
                f" {found} there, not the run directory the launch writes its config to; mount {dst} itself"
                f" there, or move the run directory (base_results_dir, {key}) outside {dst}"
            )
        if "ro" in mount_flags(covering[-1]):  # it shows the directory, and gptrain's rw mount is left out
            raise ConfigError(
                f"container_mounts: {covering[-1]!r} mounts {key} ({path}) read-only, and the run directory"
                " must be writable (the job writes its log, config and checkpoints there): drop ro from it,"
                f" or mount {path} writable after it"
            )


def mount_flags(text: str) -> list[str]:
    """The flags of pyxis's `SRC:DST:FLAGS` (several joined by '+', as `rbind+ro`)."""
    parts = text.split(":")
    return parts[2].split("+") if len(parts) > 2 else []


def cannot_mount(key: str, path: str, why: str) -> LaunchError:
    return LaunchError(
        f"{key}: cannot create {path} to mount it into the container ({why});"
        f" create it yourself or set {key} to a writable path"
    )


def check_mount_dirs(added: list[tuple[str, str]]) -> list[str]:
    """Preflight: each directory to mount exists or can be created."""
    for key, path in added:
        why = directory_blocker(path)
        if why:
            raise cannot_mount(key, path, why)
    return [f"ok  container mounts: {len(added)} director(ies) there or creatable"] if added else []


def make_mount_dirs(added: list[tuple[str, str]]) -> None:
    """Create the directories to mount (pyxis cannot mount a source that does not exist)."""
    for key, path in added:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise cannot_mount(key, path, error.strerror or type(error).__name__) from None
