"""Finishing written datasets together: each `.idx` renamed after its `.bin`, never old and new mixed."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gptrain.utils.atomic import replace_as_plain_file

if TYPE_CHECKING:
    from gptrain.data.indexed import IndexedDatasetWriter


def finalize_together(writers: Sequence[IndexedDatasetWriter]) -> None:
    """Finish several datasets as one (prepare's one per json key), each `.idx` after its `.bin`.

    Every `.idx` is written before any file is renamed, so a failure there (a full disk) leaves
    the old outputs as they were. Then every old `.idx` goes (an old index next to a new `.bin`
    would look finished), every `.bin` is renamed, and every `.idx` last: never a mix of old and
    new complete datasets, unless an old index cannot be removed after another was. A failure
    before that removes every temporary file; one during the renames (`_move_all_into_place`)
    completes what it can.
    """
    writers = [writer for writer in writers if not writer._done]
    try:
        for writer in writers:
            writer._stage()
        for writer in writers:  # all there before an old index goes: a failure leaves the old outputs whole
            writer._temps[0].stat()
            writer._temps[3].stat()
        _move_all_into_place(writers)
    except BaseException:
        for writer in reversed(writers):  # the first made the output's directory: it goes last
            writer.abort()
        raise
    for writer in writers:
        writer._done = True
        writer._remove_temps()


def _move_all_into_place(writers: Sequence[IndexedDatasetWriter]) -> None:
    """Every old `.idx` out, every `.bin` in, every `.idx` last. Once an old index may be gone there
    is no way back: an interruption there (a time limit's SIGTERM, Ctrl-C), or an error after the
    first step, finishes what moves it can before it propagates, and the writers are marked done so
    that nothing removes the new files. The cleanup used to delete them: neither dataset was left."""
    steps: list[tuple[IndexedDatasetWriter, str]] = [
        (writer, step) for step in ("unlink", "bin", "idx") for writer in writers
    ]
    for number, (writer, step) in enumerate(steps):
        try:
            _take_step(writer, step)
        except BaseException as error:
            if number == 0 and isinstance(error, OSError):
                raise  # the first old index is still there: the caller removes the new files
            _finish_moves(writers, steps[number:])
            raise


def _take_step(writer: IndexedDatasetWriter, step: str) -> None:
    if step == "unlink":
        writer.idx_path.unlink(missing_ok=True)
    elif step == "bin":
        _move_into_place(writer._temps[0], writer.bin_path)
    else:
        _move_into_place(writer._temps[3], writer.idx_path)


def _finish_moves(
    writers: Sequence[IndexedDatasetWriter], steps: list[tuple[IndexedDatasetWriter, str]]
) -> None:
    """The remaining steps, each tried once (its failure is the error already raised). A `.bin`
    moves only where the old index is gone and an `.idx` only once its own `.bin` is in place, so no
    index ever stands beside other tokens; a writer that moved nothing leaves its old pair whole."""
    for writer, step in steps:
        if step == "bin" and writer.idx_path.exists():
            continue  # its old index could not be removed: the old pair stays
        if step == "idx" and writer._temps[0].exists():
            continue  # its .bin did not move
        with contextlib.suppress(BaseException):  # a second Ctrl-C must not cut the finish short
            _take_step(writer, step)
    for writer in writers:
        writer._done = True  # abort() must not remove what is now the output
        unmoved = writer._temps[0].exists()  # then the .idx did not move either: both go
        for temp in writer._temps[1:3] + (writer._temps[::3] if unmoved else []):
            temp.unlink(missing_ok=True)


def _move_into_place(temp: Path, path: Path) -> None:
    replace_as_plain_file(temp, path)
