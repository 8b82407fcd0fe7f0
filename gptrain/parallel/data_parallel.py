"""Data parallelism: FSDP2 (full, hybrid or gradient/optimizer sharding) or replicated DDP.

FSDP2 wraps each transformer block, then the root, so parameters are gathered one
block at a time. Hybrid sharding passes a 2-D mesh (replicate, shard): parameters are
sharded inside a group (one node) and replicated across groups. `shard_grad_op` (ZeRO-2,
what NeMo's distributed_fused_adam and Megatron's distributed optimizer shard) keeps the
gathered weights from the step's first forward to its last backward: one all-gather per step
instead of two per micro-batch, while each micro-batch's gradients are reduce-scattered as
under full_shard, so AdamW's state, the fp32 weights and the gradients stay sharded. (Whole
gradients accumulated until the last micro-batch would save the reduce-scatters but cost
4 bytes a parameter: NeMo's 20b preset would not fit 80 GB by the planner.)

`ddp` uses torch's DistributedDataParallel when the model is a plain module (no TP,
no pipeline), which overlaps the all-reduce with the backward. With tensor or pipeline
parallelism (DTensor parameters, or several forwards before a backward in 1F1B), the
gradients are averaged by `GradAllReduce` after the backward instead: bucketed
all-reduces over the DP group of each rank's local gradient shard.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

BUCKET_BYTES = 25 * 2**20
_GATHERED_THROUGH_THE_STEP: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""Roots wrapped for shard_grad_op: gradient_sync keeps their weights gathered between micro-batches."""


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """bf16: parameters gathered in bf16, gradients reduced in fp32; fp16 and fp32 keep fp32
    parameters (fp16 runs under autocast with loss scaling, whose unscale needs fp32 grads)."""
    if precision != "bf16":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    mixed_precision: MixedPrecisionPolicy,
    reshard: bool,
    through_the_step: bool = False,
) -> nn.Module:
    """fully_shard each block, then the root (embeddings, norm, output) in place.

    `reshard=False` keeps gathered parameters between forward and backward (no second
    all-gather; used under pipeline parallelism, where a block runs many microbatches).
    `through_the_step` (shard_grad_op, with reshard=False): also between micro-batches, until the
    step's last backward (`gradient_sync`).
    """
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mixed_precision, reshard_after_forward=reshard)
    # The root's parameters are used last in the forward; gathering them again is wasted.
    fully_shard(model, mesh=dp_mesh, mp_policy=mixed_precision, reshard_after_forward=False)
    if through_the_step:
        _GATHERED_THROUGH_THE_STEP.add(model)
    return model


def gradient_sync(runner: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Gradient accumulation over a step's micro-batches, reducing across data-parallel ranks once.

    DDP: no_sync before the last micro-batch (one all-reduce per step). FSDP2: each micro-batch's
    reduce-scatter keeps gradients sharded (no memory for whole ones), but the all-reduce across
    replica groups (hybrid_shard: the inter-node traffic) waits for the last micro-batch, FSDP
    summing the partial results in between. shard_grad_op: the weights stay gathered from the first
    micro-batch's forward until the last one's backward frees them.
    """
    if isinstance(runner, FSDPModule):
        runner.set_requires_all_reduce(last)
        if runner in _GATHERED_THROUGH_THE_STEP:
            runner.set_reshard_after_backward(last)
        return contextlib.nullcontext()
    no_sync = getattr(runner, "no_sync", None)
    return no_sync() if no_sync is not None and not last else contextlib.nullcontext()


def apply_ddp(model: nn.Module, dp_group: dist.ProcessGroup, device: torch.device) -> nn.Module:
    """Wrap a plain module in DistributedDataParallel (overlapped gradient all-reduce)."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, process_group=dp_group, bucket_cap_mb=25)


class GradAllReduce:
    """Average gradients over the DP group after the backward, in flat buckets."""

    def __init__(self, parts: list[nn.Module], dp_group: dist.ProcessGroup, dp_size: int) -> None:
        self.parts = parts
        self.group = dp_group
        self.dp_size = dp_size

    def _local_grads(self) -> list[torch.Tensor]:
        grads, seen = [], set()
        for part in self.parts:
            for param in part.parameters():
                if param.grad is None or id(param) in seen:
                    continue
                seen.add(id(param))
                grad = param.grad
                grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
        return grads

    def __call__(self) -> None:
        if self.dp_size == 1:
            return
        bucket: list[torch.Tensor] = []
        size = 0
        for grad in self._local_grads():
            if bucket and grad.dtype != bucket[0].dtype:  # one flat buffer per dtype
                self._reduce(bucket)
                bucket, size = [], 0
            bucket.append(grad)
            size += grad.numel() * grad.element_size()
            if size >= BUCKET_BYTES:
                self._reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)

    def _reduce(self, bucket: list[torch.Tensor]) -> None:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=self.group)
        flat /= self.dp_size
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
