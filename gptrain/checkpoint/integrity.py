"""What a complete checkpoint must contain, and whether the files on disk still match it.

The COMPLETE marker carries a manifest: every file of the step directory with its size (rank 0
stats each by the name its rank's checksum sidecar records, once every rank's files are written) and its CRC-32
(computed while the file was written: DCP's files in gptrain.checkpoint.checksum_writer, the
rank files beside them; no data is read again at save time). `verify` compares the directory with it: sizes always, checksums on request
(`gptrain checkpoint verify` reads every file once to find a changed byte). At resume every rank
checks the sizes and the CRC-32s of its share of the files (`verify_share`), so the job stats and
reads the checkpoint once between its ranks before loading it.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import TypeGuard

from gptrain import __version__
from gptrain.checkpoint.crc32 import crc32
from gptrain.checkpoint.dcp_metadata import METADATA, shard_extents
from gptrain.utils.progress import Progress

COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")
RANK_FILE = re.compile(r"rank_\d+\.pt")
CHECKPOINT_FORMAT = 1
"""The layout of a step directory and its COMPLETE marker, recorded in each marker: raise it with any
change an older gptrain would misread, which then refuses such a checkpoint in one line (it would call
it damaged, set it aside and resume an older one)."""


def is_complete(path: Path) -> bool:
    return (path / COMPLETE).is_file()


def complete_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir() and is_complete(entry):
            steps.append(int(match.group(1)))
    return sorted(steps)


def manifest(step_dir: Path, checksums: dict[str, str | None] | None = None) -> dict[str, dict]:
    """{file name: {"bytes": size, "crc32": hex or None}} of the step directory, COMPLETE excluded."""
    checksums = checksums or {}
    with os.scandir(step_dir) as entries:  # is_file from the listing's file types: one stat a file
        return {
            entry.name: {"bytes": entry.stat().st_size, "crc32": checksums.get(entry.name)}
            for entry in sorted(entries, key=lambda entry: entry.name)
            if entry.is_file() and entry.name != COMPLETE and not entry.name.endswith(".tmp")
        }


def manifest_by_name(
    step_dir: Path, names: list[str], checksums: dict[str, str | None]
) -> tuple[dict[str, dict], list[str]]:
    """(the manifest of the files `names`, the names not found): one stat a file and no listing, which
    at a thousand ranks is thousands of stats fewer inside a save's stall, and which a network file
    system cannot serve stale from its cache. For the names every rank's checksum sidecar records."""
    files: dict[str, dict] = {}
    unseen: list[str] = []
    for name in dict.fromkeys(names):
        try:
            files[name] = {"bytes": os.stat(step_dir / name).st_size, "crc32": checksums.get(name)}
        except FileNotFoundError:
            unseen.append(name)
    return dict(sorted(files.items())), unseen


def complete_record(
    step: int,
    step_dir: Path,
    checksums: dict[str, str | None] | None = None,
    tokenizer: dict | None = None,
    architecture: dict | None = None,
    torch_version: str | None = None,
    metrics: dict[str, float] | None = None,
    files: dict[str, dict] | None = None,
    world_size: int | None = None,
) -> str:
    """The text of the COMPLETE marker: the step, the format, the gptrain and torch that wrote it (an
    older one refuses what it cannot read: `newer_format`, `recorded_torch`), the Slurm job that wrote
    it (a requeue of that job resumes it: gptrain.train.earlier_run), the tokenizer the model was trained
    with (gptrain.data.tokenizer_identity; mock data: its vocabulary size), the architecture settings
    (gptrain.checkpoint.architecture), the metrics retention ranks by (gptrain.checkpoint.retention:
    the validation loss of this step; json writes a NaN as NaN, which its reader takes back), the
    number of ranks that saved it (each wrote its rank_<r>.pt: `verify` names one the manifest lacks)
    and the manifest (`files`, else the step directory's listing)."""
    record: dict = {"step": step, "format": CHECKPOINT_FORMAT, "gptrain": __version__, "torch": torch_version}
    record["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    if tokenizer is not None:
        record["tokenizer"] = tokenizer
    if architecture is not None:
        record["architecture"] = architecture
    if metrics:
        record["metrics"] = metrics
    if world_size is not None:
        record["world_size"] = world_size
    record["files"] = files if files is not None else manifest(step_dir, checksums)
    return json.dumps(record, indent=1) + "\n"


def with_metrics(text: str, step: int, metrics: dict[str, float]) -> str | None:
    """The COMPLETE marker `text` with `metrics` added where complete_record puts them, every other byte
    as it was (the manifest included: `verify` and the marker's meaning are unchanged); None where the
    marker is not step `step`'s as complete_record wrote it, or records metrics already. For the loss
    of a validation a stop left to the resumed run (gptrain.train.saving.record_left_due_validation)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if (
        not isinstance(record, dict)
        or record.get("step") != step
        or "metrics" in record
        or "files" not in record
    ):
        return None
    if json.dumps(record, indent=1) + "\n" != text:  # edited by hand, or by another writer: left alone
        return None
    updated = {key: value for key, value in record.items() if key != "files"}
    updated["metrics"] = metrics
    updated["files"] = record["files"]
    return json.dumps(updated, indent=1) + "\n"


def recorded_tokenizer(step_dir: Path) -> dict | None:
    """The tokenizer record in a complete checkpoint's COMPLETE marker; None where it has none
    (saved before gptrain recorded one, or by a mock-data run before it recorded its
    vocabulary: gptrain.data.tokenizer_identity.mock_record) or the marker is unreadable
    (`verify` names that)."""
    return _recorded(step_dir, "tokenizer")


def recorded_architecture(step_dir: Path) -> dict | None:
    """The architecture record in a complete checkpoint's COMPLETE marker; None where it has none
    (saved before gptrain recorded one, or by a writer without a model config) or the marker is
    unreadable."""
    return _recorded(step_dir, "architecture")


def recorded_world_size(step_dir: Path) -> int | None:
    """How many ranks saved a complete checkpoint: as its marker records it, else the rank files its
    manifest lists (each rank's goes in); None where the marker has no manifest (saved before
    manifests) or is unreadable."""
    record = _marker_record(step_dir)
    if _is_world_size(world := record.get("world_size")):
        return world
    files = record.get("files")
    if not isinstance(files, dict):
        return None
    ranks = sum(1 for name in files if RANK_FILE.fullmatch(name))
    return ranks or None


def _is_world_size(value: object) -> TypeGuard[int]:
    return type(value) is int and value > 0


def _recorded(step_dir: Path, key: str) -> dict | None:
    entry = _marker_record(step_dir).get(key)
    return entry if isinstance(entry, dict) else None


def _marker_record(step_dir: Path) -> dict:
    """The COMPLETE marker's record; {} where it is unreadable or no object (`verify` names that)."""
    try:
        record = json.loads((step_dir / COMPLETE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def refusal(step_dir: Path) -> str | None:
    """Why a complete checkpoint is not loaded (nor rewound to) whatever its files hold, not damage to
    pass over: saved in a newer format (`newer_format`), or named for another iteration (`misnamed`)."""
    return newer_format(step_dir) or misnamed(step_dir)


def newer_format(step_dir: Path) -> str | None:
    """Why a checkpoint saved in a newer format than this gptrain reads is not loaded (its manifest may
    not be one this gptrain knows: not damage); None for this format, an older one, or none recorded."""
    record = _marker_record(step_dir)
    written = record.get("format")
    if type(written) is not int or written <= CHECKPOINT_FORMAT:
        return None
    return (
        f"{step_dir.name} was saved in checkpoint format {written} by gptrain {record.get('gptrain')} with "
        f"torch {record.get('torch')}; this gptrain {__version__} reads format {CHECKPOINT_FORMAT} and older: "
        "load it with a gptrain at least as new as the one that saved it"
    )


def recorded_torch(step_dir: Path) -> str | None:
    """The torch version that saved a checkpoint, from its COMPLETE marker; None for a marker from
    before the record."""
    version = _marker_record(step_dir).get("torch")
    return version if isinstance(version, str) else None


def misnamed(step_dir: Path) -> str | None:
    """Why a complete step directory holds another iteration than its name says (one copied or renamed
    by hand: `step_6` holding step 4 would resume as iteration 4 under the name step_6, and retention
    and `latest` would go by the name); None when the two agree or the marker records no step."""
    match = STEP_DIR.match(step_dir.name)
    recorded = _marker_record(step_dir).get("step")
    if match is None or type(recorded) is not int or recorded == int(match.group(1)):
        return None
    return (
        f"{step_dir.name} holds the checkpoint of iteration {recorded} (its {COMPLETE} marker says step "
        f"{recorded}): copied or renamed by hand; rename it to step_{recorded}, or move it out of "
        f"{step_dir.parent}"
    )


def file_crc32(path: Path, chunk: int = 16 << 20, progress: Progress | None = None) -> str:
    crc = 0
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            crc = crc32(block, crc)
            if progress is not None:
                progress.update(0, len(block))
    return f"{crc:08x}"


# Read errors that mean the data is gone (a checkpoint to pass over); any other OSError (EACCES,
# ESTALE, EMFILE) is about the reader or the mount, and passing over a good checkpoint for it would
# set it aside and resume from an older one.
DAMAGE_ERRNOS = frozenset(
    code for code in (getattr(errno, name, None) for name in ("EIO", "ENODATA", "EBADMSG", "EUCLEAN")) if code
)


def _is_damage(error: OSError) -> bool:
    """A read error that says the checkpoint's data is gone (DAMAGE_ERRNOS, or the file missing)."""
    return isinstance(error, FileNotFoundError) or error.errno in DAMAGE_ERRNOS


def checksum_progress(step_dir: Path, label: str) -> Progress:
    """Progress lines (every 2 s: files, MB/s, ETA) for reading `step_dir`'s CRC-32s: minutes for a
    large checkpoint."""
    try:
        total = manifest_bytes(step_dir)
    except OSError:
        total = None
    return Progress(label, unit="files", total_bytes=total)


def verify_share(step_dir: Path, rank: int, world_size: int) -> str | None:
    """Sizes and CRC-32s of this rank's share of the files (every world_size-th in name order, from
    index `rank`): the ranks of a resuming job stat and read each file once between them, not once
    each (at 1024 ranks a step directory holds ~3,000 files: 3 million stats if every rank took all)."""
    return verify(step_dir, checksums=True, rank=rank, world_size=world_size)


def verify(
    step_dir: Path,
    checksums: bool = False,
    rank: int = 0,
    world_size: int = 1,
    progress: Progress | None = None,
    named_shards: bool = False,
) -> str | None:
    """None when the checkpoint matches its manifest, else what is wrong (one line).

    Sizes always; with checksums=True also each file's CRC-32 (reads every file once, told to
    `progress` as it goes). Only the files of share `rank` of `world_size` (see verify_share); all
    of them by default. `named_shards` (`gptrain checkpoint verify`): also the shards `.metadata`
    names that the manifest does not list (`_check_named_shards`); never at resume, where parsing
    `.metadata` once more on rank 0 (~50 us an entry: a minute at 70B on 512 ranks) would hold every
    rank before the first verdict, and loading finds a missing shard anyway.
    """
    expected, problem, world = _manifest_files_and_world(step_dir)
    if expected is None:
        return problem
    if rank == 0 and (problem := _unlisted_rank_file(step_dir, expected, world)) is not None:
        return problem
    for index, (name, entry) in enumerate(sorted(expected.items())):
        if index % world_size == rank:
            problem = _check_file(step_dir / name, entry, checksums, progress)
            if problem is not None:
                return problem
            if progress is not None:
                progress.update(1)
    return _check_named_shards(step_dir, expected, checksums and world_size == 1) if named_shards else None


def _check_named_shards(step_dir: Path, expected: dict, crc_checked: bool) -> str | None:
    """Every shard file the checkpoint's `.metadata` names that its manifest does not list: present,
    and as long as the items `.metadata` places in it. A save to a node-local root before such saves
    were refused listed rank 0's node's files alone, and verified. `.metadata`'s own CRC-32 first
    (unless `crc_checked`): a changed byte in it is named as such, not as a shard it misnames."""
    if METADATA not in expected:
        return None
    if not crc_checked and (problem := _check_file(step_dir / METADATA, expected[METADATA], True)):
        return problem
    extents = shard_extents(step_dir / METADATA) or {}
    for name, needed in sorted(extents.items()):
        if name in expected:  # its size checked against the manifest already
            continue
        path = step_dir / name
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            return (
                f"{path} is missing: its {METADATA} names it, its manifest does not (saved where other "
                "nodes' files never reached this directory, such as a node-local checkpoint root)"
            )
        if actual < needed:
            return f"{path} is {actual} bytes, its {METADATA} places {needed} in it (truncated)"
    return None


def _unlisted_rank_file(step_dir: Path, expected: dict, world: object) -> str | None:
    """The first rank file of the ranks the marker records (`world`) that its manifest lacks; None
    where it lists them all, or records no world size (saved before the record: the manifest's files
    are all there is to check)."""
    if not _is_world_size(world):
        return None
    missing = next((f"rank_{r}.pt" for r in range(world) if f"rank_{r}.pt" not in expected), None)
    if missing is None:
        return None
    return (
        f"{step_dir / COMPLETE} records a save by {world} ranks, but its manifest lists no {missing}: "
        "the save lost it"
    )


def _manifest_files(step_dir: Path) -> tuple[dict | None, str | None]:
    """(the manifest's {name: entry}, None), or (None, what is wrong; None for a checkpoint written
    before manifests existed, which has nothing to compare: `_is_from_before_manifests`)."""
    expected, problem, _ = _manifest_files_and_world(step_dir)
    return expected, problem


def _manifest_files_and_world(step_dir: Path) -> tuple[dict | None, str | None, object]:
    """`_manifest_files`, and the world size the marker records (as read: checked by the caller)."""
    marker = step_dir / COMPLETE
    if not marker.is_file():
        return None, f"{step_dir.name} has no {COMPLETE} marker (a save that did not finish)", None
    try:
        record = json.loads(marker.read_text())
    except OSError as error:
        if not _is_damage(error):
            raise  # permissions, a stale handle, too many open files: not the checkpoint's fault
        return None, f"{marker} is unreadable ({error})", None
    except ValueError as error:
        return None, f"{marker} is unreadable ({error})", None
    if _is_from_before_manifests(record):
        return None, None, None
    files = record.get("files") if isinstance(record, dict) else None
    if not _is_manifest(files):
        return None, f"{marker} holds no valid manifest of the step's files (edited or overwritten)", None
    return files, None, record.get("world_size")


LEGACY_KEYS = frozenset({"step"})
"""All a COMPLETE marker held before manifests (2026-11-23); every later one has "files"."""


def _is_from_before_manifests(record: object) -> bool:
    """A marker as gptrain wrote it before manifests. Any other without "files" (a changed key, a value
    that is not an object) lost its manifest: taken as legacy, it would load with nothing checked."""
    return (
        isinstance(record, dict)
        and set(record) == LEGACY_KEYS
        and isinstance(record["step"], int)
        and not isinstance(record["step"], bool)
    )


def has_manifest(step_dir: Path) -> bool:
    """Whether `verify` has anything to compare: False for a marker from before manifests (and for
    one that is not a marker at all, which `verify` names)."""
    try:
        return not _is_from_before_manifests(json.loads((step_dir / COMPLETE).read_text()))
    except (OSError, ValueError):
        return True


def _is_manifest(files: object) -> bool:
    """{file name: size, or {"bytes": size, "crc32": hex or null}}: what `write_manifest` writes."""
    if not isinstance(files, dict):
        return False
    for entry in files.values():
        size = entry.get("bytes") if isinstance(entry, dict) else entry
        if type(size) is not int or (
            isinstance(entry, dict) and not isinstance(entry.get("crc32"), str | None)
        ):
            return False
    return True


def _check_file(
    path: Path, entry: int | dict, checksums: bool, progress: Progress | None = None
) -> str | None:
    """One manifest entry against the file: one stat, and one read when checksums are asked for."""
    size, crc = (entry, None) if isinstance(entry, int) else (entry.get("bytes"), entry.get("crc32"))
    try:
        actual = path.stat().st_size
        if actual != size:
            return f"{path} is {actual} bytes, its manifest says {size} (truncated or replaced)"
        if checksums and crc is not None and (found := file_crc32(path, progress=progress)) != crc:
            return f"{path} has CRC-32 {found}, its manifest says {crc} (changed on disk)"
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as error:  # a bad sector or a failing disk: damage, so the one before loads
        if not _is_damage(error):
            raise  # permissions, a stale handle, too many open files: not the checkpoint's fault
        return f"{path} is unreadable ({error.strerror or error})"
    return None


def manifest_bytes(step_dir: Path) -> int | None:
    """The size of a complete checkpoint from its manifest, COMPLETE included (one read, no listing),
    or None when it has no readable manifest."""
    try:
        expected, _ = _manifest_files(step_dir)
    except OSError:  # a marker this process may not read: sized by listing, as one without a manifest
        return None
    if expected is None:
        return None
    sizes = (entry if isinstance(entry, int) else entry.get("bytes") or 0 for entry in expected.values())
    return sum(sizes) + (step_dir / COMPLETE).stat().st_size
