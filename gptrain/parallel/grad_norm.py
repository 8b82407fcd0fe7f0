"""Global gradient norm over every stage and the whole mesh, and clipping by it.

Per stage, `get_total_norm` over DTensor gradients reduces over the mesh dims they are
sharded on (TP, FSDP); the stages' squared norms are then summed over the pipeline
group. A parameter held twice (the untied output copy of a tied embedding under PP)
is counted once, so the norm equals the one of the single-process model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _local_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.get_default_dtype())
    norm = torch.nn.utils.get_total_norm(grads, norm_type=norm_type)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def global_grad_norm(
    grads: Iterable[torch.Tensor], pp_group: dist.ProcessGroup | None = None, norm_type: float = 2.0
) -> torch.Tensor:
    """Norm of all gradients of the model, whichever rank or stage holds them (fp32, or fp64 for fp64 grads)."""
    grads = list(grads)
    norm = _local_norm(grads, norm_type)
    norm = norm.to(torch.promote_types(norm.dtype, torch.float32))
    if grads:
        norm = norm.to(grads[0].device)
    if pp_group is None or dist.get_world_size(pp_group) == 1:
        return norm
    if math.isinf(norm_type):
        dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=pp_group)
        return norm
    total = norm**norm_type
    dist.all_reduce(total, group=pp_group)
    return total ** (1.0 / norm_type)


def scale_grads(grads: list[torch.Tensor], factor: torch.Tensor | float) -> None:
    """Multiply gradients by `factor` in place, through the tensors that hold their values on this
    rank (a DTensor's shard, replica or partial sum: scaling any of them scales the gradient, and no
    collective runs). An in-place multiply of the DTensors themselves left Partial gradients (the
    norm weights' under sequence parallelism) unscaled on torch 2.11 and 2.12."""
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if local:
        torch._foreach_mul_(local, factor)


def clip_grads(params: list[torch.nn.Parameter], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale gradients by max_norm / (total_norm + 1e-6) when that is below 1 (Megatron's and
    torch's rule; `total_norm` is the global norm, a plain tensor)."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        scale_grads(grads, torch.clamp(max_norm / (total_norm + 1e-6), max=1.0).to(grads[0].device))
