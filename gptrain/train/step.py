"""One optimizer step over the micro-batches of a global batch.

The loss is Megatron's token-weighted mean: the sum of masked token losses over the
whole global batch divided by the number of loss tokens in it, so accumulating
micro-batches gives exactly the gradient of one big batch. The pieces a parallel
layout changes (the loss all-reduce, the grad-norm function) are arguments.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from gptrain.train.loss_scale import LossScaler

Batch = dict[str, torch.Tensor]
PRECISION_DTYPES = {"32": None, "16": torch.float16, "bf16": torch.bfloat16}


def masked_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token cross-entropy over the tokens where loss_mask is 1 (fp32)."""
    logits = model(batch["tokens"])
    losses = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), reduction="none"
    )
    return (losses * batch["loss_mask"].reshape(-1)).sum()


def total_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm over all gradients of this process (replace for sharded/pipelined models)."""
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


def no_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """The loss all-reduce of a single process."""
    return tensor


@dataclass
class StepOptions:
    """How a step runs; the callables are the seams for parallel layouts."""

    precision: str = "32"
    clip_grad: float | None = None
    dp_size: int = 1  # DDP averages gradients over DP ranks; the loss is scaled back up by this
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor] = masked_lm_loss
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] = no_reduce
    grad_norm_fn: Callable[[list[torch.Tensor]], torch.Tensor] = total_grad_norm
    # Layouts whose loss needs loss_parallel or a pipeline schedule (TP/PP) replace these.
    forward_backward: Callable[..., tuple[float, int]] | None = None
    eval_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None


@dataclass
class StepResult:
    """What one iteration did; `loss` is the token-weighted mean over the global batch."""

    loss: float
    grad_norm: float | None = None
    updated: bool = False
    overflow: bool = False  # fp16 gradients overflowed: skipped, scaler backed off
    nonfinite: bool = False  # loss or gradients not finite: skipped, counted as a nan iteration
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def autocast(device_type: str, precision: str) -> contextlib.AbstractContextManager:
    dtype = PRECISION_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def forward_backward(
    model: nn.Module, microbatches: list[Batch], scale: float, device: torch.device, opts: StepOptions
) -> tuple[float, int]:
    """Accumulates gradients of scale * global token-mean loss; returns (mean loss, tokens)."""
    local_tokens = sum(mb["loss_mask"].sum() for mb in microbatches)
    global_tokens = opts.reduce_sum(torch.as_tensor(local_tokens, dtype=torch.float32, device=device))
    denominator = global_tokens.clamp(min=1.0)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    for microbatch in microbatches:
        batch = to_device(microbatch, device)
        with autocast(device.type, opts.precision):
            micro_loss = opts.loss_fn(model, batch)
        (micro_loss * (scale * opts.dp_size) / denominator).backward()
        loss_sum += micro_loss.detach()
    mean = opts.reduce_sum(loss_sum) / denominator
    return float(mean.item()), int(global_tokens.item())


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    microbatches: list[Batch],
    scaler: LossScaler,
    device: torch.device,
    opts: StepOptions,
) -> StepResult:
    """Forward/backward all micro-batches, then unscale, check, clip and step (or skip)."""
    optimizer.zero_grad(set_to_none=True)
    loss, tokens = (opts.forward_backward or forward_backward)(
        model, microbatches, scaler.scale, device, opts
    )
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=loss, nonfinite=True, tokens=tokens)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grads = [p.grad for p in params]
    if scaler.scale != 1.0:
        torch._foreach_mul_(grads, 1.0 / scaler.scale)
    norm = float(opts.grad_norm_fn(grads).item()) if grads else 0.0
    found_inf = not math.isfinite(norm)
    scaler.update(found_inf)
    if found_inf:
        optimizer.zero_grad(set_to_none=True)
        fp16 = opts.precision == "16"
        return StepResult(loss=loss, grad_norm=norm, overflow=fp16, nonfinite=not fp16, tokens=tokens)
    if opts.clip_grad:
        torch.nn.utils.clip_grads_with_norm_(params, opts.clip_grad, torch.tensor(norm, device=device))
    optimizer.step()
    return StepResult(loss=loss, grad_norm=norm, updated=True, tokens=tokens)
