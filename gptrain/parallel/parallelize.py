"""Apply a parallel layout to a GPT: pipeline split, then TP -> AC -> compile -> FSDP/DDP.

The order is torchtitan's and it matters: TP turns parameters into DTensors that
activation checkpointing and compile then wrap as they are, and FSDP shards last so it
sees the TP-sharded parameters and its per-block units line up with the checkpointed
and compiled blocks. A model built on the meta device is materialized afterwards on
the right device (`to_empty`) and initialized layout-independently (`init_weights`
cuts every shard from the same full tensors).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gptrain.config.normalize import data_parallel_sharding
from gptrain.errors import ConfigError
from gptrain.models.gpt import separate_projections
from gptrain.parallel import layout as layout_checks
from gptrain.parallel.activation_checkpoint import apply_ac
from gptrain.parallel.compile import BLOCKS, BLOCKS_AND_LOSS, apply_compile, compile_scope
from gptrain.parallel.data_parallel import GradAllReduce, apply_ddp, apply_fsdp, mixed_precision_policy
from gptrain.parallel.float8 import (
    apply_fp8,
    check_fp8_device,
    gathers_float8,
    refresh_float8_scales,
)
from gptrain.parallel.layout import (
    STARTED,
    check_layout,
    hybrid_shard_node_warning,
    stage_layer_counts,
    stage_layer_ranges,
)
from gptrain.parallel.mesh import World, build_mesh
from gptrain.parallel.pipeline import build_schedules, embedding_group, is_tied, split_stage, stage_ids
from gptrain.parallel.runtime import ParallelContext, ParallelGPT
from gptrain.parallel.tensor_parallel import apply_tp


def parallelize(model: nn.Module, cfg: Any, world: World, device: torch.device | None = None) -> ParallelGPT:
    """This rank's part of `model` under `cfg.model`'s layout, ready to train.

    `model` may be on the meta device (then it is materialized and initialized from
    cfg.model.seed) or already initialized (its values are kept). The process group
    must be started when world.world_size > 1.
    """
    dims = check_layout(cfg.model, world.world_size, cfg.trainer.devices, STARTED)
    warning = hybrid_shard_node_warning(dims, cfg.trainer.devices, os.environ.get("LOCAL_WORLD_SIZE"))
    if warning and world.rank == 0:
        print(warning, file=sys.stderr, flush=True)
    _check_vocab(model, dims.tp)
    meta = any(p.is_meta for p in model.parameters())
    if device is None:
        device = torch.device("cpu") if meta else next(model.parameters()).device
    ctx = ParallelContext(dims=dims, device=device)
    ctx.compile_mode = cfg.model.compile_mode if cfg.model.compile else None
    tied = is_tied(model)
    if world.world_size == 1:
        parts = [model]
    else:
        ctx.mesh = build_mesh(dims, device.type)
        _set_ranks(ctx)
        parts = _split(model, cfg.model, ctx)
    for part in parts:
        if dims.pp > 1:
            separate_projections(part)  # micro-batches in flight would each keep a fused weight
        _apply_model_parallel(part, cfg, ctx)
    ctx.runners = list(parts)
    if dims.dp > 1 and dims.dp_shard:
        _apply_fsdp(parts, cfg, ctx)
    if meta:
        _materialize(parts, device, cfg.model.seed)
    if tied and dims.pp > 1:
        ctx.embedding_group = embedding_group(ctx.mesh)
        _copy_embedding_to_output(parts, ctx)
    for part in parts:  # the first all-gathers' float8 scales (FSDP with float8 gathers only)
        refresh_float8_scales(part)
    if dims.dp > 1 and not dims.dp_shard:
        _apply_replicated(parts, ctx)
    if dims.pp > 1:
        stages = stage_ids(ctx.pp_rank, dims.pp, dims.vpp)
        ctx.schedules = build_schedules(
            parts, stages, dims.pp * dims.vpp, ctx.pp_group, device, ctx.pipeline_loss
        )
    return ParallelGPT(parts, ctx)


def check_parallel_choices(cfg: Any, torch_version: str = torch.__version__) -> None:
    """The layout's checks that depend on this torch or on the device type (check_layout has the
    rest), for the loop to run before any process group starts; `parallelize` runs them again where
    it applies each choice. Both live without torch in gptrain.parallel.layout, where the planner
    runs them on every layout it ranks."""
    device_type = "cuda" if cfg.trainer.resolved_accelerator() == "gpu" else "cpu"
    layout_checks.check_device_choices(cfg.model, device_type, torch_version)


def _check_vocab(model: nn.Module, tp: int) -> None:
    vocab = model.tok_embeddings.num_embeddings
    if vocab % tp:
        raise ConfigError(
            f"padded vocabulary {vocab} is not divisible by model.tensor_model_parallel_size={tp}: "
            "set model.make_vocab_size_divisible_by to a multiple of it"
        )


def _set_ranks(ctx: ParallelContext) -> None:
    mesh, dims = ctx.mesh, ctx.dims
    ctx.tp_rank = mesh["tp"].get_local_rank()
    ctx.pp_rank = mesh["pp"].get_local_rank()
    ctx.dp_rank = mesh["dp"].get_local_rank()
    ctx.dp_group = mesh["dp"].get_group() if dims.dp > 1 else None
    ctx.pp_group = mesh["pp"].get_group() if dims.pp > 1 else None
    stages = stage_ids(ctx.pp_rank, dims.pp, dims.vpp)
    ctx.has_first_stage = 0 in stages
    ctx.has_last_stage = dims.pp * dims.vpp - 1 in stages


def _split(model: nn.Module, model_cfg: Any, ctx: ParallelContext) -> list[nn.Module]:
    dims = ctx.dims
    if dims.pp == 1:
        return [model]
    num_stages = dims.pp * dims.vpp
    ranges = stage_layer_ranges(stage_layer_counts(model_cfg, dims.pp, dims.vpp))
    return [
        split_stage(model, stage, num_stages, ranges[stage])
        for stage in stage_ids(ctx.pp_rank, dims.pp, dims.vpp)
    ]


def _apply_model_parallel(part: nn.Module, cfg: Any, ctx: ParallelContext) -> None:
    """FP8, then TP, then activation checkpointing, then per-block compile, on one chunk in place.

    Layouts whose whole forward and loss compile as one graph skip the per-block compile here;
    the step's loss function is compiled instead (gptrain.parallel.compile).
    """
    m = cfg.model
    if m.fp8:  # before TP, which then shards the Float8Linear weights with torchao's float8 styles
        if not m.fp8_emulate:
            check_fp8_device(ctx.device)
        layout_checks.check_fp8_collectives(m.fp8_recipe, ctx.dims.tp, m.sequence_parallel, ctx.device.type)
        fsdp = ctx.dims.dp > 1 and bool(ctx.dims.dp_shard)
        gather = gathers_float8(m.fp8_recipe, fsdp, m.fp8_fsdp_all_gather)
        apply_fp8(part, m.fp8_recipe, tp=ctx.dims.tp, fsdp_all_gather=gather, emulate=m.fp8_emulate)
    if ctx.dims.tp > 1:
        fp8_recipe = m.fp8_recipe if m.fp8 else None
        apply_tp(part, ctx.mesh["tp"], m.sequence_parallel, loss_parallel=True, fp8_recipe=fp8_recipe)
    apply_ac(
        part,
        m.activations_checkpoint_granularity,
        m.activations_checkpoint_method,
        m.activations_checkpoint_num_layers,
    )
    if m.compile and compile_scope(ctx.dims) in (BLOCKS, BLOCKS_AND_LOSS):
        check_compile_under_tp_recompute(ctx.dims.tp, m.activations_checkpoint_granularity)
        apply_compile(part, m.compile_mode)


def check_compile_under_tp_recompute(
    tp: int, recompute: str | None, version: str = torch.__version__
) -> None:
    """gptrain.parallel.layout.check_compile_under_tp_recompute on this process's torch."""
    layout_checks.check_compile_under_tp_recompute(tp, recompute, version)


def _materialize(parts: list[nn.Module], device: torch.device, seed: int) -> None:
    """Allocate on `device` and initialize each chunk exactly as the whole model would be."""
    for part in parts:
        part.to_empty(device=device)
        part.init_weights(torch.Generator(device="cpu").manual_seed(seed))


@torch.no_grad()
def _copy_embedding_to_output(parts: list[nn.Module], ctx: ParallelContext) -> None:
    """Start the last stage's output copy of a tied embedding from the embedding's values.

    The last stage zeroes its copy and the first+last pair sums: both end up with the
    first stage's weights, whatever the last stage was initialized with.
    """
    if ctx.embedding_group is None:
        return
    for part in parts:
        for name in ("tok_embeddings", "output"):
            module = getattr(part, name, None)
            if module is None:
                continue
            weight = module.weight
            local = weight.to_local() if hasattr(weight, "to_local") else weight
            if name == "output":
                local.zero_()
            dist.all_reduce(local, group=ctx.embedding_group)


def _apply_fsdp(parts: list[nn.Module], cfg: Any, ctx: ParallelContext) -> None:
    """FSDP2 on every chunk: over the dp mesh, or (replicate, shard) for hybrid sharding."""
    dims = ctx.dims
    dp_mesh = ctx.mesh["dp_rep", "dp_shard"] if dims.dp_replicate > 1 else ctx.mesh["dp"]
    policy = mixed_precision_policy(cfg.trainer.precision)
    grad_op = data_parallel_sharding(cfg.model) == "shard_grad_op"
    for part in parts:
        # Under PP a chunk runs many micro-batches: keep its parameters gathered until the backward.
        # shard_grad_op keeps them for the whole step (PP's schedule already holds them).
        reshard = dims.pp == 1 and not grad_op
        apply_fsdp(part, dp_mesh, policy, reshard=reshard, through_the_step=grad_op and dims.pp == 1)


def _apply_replicated(parts: list[nn.Module], ctx: ParallelContext) -> None:
    """torch DDP (overlapped all-reduce) on a plain model; a bucketed all-reduce after the backward otherwise."""
    dims = ctx.dims
    if dims.tp == 1 and dims.pp == 1:
        ctx.runners = [apply_ddp(parts[0], ctx.dp_group, ctx.device)]
    else:
        ctx.grad_sync = GradAllReduce(parts, ctx.dp_group, dims.dp)
