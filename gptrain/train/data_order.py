"""Whether a resumed run reads on in the train split's order, or in a new one.

The train split's shuffle spans the epochs the run asks for (trainer.max_steps x global batch, or
trainer.train_samples), as Megatron builds it: a resume that asks for more samples than fit in
the epochs the run had (or that moves the final epoch's share across Megatron's 80% line) gets a
new order. The resumed run then reads the new order from its consumed samples on, as a run asking
for that many from the start would, but it trained on the old order before: some samples come again
and others not at all this epoch. Megatron does the same, silently; gptrain keeps the order rule
and says it once: each checkpoint's rank file holds a digest of the next few samples the run would
have read, and the resumed run compares it with its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gptrain.train.target_sizes import samples_max_steps_read, train_samples_read

PROBE_SAMPLES = 4
"""Samples compared: a new shuffle leaves four given samples in place with negligible chance."""


def next_samples(samples: Sequence[Any], consumed: int, count: int = PROBE_SAMPLES) -> str | None:
    """sha256 of the tokens of samples[consumed:consumed + count]; None when the split has fewer, or
    they cannot be read (a save must not fail for samples the run may never read)."""
    if consumed + count > len(samples):
        return None
    digest = hashlib.sha256()
    try:
        for index in range(consumed, consumed + count):
            digest.update(np.ascontiguousarray(samples[index], dtype=np.int64).tobytes())
    except Exception:  # advisory: the run reports a bad sample (of whatever kind) when it reads it
        return None
    return digest.hexdigest()


SIZING_KEYS = ("max_steps", "train_samples", "val_check_interval", "limit_val_batches")
"""The trainer keys the split sizes follow (Megatron's formula: gptrain.data.builder.sample_counts)."""

DATA_CHANGED = (
    "the data settings changed (data_prefix, splits_string, seq_length, mid_level_dataset_surplus or seed)"
)
BATCH_UNRECORDED = "or model.global_batch_size or rampup_batch_size did (the checkpoint does not record them)"

BATCH_KEYS = ("global_batch_size", "rampup_batch_size")
"""The model keys they follow too: the train split is built for trainer.max_steps x the global batch,
or for what the steps read under the ramp where that is more than trainer.train_samples holds; each
validation reads limit_val_batches global batches."""


def order_record(
    train: Sequence[Any],
    valid: Sequence[Any] | None,
    consumed: int,
    trainer: Any,
    built_for: int | None = None,
    model: Any = None,
) -> dict:
    """What a checkpoint keeps to tell a changed order at resume: digests of the train samples the
    run reads next and of the first validation samples (validation reads the same first batches
    every time), the trainer and model (`model`) keys that sized the splits, and the samples the
    train split was built for (`built_for`: a gptrain that sizes it otherwise changes the order with
    no key changed)."""
    return {
        "consumed": consumed,
        "next": next_samples(train, consumed),
        "valid": next_samples(valid, 0) if valid is not None else None,
        **{key: getattr(trainer, key) for key in SIZING_KEYS},
        **({key: _plain(getattr(model, key)) for key in BATCH_KEYS} if model is not None else {}),
        "train_built_for": built_for,
    }


def order_warnings(
    saved: dict | None,
    train: Sequence[Any],
    valid: Sequence[Any] | None,
    consumed: int,
    cfg: Any,
    built_for: int | None = None,
) -> list[str]:
    """A warning line for each split whose samples are not the ones the saved run had (the train
    samples from `consumed` on, the validation samples); none where they are the same, or where the
    checkpoint cannot tell (saved before this record, at the end of its split). `built_for`: the
    samples this run's train split was built for, to tell a split sized otherwise then."""
    if not isinstance(saved, dict):
        return []
    trainer, model = cfg.trainer, cfg.model
    changed = [
        f"trainer.{key} {saved.get(key)} -> {getattr(trainer, key)}"
        for key in SIZING_KEYS
        if key in saved and saved[key] != getattr(trainer, key)
    ]
    # the ramp sizes the train split only through what the steps read past trainer.train_samples
    compared = BATCH_KEYS if trainer.train_samples is not None else ("global_batch_size",)
    batch = {
        key: saved[key] for key in compared if key in saved and saved[key] != _plain(getattr(model, key))
    }
    if changed or batch:
        cause = ", ".join(
            [*changed, *(f"model.{key} {then} -> {getattr(model, key)}" for key, then in batch.items())]
        )
        remedy = (
            "to keep one order, give a run its final trainer.max_steps (or train_samples) from the start"
            if changed
            else f"to keep the checkpoint's order, resume with its {' '.join(_overrides(batch))}"
        )
    elif "global_batch_size" in saved:
        cause, remedy = DATA_CHANGED, "resume with the data settings the run had to keep its order"
    else:  # a checkpoint from before the batch was recorded
        cause = f"{DATA_CHANGED}, {BATCH_UNRECORDED}"
        remedy = "resume with the global batch, ramp and data settings the run had to keep its order"
    warnings = []
    if saved.get("consumed") == consumed and _differs(saved.get("next"), train, consumed):
        train_cause, train_remedy = _resized(
            saved, cfg, built_for, consumed, cause if changed or batch else None
        )
        warnings.append(
            f"warning: the train samples from {consumed} on are not the ones the checkpoint's run would "
            f"have read next: {train_cause or cause}, and the train split's shuffle, which spans the epochs a"
            " run asks for (as Megatron's), came out in a new order; training goes on in it, so samples"
            f" already trained on may come again and others be left out this epoch; {train_remedy or remedy}"
        )
    if valid is not None and _differs(saved.get("valid"), valid, 0):
        warnings.append(
            f"warning: validation now evaluates other samples than the checkpoint's run did: {cause}, and "
            "the validation split's shuffle, which spans the epochs of every validation a run asks for (as "
            "Megatron's), came out in a new order; validation losses before and after this resume are not "
            f"comparable; {remedy}"
        )
    return warnings


def _resized(
    saved: dict, cfg: Any, built_for: int | None, consumed: int, keys: str | None
) -> tuple[str | None, str | None]:
    """(cause, remedy) of the train warning where the checkpoint's split was built for another count
    than this run's, as recorded or, for a record without the count and no key changed, by gptrain's
    rule before 2026-11-30 (max(train_samples, what max_steps read) under a ramp, counted with this
    run's ramp); (None, None) for the caller's own. `keys`: the changed keys, as the caller names them.

    trainer.train_samples=<then> is offered only where it keeps the order: it is not the value set,
    and the steps read no more than it (a split holding fewer is built for what they read)."""
    trainer, read = cfg.trainer, train_samples_read(cfg)
    if "train_built_for" in saved:  # None: a split this gptrain could not size, nothing to compare
        then, before = saved["train_built_for"], False
    elif trainer.train_samples is not None and read is not None and keys is None:
        then, before = max(trainer.train_samples, read), True
    else:
        return None, None
    if built_for is None or then is None or then == built_for:
        return None, None
    counts = f"the checkpoint's run built the train split for {then:,} samples and this one for {built_for:,}"
    if keys is None and not before:  # the same keys and count rule: the data, or a key not recorded
        if "global_batch_size" in saved:
            return f"{counts} with the same trainer settings and global batch: {DATA_CHANGED}", None
        return (
            f"{counts} with the same trainer settings: {DATA_CHANGED}, {BATCH_UNRECORDED}",
            "resume with the global batch, ramp and data settings the run had to keep its order",
        )
    if keys is not None:
        cause = f"{keys}: {counts}"
    else:
        cause = (
            f"gptrain before 2026-11-30 built the train split for the {then:,} samples"
            f" trainer.max_steps={trainer.max_steps} read under the batch ramp, and builds it for"
            f" trainer.train_samples={built_for:,} now, as Megatron does (no trainer setting changed)"
        )
    if then == trainer.train_samples or then < samples_max_steps_read(cfg):
        return cause, None
    megatron = " (Megatron's order)" if before else ""
    reads = f"from sample {consumed:,} on" if read is None else f"samples {consumed:,} to {read - 1:,}"
    return cause, (
        f"it reads {reads} of the split built for {built_for:,}{megatron}; to keep the checkpoint's order,"
        f" resume with trainer.train_samples={then} (which also sets the length of a weight-decay increment)"
    )


def _plain(value: Any) -> Any:
    """A key's value as the record keeps it: a list for a sequence (the config's ListConfig)."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def _overrides(values: dict) -> list[str]:
    """`model.<key>=<value>` as an override gives it (a list without spaces, null for None)."""

    def text(value: Any) -> str:
        if value is None:
            return "null"
        return f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)

    return [f"model.{key}={text(value)}" for key, value in values.items()]


def _differs(saved: str | None, samples: Sequence[Any], start: int) -> bool:
    return saved is not None and next_samples(samples, start) != saved
