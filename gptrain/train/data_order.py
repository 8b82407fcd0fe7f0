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

PROBE_SAMPLES = 4
"""Samples compared: a new shuffle leaves four given samples in place with negligible chance."""


def next_samples(samples: Sequence[Any], consumed: int, count: int = PROBE_SAMPLES) -> str | None:
    """sha256 of the tokens of samples[consumed:consumed + count]; None when the split has fewer."""
    if consumed + count > len(samples):
        return None
    digest = hashlib.sha256()
    for index in range(consumed, consumed + count):
        digest.update(np.ascontiguousarray(samples[index], dtype=np.int64).tobytes())
    return digest.hexdigest()


def order_record(samples: Sequence[Any], consumed: int, max_steps: int, train_samples: int | None) -> dict:
    """What a checkpoint keeps to tell a changed order at resume: the next samples' digest and what
    sized the split."""
    return {
        "consumed": consumed,
        "next": next_samples(samples, consumed),
        "max_steps": max_steps,
        "train_samples": train_samples,
    }


def order_warning(
    saved: dict | None, samples: Sequence[Any], consumed: int, max_steps: int, train_samples: int | None
) -> str | None:
    """The warning line when the samples from `consumed` on are not the ones the saved run would have
    read next; None when they are, or when the checkpoint cannot tell (saved before this record, at
    the end of its split, or at another position)."""
    if not isinstance(saved, dict) or saved.get("consumed") != consumed or saved.get("next") is None:
        return None
    if next_samples(samples, consumed) == saved["next"]:
        return None
    changed = [
        f"trainer.{key} {saved.get(key)} -> {now}"
        for key, now in (("max_steps", max_steps), ("train_samples", train_samples))
        if saved.get(key) != now
    ]
    if changed:
        cause = ", ".join(changed)
        remedy = "to keep one order, give a run its final trainer.max_steps (or train_samples) from the start"
    else:
        cause = "the data settings changed (data_prefix, splits_string, seq_length or seed)"
        remedy = "resume with the data settings the run had to keep its order"
    return (
        f"warning: the train samples from {consumed} on are not the ones the checkpoint's run would "
        f"have read next: {cause}, and the train split's shuffle, which spans the epochs a run asks for "
        "(as Megatron's), came out in a new order; training goes on in it, so samples already trained "
        f"on may come again and others be left out this epoch; {remedy}"
    )
