"""One verdict on a checkpoint for every rank: a step failing on one rank alone must not strand the others."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from gptrain.checkpoint.compat import CheckpointMismatchError
from gptrain.checkpoint.directory import CheckpointLoadError
from gptrain.checkpoint.errors import CheckpointFromNewerTorchError, CheckpointOutOfMemoryError, root_cause
from gptrain.checkpoint.integrity import complete_steps, refusal
from gptrain.errors import GptrainError, find_out_of_memory

T = TypeVar("T")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def every_rank(value: T) -> list[T]:
    """`value` of every rank, in rank order."""
    if not is_distributed():
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


UNREADABLE = "unreadable: "  # a rank's verdict that stops every rank (see _verify_and_load)
REFUSED = "refused: "  # a sound checkpoint that must not load: every rank stops, nothing is renamed


def first_on_any_rank(problem: str | None) -> str | None:
    """Every rank's verdict on a checkpoint, so that all ranks skip (or load) the same one."""
    return next((v for v in every_rank(problem) if v is not None), None)


def steps_of_rank_0(root: Path) -> list[int]:
    """Rank 0's complete steps under `root`, on every rank. Each rank's own listing may differ (a
    node's stale view of the directory, NFS attribute caching after a requeue): ranks walking their
    own lists would load different steps in lock step, silently. A step a rank cannot see fails its
    verification there, and the agreement passes over it on every rank."""
    if not is_distributed():
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


def rank_0s(compute: Callable[[], T]) -> T:
    """`compute()` as rank 0 finds it (its value, or its error raised), on every rank. Each
    rank's view of a shared directory may lag (NFS attribute caching after a requeue): ranks
    choosing a checkpoint from their own views would load different ones, in lock step."""
    if not is_distributed():
        return compute()
    found: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            found = [(True, compute())]
        except GptrainError as error:
            found = [(False, (type(error), str(error)))]
        except Exception as error:  # an OSError reading the directory: every rank stops, none waits
            found = [(False, (GptrainError, f"rank 0 could not read the checkpoints: {error}"))]
    dist.broadcast_object_list(found, src=0)
    succeeded, value = found[0]
    if succeeded:
        return value
    kind, text = value
    try:
        error = kind(text)
    except TypeError:  # an error built from other arguments than its text
        error = GptrainError(text)
    raise error


def refused_verdict(path: Path) -> str | None:
    """Why `path` must not be loaded whatever its files hold (REFUSED and the reason), told to every
    rank with the verdicts of their shares: one saved in a newer format than this gptrain reads, or a
    step directory named for another iteration than its marker records (a copy by hand), is not damage
    to pass over and set aside."""
    problem = refusal(path)
    return REFUSED + problem if problem is not None else None


class NotLoaded(Exception):
    """A step of loading a checkpoint failed on some rank: every rank skips the checkpoint."""


def agreed(path: Path, step: Callable[[], T], what: Path | None = None) -> T:
    """Run one step of loading checkpoint `path` on every rank: its result, or NotLoaded on every
    rank with the reason of the first rank where `what` (default: `path`) did not load.

    Safe only if `step` holds no collective after work that can fail on one rank alone: that rank
    would meet the others' collective with this one's. Running out of memory is not damage:
    CheckpointOutOfMemoryError on every rank, naming the first rank it happened on; nor is a `.metadata`
    from a newer torch (CheckpointFromNewerTorchError, on every rank)."""
    value, failure = None, None
    try:
        value = step()
    except CheckpointMismatchError:
        raise  # the config's fault, raised on every rank alike (check_fits): no fallback
    except CheckpointFromNewerTorchError as error:  # not damage: every rank refuses it below
        failure = (False, str(error), str(what or path), True)
    except (Exception, CheckpointException) as error:  # DCP's is a BaseException
        out_of_memory = find_out_of_memory(error) is not None
        failure = (out_of_memory, root_cause(error), str(what or path), False)  # the failing rank's `what`
    failures = every_rank(failure)
    refused = next((found[1] for found in failures if found is not None and found[3]), None)
    if refused is not None:
        raise CheckpointFromNewerTorchError(refused)
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
        raise NotLoaded(f"{found[2]} does not load ({found[1]})")
    return cast(T, value)
