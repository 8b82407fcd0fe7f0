"""NeMo's alternative spellings mapped onto gptrain's canonical values, before validate checks them."""

from __future__ import annotations

import math
import os
from typing import Any

from gptrain.config.checkpoint_params import dirpath_apart_from_log_dir, save_interval
from gptrain.config.schema import TrainingConfig, default_min_lr
from gptrain.config.tokenizer_checks import tokenizer_type, use_fast_notes
from gptrain.errors import ConfigError

PRECISIONS = {"32": "32", "32-true": "32", "16": "16", "16-mixed": "16", "bf16": "bf16", "bf16-mixed": "bf16"}
OPTIMIZER_ALIASES = ("adam", "adamw", "fused_adam", "distributed_fused_adam", "mcore_distributed_optim")
DISTRIBUTED_OPTIMIZERS = ("distributed_fused_adam", "mcore_distributed_optim")
"""NeMo's optimizers that shard AdamW's state over the data-parallel ranks (ZeRO-2 in effect)."""
FSDP_STRATEGIES = {"full": "full_shard", "hybrid": "hybrid_shard", "grad": "shard_grad_op"}
"""NeMo's model.fsdp_sharding_strategy values and the data_parallel_sharding each means."""


def normalize(cfg: TrainingConfig) -> list[str]:
    """Map NeMo's alternative spellings onto gptrain's canonical values; the notes say what NeMo
    itself would have changed."""
    precision = str(cfg.trainer.precision)
    if precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision: {_unknown_precision(precision)}")
    cfg.trainer.precision = PRECISIONS[precision]
    optimizer = cfg.model.optim.name.lower()
    if optimizer not in OPTIMIZER_ALIASES:
        raise ConfigError(f"model.optim.name: '{cfg.model.optim.name}' is not supported; use adamw")
    cfg.model.data_parallel_sharding = data_parallel_sharding(cfg.model)
    cfg.model.optim.name = "adamw"
    _fused_bias_gelu(cfg.model)
    if cfg.model.ffn_hidden_size is None:
        cfg.model.ffn_hidden_size = 4 * cfg.model.hidden_size
    if cfg.model.optim.sched.min_lr is None:
        cfg.model.optim.sched.min_lr = _schedule_default_min_lr(cfg)
    if cfg.model.data.mock_dataset:
        cfg.model.data.data_impl = "mock"
    if cfg.model.fsdp:
        strategy = cfg.model.fsdp_sharding_strategy
        if strategy not in FSDP_STRATEGIES:
            raise ConfigError(
                f"model.fsdp_sharding_strategy: '{strategy}' is not one of {', '.join(FSDP_STRATEGIES)}"
            )
        cfg.model.data_parallel_sharding = FSDP_STRATEGIES[strategy]
    tokenizer_type(cfg.model.tokenizer)
    _one_resume_source(cfg)
    if cfg.exp_manager.tensorboard_dir:  # hparams.yaml, a requeued job and `gptrain plot` read it elsewhere
        cfg.exp_manager.tensorboard_dir = os.path.abspath(os.path.expanduser(cfg.exp_manager.tensorboard_dir))
    params = cfg.exp_manager.checkpoint_callback_params
    params.dirpath = params.dirpath or (os.path.dirname(params.filepath) if params.filepath else None)
    if params.dirpath:  # as Lightning's ModelCheckpoint resolves it; hparams.yaml records it for the tools
        params.dirpath = os.path.abspath(os.path.expanduser(params.dirpath))
        dirpath_apart_from_log_dir(params.dirpath, cfg.exp_manager.explicit_log_dir)
    _max_time_per_run(cfg)
    notes = save_interval(cfg) + use_fast_notes(cfg.model.tokenizer)
    return notes + _sequence_parallel_needs_tp(cfg.model) + _block_recompute_past_the_chunk(cfg.model)


def _fused_bias_gelu(model: Any) -> None:
    """Megatron's fused bias-GELU kernel (megatron/core/fusions/fused_bias_gelu.py), which NeMo's
    bias_activation_fusion and Megatron's default select, is GELU's tanh approximation, gptrain's
    openai_gelu (the two agree to 3e-10). Megatron turns the fusion off without biases."""
    if model.bias_activation_fusion and model.activation == "gelu" and model.bias:
        model.openai_gelu = True


def _unknown_precision(precision: str) -> str:
    """Why `precision` is refused: Lightning's `16-true`/`bf16-true` keep the weights in that type, with
    no fp32 master copy, which gptrain's mixed precision always keeps."""
    half = precision.removesuffix("-true")
    if precision.endswith("-true") and half in PRECISIONS:
        return (
            f"'{precision}' is PyTorch Lightning's {half} weights without fp32 master weights, which gptrain "
            f"does not implement; use {half} ({half}-mixed): {half} compute over fp32 weights"
        )
    return f"'{precision}' is not one of 32, 16, bf16 (also 32-true, 16-mixed, bf16-mixed)"


def _sequence_parallel_needs_tp(model: Any) -> list[str]:
    """NeMo turns sequence parallelism off at TP 1 (and says so), so a preset with it on keeps
    working when TP is overridden to 1; refusing would reject a NeMo command line."""
    if not (model.sequence_parallel and model.tensor_model_parallel_size == 1):
        return []
    model.sequence_parallel = False
    return [
        "model.sequence_parallel=true needs model.tensor_model_parallel_size > 1; turned off, as NeMo does"
    ]


def _block_recompute_past_the_chunk(model: Any) -> list[str]:
    """Full recompute by block of more layers than a pipeline chunk holds recomputes all of them, as
    in Megatron (gptrain.parallel.activation_checkpoint takes the first N of each chunk); said, since
    the number no longer says what runs."""
    count, chunks = model.activations_checkpoint_num_layers, model.pipeline_model_parallel_size
    chunks *= model.virtual_pipeline_model_parallel_size or 1
    if model.activations_checkpoint_granularity != "full" or model.activations_checkpoint_method != "block":
        return []
    if count is None or chunks < 1 or model.num_layers % chunks or count <= model.num_layers // chunks:
        return []
    if model.num_layers_in_first_pipeline_stage or model.num_layers_in_last_pipeline_stage:
        return []  # chunks of several sizes: the note's one count would be wrong for some
    if model.account_for_embedding_in_pipeline_split or model.account_for_loss_in_pipeline_split:
        return []
    return [
        f"model.activations_checkpoint_num_layers={count} is more than the {model.num_layers // chunks} layers "
        "of a pipeline chunk: every layer of each chunk is recomputed, as Megatron does"
    ]


def data_parallel_sharding(model: Any) -> str:
    """model.data_parallel_sharding, or where it is null what model.optim.name asks for: NeMo's and
    Megatron-Core's distributed optimizers shard AdamW's state and the gradients (shard_grad_op);
    any other optimizer is replicated (ddp)."""
    if model.data_parallel_sharding is not None:
        return model.data_parallel_sharding
    return "shard_grad_op" if model.optim.name.lower() in DISTRIBUTED_OPTIMIZERS else "ddp"


def _one_resume_source(cfg: TrainingConfig) -> None:
    """NeMo spells the checkpoint to start from exp_manager.resume_from_checkpoint,
    model.resume_from_checkpoint or (megatron_gpt_config.yaml) model.restore_from_ckpt.
    Made absolute against the working directory it was given in: hparams.yaml records it, and a
    requeued job, `gptrain export` or a moved run's check read it from other directories."""
    em = cfg.exp_manager
    spellings = {
        "exp_manager.resume_from_checkpoint": em.resume_from_checkpoint,
        "model.resume_from_checkpoint": cfg.model.resume_from_checkpoint,
        "model.restore_from_ckpt": cfg.model.restore_from_ckpt,
    }
    given = {key: os.path.abspath(path) for key, path in spellings.items() if path}
    if len(set(given.values())) > 1:
        shown = " and ".join(f"{key} ({path})" for key, path in given.items())
        raise ConfigError(f"{shown} differ: give one of them")
    if given:  # each spelling as absolute as the one used, so that hparams.yaml agrees with itself
        em.resume_from_checkpoint = next(iter(given.values()))
        cfg.model.resume_from_checkpoint = (
            em.resume_from_checkpoint if cfg.model.resume_from_checkpoint else None
        )
        if cfg.model.restore_from_ckpt:
            cfg.model.restore_from_ckpt = em.resume_from_checkpoint
    if cfg.model.restore_from_ckpt is not None:  # NeMo's continue_training: consumed samples from 0
        em.load_data_position = False


def check_max_time(value: Any, key: str) -> None:
    """DD:HH:MM:SS (or its last parts), none negative (00:00:-1:00 read as 59 minutes), each finite
    (00:00:nan:00 never compared as reached: no limit), and not zero: every job stopped after one
    step to be requeued, until cluster.max_requeues was spent (Slurm's --time=0 and Megatron's
    --exit-duration-in-mins 0 mean no limit; Lightning's max_time 0 stops after one step)."""
    parts = str(value).split(":")
    try:
        if any(not 0 <= float(part) < math.inf for part in parts) or len(parts) > 4:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{key}: '{value}' is not DD:HH:MM:SS") from None
    if not any(float(part) for part in parts):
        raise ConfigError(
            f"{key}: '{value}' leaves no time to train: each job would stop after one step to be "
            "requeued; give the time a job may train (DD:HH:MM:SS), or null for no limit"
        )


def _max_time_per_run(cfg: TrainingConfig) -> None:
    """NeMo's exp_manager.max_time_per_run is a limit per job (a StatelessTimer), which is what
    trainer.max_time is in gptrain; as in NeMo, it wins where both are set."""
    per_run = cfg.exp_manager.max_time_per_run
    if per_run is not None:
        check_max_time(per_run, "exp_manager.max_time_per_run")
        cfg.trainer.max_time = per_run


def _schedule_default_min_lr(cfg: TrainingConfig) -> float:
    """The NeMo default of a min_lr the config leaves out; one above lr (SquareAnnealing's 1e-5 beside
    a smaller lr) is refused here, where the line can say the user never wrote it."""
    name, lr = cfg.model.optim.sched.name, cfg.model.optim.lr
    min_lr = default_min_lr(name)
    if 0 < lr < min_lr:
        raise ConfigError(
            f"model.optim.sched.min_lr: not set, so {name}'s NeMo default {min_lr:g}, which is above"
            f" model.optim.lr={lr:g}; set model.optim.sched.min_lr (0 up to lr)"
        )
    return min_lr
