"""Finishing written datasets together: each `.idx` renamed after its `.bin` (and its tokenizer record),
never old and new mixed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gptrain.utils.atomic import fsync_directory, replace_as_plain_file, temporary_sibling

if TYPE_CHECKING:
    from gptrain.data.indexed import IndexedDatasetWriter


@dataclass(frozen=True)
class Companion:
    """A small file that describes a dataset (its tokenizer record, gptrain.data.tokenizer_record),
    finished with it: `text` is written beside the new files before any rename (None: no new one),
    the `stale` files (the old record) go with the old `.idx`, and the new one is renamed onto
    `path` before the new `.idx`. Written after the renames, a kill or a full disk between left the
    new tokens beside the record of the data they replaced, which training trusts."""

    path: Path
    text: str | None
    stale: tuple[Path, ...] = ()


@dataclass
class _Output:
    writer: IndexedDatasetWriter
    companion: Companion | None
    temp: Path | None = None  # the companion's new text, staged
    moved: set[str] = field(default_factory=set)  # the steps of _move_all_into_place taken


def state_after(error: OSError) -> str | None:
    """What each output now is where `error` came past the first rename step (the new dataset may be
    in place, so 'cannot write' would read as nothing written); None before it (the old outputs whole)."""
    return getattr(error, "gptrain_outputs_state", None)


def finalize_together(
    writers: Sequence[IndexedDatasetWriter], companions: Sequence[Companion | None] = ()
) -> None:
    """Finish several datasets as one (prepare's one per json key), each `.idx` after its `.bin`;
    `companions[i]` (if given) goes with `writers[i]`.

    Every `.idx` and companion is written before any file is renamed, so a failure there (a full
    disk) leaves the old outputs as they were. Then every old `.idx` goes (an old index next to a
    new `.bin` would look finished) and every old companion, every `.bin` is renamed, every new
    companion, and every `.idx` last: never a mix of old and new complete datasets, unless an old
    index cannot be removed after another was. A failure before that removes every temporary file;
    one during the renames (`_move_all_into_place`) completes what it can.
    """
    given = list(companions) + [None] * (len(writers) - len(companions))
    outputs = [_Output(w, c) for w, c in zip(writers, given, strict=True) if not w._done]
    try:
        for output in outputs:
            output.writer._stage()
            _stage_companion(output)
        for output in outputs:  # all there before an old index goes: a failure leaves the old outputs whole
            output.writer._temps[0].stat()
            output.writer._temps[3].stat()
        _move_all_into_place(outputs)
    except BaseException:
        for output in reversed(outputs):  # the first made the output's directory: it goes last
            output.writer.abort()
            if output.temp is not None:  # moved, or not: either way none is left
                output.temp.unlink(missing_ok=True)
        raise
    for output in outputs:
        output.writer._done = True
        output.writer._remove_temps()
    _sync_directories(outputs)


def _stage_companion(output: _Output) -> None:
    companion = output.companion
    if companion is None or companion.text is None:
        return
    output.temp = temporary_sibling(companion.path)
    with open(output.temp, "w", encoding="utf-8") as handle:
        handle.write(companion.text)
        handle.flush()
        os.fsync(handle.fileno())


def _move_all_into_place(outputs: Sequence[_Output]) -> None:
    """Every old `.idx` out, every old companion, every `.bin` in, every new companion, every `.idx`
    last. Once an old index may be gone there is no way back: an interruption there (a time limit's
    SIGTERM, Ctrl-C), or an error after the first step, finishes what moves it can before it
    propagates, and the writers are marked done so that nothing removes the new files. The cleanup
    used to delete them: neither dataset was left."""
    steps: list[tuple[_Output, str]] = [
        (output, step) for step in ("unlink", "stale", "bin", "companion", "idx") for output in outputs
    ]
    for number, (output, step) in enumerate(steps):
        try:
            _take_step(output, step)
        except BaseException as error:
            if number == 0 and isinstance(error, OSError):
                raise  # the first old index is still there: the caller removes the new files
            _finish_moves(outputs, steps[number:])
            if isinstance(error, OSError):  # read by state_after; the error itself is unchanged
                error.gptrain_outputs_state = _state(outputs)  # type: ignore[attr-defined]
            raise
        output.moved.add(step)


def _state(outputs: Sequence[_Output]) -> str:
    """What each output is after the moves finished where they could."""
    said = []
    for output in outputs:
        name = output.writer.bin_path.stem
        if "idx" in output.moved:
            expected = output.companion is not None and output.companion.text is not None
            lacks = expected and "companion" not in output.moved
            said.append(f"{name}: the new dataset{', without its tokenizer record' if lacks else ''}")
        elif "unlink" not in output.moved and output.writer.idx_path.exists():
            said.append(f"{name}: the old dataset, as it was")
        else:
            said.append(f"{name}: its new tokens without an index")
    return (
        "while renaming the new files into place; "
        + "; ".join(said)
        + " (write it again for a complete dataset)"
    )


def _take_step(output: _Output, step: str) -> None:
    writer, companion = output.writer, output.companion
    if step == "unlink":
        writer.idx_path.unlink(missing_ok=True)
    elif step == "stale":
        for path in companion.stale if companion is not None else ():
            path.unlink(missing_ok=True)
    elif step == "bin":
        _move_into_place(writer._temps[0], writer.bin_path)
    elif step == "companion":
        if companion is not None and output.temp is not None:
            _move_into_place(output.temp, companion.path)
    else:
        _move_into_place(writer._temps[3], writer.idx_path)


def _finish_moves(outputs: Sequence[_Output], steps: list[tuple[_Output, str]]) -> None:
    """The remaining steps, each tried once (its failure is the error already raised). A `.bin`
    or companion moves only where the old index is gone and an `.idx` only once its own `.bin` is
    in place and no old companion stays, so no index ever stands beside other tokens or another
    dataset's record; a writer that moved nothing leaves its old pair whole."""
    for output, step in steps:
        if step in ("stale", "bin", "companion") and output.writer.idx_path.exists():
            continue  # its old index could not be removed: the old pair stays, with its record
        if step == "idx" and (output.writer._temps[0].exists() or _stale_left(output)):
            continue  # its .bin did not move, or an old record stays that would describe it
        with contextlib.suppress(BaseException):  # a second Ctrl-C must not cut the finish short
            _take_step(output, step)
            output.moved.add(step)
    for output in outputs:
        output.writer._done = True  # abort() must not remove what is now the output
        output.writer._remove_temps()  # what moved is gone from there; what did not is dropped
    _sync_directories(outputs)


def _stale_left(output: _Output) -> bool:
    """Whether an old companion is still there (one the new one replaced is not)."""
    companion = output.companion
    if companion is None:
        return False
    replaced = output.temp is not None and not output.temp.exists()
    return any(os.path.lexists(path) for path in companion.stale if not (replaced and path == companion.path))


def _sync_directories(outputs: Sequence[_Output]) -> None:
    """The renames and removals on disk (a crash could lose them: no index, so prepared again)."""
    for directory in dict.fromkeys(output.writer.bin_path.parent for output in outputs):
        fsync_directory(directory)


def _move_into_place(temp: Path, path: Path) -> None:
    replace_as_plain_file(temp, path)
