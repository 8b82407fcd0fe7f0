"""The checkpoint root's layout: step directories, the `latest` marker, finding a checkpoint to load.

step_<N>/            one checkpoint (complete once it holds COMPLETE: gptrain.checkpoint.integrity)
latest               'step_<N>', rewritten atomically after COMPLETE
step_<N>.damaged-<time>/  a checkpoint resume passed over, renamed by rank 0 (kept, never pruned)
step_<N>.rewound-<time>/  a checkpoint newer than the one `gptrain checkpoint rewind` went back to
                          (kept, never loaded or pruned)
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

from gptrain.checkpoint.integrity import COMPLETE, STEP_DIR, complete_steps, is_complete, manifest_bytes
from gptrain.errors import GptrainError
from gptrain.utils.atomic import STALE_TEMPORARY_S, remove_stale_temporaries
from gptrain.utils.paths import look_up

LATEST = "latest"
HPARAMS = "hparams.yaml"
CHECKPOINTS = "checkpoints"
DAMAGED = "damaged"
SET_ASIDE = re.compile(rf"^step_\d+\.{DAMAGED}-")
"""A checkpoint a resume passed over, renamed by `rename_aside(path, DAMAGED)`."""
REWOUND = "rewound"
REWOUND_ASIDE = re.compile(rf"^step_\d+\.{REWOUND}-")
"""A checkpoint a rewind moved out of the step_<N> names (gptrain.checkpoint.rewind)."""


class CheckpointLoadError(GptrainError):
    """No complete checkpoint of the run verifies and loads."""


def removed_while_read(step_dir: Path) -> CheckpointLoadError:
    """A checkpoint whose COMPLETE marker went while it was read: retention, which unlinks the
    marker first, removed it (its run is still training), not damage."""
    return CheckpointLoadError(
        f"checkpoint {step_dir} was removed while it was read (its {COMPLETE} marker is gone: a run still "
        "training removes its older checkpoints as it saves, keeping "
        "exp_manager.checkpoint_callback_params.save_top_k); run again to take the newest"
    )


def recorded_checkpoints_dir(run_dir: Path) -> Path | None:
    """The exp_manager.checkpoint_callback_params.dirpath that the hparams.yaml of `run_dir` (or of its
    results/) records, where the run's checkpoints went instead of its checkpoints/ (the tools look
    there only: a checkpoints/ beside it is an earlier run's); None where none."""
    dirpath = _recorded(run_dir / "hparams.yaml", "checkpoint_callback_params", "dirpath")
    dirpath = dirpath or _recorded(
        run_dir / "results" / "hparams.yaml", "checkpoint_callback_params", "dirpath"
    )
    return Path(dirpath) if dirpath else None


def run_dir_of(root: Path) -> Path:
    """The run directory of the checkpoints directory `root`: the explicit_log_dir of the hparams.yaml
    training copies into a dirpath outside it, else the directory `root` is in."""
    recorded = _recorded(root / "hparams.yaml", "explicit_log_dir")
    return Path(recorded) if recorded else root.parent


def _recorded(hparams: Path, *keys: str) -> str | None:
    """exp_manager.<keys> in an hparams.yaml, when the file and the text value are there."""
    import yaml

    try:
        value = yaml.safe_load(hparams.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    for key in ("exp_manager", *keys):
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def newest_complete(root: Path) -> Path | None:
    """The newest complete checkpoint; incomplete directories (no COMPLETE) are ignored."""
    steps = complete_steps(Path(root))
    return Path(root) / step_dir_name(steps[-1]) if steps else None


OWN_CHECKPOINTS_ONLY = (
    "gptrain reads its own checkpoints, not Megatron's iter_<N>/ or NeMo's .ckpt/.nemo files"
)


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint a path names: a step directory, or the newest complete one of a checkpoints
    directory or of a run directory (its checkpoints/). A one-line CheckpointLoadError naming the
    path when there is nothing complete to load there, told as eval and export tell it (a gptrain
    run not saved yet, a checkpoint set aside, another tool's checkpoint)."""
    given = Path(path)
    found = look_up(given)  # Path.is_dir raised PermissionError where it may not be looked up
    if found.kind == "unreachable":
        raise CheckpointLoadError(f"{path}: {found.why}")
    if found.kind == "file":
        raise CheckpointLoadError(file_given_text(given))
    if found.kind != "directory":
        raise CheckpointLoadError(
            f"{path}: does not exist; give a run directory, its checkpoints/ or a step_<N>/ ({OWN_CHECKPOINTS_ONLY})"
        )
    if STEP_DIR.match(given.name):
        if not is_complete(given):
            raise CheckpointLoadError(incomplete_step_text(given))
        return given
    # a run directory (<base_results_dir>/<run.name>, as eval/export take it), its results dir, or checkpoints/
    recorded = recorded_checkpoints_dir(given)
    found = (
        newest_complete(recorded)
        if recorded  # the run's own, not a checkpoints/ an earlier run left beside it
        else newest_complete(given / "checkpoints")
        or newest_complete(given)
        or newest_complete(given / "results" / "checkpoints")
    )
    if found is None and is_transformers_model(given):
        raise CheckpointLoadError(transformers_model_text(path))
    if found is None and recorded:
        raise CheckpointLoadError(
            f"{path}: no complete checkpoint (step_<N>/{COMPLETE}) in {recorded}, the "
            "exp_manager.checkpoint_callback_params.dirpath its hparams.yaml records"
        )
    if found is None:
        root = checkpoints_dir(given)
        raise CheckpointLoadError(no_checkpoints_text(given) if root is None else no_complete_text(root))
    return found


def no_complete_text(root: Path) -> str:
    """A checkpoints directory whose every step_<N>/ lacks its COMPLETE marker (saves unfinished)."""
    return f"{root}: no complete checkpoint (every step_* lacks its {COMPLETE} marker)"


def checkpoints_dir(path: Path) -> Path | None:
    """The checkpoint root for a run dir, results dir or checkpoints dir (or the dirpath its hparams.yaml
    records); None when none is found."""
    recorded = recorded_checkpoints_dir(path)  # the run's, alone: not a checkpoints/ an earlier run left
    for candidate in [recorded] if recorded else [path, path / CHECKPOINTS, path / "results" / CHECKPOINTS]:
        if (candidate / LATEST).is_file() or any(
            STEP_DIR.match(entry.name) for entry in candidate.glob("step_*") if entry.is_dir()
        ):
            return candidate
    return None


def incomplete_step_text(step_dir: Path) -> str:
    """A step directory without its COMPLETE marker (a save still being written, or killed), and
    the newest complete checkpoint beside it, where there is one to take instead."""
    steps = complete_steps(step_dir.parent)
    instead = (
        f"pass {step_dir.parent} to use the newest complete one ({step_dir_name(steps[-1])})"
        if steps
        else f"no checkpoint in {step_dir.parent} is complete yet: wait for the run's first save to finish"
    )
    return (
        f"{step_dir}: incomplete checkpoint (no COMPLETE marker: its save has not finished, or was "
        f"killed); {instead}"
    )


def file_given_text(path: Path) -> str:
    """A file given where a checkpoint goes: one of a run's (`latest`, a shard, hparams.yaml),
    whose directory is what to pass, or of a run's elsewhere (`run_advice`), else another tool's
    checkpoint file (a NeMo .nemo or .ckpt)."""
    parent = path.parent
    kind = aside_kind(parent)
    if is_step_dir(parent) or checkpoints_dir(parent) is not None:
        advice = f"pass {parent}, the directory it is in"
    elif kind is not None:
        advice = f"it is in {parent}, set aside {kind}: pass {parent.parent} for the newest complete one"
    else:
        run = gptrain_run_near(parent)
        advice = run_advice(run) if run is not None else OWN_CHECKPOINTS_ONLY
    return (
        f"{path}: is a file, not a checkpoint; pass a run's results dir, its checkpoints dir or a "
        f"step_<N> dir ({advice})"
    )


def no_checkpoints_text(path: Path) -> str:
    """A directory with no checkpoint in it or below: a checkpoint set aside, or a gptrain run's
    (`run_advice`); the note that gptrain reads its own checkpoints only where there is no trace of
    a gptrain run (a Megatron or NeMo directory)."""
    kind = aside_kind(path)
    if kind is not None:
        return f"{path}: set aside {kind}; pass {path.parent} for the newest complete one"
    run = gptrain_run_near(path)
    if run is None:
        return (
            f"{path}: no checkpoints found; pass a run's results dir, its checkpoints dir or a step dir "
            f"({OWN_CHECKPOINTS_ONLY})"
        )
    if checkpoints_dir(run) is not None:
        return f"{path}: no checkpoints found; {run_advice(run)}"
    return f"{path}: {nothing_to_load_text(run)}"


def aside_kind(directory: Path) -> str | None:
    """How a checkpoint directory named step_<N>.<why>-<time> was set aside (None: it was not)."""
    if SET_ASIDE.match(directory.name):
        return "as damaged (a resume found it so and passed over it)"
    if REWOUND_ASIDE.match(directory.name):
        return "by `gptrain checkpoint rewind` (newer than the one it went back to)"
    return None


def gptrain_run_near(directory: Path) -> Path | None:
    """The gptrain run `directory` is (or its results/ is), or is in one or two levels up: the
    nearest with a gptrain hparams.yaml (NeMo writes one too, holding Lightning's `cfg:` only)."""
    candidates = (directory, directory / "results", *list(directory.absolute().parents)[:2])
    return next((run for run in candidates if is_run_config(run / HPARAMS)), None)


def is_run_config(file: Path) -> bool:
    """Whether `file` is a gptrain run's hparams.yaml: a training config, with trainer and model."""
    import yaml

    try:
        config = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(config, dict) and {"trainer", "model"} <= config.keys()


def run_advice(run: Path) -> str:
    """What to pass for a gptrain `run`, or why there is nothing of it to load yet."""
    if checkpoints_dir(run) is not None:
        return f"pass {run}, the run directory it is in"
    return nothing_to_load_text(run)


def nothing_to_load_text(run: Path) -> str:
    """Why a gptrain `run` without a step_<N>/ has nothing to load: every checkpoint it saved was
    set aside, or it has saved none yet."""
    where = recorded_checkpoints_dir(run) or run / CHECKPOINTS
    aside = sorted(entry.name for entry in where.glob("step_*") if aside_kind(entry) is not None)
    if aside:
        return f"no checkpoint to load in {where}: each was set aside ({', '.join(aside)})"
    return f"no checkpoint saved yet in {where}: wait for the run's first save"


def is_step_dir(path: str | Path) -> bool:
    """Whether `path` names one checkpoint (taken as given) rather than a run to take the newest of."""
    path = Path(path)
    return bool(STEP_DIR.match(path.name)) and path.is_dir()


def transformers_model_text(path: str | Path) -> str:
    """What to do with a transformers model directory given where a gptrain checkpoint goes."""
    return (
        f"{path}: a transformers model directory (config.json), not a gptrain checkpoint: import it with "
        f"`gptrain import {shlex.quote(str(path))} --output RUN_DIR` and give RUN_DIR"
    )


def is_transformers_model(directory: Path) -> bool:
    """What transformers' save_pretrained writes: config.json beside safetensors or .bin weights."""
    weights = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")
    return (directory / "config.json").is_file() and any(
        next(directory.glob(pattern), None) for pattern in weights
    )


def directory_bytes(path: Path) -> int:
    """The bytes of the files in `path`; one renamed or removed while listed (rank 0's COMPLETE
    temporary, a file retention removes) is not counted."""
    total = 0
    for entry in path.iterdir():
        try:
            if entry.is_file():
                total += entry.stat().st_size
        except FileNotFoundError:
            continue
    return total


def step_dir_bytes(path: Path) -> int:
    """A checkpoint's size: from its manifest when it has one (one file read), else by listing it
    (a background save rank 0 has not marked yet); 0 once it is gone."""
    if not path.is_dir():
        return 0
    from_manifest = manifest_bytes(path)
    return from_manifest if from_manifest is not None else directory_bytes(path)


def remove_unfinished_latest(root: Path) -> str | None:
    """Remove the temporaries of `latest` that a run killed while writing it left (`.latest.*.tmp`,
    unheld and an hour old: rank 0 writes it in milliseconds); the line to log, or None."""
    removed, _ = remove_stale_temporaries(root / LATEST, STALE_TEMPORARY_S)
    if not removed:
        return None
    names = ", ".join(temp.name for temp, _ in removed)
    return f"gptrain: removed {names} from {root}: left unfinished by a run killed while writing {LATEST}"


def rename_aside(path: Path, why: str) -> Path:
    """Rename `path` to a free sibling `<name>.<why>-<time>[-N]`, a name STEP_DIR does not match."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = path.with_name(f"{path.name}.{why}-{stamp}" + (f"-{n}" if n else ""))
        if not aside.exists():
            path.rename(aside)
            return aside
    raise FileExistsError(f"no free name beside {path}")


def size_text(nbytes: int) -> str:
    """A checkpoint's size as the logs print it: GB from 100 MB up, else MB."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"
