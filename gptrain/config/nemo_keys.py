"""NeMo-Megatron keys that gptrain accepts but does not implement, each with the reason.

They come from the NeMo launcher's GPT-3 training configs (releases 23.07 to 24.12) and from NeMo's
own examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (NeMo 1.13 to 2.4), so that a
user's existing files and overrides load unchanged; each one given is reported once, grouped
by reason, so the user knows what has no effect and why.
"""

from __future__ import annotations

from gptrain.config.yamlio import as_switch

_FUSION = "fused kernels and Transformer Engine switches (gptrain uses PyTorch SDPA and fused AdamW)"
_OVERLAP = "communication tuning and overlap (torch.distributed buckets and overlaps on its own)"
_FP8 = "Transformer Engine's FP8 recipe settings (model.fp8 runs torchao's float8 with dynamic scaling: model.fp8_recipe=tensorwise or rowwise)"
_LIGHTNING = "PyTorch Lightning trainer switches (gptrain has its own loop)"
_CKPT = (
    ".nemo checkpoint handling (gptrain writes DCP checkpoints to checkpoint_callback_params.dirpath, "
    "by default explicit_log_dir/checkpoints)"
)
_CKPT_NAMES = (
    "PyTorch Lightning's checkpoint file names and messages (gptrain names each checkpoint "
    "checkpoints/step_<N> and logs each save)"
)
_LOGGERS = "loggers and profilers other than TensorBoard and Weights & Biases"
_WANDB_MODEL = (
    "uploading checkpoints to W&B (gptrain keeps them in checkpoint_callback_params.dirpath, "
    "by default explicit_log_dir/checkpoints)"
)
_DATA = "NeMo dataloader options (gptrain's dataset and sampler are Megatron's; these do not apply)"
_NOT_IMPL = "not implemented in gptrain"
_VALIDATION_DROP_LAST = (
    "NeMo's validation_drop_last, whose default true gptrain follows (the validation split's last partial "
    "sample and last partial global batch dropped)"
)
_MLPERF = "MLPerf-only keys (the MLPerf configs are not supported)"
_NAME = "NeMo's experiment name (gptrain names a run by run.name)"
_MODEL_TYPE = "bignlp-scripts 22.x's model family of the file (gptrain's model is GPT)"
_VERSION = (
    "NeMo's versioned log subdirectories, which NeMo too leaves out when explicit_log_dir is set "
    "(gptrain's run directory is always explicit_log_dir)"
)
_PREEMPTION = (
    "NeMo's preemption callback (gptrain always saves on SIGTERM and SIGUSR1 and exits 75 to be requeued)"
)
_RESILIENCY = (
    "NeMo's straggler detection and fault-tolerance callbacks (gptrain's hang watchdog, "
    "trainer.hang_timeout_minutes, ends a stuck job with exit 76, which the batch script requeues)"
)
_EMA = "NeMo's exponential moving average of the weights (gptrain trains, validates and saves the weights)"
_RESUME_CHECKS = (
    "NeMo's resume checks (gptrain resumes the newest complete checkpoint, starts afresh without one, "
    "and validates on resume only where a stop left a validation undone)"
)
_FILES = "NeMo's copies of files into the log directory (gptrain records the composed config in hparams.yaml)"
_FAST_TOKENIZER = (
    "Hugging Face AutoTokenizer's remote code (gptrain reads tokenizer.json with the tokenizers library, "
    "and no code of the tokenizer's repository)"
)
_EARLY_STOP = "NeMo's early stopping on a monitored metric (gptrain trains to trainer.max_steps or max_time)"

_REASONS: dict[str, tuple[str, ...]] = {
    _FUSION: (
        "model.apex_transformer_log_level",
        "model.apply_query_key_layer_scaling",
        "model.apply_rope_fusion",
        "model.bias_dropout_add_fusion",
        "model.enable_cuda_graph",
        "model.fp16_lm_cross_entropy",
        "model.get_attention_mask_from_fusion",
        "model.grad_div_ar_fusion",
        "model.gradient_accumulation_fusion",
        "model.masked_softmax_fusion",
        "model.mcore_gpt",
        "model.megatron_amp_O2",
        "model.onnx_safe",
        "model.persist_layer_norm",
        "model.transformer_block_type",
        "model.transformer_engine",
        "model.use_emha",
        "model.use_flash_attention",
        "model.use_te_rng_tracker",
    ),
    _OVERLAP: (
        "model.batch_p2p_comm",
        "model.defer_embedding_wgrad_compute",
        "model.fsdp_grad_reduce_dtype",
        "model.grad_allreduce_chunk_size_mb",
        "model.gradient_as_bucket_view",
        "model.nccl_communicator_config_path",
        "model.optim.bucket_cap_mb",
        "model.optim.contiguous_grad_buffer",
        "model.optim.contiguous_param_buffer",
        "model.optim.grad_sync_dtype",
        "model.optim.lock_timeout",
        "model.optim.nccl_ub",
        "model.optim.overlap_grad_sync",
        "model.optim.overlap_param_sync",
        "model.overlap_p2p_comm",
        "model.sharp",
        "model.sync_batch_comm",
        "model.tp_comm_atomic_ag",
        "model.tp_comm_atomic_rs",
        "model.tp_comm_overlap_ag",
        "model.tp_comm_overlap_rs",
        "model.tp_comm_split_ag",
        "model.tp_comm_split_rs",
        "model.ub_tp_comm_overlap",
        "model.use_tp_pp_dp_mapping",
        "model.validation_param_sync_overlap",
    ),
    _FP8: (
        "model.fp8_amax_compute_algo",
        "model.fp8_amax_history_len",
        "model.fp8_e4m3",
        "model.fp8_hybrid",
        "model.fp8_interval",
        "model.fp8_margin",
        "model.fp8_params",
        "model.fp8_wgrad",
        "model.reduce_amax",
    ),
    _LIGHTNING: (
        "trainer.accumulate_grad_batches",
        "trainer.amp_backend",  # bignlp-scripts 22.x (Lightning 1.x): native is torch's autocast, as gptrain's
        "trainer.benchmark",
        "trainer.enable_checkpointing",
        "trainer.enable_model_summary",
        "trainer.enable_progress_bar",
        "trainer.limit_train_batches",
        "trainer.logger",
        "trainer.max_epochs",
        "trainer.num_sanity_val_steps",
        "trainer.plugins",
        "trainer.replace_sampler_ddp",
        "trainer.strategy",
        "trainer.use_distributed_sampler",
    ),
    _CKPT: (
        "exp_manager.checkpoint_callback_params.always_save_nemo",
        "exp_manager.checkpoint_callback_params.model_parallel_size",
        "exp_manager.checkpoint_callback_params.save_best_model",  # the best weights into the .nemo
        "exp_manager.checkpoint_callback_params.save_last_n_optim_states",
        "exp_manager.checkpoint_callback_params.save_nemo_on_train_end",
        "exp_manager.checkpoint_callback_params.save_on_train_epoch_end",
        "exp_manager.checkpoint_callback_params.save_weights_only",
        "exp_manager.checkpoint_callback_params.train_time_interval",
        "exp_manager.exp_dir",
        "exp_manager.name",
        "exp_manager.seconds_to_sleep",
        "model.dist_ckpt_assume_constant_structure",
        "model.dist_ckpt_format",
        "model.dist_ckpt_load_on_device",
        "model.dist_ckpt_load_strictness",
        "model.dist_ckpt_parallel_dist_opt",
        "model.dist_ckpt_parallel_load",
        "model.dist_ckpt_parallel_save",
        "model.dist_ckpt_parallel_save_within_dp",
        "model.dist_ckpt_torch_dist_multiproc",
        "model.fsdp_sharded_checkpoint",
        "model.restore_from_path",
    ),
    _CKPT_NAMES: (
        "exp_manager.checkpoint_callback_params.auto_insert_metric_name",
        "exp_manager.checkpoint_callback_params.filename",
        "exp_manager.checkpoint_callback_params.postfix",
        "exp_manager.checkpoint_callback_params.prefix",
        "exp_manager.checkpoint_callback_params.verbose",
    ),
    _LOGGERS: (
        "exp_manager.create_clearml_logger",
        "exp_manager.create_dllogger_logger",
        "exp_manager.create_mlflow_logger",
        "exp_manager.create_neptune_logger",
        "exp_manager.log_delta_step_timing",
        "exp_manager.log_global_rank_0_only",
        "exp_manager.log_local_rank_0_only",
        "exp_manager.log_step_timing",
        "exp_manager.log_tflops_per_sec_per_gpu",  # gptrain's line has Megatron's TFLOP/s/GPU
        "model.enable_megatron_timers",
    ),
    _WANDB_MODEL: ("exp_manager.wandb_logger_kwargs.log_model",),
    _DATA: (
        "model.data.dataloader_type",
        "model.data.delay_data_init",
        "model.data.delay_data_mmap",
        "model.data.exchange_indices_distributed",
        "model.data.legacy_dataset",
        "model.data.mmap_bin_files",
        "model.data.num_dataset_builder_threads",
        "model.data.pad_samples_to_global_batch_size",
        "model.data.skip_warmup",
    ),
    _VALIDATION_DROP_LAST: ("model.data.validation_drop_last",),
    _NOT_IMPL: (
        "model.data.data_cache_generation_only",
        "model.data.no_seqlen_plus_one_input_tokens",
        "model.data.reset_attention_mask",
        "model.data.reset_position_ids",
        "model.data.shuffle_documents",
        "model.activations_checkpoint_layers_per_pipeline",
        "model.attention_type",
        "model.context_parallel_size",
        "model.cpu_offloading",
        "model.cpu_offloading_activations",
        "model.cpu_offloading_num_layers",
        "model.cpu_offloading_weights",
        "model.do_layer_norm_weight_decay",
        "model.drop_layers",
        "model.expert_model_parallel_size",
        "model.ffn_dropout",
        "model.fp32_residual_connection",
        "model.gc_interval",
        "model.headscale",
        "model.layernorm_zero_centered_gamma",
        "model.name",
        "model.normalize_attention_scores",
        "model.num_micro_batches_with_partial_activation_checkpoints",
        "model.optim.sched.last_epoch",
        "model.post_process",
        "model.pre_process",
        "model.reset_lr",
        "model.reset_lr_steps",  # NeMo reads it only under reset_lr, which is refused
        "model.scale_positional_embedding",
        "model.seq_len_interpolation_factor",
        "model.skip_train",
        "model.tokenizer.delimiter",
        "model.tokenizer.sentencepiece_legacy",
        "model.use_cpu_initialization",
    ),
    _MLPERF: ("restore_from_path", "model.optim.sched.max_steps_for_lr_sched"),
    _NAME: ("name",),
    _MODEL_TYPE: ("model.model_type",),
    _VERSION: ("exp_manager.use_datetime_version", "exp_manager.version"),
    _EARLY_STOP: ("exp_manager.create_early_stopping_callback",),
    _PREEMPTION: ("exp_manager.create_preemption_callback",),
    _RESILIENCY: (
        "exp_manager.create_fault_tolerance_callback",
        "exp_manager.create_straggler_detection_callback",
    ),
    _RESUME_CHECKS: (
        "exp_manager.disable_validation_on_resume",
        "exp_manager.resume_ignore_no_checkpoint",
        "exp_manager.resume_past_end",
    ),
    _FILES: ("exp_manager.files_to_copy",),
    _FAST_TOKENIZER: ("model.tokenizer.trust_remote_code",),
}

# Whole sub-trees that gptrain ignores; the sub-tree's own name is ignored too.
_PREFIX_REASONS: dict[str, str] = {
    "exp_manager.neptune_logger_kwargs.": _LOGGERS,
    "exp_manager.clearml_logger_kwargs.": _LOGGERS,
    "exp_manager.dllogger_logger_kwargs.": _LOGGERS,
    "exp_manager.mlflow_logger_kwargs.": _LOGGERS,
    "exp_manager.summary_writer_kwargs.": _LOGGERS,  # TensorBoard writer options; gptrain writes its own
    "exp_manager.straggler_detection_params.": _RESILIENCY,
    "exp_manager.fault_tolerance.": _RESILIENCY,
    "exp_manager.ema.": _EMA,  # read only with ema.enable, refused but as false
    "exp_manager.step_timing_kwargs.": _LOGGERS,
    "exp_manager.early_stopping_callback_params.": _EARLY_STOP,  # read only under the refused switch
    "model.megatron_timer_kwargs.": _LOGGERS,
    "model.nsys_profile.": _LOGGERS,
    "model.ub_tp_comm_overlap_cfg.": _OVERLAP,
    "s3_checkpointing.": _CKPT,  # MLPerf's configs and NeMo's megatron_gpt_config.yaml
    "env_vars.": "environment of the job: set env_vars in the launcher's config.yaml",
}

# Ignored keys that change what is trained unless they hold NeMo's default: accepted with these
# values (the launcher's configs carry them so), refused with any other, naming what it would change.
NO_OP_VALUES: dict[str, tuple[tuple[object, ...], str]] = {
    "model.data.reset_position_ids": ((False,), "position ids restarting after each end-of-document"),
    "model.data.reset_attention_mask": ((False,), "attention cut at end-of-document tokens"),
    "model.data.no_seqlen_plus_one_input_tokens": (
        (False,),
        "samples of seq_length tokens, not seq_length+1",
    ),
    "model.data.shuffle_documents": ((True,), "documents read in order, not shuffled"),
    "model.data.dataloader_type": (("single",), "a loader other than Megatron's single"),
    "model.data.validation_drop_last": (
        (True,),
        "the validation split's last partial sample kept, padded (Megatron-core's drop_last_partial_validation_"
        "sequence=False: one sample more, so another shuffle and other validation samples throughout) and its "
        "last partial global batch validated (NeMo's megatron_gpt_model.py also turns the validation "
        "dataloader's drop_last off and weights the validation loss by tokens, as gptrain's always is)",
    ),
    "model.context_parallel_size": ((1,), "context parallelism"),
    "model.expert_model_parallel_size": ((1,), "mixture of experts"),
    "model.fp32_residual_connection": ((False,), "a switch of the residual stream's precision"),
    "model.headscale": ((False,), "NormFormer head scaling"),
    "model.normalize_attention_scores": ((True,), "attention scores not scaled by 1/sqrt(head size)"),
    "model.seq_len_interpolation_factor": ((None, 1), "rope position interpolation"),
    "model.ffn_dropout": ((0,), "dropout inside the MLP"),
    "model.transformer_block_type": (("pre_ln",), "a block other than pre-norm"),
    "model.attention_type": (("multihead",), "an attention other than multi-head self-attention"),
    "model.do_layer_norm_weight_decay": ((False,), "weight decay on the norms' weights"),
    "model.scale_positional_embedding": ((False,), "rope frequency scaling"),
    "model.drop_layers": (([], None), "layers left out of the model"),
    "model.skip_train": ((False,), "validation without training"),
    "model.data.data_cache_generation_only": ((False,), "building the data caches, then stopping"),
    "model.restore_from_path": ((None,), "starting from the weights of a .nemo file"),
    "model.reset_lr": ((False,), "the LR schedule restarted at the resumed checkpoint's step"),
    "model.optim.sched.last_epoch": ((-1,), "a schedule started at another step than the run's"),
    "trainer.accumulate_grad_batches": ((1,), "Lightning's gradient accumulation over global batches"),
    "exp_manager.create_early_stopping_callback": ((False,), "stopping when val_loss stops improving"),
    "model.tokenizer.trust_remote_code": (
        (False, None),
        "a tokenizer's own Python code from its repository (AutoTokenizer's trust_remote_code)",
    ),
    "exp_manager.ema.enable": (
        (False, None),
        "an exponential moving average of the weights, validated and saved",
    ),
    "exp_manager.checkpoint_callback_params.train_time_interval": (
        (None,),
        "a checkpoint every interval of wall-clock time",
    ),
    "exp_manager.checkpoint_callback_params.save_weights_only": (
        (False, None),
        "checkpoints of the weights alone (no optimizer state or iteration: PyTorch Lightning cannot resume from them either)",
    ),
    "exp_manager.checkpoint_callback_params.save_on_train_epoch_end": (
        (False, None),
        "checkpoints at the end of each epoch of the training data instead of at each validation",
    ),
}

# What to do instead, added to the refusal of a value in NO_OP_VALUES where gptrain has a way.
INSTEAD: dict[str, str] = {
    "model.tokenizer.trust_remote_code": "give model.tokenizer.model a tokenizer.json that the tokenizers library reads",
    "model.skip_train": "to validate a run's checkpoint use `gptrain eval RUN`",
    "model.data.data_cache_generation_only": "gptrain builds the caches at the start of training",
    "model.restore_from_path": (
        "to take only the weights of a gptrain checkpoint: exp_manager.resume_from_checkpoint=<it> "
        "exp_manager.finetune=true"
    ),
    "model.reset_lr": (
        "to restart the schedule from another run's checkpoint: exp_manager.resume_from_checkpoint=<it> "
        "exp_manager.load_optimizer=false (a fresh AdamW state too; the iteration goes on), and "
        "model.optim.sched.max_steps=<steps left> for reset_lr_steps"
    ),
    "model.optim.sched.last_epoch": "a resumed run takes the schedule's step from its checkpoint",
    "exp_manager.create_early_stopping_callback": (
        "gptrain trains to trainer.max_steps, or until trainer.max_time"
    ),
    "exp_manager.checkpoint_callback_params.train_time_interval": (
        "gptrain saves every checkpoint_callback_params.every_n_train_steps steps, and at trainer.max_time or "
        "a stop signal (SIGTERM, SIGUSR1) before the job's time runs out: set every_n_train_steps"
    ),
    "exp_manager.checkpoint_callback_params.save_weights_only": (
        "a checkpoint holds the whole training state so that a stopped or requeued run resumes; for the"
        " weights alone, export the trained run: `gptrain export RUN --to hf OUT`"
    ),
    "exp_manager.checkpoint_callback_params.save_on_train_epoch_end": (
        "gptrain saves every checkpoint_callback_params.every_n_train_steps steps (null: at each validation);"
        " beside a given every_n_train_steps it is taken, as Lightning then saves on those steps whatever it holds"
    ),
    "trainer.accumulate_grad_batches": (
        "NeMo refuses it too: a step already accumulates model.global_batch_size / (model.micro_batch_size"
        " x data-parallel size) micro-batches, so raise model.global_batch_size to accumulate more"
    ),
}


# Why a value of NO_OP_VALUES is refused, where "not implemented" is not the reason.
NOT_A_SWITCH: dict[str, str] = {
    "model.fp32_residual_connection": (
        "is no switch in gptrain: its residual stream is fp32 under model.data_parallel_sharding=ddp and with "
        "trainer.precision 32 or 16 (autocast over fp32 weights), and bf16 under FSDP (shard_grad_op, "
        "full_shard, hybrid_shard) with trainer.precision=bf16 (the weights gathered in bf16)"
    ),
}


def refused_value(dotted: str, value: object, siblings: dict | None = None) -> str | None:
    """Why an ignored key's `value` cannot be ignored (it would change the model or the data), or None.
    `siblings`: the keys of its section as given, for a value that is harmless beside one of them."""
    if dotted not in NO_OP_VALUES or _harmless_beside(dotted, siblings or {}):
        return None
    allowed, change = NO_OP_VALUES[dotted]
    if any(_same(value, ok) for ok in allowed):
        return None
    default = allowed[0]
    instead = f"; {INSTEAD[dotted]}" if dotted in INSTEAD else ""
    if dotted in NOT_A_SWITCH:
        return f"'{dotted}: {value!r}' {NOT_A_SWITCH[dotted]}; set it to {default!r} (NeMo's default) or leave it out"
    return (
        f"'{dotted}: {value!r}' asks for {change}, which gptrain does not implement; "
        f"set it to {default!r} (NeMo's default) or leave it out{instead}"
    )


def _harmless_beside(dotted: str, siblings: dict) -> bool:
    """save_on_train_epoch_end only moves Lightning's saves at validation to the epoch's end; with
    every_n_train_steps set Lightning saves on those steps and none at validation, whatever it holds."""
    return (
        dotted == "exp_manager.checkpoint_callback_params.save_on_train_epoch_end"
        and siblings.get("every_n_train_steps") is not None
    )


def _same(value: object, ok: object) -> bool:
    """Equal as NeMo reads it: a switch as OmegaConf reads one (0/1, `no`/`yes`), 1 is 1.0."""
    if isinstance(ok, bool):
        return as_switch(value) is ok
    if isinstance(value, bool):
        return False
    return value == ok


IGNORED_NEMO_KEYS: dict[str, str] = {key: reason for reason, keys in _REASONS.items() for key in keys}
IGNORED_NEMO_PREFIXES = tuple(_PREFIX_REASONS)


def ignored_reason(dotted: str) -> str | None:
    """Why gptrain ignores `dotted`, or None when it is not an ignored NeMo key."""
    if dotted in IGNORED_NEMO_KEYS:
        return IGNORED_NEMO_KEYS[dotted]
    for prefix, reason in _PREFIX_REASONS.items():
        if f"{dotted}.".startswith(prefix):
            return reason
    return None


def is_ignored_nemo_key(dotted: str) -> bool:
    """True for a listed key, a key inside an ignored sub-tree, or the sub-tree's own name."""
    return ignored_reason(dotted) is not None


def ignored_summary(keys: list[str]) -> str:
    """One line: the ignored keys grouped by reason (`reason: a, b; reason: c`)."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(ignored_reason(key) or _NOT_IMPL, []).append(key)
    return "; ".join(f"{reason}: {', '.join(names)}" for reason, names in groups.items())
