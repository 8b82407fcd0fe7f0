"""Megatron's training and validation log lines, byte for byte.

Tools that parse Megatron logs (and people used to reading them) keep working.
Our own additions (MFU, ETA) are appended after the Megatron fields.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

SKIPPED = "number of skipped iterations"
# a training process's first line (gptrain.train.loop): each requeue of a job prints it again;
# `srun --label` (cluster.srun_args, as the Megatron tutorial's srun -l) puts the task id before it
PROCESS_START = re.compile(r"^(?:\s*\d+: )?gptrain: [\d,]+ parameters \|")


@dataclass
class IterationLog:
    """The numbers of one iteration line; losses are averages since the previous line."""

    iteration: int
    train_iters: int
    consumed_samples: int
    elapsed_ms_per_iteration: float
    learning_rate: float
    global_batch_size: int
    lm_loss: float | None
    loss_scale: float
    skipped_iterations: int
    nan_iterations: int
    throughput_tflops: float | None = None
    grad_norm: float | None = None
    skipped_samples: int = 0


def format_iteration_line(log: IterationLog, now: datetime | None = None) -> str:
    """The line Megatron's training_log prints (megatron-data-format.md section 10)."""
    stamp = (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")
    line = f" [{stamp}]"
    line += f" iteration {log.iteration:8d}/{log.train_iters:8d} |"
    line += f" consumed samples: {log.consumed_samples:12d} |"
    if log.skipped_samples > 0:
        line += f" skipped samples: {log.skipped_samples:12d} |"
    line += f" elapsed time per iteration (ms): {log.elapsed_ms_per_iteration:.1f} |"
    if log.throughput_tflops is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {log.throughput_tflops:.1f} |"
    line += f" learning rate: {log.learning_rate:.6E} |"
    line += f" global batch size: {log.global_batch_size:5d} |"
    if log.lm_loss is not None and log.lm_loss >= 0.0:  # Megatron prints averages >= 0
        line += f" lm loss: {log.lm_loss:.6E} |"
    line += f" loss scale: {log.loss_scale:.1f} |"
    if log.grad_norm is not None:
        line += f" grad norm: {log.grad_norm:.3f} |"
    line += f" {SKIPPED}: {log.skipped_iterations:3d} |"
    line += f" number of nan iterations: {log.nan_iterations:3d} |"
    return line


def measured_loss(loss: float | None, skipped: float) -> float | None:
    """An iteration line's `lm loss`, or None where it measured none: Megatron prints 0 for an
    interval whose iterations were all skipped (its sum over max(1, 0) updated ones)."""
    return None if loss == 0.0 and skipped > 0 else loss


def format_suffix(mfu: float | None = None, eta_seconds: float | None = None) -> str:
    """gptrain's additions after the Megatron fields: ` MFU: 41.3% | ETA 01:02:03 |`."""
    parts = ""
    if mfu is not None:
        parts += f" MFU: {100 * mfu:.1f}% |"
    if eta_seconds is not None:
        seconds = max(0, int(eta_seconds))
        parts += f" ETA {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d} |"
    return parts


def format_validation_lines(iteration: int, loss: float, where: str = "") -> list[str]:
    """Megatron's validation block: the result line between two dashed lines.

    `where` is Megatron's suffix for the test split, " on test set".
    """
    ppl = math.exp(min(20.0, loss))
    text = f" validation loss at iteration {iteration}{where} | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} | "
    dashes = "-" * (len(text) + 1)
    return [dashes, text, dashes]
