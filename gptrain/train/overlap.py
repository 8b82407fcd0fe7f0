"""Queue the next step's forward/backward before reading a step's results, where nothing waits on them.

The host reads each step's loss, token count and grad norm once, for the step's bookkeeping (LR
schedule, skip counters, stop checks, the iteration line). Read right after the step's update is
queued, the device runs dry while the host reads, bookkeeps, fetches the next batch and queues its
forward. Where the update is decided on the device (fused AdamW over plain tensors, no dynamic loss
scale: `step.updates_on_device`) the next step's forward/backward can be queued first: the device
works on it while the host waits and bookkeeps, and the next update is queued after the
bookkeeping, with the learning rate it would have had. The device runs the same work in the same
order; only the host's wait moves.

No step is queued ahead past a boundary that needs the state exactly there: a logged iteration
(the device is synchronized to time the interval), a checkpoint, a validation, the last step, a
batch-size ramp-up (the next batch's size follows from this step's), or a stop already agreed. A
stop agreed while a step is queued ahead lets that step finish, and the run stops after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gptrain.train.step import (
    Batch,
    StepResult,
    queue_device_update,
    queue_forward_backward,
    read_device_step,
    updates_on_device,
)

if TYPE_CHECKING:
    from gptrain.train.session import Session

Queued = tuple[float | torch.Tensor, int | torch.Tensor]  # (mean loss, tokens) of a forward/backward


@dataclass
class StepRunner:
    """Runs the loop's steps in order; `next` returns each one's result once the host has read it."""

    s: Session
    batches: Iterator[list[Batch]]
    runs_ahead: bool  # the run may queue a forward/backward ahead (see can_run_ahead)
    _ahead: tuple[Queued, int] | None = None  # the next step's forward/backward and its samples

    @property
    def ahead(self) -> bool:
        """A forward/backward of the step after the last one returned is queued."""
        return self._ahead is not None

    def next(self, may_run_ahead: bool) -> tuple[StepResult, int]:
        """Run the next step: (its result, its samples). With `may_run_ahead`, the step after it
        is queued before this one is read (only at full global batch)."""
        s = self.s
        s.schedule.apply()
        if self._ahead is not None:
            (loss, tokens), samples = self._ahead
            self._ahead = None
        else:
            samples = s.current_global_batch()
            batch = self._draw()
            if not self.runs_ahead:
                return s.step_fn(batch), samples
            loss, tokens = self._forward_backward(batch)
        queued = queue_device_update(s.optimizer, loss, tokens, s.device, s.step_opts)
        if may_run_ahead and samples == s.cfg.model.global_batch_size:
            self._ahead = self._forward_backward(self._draw()), samples
        result = read_device_step(queued, s.optimizer, s.scaler, s.step_opts, next_step_queued=self.ahead)
        return result, samples

    def _draw(self) -> list[Batch]:
        """The next global batch; a rank whose loader hangs is named as loading, not as one of every
        rank stuck in the step's collective (where the others wait for its gradients)."""
        with self.s.watchdog.doing("loading its micro-batches"):
            return next(self.batches)

    def _forward_backward(self, batch: list[Batch]) -> Queued:
        s = self.s
        return queue_forward_backward(s.model, s.optimizer, batch, s.scaler, s.device, s.step_opts)


def can_run_ahead(s: Session) -> bool:
    """trainer.run_ahead, where every update is decided on the device."""
    return s.cfg.trainer.run_ahead and updates_on_device(s.optimizer, s.scaler)
