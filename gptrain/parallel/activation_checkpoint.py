"""Activation checkpointing with Megatron's knobs, on the blocks of a model (or stage).

- full / uniform: every block recomputes its forward in the backward. (Megatron
  checkpoints groups of `num_layers` blocks; per-block checkpointing stores slightly
  more, one block input per block, and recomputes the same amount.)
- full / block: only the first `num_layers` blocks of each stage/chunk are recomputed.
- selective: only the attention core (scaled dot-product attention, the activation
  that grows with seq^2) is recomputed; everything else is stored.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_ATTENTION_OPS = {
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_attention_math.default,
}


# Dropout builds its mask in place (empty_like, then bernoulli_ and div_): a saved factory output
# would be mutated after caching, which selective checkpointing refuses. Such ops are recomputed
# instead (the RNG state is restored for the recomputation, so the mask is the same).
_FACTORY_OPS = {
    torch.ops.aten.empty_like,
    torch.ops.aten.empty,
    torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty,
    torch.ops.aten.zeros_like,
    torch.ops.aten.ones_like,
}


def _recompute_attention_only(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op in _ATTENTION_OPS or _allocates_or_mutates(op) or _copy_of_kept_data(op, args):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def _copy_of_kept_data(op: Any, args: tuple) -> bool:
    """Copies that cost memory, and no compute to redo, when saved (gptrain.models.gpt.fused_linears):
    the concatenated fp32 weights of a fused GEMM (a second copy of the weights per layer), and the
    copy of v or q out of the fused GEMM's output (a second copy of part of a saved output)."""
    if op is torch.ops.aten.cat.default:
        return all(isinstance(tensor, nn.Parameter) for tensor in args[0])
    if op is torch.ops.aten.clone.default:
        source = args[0]
        return source.untyped_storage().nbytes() > source.numel() * source.element_size()
    return False


def _allocates_or_mutates(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    return getattr(op, "overloadpacket", None) in _FACTORY_OPS or bool(
        schema is not None and schema.is_mutable
    )


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_recompute_attention_only)


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
