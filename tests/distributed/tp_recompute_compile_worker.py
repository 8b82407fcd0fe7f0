"""One gloo rank of the plain-torch case behind gptrain.parallel.parallelize.check_compile_under_tp_recompute.

A sequence-parallel attention block (LayerNorm under SequenceParallel; the input gathered by
PrepareModuleInput and kept a Replicate DTensor; ColwiseParallel q/k/v, RowwiseParallel output),
inside checkpoint_wrapper (full, and selective with a save-the-matmuls policy), compiled in place as
gptrain compiles blocks; one forward/backward each. No gptrain code runs: it is torch's behaviour.
Rank 0 writes {"full": outcome, "selective": outcome} to OUT, the outcome "runs" or the exception's
first line. Argument: OUT. Without the attention (an MLP alone) torch 2.13 runs it.
"""

import functools
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

HIDDEN, HEAD_DIM = 16, 4


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, -1, HEAD_DIM).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.attention = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attention(self.norm(x))


def save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:  # type: ignore[no-untyped-def]
    return (
        CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE
    )


def sharded_block(mesh: DeviceMesh, granularity: str) -> nn.Module:
    torch.manual_seed(0)
    block = Block()
    plan = {
        "norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(block, mesh, plan)
    if granularity == "selective":
        block = checkpoint_wrapper(
            block, context_fn=functools.partial(create_selective_checkpoint_contexts, save_matmuls)
        )
    else:
        block = checkpoint_wrapper(block)
    block.compile()
    return block


def outcome(block: nn.Module) -> str:
    x = torch.randn(2, 4, HIDDEN, requires_grad=True)  # this rank's half of 8 positions
    try:
        block(x).sum().backward()
    except Exception as error:  # torch's own failure, whatever its type, is the finding
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return "runs"


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {
        granularity: outcome(sharded_block(mesh, granularity)) for granularity in ("full", "selective")
    }
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as handle:
            json.dump(results, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
