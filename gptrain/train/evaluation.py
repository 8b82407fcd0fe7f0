"""Loss over whole global batches of a dataset: validation during training and `gptrain eval`.

Both use this one function, so a run's validation line and `gptrain eval` of the same
checkpoint and split agree to the bit. The loss is token-weighted over the batches (the mean
of per-token losses, not of per-batch means), reduced over data-parallel ranks in float64.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from gptrain.train.batches import GPTBatchDataset, build_loader
from gptrain.train.step import StepOptions, autocast, to_device


@dataclass(frozen=True)
class EvalSetup:
    """What evaluation needs of a run: its model under its layout and how batches are cut."""

    model: nn.Module
    step_opts: StepOptions
    device: torch.device
    micro_batch_size: int
    num_microbatches: int  # per data-parallel rank, at the full global batch
    dp_rank: int = 0
    dp_size: int = 1
    seed: int = 0
    # watches each global batch (1-based) and, given None, the closing reduction: the run's hang
    # watchdog (Watchdog.evaluation), which names a rank stuck in it; none for `gptrain eval`
    watch: Callable[[int | None], AbstractContextManager[object]] | None = None
    # notes, inside a watched batch, that this rank is drawing its micro-batches (Watchdog.doing): one
    # whose loader hangs is named as loading while the others wait in the batch's forward
    loading: Callable[[], AbstractContextManager[object]] | None = None


def _watched(setup: EvalSetup, batch: int | None) -> AbstractContextManager[object]:
    return setup.watch(batch) if setup.watch is not None else contextlib.nullcontext()


# Asked before each global batch: the reason every rank stops evaluating now, or None to go on.
StopCheck = Callable[[], "str | None"]


class EvaluationStopped(Exception):
    """An evaluation given up at a global batch boundary for a stop (a signal, trainer.max_time), its
    loss never reported: the run saves and exits to be requeued, and the requeued run evaluates again."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class EvalResult:
    loss: float
    tokens: int
    batches: int

    @property
    def perplexity(self) -> float:
        """exp(loss), inf past float64's range; NaN for a NaN loss (a diverged model), which
        `loss < 709` sent to inf as if it were a finite but huge loss."""
        if math.isnan(self.loss):
            return math.nan
        return math.exp(self.loss) if self.loss < 709.0 else math.inf


@torch.no_grad()
def evaluate_loss(
    setup: EvalSetup, data: GPTBatchDataset, num_batches: int, stop_check: StopCheck | None = None
) -> EvalResult:
    """Token-weighted mean loss over the first `num_batches` global batches of `data` (fewer if it ends).
    `stop_check`, before each global batch (every rank draws as many): EvaluationStopped when it
    gives a reason, so that Slurm's warning signal is not spent on a validation or test split that
    would be killed before its end and the run's checkpoint."""
    loader = build_loader(
        data,
        0,
        setup.micro_batch_size,
        setup.dp_rank,
        setup.dp_size,
        num_workers=0,
        seed=setup.seed,
        pin_memory=setup.device.type == "cuda",
    )
    was_training = setup.model.training
    setup.model.eval()
    try:
        if setup.step_opts.eval_fn is not None:  # TP/PP: whole global batches through the layout's forward
            return _evaluate_parallel(setup, iter(loader), num_batches, stop_check)
        return _evaluate_local(setup, iter(loader), num_batches, stop_check)
    finally:
        setup.model.train(was_training)


def _stop_if_asked(stop_check: StopCheck | None) -> None:
    if stop_check is not None and (reason := stop_check()) is not None:
        raise EvaluationStopped(reason)


def _draw(setup: EvalSetup, loader) -> dict | None:
    """The loader's next micro-batch (None at its end), noted as this rank's loading."""
    with setup.loading() if setup.loading is not None else contextlib.nullcontext():
        return next(loader, None)


def _evaluate_local(setup: EvalSetup, loader, num_batches: int, stop_check: StopCheck | None) -> EvalResult:
    opts = setup.step_opts
    loss_sum = torch.zeros((), dtype=torch.float64, device=setup.device)
    tokens = torch.zeros((), dtype=torch.float64, device=setup.device)
    batches = 0
    with contextlib.ExitStack() as watching:  # one global batch's watch at a time
        while batches < num_batches:
            # every micro-batch is drawn inside its global batch's watch: a loader hung on every rank
            # at once (a dead data mount) before a batch's first micro-batch is a hang the watch sees
            watching.close()
            watching.enter_context(_watched(setup, batches + 1))
            _stop_if_asked(stop_check)
            drawn = 0
            while drawn < setup.num_microbatches and (microbatch := _draw(setup, loader)) is not None:
                batch = to_device(microbatch, setup.device)
                with autocast(setup.device.type, opts.precision):
                    loss_sum += opts.loss_fn(setup.model, batch).double()
                tokens += batch["loss_mask"].sum().double()
                drawn += 1
            batches += drawn > 0
            if drawn < setup.num_microbatches:  # the data ended
                break
        watching.close()
        with _watched(setup, None):
            total_tokens = opts.reduce_sum(tokens)
            loss = opts.reduce_sum(loss_sum) / total_tokens.clamp(min=1)
            return EvalResult(float(loss.item()), int(total_tokens.item()), batches)


def _evaluate_parallel(
    setup: EvalSetup, loader, num_batches: int, stop_check: StopCheck | None
) -> EvalResult:
    loss_sum = tokens = 0.0
    batches = 0
    for _ in range(num_batches):
        with _watched(setup, batches + 1):
            _stop_if_asked(stop_check)
            with setup.loading() if setup.loading is not None else contextlib.nullcontext():
                microbatches = [mb for _, mb in zip(range(setup.num_microbatches), loader, strict=False)]
            if len(microbatches) < setup.num_microbatches:
                break
            batch_loss, batch_tokens = setup.step_opts.eval_fn(
                setup.model, microbatches, setup.step_opts.precision
            )
            loss_sum, tokens = loss_sum + float(batch_loss), tokens + float(batch_tokens)
        batches += 1
    return EvalResult(loss_sum / max(tokens, 1.0), int(tokens), batches)
