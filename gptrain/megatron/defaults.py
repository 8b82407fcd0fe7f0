"""Megatron-LM's defaults where gptrain's differ, and the flags it needs: every translation's base."""

from __future__ import annotations

from typing import Any

# Megatron-LM's argument defaults (megatron/training/arguments.py) where gptrain's differ (for
# --lr and, since core 0.16, --eval-interval Megatron has none: FILLED_IN).
MEGATRON_DEFAULTS: dict[str, Any] = {
    "run.name": "megatron",
    "trainer.precision": "32",
    "trainer.log_every_n_steps": 100,
    "trainer.tensorboard_log_interval": 1,  # each iteration's own values to TensorBoard and W&B
    "trainer.log_throughput": False,  # the line's throughput field only with --log-throughput
    "trainer.val_check_interval": 1000,
    "trainer.limit_val_batches": 100,
    "trainer.limit_test_batches": 100,
    "trainer.gradient_clip_val": 1.0,
    "exp_manager.resume_if_exists": False,
    "exp_manager.checkpoint_callback_params.save_top_k": -1,  # Megatron removes no checkpoint
    "model.optim.lr": 6e-4,
    "model.optim.betas": [0.9, 0.999],
    "model.optim.eps": 1e-8,
    "model.optim.weight_decay": 0.01,
    "model.optim.sched.name": "LinearAnnealing",
    "model.optim.sched.min_lr": 0.0,
    "model.optim.sched.warmup_steps": 0,
    "model.optim.sched.constant_steps": 0,
    "model.optim.sched.warmup_style": "megatron",
    "model.data.splits_string": "969, 30, 1",
    "model.data.num_workers": 2,
    "model.activations_checkpoint_granularity": None,
    "model.data_parallel_sharding": "ddp",  # Megatron replicates unless --use-distributed-optimizer
    "model.tokenizer.library": "megatron",
    "model.tokenizer.type": "GPT2BPETokenizer",
    "model.make_vocab_size_divisible_by": 128,
    "model.init_method_std": 0.02,
    "model.hidden_dropout": 0.1,
    "model.attention_dropout": 0.1,
    "model.layernorm_epsilon": 1e-5,
    "model.seed": 1234,
}


# The flags that set the warmup; Megatron's default is --lr-warmup-iters 0.
WARMUP_FLAGS = ("--lr-warmup-samples", "--lr-warmup-fraction", "--lr-warmup-iters")


REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size")


# Flags without which Megatron stops, or stops since core 0.16 (February 2026: no --eval-interval
# default, and `train_iters // None` fails as the datasets are sized): the value gptrain takes instead.
FILLED_IN: dict[str, str] = {
    "--lr": f"learning rate {MEGATRON_DEFAULTS['model.optim.lr']}; Megatron has no default and stops",
    "--eval-interval": (
        f"validation every {MEGATRON_DEFAULTS['trainer.val_check_interval']} iterations, the default of "
        "Megatron up to core 0.15; from core 0.16 (February 2026) it has none and stops"
    ),
}
