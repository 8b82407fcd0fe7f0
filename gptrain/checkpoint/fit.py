"""Whether a checkpoint holds the tensors the config builds, agreed by all ranks before any data is read."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptrain.checkpoint import compat
from gptrain.checkpoint.agreement import every_rank, first_on_any_rank


def saved_sections(saved_keys: Iterable[str]) -> set[str]:
    """The top-level sections of a DCP checkpoint's keys: 'model', 'optim', 'schedule', ... ('model'
    alone for a weights-only checkpoint)."""
    return {key.split(".", 1)[0] for key in saved_keys}


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
    problem = first_on_any_rank(fit.problem)
    if problem is None:
        held = functools.reduce(operator.or_, every_rank(fit.held), 0)
        unheld = next((key for index, key in enumerate(fit.tensors) if not held >> index & 1), None)
        problem = compat.unloaded(unheld, saved[unheld]) if unheld is not None else None
    if problem is not None:
        raise compat.mismatch_error(path, problem)
    return fit.rows
