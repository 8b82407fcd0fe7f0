"""Megatron-LM's `pretrain_gpt.py` flags, as a table: flag -> gptrain key, value type, arity.

Four kinds of flag:
- VALUE: one value to one (or more) gptrain keys, converted by a type or a table of choices;
- SWITCH: a flag without a value that sets fixed keys;
- NO_EFFECT: kernel, memory, logging and communication switches that change speed or logs only,
  and switches for what gptrain always does; accepted and reported once (with how many values
  they take, so parsing stays in step, and why where the reason is not speed or logs);
- REFUSED: flags whose meaning gptrain cannot reproduce; refused by name in one line.
Anything else is unknown and refused. Flags that combine with others (`--data-path`,
`--adam-beta1/2`, `--train-samples`, `--save/--load`, `--wandb-*`, `--group-query-attention`
with `--num-query-groups`, `--grad-reduce-in-bf16` with `--bf16`, `--decoupled-lr` with `--lr`,
`--tiktoken-*` and `--tokenizer-special-tokens` with `--tokenizer-type`,
`--data-parallel-sharding-strategy` with `--use-megatron-fsdp`, `--no-position-embedding` with the
position embedding type, `--null-tokenizer-*-id` with NullTokenizer, `--add-qkv-bias` with
`--disable-bias-linear`, `--no-pad-vocab-size` with the padding flags, `--weight-decay-incr-style` with
`--start/end-weight-decay`, `--openai-gelu` with `--use-legacy-models`) are handled in translate.py;
any `--moe-*` flag is refused as `--num-experts`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gptrain.errors import ConfigError

Converter = Callable[[str], Any] | dict[str, Any]


def exit_duration_as_max_time(minutes: str) -> str | None:
    """--exit-duration-in-mins as trainer.max_time; 0 is no limit, as Megatron tests the value for
    truth (a max_time of 0 would stop after the first step). A negative one (Megatron: stop after the
    first step) is refused in words, not as the malformed max_time it would make."""
    whole = int(minutes)
    if whole < 0:
        raise ConfigError(f"--exit-duration-in-mins {minutes}: give whole minutes, 0 or more (0 is no limit)")
    return None if whole == 0 else f"00:00:{whole:02d}:00"


def exit_interval_or_none(iterations: str) -> int | None:
    """--exit-interval as trainer.exit_interval; 0 is none, as Megatron tests the value for truth."""
    return int(iterations) or None


def split_without_quotes(split: str) -> str:
    """--split as Megatron reads it (its numbers only): the quotes an unquoted array expansion leaves in
    the word (`"--split '99,1,0'"` in Megatron's llama3 example arrives as `'99,1,0'`) are dropped."""
    quoted = len(split) >= 2 and split[0] == split[-1] and split[0] in "'\""
    return split[1:-1] if quoted else split


VALUE: dict[str, tuple[tuple[str, ...], Converter]] = {
    "--num-layers": (("model.num_layers",), int),
    "--hidden-size": (("model.hidden_size",), int),
    "--ffn-hidden-size": (("model.ffn_hidden_size",), int),
    "--num-attention-heads": (("model.num_attention_heads",), int),
    "--kv-channels": (("model.kv_channels",), int),
    "--seq-length": (("model.encoder_seq_length", "model.data.seq_length"), int),
    "--max-position-embeddings": (("model.max_position_embeddings",), int),
    "--micro-batch-size": (("model.micro_batch_size",), int),
    "--global-batch-size": (("model.global_batch_size",), int),
    "--train-iters": (("trainer.max_steps",), int),
    "--lr": (("model.optim.lr",), float),
    "--min-lr": (("model.optim.sched.min_lr",), float),
    "--lr-decay-iters": (("model.optim.sched.max_steps",), int),
    "--lr-warmup-iters": (("model.optim.sched.warmup_steps",), int),
    "--lr-warmup-samples": (("model.optim.sched.warmup_samples",), int),
    "--lr-decay-samples": (("model.optim.sched.decay_samples",), int),
    "--lr-warmup-fraction": (("model.optim.sched.warmup_fraction",), float),
    "--lr-warmup-init": (("model.optim.sched.warmup_init_lr",), float),
    "--lr-decay-style": (
        ("model.optim.sched.name",),
        {"cosine": "CosineAnnealing", "linear": "LinearAnnealing", "constant": "Constant",
         "inverse-square-root": "MegatronInverseSquareRoot", "WSD": "WarmupStableDecay"},
    ),
    # read only with --lr-decay-style WSD, each in the run's unit (schedule_flags.megatron_decay_styles)
    "--lr-wsd-decay-style": (
        ("model.optim.sched.wsd_decay_style",),
        {style: style for style in ("linear", "cosine", "exponential", "minus_sqrt")},
    ),
    "--lr-wsd-decay-iters": (("model.optim.sched.wsd_decay_steps",), int),
    "--lr-wsd-decay-samples": (("model.optim.sched.wsd_decay_samples",), int),
    "--weight-decay": (("model.optim.weight_decay",), float),
    "--adam-eps": (("model.optim.eps",), float),
    "--clip-grad": (("trainer.gradient_clip_val",), float),
    "--init-method-std": (("model.init_method_std",), float),
    "--hidden-dropout": (("model.hidden_dropout",), float),
    "--attention-dropout": (("model.attention_dropout",), float),
    "--layernorm-epsilon": (("model.layernorm_epsilon",), float),
    "--norm-epsilon": (("model.layernorm_epsilon",), float),
    "--normalization": (("model.normalization",), {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}),
    "--position-embedding-type": (("model.position_embedding_type",), {"learned_absolute": "learned_absolute", "rope": "rope"}),
    "--rotary-percent": (("model.rotary_percentage",), float),
    "--rotary-base": (("model.rotary_base",), int),
    "--make-vocab-size-divisible-by": (("model.make_vocab_size_divisible_by",), int),
    "--padded-vocab-size": (("model.padded_vocab_size",), int),  # Megatron since August 2025
    "--seed": (("model.seed",), int),
    "--tensor-model-parallel-size": (("model.tensor_model_parallel_size",), int),
    "--pipeline-model-parallel-size": (("model.pipeline_model_parallel_size",), int),
    "--decoder-first-pipeline-num-layers": (("model.num_layers_in_first_pipeline_stage",), int),
    "--decoder-last-pipeline-num-layers": (("model.num_layers_in_last_pipeline_stage",), int),
    "--log-interval": (("trainer.log_every_n_steps",), int),
    "--eval-iters": (("trainer.limit_val_batches", "trainer.limit_test_batches"), int),
    "--eval-interval": (("trainer.val_check_interval",), int),
    "--save-interval": (("exp_manager.checkpoint_callback_params.every_n_train_steps",), int),
    # Megatron's other name for --save-interval (persistent checkpoints, beside its non-persistent ones)
    "--persistent-save-interval": (("exp_manager.checkpoint_callback_params.every_n_train_steps",), int),
    "--split": (("model.data.splits_string",), split_without_quotes),
    "--vocab-file": (("model.tokenizer.vocab_file",), str),
    "--merge-file": (("model.tokenizer.merge_file",), str),
    "--tokenizer-type": (
        ("model.tokenizer.type",),
        {"GPT2BPETokenizer": "GPT2BPETokenizer", "HuggingFaceTokenizer": "HuggingFaceTokenizer",
         "TikTokenizer": "TikTokenizer", "GPTSentencePieceTokenizer": "GPTSentencePieceTokenizer",
         "Llama2Tokenizer": "Llama2Tokenizer", "SentencePieceTokenizer": "SentencePieceTokenizer",
         "NullTokenizer": "NullTokenizer"},  # mock data, or pre-tokenized data (tokenizer_flags.py)
    ),
    "--tokenizer-model": (("model.tokenizer.model",), str),
    "--data-cache-path": (("model.data.index_mapping_dir",), str),
    "--mid-level-dataset-surplus": (("model.data.mid_level_dataset_surplus",), float),
    "--num-workers": (("model.data.num_workers",), int),
    "--initial-loss-scale": (("model.native_amp_init_scale",), float),
    "--loss-scale-window": (("model.native_amp_growth_interval",), int),
    "--hysteresis": (("model.hysteresis",), int),
    "--recompute-granularity": (("model.activations_checkpoint_granularity",), {"full": "full", "selective": "selective"}),
    "--recompute-method": (("model.activations_checkpoint_method",), {"uniform": "uniform", "block": "block"}),
    "--recompute-num-layers": (("model.activations_checkpoint_num_layers",), int),
    # Megatron's names from August 2021 to April 2022 (its examples kept the method until September 2023)
    "--activations-checkpoint-method": (("model.activations_checkpoint_method",), {"uniform": "uniform", "block": "block"}),
    "--activations-checkpoint-num-layers": (("model.activations_checkpoint_num_layers",), int),
    "--checkpoint-num-layers": (("model.activations_checkpoint_num_layers",), int),  # before August 2021
    "--exit-duration-in-mins": (("trainer.max_time",), exit_duration_as_max_time),
    "--exit-interval": (("trainer.exit_interval",), exit_interval_or_none),
    "--tensorboard-log-interval": (("trainer.tensorboard_log_interval",), int),
    "--log-memory-interval": (("trainer.log_memory_interval",), int),
    "--vocab-size": (("model.data.mock_vocab_size",), int),
}  # fmt: skip

SWITCH: dict[str, dict[str, Any]] = {
    "--fp16": {"trainer.precision": "16"},
    "--bf16": {"trainer.precision": "bf16"},
    "--sequence-parallel": {"model.sequence_parallel": True},
    "--untie-embeddings-and-output-weights": {"model.share_embeddings_and_output_weights": False},
    "--disable-bias-linear": {"model.bias": False},
    "--swiglu": {"model.activation": "swiglu"},
    "--log-throughput": {"trainer.log_throughput": True},
    # a resume takes the schedule the checkpoint records (name, rates, warmup, length), as Megatron's
    **dict.fromkeys(
        ("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler"),
        {"model.optim.sched.from_checkpoint": True},
    ),
    # store_false: the fused bias-GELU, GELU's tanh approximation, is Megatron's default; off, the erf GELU
    "--no-bias-gelu-fusion": {"model.bias_activation_fusion": False},
    "--use-rotary-position-embeddings": {"model.position_embedding_type": "rope"},
    "--eod-mask-loss": {"model.data.eod_mask_loss": True},
    "--allow-ambiguous-pad-tokens": {"model.data.allow_ambiguous_pad_tokens": True},
    "--account-for-embedding-in-pipeline-split": {"model.account_for_embedding_in_pipeline_split": True},
    "--account-for-loss-in-pipeline-split": {"model.account_for_loss_in_pipeline_split": True},
    "--mock-data": {"model.data.data_impl": "mock"},
    # the AWS Neuron fork's: each save removes the checkpoints before it
    "--keep-last-checkpoint-only": {"exp_manager.checkpoint_callback_params.save_top_k": 1},
    # ZeRO-1 in Megatron (one reduce-scatter and one all-gather per step); gptrain's nearest is
    # FSDP2 keeping the weights gathered through the step (ZeRO-2: gradients reduce-scattered)
    "--use-distributed-optimizer": {"model.data_parallel_sharding": "shard_grad_op"},
    # how a --load that differs from --save is loaded (the run's own checkpoints always load whole)
    "--no-load-optim": {"exp_manager.load_optimizer": False},
    "--no-load-rng": {"exp_manager.load_rng": False},
    "--finetune": {"exp_manager.finetune": True},
    "--async-save": {"exp_manager.checkpoint_callback_params.async_save": True},
    # GPT-2 BPE keeps a literal <|endoftext|> as text; checked against the data's record of it
    "--legacy-tokenizer": {"model.tokenizer.legacy": True},
    # Megatron's AutoTokenizer then builds transformers' slow class: taken where its ids are the
    # tokenizer.json's, refused where they may differ (as data prepare does)
    "--tokenizer-hf-no-use-fast": {"model.tokenizer.use_fast": False},
}

# flag -> number of values it takes (None: one or more); these change speed, kernels or logs only.
NO_EFFECT: dict[str, int | None] = {
    "--use-flash-attn": 0, "--use-mcore-models": 0, "--no-masked-softmax-fusion": 0,
    "--no-bias-dropout-fusion": 0, "--no-gradient-accumulation-fusion": 0,
    "--no-async-tensor-model-parallel-allreduce": 0, "--overlap-grad-reduce": 0, "--overlap-param-gather": 0,
    "--fp16-lm-cross-entropy": 0, "--accumulate-allreduce-grads-in-fp32": 0,
    "--apply-query-key-layer-scaling": 0, "--no-query-key-layer-scaling": 0, "--attention-softmax-in-fp32": 0,
    "--use-cpu-initialization": 0, "--no-contiguous-buffers-in-local-ddp": 0, "--no-persist-layer-norm": 0,
    "--distribute-saved-activations": 0, "--manual-gc": 0, "--no-manual-gc-eval": 0, "--manual-gc-interval": 1,
    "--empty-unused-memory-level": 1, "--exit-signal-handler": 0, "--data-impl": 1,
    "--log-params-norm": 0, "--log-num-zeros-in-grad": 0,
    "--log-timers-to-tensorboard": 0, "--log-validation-ppl-to-tensorboard": 0,
    "--log-memory-to-tensorboard": 0, "--log-batch-size-to-tensorboard": 0,
    "--log-learning-rate-to-tensorboard": 0, "--log-loss-scale-to-tensorboard": 0,
    "--no-save-optim": 0, "--no-save-rng": 0,
    "--transformer-impl": 1, "--attention-backend": 1, "--DDP-impl": 1, "--timing-log-level": 1,
    "--tensorboard-queue-size": 1, "--distributed-backend": 1,
    "--distributed-timeout-minutes": 1, "--ckpt-format": 1, "--dataloader-type": 1,
    "--calculate-per-token-loss": 0, "--min-loss-scale": 1, "--tp-comm-overlap": 0, "--tp-comm-overlap-cfg": 1,
    "--override-opt_param-scheduler": 0, "--override-opt-param-scheduler": 0, "--optimizer": 1,
    "--use-legacy-models": 0, "--cross-entropy-loss-fusion": 0,
    "--cross-entropy-fusion-impl": 1, "--no-rope-fusion": 0, "--no-create-attention-mask-in-dataloader": 0,
    "--no-mmap-bin-files": 0, "--profile": 0, "--profile-step-start": 1, "--profile-step-end": 1,
    "--profile-ranks": None, "--use-pytorch-profiler": 0, "--record-memory-history": 0,
    "--memory-snapshot-path": 1, "--apply-layernorm-1p": 0, "--context-parallel-size": 1,
    "--expert-model-parallel-size": 1, "--no-bias-swiglu-fusion": 0, "--no-gradient-reduce-div-fusion": 0,
    "--init-model-with-meta-device": 0, "--use-precision-aware-optimizer": 0, "--main-grads-dtype": 1,
    "--main-params-dtype": 1, "--exp-avg-dtype": 1, "--exp-avg-sq-dtype": 1,
    "--no-check-for-nan-in-loss-and-grad": 0, "--use-nccl-ub": 0, "--fsdp-double-buffer": 0,
    "--fsdp-manual-registration": 0, "--logging-level": 1,
    # Megatron's checkpoint format and how it is saved and loaded (gptrain's own, see NO_EFFECT_WHY)
    "--use-dist-ckpt": 0, "--dist-ckpt-format": 1, "--auto-detect-ckpt-format": 0,
    "--ckpt-fully-parallel-save": 0, "--no-ckpt-fully-parallel-save": 0, "--ckpt-fully-parallel-load": 0,
    "--ckpt-assume-constant-structure": 0, "--dist-ckpt-strictness": 1, "--use-persistent-ckpt-worker": 0,
    "--dist-ckpt-optim-fully-reshardable": 0, "--distrib-optim-fully-reshardable-mem-efficient": 0,
    "--dist-ckpt-workers": 1,
    # logs only
    "--log-world-size-to-tensorboard": 0, "--timing-log-option": 1, "--log-progress": 0, "--log-straggler": 0,
    "--disable-straggler-on-startup": 0, "--straggler-ctrlr-port": 1, "--straggler-minmax-count": 1,
    "--log-energy": 0, "--log-device-memory-used": 0, "--log-max-attention-logit": 0,
    "--no-log-loss-scale-to-tensorboard": 0, "--disable-log-loss-scale-to-tensorboard": 0,
    "--no-barrier-with-level-1-timing": 0, "--disable-manual-gc-eval": 0,
    # what Megatron's profilers (--profile, accepted without effect) record
    "--pytorch-profiler-collect-shapes": 0, "--pytorch-profiler-collect-callstack": 0,
    "--pytorch-profiler-collect-chakra": 0, "--record-shapes": 0, "--nvtx-ranges": 0,
    # data-parallel communication
    "--ddp-bucket-size": 1, "--ddp-num-buckets": 1, "--ddp-pad-buckets-for-high-nccl-busbw": 0,
    "--ddp-average-in-collective": 0,
    # Megatron's shared tokenizer flags (data prepare reads them for the ids; see NO_EFFECT_WHY)
    "--tokenizer-hf-use-fast": 0,
    "--tokenizer-hf-include-special-tokens": 0, "--tokenizer-hf-no-include-special-tokens": 0,
    "--trust-remote-code": 0, "--vocab-extra-ids": 1, "--tokenizer-sentencepiece-legacy": 0,
    "--no-tokenizer-sentencepiece-ignore-extra-whitespaces": 0,
    "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces": 0, "--use-gigatoken": 0, "--chat-template": 1,
    # Transformer Engine's FP8 settings, read only with --fp8-format (refused)
    "--fp8-amax-history-len": 1, "--fp8-amax-compute-algo": 1, "--fp8-param-gather": 0, "--fp8-recipe": 1,
    "--fp8-margin": 1, "--fp8-interval": 1,
    # read only with --use-rope-scaling (refused); 1 is no interpolation
    "--rope-scaling-factor": 1, "--rotary-seq-len-interpolation-factor": 1,
    "--num-dataset-builder-threads": 1, "--deterministic-mode": 0, "--recompute-modules": None,
    # how Megatron loads its index caches (core 0.14 on): the same samples from gptrain's cache
    "--dataloader-fast-cache-load": 0, "--dataloader-defer-npy-index-mmap": 0, "--per-dataset-sequences-path": 1,
    # Megatron's defaults of newer model flags (other values refused: NO_EFFECT_CHOICES)
    "--rope-type": 1, "--softmax-type": 1, "--window-attn-skip-freq": 1,
}  # fmt: skip

# Why a NO_EFFECT flag changes nothing, where the reason is not speed, kernels or logs (said in the notice).
NO_EFFECT_WHY: dict[str, str] = {
    # Megatron core 0.18's logging flags whose output gptrain's logs lack
    "--log-energy": "the line has no energy and power per GPU fields: gptrain does not read the GPUs' energy counters",
    "--log-device-memory-used": "the memory report has no 'total device memory used' field, nvidia-smi's figure",
    "--log-max-attention-logit": "no max attention logit in TensorBoard",
    **dict.fromkeys(
        ("--no-log-loss-scale-to-tensorboard", "--disable-log-loss-scale-to-tensorboard"),
        "gptrain writes the loss scale to TensorBoard",
    ),
    "--exit-signal-handler": "gptrain always saves a checkpoint and exits on SIGTERM and SIGUSR1",
    # gptrain.train.watchdog.collective_timeout_minutes at trainer.hang_timeout_minutes 10
    "--distributed-timeout-minutes": "gptrain's collectives wait 65 minutes (6 x trainer.hang_timeout_minutes "
    "+ 5), and a training step stuck for 10 (trainer.hang_timeout_minutes) ends the job naming the stuck rank",
    "--data-impl": "gptrain reads Megatron's mmap format",
    "--calculate-per-token-loss": "gptrain's loss is always the per-token mean over the global batch",
    "--min-loss-scale": "gptrain's dynamic fp16 loss scale never falls below 1, Megatron's default",
    "--dataloader-type": "gptrain reads the samples in the dataset's own shuffled order, as Megatron's single does",
    "--optimizer": "Megatron's adam is AdamW, which gptrain runs",
    "--context-parallel-size": "1 is Megatron's default, no context parallelism",
    "--expert-model-parallel-size": "1 is Megatron's default, no expert parallelism",
    "--no-save-optim": "gptrain's checkpoints always hold the optimizer state, so that a resume goes on exactly",
    "--no-save-rng": "gptrain's checkpoints always hold the random states, so that a resume goes on exactly",
    "--use-legacy-models": "Megatron's older code for the same model",
    "--apply-layernorm-1p": "norm weights kept as gamma - 1 train as gptrain's gamma: the same forward and "
    "updates, as neither decays norm weights",
    "--no-create-attention-mask-in-dataloader": "gptrain's attention is causal without a mask tensor",
    "--no-mmap-bin-files": "the same tokens, read through mmap",
    **dict.fromkeys(
        ("--dataloader-fast-cache-load", "--dataloader-defer-npy-index-mmap"),
        "gptrain loads its own index cache from model.data.index_mapping_dir, or builds it: the same samples",
    ),
    "--per-dataset-sequences-path": "gptrain reads each dataset's sequence count from its .idx",
    "--no-check-for-nan-in-loss-and-grad": "gptrain never applies an iteration whose loss or gradients are "
    "not finite (Megatron with this flag applies it under --bf16 or fp32): it skips it (a nan iteration in the log "
    "line) and stops after trainer.max_consecutive_nonfinite (5) in a row; without the flag, at the first",
    "--use-precision-aware-optimizer": "with its dtypes at fp32, Megatron's default, Transformer Engine's "
    "fused Adam updates as gptrain's AdamW does",
    **dict.fromkeys(
        ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"),
        "fp32, Megatron's default and gptrain's",
    ),
    **dict.fromkeys(
        (
            "--use-dist-ckpt",
            "--dist-ckpt-format",
            "--ckpt-format",
            "--auto-detect-ckpt-format",
            "--ckpt-fully-parallel-save",
            "--no-ckpt-fully-parallel-save",
            "--ckpt-fully-parallel-load",
            "--ckpt-assume-constant-structure",
            "--dist-ckpt-strictness",  # how strictly a Megatron checkpoint's keys are matched on load
            "--use-persistent-ckpt-worker",  # one process for all async saves, not one per save
        ),
        "gptrain always writes and reads its own sharded checkpoints (torch.distributed.checkpoint), each rank "
        "its shards in parallel; it does not read Megatron's",
    ),
    # Megatron's distributed optimizer saves its state by DP shard, loadable at another DP only, unless
    # this flag; gptrain's loads under every layout change (tests/distributed/test_optimizer_resharding)
    "--dist-ckpt-optim-fully-reshardable": "gptrain's checkpoints hold each parameter's optimizer state whole "
    "under its name, which loads under any other data, tensor or pipeline parallel layout, or in one process",
    # Megatron's arguments.py and checkpointing.py: with --dist-ckpt-optim-fully-reshardable, the state is
    # gathered over Gloo to DP rank 0 instead of over NCCL to all (a checkpoint-save setting only)
    "--distrib-optim-fully-reshardable-mem-efficient": "how Megatron gathers its fully reshardable "
    "distributed-optimizer state to save it (over Gloo, on one data-parallel rank, to spare memory); gptrain "
    "writes its checkpoints with torch.distributed.checkpoint, each rank its own part, and has no such gather",
    # the thread count of Megatron's FileSystemWriterAsync (async saves only; 1 for a synchronous one)
    "--dist-ckpt-workers": "how many threads each rank's asynchronous save writes Megatron's checkpoint files "
    "with; gptrain writes its own checkpoints (torch.distributed.checkpoint) and has no such setting",
    **dict.fromkeys(
        (
            "--tokenizer-hf-use-fast",
            "--tokenizer-hf-include-special-tokens",
            "--tokenizer-hf-no-include-special-tokens",
            "--trust-remote-code",
            "--vocab-extra-ids",
            "--tokenizer-sentencepiece-legacy",
            "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
            "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces",
            "--use-gigatoken",
        ),
        "training reads the prepared data's ids; the tokenizer gives its vocabulary size and end-of-document "
        "id, the same either way",
    ),
    **dict.fromkeys(
        (
            "--fp8-amax-history-len",
            "--fp8-amax-compute-algo",
            "--fp8-recipe",
            "--fp8-margin",
            "--fp8-interval",
        ),
        "an FP8 setting: without --fp8-format (refused) Megatron trains without FP8 too",
    ),
    "--fp8-param-gather": "FP8 weights, with --fp8-format (refused): without it Megatron stops ('fp8_param must be "
    "used together with fp8 mode'); gptrain keeps the weights in the training precision",
    "--rope-scaling-factor": "Megatron reads it only with --use-rope-scaling, refused",
    "--rope-type": "rope: Megatron's rotary embedding of common attention, gptrain's",
    "--softmax-type": "vanilla: Megatron's default softmax, gptrain's",
    "--window-attn-skip-freq": "Megatron reads it only with --window-size, refused",
    "--rotary-seq-len-interpolation-factor": "1: no interpolation, Megatron's default",
    "--chat-template": "Megatron formats conversations with it (SFT, inference), not pretraining data",
    "--ddp-average-in-collective": "the same mean gradient over the data-parallel ranks, divided after the "
    "sum rather than before it (rounding aside)",
    **dict.fromkeys(  # the reason once; the flags that only set these up (steps, ranks, paths) go without
        ("--profile", "--use-pytorch-profiler", "--record-memory-history"),
        "gptrain starts no profiler and no cudaProfilerApi range: profile the whole run",
    ),
    **dict.fromkeys(
        ("--override-opt_param-scheduler", "--override-opt-param-scheduler"),
        "a resume always takes the flags' learning-rate schedule, as this flag asks; a change from the "
        "checkpoint's is said in one line",
    ),
}

# NO_EFFECT flags whose other values gptrain cannot honour: flag -> (values accepted, why others are refused).
# The values are of the type Megatron's argparse reads the flag as (int, float, else str): 01 is 1.
NO_EFFECT_CHOICES: dict[str, tuple[tuple[Any, ...], str]] = {
    "--data-impl": (
        ("mmap", "infer"),
        "gptrain reads Megatron's mmap format only (lazy and cached are gone from Megatron too); "
        "drop the flag or give mmap",
    ),
    "--empty-unused-memory-level": ((0, 1, 2), "give 0, 1 or 2 (Megatron's levels)"),
    "--rotary-seq-len-interpolation-factor": (
        (1,),
        "rope position interpolation is not implemented; drop the flag or give 1",
    ),
    "--min-loss-scale": (
        (1.0,),
        "other floors of the fp16 loss scale are not implemented; drop the flag",
    ),
    "--context-parallel-size": (
        (1,),
        "context parallelism is not implemented: drop the flag (or give 1), and its ranks do data parallelism",
    ),
    "--expert-model-parallel-size": ((1,), "mixture of experts is not implemented"),
    **dict.fromkeys(
        ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"),
        (
            ("fp32",),
            "gptrain keeps gradients, fp32 weights and AdamW's state in fp32; drop the flag or give fp32",
        ),
    ),
    "--optimizer": (
        ("adam",),
        "gptrain trains with AdamW only, Megatron's adam (its default): drop the flag or give adam",
    ),
    "--rope-type": (("rope",), "YaRN rope scaling is not implemented; drop the flag or give rope"),
    "--softmax-type": (
        ("vanilla",),
        "attention sinks (off-by-one and learnable softmax) are not implemented; drop the flag or give vanilla",
    ),
    "--dataloader-type": (
        ("single",),
        "gptrain reads the samples in the dataset's own shuffled order (Megatron's single); cyclic's "
        "reshuffle at every epoch and external loaders are not implemented: drop the flag or give single",
    ),
}

REFUSED: dict[str, str] = {
    "--tokenizer-metadata": "Megatron's tokenizer metadata file chooses the tokenizer's library and class, which "
    "gptrain does not read; drop it and give the --tokenizer-type (and --tokenizer-model) it names",
    "--num-experts": "mixture of experts is not implemented",
    "--expert-tensor-parallel-size": "mixture of experts is not implemented",
    "--multi-latent-attention": "multi-latent attention is not implemented",
    "--mtp-num-layers": "multi-token prediction is not implemented",
    "--qk-layernorm": "a norm on the queries and keys is not implemented",
    "--rotary-interleaved": "rotary embedding of interleaved pairs (RoFormer's) is not implemented; gptrain rotates "
    "the first half of each head against the second, Megatron's default",
    "--use-rope-scaling": "Llama 3.1's rope frequency scaling is not implemented",
    "--reset-position-ids": "position ids restarting after each end of document are not implemented",
    "--reset-attention-mask": "attention cut at each end of document is not implemented",
    "--squared-relu": "the squared ReLU activation is not implemented (gelu, or --swiglu)",
    "--quick-geglu": "the quick-GELU gated activation is not implemented (gelu, or --swiglu)",
    "--window-size": "sliding-window attention is not implemented (gptrain attends to the whole sequence)",
    "--qk-l2-norm": "an L2 norm on the queries and keys is not implemented",
    "--apply-residual-connection-post-layernorm": "the residual taken after the norm is not implemented (gptrain "
    "adds the block's input, Megatron's default)",
    "--init-method-xavier-uniform": "Xavier-uniform initialisation is not implemented (gptrain draws the weights "
    "from a normal of --init-method-std, Megatron's default)",
    "--no-rope-freq": "layers without rope (Llama 4's NoPE layers) are not implemented",
    "--fp8-format": "FP8 through Transformer Engine is not used; see model.fp8 (torchao) with gptrain train",
    "--skip-train": "evaluation without training is not run by gptrain megatron: `gptrain eval RUN` evaluates "
    "the newest checkpoint of a run on its validation split (--split test for the test split)",
    "--use-checkpoint-args": "reading the model shape from a checkpoint is not supported: give the shape flags "
    "the checkpoint was trained with (--num-layers, --hidden-size, --num-attention-heads, ...) and drop this flag",
    "--non-persistent-save-interval": "non-persistent checkpoints (each replacing the one before, for a restart "
    "after a failure) are not implemented; gptrain saves every --save-interval and on SIGTERM/SIGUSR1: drop the "
    "flag, or give its interval to --save-interval",
}

# Flags with several values or that combine with others (translate.py handles them): flag -> number
# of values it takes, None for one or more.
SPECIAL: dict[str, int | None] = {
    "--data-path": None, "--train-data-path": None, "--valid-data-path": None, "--test-data-path": None,
    "--data-args-path": 1, "--per-split-data-args-path": 1,
    "--adam-beta1": 1, "--adam-beta2": 1, "--train-samples": 1, "--save": 1, "--load": 1,
    "--save-xser": 1, "--load-xser": 1,
    "--tensorboard-dir": 1, "--rampup-batch-size": 3, "--wandb-project": 1, "--wandb-exp-name": 1,
    "--wandb-save-dir": 1, "--wandb-entity": 1, "--num-layers-per-virtual-pipeline-stage": 1,
    "--num-virtual-stages-per-pipeline-rank": 1,
    "--group-query-attention": 0, "--num-query-groups": 1, "--recompute-activations": 0,
    "--checkpoint-activations": 0, "--step-batch-size-schedule": None, "--grad-reduce-in-bf16": 0,
    "--decoupled-lr": 1, "--decoupled-min-lr": 1, "--tiktoken-pattern": 1,
    "--tiktoken-num-special-tokens": 1, "--tokenizer-special-tokens": None, "--tiktoken-special-tokens": None,
    "--use-megatron-fsdp": 0, "--data-parallel-sharding-strategy": 1, "--use-torch-fsdp2": 0,
    "--no-position-embedding": 0, "--add-qkv-bias": 0, "--loss-scale": 1,
    "--null-tokenizer-eod-id": 1, "--null-tokenizer-pad-id": 1, "--no-pad-vocab-size": 0,
    "--disable-pad-vocab-size": 0, "--weight-decay-incr-style": 1, "--start-weight-decay": 1,
    "--end-weight-decay": 1, "--openai-gelu": 0,
}  # fmt: skip
