"""Checkpoints in step directories with a `latest` marker that is written last.

Layout under the checkpoint root:
    step_<N>/            torch.distributed.checkpoint files (.metadata, __<rank>_0.distcp)
    step_<N>/rank_<r>.pt this rank's extra state (RNG streams), written atomically
    step_<N>/COMPLETE    written by rank 0 once every rank has written its files
    latest               'step_<N>', rewritten atomically after COMPLETE
    step_<N>.damaged-<time>/  a checkpoint resume passed over, renamed by rank 0 (kept, never pruned)

A directory without COMPLETE is a save that died half way: lookups ignore it, so a
resumed run never loads a torn checkpoint. Works without a process group (one process).

Asynchronous saves (`async_save=True`) copy the state into a staging buffer that is kept
between saves (pinned host memory on CUDA, so the copy runs at full PCIe speed and is
allocated once) and write it from a background thread while training goes on. On CPU the
copy itself runs beside the next forward/backward; the only thing that must wait for it is
the next optimizer step (`wait_for_staging`, installed as a step pre-hook). The writer thread
runs at idle priority (SCHED_IDLE on Linux), so it takes only CPU time training leaves free.
A new save waits for the previous one only if that one is still writing, and says so.
"""

from __future__ import annotations

import functools
import io
import json
import operator
import os
import shutil
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from gptrain.checkpoint import compat
from gptrain.checkpoint.checksum_writer import ChecksummingWriter, gathered_checksums
from gptrain.checkpoint.compat import CheckpointMismatchError
from gptrain.checkpoint.integrity import (
    COMPLETE,
    STEP_DIR,
    complete_record,
    complete_steps,
    is_complete,
    manifest_bytes,
    verify_share,
)
from gptrain.errors import GptrainError
from gptrain.utils.atomic import atomic_write_bytes, atomic_write_text

LATEST = "latest"
T = TypeVar("T")
# One process without a process group is a supported case here, not a mistake (also
# raised from the async-save thread, where a local catch_warnings would not reach).
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


class CheckpointLoadError(GptrainError):
    """No complete checkpoint of the run verifies and loads."""


class CheckpointWriteError(GptrainError):
    """A checkpoint could not be written (full disk, file size limit, I/O or permission error)."""


class CheckpointOutOfMemoryError(GptrainError):
    """A rank ran out of (GPU or host) memory loading a checkpoint: not damage, so resume stops
    there instead of passing over a sound checkpoint (and moving it aside)."""


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def newest_complete(root: Path) -> Path | None:
    """The newest complete checkpoint; incomplete directories (no COMPLETE) are ignored."""
    steps = complete_steps(Path(root))
    return Path(root) / step_dir_name(steps[-1]) if steps else None


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint a path names: a step directory, or the newest complete one of a checkpoints
    directory or of a run directory (its checkpoints/). A one-line CheckpointLoadError naming the
    path when there is nothing complete to load there."""
    given = Path(path)
    own_only = "gptrain reads its own checkpoints, not Megatron's iter_<N>/ or NeMo's .ckpt/.nemo files"
    if not given.is_dir():
        what = "is a file" if given.exists() else "does not exist"
        raise CheckpointLoadError(
            f"{path}: {what}; give a run directory, its checkpoints/ or a step_<N>/ ({own_only})"
        )
    if STEP_DIR.match(given.name):
        if not is_complete(given):
            raise CheckpointLoadError(
                f"{path}: incomplete checkpoint (no {COMPLETE} marker: its save did not finish); give a complete one"
            )
        return given
    found = newest_complete(given / "checkpoints") or newest_complete(given)
    if found is None:
        raise CheckpointLoadError(
            f"{path}: no complete checkpoint (step_<N>/{COMPLETE}) in it or in its checkpoints/ ({own_only})"
        )
    return found


def directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.iterdir() if entry.is_file())


def step_dir_bytes(path: Path) -> int:
    """A checkpoint's size: from its manifest when it has one (one file read), else by listing it
    (a background save rank 0 has not marked yet); 0 once it is gone."""
    if not path.is_dir():
        return 0
    from_manifest = manifest_bytes(path)
    return from_manifest if from_manifest is not None else directory_bytes(path)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _world_size() -> int:
    return dist.get_world_size() if _distributed() else 1


def _every_rank(value: T) -> list[T]:
    """`value` of every rank, in rank order."""
    if not _distributed():
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _first_on_any_rank(problem: str | None) -> str | None:
    """Every rank's verdict on a checkpoint, so that all ranks skip (or load) the same one."""
    return next((v for v in _every_rank(problem) if v is not None), None)


def _steps_of_rank_0(root: Path) -> list[int]:
    """Rank 0's complete steps under `root`, on every rank. Each rank's own listing may differ (a
    node's stale view of the directory, NFS attribute caching after a requeue): ranks walking their
    own lists would load different steps in lock step, silently. A step a rank cannot see fails its
    verification there, and the agreement passes over it on every rank."""
    if not _distributed():
        return complete_steps(root)
    found: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            found = [complete_steps(root)]
        except OSError as error:
            found = [f"cannot list {root} ({root_cause(error)})"]
    dist.broadcast_object_list(found, src=0)
    if isinstance(found[0], str):
        raise CheckpointLoadError(f"{found[0]} on rank 0; check the filesystem, then resume again")
    return found[0]


def _out_of_memory(error: BaseException) -> bool:
    """Whether `error` is, or wraps (DCP's per-rank failures, a cause), a CUDA or host out-of-memory error."""
    pending: list[Any] = [error]
    while pending:
        current = pending.pop()
        if isinstance(current, tuple) and current:  # (exception, traceback) in some torch versions
            current = current[0]
        if not isinstance(current, BaseException):
            continue
        if isinstance(current, (torch.cuda.OutOfMemoryError, MemoryError)):
            return True
        failures = getattr(current, "failures", None)
        pending += list(failures.values()) if isinstance(failures, dict) else []
        pending.append(current.__cause__)
    return False


class _NotLoaded(Exception):
    """A step of loading a checkpoint failed on some rank: every rank skips the checkpoint."""


def _agreed(path: Path, step: Callable[[], T], what: Path | None = None) -> T:
    """Run one step of loading checkpoint `path` on every rank: its result, or _NotLoaded on every
    rank with the reason of the first rank where `what` (default: `path`) did not load.

    Safe only if `step` holds no collective after work that can fail on one rank alone: that rank
    would meet the others' collective with this one's. Running out of memory is not damage:
    CheckpointOutOfMemoryError on every rank, naming the first rank it happened on."""
    value, failure = None, None
    try:
        value = step()
    except CheckpointMismatchError:
        raise  # the config's fault, raised on every rank alike (check_fits): no fallback
    except (Exception, CheckpointException) as error:  # DCP's is a BaseException
        failure = (_out_of_memory(error), root_cause(error), str(what or path))  # the failing rank's `what`
    failures = _every_rank(failure)
    for rank, found in enumerate(failures):
        if found is not None and found[0]:
            raise CheckpointOutOfMemoryError(
                f"out of memory while loading {path.name} on rank {rank} ({found[1]}); the checkpoint is "
                "not damaged and was left in place: give each GPU less of the state (a larger "
                "model.pipeline_model_parallel_size, or model.data_parallel_sharding=full_shard) or free "
                "GPU/host memory, then resume"
            )
    found = next((f for f in failures if f is not None), None)
    if found is not None:
        raise _NotLoaded(f"{found[2]} does not load ({found[1]})")
    return cast(T, value)


def rename_aside(path: Path, why: str) -> Path:
    """Rename `path` to a free sibling `<name>.<why>-<time>[-N]`, a name STEP_DIR does not match."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = path.with_name(f"{path.name}.{why}-{stamp}" + (f"-{n}" if n else ""))
        if not aside.exists():
            path.rename(aside)
            return aside
    raise FileExistsError(f"no free name beside {path}")


def _recorded_bytes(record: str) -> int:
    """The size of a checkpoint from the text of its COMPLETE marker, the marker included."""
    files = json.loads(record)["files"]
    return sum(entry["bytes"] for entry in files.values()) + len(record.encode())


def _background_save_group() -> dist.ProcessGroup:
    """The gloo group background saves talk over: a collective from the writer thread must never
    interleave with the training's collectives on the default group.

    Created with lazy connections (TORCH_GLOO_LAZY_INIT, read by torch when a gloo group is made):
    eager, every process holds a socket to every other, world + 3 descriptors each (EMFILE past
    ~1,000 ranks under nofile=1024). DCP's collectives on it gather to and scatter from the
    coordinator (rank 0) and all-gather sizes in a ring, so rank 0 still connects to every rank
    and each other rank to a handful (measured: 3-5 at 8 ranks; docs/reliability.md)."""
    before = os.environ.get("TORCH_GLOO_LAZY_INIT")
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    try:
        return dist.new_group(backend="gloo")
    finally:
        if before is None:
            del os.environ["TORCH_GLOO_LAZY_INIT"]
        else:
            os.environ["TORCH_GLOO_LAZY_INIT"] = before


def _barrier() -> None:
    if _distributed():
        dist.barrier()


@dataclass
class SaveReport:
    """What one save cost the training: the stall, and the write that ran beside it."""

    step: int
    path: Path
    stall_s: float
    """Time the training loop was blocked by this save (all of it for a synchronous save)."""
    write_s: float
    """From the start of the save until its files were on disk."""
    background: bool
    waited_for_previous_s: float = 0.0
    """Part of the stall spent waiting for the previous save, still writing when this one began."""
    known_bytes: int | None = None
    """Set by rank 0 from the manifest it wrote; elsewhere `bytes` finds it on first use."""

    @property
    def bytes(self) -> int:
        """The checkpoint's size, found only where it is asked for (the logging rank): every rank
        listing the step directory after every save is O(world^2) stats at scale."""
        if self.known_bytes is None:
            self.known_bytes = step_dir_bytes(self.path)
        return self.known_bytes

    def _amount(self) -> str:
        return f"{self.bytes / 1e9:.2f} GB" if self.bytes >= 1e8 else f"{self.bytes / 1e6:.1f} MB"

    def describe(self, size: bool = True) -> str:
        """The log line; `size=False` leaves the size out (ranks that do not log it need not find it)."""
        named = f"{self.path.name} ({self._amount()})" if size else self.path.name
        line = f"saved checkpoint {named}: training stalled {1000 * self.stall_s:.0f} ms"
        if self.background:
            line += f", written in the background in {self.write_s:.1f} s"
        if self.waited_for_previous_s > 0:
            line += f" (waited {self.waited_for_previous_s:.1f} s for the previous save to finish writing)"
        return line


@dataclass
class _Prepared:
    """A checkpoint made ready to load on this rank by local work alone (`CheckpointManager._prepare`)."""

    metadata: Metadata
    saved: dict[str, Any]
    state: dict[str, Any]
    fit: Fit
    staged: dict[str, torch.Tensor]
    """Buffers for the tensors loaded by rows, in their saved shapes."""


@dataclass
class _Pending:
    """A background save: its report, and the futures the training thread waits on."""

    report: SaveReport
    written: Future
    """Done when every file is on disk and, on rank 0, the save is marked complete."""
    staging: Future | None


class CheckpointManager:
    """Saves and finds checkpoints of one run; rank 0 writes markers and prunes old ones."""

    def __init__(
        self,
        root: str | Path,
        keep_last: int | None,
        rank: int = 0,
        async_save: bool = False,
        on_saved: Callable[[SaveReport], None] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """`vocab_size` is the tokenizer's: rows of the vocabulary tensors at or past it are padding
        (see `load`)."""
        self.root = Path(root)
        self.keep_last = keep_last if keep_last and keep_last > 0 else None
        self.rank = rank
        self.async_save = async_save
        self.on_saved = on_saved
        self.vocab_size = vocab_size
        self._pending: _Pending | None = None
        self._writer: ChecksummingWriter | None = None
        self._stager: Any = None
        self._pruning: threading.Thread | None = None
        self._group = _background_save_group() if async_save and _distributed() else None

    def save(self, step: int, state: dict[str, Any], rank_state: dict[str, Any]) -> Path:
        """Write `state` (DCP, shared by all ranks) and `rank_state` (torch.save, per rank)."""
        started = time.perf_counter()
        waited = self._wait_for_previous()
        path = self.root / step_dir_name(step)
        if self.rank == 0 and path.exists():
            shutil.rmtree(path)  # a torn or superseded save of the same step
        _barrier()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._writer = ChecksummingWriter(path, background=self.async_save)
            rank_file = path / f"rank_{self.rank}.pt"
            # into this rank's checksum sidecar with its DCP files, hence into the manifest
            self._writer.checksums[rank_file.name] = write_rank_state(rank_file, rank_state)
            if self.async_save:
                self._start_background_save(step, path, state, started, waited)
                return path
            dcp.save(state, checkpoint_id=str(path), storage_writer=self._writer)
        except (Exception, CheckpointException) as error:  # DCP's is a BaseException
            raise self._write_failed(path, error) from error
        elapsed = time.perf_counter() - started
        self._finish(SaveReport(step, path, elapsed, elapsed, False, waited))
        return path

    def _start_background_save(
        self, step: int, path: Path, state: dict[str, Any], started: float, waited: float
    ) -> None:
        response = dcp.async_save(
            state,
            checkpoint_id=str(path),
            storage_writer=self._writer,
            async_stager=self._staging(),
            process_group=self._group,
        )
        staging = getattr(response, "staging_completion", None)
        upload = getattr(response, "upload_completion", response)
        report = SaveReport(step, path, time.perf_counter() - started, 0.0, True, waited)
        written = self._marked_when_written(upload, report) if self.rank == 0 else upload
        written.add_done_callback(lambda _: setattr(report, "write_s", time.perf_counter() - started))
        self._pending = _Pending(report, written, staging)

    def _marked_when_written(self, upload: Future, report: SaveReport) -> Future:
        """Rank 0 marks a background save complete (manifest, COMPLETE, latest, pruning) in a thread of
        its own as soon as the write ends: the manifest reads every rank's checksum sidecar and lists
        the step directory (about 3 files per rank), which must not stall training when a later step
        polls, and a crash between the write and that poll no longer loses a finished checkpoint."""
        marked: Future = Future()
        checksums = self._writer.checksums if self._writer else {}

        def mark() -> None:
            try:
                upload.result()
                self._mark_complete(report, checksums)
            except BaseException as error:  # DCP's CheckpointException is one; the training thread raises it
                marked.set_exception(error)
            else:
                marked.set_result(None)

        threading.Thread(target=mark, name="gptrain-mark-complete", daemon=True).start()
        return marked

    def _staging(self) -> Any:
        """One stager for the whole run: its host buffers are allocated (and pinned) once.

        On CUDA the copy into the cached pinned buffer blocks (it runs at PCIe speed, well
        under a second per 10 GB); on CPU it runs in a background thread beside the next
        forward/backward, and the optimizer step waits for it (`wait_for_staging`).
        """
        if self._stager is None:
            from torch.distributed.checkpoint.staging import (
                BlockingAsyncStager,
                DefaultStager,
                StagingOptions,
            )

            if torch.cuda.is_available():
                self._stager = BlockingAsyncStager(cache_staged_state_dict=True)
            else:
                options = StagingOptions(
                    use_pinned_memory=False,
                    use_shared_memory=False,
                    use_async_staging=True,
                    use_non_blocking_copy=False,
                )
                self._stager = DefaultStager(options)
        return self._stager

    def wait_for_staging(self) -> None:
        """Block until the pending save has its copy of the state: call before changing the state."""
        pending = self._pending
        if pending is None or pending.staging is None or pending.staging.done():
            return
        started = time.perf_counter()
        try:
            pending.staging.result()
        except (Exception, CheckpointException) as error:  # DCP's is a BaseException
            self._pending = None
            raise self._write_failed(pending.report.path, error) from error
        pending.report.stall_s += time.perf_counter() - started

    def poll(self) -> None:
        """Report a background save that has been written and marked (never blocks)."""
        if self._pending is not None and self._pending.written.done():
            self.wait()

    def wait(self) -> None:
        """Block until a pending async save is written and marked complete, then report it."""
        pending = self._pending
        if pending is None:
            return
        self.wait_for_staging()
        self._pending = None
        try:
            pending.written.result()
        except (Exception, CheckpointException) as error:  # DCP's is a BaseException
            raise self._write_failed(pending.report.path, error) from error
        if self.on_saved is not None:
            self.on_saved(pending.report)

    def _wait_for_previous(self) -> float:
        """Seconds spent waiting for a previous save that was still writing (0 if none)."""
        if self._pending is None:
            return 0.0
        still_writing = not self._pending.written.done()
        started = time.perf_counter()
        self.wait()
        return time.perf_counter() - started if still_writing else 0.0

    def _finish(self, report: SaveReport) -> None:
        """Mark a synchronous save complete once every rank's files are on disk, and report it."""
        _barrier()
        if self.rank == 0:
            self._mark_complete(report, self._writer.checksums if self._writer else {})
        _barrier()
        if self.on_saved is not None:
            self.on_saved(report)

    def _mark_complete(self, report: SaveReport, checksums: dict[str, str | None]) -> None:
        """Rank 0: the manifest into COMPLETE, then `latest`, then pruning. For a background save no
        barrier is needed: DCP's coordinator (rank 0) writes .metadata only after gathering every
        rank's write results, so every rank's files and checksum sidecar are on disk by then."""
        record = complete_record(report.step, report.path, gathered_checksums(report.path, checksums))
        atomic_write_text(report.path / COMPLETE, record)
        atomic_write_text(self.root / LATEST, step_dir_name(report.step) + "\n")
        report.known_bytes = _recorded_bytes(record)
        self._prune(report.step)

    def _write_failed(self, path: Path, error: BaseException) -> CheckpointWriteError:
        """Remove the partial step directory; earlier checkpoints and `latest` stay as they were."""
        shutil.rmtree(path, ignore_errors=True)
        return CheckpointWriteError(
            f"checkpoint {path} could not be written ({root_cause(error)}); the partial directory was "
            f"removed and earlier checkpoints are unchanged: free space or fix permissions under {self.root}"
        )

    def _prune(self, saved: int) -> None:
        """Keep the newest `keep_last` complete checkpoints up to `saved`, the one just marked complete,
        and drop torn ones older than it. A step newer than `saved` is one this run did not resume
        from (damaged, and not moved aside): counting it would delete the good ones, so it is left
        alone until the run passes it.

        The doomed lose their COMPLETE marker here (one unlink each: no longer checkpoints, so a
        crash mid-removal leaves a torn directory the next prune takes), and are removed in a
        background thread: at 1024 ranks a step directory is ~3,000 unlinks, which every rank
        would otherwise wait for in the next collective."""
        doomed = [self.root / step_dir_name(step) for step in self._doomed(saved)]
        for path in doomed:
            (path / COMPLETE).unlink(missing_ok=True)
        self._wait_for_pruning()
        self._pruning = threading.Thread(
            target=_remove_all, args=(doomed,), name="gptrain-prune", daemon=True
        )
        self._pruning.start()

    def _doomed(self, saved: int) -> list[int]:
        """The steps `_prune` removes (see there)."""
        steps = [step for step in complete_steps(self.root) if step <= saved]
        doomed = steps[: -self.keep_last] if self.keep_last else []
        for entry in self.root.iterdir():
            match = STEP_DIR.match(entry.name)
            if match and not is_complete(entry) and int(match.group(1)) < saved:
                doomed.append(int(match.group(1)))
        return doomed

    def _wait_for_pruning(self) -> None:
        if self._pruning is not None:
            self._pruning.join()
            self._pruning = None

    def newest(self) -> Path | None:
        return newest_complete(self.root)

    def space_warning(self, checkpoint_bytes: int) -> str | None:
        """A warning when the filesystem cannot hold keep_last + 1 checkpoints of this size
        (the next save is written before the oldest is removed)."""
        count = (self.keep_last or 1) + 1
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free + sum(
            step_dir_bytes(self.root / step_dir_name(step)) for step in complete_steps(self.root)
        )
        if free >= count * checkpoint_bytes:
            return None
        return (
            f"{existing} has {free / 1e9:.1f} GB free for checkpoints, but {count} checkpoints of about "
            f"{checkpoint_bytes / 1e9:.1f} GB (save_top_k + 1) need {count * checkpoint_bytes / 1e9:.1f} GB: "
            "a save will fail when the disk fills; free space or lower save_top_k"
        )

    def load_newest_good(
        self,
        state_fn: Callable[[set[str]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
        warn: Callable[[str], None],
    ) -> tuple[Path, dict[str, Any]] | None:
        """Load the newest complete checkpoint that verifies and loads; older ones are tried in turn.

        `state_fn` gets the checkpoint's saved keys ('model.tok_embeddings.weight', 'scaler.scale', ...)
        and builds the state to load. Each checkpoint passed over (damaged: it fails its manifest, or
        reading it fails) is reported through `warn`, and once an older one has loaded, moved aside
        (`_move_aside_damaged`). None when there is no complete checkpoint; CheckpointLoadError when
        there are some and none of them loads (nothing is moved); CheckpointMismatchError, at once,
        when the newest sound one holds other tensors than the config builds.
        """
        problems, damaged = [], []
        for step in reversed(_steps_of_rank_0(self.root)):
            path = self.root / step_dir_name(step)
            loaded = self._verify_and_load(path, state_fn, apply)
            if isinstance(loaded, dict):
                self._move_aside_damaged(damaged, path, warn)
                return path, loaded
            problem = loaded
            problems.append(problem)
            damaged.append(path)
            warn(f"checkpoint {path.name} is damaged: {problem}; trying the previous one")
        if problems:
            raise CheckpointLoadError(
                f"no checkpoint under {self.root} loads (newest: {problems[0]}); move the damaged ones "
                "aside, or start over with exp_manager.resume_if_exists=false and another run.name"
            )
        return None

    def _move_aside_damaged(self, damaged: list[Path], resumed: Path, warn: Callable[[str], None]) -> None:
        """Rank 0 renames the checkpoints a resume passed over out of the step_<N> names, and points
        `latest` at the one it resumed: resume and retention then see only the good ones (left as
        step_<N>, the newest-numbered damaged one would outlive the run's new saves). The damaged data
        is kept, not deleted, for a look at what happened."""
        if self.rank != 0 or not damaged:
            return
        for path in damaged:
            try:
                aside = rename_aside(path, "damaged")
            except OSError as error:
                warn(f"could not move the damaged checkpoint {path} aside ({error}); move it by hand")
                continue
            warn(f"moved the damaged checkpoint {path.name} aside to {aside} (kept for inspection)")
        atomic_write_text(self.root / LATEST, resumed.name + "\n")

    def load_verified(
        self,
        path: Path,
        state_fn: Callable[[set[str]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Load the complete checkpoint `path` (of this run or another) if it verifies, else a one-line
        CheckpointLoadError naming it (CheckpointMismatchError when it does not fit the config);
        returns this rank's extra state. `state_fn` as for `load_newest_good`."""
        loaded = self._verify_and_load(path, state_fn, apply)
        if not isinstance(loaded, dict):
            raise CheckpointLoadError(f"checkpoint {path} is damaged: {loaded}; give another one")
        return loaded

    def _verify_and_load(
        self,
        path: Path,
        state_fn: Callable[[set[str]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any] | str:
        """This rank's extra state, or what is wrong with `path` (the same verdict on every rank).

        Each step that can fail on one rank alone (reading its rank file, reading `.metadata` and
        building the state, reading the data, applying it) is agreed before the next collective: a
        rank that fell back alone would meet the others' next collective with its agreement (their
        check_fits would take its failure for a config mismatch) or wait until the group timed out.
        """
        problem = _first_on_any_rank(verify_share(path, self.rank, _world_size()))
        if problem is not None:
            return problem
        rank_file = path / f"rank_{self.rank}.pt"
        try:
            extra = _agreed(path, lambda: read_rank_state(path, self.rank), rank_file)
            prepared = _agreed(path, lambda: self._prepare(path, state_fn))
            agree_fit(path, prepared.saved, prepared.fit)  # collectives only; a mismatch on every rank
            state = _agreed(path, lambda: self._load_prepared(path, prepared))
            _agreed(path, lambda: apply(state))
        except _NotLoaded as skipped:
            return str(skipped)
        return extra

    def _prepare(
        self, path: Path, state_fn: Callable[[set[str]], dict[str, Any]], metadata: Metadata | None = None
    ) -> _Prepared:
        """This rank's work before loading `path`, without a collective: its `.metadata` (read once),
        the state `state_fn` builds for the saved keys (the optimizer state: the largest allocation of
        start-up), this rank's side of `check_fits`, and the buffers of the tensors loaded by rows."""
        metadata = metadata or compat.read_metadata(path)
        sections = saved_sections(metadata.state_dict_metadata)
        state = state_fn(set(metadata.state_dict_metadata))
        state = {top: value for top, value in state.items() if top in sections}
        saved = compat.saved_metadata(path, metadata)
        fit = local_fit(saved, state)
        flat, _ = compat.flatten(state)
        staged = (
            {}
            if fit.problem
            else {key: torch.empty(shape, dtype=flat[key].dtype) for key, shape in fit.rows.items()}
        )
        return _Prepared(metadata, saved, state, fit, staged)

    def _load_prepared(self, path: Path, prepared: _Prepared) -> dict[str, Any]:
        """DCP load into the prepared state (after `agree_fit`); the tensors fitted by rows copied in."""
        state, staged = prepared.state, prepared.staged
        flat, paths = compat.flatten(state)
        for key, tensor in staged.items():
            compat.set_at(state, paths[key], tensor)
        reader = compat.MetadataReader(path, prepared.metadata)
        dcp.load(state, checkpoint_id=str(path), storage_reader=reader)  # in place; `staged` for the resized
        for key, tensor in staged.items():
            compat.copy_common_rows(flat[key], tensor, self.vocab_size)
            compat.set_at(state, paths[key], flat[key])
        return state

    def finish_after_failure(self, timeout_s: float) -> str | None:
        """On a run's way out by an exception: let a background save be written and marked complete if
        that takes at most `timeout_s` (its state is that of a finished step), else leave it, as a
        crash would (unmarked, unless rank 0's marking finishes before the process ends). Never
        raises over the error on its way out; returns a line to log when the save was given up."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        deadline = time.monotonic() + timeout_s
        try:
            for future in (pending.staging, pending.written):
                if future is not None:
                    future.result(timeout=max(0.0, deadline - time.monotonic()))
            if self.on_saved is not None:
                self.on_saved(pending.report)
        except BaseException as error:  # a timeout, DCP's CheckpointException, a dead peer
            reason = "still writing" if isinstance(error, TimeoutError) else root_cause(error)
            return (
                f"checkpoint {pending.report.path.name} left incomplete ({reason}); "
                f"resume uses the newest complete one"
            )
        finally:
            self._release_staging()
            self._wait_for_pruning()
        return None

    def _release_staging(self) -> None:
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def close(self) -> None:
        """Wait for a pending save and for old checkpoints to be removed; release the staging buffers."""
        try:
            self.wait()
        finally:
            self._release_staging()
            self._wait_for_pruning()

    def load(
        self, path: Path, state: dict[str, Any], apply: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        """Load DCP `state` in place, hand it to `apply`, return this rank's extra state (read first:
        nothing is applied from a checkpoint whose rank file does not load)."""
        extra = read_rank_state(path, self.rank)
        apply(self.read_state(path, state))
        return extra

    def read_state(
        self, path: Path, state: dict[str, Any], metadata: Metadata | None = None
    ) -> dict[str, Any]:
        """DCP `state` loaded in place; what `apply` gets. `metadata`: the checkpoint's, when already
        read (`compat.read_metadata`; read here otherwise, once for the checks and the load).

        A checkpoint whose tensors are not those of `state` is refused before any data is read
        (`check_fits`), except for the rows of the vocabulary tensors: the vocabulary is padded to a
        multiple of make_vocab_size_divisible_by x TP, as Megatron pads it, so it changes with TP.
        Those are loaded as saved and their common rows copied in. Rows only the live state has are
        padding: they take the mean of the saved padding rows (rows at or past `vocab_size`), which
        training pushed to low logits, so the new ones take no more softmax mass than the old did;
        with no saved padding row (or no `vocab_size`) they keep their values.
        Sections of `state` the checkpoint lacks altogether are left out of what `apply` gets:
        a weights-only checkpoint (`gptrain import`) has a 'model' section and nothing else.
        """
        prepared = self._prepare(path, lambda saved: state, metadata)
        agree_fit(path, prepared.saved, prepared.fit)
        return self._load_prepared(path, prepared)


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def write_rank_state(path: Path, rank_state: dict[str, Any]) -> str:
    """torch.save `rank_state` to `path` atomically; returns the CRC-32 of the bytes written, so that
    verify finds a changed byte in a rank file as it does in a DCP file."""
    buffer = io.BytesIO()
    torch.save(rank_state, buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    return f"{zlib.crc32(data):08x}"


def read_rank_state(path: Path, rank: int) -> dict[str, Any]:
    """This rank's extra state of a checkpoint ({} when it has none: an import, or a larger world)."""
    rank_file = path / f"rank_{rank}.pt"
    if not rank_file.is_file():
        return {}
    return torch.load(rank_file, map_location="cpu", weights_only=False)


def saved_sections(saved_keys: Iterable[str]) -> set[str]:
    """The top-level sections of a DCP checkpoint's keys: 'model', 'optim', 'schedule', ... ('model'
    alone for a weights-only checkpoint)."""
    return {key.split(".", 1)[0] for key in saved_keys}


def root_cause(error: BaseException) -> str:
    """The innermost cause of a (DCP-wrapped) write error, as 'Type: message' on one line."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple):  # (exception, traceback) in some torch versions
            inner = inner[0]
        if isinstance(inner, BaseException):
            error = inner
    while error.__cause__ is not None:
        error = error.__cause__
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"


def check_fits(
    path: Path, state: dict[str, Any], saved: dict[str, Any] | None = None
) -> dict[str, torch.Size]:
    """Refuse (CheckpointMismatchError, on every rank alike) a checkpoint whose tensors are not those
    of `state`: one it lacks, one in another shape, or one no rank loads. Returns the saved shapes
    of the vocabulary tensors whose padding rows differ (loaded by rows, see gptrain.checkpoint.compat).

    Under pipeline parallelism each rank holds some layers only: a saved tensor is unloaded when
    no rank has it, found by OR-ing one bit per saved tensor across ranks. `saved`: the checkpoint's
    `compat.saved_metadata`, when already read.
    """
    saved = saved if saved is not None else compat.saved_metadata(path)
    return agree_fit(path, saved, local_fit(saved, state))


@dataclass
class Fit:
    """This rank's side of `check_fits`, found without a collective."""

    problem: str | None
    """How this rank's state differs from the checkpoint's (None: it fits)."""
    rows: dict[str, torch.Size]
    tensors: list[str]
    """The saved tensors of the state's sections, in the order of the bits of `held`."""
    held: int
    """One bit per tensor of `tensors` this rank holds."""


def local_fit(saved: dict[str, Any], state: dict[str, Any]) -> Fit:
    """This rank's state against the checkpoint's `compat.saved_metadata` (local work only)."""
    live, _ = compat.flatten(state)
    problem, rows = compat.compare(saved, live)
    tensors = compat.saved_tensors_in(saved, set(state))
    held = sum(1 << index for index, key in enumerate(tensors) if key in live)
    return Fit(problem, rows, tensors, held)


def agree_fit(path: Path, saved: dict[str, Any], fit: Fit) -> dict[str, torch.Size]:
    """The collective part of `check_fits`: CheckpointMismatchError on every rank when `fit` fails on
    any, or some saved tensor is held by no rank; else the shapes of `fit.rows`. Nothing here can
    fail on one rank alone, so it needs no agreement."""
    problem = _first_on_any_rank(fit.problem)
    if problem is None:
        held = functools.reduce(operator.or_, _every_rank(fit.held), 0)
        unheld = next((key for index, key in enumerate(fit.tensors) if not held >> index & 1), None)
        problem = compat.unloaded(unheld, saved[unheld]) if unheld is not None else None
    if problem is not None:
        raise compat.mismatch_error(path, problem)
    return fit.rows
