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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

OTHER_RANK = "stop requested on another rank"


@dataclass
class _Posted:
    """A flag all-reduced but not yet read."""

    reason: str | None
    flag: torch.Tensor  # on the host
    done: torch.cuda.Event | None  # None: already complete (a CPU backend)


class StopAgreement:
    def __init__(self) -> None:
        self._posted: _Posted | None = None
        self._distributed = dist.is_available() and dist.is_initialized()

    def exchange(self, reason: str | None, read_now: bool) -> str | None:
        """The reason every rank stops at this step boundary, or None to go on.

        `reason` is this rank's own (None: no request). With `read_now` false it takes part only
        from the next boundary on, unless a flag posted at the last one already says stop.
        """
        if not self._distributed:
            return reason
        earlier = self._read_posted()
        if earlier is not None:
            return earlier
        flag = self._flag(reason)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if read_now:
            return reason or (OTHER_RANK if int(flag.item()) else None)
        self._posted = self._post(reason, flag)
        return None

    def _flag(self, reason: str | None) -> torch.Tensor:
        """A one-element int tensor on the backend's device, written by a fill kernel (a
        host-to-device copy of a pageable value would wait for the queued step)."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        return torch.full((1,), 1 if reason else 0, dtype=torch.int32, device=device)

    @staticmethod
    def _post(reason: str | None, flag: torch.Tensor) -> _Posted:
        if flag.device.type == "cpu":
            return _Posted(reason, flag, None)
        host = torch.empty(flag.shape, dtype=flag.dtype, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return _Posted(reason, host, done)

    def _read_posted(self) -> str | None:
        posted, self._posted = self._posted, None
        if posted is None:
            return None
        if posted.done is not None:
            posted.done.synchronize()  # long complete: the step since waited for later work
        if not int(posted.flag[0]):
            return None
        return posted.reason or OTHER_RANK
