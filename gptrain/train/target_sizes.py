"""The samples a run asks of each split, and so which splits it builds (a split of 0 is not).

No torch or numpy: `gptrain launch`'s preflight and `gptrain megatron` check the files of the splits
built with it before a job starts, and training builds its datasets for the same sizes.
"""

from __future__ import annotations

from gptrain.config import TrainingConfig
from gptrain.config.schema import PER_SPLIT_KEYS
from gptrain.data.split_sizes import sample_counts
from gptrain.train.rampup import BatchRamp


def dataset_target_sizes(cfg: TrainingConfig) -> tuple[int, int, int]:
    """The samples the train, validation and test splits are built for (Megatron's
    train_val_test_num_samples; a split of 0 is not built)."""
    m, t = cfg.model, cfg.trainer
    train_n, valid_n, _ = sample_counts(
        t.max_steps,
        m.global_batch_size,
        t.val_check_interval,
        t.limit_val_batches,
        train_samples=t.train_samples,
    )
    test_n = t.limit_test_batches * m.global_batch_size  # NeMo sizes the test split by limit_test_batches
    return train_n, valid_n, test_n


def train_samples_read(cfg: TrainingConfig) -> int | None:
    """The samples trainer.max_steps read under trainer.train_samples (None without it): inside a ramp
    Megatron's iteration count can read more than train_samples, which a split built for it (whole
    epochs) often holds anyway; one that does not is rebuilt for this count (builders._build_datasets)."""
    return None if cfg.trainer.train_samples is None else samples_max_steps_read(cfg)


def samples_max_steps_read(cfg: TrainingConfig) -> int:
    """The samples trainer.max_steps read under the global batch and its ramp."""
    m = cfg.model
    ramp = BatchRamp.from_config(m.rampup_batch_size, m.global_batch_size, 1)
    return ramp.samples_for(cfg.trainer.max_steps)


def split_sizes_asked_by(cfg: TrainingConfig) -> tuple[str, str, str]:
    """The keys that size the train, validation and test splits (dataset_target_sizes), as errors name them."""
    return (
        "trainer.max_steps x model.global_batch_size"
        if cfg.trainer.train_samples is None
        else "trainer.train_samples",
        "trainer.limit_val_batches x validations (trainer.max_steps / trainer.val_check_interval + 1)",
        "trainer.limit_test_batches x model.global_batch_size",
    )


def built_split_keys(cfg: TrainingConfig) -> list[str]:
    """The per-split data_prefix keys the build reads: training builds no split asked for 0 samples
    (the test split under trainer.limit_test_batches=0), so its prefix need not exist."""
    sizes = dataset_target_sizes(cfg)
    return [key for key, size in zip(PER_SPLIT_KEYS, sizes, strict=True) if size > 0]
