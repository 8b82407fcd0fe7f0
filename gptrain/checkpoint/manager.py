"""Checkpoints in step directories with a `latest` marker that is written last.

Layout under the checkpoint root:
    step_<N>/            torch.distributed.checkpoint files (.metadata, __<rank>_0.distcp)
    step_<N>/rank_<r>.pt this rank's extra state (RNG streams), written atomically
    step_<N>/COMPLETE    written by rank 0 once every rank has written its files
    latest               'step_<N>', rewritten atomically after COMPLETE

A directory without COMPLETE is a save that died half way: lookups ignore it, so a
resumed run never loads a torn checkpoint. Works without a process group (one process).

Asynchronous saves (`async_save=True`) copy the state into a staging buffer that is kept
between saves (pinned host memory on CUDA, so the copy runs at full PCIe speed and is
allocated once) and write it from a background thread while training goes on. On CPU the
copy itself runs beside the next forward/backward; the only thing that must wait for it is
the next optimizer step (`wait_for_staging`, installed as a step pre-hook). The writer thread
runs at the lowest normal priority (nice 19 on Linux), so training's threads win the CPU.
A new save waits for the previous one only if that one is still writing, and says so. A save
the caller waits for at once (`waited_for`: a run's last with no evaluation after it, or the one
before a stop) is written in place when the state is in host memory: there is nothing to overlap.
On CUDA the pinned buffer can be allocated ahead of the first save (`prepare_staging`), in a
background thread while training runs: pinning the whole state is the slow part (16 s for the
16 GB state of a 1.3B model on an H100 VM, against 0.35 s for each later copy into it).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from gptrain.checkpoint import save_failures
from gptrain.checkpoint.agreed_staging import AgreedStager
from gptrain.checkpoint.agreement import first_on_any_rank, is_distributed
from gptrain.checkpoint.background_save import background_save_group, first_failure, marked_when_written
from gptrain.checkpoint.checksum_writer import MARKING, PREPARING, ChecksummingWriter, Note, OwnWork, noted
from gptrain.checkpoint.direct_io import takes_direct_io
from gptrain.checkpoint.directory import LATEST, remove_unfinished_latest, step_dir_name
from gptrain.checkpoint.errors import CheckpointNotSharedError, CheckpointWriteError
from gptrain.checkpoint.integrity import COMPLETE, complete_record, with_metrics
from gptrain.checkpoint.planner import CachingSavePlanner, forget, new_key
from gptrain.checkpoint.pruning import CheckpointPruning, put_in_place, replacing_dir
from gptrain.checkpoint.rank_state import rank_state_bytes
from gptrain.checkpoint.reader import CheckpointReader
from gptrain.checkpoint.save_failures import (
    NOT_SHARED,
    UPDATE_FAILED,
    WRITE_FAILED,
    given_up_text,
    update_failed,
    write_failed,
)
from gptrain.checkpoint.save_manifest import (
    complete_manifest,
    not_shared_text,
    recorded_bytes,
    saving_world_size,
)
from gptrain.checkpoint.save_report import Pending, SaveReport
from gptrain.checkpoint.staging import STAGER_SERVES_ONE_SAVE, allocate_pinned_staging, in_host_memory
from gptrain.utils.atomic import atomic_write_text, fsync_directory

if TYPE_CHECKING:
    from gptrain.data.tokenizer_identity import TokenizerCheck

# One process without a process group is a supported case here, not a mistake (also
# raised from the async-save thread, where a local catch_warnings would not reach).
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def _barrier() -> None:
    if is_distributed():
        dist.barrier()


class CheckpointManager(CheckpointReader, CheckpointPruning):
    """Saves (and, as a CheckpointReader, loads) the checkpoints of one run; rank 0 writes the
    markers and prunes old ones."""

    def __init__(
        self,
        root: str | Path,
        keep_last: int | None,
        rank: int = 0,
        async_save: bool = False,
        on_saved: Callable[[SaveReport], None] | None = None,
        vocab_size: int | None = None,
        direct_io: bool | None = None,
        pinned_staging: bool | None = None,
        tokenizer: TokenizerCheck | None = None,
        tied: bool = False,
        architecture: dict[str, Any] | None = None,
        monitor: str | None = None,
        mode: str = "min",
    ) -> None:
        """`vocab_size`, `tokenizer`, `tied`, `architecture`: as for CheckpointReader (each save records
        the tokenizer and the architecture). `keep_last`: save_top_k (None or negative: keep every
        one; 0: only the newest); `monitor`, `mode`: keep the `keep_last` best by the metric each
        COMPLETE records, and the newest (gptrain.checkpoint.retention); without `monitor`, the
        `keep_last` newest. `direct_io`: write shards around the page cache
        (O_DIRECT); None: where `root` is on a local disk (gptrain.checkpoint.direct_io).
        `pinned_staging`: async saves copy into a kept, pinned host buffer (a CUDA run's); None:
        wherever CUDA is available."""
        super().__init__(root, rank, vocab_size, tokenizer, tied, architecture)
        self.keep_last = keep_last if keep_last is not None and keep_last >= 0 else None
        self.monitor = monitor
        self.mode = mode
        self.async_save = async_save
        self.direct_io = takes_direct_io(root) if direct_io is None else direct_io
        self.pinned_staging = torch.cuda.is_available() if pinned_staging is None else pinned_staging
        self.on_saved = on_saved
        # what this rank does on its own in a save (None: done): the run's hang watchdog (checksum_writer.noted)
        self.note: Note | None = None
        self._pending: Pending | None = None
        # a background save's failure poll() found, until every rank has agreed to stop on it
        self.failure: CheckpointWriteError | None = None
        # background saves this rank has seen written (rank 0: and marked), reported once every rank has
        self._unagreed: list[SaveReport] = []
        self.done_through = -1  # the newest of them: what this rank adds to the stop flag (StopAgreement)
        self._writer: ChecksummingWriter | None = None
        self._stager: Any = None
        self._preparing: threading.Thread | None = None
        self._pruning: threading.Thread | None = None
        self._group = background_save_group() if async_save and is_distributed() else None
        self._plan_key = new_key()

    def save(
        self,
        step: int,
        state: dict[str, Any],
        rank_state: dict[str, Any],
        waited_for: bool = False,
        metrics: dict[str, float] | None = None,
    ) -> Path:
        """Write `state` (DCP, shared by all ranks) and `rank_state` (torch.save, per rank);
        `metrics` (the validation loss of this step) goes into COMPLETE, for retention to rank by.

        `waited_for`: the caller waits for this save at once, with nothing to run beside its write
        (a run's last save with no evaluation after it, or the one before a stop). A state in host
        memory (CPU training) is then written in place, as a synchronous save: a staging copy and a
        low-priority writer would only add to the wait. A state on a GPU still goes through the
        pinned buffer, whose copy out of device memory is faster than a synchronous save's unpinned
        one. Every rank decides alike: they train on one kind of device."""
        started = time.perf_counter()
        try:  # a previous save's failure (rank 0's alone where it could not mark it) is agreed below
            waited = self._wait_for_previous()
        except CheckpointWriteError as error:
            self.failure, waited = self.failure or error, 0.0
        in_background = self.async_save and not (waited_for and in_host_memory(state))
        path = self.root / step_dir_name(step)
        own = str(self.failure) if self.failure else None
        if own is None and self.rank == 0:
            with noted(self.note, PREPARING):  # this rank's own file system work, never a wait for others
                own = self._clear_step_dir(path)
        problem = first_on_any_rank(own)  # a barrier
        if problem is not None:  # every rank learns it, none waits for rank 0 in a collective
            raise self.failure or CheckpointWriteError(problem)
        self.report_done_through(step)  # every rank's earlier saves are written and marked
        with noted(self.note, PREPARING):  # an lstat: a stalled mount hangs here
            link = os.readlink(path) if path.is_symlink() else None  # replaced once the save is complete
        files = replacing_dir(path) if link is not None else path
        report = SaveReport(step, path, 0.0, 0.0, in_background, waited, metrics=metrics, replaced_link=link)
        report.written_in = files if link is not None else None
        try:
            with noted(self.note, PREPARING):
                files.mkdir(parents=True, exist_ok=True)
            self._writer = ChecksummingWriter(
                files,
                background=in_background,
                direct_io=self.direct_io,
                own_files={f"rank_{self.rank}.pt": rank_state_bytes(rank_state)},
                note=None if in_background else self.note,  # a background write's: OwnWork, below
            )
            if in_background:
                self.wait_for_preparation()  # the buffer being pinned ahead is the one this save fills
                self._start_background_save(report, state, started)
                return path
            dcp.save(
                state,
                checkpoint_id=str(files),
                storage_writer=self._writer,
                planner=CachingSavePlanner(self._plan_key),
            )
        except (Exception, CheckpointException) as error:  # DCP's is a BaseException
            raise write_failed(self.root, files, error) from error
        report.stall_s = report.write_s = time.perf_counter() - started
        self._finish(report)
        return path

    def _start_background_save(self, report: SaveReport, state: dict[str, Any], started: float) -> None:
        """`report`: this save's, its stall set here once the write has started."""
        own_work = self._writer.note = OwnWork()  # the write outlasts the save's watch
        response = dcp.async_save(
            state,
            checkpoint_id=str(report.files_dir),
            storage_writer=self._writer,
            async_stager=self._agreed_staging(),
            process_group=self._group,
            planner=CachingSavePlanner(self._plan_key),
        )
        # a pinned copy blocked in async_save: done, and the optimizer step need not wait for its agreement
        staging = None if self.pinned_staging else getattr(response, "staging_completion", None)
        upload = getattr(response, "upload_completion", response)
        report.stall_s = time.perf_counter() - started
        checksums = self._writer.checksums if self._writer else {}
        mark = (lambda: self._mark_complete(report, checksums)) if self.rank == 0 else None
        marked = marked_when_written(upload, mark, report, started, own_work)
        self._pending = Pending(report, marked, staging, own_work)

    def prepare_staging(self, state: dict[str, Any]) -> None:
        """Allocate the pinned staging buffer for states shaped like `state` now, in a background
        thread, so the first async save only copies into it (call once the optimizer state exists;
        `state` as later passed to `save`). Nothing to do for synchronous saves or on CPU, where
        the staging copies are not pinned. A sharded (DTensor) state's buffer takes each shard's
        spec without reading the device, so it is prepared in the background too."""
        if not self.async_save or not self.pinned_staging or self._preparing is not None:
            return
        stager = self._staging()
        if getattr(stager, "state_dict_cache", False) is not None:
            return  # not a caching stager, or its buffer exists already

        def allocate() -> None:
            try:
                stager.state_dict_cache = allocate_pinned_staging(state)
            except Exception as error:  # the first save allocates it then, as without this
                warnings.warn(f"checkpoint staging buffer not prepared ahead: {error}", stacklevel=1)

        self._preparing = threading.Thread(target=allocate, name="gptrain-pin-staging", daemon=True)
        self._preparing.start()

    def wait_for_preparation(self) -> None:
        """Block until the staging buffer being prepared ahead (if any) is allocated."""
        if self._preparing is not None:
            self._preparing.join()

    def _staging(self) -> Any:
        """One stager for the whole run: its host buffers are allocated (and pinned) once.

        On CUDA the copy into the cached pinned buffer blocks (it runs at PCIe speed, well
        under a second per 10 GB); on CPU it runs in a background thread beside the next
        forward/backward, and the optimizer step waits for it (`wait_for_staging`).
        """
        if self._stager is not None and not self.pinned_staging and STAGER_SERVES_ONE_SAVE:
            self._release_staging()  # the previous save's copy is taken: save() waited for it
        if self._stager is None:
            from torch.distributed.checkpoint.staging import (
                BlockingAsyncStager,
                DefaultStager,
                StagingOptions,
            )

            if self.pinned_staging:
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

    def _agreed_staging(self) -> Any:
        """The run's stager, for one save of several ranks agreed by them all before the write starts."""
        stager = self._staging()
        return stager if self._group is None else AgreedStager(stager, self._group)

    def wait_for_staging(self) -> None:
        """Block until the pending save has its copy of the state, or its copy failed: call before changing
        the state. A failed copy is not raised here (the optimizer step's pre-hook, on one rank alone, where
        the others went on into a collective): the save's write fails with it, which the ranks agree on
        (`poll`, StopAgreement; the next save, `wait`)."""
        pending = self._pending
        if pending is None or pending.staging is None or pending.staging.done():
            return
        started = time.perf_counter()
        pending.staging.exception()  # waits; a failure is the write's too
        pending.report.stall_s += time.perf_counter() - started

    @property
    def writing(self) -> bool:
        """A background save has been started and not yet reported (it may be written already)."""
        return self._pending is not None

    def poll(self) -> None:
        """Take a background save that has been written and marked (never blocks). Its failure is
        kept in `failure` for the ranks to agree on (StopAgreement, the next save): rank 0 alone
        learns of a save it could not mark, and raising there left the others in a collective. For
        the same reason the others report it saved only once every rank has it done, rank 0's
        marking included (`report_done_through`, with the stop flag): they reported it at once,
        then failed on it."""
        if self._pending is not None and self._pending.written.done():
            try:
                self._settled(self._written())
            except CheckpointWriteError as error:
                self.failure = error

    def _settled(self, report: SaveReport | None) -> None:
        """`report`'s save is done on this rank: reported at once in one process, else once agreed."""
        if report is None:
            return
        self._unagreed.append(report)
        self.done_through = report.step
        if not is_distributed():
            self.report_done_through(report.step)

    def report_done_through(self, step: int) -> None:
        """Report the background saves up to `step`, which every rank has found done (the smallest
        `done_through` of them all, as the stop flag or a save's agreement carries it)."""
        agreed = [report for report in self._unagreed if report.step <= step]
        self._unagreed = [report for report in self._unagreed if report.step > step]
        for report in agreed:
            self._report(report)

    def wait(self) -> None:
        """Block until a pending async save is written and marked complete, then report it. Every rank
        calls this at the same point (a stop, the run's end), and the outcome is agreed first: a save
        rank 0 could not mark stops every rank with its line, where the others reported it saved."""
        failure, report = self.failure, None
        if failure is None:
            try:
                report = self._written()
            except CheckpointWriteError as error:
                failure = error
        problem = first_on_any_rank(str(failure) if failure else None)
        if problem is not None:
            raise failure or CheckpointWriteError(problem)
        self._settled(report)
        self.report_done_through(sys.maxsize)

    def _written(self) -> SaveReport | None:
        """The pending save's report once it is written and marked (None without one), or its error."""
        self.wait_for_preparation()
        pending = self._pending
        if pending is None:
            return None
        self.wait_for_staging()
        self._pending = None
        try:
            with pending.own_work.waited_for(self.note, pending.report.path.name):  # this rank's own write
                pending.written.result()
        except (Exception, CheckpointException) as error:  # DCP's is a BaseException
            if save_failures.kept(pending.report.path):  # marked: `latest` or pruning failed
                raise update_failed(self.root, pending.report.path, error) from error
            raise write_failed(self.root, pending.report.files_dir, error) from error
        return pending.report

    def _report(self, report: SaveReport) -> None:
        if self.on_saved is not None:
            self.on_saved(report)

    def _wait_for_previous(self) -> float:
        """Seconds spent waiting for a previous save that was still writing (0 if none)."""
        if self._pending is None:
            return 0.0
        still_writing = not self._pending.written.done()
        started = time.perf_counter()
        self._settled(self._written())  # its failure is agreed by save(), and it is reported there
        return time.perf_counter() - started if still_writing else 0.0

    def _finish(self, report: SaveReport) -> None:
        """Mark a synchronous save complete once every rank's files are on disk, and report it. A save
        rank 0 cannot mark (its files unseen, a full disk under COMPLETE) stops every rank with rank 0's
        line (the gather is the second barrier): the others waited in it until the group timed out."""
        _barrier()
        failure = first_on_any_rank(self._mark_on_rank_0(report) if self.rank == 0 else None)
        if failure is not None:
            kind, line = failure
            if kind != UPDATE_FAILED:  # never marked: this rank's files of it go, wherever they are
                shutil.rmtree(report.files_dir, ignore_errors=True)  # a step symlink stays
            raise (CheckpointNotSharedError if kind == NOT_SHARED else CheckpointWriteError)(line)
        if self.on_saved is not None:
            self.on_saved(report)

    def _mark_on_rank_0(self, report: SaveReport) -> tuple[str, str] | None:
        """None once the save is marked complete, else (what failed, the line every rank stops with)."""
        try:
            with noted(self.note, MARKING):  # the others wait in the gather
                self._mark_complete(report, self._writer.checksums if self._writer else {})
        except CheckpointNotSharedError as error:
            return NOT_SHARED, str(error)
        except OSError as error:
            if save_failures.kept(report.path):
                return UPDATE_FAILED, str(update_failed(self.root, report.path, error))
            return WRITE_FAILED, str(write_failed(self.root, report.files_dir, error))
        return None

    def _mark_complete(self, report: SaveReport, checksums: dict[str, str | None]) -> None:
        """Rank 0: the manifest into COMPLETE, then `latest`, then pruning. For a background save no
        barrier is needed: DCP's coordinator (rank 0) writes .metadata only after gathering every
        rank's write results, so every rank's files and checksum sidecar are on disk by then."""
        tokenizer = self.tokenizer.record if self.tokenizer is not None else None
        world_size = saving_world_size()
        written = report.files_dir
        gathered, files, unseen = complete_manifest(written, checksums, world_size)
        if unseen:
            raise CheckpointNotSharedError(not_shared_text(report.path, unseen))
        record = complete_record(
            report.step,
            written,
            gathered,
            tokenizer,
            self.architecture,
            torch.__version__,
            report.metrics,
            files=files,
            world_size=world_size,
        )
        fsync_directory(written)  # every file's name durable (.metadata was renamed) before COMPLETE's
        atomic_write_text(written / COMPLETE, record)  # beside a step symlink: a name no lookup takes
        if written != report.path:  # the symlink, replaced only now, by a complete save: never lost
            put_in_place(written, report.path)
        if (removed := remove_unfinished_latest(self.root)) is not None:
            print(removed, file=sys.stderr)
        atomic_write_text(self.root / LATEST, step_dir_name(report.step) + "\n")
        report.known_bytes = recorded_bytes(record)
        report.removed = self._prune(report.step)

    def record_metrics_of_resumed(self, step: int, metrics: dict[str, float]) -> Path | None:
        """Rank 0 adds `metrics` to the COMPLETE of the checkpoint this run resumed from, when that is
        step `step`'s and records none: a stop saves before the validation due at its step, which the
        resumed run runs first, with no save at that step after it. Unrecorded, retention would rank
        that checkpoint below every one with a metric, and remove it however good its loss. The marker
        is replaced atomically (fsync'd, renamed, the directory fsync'd): COMPLETE stays written last,
        and the manifest in it unchanged. Returns the step directory written, None where nothing was:
        a step that is a symlink is another run's, whose marker is not this run's to rewrite."""
        resumed = self.resumed
        if self.rank != 0 or resumed is None or resumed.name != step_dir_name(step) or resumed.is_symlink():
            return None
        marker = resumed / COMPLETE
        updated = with_metrics(marker.read_text(), step, metrics)
        if updated is None:
            return None
        atomic_write_text(marker, updated)
        return resumed

    def finish_after_failure(self, timeout_s: float) -> str | None:
        """On a run's way out by an exception: let a background save be written and marked complete if
        that takes at most `timeout_s` (its state is that of a finished step), else leave it, as a
        crash would (unmarked, unless rank 0's marking finishes before the process ends). Never
        raises over the error on its way out; returns a line to log when the save was given up, or was
        marked complete but `latest` or pruning then failed. A save no agreement has reported yet is
        reported where this rank sees its COMPLETE (rank 0 marked it)."""
        unagreed, self._unagreed = self._unagreed, []
        notes = [note for report in unagreed if (note := self._report_if_marked(report))]
        pending, self._pending = self._pending, None
        if pending is None:
            return "; ".join(notes) or None
        deadline = time.monotonic() + timeout_s
        try:
            failure = first_failure((pending.staging, pending.written), deadline)
            if failure is None and (note := self._report_if_marked(pending.report)):
                notes.append(note)
        except BaseException as error:  # the timeout, or the report's own failure
            failure = error
        finally:
            self._release_staging()
            self._wait_for_pruning()
        if failure is not None:
            notes.append(given_up_text(self.root, pending.report.path, failure))
        return "; ".join(notes) or None

    def _report_if_marked(self, report: SaveReport) -> str | None:
        """On the way out no rank agrees: rank 0 knows it marked the save, the others read its COMPLETE,
        waiting a few seconds for rank 0 to write it (it may be dead); else a note, where the logging
        rank said nothing of a checkpoint rank 0 then marked complete."""
        if self.rank == 0 or save_failures.marked_within(report.path, save_failures.MARK_WAIT_S):
            self._report(report)
            return None
        return save_failures.unmarked_text(report.path)

    def _release_staging(self) -> None:
        self.wait_for_preparation()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def close(self) -> None:
        """Wait for a pending save and for old checkpoints to be removed; release the staging buffers
        and the cached save plans."""
        try:
            self.wait()
        finally:
            self._release_staging()
            self._wait_for_pruning()
            forget(self._plan_key)
