"""The checkpoint errors a caller tells apart, and any checkpoint error's innermost cause in one line."""

from __future__ import annotations

from pathlib import Path

from gptrain.checkpoint.compat import CheckpointMismatchError
from gptrain.checkpoint.directory import CheckpointLoadError
from gptrain.errors import GptrainError


class CheckpointDamagedError(CheckpointLoadError):
    """A checkpoint given to load failed its manifest or did not load (the same verdict on every
    rank): an older checkpoint of its run may still load."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {path} is damaged: {problem}; give another one")
        self.problem = problem


class TokenizerMismatchError(CheckpointMismatchError):
    """A checkpoint was trained with another tokenizer than the config's: its ids would mean other
    tokens (gptrain.data.tokenizer_identity)."""


class ArchitectureChangedError(CheckpointMismatchError):
    """A run resumed its own checkpoint with architecture settings that change what the model computes
    but not the tensors' shapes (gptrain.checkpoint.architecture)."""


class CheckpointOutOfMemoryError(GptrainError):
    """A rank ran out of (GPU or host) memory loading a checkpoint: not damage, so resume stops
    there instead of passing over a sound checkpoint (and moving it aside)."""


class CheckpointFromNewerTorchError(CheckpointLoadError):
    """A checkpoint whose files all match its manifest, but whose `.metadata` this torch cannot unpickle:
    a newer torch wrote it, not damage (agreed by `agreement.agreed`: every rank refuses it, nothing is renamed)."""


def root_cause(error: BaseException) -> str:
    """The innermost cause of a (DCP-wrapped) write error, as 'Type: message' on one line."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple):  # (exception, traceback) in some torch versions
            inner = inner[0]
        if isinstance(inner, BaseException):
            error = inner
    error = _innermost(error)
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"


def on_rank(error: BaseException, world_size: int) -> str:
    """'on rank R: ' for the first rank a DCP CheckpointException names (its `failures`, by rank), in
    a world of several: every rank stops with the line, and the full disk or bad mount is R's node's.
    Empty for an error of this process alone."""
    failures = getattr(error, "failures", None)
    if (
        world_size > 1
        and isinstance(failures, dict)
        and failures
        and isinstance(rank := next(iter(failures)), int)
    ):
        return f"on rank {rank}: "
    return ""


def _innermost(error: BaseException) -> BaseException:
    """Down the chain of causes, and of contexts where none is set (torch's zip writer raises its
    own RuntimeError while handling the OSError beneath, ENOSPC for one); the deepest OSError
    there is the one to name."""
    chain = [error]
    while True:
        following = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
        if following is None or following in chain:
            break
        chain.append(following)
        error = following
    return next((e for e in reversed(chain) if isinstance(e, OSError)), chain[-1])


class CheckpointWriteError(GptrainError):
    """A checkpoint could not be written (full disk, file size limit, I/O or permission error)."""


class CheckpointNotSharedError(CheckpointWriteError):
    """Rank 0 cannot see files other ranks wrote into the step directory: the checkpoint root is
    not one directory every rank shares (node-local storage under the same path on each node)."""
