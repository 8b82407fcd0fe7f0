"""Check a parallel layout before any process group starts.

Every rule here would otherwise surface as a shape error or a hang deep inside a
collective on some rank; a ConfigError naming the keys and values is raised instead.
Imports no torch, so `gptrain train` and the launcher can call it on a login node.
"""

from __future__ import annotations

import functools
from typing import Any

from gptrain.config.normalize import data_parallel_sharding
from gptrain.errors import ConfigError
from gptrain.parallel.mesh import ParallelDims

SHARDING_CHOICES = ("ddp", "shard_grad_op", "full_shard", "hybrid_shard")
AC_GRANULARITIES = ("full", "selective")
AC_METHODS = ("uniform", "block")
# How much of a step torch.compile gets (gptrain.parallel.compile applies it; the planner's
# memory model depends on it, so the rule lives here, without torch).
WHOLE, BLOCKS_AND_LOSS, BLOCKS = "whole", "blocks+loss", "blocks"


def compile_scope(dims: ParallelDims) -> str:
    """One device or DDP: forward and loss in one graph; FSDP2: each block, then the loss;
    TP or PP: each block (the loss runs on vocab-sharded DTensors or in the pipeline schedule)."""
    if dims.tp > 1 or dims.pp > 1:
        return BLOCKS
    if dims.dp > 1 and dims.dp_shard:
        return BLOCKS_AND_LOSS
    return WHOLE


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def num_microbatches(model: Any, dp: int) -> int:
    """Microbatches per DP rank per step: global batch / (micro batch x DP)."""
    return model.global_batch_size // (model.micro_batch_size * dp)


# Where a world size comes from: the config (launch preflight, planner), or the processes running.
CONFIGURED, STARTED = "trainer.num_nodes x trainer.devices", "processes started by torchrun or srun"


def check_layout(
    model: Any, world_size: int, devices_per_node: int | None = None, ranks: str = CONFIGURED
) -> ParallelDims:
    """Validate `cfg.model`'s parallel keys against the world size; return the degrees.

    `ranks`: what the world size counts (STARTED inside a training process), for the error."""
    tp, pp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size
    vpp = model.virtual_pipeline_model_parallel_size
    _require(
        tp >= 1 and pp >= 1,
        f"model.tensor_model_parallel_size={tp} and model.pipeline_model_parallel_size={pp} must be >= 1",
    )
    _require(world_size % (tp * pp) == 0, _world_message(world_size, tp, pp, ranks))
    dims = ParallelDims(world_size=world_size, tp=tp, pp=pp, vpp=vpp or 1)
    _check_model_split(model, dims)
    _check_sequence_parallel(model, tp)
    _check_batch(model, dims)
    dp_shard = _check_sharding(model, dims, devices_per_node)
    _check_activation_checkpointing(model)
    return ParallelDims(world_size=world_size, tp=tp, pp=pp, vpp=dims.vpp, dp_shard=dp_shard)


# torch releases whose compiled backward of a checkpointed TP block asserts (checked 2026-11-28: 2.12.0,
# 2.12.1 and 2.13.0 fail; 2.11.0 and 2.14.1 run it, and 2.15.0 ran the same case before).
TORCH_FAILING_COMPILE_UNDER_TP_RECOMPUTE = ("2.12.", "2.13.")


@functools.cache
def installed_torch_version() -> str:
    """The installed torch's version from its package metadata, without importing torch ("" if none)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return ""


def check_device_choices(model: Any, device_type: str, torch_version: str | None = None) -> None:
    """The layout's refusals that depend on the device type ("cuda" or "cpu") or on torch's version
    (None: the installed one's), without torch: training runs them before any process group starts
    (gptrain.parallel.parallelize.check_parallel_choices), the planner on every layout it ranks."""
    tp = model.tensor_model_parallel_size
    if model.fp8:
        check_fp8_collectives(model.fp8_recipe, tp, model.sequence_parallel, device_type)
    if model.compile:
        check_compile_under_tp_recompute(tp, model.activations_checkpoint_granularity, torch_version)


def check_fp8_collectives(recipe: str, tp: int, sequence_parallel: bool, device_type: str) -> None:
    """Raise ConfigError where tensorwise FP8 would all-gather float8 tensors over gloo.

    Under sequence parallelism torchao's float8 styles gather the sublayer inputs as float8 (and
    their gradients in the backward); gloo, the backend of CPU tensors (model.fp8_emulate), has no
    float8 types and stopped the first step with torch's 'Invalid scalar type' traceback on every rank.
    """
    if recipe == "tensorwise" and tp > 1 and sequence_parallel and device_type != "cuda":
        raise ConfigError(
            f"model.fp8_recipe=tensorwise with model.tensor_model_parallel_size={tp} and "
            "model.sequence_parallel=true all-gathers float8 tensors, which the CPU's gloo backend "
            f"cannot (this run is on {device_type}): set model.fp8_recipe=rowwise or "
            "model.sequence_parallel=false here, or run it on GPUs"
        )


def check_compile_under_tp_recompute(tp: int, recompute: str | None, version: str | None = None) -> None:
    """torch 2.12's and 2.13's compiled backward asserts on a DeviceMesh among the tensors a
    checkpointed tensor-parallel block saves (`expected all tensors_saved_with_vc_check to be
    Tensors`), on any device (plain torch: tests/distributed/tp_recompute_compile_worker.py).
    Said before the model is built, not as that traceback. `version`: None reads the installed one."""
    if tp == 1 or recompute is None:
        return
    version = installed_torch_version() if version is None else version
    if version.startswith(TORCH_FAILING_COMPILE_UNDER_TP_RECOMPUTE):
        raise ConfigError(
            f"model.compile=true with model.tensor_model_parallel_size={tp} and "
            f"model.activations_checkpoint_granularity={recompute} fails in torch {version} (torch's own "
            "assertion in the compiled backward; torch 2.11, 2.14 and later run it): upgrade torch, or set "
            "model.compile=false or model.activations_checkpoint_granularity=null"
        )


def _world_message(world_size: int, tp: int, pp: int, ranks: str) -> str:
    degrees = f"model.tensor_model_parallel_size x model.pipeline_model_parallel_size = {tp} x {pp}"
    if (
        world_size == 1 and ranks == STARTED
    ):  # `gptrain train` run directly: one process, whatever the config says
        return (
            f"{degrees} needs {tp * pp} processes (or a multiple), but this one runs alone (no RANK/WORLD_SIZE "
            "from torchrun or srun): start one process per device, with gptrain launch or "
            "python -m gptrain.parallel.torchrun --nproc-per-node=<trainer.devices> -m gptrain ..."
        )
    return f"world size {world_size} ({ranks}) is not divisible by {degrees}"


def _check_model_split(model: Any, dims: ParallelDims) -> None:
    tp, pp, vpp = dims.tp, dims.pp, model.virtual_pipeline_model_parallel_size
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    _require(
        heads % tp == 0,
        f"model.num_attention_heads={heads} is not divisible by model.tensor_model_parallel_size={tp}",
    )
    _require(
        groups % tp == 0,
        f"model.num_query_groups={groups} is not divisible by model.tensor_model_parallel_size={tp}",
    )
    ffn = model.ffn_hidden_size or 4 * model.hidden_size
    _require(
        ffn % tp == 0,
        f"model.ffn_hidden_size={ffn} is not divisible by model.tensor_model_parallel_size={tp}",
    )
    rows = getattr(model, "padded_vocab_size", None)  # the embedding's rows, split over the TP ranks
    _require(
        rows is None or rows % tp == 0,
        f"model.padded_vocab_size={rows} is not divisible by model.tensor_model_parallel_size={tp}; give a "
        "multiple of it, or null to pad by model.make_vocab_size_divisible_by",
    )
    if vpp is not None:
        _require(vpp >= 1, f"model.virtual_pipeline_model_parallel_size={vpp} must be >= 1 or null")
        _require(
            pp > 1 or vpp == 1,
            f"model.virtual_pipeline_model_parallel_size={vpp} needs model.pipeline_model_parallel_size > 1 (it is {pp})",
        )
    stage_layer_counts(model, pp, vpp or 1)


FIRST, LAST = "model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage"
EMBEDDING, LOSS = "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split"


def stage_layer_counts(model: Any, pp: int, vpp: int = 1) -> list[int]:
    """Transformer layers of each pipeline stage, in stage order (pipeline rank r's chunk v is stage
    v x pp + r, and the stages hold consecutive layers in that order), as Megatron splits them:
    an equal share each; or the first/last stage's count as given and the rest split evenly over the
    stages between; or the embedding and/or loss counted as one layer of the first/last stage.
    Every count is checked here, naming the keys, as every caller (training, the launcher's preflight,
    the planner) depends on the same split."""
    first, last = model.num_layers_in_first_pipeline_stage, model.num_layers_in_last_pipeline_stage
    embedding = bool(model.account_for_embedding_in_pipeline_split)
    loss = bool(model.account_for_loss_in_pipeline_split)
    if first is None and last is None:
        return _even_counts(model.num_layers, pp, vpp, embedding, loss)
    counts = _uneven_counts(model.num_layers, pp, vpp, first, last, _uneven_keys(None, None, embedding, loss))
    _require(
        0 not in counts,
        f"{_split_name(pp, vpp)} with {_uneven_keys(first, last, embedding, loss)} leaves pipeline stage "
        f"{counts.index(0) if 0 in counts else 0} without transformer layers (layers per stage: {counts}), "
        "which Megatron refuses between the first and last stage: use fewer stages or more layers",
    )
    return counts


def pipeline_rank_layers(counts: list[int], pp: int) -> list[int]:
    """Transformer layers held by each pipeline rank: the sum of its chunks (stages r, r + pp, ...)."""
    return [sum(counts[rank::pp]) for rank in range(pp)]


def stage_layer_ranges(counts: list[int]) -> list[range]:
    """Each stage's global layer indices (consecutive in stage order), the names its blocks keep."""
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


def _split_name(pp: int, vpp: int) -> str:
    if vpp == 1:
        return f"model.pipeline_model_parallel_size={pp}"
    return f"model.pipeline_model_parallel_size x model.virtual_pipeline_model_parallel_size = {pp} x {vpp}"


def _uneven_keys(first: int | None, last: int | None, embedding: bool, loss: bool) -> str:
    given = [f"{FIRST}={first}"] if first is not None else []
    given += [f"{LAST}={last}"] if last is not None else []
    given += [f"{EMBEDDING}=true"] if embedding else []
    given += [f"{LOSS}=true"] if loss else []
    return " and ".join(given)


def _even_counts(num_layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> list[int]:
    """An equal share per stage of the layers, counting the embedding and loss as one layer each when
    asked (Megatron's --account-for-embedding/loss-in-pipeline-split): the first/last stage then
    builds one layer fewer."""
    chunks = pp * vpp
    total = num_layers + embedding + loss
    if embedding or loss:
        counted = " + ".join(["model.num_layers"] + ["1 (embedding)"] * embedding + ["1 (loss)"] * loss)
        _require(
            total % chunks == 0,
            f"{counted} = {total} is not divisible by {_split_name(pp, vpp)} ({_uneven_keys(None, None, embedding, loss)})",
        )
    else:
        _require(
            total % chunks == 0, f"model.num_layers={num_layers} is not divisible by {_split_name(pp, vpp)}"
        )
    counts = [total // chunks] * chunks
    counts[0] -= embedding
    counts[-1] -= loss
    return counts


def _uneven_counts(
    num_layers: int, pp: int, vpp: int, first: int | None, last: int | None, accounted: str
) -> list[int]:
    """The first/last stage's layers as given, the rest split evenly over the stages between; with
    virtual stages, each rank's layers split evenly over its chunks (Megatron's rules). `accounted`:
    the account_for_*_in_pipeline_split keys set, which Megatron refuses beside these."""
    keys = _uneven_keys(first, last, False, False)
    _require(pp > 1, f"{keys} needs model.pipeline_model_parallel_size > 1 (it is {pp}): drop it")
    for key, value in ((FIRST, first), (LAST, last)):
        _require(value is None or value >= 1, f"{key}={value} must be >= 1 or null")
    _require(
        not accounted,
        f"{keys} cannot be combined with {accounted} (Megatron refuses the pair): count the embedding "
        "or loss into the first/last stage's layers yourself, or drop one of them",
    )
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    _require(rest >= 0, f"{keys} together hold more than model.num_layers={num_layers}")
    if middle == 0:
        _require(
            rest == 0,
            f"{keys} must add up to model.num_layers={num_layers}: with model.pipeline_model_parallel_size={pp} "
            "the first and last stage are every stage",
        )
    else:
        _require(
            rest % middle == 0,
            f"the {rest} layers left by {keys} (model.num_layers={num_layers}) do not split evenly over the "
            f"other {middle} of model.pipeline_model_parallel_size={pp} stages, as Megatron requires",
        )
    share = rest // middle if middle else 0
    per_rank = [share] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    for rank, layers in enumerate(per_rank):
        _require(
            layers % vpp == 0,
            f"pipeline rank {rank}'s {layers} layers ({keys}) are not divisible by "
            f"model.virtual_pipeline_model_parallel_size={vpp}: each rank's chunks hold equal shares, as in Megatron",
        )
    return [per_rank[rank] // vpp for _ in range(vpp) for rank in range(pp)]


def _check_sequence_parallel(model: Any, tp: int) -> None:
    if not model.sequence_parallel:
        return
    _require(
        tp > 1,
        "model.sequence_parallel=true needs model.tensor_model_parallel_size > 1: set one or the other",
    )
    seq = model.encoder_seq_length
    _require(
        seq % tp == 0,
        f"model.encoder_seq_length={seq} is not divisible by model.tensor_model_parallel_size={tp} "
        "(needed by model.sequence_parallel=true)",
    )


def _check_batch(model: Any, dims: ParallelDims) -> None:
    mbs, gbs, dp = model.micro_batch_size, model.global_batch_size, dims.dp
    _require(mbs >= 1, f"model.micro_batch_size={mbs} must be >= 1")
    _require(
        gbs % (mbs * dp) == 0,
        f"model.global_batch_size={gbs} is not divisible by model.micro_batch_size x data-parallel size = "
        f"{mbs} x {dp} (data-parallel size = world size / (tensor x pipeline parallel))",
    )
    n = num_microbatches(model, dp)
    _check_ramp_microbatches(model, dims)
    if dims.vpp > 1:  # a plain pipeline runs fewer micro-batches than stages (gptrain.parallel.pipeline)
        _require(
            n >= dims.pp,
            f"{n} microbatches per step (model.global_batch_size={gbs} / (micro batch {mbs} x DP {dp})) is fewer "
            f"than model.pipeline_model_parallel_size={dims.pp}, which the interleaved pipeline "
            "(model.virtual_pipeline_model_parallel_size) needs, as in Megatron: raise the global batch",
        )
        _require(
            n % interleaved_rounds(n, dims.pp) == 0,
            f"{_interleaved_message(n, dims.pp)}: change model.global_batch_size={gbs}",
        )


def interleaved_rounds(microbatches: int, pp: int) -> int:
    """Rounds torch's ScheduleInterleaved1F1B runs a step's micro-batches in: max(1, n // pp), each
    round taking the same count through every chunk before the next (Megatron's
    microbatch_group_size_per_vp_stage). n needs to be a multiple of the rounds, not of pp."""
    return max(1, microbatches // pp)


def _interleaved_message(n: int, pp: int) -> str:
    rounds = interleaved_rounds(n, pp)
    return (
        f"the interleaved pipeline (model.virtual_pipeline_model_parallel_size) runs {n} microbatches in "
        f"{rounds} equal rounds (torch's schedule: microbatches // model.pipeline_model_parallel_size={pp}), "
        f"and {n} is not a multiple of {rounds} (any multiple of {pp} is)"
    )


def _check_ramp_microbatches(model: Any, dims: ParallelDims) -> None:
    """Every ramp batch splits into micro-batches over the DP ranks (gptrain.train.rampup's own key
    checks, run here so that a layout the planner picks is one training takes); under an
    interleaved pipeline, each also fills it as the full batch must: at least one micro-batch per
    stage, in a count torch's schedule splits into equal rounds."""
    from gptrain.train.rampup import BatchRamp  # no torch

    ramp = getattr(model, "rampup_batch_size", None)
    if ramp:
        BatchRamp.from_config(list(ramp), model.global_batch_size, model.micro_batch_size * dims.dp)
    if dims.vpp == 1 or not ramp or len(ramp) != 3:
        return
    start, increment = ramp[0], ramp[1]
    per_step = model.micro_batch_size * dims.dp
    _require(
        start >= per_step * dims.pp,
        f"model.rampup_batch_size={list(ramp)}: the first ramp batch {start} gives {start // per_step} "
        f"microbatches (micro batch {model.micro_batch_size} x DP {dims.dp}), fewer than "
        f"model.pipeline_model_parallel_size={dims.pp}, which the interleaved pipeline needs, as in Megatron: "
        f"start the ramp at {per_step * dims.pp} or more",
    )
    for batch in range(start, model.global_batch_size, increment):
        n = batch // per_step
        _require(
            n % interleaved_rounds(n, dims.pp) == 0,
            f"model.rampup_batch_size={list(ramp)}: the ramp batch {batch} gives {n} microbatches (micro batch "
            f"{model.micro_batch_size} x DP {dims.dp}); {_interleaved_message(n, dims.pp)}: change the start "
            "or the increment",
        )


def _check_sharding(model: Any, dims: ParallelDims, devices_per_node: int | None) -> int:
    """Validate model.data_parallel_sharding; return the FSDP shard-group size (0 for DDP)."""
    mode = data_parallel_sharding(model)
    _require(
        mode in SHARDING_CHOICES,
        f"model.data_parallel_sharding={mode!r} must be one of {', '.join(SHARDING_CHOICES)}",
    )
    if mode == "ddp":
        return 0
    if mode in ("full_shard", "shard_grad_op") or devices_per_node is None:
        return dims.dp
    ranks_per_node_dp = max(1, devices_per_node // dims.tp)
    shard = min(dims.dp, ranks_per_node_dp)
    _require(
        dims.dp % shard == 0,
        f"model.data_parallel_sharding=hybrid_shard: data-parallel size {dims.dp} is not a multiple of the "
        f"shard group {shard} (trainer.devices={devices_per_node} / tensor parallel {dims.tp})",
    )
    return shard


def hybrid_shard_node_warning(dims: ParallelDims, devices: int, local_world_size: str | None) -> str | None:
    """hybrid_shard sizes its shard groups from trainer.devices (so that one machine can stand in for
    several nodes in tests); when the launcher started another number of processes per node
    (torchrun's/srun's LOCAL_WORLD_SIZE), the groups span nodes: the numbers are right, the
    all-gathers cross the slow links. Said once, on rank 0."""
    if not (dims.dp_shard and dims.dp_shard != dims.dp) or not (local_world_size or "").isdigit():
        return None
    if int(local_world_size) == devices:
        return None
    return (
        f"gptrain: warning: model.data_parallel_sharding=hybrid_shard shards over groups of {dims.dp_shard} "
        f"from trainer.devices={devices}, but {local_world_size} processes run on this node "
        "(LOCAL_WORLD_SIZE): the shard groups span nodes; set trainer.devices to the processes per node"
    )


def _check_activation_checkpointing(model: Any) -> None:
    granularity = model.activations_checkpoint_granularity
    method = model.activations_checkpoint_method
    count = model.activations_checkpoint_num_layers
    if granularity is None:
        return
    _require(
        granularity in AC_GRANULARITIES,
        f"model.activations_checkpoint_granularity={granularity!r} must be one of full, selective or null",
    )
    if granularity != "full":
        return
    _require(
        method in AC_METHODS,
        f"model.activations_checkpoint_method={method!r} must be uniform or block with granularity full",
    )
    _require(count is None or count >= 0, f"model.activations_checkpoint_num_layers={count} must be >= 0")
