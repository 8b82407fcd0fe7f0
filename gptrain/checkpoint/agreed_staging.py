"""An async save's staging copy, agreed by every rank before any of them enters the write's collectives.

DCP's writer thread gathers every rank's save plan as soon as its own copy is staged. A rank whose copy
failed never joins that gather: the others waited in it, while the failing rank, alive, waited for them
in the next agreement (the stop flag's, a save's) until the process group timed out (30 minutes), and a
rank that raised from the optimizer step's wait for the copy left its peers with 'a collective lost its
peer', without the cause. Here each rank's outcome is gathered first, over the background save's own
group: on a failure anywhere, every rank's staging fails with the first failing rank's error and no rank
starts the write, so the agreed stop ends them all at once, each naming that rank and its cause.
"""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from gptrain.checkpoint.errors import root_cause


class StagingFailed(Exception):  # noqa: N818 (DCP's word: a staging that failed, as CheckpointException)
    """A rank's staging copy failed. `failures` is {rank: its error}, as DCP's CheckpointException has it,
    so that the save's line names that rank (errors.on_rank, root_cause). An Exception, not DCP's
    BaseException: DCP's staging callback catches Exception only, and would leave the future unresolved."""

    def __init__(self, rank: int, error: BaseException) -> None:
        super().__init__(f"staging failed on rank {rank}: {root_cause(error)}")
        self.failures = {rank: error}


class AgreedStager:
    """`stager` (torch's AsyncStager) for one save, its outcome agreed over `group` (every rank's)."""

    def __init__(self, stager: Any, group: dist.ProcessGroup) -> None:
        self._stager = stager
        self._group = group

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._stager.should_synchronize_after_execute

    def synchronize_staging(self) -> None:
        self._stager.synchronize_staging()

    def close(self) -> None:
        """The stager is the manager's, kept for the run: it closes it."""

    def stage(self, state_dict: Any, **kwargs: Any) -> Future:
        """A Future of the staged state, done once every rank has staged its own; StagingFailed on every
        rank where any rank's copy failed. A blocking copy (CUDA's pinned one) is done when this returns:
        its agreement still runs in a thread of its own, not in the training thread, where the all-reduce
        over every rank stalled each save by the slowest rank's copy and the group's latency."""
        try:
            staged = self._stager.stage(state_dict, **kwargs)
            if not isinstance(staged, Future):
                # DCP synchronizes a stager after its write starts only when given the state, not a Future
                if self._stager.should_synchronize_after_execute:
                    self._stager.synchronize_staging()
                staged = _done(staged)
        except Exception as error:  # a blocking copy's, in the training thread: agreed as any other
            staged = _failed(error)
        return self._agreed_later(staged)

    def _agreed_later(self, staging: Future) -> Future:
        """A Future of `staging`'s state, done once every rank's copy is: in a thread of its own, as the
        training goes on (DCP's writer thread waits for it before its first collective, and the next save
        for that writer: one thread at a time uses the group)."""
        agreed: Future = Future()

        def agree() -> None:
            try:
                raise_if_failed_anywhere(staging.exception(), self._group)
                agreed.set_result(staging.result())
            except BaseException as error:  # the agreed failure, or the all-reduce's own
                agreed.set_exception(error)

        threading.Thread(target=agree, name="gptrain-agree-staging", daemon=True).start()
        return agreed


def _done(staged: Any) -> Future:
    future: Future = Future()
    future.set_result(staged)
    return future


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


def raise_if_failed_anywhere(error: BaseException | None, group: dist.ProcessGroup) -> None:
    """StagingFailed on every rank, with the first failing rank's error, if any rank's copy failed. One
    all-reduce of an int64 when none did (every save: a gather of every rank's outcome would grow with
    the world's size); the cause is broadcast only from the failing rank. The group holds every rank,
    so its ranks are the global ones."""
    rank, world = dist.get_rank(), dist.get_world_size(group)
    first = torch.tensor([world if error is None else rank], dtype=torch.int64)
    dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
    failing = int(first.item())
    if failing == world:
        return
    own = error if rank == failing else None
    cause: list[Any] = [None if own is None else _portable(own)]
    dist.broadcast_object_list(cause, src=failing, group=group)
    raise StagingFailed(failing, own if own is not None else _rebuilt(cause[0]))


def _portable(error: BaseException) -> tuple[bytes | None, str]:
    """`error` as another rank can rebuild it: pickled where it pickles, and its line in any case."""
    try:
        pickled: bytes | None = pickle.dumps(error)
    except Exception:  # a local object in its arguments
        pickled = None
    return pickled, root_cause(error)


def _rebuilt(outcome: tuple[bytes | None, str]) -> BaseException:
    pickled, line = outcome
    if pickled is not None:
        try:
            return pickle.loads(pickled)  # noqa: S301 (a peer rank of this job, as broadcast_object_list is)
        except Exception:  # a class this rank cannot build from its arguments
            pass
    return RuntimeError(line)
