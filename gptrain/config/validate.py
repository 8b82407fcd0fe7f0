"""Normalise NeMo spellings and reject impossible values, naming the key.

Checks that need the world size (parallel layout divisibility) live in
gptrain.parallel.layout; these run on the config alone.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from gptrain.config.schema import PER_SPLIT_KEYS, ExpManagerConfig, TrainingConfig, default_min_lr
from gptrain.errors import ConfigError
from gptrain.utils.tokenizer_types import (
    MEGATRON_TYPES,
    SENTENCEPIECE_TYPES,
    hub_name_advice,
    is_tiktoken_vocabulary_file,
    megatron_tokenizer_type,
    tiktoken_settings_given,
)

PRECISIONS = {"32": "32", "32-true": "32", "16": "16", "16-mixed": "16", "bf16": "bf16", "bf16-mixed": "bf16"}
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
    ),
    "model.optim.sched.warmup_style": ("nemo", "megatron"),
    "model.data.data_impl": ("mmap", "mock"),
    "model.tokenizer.type": MEGATRON_TYPES,
    "model.tokenizer.tiktoken_pattern": (None, "v1", "v2"),
}
OPTIMIZER_ALIASES = ("adam", "adamw", "fused_adam", "distributed_fused_adam", "mcore_distributed_optim")
DISTRIBUTED_OPTIMIZERS = ("distributed_fused_adam", "mcore_distributed_optim")
"""NeMo's optimizers that shard AdamW's state over the data-parallel ranks (ZeRO-2 in effect)."""
FSDP_STRATEGIES = {"full": "full_shard", "hybrid": "hybrid_shard", "grad": "shard_grad_op"}
"""NeMo's model.fsdp_sharding_strategy values and the data_parallel_sharding each means."""
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
# refused only by the job, at its start (min_lr is checked with lr, in _check_model).
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
    "model.data.num_workers",
)
# NoamAnnealing's width: null is the model's, 0 or less a division by zero (d_model ** -0.5).
ABOVE_ZERO_OR_NULL = ("model.optim.sched.d_model",)


def get(cfg: TrainingConfig, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


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
    _tokenizer_type(cfg.model.tokenizer)
    _one_resume_source(cfg)
    if cfg.exp_manager.tensorboard_dir:  # hparams.yaml, a requeued job and `gptrain plot` read it elsewhere
        cfg.exp_manager.tensorboard_dir = os.path.abspath(os.path.expanduser(cfg.exp_manager.tensorboard_dir))
    params = cfg.exp_manager.checkpoint_callback_params
    params.dirpath = params.dirpath or (os.path.dirname(params.filepath) if params.filepath else None)
    if params.dirpath:  # as Lightning's ModelCheckpoint resolves it; hparams.yaml records it for the tools
        params.dirpath = os.path.abspath(os.path.expanduser(params.dirpath))
        _dirpath_apart_from_log_dir(params.dirpath, cfg.exp_manager.explicit_log_dir)
    _max_time_per_run(cfg)
    notes = _save_interval(cfg) + _use_fast_notes(cfg.model.tokenizer)
    return notes + _sequence_parallel_needs_tp(cfg.model) + _block_recompute_past_the_chunk(cfg.model)


def _dirpath_apart_from_log_dir(dirpath: str, log_dir: str) -> None:
    """Checkpoints in the log dir itself, or in a directory above it, mix with the run's files: moving
    an earlier run aside would move the live run's lock too. Inside the log dir is its own directory.
    Compared resolved (as Lightning resolves dirpath): a symlink to the log dir is the log dir."""
    log_dir = os.path.abspath(log_dir)
    real_dirpath, real_log_dir = os.path.realpath(dirpath), os.path.realpath(log_dir)
    if os.path.commonpath([real_dirpath, real_log_dir]) == real_dirpath:
        what = (
            "explicit_log_dir" if real_dirpath == real_log_dir else f"explicit_log_dir {log_dir} or above it"
        )
        through = f" (resolved: {real_dirpath})" if real_dirpath != dirpath else ""
        raise ConfigError(
            f"exp_manager.checkpoint_callback_params.dirpath={dirpath} is the run's {what}{through}; give "
            f"the checkpoints a directory of their own (such as {os.path.join(log_dir, 'checkpoints')}, "
            "or null for that)"
        )


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


TOKENIZER_LIBRARIES = ("megatron", "huggingface", "sentencepiece", "tiktoken")
"""NeMo's model.tokenizer.library values gptrain reads (get_nmt_tokenizer's, less byte-level, regex, tabular)."""


def _tokenizer_type(tokenizer: Any) -> None:
    """The type's canonical spelling (any spelling data prepare takes). NeMo's `library: sentencepiece` reads `model` as a SentencePiece
    model and no type (a preset's GPT2BPETokenizer stays beside it): its ids alone, its eos ending
    documents, which is GPTSentencePieceTokenizer (one of Megatron's SentencePiece types is kept).
    `huggingface` with a type no Megatron type names is AutoTokenizer(type): the Hugging Face tokenizer
    at that path (as data prepare reads it; model is never read), and a Megatron type other than
    HuggingFaceTokenizer (a preset's GPT2BPETokenizer) or none is refused; `tiktoken` is TikTokenizer
    over vocab_file whatever type and model say (model only where vocab_file is null)."""
    library, named = str(tokenizer.library).lower(), megatron_tokenizer_type(tokenizer.type)
    if library not in TOKENIZER_LIBRARIES:
        raise ConfigError(
            f"model.tokenizer.library: '{tokenizer.library}' is not one of {', '.join(TOKENIZER_LIBRARIES)}"
            " (NeMo's byte-level, regex and tabular tokenizers are not implemented)"
        )
    kind = named or tokenizer.type
    if library == "megatron" and named is None and kind is not None:
        _refuse_hub_name(str(kind))
    if library == "sentencepiece" and kind not in SENTENCEPIECE_TYPES:
        kind = "GPTSentencePieceTokenizer"
    if library == "huggingface" and named is None:  # AutoTokenizer(type): NeMo never reads model here
        kind, tokenizer.model = "HuggingFaceTokenizer", _huggingface_type(tokenizer)
    elif (
        library == "huggingface" and named != "HuggingFaceTokenizer" and str(tokenizer.type).lower() != "gpt2"
    ):
        _huggingface_type(tokenizer)  # a Megatron type (a preset's GPT2BPETokenizer): no tokenizer's name
    if library == "tiktoken":  # NeMo's TiktokenTokenizer(vocab_file), whatever type and model say
        kind, tokenizer.model = "TikTokenizer", tokenizer.vocab_file or tokenizer.model
    if kind is None:
        raise ConfigError(
            f"model.tokenizer.type: null (model.tokenizer.library={tokenizer.library}); name the type, "
            "e.g. GPT2BPETokenizer (null is for library sentencepiece, as NeMo writes it)"
        )
    tokenizer.type = kind


def _use_fast_notes(tokenizer: Any) -> list[str]:
    """`use_fast: false` (NeMo hands it to transformers' AutoTokenizer) where the slow tokenizer gives
    the fast one's ids, or is not read; HuggingFaceTokenizer's is checked against the tokenizer's
    class when it is built (gptrain.train.builders), which needs its files."""
    if tokenizer.use_fast is None or tokenizer.use_fast or tokenizer.type == "HuggingFaceTokenizer":
        return []
    if tokenizer.type == "GPT2BPETokenizer":
        return [
            "model.tokenizer.use_fast: false: transformers' slow GPT2Tokenizer gives the same ids as the fast "
            "one gptrain encodes with (the same byte-level BPE, split and <|endoftext|>)"
        ]
    return [
        f"model.tokenizer.use_fast: false: {tokenizer.type} does not read it (Hugging Face tokenizers only)"
    ]


def _refuse_hub_name(kind: str) -> None:
    """NeMo's library megatron hands a type it does not know to AutoTokenizer, which downloads it
    (`gpt2-medium`); gptrain says it does not, rather than only listing its types."""
    advice = hub_name_advice(kind, "pass model.tokenizer.library=huggingface model.tokenizer.type=DIR")
    if advice is not None:
        raise ConfigError(
            f"model.tokenizer.type: '{kind}' is not one of {', '.join(MEGATRON_TYPES)}; {advice}"
        )


def _huggingface_type(tokenizer: Any) -> str:
    """library huggingface's tokenizer: `type`, the path or hub name NeMo gives AutoTokenizer (HF's
    `gpt2`, or Megatron's HuggingFaceTokenizer over `model`, are taken before this)."""
    if tokenizer.type and megatron_tokenizer_type(tokenizer.type) is None:
        return str(tokenizer.type)
    raise ConfigError(
        f"model.tokenizer.type: {tokenizer.type} with model.tokenizer.library=huggingface, which reads type "
        "as the Hugging Face tokenizer's path or hub name (NeMo's AutoTokenizer(type), never model); "
        "give that path or name, or library megatron for a Megatron type"
    )


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


def _save_interval(cfg: TrainingConfig) -> list[str]:
    """`every_n_train_steps: null` is PyTorch Lightning's save at each validation (NeMo's default, with
    every_n_epochs 1): every trainer.val_check_interval steps, so that each save records its val_loss.
    Without validation (limit_val_batches=0) Lightning saves none before the end; gptrain still saves
    on that interval, which a requeued run resumes from. 0 is Lightning's "no saves by step": null, its
    every_n_epochs then 0 where not given. Returns the note of _last_only."""
    params, key = cfg.exp_manager.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    _save_last_link(params, key)
    if cfg.exp_manager.create_checkpoint_callback and (params.every_n_epochs or 0) < 0:  # as Lightning
        raise ConfigError(
            f"{key}.every_n_epochs={params.every_n_epochs}: must be >= 0 (PyTorch Lightning refuses it); "
            "give 0 for no saves by epoch, 1 or null for a save at each validation"
        )
    if cfg.exp_manager.create_checkpoint_callback:
        _one_save_trigger(params, key)
    if params.every_n_train_steps == 0:
        given = f"{key}.every_n_train_steps=0" + (
            f" with every_n_epochs={params.every_n_epochs}" if params.every_n_epochs is not None else ""
        )
        params.every_n_epochs = 0 if params.every_n_epochs is None else params.every_n_epochs
    elif params.every_n_train_steps is None:
        given = f"{key}.every_n_epochs={params.every_n_epochs} with every_n_train_steps=null"
    else:
        return []
    params.every_n_train_steps = cfg.trainer.val_check_interval
    return _last_only(cfg.exp_manager, given)


def _one_save_trigger(params: Any, key: str) -> None:
    """Lightning's ModelCheckpoint takes one trigger: every_n_train_steps and every_n_epochs both
    above 0 raise its MisconfigurationException (train_time_interval, the third, is refused as not
    implemented). Here every_n_epochs was dropped without a word."""
    steps, epochs = params.every_n_train_steps or 0, params.every_n_epochs or 0
    if steps >= 1 and epochs >= 1:
        raise ConfigError(
            f"{key}.every_n_train_steps={steps} and every_n_epochs={epochs}: PyTorch Lightning refuses both "
            "(they are mutually exclusive); keep every_n_train_steps for a save every N steps and set "
            "every_n_epochs=null, or set every_n_train_steps=null for a save at each validation"
        )


def _save_last_link(params: Any, key: str) -> None:
    """Lightning's save_last `link` (last.ckpt a link to the newest checkpoint) saves the last one too."""
    if isinstance(params.save_last, str):
        if params.save_last.lower() != "link":
            raise ConfigError(f"{key}.save_last: '{params.save_last}' is not true, false or link")
        params.save_last = True


def _last_only(em: ExpManagerConfig, given: str) -> list[str]:
    """every_n_epochs other than null or 1 beside a null every_n_train_steps: Lightning saves no top-k
    checkpoint at a validation (a NeMo run's single epoch never reaches a second), only its `last`
    one, overwritten at each validation (the save still made): the newest alone is kept. Without
    save_last Lightning saves nothing, which a requeued run could not resume: refused."""
    params, key = em.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    if params.every_n_epochs in (None, 1) or not em.create_checkpoint_callback:
        return []
    if not params.save_last:
        raise ConfigError(
            f"{given} and save_last=false: PyTorch Lightning saves no checkpoint at all (no top-k at "
            "validation, no last one); for none set exp_manager.create_checkpoint_callback=false, else "
            f"set {key}.every_n_train_steps=N or save_last=true"
        )
    kept, params.save_top_k = params.save_top_k, 0
    return [
        f"{given}: as PyTorch Lightning, only the last checkpoint, saved at each validation (every "
        f"{params.every_n_train_steps} steps) and at the end; the newest alone is kept (not save_top_k={kept})"
    ]


MONITORED = ("val_loss", "step")
"""The metrics retention can rank by: val_loss, which a save at a validated step records in its
COMPLETE marker, and step (the iteration the marker records), which Lightning offers every save."""


def check_monitor(monitor: object) -> None:
    """Lightning fails a save whose monitored metric was never logged; here a name no save records
    would rank no checkpoint, silently keeping the newest: refused at load instead."""
    if monitor is not None and monitor not in MONITORED:
        raise ConfigError(
            f"exp_manager.checkpoint_callback_params.monitor: '{monitor}' is not recorded with a checkpoint; "
            "use val_loss to keep the best by validation loss, step (with mode=max) or null to keep the newest"
        )


def check_retention(em: ExpManagerConfig) -> None:
    """save_top_k as PyTorch Lightning's ModelCheckpoint takes it: -1 keeps every checkpoint (as
    Megatron does), 0 no best ones, only `last` (save_last, which NeMo's launcher sets): here the
    newest alone, which a requeue resumes from. 0 with save_last=false saves nothing in Lightning;
    a run that keeps no checkpoint cannot be requeued, so it is refused, naming both ways out."""
    key = "exp_manager.checkpoint_callback_params"
    params = em.checkpoint_callback_params
    if params.save_top_k < -1:
        raise ConfigError(
            f"{key}.save_top_k: must be 0 or more (0 keeps only the newest), or -1 to keep every "
            f"checkpoint, got {params.save_top_k}"
        )
    if params.save_top_k == 0 and not params.save_last and em.create_checkpoint_callback:
        raise ConfigError(
            f"{key}.save_top_k: 0 with save_last=false keeps no checkpoint (PyTorch Lightning saves none), "
            f"so a stopped run could not resume; set {key}.save_last=true to keep only the newest, or "
            "exp_manager.create_checkpoint_callback=false to save none"
        )


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
    exit_interval = cfg.trainer.exit_interval
    if exit_interval is not None and (isinstance(exit_interval, bool) or exit_interval < 1):
        raise ConfigError(
            f"trainer.exit_interval: must be at least 1, or null for no exit interval, got {exit_interval}"
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


def _check_max_time(value: Any, key: str) -> None:
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
        _check_max_time(per_run, "exp_manager.max_time_per_run")
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


def _check_batches(cfg: TrainingConfig) -> None:
    model = cfg.model
    if model.global_batch_size % model.micro_batch_size:
        raise ConfigError(
            f"model.global_batch_size ({model.global_batch_size}) must be divisible by "
            f"model.micro_batch_size ({model.micro_batch_size})"
        )
    if cfg.trainer.max_time is not None:
        _check_max_time(cfg.trainer.max_time, "trainer.max_time")
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
    _check_tiktoken_settings(tokenizer)
    _check_padded_vocab(cfg)
    has_tokenizer = tokenizer.model or (tokenizer.vocab_file and tokenizer.merge_file)
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


def _check_tiktoken_settings(tokenizer: Any) -> None:
    """The TikTokenizer settings' types, checked on the login node (their relations, which Megatron
    asserts, where the vocabulary file is read: gptrain.data.tiktoken_file)."""
    size, count, specials = (
        tokenizer.vocab_size,
        tokenizer.tiktoken_num_special_tokens,
        tokenizer.special_tokens,
    )
    if size is not None and (isinstance(size, bool) or size < 1):
        raise ConfigError(f"model.tokenizer.vocab_size: must be at least 1, or null for 131072, got {size}")
    if isinstance(count, bool) or count < 0:
        raise ConfigError(f"model.tokenizer.tiktoken_num_special_tokens: must be 0 or more, got {count}")
    if specials is not None and not all(isinstance(token, str) and token for token in specials):
        raise ConfigError(
            f"model.tokenizer.special_tokens: expected a list of token names such as [<unk>, <s>, </s>, ...], "
            f"got {specials}"
        )
    _refuse_unread_tiktoken_settings(tokenizer)


def _refuse_unread_tiktoken_settings(tokenizer: Any) -> None:
    """vocab_size, tiktoken_pattern, tiktoken_num_special_tokens and special_tokens are read only
    with Megatron's tiktoken vocabulary file (Megatron reads its flags only for TikTokenizer); beside
    another tokenizer they were taken silently, beside an encoding name refused only as the job
    started: refused here, on the login node, naming the key."""
    if tokenizer.type == "TikTokenizer":
        if not tokenizer.model or is_tiktoken_vocabulary_file(str(tokenizer.model)):
            return
        reader = f"the tiktoken encoding {tokenizer.model!r}, which has its own split, vocabulary and special tokens"
    else:
        reader = f"{tokenizer.type}, which has its own split and vocabulary"
    given = tiktoken_settings_given(
        tokenizer.tiktoken_pattern,
        tokenizer.vocab_size,
        tokenizer.tiktoken_num_special_tokens,
        tokenizer.special_tokens,
    )
    if given:
        raise ConfigError(
            f"{', '.join(given)}: read only by TikTokenizer with Megatron's tiktoken vocabulary file, not by "
            f"{reader}; drop it"
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
