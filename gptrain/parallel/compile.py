"""torch.compile for a parallel layout: as much of the step in one graph as the layout allows.

- one device or DDP ("whole"): the forward *and* the loss (final norm, output projection,
  fp32 cross-entropy) are one graph, so the upcast to fp32 fuses into the loss kernel and no
  full-vocabulary fp32 logits are ever stored. DDP's bucketed all-reduce still overlaps the
  backward (dynamo splits the graph at bucket boundaries).
- FSDP2 ("blocks+loss"): each block is compiled inside its FSDP unit (FSDP's hooks stay
  eager between them), and the loss over the logits is compiled on its own.
- TP and PP ("blocks"): each block; the loss runs on vocab-sharded DTensors or inside the
  pipeline schedule, which dynamo does not trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gptrain.parallel.layout import BLOCKS, BLOCKS_AND_LOSS, WHOLE, compile_scope

__all__ = [
    "BLOCKS",
    "BLOCKS_AND_LOSS",
    "WHOLE",
    "apply_compile",
    "compile_options",
    "compile_scope",
    "compiled_loss_fn",
]


def compile_options(mode: str) -> dict[str, Any]:
    """torch.compile keyword arguments for `model.compile_mode` ('default' passes none)."""
    return {} if mode == "default" else {"mode": mode}


def apply_compile(model: nn.Module, mode: str = "default") -> nn.Module:
    """torch.compile each block in place (no wrapper, so parameter names are unchanged)."""
    for block in model.layers.values():
        block.compile(**compile_options(mode))
    return model


def compiled_loss_fn(scope: str, mode: str = "default") -> Callable[[nn.Module, dict], torch.Tensor] | None:
    """The step's loss_fn for `scope` (None: keep the eager default)."""
    from gptrain.train.step import lm_loss_sum, masked_lm_loss

    options = compile_options(mode)
    if scope == WHOLE:
        return torch.compile(masked_lm_loss, **options)
    if scope == BLOCKS_AND_LOSS:
        loss_on_logits = torch.compile(lm_loss_sum, **options)

        def blocks_then_compiled_loss(model: nn.Module, batch: dict) -> torch.Tensor:
            return loss_on_logits(model(batch["tokens"]), batch["labels"], batch["loss_mask"])

        return blocks_then_compiled_loss
    return None
