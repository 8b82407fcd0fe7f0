"""The samples each split of a run consumes, by Megatron's formula.

Standard library only: `gptrain launch` (the login node's preflight) and `gptrain megatron --dry-run`
decide with it which splits a job builds, without numpy or torch.
"""

from __future__ import annotations

from gptrain.errors import ConfigError


def sample_counts(
    train_iters: int,
    global_batch_size: int,
    eval_interval: int,
    eval_iters: int,
    eval_global_batch_size: int | None = None,
    *,
    train_samples: int | None = None,
    start_eval_at_iter: int | None = None,
) -> tuple[int, int, int]:
    """(train, valid, test) samples a run consumes, by Megatron's training.py formula.

    Validation runs at every multiple of eval_interval and once more after training, hence
    `train_iters // eval_interval + 1` evaluations of eval_iters batches each.
    """
    if eval_interval < 1:
        raise ConfigError(f"eval_interval must be at least 1, got {eval_interval}")
    eval_batch = eval_global_batch_size or global_batch_size
    train = train_samples if train_samples else train_iters * global_batch_size
    evaluations = train_iters // eval_interval + 1
    if start_eval_at_iter is not None:
        evaluations = max(0, evaluations - start_eval_at_iter // eval_interval)
    return train, evaluations * eval_iters * eval_batch, eval_iters * eval_batch
