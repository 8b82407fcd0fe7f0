"""Every rank stops (and checkpoints) at the same step, without a second wait per step.

A stop request (a signal, trainer.max_time) reaches ranks at different moments, so each
step ends with a MAX all-reduce of "do I want to stop". Reading that flag right away would
make the host wait for the device a second time per step (the step's one wait is its
loss/norm read), after the optimizer step has been queued: the GPU would idle while the host
queues the next step. So the flag is read one step late on iterations that are not logged:
it is all-reduced into a host buffer (page-locked on CUDA, copied without blocking) with an
event behind it, and read at the next step boundary, when that work finished long ago. A stop
seen at step N then happens at step N + 1 on every rank (N + 2 where step N + 2 was
already queued ahead at N + 1: trainer.run_ahead, gptrain.train.overlap). Logged iterations have just
synchronized the device to time the interval, so there the flags are read at once (which is
also the wait the straggler line times).

A background checkpoint save that failed (CheckpointManager.failure: rank 0 alone learns of a save
it could not mark) rides on the same flag, as a higher value: every rank then stops at that boundary
with the failing rank's line, where the failing rank alone used to raise and leave the others to
find a lost peer in their next collective. Beside the flag each rank adds the newest background save
it has found done (`done_through`; rank 0's: written and marked complete), negated so that the same
MAX all-reduce gives the smallest: `done_everywhere`, the saves the other ranks may report as saved,
where they had reported one rank 0 then failed to mark.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from gptrain.checkpoint.agreement import first_on_any_rank
from gptrain.checkpoint.errors import CheckpointWriteError

OTHER_RANK = "stop requested on another rank"
STOP, SAVE_FAILED = 1, 2  # the flag's values; the all-reduce keeps the highest


@dataclass
class _Posted:
    """A flag all-reduced but not yet read."""

    reason: str | None
    failure: CheckpointWriteError | None
    flag: torch.Tensor  # on the host: (the flag, -done_through)
    done: torch.cuda.Event | None  # None: already complete (a CPU backend)


class StopAgreement:
    def __init__(self) -> None:
        self._posted: _Posted | None = None
        self._distributed = dist.is_available() and dist.is_initialized()
        self.done_everywhere = -1  # the newest background save every rank has found done (one agreement ago)

    def exchange(
        self,
        reason: str | None,
        read_now: bool,
        failure: CheckpointWriteError | None = None,
        done_through: int = -1,
    ) -> str | None:
        """The reason every rank stops at this step boundary, or None to go on.

        `reason` is this rank's own (None: no request). With `read_now` false it takes part only
        from the next boundary on, unless a flag posted at the last one already says stop.
        `failure`: this rank's failed background save; once agreed, every rank raises it.
        `done_through`: the step of the newest background save this rank has found done (CheckpointManager);
        the smallest over the ranks lands in `done_everywhere` when the flag is read.
        """
        if not self._distributed:
            if failure is not None:
                raise failure
            self.done_everywhere = max(self.done_everywhere, done_through)
            return reason
        earlier = self._read_posted()
        if earlier is not None:
            return earlier
        flag = self._flag(SAVE_FAILED if failure else STOP if reason else 0, done_through)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if read_now:
            return self._read(flag, reason, failure)
        self._posted = self._post(reason, failure, flag)
        return None

    def _read(
        self, flag: torch.Tensor, reason: str | None, failure: CheckpointWriteError | None
    ) -> str | None:
        """`flag` all-reduced, on the host: what it says (`_agreed`), `done_everywhere` moved on first."""
        value, negated_done = flag.tolist()
        if value != SAVE_FAILED:
            self.done_everywhere = max(self.done_everywhere, -negated_done)
        return self._agreed(value, reason, failure)

    @staticmethod
    def _agreed(flag: int, reason: str | None, failure: CheckpointWriteError | None) -> str | None:
        """What an all-reduced flag says on this rank: a failed save raised (the failing rank's own
        error; on the others, the first failing rank's line, gathered now), a stop, or None."""
        if flag == SAVE_FAILED:
            line = first_on_any_rank(str(failure) if failure else None)
            raise failure or CheckpointWriteError(line)
        return reason or (OTHER_RANK if flag else None)

    def _flag(self, value: int, done_through: int) -> torch.Tensor:
        """(value, -done_through) as an int64 tensor on the backend's device, written by fill kernels (a
        host-to-device copy of pageable values would wait for the queued step)."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        flag = torch.full((2,), value, dtype=torch.int64, device=device)
        flag[1:].fill_(-done_through)
        return flag

    @staticmethod
    def _post(reason: str | None, failure: CheckpointWriteError | None, flag: torch.Tensor) -> _Posted:
        if flag.device.type == "cpu":
            return _Posted(reason, failure, flag, None)
        host = torch.empty(flag.shape, dtype=flag.dtype, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return _Posted(reason, failure, host, done)

    def _read_posted(self) -> str | None:
        posted, self._posted = self._posted, None
        if posted is None:
            return None
        if posted.done is not None:
            posted.done.synchronize()  # long complete: the step since waited for later work
        return self._read(posted.flag, posted.reason, posted.failure)
