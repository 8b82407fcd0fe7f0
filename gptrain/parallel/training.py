"""What the training loop's seams call (gptrain/train/builders.py plugs these in).

- `build_parallel_model`: model building on meta + `parallelize` (materialized on device).
- `data_parallel_rank_size`: the DP coordinate the sampler slices by; the TP and PP ranks of
  one DP replica get the same samples. Pure arithmetic on the rank, so it is known before
  any collective (datasets are built before the process group's first collective).
- `is_logging_rank`: Megatron prints from the last rank, which holds the last stage.
- `step_overrides`: the loss/token all-reduce (over DP only), the global grad norm, and,
  for TP/PP, the forward/backward and evaluation that need loss_parallel or a schedule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gptrain.parallel.compile import compile_scope, compiled_loss_fn
from gptrain.parallel.layout import STARTED, check_layout
from gptrain.parallel.mesh import World, device_for
from gptrain.parallel.parallelize import parallelize
from gptrain.parallel.runtime import (
    ParallelGPT,
    autocast_context,
    forward_backward,
    lm_loss_sum,
    loss_context,
    masked_labels,
    sum_over_loss_ranks,
    to_plain,
)
from gptrain.train.step import count_loss_tokens

Batch = dict[str, torch.Tensor]


def build_parallel_model(model_cls: Any, model_config: Any, cfg: Any, world: World) -> ParallelGPT:
    """Build on the meta device, then parallelize (which materializes and initializes)."""
    with torch.device("meta"):
        model = model_cls(model_config)
    device = torch.device(device_for(world, cfg.trainer.resolved_accelerator()))
    return parallelize(model, cfg, world, device)


def data_parallel_rank_size(cfg: Any, world: World) -> tuple[int, int]:
    """(dp_rank, dp_size) of this rank in the mesh (pp, dp, tp), tp fastest."""
    dims = check_layout(cfg.model, world.world_size, cfg.trainer.devices, STARTED)
    return (world.rank // dims.tp) % dims.dp, dims.dp


def is_logging_rank(cfg: Any, world: World) -> bool:
    """The last rank: on the last pipeline stage, where the loss is known (print_rank_last)."""
    del cfg
    return world.rank == world.world_size - 1


def step_overrides(model: ParallelGPT) -> dict[str, Any]:
    """StepOptions fields for this layout (merged over the loop's defaults).

    With model.compile on, the loss function is compiled, with the whole forward in it where the
    layout allows (gptrain.parallel.compile).
    """
    overrides: dict[str, Any] = {"reduce_sum": model.reduce_sum, "grad_norm_fn": model.grad_norm}
    ctx = model.ctx
    dims = ctx.dims
    loss_fn = compiled_loss_fn(compile_scope(dims), ctx.compile_mode) if ctx.compile_mode else None
    if loss_fn is not None:
        overrides["loss_fn"] = loss_fn
    if dims.tp > 1 or dims.pp > 1:
        overrides["forward_backward"] = _step_forward_backward
        overrides["eval_fn"] = eval_loss_sum
    return overrides


def _step_forward_backward(
    model: nn.Module, microbatches: list[Batch], scale: float, device: torch.device, opts: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """train_step's forward_backward signature; the loss is the token-weighted LM loss."""
    del device
    assert isinstance(model, ParallelGPT)
    return forward_backward(model, microbatches, scale, opts.precision)


@torch.no_grad()
def eval_loss_sum(
    model: nn.Module, microbatches: list[Batch], precision: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of masked token losses, loss tokens) of one global batch, summed over DP, on every rank."""
    assert isinstance(model, ParallelGPT)
    ctx = model.ctx
    tokens = model.reduce_sum(count_loss_tokens(microbatches, ctx.device))
    if ctx.schedules is not None:
        local = _pipeline_eval(model, microbatches, precision)
    else:
        local = torch.zeros((), dtype=torch.float64, device=ctx.device)
        for mb in microbatches:
            batch = {key: value.to(ctx.device) for key, value in mb.items()}
            with loss_context(ctx), autocast_context(ctx.device, precision):
                local += to_plain(lm_loss_sum(ctx.runners[0](batch["tokens"]), masked_labels(batch))).double()
    return sum_over_loss_ranks(ctx, local), tokens


def _pipeline_eval(model: ParallelGPT, microbatches: list[Batch], precision: str) -> torch.Tensor:
    ctx = model.ctx
    ctx.pipeline_loss.weight = 1.0
    losses: list[torch.Tensor] = []
    args = (torch.cat([mb["tokens"] for mb in microbatches]).to(ctx.device),) if ctx.has_first_stage else ()
    target = torch.cat([masked_labels(mb) for mb in microbatches]).to(ctx.device)
    kwargs: dict[str, Any] = {"target": target, "losses": losses} if ctx.has_last_stage else {}
    with loss_context(ctx), autocast_context(ctx.device, precision):
        ctx.schedules.for_microbatches(len(microbatches), training=False).eval(*args, **kwargs)
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for loss in losses:
        total += to_plain(loss).double()
    return total
