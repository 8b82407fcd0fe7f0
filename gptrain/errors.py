"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations

import os
import re
from typing import Any


def os_error_text(error: OSError, where: object) -> str:
    """'<file>: <reason>' of an OSError, the file it names or else `where`.

    mkdir on a path that is a file fails with EEXIST, "File exists", which reads as a refusal to
    overwrite: said instead as what it is, a file where a directory is needed (--json out/r.json,
    a results or output directory, with `out` a file)."""
    filename = getattr(error, "filename", None)
    reason = error.strerror or error
    if isinstance(error, FileExistsError) and filename and _is_a_file(filename):
        reason = "is a file, where a directory is needed"
    return f"{filename or where}: {reason}"


def _is_a_file(path: str | bytes | os.PathLike) -> bool:
    return os.path.exists(path) and not os.path.isdir(path)


def error_text(error: BaseException) -> str:
    """The message of `error`; for one a DataLoader worker raised, the message it was raised with
    (torch re-raises it as "Caught <Error> in DataLoader worker process N" and the worker's traceback)."""
    text = str(error)
    if "\nOriginal Traceback" not in text:
        return text
    marker = f"{type(error).__module__}.{type(error).__qualname__}: "
    if marker in text:
        return text.rpartition(marker)[2].strip()
    # re-raised as another type (torch falls back to RuntimeError): the traceback's last line, less its type
    last = [line for line in text.splitlines() if line.strip()][-1].strip()
    return re.sub(r"^[\w.]+: ", "", last)


def excerpt(text: str, quote: bool = True) -> str:
    """`text` as an error line quotes a user's input (repr'd with `quote`): whole up to 80
    characters, else its first 60 and its length, so that the line stays one short line (a vocab.json
    given as merges.txt is one line of 1 MB; a document without spaces is one "word")."""
    if len(text) <= 80:
        return repr(text) if quote else text
    start = text[:60]
    return f"{repr(start) if quote else start}… ({len(text):,} characters)"


class GptrainError(Exception):
    """Base class: the message names the file, line or key and what to do."""


class ConfigError(GptrainError):
    """A config key, value or file is wrong."""


class DataError(GptrainError):
    """Input data or a dataset file is wrong."""


class LaunchError(GptrainError):
    """A launch request cannot be satisfied (cluster, Slurm, paths)."""


# Exit code of a training run that saved a checkpoint because of a time limit or a signal
# (SIGTERM/SIGUSR1, trainer.max_time) and wants to be requeued; 75 is EX_TEMPFAIL.
EXIT_REQUEUE = 75

# Exit code of a rank ended by the hang watchdog (gptrain/train/watchdog.py): a rank made no
# progress for trainer.hang_timeout_minutes. Distinct from a crash (1, or 2 for a GptrainError)
# and from EXIT_REQUEUE; the rendered batch script requeues the job on it, like on 75, and the
# requeued run resumes from the last complete checkpoint. 76 is EX_PROTOCOL.
EXIT_HUNG = 76

# The seconds by which Slurm's warning signal comes before the job's time limit (cluster.signal_seconds,
# rendered as --signal=B:USR1@N), exported by the batch script of a requeueable training for the run
# to warn when a checkpoint save takes longer than that (a stop's save then cannot finish).
SIGNAL_SECONDS_ENV = "GPTRAIN_SIGNAL_SECONDS"


def find_out_of_memory(error: BaseException) -> BaseException | None:
    """The CUDA or host out-of-memory error that `error` is or wraps (a cause: torch's pipeline
    schedule re-raises a stage's failure as a RuntimeError; DCP's per-rank failures), or None."""
    import torch

    pending: list[Any] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if isinstance(current, tuple) and current:  # (exception, traceback) in some torch versions
            current = current[0]
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (torch.cuda.OutOfMemoryError, MemoryError)):
            return current
        failures = getattr(current, "failures", None)
        pending += list(failures.values()) if isinstance(failures, dict) else []
        pending += [current.__cause__, current.__context__]
    return None


def printable(text: str) -> str:
    """`text` with the bytes of a non-UTF-8 path (surrogates in Python) shown as \\xNN escapes."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def non_utf8(text: str) -> tuple[int, str] | None:
    """(position, 'byte 0xe9') of the first character of `text` UTF-8 cannot hold, or None. A word
    of argv, a path or a line read with surrogateescape holds each byte that was not UTF-8 as a lone
    surrogate U+DC80-U+DCFF; any other surrogate is named as itself."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        return (
            error.start,
            f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"surrogate U+{code:04X}",
        )
    return None
