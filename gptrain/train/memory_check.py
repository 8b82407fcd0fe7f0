"""The planner's memory estimate of the run's own layout, against the GPU it runs on.

A layout that cannot fit (NeMo's 5b on 2 nodes with replicated AdamW state: 137 GiB per GPU of
80) fails with CUDA's out-of-memory traceback on one rank, minutes into the job. At start the
estimate is logged as a warning when it is above the GPU's memory, and an out-of-memory error
becomes one line with the estimate and the changes that shrink it (the sharded layout's
figure where the state is replicated).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gptrain.errors import GptrainError

GIB = float(2**30)


class TrainingOutOfMemoryError(GptrainError):
    """The device ran out of memory during training."""


def estimate_gib(
    cfg: Any, vocab_size: int, sharding: str | None = None, world_size: int | None = None
) -> tuple[float, str] | None:
    """(estimated peak GiB per GPU, its breakdown) of cfg's layout over `world_size` ranks (the
    config's by default), or of it with `sharding`; None where the planner cannot model it."""
    from gptrain.plan.memory import estimate_memory
    from gptrain.plan.spec import layout_from_config, workload_from_config

    try:
        layout = layout_from_config(cfg, world_size=world_size)
        if sharding is not None:
            layout = dataclasses.replace(layout, sharding=sharding, dp_shard=layout.dp)
        estimate = estimate_memory(workload_from_config(cfg, vocab_size), layout)
    except (GptrainError, KeyError, ValueError, ZeroDivisionError):
        return None
    parts = estimate.gib()
    shown = ", ".join(
        f"{name} {parts[name]:.1f}" for name in ("weights", "gradients", "optimizer", "activations", "logits")
    )
    return estimate.total / GIB, f"{layout.label()}: {shown} GiB"


def sharded_alternative(cfg: Any, vocab_size: int, world_size: int | None, replicated_gib: float) -> str:
    """The full_shard layout's estimate, where this run replicates its state over 2+ DP ranks."""
    if cfg.model.data_parallel_sharding != "ddp":
        return ""
    sharded = estimate_gib(cfg, vocab_size, "full_shard", world_size)
    if sharded is None or sharded[0] >= replicated_gib:
        return ""
    return f"; with model.data_parallel_sharding=full_shard (sharded weights, gradients and AdamW state) {sharded[0]:.1f} GiB"


def start_warning(cfg: Any, vocab_size: int, device_bytes: int, world_size: int | None = None) -> str | None:
    """A warning line when the estimate is above the device's memory, else None."""
    estimate = estimate_gib(cfg, vocab_size, world_size=world_size)
    if estimate is None or estimate[0] * GIB <= device_bytes:
        return None
    return (
        f"WARNING: the planner estimates {estimate[0]:.1f} GiB per GPU for this layout ({estimate[1]}), "
        f"above this GPU's {device_bytes / GIB:.1f} GiB: expect it to run out of memory"
        f"{sharded_alternative(cfg, vocab_size, world_size, estimate[0])}; `gptrain plan` ranks the layouts that fit"
    )


def out_of_memory(
    cfg: Any,
    vocab_size: int | None,
    rank: int,
    device_bytes: int | None,
    error: BaseException,
    world_size: int | None = None,
) -> TrainingOutOfMemoryError:
    """One line for an out-of-memory error during training: where, torch's first line, the estimate."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    estimate = estimate_gib(cfg, vocab_size, world_size=world_size) if vocab_size else None
    of = f" of {device_bytes / GIB:.1f} GiB" if device_bytes else ""
    planned = ""
    if estimate is not None and vocab_size:
        planned = f"; the planner estimates {estimate[0]:.1f} GiB per GPU ({estimate[1]})"
        planned += sharded_alternative(cfg, vocab_size, world_size, estimate[0])
    return TrainingOutOfMemoryError(
        f"out of memory on rank {rank}{of} ({first}){planned}; "
        "lower model.micro_batch_size, recompute activations (model.activations_checkpoint_granularity), "
        "or run `gptrain plan` for the layouts that fit"
    )
