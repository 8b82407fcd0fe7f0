"""`gptrain checkpoint verify RUN`: every checkpoint of a run against its manifest, sizes and CRC-32s;
`gptrain checkpoint rewind RUN --to step_N`: go back to an earlier checkpoint (gptrain.checkpoint.rewind).
Neither imports torch."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from gptrain.checkpoint.directory import REWOUND_ASIDE, SET_ASIDE, recorded_checkpoints_dir, size_text
from gptrain.checkpoint.integrity import (
    COMPLETE,
    STEP_DIR,
    checksum_progress,
    has_manifest,
    manifest_bytes,
    misnamed,
    newer_format,
    verify,
)
from gptrain.errors import ConfigError, os_error_text
from gptrain.utils.paths import look_up


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "checkpoint",
        help="verify a run's checkpoints, or rewind it to an earlier one",
        description="Verify a run's checkpoints, or rewind it to an earlier one.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    verify_parser = actions.add_parser(
        "verify",
        help="check every checkpoint's files against the manifest in its COMPLETE marker",
        description="Exit 0 when the newest complete checkpoint verifies (the one a resume loads), 1 otherwise; "
        "one saved before checkpoints carried a manifest is said to be unchecked, and counts as sound.",
    )
    verify_parser.add_argument(
        "run",
        type=Path,
        help="a run directory, its results/ or checkpoints/ directory, or one step_<N> directory",
    )
    verify_parser.add_argument(
        "--sizes-only",
        action="store_true",
        help="skip the CRC-32 of each file but .metadata (read for the shards it names)",
    )
    verify_parser.set_defaults(func=run_verify)
    rewind_parser = actions.add_parser(
        "rewind",
        help="go back to an earlier checkpoint: the next resume continues from it",
        description="Check that the checkpoint given to --to verifies, point `latest` at it and rename every newer "
        "complete checkpoint to step_<M>.rewound-<time> (kept, never loaded or pruned). The next resume "
        "continues from it, with its data position and LR schedule. Refused while the run is live.",
    )
    rewind_parser.add_argument(
        "run", type=Path, help="a run directory, its results/ or its checkpoints/ directory"
    )
    rewind_parser.add_argument(
        "--to", required=True, metavar="step_N", help="the checkpoint to go back to: step_<N> or <N>"
    )
    rewind_parser.set_defaults(func=run_rewind)


VERIFY_TAKES = "a run directory, its checkpoints/ or a step_<N> directory"
REWIND_TAKES = "a run directory or its checkpoints/ (the checkpoint to go back to is --to's)"


def checkpoint_root(run: Path, takes: str = VERIFY_TAKES) -> Path:
    """RUN/checkpoints, RUN/results/checkpoints or RUN itself, whichever holds step directories.
    `takes`: what the command takes, said when `run` is no directory."""
    if (kind := _kind(run)) != "directory":
        what = "no such directory" if kind == "missing" else "not a directory"
        raise ConfigError(f"{run}: {what}; pass {takes}")
    recorded = recorded_checkpoints_dir(run)  # checkpoint_callback_params.dirpath: the run's, alone
    for candidate in [recorded] if recorded else [run / "checkpoints", run / "results" / "checkpoints", run]:
        if candidate.is_dir() and any(STEP_DIR.match(p.name) for p in candidate.iterdir()):
            return candidate
    if recorded:
        raise ConfigError(
            f"{run}: no step_<N> checkpoint directories in {recorded}, the dirpath its hparams.yaml records"
        )
    searched = f"{run / 'checkpoints'}, {run / 'results' / 'checkpoints'} or {run} itself"
    raise ConfigError(f"{run}: no step_<N> checkpoint directories in {searched} (has the run saved one yet?)")


def _kind(run: Path) -> str:
    """What the RUN given is; one the file system refuses to look up is a ConfigError naming the
    directory to check (Path.is_dir raised PermissionError there: a bare '<path>: Permission denied')."""
    found = look_up(run)
    if found.kind == "unreachable":
        raise ConfigError(f"{run}: {found.why}")
    return found.kind


def steps_to_verify(run: Path) -> tuple[Path, list[Path]]:
    """(the checkpoints directory, its step directories newest first); a step directory alone when
    `run` is one (generate, eval and export take one too)."""
    if STEP_DIR.match(run.name) and _kind(run) == "directory":
        return run.parent, [run]
    root = checkpoint_root(run)
    steps = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()
    )
    return root, [path for _, path in reversed(steps)]


_BEFORE_MANIFESTS = (
    f"its {COMPLETE} marker is from before gptrain recorded each file's size and CRC-32: nothing to "
    "compare; a resume loads it unchecked"
)


_REMOVED_WHILE_READ = (
    f"removed while it was read (its {COMPLETE} marker is gone: a run still saving removes its older "
    "checkpoints, keeping exp_manager.checkpoint_callback_params.save_top_k); not damage"
)


def run_verify(args: argparse.Namespace) -> int:
    root, steps = steps_to_verify(args.run)
    newest_complete_ok = None
    removed = False
    for path in steps:
        if not (path / COMPLETE).is_file():
            print(f"{path.name}: incomplete (no {COMPLETE}): never loaded")
            continue
        started = time.perf_counter()
        progress = None if args.sizes_only else checksum_progress(path, f"{path.name}: reading")
        verdict = "DAMAGED"
        try:
            if (problem := newer_format(path)) is not None:
                verdict = "NEWER FORMAT"
            elif (problem := misnamed(path)) is not None:
                verdict = "MISMATCH"
            else:
                problem = verify(path, checksums=not args.sizes_only, progress=progress, named_shards=True)
        except OSError as error:  # permissions or the mount, not damage: said, and the listing goes on
            verdict, problem = "UNREADABLE", os_error_text(error, path)
        if problem is not None and not (path / COMPLETE).is_file():  # retention took it mid-read
            print(f"{path.name}: {_REMOVED_WHILE_READ}")
            removed = True
            continue
        if problem is None and not has_manifest(path):
            print(f"{path.name}: not checked ({_BEFORE_MANIFESTS})")
        elif problem is None:
            print(f"{path.name}: ok ({_checked(path, time.perf_counter() - started, args.sizes_only)})")
        else:
            print(f"{path.name}: {verdict}: {problem}")
        if newest_complete_ok is None:
            newest_complete_ok = problem is None
    for path in sorted(p for p in root.iterdir() if SET_ASIDE.match(p.name)):
        print(f"{path.name}: set aside by a resume as damaged (never loaded or pruned; delete it when done)")
    for path in sorted(p for p in root.iterdir() if REWOUND_ASIDE.match(p.name)):
        print(
            f"{path.name}: set aside by `gptrain checkpoint rewind` (never loaded or pruned; delete it when done)"
        )
    if newest_complete_ok is None:
        gone = (
            " left (those listed were removed while read): run again to check the newest" if removed else ""
        )
        print(f"{root}: no complete checkpoint{gone}")
        return 1
    return 0 if newest_complete_ok else 1


def run_rewind(args: argparse.Namespace) -> int:
    from gptrain.checkpoint.rewind import rewind, target_step

    root = rewind_root(args.run)
    step = target_step(args.to, root)
    moved = rewind(root, step)
    what = (
        f"{len(moved)} newer checkpoint{'s' if len(moved) != 1 else ''} moved aside"
        if moved
        else "nothing newer"
    )
    print(
        f"{root}: rewound to step_{step} ({what}); the next resume continues from iteration {step} with its "
        "data position and LR schedule"
    )
    return 0


def rewind_root(run: Path) -> Path:
    """The checkpoints directory a rewind works in. A step directory given for RUN (what verify takes)
    was searched for step directories inside it and refused as holding none: it is named as one
    checkpoint, with the command that goes back to it."""
    if STEP_DIR.match(run.name) and _kind(run) == "directory":
        command = shlex.join(["gptrain", "checkpoint", "rewind", str(run.parent), "--to", run.name])
        raise ConfigError(f"{run}: one checkpoint, where rewind takes its run; to go back to it, `{command}`")
    return checkpoint_root(run, REWIND_TAKES)


def _checked(path: Path, seconds: float, sizes_only: bool) -> str:
    """What verifying a sound checkpoint covered: its size, and for the CRC-32s the read rate (a large
    checkpoint takes minutes; the rate tells a slow filesystem from a stuck one)."""
    size = manifest_bytes(path) or 0
    amount = size_text(size)
    if sizes_only:
        return f"{amount}, sizes only"
    return f"{amount} read in {seconds:.1f} s, {size / 1e6 / max(seconds, 1e-3):.0f} MB/s"
