"""Numbers between two iteration lines, and the line itself (Megatron's + MFU + ETA).

Pure bookkeeping: it knows nothing of the loop, which prints the line and writes the scalars.

Like Megatron, the loss is averaged over the iterations that updated the model since
the previous line, and the skipped/nan counts in the line are per interval. An interval with no
update still has a loss point on the dashboards (Megatron writes every logged iteration's own loss,
skipped or not): the mean of its iterations' losses. The first line of a process (its first step
alone), where it is not on the logging interval, is a peek, as Megatron's: the next line's loss and
counts go back to the process's start. Its time does not: Megatron's does, the warm-up in the next
line's time per iteration; gptrain's leaves it out. A first line on the interval (log_every_n_steps=1)
is an ordinary one: Megatron's newest does not reset there either, so its next line averages two
iterations; its older ones, which print no first line, reset there as gptrain does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gptrain.train import results as tb
from gptrain.train.logline import IterationLog, format_iteration_line, format_suffix
from gptrain.train.metrics import (
    MEGATRON_TAGS,
    NEMO_TAGS,
    TIMING_KEYS,
    dashboard_scalars,
    mfu,
    tflops_per_gpu,
    tokens_per_second,
)
from gptrain.train.rampup import BatchRamp
from gptrain.train.step import StepResult


@dataclass
class IntervalMeter:
    """Accumulates one logging interval; `reset` starts the next."""

    start_step: int = 0
    started: float = field(default_factory=time.perf_counter)
    iterations: int = 0
    updated: int = 0
    loss_sum: float = 0.0
    loss_seen: bool = False  # an iteration of this process updated: Megatron's line has a loss from then on
    skipped: int = 0
    skipped_loss_sum: float = 0.0  # the skipped iterations' own losses: an interval of them still has a point
    nans: int = 0
    last_lr: float = 0.0
    last_scale: float = 1.0
    last_grad_norm: float | None = None
    samples: int = 0
    last_batch: int | None = None  # global batch of the last step (ramp-up changes it)
    excluded_s: float = 0.0  # checkpoint saves and validation inside the interval
    eta_origin: tuple[float, int] | None = None  # (time, consumed samples) at the process's first line

    def eta_seconds(self, now: float, consumed: int, samples_left: int) -> float | None:
        """Wall time to max_steps: the samples left at the time per sample since the process's first
        line (its warm-up step left out), validations and saves included: they are part of the time
        the run takes, though not of the time per iteration. Counted in samples, not steps: a batch
        ramp-up's steps so far are smaller than those left (a step's work is its batch's share). The
        mean since the first line rather than the last interval's: it holds the validations and saves
        an interval may not, and does not swing with one slow interval."""
        if self.eta_origin is None or consumed <= self.eta_origin[1]:
            return None
        began, first = self.eta_origin
        return samples_left * (now - began) / (consumed - first)

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Time spent in the block is not training time: Megatron stops its interval timer
        around saves and evaluation, so the rate and MFU stay those of the steps."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.excluded_s += time.perf_counter() - began

    def add(self, result: StepResult, lr: float, scale: float, batch: int | None = None) -> None:
        self.iterations += 1
        if batch is not None:
            self.samples += batch
            self.last_batch = batch
        # Megatron's skipped iterations are those that did not update (a nan one is also skipped)
        self.skipped += int(not result.updated)
        self.nans += int(result.nan)  # Megatron's nan iterations (StepResult.nan)
        # Megatron prints the grad norm of the last iteration, none when it was skipped
        self.last_grad_norm = result.grad_norm if result.updated else None
        if result.updated:
            self.updated += 1
            self.loss_seen = True
            self.loss_sum += result.loss
        else:
            self.skipped_loss_sum += result.loss
        self.last_lr, self.last_scale = lr, scale

    def seconds_per_iteration(self, now: float) -> float:
        return max(0.0, now - self.started - self.excluded_s) / max(1, self.iterations)

    def dashboard_loss(self) -> float | None:
        """The dashboards' loss: the line's mean where an iteration updated; else the mean of the skipped
        iterations' own losses (Megatron writes a skipped iteration's loss to TensorBoard, a NaN too)."""
        if self.updated:
            return self.loss_sum / self.updated
        return self.skipped_loss_sum / self.skipped if self.skipped else None

    def line_loss(self) -> float | None:
        """The line's loss as Megatron's training_log prints it: the sum over max(1, updated), so 0 for an
        interval of skipped iterations, and none before the process's first update."""
        return self.loss_sum / max(1, self.updated) if self.loss_seen else None

    def batch_share(self, global_batch_size: int) -> float:
        """Mean global batch of the interval over the full one (1 outside a ramp-up)."""
        if not self.samples or not self.iterations:
            return 1.0
        return self.samples / (self.iterations * global_batch_size)

    def reset(self, now: float, timing_only: bool = False) -> None:
        """Start the next interval; `timing_only`: its time (a process's first line: the loss and
        counts carry on to the next line, as Megatron's first line resets none of its own)."""
        self.samples = 0
        self.started, self.iterations = now, 0
        self.excluded_s = 0.0
        if timing_only:
            return
        self.updated, self.loss_sum = 0, 0.0
        self.skipped = self.nans = 0
        self.skipped_loss_sum = 0.0


@dataclass(frozen=True)
class RunShape:
    """What an iteration line needs to know about the run beyond the interval itself."""

    flops_per_iteration: float
    peak_tflops: float | None
    world_size: int
    global_batch_size: int
    seq_length: int
    max_steps: int
    log_throughput: bool = True  # the line's throughput field (trainer.log_throughput)
    ramp: BatchRamp | None = None  # model.rampup_batch_size (None: every step a global batch)
    log_every_n_steps: int = 1  # the lines on this interval end one; a process's first line off it is a peek

    def samples_left(self, step: int, consumed_samples: int) -> int:
        """The samples of the steps to max_steps, walked along the ramp from those consumed."""
        ramp = self.ramp or BatchRamp(self.global_batch_size)
        return ramp.samples_for(max(0, self.max_steps - step), after=consumed_samples)


@dataclass
class IntervalReport:
    """One interval's iteration line and its dashboard scalars: by iteration, and Megatron's
    `... vs samples` series whose x axis is consumed samples."""

    line: str
    by_step: dict[str, float | None]
    vs_samples: dict[str, float | None]
    warm_up: bool = False  # the process's first line: its first step alone, warm-up included


def interval_report(meter: IntervalMeter, step: int, consumed_samples: int, run: RunShape) -> IntervalReport:
    """The iteration line (Megatron's, plus MFU and ETA) and the TensorBoard scalars; resets `meter`.

    The first line of a process is its first step alone: compilation, allocator and kernel warm-up,
    often hundreds of times a step (25 s against 25 ms on an H100). It gets no ETA rather than one
    that many times too long; the later lines' ETA counts from it (IntervalMeter.eta_seconds).
    """
    now = time.perf_counter()
    warm_up = meter.eta_origin is None
    eta = meter.eta_seconds(now, consumed_samples, run.samples_left(step, consumed_samples))
    if meter.eta_origin is None:
        meter.eta_origin = (now, consumed_samples)
    seconds = meter.seconds_per_iteration(now)
    share = meter.batch_share(run.global_batch_size)  # FLOPs and tokens scale with the ramp's batch
    batch = meter.last_batch or run.global_batch_size
    tflops = tflops_per_gpu(run.flops_per_iteration * share, seconds, run.world_size)
    line = format_iteration_line(
        IterationLog(
            iteration=step,
            train_iters=run.max_steps,
            consumed_samples=consumed_samples,
            elapsed_ms_per_iteration=seconds * 1000.0,
            throughput_tflops=tflops if run.log_throughput else None,
            learning_rate=meter.last_lr,
            global_batch_size=batch,
            lm_loss=meter.line_loss(),
            loss_scale=meter.last_scale,
            grad_norm=meter.last_grad_norm,
            skipped_iterations=meter.skipped,
            nan_iterations=meter.nans,
        )
    )
    line += format_suffix(mfu(tflops, run.peak_tflops), eta)
    gptrain_tags = {
        tb.TB_LM_LOSS: meter.dashboard_loss(),
        tb.TB_LEARNING_RATE: meter.last_lr,
        tb.TB_GRAD_NORM: meter.last_grad_norm,
        tb.TB_LOSS_SCALE: meter.last_scale,
        tb.TB_STEP_TIME: seconds,
        tb.TB_CONSUMED_SAMPLES: consumed_samples,  # an int: exact in TensorBoard (results.add_scalar)
        tb.TB_TOKENS_PER_SECOND: tokens_per_second(run.global_batch_size * share, run.seq_length, seconds),
        tb.TB_TFLOPS: tflops,
    }
    by_step, by_samples = dashboard_scalars(
        {
            "loss": meter.dashboard_loss(),
            "lr": meter.last_lr,
            "grad_norm": meter.last_grad_norm,
            "loss_scale": meter.last_scale,
            "batch_size": batch,
            "seconds": seconds,
            "tflops": tflops,
            "world_size": run.world_size,
            "step": step,
            "consumed": consumed_samples,
        }
    )
    peek = warm_up and step % run.log_every_n_steps != 0  # as Megatron's first line off --log-interval
    meter.reset(time.perf_counter(), timing_only=peek)
    return IntervalReport(
        line=line, by_step={**gptrain_tags, **by_step}, vs_samples=by_samples, warm_up=warm_up
    )


# The tags an interval's timing sets: a printed line's only, also where each iteration's own values
# go to the dashboards (iteration_scalars).
TIMING_TAGS = frozenset(
    {tb.TB_STEP_TIME, tb.TB_TOKENS_PER_SECOND, tb.TB_TFLOPS, NEMO_TAGS["seconds"]}
    | {MEGATRON_TAGS[key] for key in TIMING_KEYS}
)


def timing_only(by_step: dict[str, float | None]) -> dict[str, float | None]:
    """An interval's timing scalars, without its mean loss and last rates (iteration_scalars has those)."""
    return {tag: value for tag, value in by_step.items() if tag in TIMING_TAGS}


def dashboard_by_step(report: IntervalReport) -> dict[str, float | None]:
    """The line's scalars for TensorBoard and W&B: the first line of a process without its timing, which
    is the warm-up's (compilation: hundreds of times a step), a spike after every restart that sets the
    charts' scale. Megatron writes no iteration-time for its first iteration either."""
    if not report.warm_up:
        return report.by_step
    return {tag: value for tag, value in report.by_step.items() if tag not in TIMING_TAGS}


def iteration_scalars(
    result: StepResult, lr: float, scale: float, batch: int, step: int, consumed_samples: int, world_size: int
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """(by iteration, by consumed samples): one iteration's own values, as Megatron writes them every
    --tensorboard-log-interval iterations (trainer.tensorboard_log_interval): its loss, not a mean, and
    no timing, which an interval measures. A skipped iteration's loss is written too, as Megatron's
    training_log writes it (a NaN as well, under --fp16's dynamic scaling, where Megatron goes on); it
    has no grad norm (Megatron's optimizer returns none when it skips)."""
    loss = result.loss
    grad_norm = result.grad_norm if result.updated else None
    gptrain_tags = {
        tb.TB_LM_LOSS: loss,
        tb.TB_LEARNING_RATE: lr,
        tb.TB_GRAD_NORM: grad_norm,
        tb.TB_LOSS_SCALE: scale,
        tb.TB_CONSUMED_SAMPLES: consumed_samples,
    }
    by_step, by_samples = dashboard_scalars(
        {
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "loss_scale": scale,
            "batch_size": batch,
            "world_size": world_size,
            "step": step,
            "consumed": consumed_samples,
        }
    )
    return {**gptrain_tags, **by_step}, by_samples
