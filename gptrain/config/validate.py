"""Reject impossible values, naming the key (after gptrain.config.normalize).

Checks that need the world size (parallel layout divisibility) live in
gptrain.parallel.layout; these run on the config alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gptrain.config.checkpoint_params import check_monitor, check_retention
from gptrain.config.normalize import PRECISIONS, check_max_time
from gptrain.config.schema import PER_SPLIT_KEYS, TrainingConfig
from gptrain.config.tokenizer_checks import check_tiktoken_settings
from gptrain.errors import ConfigError
from gptrain.utils.tokenizer_types import (
    MEGATRON_TYPES,
    NULL_TYPE,
)

CHOICES = {
    "trainer.accelerator": ("auto", "gpu", "cpu"),
    "model.normalization": ("layernorm", "layernorm1p", "rmsnorm"),
    "model.activation": ("gelu", "swiglu", "fast-swiglu"),
    "model.position_embedding_type": ("learned_absolute", "rope"),
    "model.data_parallel_sharding": ("ddp", "shard_grad_op", "full_shard", "hybrid_shard"),
    "model.activations_checkpoint_granularity": (None, "full", "selective"),
    "model.activations_checkpoint_method": (None, "uniform", "block"),
    "model.compile_mode": ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"),
    "model.fp8_recipe": ("tensorwise", "rowwise"),
    "model.optim.name": ("adamw",),
    "exp_manager.checkpoint_callback_params.mode": ("min", "max"),
    "model.optim.sched.name": (
        "CosineAnnealing",
        "LinearAnnealing",
        "Constant",
        # NeMo's others (gptrain.train.nemo_schedules, which config may not import)
        "WarmupPolicy",
        "WarmupAnnealing",
        "SquareAnnealing",
        "SquareRootAnnealing",
        "InverseSquareRootAnnealing",
        "PolynomialDecayAnnealing",
        "WarmupHoldPolicy",
        "PolynomialHoldDecayAnnealing",
        "WarmupHoldAnnealLinear",
        "WarmupHoldAnnealOneMinusSquareRoot",
        "NoamHoldAnnealing",
        "NoamAnnealing",
        # Megatron's (gptrain.train.megatron_schedules)
        "MegatronInverseSquareRoot",
        "WarmupStableDecay",
    ),
    "model.optim.sched.wsd_decay_style": (None, "linear", "cosine", "exponential", "minus_sqrt"),
    "model.optim.sched.warmup_style": ("nemo", "megatron"),
    "model.data.data_impl": ("mmap", "mock"),
    "model.tokenizer.type": MEGATRON_TYPES,
    "model.tokenizer.tiktoken_pattern": (None, "v1", "v2"),
}
POSITIVE = (
    "trainer.num_nodes",
    "trainer.devices",
    "trainer.max_steps",
    "trainer.log_every_n_steps",
    "trainer.val_check_interval",
    "exp_manager.checkpoint_callback_params.every_n_train_steps",
    "model.micro_batch_size",
    "model.global_batch_size",
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.encoder_seq_length",
    "model.num_layers",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.make_vocab_size_divisible_by",
    "model.data.seq_length",
)
# The fp16 loss scaler's settings, which Megatron's DynamicGradScaler asserts > 0; the scaler exists
# only with fp16, so Megatron and NeMo take any value beside bf16 or fp32.
LOSS_SCALER_POSITIVE = ("model.native_amp_growth_interval", "model.hysteresis")

# 0 is meaningful (no clipping, no decay, loading in the main process, no warmup); a negative value
# is not: a negative clip would flip every gradient and train uphill, and a negative warmup was
# refused only by the job, at its start (min_lr is checked with lr, in _check_batches).
NON_NEGATIVE = (
    "trainer.gradient_clip_val",
    "trainer.limit_val_batches",
    "trainer.limit_test_batches",
    "model.optim.weight_decay",
    "model.optim.sched.warmup_steps",
    "model.optim.sched.warmup_ratio",
    "model.optim.sched.warmup_samples",
    "model.optim.sched.warmup_fraction",
    "model.optim.sched.warmup_init_lr",
    "model.optim.sched.constant_steps",
    "model.optim.sched.constant_ratio",
    "model.optim.sched.hold_steps",
    "model.optim.sched.hold_ratio",
    "model.optim.sched.power",  # the decays' exponents: 0 holds lr to max_steps, as in NeMo (x ** 0 is 1)
    "model.optim.sched.decay_rate",
    "model.optim.sched.wsd_decay_steps",
    "model.optim.sched.wsd_decay_samples",
    "model.data.num_workers",
    "model.data.mid_level_dataset_surplus",  # a negative one builds a blend's datasets short of their share
)
# NoamAnnealing's width: null is the model's, 0 or less a division by zero (d_model ** -0.5).
ABOVE_ZERO_OR_NULL = ("model.optim.sched.d_model",)


def get(cfg: TrainingConfig, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def validate(cfg: TrainingConfig) -> None:
    """Raise ConfigError for the first value that cannot work, naming its key."""
    for key, choices in CHOICES.items():
        value = get(cfg, key)
        if value not in choices:
            shown = ", ".join(str(c) for c in choices)
            raise ConfigError(f"{key}: '{value}' is not one of {shown}")
    for key in POSITIVE:
        if get(cfg, key) < 1:
            raise ConfigError(f"{key}: must be at least 1, got {get(cfg, key)}")
    check_retention(cfg.exp_manager)
    check_monitor(cfg.exp_manager.checkpoint_callback_params.monitor)
    tb_every = cfg.trainer.tensorboard_log_interval
    if tb_every is not None and (isinstance(tb_every, bool) or tb_every < 1):
        raise ConfigError(
            "trainer.tensorboard_log_interval: must be at least 1, or null for trainer.log_every_n_steps's "
            f"interval, got {tb_every}"
        )
    memory_every = cfg.trainer.log_memory_interval
    if memory_every is not None and (isinstance(memory_every, bool) or memory_every < 1):
        raise ConfigError(
            f"trainer.log_memory_interval: must be at least 1, or null for the end's report only, got {memory_every}"
        )
    exit_interval = cfg.trainer.exit_interval
    if exit_interval is not None and (isinstance(exit_interval, bool) or exit_interval < 1):
        raise ConfigError(
            f"trainer.exit_interval: must be at least 1, or null for no exit interval, got {exit_interval}"
        )
    nonfinite = cfg.trainer.max_consecutive_nonfinite
    if isinstance(nonfinite, bool) or nonfinite < 1:  # 0 read as "never stop" stopped at the first
        raise ConfigError(
            "trainer.max_consecutive_nonfinite: must be at least 1 (the non-finite iterations in a row that "
            f"stop the run; 1 stops at the first, as Megatron's --check-for-nan-in-loss-and-grad), got {nonfinite}"
        )
    if cfg.trainer.train_samples is not None and cfg.trainer.train_samples < 1:
        raise ConfigError(
            f"trainer.train_samples: must be at least 1 or null, got {cfg.trainer.train_samples}"
        )
    for key in NON_NEGATIVE:
        value = get(cfg, key)
        if value is not None and not value >= 0:
            raise ConfigError(f"{key}: must be 0 or more, got {value}")
    for key in ABOVE_ZERO_OR_NULL:
        value = get(cfg, key)
        if value is not None and not value > 0:
            raise ConfigError(f"{key}: must be above 0, or null for the schedule's default, got {value}")
    if PRECISIONS.get(str(cfg.trainer.precision)) == "16":
        _check_loss_scaler(cfg)
    _check_run_directories(cfg)
    _check_model(cfg)
    _check_batches(cfg)
    _check_data(cfg)


# fp16's largest value is 65504, so a static scale S overflows any gradient above 65504 / S. At
# 2**24 that is 3.9e-3, about the largest gradient element pretraining sees; the 2**32 default
# (meant for the dynamic scaler, which halves it in a few steps) overflows any above 1.5e-5, i.e. always.
MAX_STATIC_LOSS_SCALE = 2**24


def _check_loss_scaler(cfg: TrainingConfig) -> None:
    """The fp16 loss scaler's settings, as Megatron asserts them (a scale of 0 zeroes every gradient);
    a static scale reads only the scale, as Megatron's ConstantGradScaler does."""
    for key in () if cfg.model.native_amp_static_scale else LOSS_SCALER_POSITIVE:
        if get(cfg, key) < 1:
            raise ConfigError(f"{key}: must be at least 1, got {get(cfg, key)}")
    if not cfg.model.native_amp_init_scale > 0:
        raise ConfigError(
            f"model.native_amp_init_scale: must be greater than 0, got {cfg.model.native_amp_init_scale}"
        )
    if cfg.model.native_amp_static_scale and cfg.model.native_amp_init_scale > MAX_STATIC_LOSS_SCALE:
        raise ConfigError(
            f"model.native_amp_init_scale: {cfg.model.native_amp_init_scale:g} is too large for "
            f"model.native_amp_static_scale=true (fp16 overflows on every step); give a scale of at "
            f"most 2**24 = {MAX_STATIC_LOSS_SCALE}, as Megatron's --loss-scale (2**12 to 2**16 is usual)"
        )


RUN_DIRECTORIES = {
    "run.name": "a run needs a name (its results directory); set run.name=NAME",
    "run.results_dir": "give a directory, or null for ${base_results_dir}/${run.name}",
    "exp_manager.explicit_log_dir": "give a directory, or null for ${run.results_dir}/results",
}


def _check_run_directories(cfg: TrainingConfig) -> None:
    """An empty name or directory (`run.name=$NAME` with NAME unset) made the run directory the
    results directory itself, or the current directory, shared with every other run."""
    for key, what in RUN_DIRECTORIES.items():
        if not str(get(cfg, key)).strip():
            raise ConfigError(f"{key}: empty (an unset shell variable?); {what}")


# numpy's RandomState, which draws the data shuffles (as in Megatron), takes seeds in [0, 2**32);
# gptrain.data.gpt_dataset.MAX_SEED, repeated so loading a config does not import numpy.
MAX_SEED = 2**32 - 1


def _check_model(cfg: TrainingConfig) -> None:
    model = cfg.model
    if not 0 <= model.seed <= MAX_SEED:  # the message of gptrain.data.gpt_dataset.seed_problem
        raise ConfigError(
            f"model.seed: {model.seed} is outside 0 to {MAX_SEED} (2**32 - 1, the range of numpy's "
            "RandomState that shuffles the data, as in Megatron); choose a seed in that range"
        )
    if model.hidden_size % model.num_attention_heads and model.kv_channels is None:
        raise ConfigError(
            f"model.hidden_size ({model.hidden_size}) must be divisible by model.num_attention_heads "
            f"({model.num_attention_heads}), or set model.kv_channels"
        )
    groups = model.num_query_groups
    if groups is not None and (groups < 1 or model.num_attention_heads % groups):
        raise ConfigError(
            f"model.num_query_groups ({groups}) must divide model.num_attention_heads ({model.num_attention_heads})"
        )
    if model.data.seq_length != model.encoder_seq_length:
        raise ConfigError(
            f"model.data.seq_length ({model.data.seq_length}) differs from model.encoder_seq_length "
            f"({model.encoder_seq_length}); set both to the same value"
        )
    uses_table = model.position_embedding_type == "learned_absolute"
    rows = model.max_position_embeddings
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ConfigError(
            f"model.max_position_embeddings: must be a whole number of at least 1 or null, got {rows}"
        )
    if uses_table and rows is not None and rows < model.encoder_seq_length:
        raise ConfigError(
            f"model.max_position_embeddings ({rows}) is smaller than "
            f"model.encoder_seq_length ({model.encoder_seq_length})"
        )
    for key in ("model.hidden_dropout", "model.attention_dropout"):
        if not 0.0 <= get(cfg, key) < 1.0:
            raise ConfigError(f"{key}: must be in [0, 1), got {get(cfg, key)}")


def _check_batches(cfg: TrainingConfig) -> None:
    model = cfg.model
    if model.global_batch_size % model.micro_batch_size:
        raise ConfigError(
            f"model.global_batch_size ({model.global_batch_size}) must be divisible by "
            f"model.micro_batch_size ({model.micro_batch_size})"
        )
    if cfg.trainer.max_time is not None:
        check_max_time(cfg.trainer.max_time, "trainer.max_time")
    optim = model.optim
    if len(optim.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in optim.betas) or not optim.eps > 0:
        raise ConfigError(
            f"model.optim.betas ({list(optim.betas)}) must be two values in [0, 1) and "
            f"model.optim.eps ({optim.eps}) above 0"
        )
    if model.optim.lr <= 0 or model.optim.sched.min_lr < 0 or model.optim.sched.min_lr > model.optim.lr:
        raise ConfigError(
            f"model.optim.lr ({model.optim.lr}) must be > 0 and model.optim.sched.min_lr "
            f"({model.optim.sched.min_lr}) between 0 and lr"
        )
    if model.optim.sched.warmup_init_lr > model.optim.lr:
        raise ConfigError(
            f"model.optim.sched.warmup_init_lr ({model.optim.sched.warmup_init_lr}) is above model.optim.lr "
            f"({model.optim.lr}): the warmup rises from warmup_init_lr to lr, as Megatron asserts; give a "
            "warmup_init_lr of at most lr"
        )


def _check_scan_limit(limit: object, tokenizer_type: str | None) -> None:
    """model.data.token_scan_limit_gb: null, or a size of 0 GiB or more, read with NullTokenizer
    alone (as null_eod_id and null_pad_id are): beside another type it would be taken silently."""
    if limit is None:
        return
    if tokenizer_type != NULL_TYPE:
        raise ConfigError(
            f"model.data.token_scan_limit_gb: read only with {NULL_TYPE} (whose data's ids nothing else "
            f"checks), not {tokenizer_type or 'without a tokenizer type'}; drop it"
        )
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 <= limit < float("inf"):
        raise ConfigError(
            f"model.data.token_scan_limit_gb: {limit!r}: give the GiB of .bin files read at the start for "
            "their largest token id (0: none, null: 4)"
        )


def _check_data(cfg: TrainingConfig) -> None:
    data, tokenizer = cfg.model.data, cfg.model.tokenizer
    if data.data_impl == "mmap" and not data.data_prefix:
        raise ConfigError(
            "model.data.data_prefix: no dataset given; set it to a prefix or [weight, prefix, ...], "
            "or use model.data.data_impl=mock"
        )
    if data.data_impl == "mmap" and isinstance(data.data_prefix, Mapping):
        _check_per_split_prefix(data.data_prefix)
    elif data.data_impl == "mmap":  # checked before the job waits in the queue, not when it builds its data
        try:
            split_weights(data.splits_string)
        except ConfigError as error:
            raise ConfigError(f"model.data.splits_string: {error}") from None
    check_tiktoken_settings(tokenizer)
    _check_padded_vocab(cfg)
    _check_scan_limit(data.token_scan_limit_gb, tokenizer.type)
    has_tokenizer = (
        tokenizer.model or (tokenizer.vocab_file and tokenizer.merge_file) or tokenizer.type == NULL_TYPE
    )
    if data.data_impl == "mock" and not has_tokenizer and not data.mock_vocab_size:
        raise ConfigError(
            "model.data.mock_vocab_size: set it (e.g. 50257) or give model.tokenizer files for mock data"
        )


def _check_padded_vocab(cfg: TrainingConfig) -> None:
    """model.padded_vocab_size: a whole number, and no fewer rows than mock data's ids where no tokenizer
    is read (a tokenizer's are checked where it is built; TP's split in gptrain.parallel.layout)."""
    rows, data = cfg.model.padded_vocab_size, cfg.model.data
    if rows is None:
        return
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ConfigError(
            "model.padded_vocab_size: must be a whole number of at least 1, or null to pad the vocabulary by "
            f"model.make_vocab_size_divisible_by, got {rows}"
        )
    if not data.builds_tokenizer() and data.mock_vocab_size > rows:  # as gptrain.models.flops.vocab_rows
        raise ConfigError(
            f"model.padded_vocab_size={rows}: fewer rows than the {data.mock_vocab_size} ids of "
            f"model.data.mock_vocab_size; give {data.mock_vocab_size} or more, or null to pad them by "
            "model.make_vocab_size_divisible_by"
        )


def _check_per_split_prefix(data_prefix: Mapping) -> None:
    """NeMo's per-split form {train: ..., validation: ..., test: ...}: training needs its train entry."""
    unknown = [str(key) for key in data_prefix if key not in PER_SPLIT_KEYS]
    if unknown:
        raise ConfigError(
            f"model.data.data_prefix.{unknown[0]}: not a split; the per-split form has the keys "
            f"{', '.join(PER_SPLIT_KEYS)}"
        )
    if not data_prefix.get("train"):
        raise ConfigError(
            "model.data.data_prefix.train: no training data in the per-split data prefix; give a prefix "
            "or [weight, prefix, ...]"
        )


SPLIT_SEPARATORS = re.compile(r"[,/\s]+")
SPLIT_NUMBER = re.compile(r"[.0-9]+")
SPLITS = 3  # train, valid, test


def split_weights(text: str) -> list[float]:
    """The train/valid/test weights of a split string ("98,2,0"), three of them, not normalised.

    Like Megatron, every run of digits and dots counts as a number, so "98,2,0", "98 2 0" and
    "98/2" all parse. Without numpy, so that `gptrain launch` refuses a bad one on the login node
    (the job found it once it had waited in the queue); gptrain.data.splits normalises them."""
    stray = next((item for item in SPLIT_SEPARATORS.split(text) if re.search(r"[^0-9.]", item)), None)
    if stray:  # "nan,2,0" or "-1,2,0" would lose a sign or a word and mean other weights
        raise ConfigError(
            f"split string {text!r}: {stray!r} is not a weight; give non-negative numbers like '98,2,0'"
        )
    try:
        values = [float(match) for match in SPLIT_NUMBER.findall(text)]
    except ValueError as error:
        raise ConfigError(f"split string {text!r}: {error}; write it like '98,2,0'") from None
    if len(values) > SPLITS:
        raise ConfigError(
            f"split string {text!r} has {len(values)} numbers; give at most 3 (train,valid,test)"
        )
    values += [0.0] * (SPLITS - len(values))
    if sum(values) <= 0:
        raise ConfigError(f"split string {text!r} sums to 0; give positive weights like '98,2,0'")
    return values
