"""Named builders that turn a TrainingConfig into the pieces of a run.

Each is small and replaceable: the parallel layer (gptrain.parallel) plugs in through
`build_parallel_model`, `data_parallel_rank_size`, `with_parallel_seams` (the step options'
reduce/norm/forward-backward/eval functions) and `is_logging_rank`.
"""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from gptrain.checkpoint import architecture
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError, DataError
from gptrain.models.config import GPTConfig
from gptrain.parallel.float8 import refresh_scales_after_step
from gptrain.parallel.mesh import World, cuda_index
from gptrain.train.batches import GPTBatchDataset
from gptrain.train.loss_scale import LossScaler, build_loss_scaler
from gptrain.train.model_config import build_model_config  # noqa: F401  (the builders' seam)
from gptrain.train.optim import build_optimizer
from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule import LRSchedule, ScheduleSpec
from gptrain.train.step import StepOptions, no_reduce
from gptrain.train.target_sizes import dataset_target_sizes, split_sizes_asked_by, train_samples_read
from gptrain.train.tokenizer_setup import (
    check_data_tokenizer,
    check_token_ids,
    padded_vocab_size,
    tokenizer_check,
)
from gptrain.train.weight_decay_schedule import weight_decay_spec


def seed_everything(seed: int) -> None:
    """Seeds this process's global streams (python, numpy, torch): what dropout draws from.

    Init and the data order use generators of their own, seeded with model.seed on every rank.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def dropout_seed(cfg: TrainingConfig, world: World) -> int:
    """Seam: this rank's seed for seed_everything, Megatron's per rank (gptrain.parallel.rng):
    model.seed + 100 x pipeline rank, + 2718 + tensor rank under sequence parallelism."""
    from gptrain.parallel.rng import rank_dropout_seed

    return rank_dropout_seed(cfg, world)


def select_device(cfg: TrainingConfig, world: World) -> torch.device:
    if cfg.trainer.resolved_accelerator() == "gpu":
        if not torch.cuda.is_available():
            raise ConfigError(
                "trainer.accelerator=gpu but no CUDA device is visible; use trainer.accelerator=cpu"
            )
        index = cuda_index(world.local_rank)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def is_mock_data(cfg: TrainingConfig) -> bool:
    return cfg.model.data.is_mock()


SHARDING_LINES = {
    "ddp": "replicated (DDP)",
    "shard_grad_op": "AdamW state and gradients sharded, weights gathered once per step (shard_grad_op)",
    "full_shard": "weights, gradients and AdamW state sharded (full_shard)",
    "hybrid_shard": "sharded within a node, replicated across nodes (hybrid_shard)",
}
"""What each model.data_parallel_sharding keeps on a rank, for the start of the log."""


def megatron_start_lines(cfg: TrainingConfig, vocab: int, model_config: Any, dp_size: int = 1) -> list[str]:
    """Megatron's padding line and its parameter line for every (tensor, pipeline) rank; with 2+
    data-parallel ranks, what they share (NeMo's distributed optimizer names choose a sharding);
    then Megatron's datasets target sizes."""
    from gptrain.parallel.layout import pipeline_rank_layers, stage_layer_counts
    from gptrain.plan.sizes import megatron_parameter_lines, padded_vocab_line

    m = cfg.model
    lines = [padded_vocab_line(vocab, model_config.vocab_size)]
    pp = m.pipeline_model_parallel_size
    rank_layers = pipeline_rank_layers(
        stage_layer_counts(m, pp, m.virtual_pipeline_model_parallel_size or 1), pp
    )
    lines += megatron_parameter_lines(model_config, m.tensor_model_parallel_size, pp, rank_layers)
    if dp_size > 1:
        lines.append(f" > data parallel over {dp_size} ranks: {SHARDING_LINES[m.data_parallel_sharding]}")
    return lines + dataset_size_lines(cfg)


def log_memory(log: Any, device: torch.device, step: int) -> None:
    """Megatron's memory report line (each rank, in its own log): what `gptrain plan --measure` reads."""
    if device.type != "cuda":
        return
    mib = 2.0**20
    log(
        f"[Rank {dist.get_rank() if dist.is_initialized() else 0}] (after {step} iterations) memory (MB)"
        f" | allocated: {torch.cuda.memory_allocated(device) / mib:.1f}"
        f" | max allocated: {torch.cuda.max_memory_allocated(device) / mib:.1f}"
        f" | reserved: {torch.cuda.memory_reserved(device) / mib:.1f}"
        f" | max reserved: {torch.cuda.max_memory_reserved(device) / mib:.1f}"
    )


def device_memory_bytes(device: torch.device) -> int | None:
    """The GPU's total memory (what the planner's estimate is held against); None elsewhere."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def build_model(model_config: Any, device: torch.device, seed: int) -> nn.Module:
    """Build on meta, materialise on `device`, init from a generator seeded with model.seed."""
    from gptrain.models.gpt import GPT

    with torch.device("meta"):
        model = GPT(model_config)
    model.to_empty(device=device)
    model.init_weights(torch.Generator(device="cpu").manual_seed(seed))
    return model


def build_parallel_model(
    model_config: Any, cfg: TrainingConfig, world: World, device: torch.device
) -> nn.Module:
    """Seam: build on meta, apply the layout (PP split, TP, AC, compile, FSDP/DDP), then materialize
    on `device` and init from model.seed (the same weights as build_model, whatever the layout)."""
    from gptrain.models.gpt import GPT
    from gptrain.parallel.parallelize import parallelize

    with torch.device("meta"):
        model = GPT(model_config)
    return parallelize(model, cfg, world, device)


def data_parallel_rank_size(cfg: TrainingConfig, world: World) -> tuple[int, int]:
    """Seam: (dp_rank, dp_size) the sampler slices by; TP/PP ranks of one replica read the same samples."""
    from gptrain.parallel.training import data_parallel_rank_size as dp_rank_size

    return dp_rank_size(cfg, world)


def check_batch_sizes(cfg: TrainingConfig, dp_size: int) -> None:
    """The global batch must split into whole micro batches on every data-parallel rank (ramp included)."""
    m = cfg.model
    BatchRamp.from_config(m.rampup_batch_size, m.global_batch_size, m.micro_batch_size * dp_size)
    if m.global_batch_size % (m.micro_batch_size * dp_size) != 0:
        raise ConfigError(
            f"model.global_batch_size={m.global_batch_size} is not divisible by model.micro_batch_size x "
            f"data-parallel size = {m.micro_batch_size} x {dp_size}"
        )


def is_logging_rank(cfg: TrainingConfig, world: World) -> bool:
    """Seam: the rank that prints iteration lines: the last rank, on the last pipeline stage (Megatron)."""
    from gptrain.parallel.training import is_logging_rank as last_rank

    return last_rank(cfg, world)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks (the DP loss/token all-reduce of the default layout)."""
    out = tensor.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def build_step_options(cfg: TrainingConfig, dp_size: int) -> StepOptions:
    """Seam: how a step reduces losses and computes the grad norm for this layout."""
    distributed = dist.is_available() and dist.is_initialized() and dp_size > 1
    return StepOptions(
        precision=cfg.trainer.precision,
        clip_grad=cfg.trainer.gradient_clip_val or None,
        dp_size=dp_size,
        reduce_sum=all_reduce_sum if distributed else no_reduce,
    )


def build_adamw(cfg: TrainingConfig, model: nn.Module, device: torch.device) -> torch.optim.AdamW:
    """AdamW; under a weight-decay increment the decaying groups are built at its end (LRSchedule sets
    each step's decay, and finds those groups by a decay above 0)."""
    o = cfg.model.optim
    increment = weight_decay_spec(cfg)
    weight_decay = o.weight_decay if increment is None else increment.end
    optimizer = build_optimizer(model, o.name, o.lr, weight_decay, o.betas, o.eps, device.type)
    refresh_scales_after_step(optimizer, model)  # FSDP's float8 gathers (model.fp8_fsdp_all_gather)
    return optimizer


def build_scaler(cfg: TrainingConfig) -> LossScaler:
    m = cfg.model
    return build_loss_scaler(
        cfg.trainer.precision,
        m.native_amp_init_scale,
        m.native_amp_growth_interval,
        m.hysteresis,
        static=m.native_amp_static_scale,
    )


def build_checkpoint_manager(
    cfg: TrainingConfig,
    world: World,
    vocab_size: int,
    device: torch.device | None = None,
    tokenizer: Any | None = None,
    model_config: GPTConfig | None = None,
) -> CheckpointManager:
    """Checkpoints in exp_manager.checkpoints_dir, keeping save_top_k (the best by monitor, or the
    newest) and the newest; `vocab_size` (unpadded) tells the padding rows apart when TP changed the
    padded vocabulary; `tokenizer` and `model_config`'s architecture settings are recorded with each
    save and checked against each checkpoint loaded."""
    params = cfg.exp_manager.checkpoint_callback_params
    root = Path(cfg.exp_manager.checkpoints_dir)
    return CheckpointManager(
        root,
        params.save_top_k,
        rank=world.rank,
        async_save=params.async_save,
        vocab_size=vocab_size,
        direct_io=params.direct_io,
        pinned_staging=None if device is None else device.type == "cuda",  # a CPU run pins nothing
        tokenizer=tokenizer_check(cfg, tokenizer),
        tied=cfg.model.share_embeddings_and_output_weights,
        architecture=architecture.record(model_config) if model_config is not None else None,
        monitor=params.monitor,
        mode=params.mode,
    )


def with_parallel_seams(opts: StepOptions, model: nn.Module) -> StepOptions:
    """The layout's loss all-reduce (DP group), global grad norm and, for TP/PP, forward/backward and eval."""
    from gptrain.parallel.runtime import ParallelGPT
    from gptrain.parallel.training import step_overrides

    if not isinstance(model, ParallelGPT):
        return opts
    return dataclasses.replace(opts, **step_overrides(model))


def build_schedule(cfg: TrainingConfig, optimizer: torch.optim.Optimizer) -> LRSchedule:
    """The learning-rate schedule, and Megatron's weight-decay increment where configured."""
    return LRSchedule(optimizer, schedule_spec(cfg), weight_decay_spec(cfg))


def schedule_spec(cfg: TrainingConfig) -> ScheduleSpec:
    from gptrain.train.schedule import spec_from_config

    return spec_from_config(cfg)


def build_datasets(
    cfg: TrainingConfig,
    vocab: int,
    tokenizer: Any | None,
    local_rank: int | None = None,
    asked_by: Sequence[str] | None = None,
    note: Callable[[str], None] | None = None,
) -> tuple[Any, Any, Any]:
    """(train, valid, test) GPTBatchDatasets with Megatron's sample counts; valid/test may be None.
    `asked_by`: what set each split's count, for an error about it (default: the config's keys).
    `note`: where a line about the build goes (the run's log); without it, rank 0's stderr.

    With a process group the ranks build in three turns (`build_turn`), each loading what the
    turns before wrote to the index cache: rank 0 first, then one rank per node (`local_rank` 0;
    read from the environment when None), then the rest. On a cache miss the index arrays cost
    gigabytes of memory and tens of seconds per builder; a cache on a shared filesystem is filled
    once, and one on each node's own disk (the default sits beside the data, which is often
    copied to local NVMe) once per node, never by all of a node's ranks at once.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return _build_datasets(cfg, vocab, tokenizer, asked_by, note)
    if local_rank is None:
        from gptrain.parallel.mesh import world_from_env

        local_rank = world_from_env().local_rank
    mine = build_turn(dist.get_rank(), local_rank)
    built: tuple[Any, Any, Any] = (None, None, None)
    for turn in range(3):
        failure: Exception | None = None
        if turn == mine:
            try:
                built = _build_datasets(cfg, vocab, tokenizer, asked_by, note)
            except Exception as error:  # told to the other ranks, then raised here
                failure = error
        verdicts: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(verdicts, None if failure is None else str(failure) or type(failure).__name__)
        if failure is not None:
            raise failure
        failed = next((r for r, verdict in enumerate(verdicts) if verdict is not None), None)
        if failed is not None:
            raise DataError(f"rank {failed} could not build the datasets: {verdicts[failed]}")
    return built


def batch_eod(tokenizer: Any | None, eod_mask_loss: bool) -> int | None:
    """The end-of-document id the batches use: only model.data.eod_mask_loss reads it (Megatron's
    GPT dataset needs it for that and for reset_attention_mask/position_ids, which gptrain refuses),
    so an imported tokenizer.json without one trains and evaluates, as generate and export take it."""
    if tokenizer is None or not eod_mask_loss:
        return None
    try:
        return int(tokenizer.eod)
    except DataError as error:
        raise DataError(f"model.data.eod_mask_loss needs an end-of-document token: {error}") from None


def batch_pad(tokenizer: Any | None, allow_ambiguous: bool = False) -> int | None:
    """The padding id whose labels leave the loss, as Megatron's GPT dataset masks its tokenizer's
    pad (since core 0.7): NullTokenizer's model.tokenizer.null_pad_id, and a HuggingFaceTokenizer's
    pad_token (its HF tokenizer's pad from core 0.15; gptrain's other tokenizers have none that text
    encodes to). One that is the end of document is none, as Megatron's dataset resets it since core
    0.16, unless `allow_ambiguous`
    (model.data.allow_ambiguous_pad_tokens; ambiguous_pad_warning says so)."""
    pad = padding_id(tokenizer)
    if pad is None:
        return None
    if pad == eod_or_none(tokenizer) and not allow_ambiguous:
        return None
    return pad


def eod_or_none(tokenizer: Any) -> int | None:
    """The tokenizer's end-of-document id, None where it has none (an imported tokenizer.json still
    trains without one: batch_eod)."""
    try:
        return int(tokenizer.eod)
    except DataError:
        return None


def padding_id(tokenizer: Any | None) -> int | None:
    """The tokenizer's own padding id (NullTokenizer's, a HuggingFaceTokenizer's pad_token), or None."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_wrappers import HFTokenizer

    if not isinstance(tokenizer, NullTokenizer | HFTokenizer) or tokenizer.pad < 0:
        return None
    return tokenizer.pad


def null_vocab(tokenizer: Any | None) -> int | None:
    """NullTokenizer's vocab_size, which every sample's ids are held to as batches are made (nothing
    else bounds them: gptrain.data.token_bound reads only a small corpus at the start); None for any
    other tokenizer, whose samples keep the embedding's rows as their only per-sample bound."""
    from gptrain.data.null_tokenizer import NullTokenizer

    return int(tokenizer.vocab_size) if isinstance(tokenizer, NullTokenizer) else None


def build_turn(rank: int, local_rank: int) -> int:
    """0 for rank 0, 1 for the first rank of every other node, 2 for the rest (build_datasets)."""
    if rank == 0:
        return 0
    return 1 if local_rank == 0 else 2


def dataset_size_lines(cfg: TrainingConfig) -> list[str]:
    """Megatron's lines of the splits' target sizes, which its users compare between runs."""
    train, valid, test = dataset_target_sizes(cfg)
    return [
        " > datasets target sizes (minimum size):",
        f"    train:      {train}",
        f"    validation: {valid}",
        f"    test:       {test}",
    ]


def built_split_lines(datasets: Sequence[Any]) -> list[str]:
    """Megatron's lines of what the (train, valid, test) GPTBatchDatasets hold: samples, epochs."""
    from gptrain.data.builder import built_split_lines as lines

    return lines([getattr(dataset, "samples", None) for dataset in datasets])


def _build_datasets(
    cfg: TrainingConfig,
    vocab: int,
    tokenizer: Any | None,
    asked_by: Sequence[str] | None = None,
    note: Callable[[str], None] | None = None,
) -> tuple[Any, Any, Any]:
    from gptrain.data.builder import build_gpt_datasets

    m = cfg.model
    if not is_mock_data(cfg):
        check_data_tokenizer(cfg, tokenizer=tokenizer)
        check_token_ids(cfg, tokenizer)  # before index builds of minutes

    def build(sizes: tuple[int, int, int], only_split: str | None = None) -> tuple[Any, Any, Any]:
        return build_gpt_datasets(
            m.data.data_prefix,
            m.data.splits_string,
            m.data.seq_length,
            m.seed,
            sizes,
            cache_dir=m.data.index_mapping_dir,
            mock=is_mock_data(cfg),
            vocab_size=vocab,
            skip_unused=True,  # limit_val/test_batches=0: that split is not built at all
            only_split=only_split,
            asked_by=asked_by or split_sizes_asked_by(cfg),
            surplus=m.data.mid_level_dataset_surplus,
        )

    sizes = dataset_target_sizes(cfg)
    train, valid, test = build(sizes)
    built_for = sizes[0]
    read = train_samples_read(cfg)
    if train is not None and read is not None and len(train) < read:  # Megatron's split would run out
        line = (
            f"the train split built for trainer.train_samples={sizes[0]:,} holds {len(train):,}"
            f" samples, fewer than the {read:,} that trainer.max_steps read: it is built for {read:,}"
        )
        if note is not None:  # each rank's own log, echoed by the logging rank
            note(line)
        elif not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
            print(f"gptrain: {line}", file=sys.stderr)
        train, built_for = build((read, *sizes[1:]), only_split="train")[0], read
    eod = batch_eod(tokenizer, m.data.eod_mask_loss)
    rows = padded_vocab_size(cfg, tokenizer)[1]
    source = "model.data.data_prefix"
    pad, limit = batch_pad(tokenizer, m.data.allow_ambiguous_pad_tokens), null_vocab(tokenizer)
    wrapped = [
        GPTBatchDataset(d, eod, m.data.eod_mask_loss, rows, source, pad, limit) if d is not None else None
        for d in (train, valid, test)
    ]
    if wrapped[0] is not None:
        wrapped[0].built_for = built_for
    return wrapped[0], wrapped[1], wrapped[2]
