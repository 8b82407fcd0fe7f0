"""Activation checkpointing with Megatron's knobs, on the blocks of a model (or stage).

- full / uniform: every block recomputes its forward in the backward. (Megatron
  checkpoints groups of `num_layers` blocks; per-block checkpointing stores slightly
  more, one block input per block, and recomputes the same amount.)
- full / block: only the first `num_layers` blocks of each stage/chunk are recomputed (all of
  them when `num_layers` is more than a chunk holds, as in Megatron).
- selective: the outputs of the matrix multiplications are stored, and everything else
  (the attention core, as Megatron's selective recompute does, and the cheap elementwise work:
  norms, activation function, dropout, residual sums, casts) is recomputed from them.
  Storing every other op's output instead, as this once did, kept more than no recompute at
  all: torch's selective checkpoint caches each saved op's output, also where autograd would
  have kept only its input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# What is stored: the linears' GEMMs (mm/addmm, FP8's _scaled_mm); recomputing from them is
# elementwise. Not bmm: only attention's math path runs it, and its seq x seq scores are what
# selective recompute exists not to keep.
_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_mm.default,
}
# Under TP the reductions' outputs are kept too, so the backward does not reduce again. Not the
# all-gathers' (sequence parallelism's full-sequence norm outputs): kept, they made selective keep
# more than no recompute (+22% at TP4, review E2); their sharded input is kept instead and gathered
# again in the backward, as Megatron's sequence parallelism does. Their column GEMMs stay cached.
_SAVED_OPS |= {
    getattr(torch.ops._c10d_functional, name).default
    for name in ("all_reduce", "reduce_scatter_tensor")
    if hasattr(torch.ops._c10d_functional, name)
}


def _save_matmuls_only(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Megatron's selective recompute (the attention core) plus the elementwise ops around it.

    Factory and in-place ops (dropout builds its mask with empty_like then bernoulli_) are
    recomputed anyway: a cached output mutated afterwards is refused by torch; the RNG state is
    restored for the recomputation, so the masks are the same.
    """
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_save_matmuls_only)


def blocks_to_checkpoint(keys: list[str], method: str | None, num_layers: int | None) -> list[str]:
    """Which blocks (by ModuleDict key, in order) the full granularity wraps."""
    if method == "block":
        return keys[: len(keys) if num_layers is None else num_layers]
    return keys


def apply_ac(
    model: nn.Module, granularity: str | None, method: str | None, num_layers: int | None
) -> nn.Module:
    """Wrap the blocks of `model.layers` in place; granularity None leaves them alone."""
    if granularity is None:
        return model
    keys = list(model.layers.keys())
    if granularity == "selective":
        chosen, context_fn = keys, _selective_context
    else:
        chosen, context_fn = blocks_to_checkpoint(keys, method, num_layers), None
    for key in chosen:
        kwargs = {"context_fn": context_fn} if context_fn else {}
        model.layers[key] = checkpoint_wrapper(model.layers[key], preserve_rng_state=True, **kwargs)
    return model
