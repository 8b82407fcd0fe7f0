"""The parallelized model as the training loop sees it, and its forward/backward.

`ParallelGPT` registers this rank's model chunks under the whole model's names
(`tok_embeddings`, `layers.<i>`, `norm`, `output`), so `parameters()`, the optimizer
and the DCP state-dict helpers see exactly the FQNs of a single-process GPT whatever
the layout: a checkpoint saved under one layout loads under any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from gptrain.parallel.data_parallel import gradient_sync
from gptrain.parallel.grad_norm import global_grad_norm
from gptrain.parallel.mesh import ParallelDims
from gptrain.parallel.pipeline import sync_tied_embedding_grads

Batch = dict[str, torch.Tensor]
IGNORE_INDEX = -100
AUTOCAST_DTYPES = {"16": torch.float16, "bf16": torch.bfloat16}


class PipelineLoss:
    """The last stage's loss function, weighted for the backward (weight set per step)."""

    def __init__(self) -> None:
        self.weight: float | torch.Tensor = 1.0  # a device scalar in training (no host read)

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return lm_loss_sum(logits, target) * self.weight


@dataclass
class ParallelContext:
    """Groups and ranks of this process in the layout (None where a degree is 1)."""

    dims: ParallelDims
    device: torch.device
    dp_rank: int = 0
    tp_rank: int = 0
    pp_rank: int = 0
    dp_group: dist.ProcessGroup | None = None
    pp_group: dist.ProcessGroup | None = None
    embedding_group: dist.ProcessGroup | None = None
    mesh: Any = None
    schedules: Any = None  # PipelineSchedules under pipeline parallelism
    pipeline_loss: PipelineLoss = field(default_factory=PipelineLoss)
    has_first_stage: bool = True
    has_last_stage: bool = True
    grad_sync: Callable[[], None] | None = None
    runners: list[nn.Module] = field(default_factory=list)
    compile_mode: str | None = None  # model.compile_mode when model.compile is on

    @property
    def loss_parallel(self) -> bool:
        return self.dims.tp > 1


class ParallelGPT(nn.Module):
    """This rank's chunks of the GPT, addressable with the single-process names."""

    def __init__(self, parts: list[nn.Module], ctx: ParallelContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.parts = parts  # plain list: not registered twice
        layers = nn.ModuleDict()
        for part in parts:
            for name in ("tok_embeddings", "pos_embeddings", "norm", "output"):
                module = getattr(part, name, None)
                if module is not None:
                    self.add_module(name, module)
            for key, block in part.layers.items():
                layers[key] = block
        self.layers = layers

    def train(self, mode: bool = True) -> ParallelGPT:
        """Also switch the chunks and wrappers themselves (their own dropout is not a child here)."""
        super().train(mode)
        for module in [*self.parts, *self.ctx.runners]:
            module.train(mode)
        return self

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of one micro-batch (only without pipeline parallelism)."""
        if len(self.ctx.runners) != 1 or self.ctx.schedules is not None:
            raise RuntimeError("a pipelined model runs through forward_backward/eval_loss_sum, not forward")
        return self.ctx.runners[0](tokens)

    def duplicate_grads(self) -> set[int]:
        """ids of gradients counted elsewhere (the output copy of a tied embedding under PP)."""
        if self.ctx.embedding_group is None or getattr(self, "output", None) is None:
            return set()
        grad = self.output.weight.grad
        return {id(grad)} if grad is not None else set()

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The step's grad-norm seam: global norm over stages and mesh."""
        skip = self.duplicate_grads()
        return global_grad_norm([g for g in grads if id(g) not in skip], self.ctx.pp_group)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The step's loss/token all-reduce seam: sum over the data-parallel group only."""
        out = tensor.clone()
        if self.ctx.dp_group is not None:
            dist.all_reduce(out, group=self.ctx.dp_group)
        return out


def masked_labels(batch: Batch) -> torch.Tensor:
    """Labels with IGNORE_INDEX where loss_mask is 0 (one tensor the pipeline can split)."""
    return batch["labels"].masked_fill(batch["loss_mask"] == 0, IGNORE_INDEX)


def lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies over unmasked labels; logits may be vocab-sharded DTensors."""
    return F.cross_entropy(
        upcast(logits).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def upcast(logits: torch.Tensor) -> torch.Tensor:
    """Logits in at least fp32 for the loss (a float64 model keeps float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def loss_context(ctx: ParallelContext) -> contextlib.AbstractContextManager:
    return loss_parallel() if ctx.loss_parallel else contextlib.nullcontext()


def forward_backward(
    model: ParallelGPT, microbatches: list[Batch], scale: float, precision: str = "32"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate gradients of scale x the per-token mean loss over the global batch (train.step).

    Returns (mean loss over the global batch, loss tokens in it) on every rank, as float64
    scalars on the device: nothing here waits for the device (train_step reads them once, with
    the grad norm). Gradients are averaged over DP and summed over the tied embedding copies.
    """
    from gptrain.train.step import count_loss_tokens  # the loop's own count (step imports this package)

    ctx = model.ctx
    if scale <= 0:
        raise ValueError(f"loss scale must be positive, got {scale}")
    global_tokens = model.reduce_sum(count_loss_tokens(microbatches, ctx.device))
    denominator = global_tokens.clamp(min=1.0)
    weight = (scale * ctx.dims.dp) / denominator
    if ctx.schedules is not None:
        loss_sum = _pipeline_forward_backward(model, microbatches, weight, precision)
    else:
        loss_sum = _local_forward_backward(model, microbatches, weight, precision)
    sync_tied_embedding_grads(model.parts, ctx.embedding_group)
    if ctx.grad_sync is not None:
        ctx.grad_sync()
    return sum_over_loss_ranks(ctx, loss_sum) / denominator, global_tokens


def _local_forward_backward(
    model: ParallelGPT, microbatches: list[Batch], weight: torch.Tensor, precision: str
) -> torch.Tensor:
    ctx = model.ctx
    runner = ctx.runners[0]
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for index, microbatch in enumerate(microbatches):
        batch = {key: value.to(ctx.device, non_blocking=True) for key, value in microbatch.items()}
        last = index == len(microbatches) - 1
        with gradient_sync(runner, last), loss_context(ctx):
            with autocast_context(ctx.device, precision):
                logits = runner(batch["tokens"])
            loss = lm_loss_sum(logits, masked_labels(batch))
            (loss * weight).backward()
        loss_sum += to_plain(loss.detach())
    return loss_sum


def _pipeline_forward_backward(
    model: ParallelGPT, microbatches: list[Batch], weight: torch.Tensor, precision: str
) -> torch.Tensor:
    """One schedule step over all micro-batches (stacked; the schedule splits them again)."""
    ctx = model.ctx
    tokens = torch.cat([mb["tokens"] for mb in microbatches]).to(ctx.device)
    labels = torch.cat([masked_labels(mb) for mb in microbatches]).to(ctx.device)
    ctx.pipeline_loss.weight = weight
    losses: list[torch.Tensor] = []
    args = (tokens,) if ctx.has_first_stage else ()
    kwargs: dict[str, Any] = {"target": labels, "losses": losses} if ctx.has_last_stage else {}
    with loss_context(ctx), autocast_context(ctx.device, precision):
        ctx.schedules.for_microbatches(len(microbatches)).step(*args, return_outputs=False, **kwargs)
    # The schedule's shape-inference pass may call the loss on dummy data: use only its list.
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for loss in losses:
        total += to_plain(loss.detach()).to(torch.float64) / weight
    return total


def to_plain(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def sum_over_loss_ranks(ctx: ParallelContext, loss_sum: torch.Tensor) -> torch.Tensor:
    """Sum the DP ranks' loss sums, counted once per DP rank (last stage, TP rank 0), as a
    float64 scalar on the device (every rank gets it; no host read)."""
    value = loss_sum.detach().to(torch.float64)
    if not dist.is_initialized() or ctx.dims.world_size == 1:
        return value
    owner = ctx.has_last_stage and ctx.tp_rank == 0
    if not owner:
        value = torch.zeros_like(value)
    dist.all_reduce(value)
    return value
