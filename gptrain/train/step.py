"""One optimizer step over the micro-batches of a global batch.

The loss is the per-token mean over the global batch: the sum of masked token losses over
the whole global batch divided by the number of loss tokens in it (Megatron's
--calculate-per-token-loss; its default averages each micro-batch's own mean, which differs
only when micro-batches hold different numbers of loss tokens, under eod_mask_loss), so
accumulating micro-batches gives exactly the gradient of one big batch. The pieces a parallel
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
from torch.distributed.tensor import DTensor

from gptrain.parallel.data_parallel import gradient_sync
from gptrain.parallel.grad_norm import clip_grads, scale_grads
from gptrain.train.loss_scale import ConstantLossScaler, LossScaler

Batch = dict[str, torch.Tensor]
PRECISION_DTYPES = {"32": None, "16": torch.float16, "bf16": torch.bfloat16}


IGNORE_INDEX = -100


def lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy (computed in fp32) over the tokens where loss_mask is 1.

    Masked tokens are dropped through ignore_index rather than multiplied by 0, so a non-finite
    logit there cannot poison the sum. Under torch.compile the fp32 upcast fuses into the loss
    kernel: no full-vocabulary fp32 copy of the logits is ever stored.
    """
    labels = labels.masked_fill(loss_mask == 0, IGNORE_INDEX)
    return F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, -2),
        labels.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def masked_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token cross-entropy over the tokens where loss_mask is 1 (fp32)."""
    return lm_loss_sum(model(batch["tokens"]), batch["labels"], batch["loss_mask"])


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
    # Returns (mean loss, loss tokens), as floats or as 0-d tensors still on the device.
    forward_backward: Callable[..., tuple[float | torch.Tensor, int | torch.Tensor]] | None = None
    eval_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None


@dataclass
class StepResult:
    """What one iteration did; `loss` is the token-weighted mean over the global batch."""

    loss: float
    grad_norm: float | None = None
    updated: bool = False
    overflow: bool = False  # fp16 gradients overflowed: skipped, scaler backed off
    # loss or gradients not finite, or an fp16 overflow the scaler cannot back off from: skipped, and
    # counted towards trainer.max_consecutive_nonfinite (the line's nan iterations leave out overflows)
    nonfinite: bool = False
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def nan(self) -> bool:
        """Megatron's nan iteration: skipped with a loss or gradients not finite. An fp16 overflow the
        scaler cannot back off from (a finite loss) is only skipped, though it counts towards the stop;
        the iteration line's count and the run's total in the checkpoint (TrainState) both use this."""
        return self.nonfinite and not self.overflow


def autocast(device_type: str, precision: str) -> contextlib.AbstractContextManager:
    dtype = PRECISION_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def forward_backward(
    model: nn.Module, microbatches: list[Batch], scale: float, device: torch.device, opts: StepOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulates gradients of scale * global token-mean loss; returns (mean loss, tokens) on device.

    Nothing here waits for the device: the token count is summed where the masks live (the host,
    for batches from the loader) and the results stay tensors until train_step reads them once.
    DDP all-reduces only after the last micro-batch (no_sync before it).
    """
    global_tokens = opts.reduce_sum(count_loss_tokens(microbatches, device))
    denominator = global_tokens.clamp(min=1.0)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # as the TP/PP path and evaluation sum
    for index, microbatch in enumerate(microbatches):
        batch = to_device(microbatch, device)
        with no_sync_unless_last(model, index == len(microbatches) - 1):
            with autocast(device.type, opts.precision):
                micro_loss = opts.loss_fn(model, batch)
            (micro_loss * (scale * opts.dp_size) / denominator).backward()
        loss_sum += micro_loss.detach()
    mean = opts.reduce_sum(loss_sum) / denominator
    return mean, global_tokens


def count_loss_tokens(microbatches: list[Batch], device: torch.device) -> torch.Tensor:
    """Loss tokens of this rank as a float64 scalar on `device`, without a device round trip
    (float64: summed over data-parallel ranks, a 16M-token global batch is past fp32's 2^24).

    Host masks are summed on the host and the count is written by a fill kernel (a host-to-device
    copy of a pageable scalar would wait for the queued work of the step before).
    """
    masks = [mb["loss_mask"] for mb in microbatches]
    if all(mask.device.type == "cpu" for mask in masks):
        return torch.full(
            (), float(sum(float(mask.sum()) for mask in masks)), dtype=torch.float64, device=device
        )
    return torch.stack([mask.to(device).sum(dtype=torch.float64) for mask in masks]).sum()


def no_sync_unless_last(model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Gradients reduced across data-parallel ranks after the last micro-batch only (gradient_sync)."""
    runners = getattr(getattr(model, "ctx", None), "runners", None) or [model]
    return gradient_sync(runners[0], last)


def read_on_host(*values: float | int | torch.Tensor) -> list[float]:
    """The values as Python floats, with at most one device synchronisation for all of them."""
    if not any(isinstance(v, torch.Tensor) for v in values):
        return [float(v) for v in values]
    return stack_as_float64(values).tolist()


def takes_device_skip(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> bool:
    """Whether the optimizer can apply the clip factor and skip a non-finite step on the device.

    torch's fused Adam/AdamW read `grad_scale` (grads are divided by it) and `found_inf` (1 leaves
    parameters, moments and step counts as they were) from the optimizer, as GradScaler sets them;
    over DTensor parameters (FSDP2, TP) too, the two scalars replicated. Unlike the host path, a
    skipped step still calls `optimizer.step()`: its hooks run, and a first step skipped creates
    the (zero) moments. FP8's post-step scale update under FSDP2 assumes skipped steps do not
    step: parameters whose shards are tensor subclasses (torchao's float8-gathered weights) keep
    the host-decided path. Called every step: the shards are read as `_local_tensor`, since
    `to_local()` on a parameter runs an autograd function (or makes a view) for each one.
    """
    return (
        all(group.get("fused") for group in optimizer.param_groups)
        and isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
        and all(type(p._local_tensor) is torch.Tensor for p in params if isinstance(p, DTensor))
    )


def step_on_device(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, norm: torch.Tensor, clip_grad: float | None
) -> None:
    """Queue the update with clipping folded into the fused kernel and the non-finite skip decided
    there: the host reads the step's results after the update is queued, so the device is not
    left idle while the host launches the optimizer, and the gradients are not rewritten by a
    separate clipping pass."""
    nonfinite = ~(torch.isfinite(loss) & torch.isfinite(norm))
    if clip_grad:
        coefficient = torch.clamp(clip_grad / (norm.to(torch.float32) + 1e-6), max=1.0)
        optimizer.grad_scale = torch.where(nonfinite, 1.0, 1.0 / coefficient)
    optimizer.found_inf = nonfinite.to(torch.float32)
    try:
        optimizer.step()
    finally:
        optimizer.grad_scale = optimizer.found_inf = None


@dataclass
class QueuedResult:
    """A step's (loss, tokens, grad norm), queued for the host behind the step's update.

    On a GPU they are copied into pinned host memory behind the update and an event is recorded, so
    `read` waits for this step's work only, not for anything queued after it (the next step's
    forward/backward, when the loop runs ahead: gptrain.train.overlap).
    """

    values: torch.Tensor
    ready: torch.cuda.Event | None = None

    @classmethod
    def queue(cls, *values: float | int | torch.Tensor) -> QueuedResult:
        """Queue the copy to the host behind the work queued so far (nothing waits here)."""
        stacked = stack_as_float64(values)
        if stacked.device.type != "cuda":
            return cls(stacked)
        host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
        host.copy_(stacked, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(host, ready)

    def read(self) -> list[float]:
        """The values as floats, once the work queued before them is done."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.values.tolist()


def stack_as_float64(values: tuple[float | int | torch.Tensor, ...]) -> torch.Tensor:
    """The values as one float64 vector on the device of the first tensor among them."""
    device = next(v.device for v in values if isinstance(v, torch.Tensor))
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values])


def updates_on_device(optimizer: torch.optim.Optimizer, scaler: LossScaler) -> bool:
    """Whether every step of this run can be updated and skipped on the device (see takes_device_skip):
    what lets the loop queue the next forward/backward before reading a step's results."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    constant = isinstance(scaler, ConstantLossScaler) and scaler.scale == 1.0
    return constant and bool(params) and takes_device_skip(optimizer, params)


def queue_forward_backward(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    microbatches: list[Batch],
    scaler: LossScaler,
    device: torch.device,
    opts: StepOptions,
) -> tuple[float | torch.Tensor, int | torch.Tensor]:
    """Fresh gradients of the global batch; (mean loss, tokens), still on the device."""
    optimizer.zero_grad(set_to_none=True)
    return (opts.forward_backward or forward_backward)(model, microbatches, scaler.scale, device, opts)


def queue_device_update(
    optimizer: torch.optim.Optimizer,
    loss: float | torch.Tensor,
    tokens: int | torch.Tensor,
    device: torch.device,
    opts: StepOptions,
) -> QueuedResult:
    """Clip, check and update on the device (step_on_device); the step's results queued for the host."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    norm = opts.grad_norm_fn(grads)
    step_on_device(optimizer, torch.as_tensor(loss, device=device), norm, opts.clip_grad)
    return QueuedResult.queue(loss, tokens, norm)


def read_device_step(
    queued: QueuedResult,
    optimizer: torch.optim.Optimizer,
    scaler: LossScaler,
    opts: StepOptions,
    next_step_queued: bool = False,
) -> StepResult:
    """The outcome of a step updated (or skipped) on the device, from its queued results. A skipped
    step's gradients are dropped, as the host path drops them, unless they are already the next
    step's (the loop ran ahead)."""
    result = step_outcome(scaler, opts, *queued.read())
    if not result.updated and not next_step_queued:
        optimizer.zero_grad(set_to_none=True)
    return result


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    microbatches: list[Batch],
    scaler: LossScaler,
    device: torch.device,
    opts: StepOptions,
) -> StepResult:
    """Forward/backward all micro-batches, then unscale, check, clip and step (or skip)."""
    loss, tokens = queue_forward_backward(model, optimizer, microbatches, scaler, device, opts)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grads = [p.grad for p in params]
    if scaler.scale == 1.0 and grads and takes_device_skip(optimizer, params):
        return read_device_step(
            queue_device_update(optimizer, loss, tokens, device, opts), optimizer, scaler, opts
        )
    if scaler.scale != 1.0:
        scale_grads(grads, 1.0 / scaler.scale)
    norm_tensor = opts.grad_norm_fn(grads) if grads else 0.0
    # The step's only wait for the device: loss, tokens and grad norm read together.
    result = step_outcome(scaler, opts, *read_on_host(loss, tokens, norm_tensor))
    if not result.updated:
        optimizer.zero_grad(set_to_none=True)
        return result
    if opts.clip_grad:
        total = (
            norm_tensor if isinstance(norm_tensor, torch.Tensor) else torch.tensor(norm_tensor, device=device)
        )
        clip_grads(params, opts.clip_grad, total)
    optimizer.step()
    return result


def step_outcome(
    scaler: LossScaler, opts: StepOptions, loss: float, tokens: float, norm: float
) -> StepResult:
    """The step's outcome from its host-read values: finite steps update (the caller steps, or the
    device already did), non-finite ones are skipped (the host-path caller drops their gradients)."""
    tokens = int(tokens)
    if not math.isfinite(loss):
        return StepResult(loss=loss, nonfinite=True, tokens=tokens)
    found_inf = not math.isfinite(norm)
    # an fp16 overflow the scaler cannot back off from (a static scale, or a dynamic one at its
    # floor) is counted as non-finite too, so it stops after trainer.max_consecutive_nonfinite, not never
    stuck = found_inf and not scaler.can_back_off()
    scaler.update(found_inf)
    if found_inf:
        fp16 = opts.precision == "16"
        return StepResult(
            loss=loss, grad_norm=norm, overflow=fp16, nonfinite=not fp16 or stuck, tokens=tokens
        )
    return StepResult(loss=loss, grad_norm=norm, updated=True, tokens=tokens)
