"""What a checkpoint holds besides weights: counters, schedule, scaler and RNG streams.

Model and optimizer go through `torch.distributed.checkpoint.state_dict` so another
parallel layout can reshard them; the RNG streams are per rank and saved next to them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from gptrain.parallel.rng import describe_layout, streams_fit
from gptrain.parallel.state_dict import (
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
)
from gptrain.train.loss_scale import LossScaler
from gptrain.train.schedule import RECORDED_WHERE_SET, LRSchedule
from gptrain.train.weight_decay_schedule import recorded_weight_decay

PARTS = ("model", "optim", "schedule", "scaler", "train")


@dataclass
class TrainState:
    """Progress counters; `step` is the number of iterations run (skipped ones included).

    `validated_at`: the last iteration whose validation ran. A run stopped for a requeue on a
    validation step saves before validating; the resumed run sees the validation still due.
    """

    step: int = 0
    consumed_samples: int = 0
    skipped_iterations: int = 0
    nan_iterations: int = 0
    consecutive_nonfinite: int = 0
    validated_at: int = -1

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, int(value))


def rng_state() -> dict[str, Any]:
    """Every random stream a step can draw from (dropout, data workers, numpy, python)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        # this rank's device only: a requeued job may see fewer GPUs (srun's one per task). A run
        # that never touched CUDA (trainer.accelerator=cpu on a GPU host) drew nothing from it, and
        # reading it would create a CUDA context on GPU 0 for every rank.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def rank_state(layout: dict[str, Any]) -> dict[str, Any]:
    """This rank's file of a checkpoint: its streams and the layout that gave each rank its stream."""
    return {"rng": rng_state(), "rng_layout": layout}


def restore_rng_state(extra: dict[str, Any], layout: dict[str, Any], log: Callable[[str], None]) -> bool:
    """Put back the streams this rank read (`extra`: gptrain.checkpoint.rank_state.read_rank_state, the
    saved rank's of its (stage, tensor rank) coordinate) when they are this rank's, else log why not.

    Under other TP, PP or sequence-parallel settings (`gptrain.parallel.rng.stream_layout`) the saved
    rank at a coordinate is another stage's or tensor rank's stream, and tensor ranks that must share a
    stream could get different ones. They then keep the streams seeded for this layout. True when
    restored.
    """
    saved = extra.get("rng_layout")
    if "rng" not in extra and saved is None:
        return False
    if not streams_fit(saved, layout):
        log(
            f"random streams not restored: saved under {describe_layout(saved)}, this run has "
            f"{describe_layout(layout)}; dropout draws from the streams seeded for this layout"
        )
        return False
    if "rng" not in extra:  # its coordinate's rank file is missing (read_rank_state)
        log(
            "random streams not restored: the checkpoint has no rank file of this rank's (pipeline, "
            "tensor) position; dropout draws from the streams seeded for this layout"
        )
        return False
    set_rng_state(extra["rng"])
    return True


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list | tuple):  # older checkpoints: one state per GPU the rank saw
            index = torch.cuda.current_device()
            cuda = cuda[index] if index < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)


def parts_to_load(
    wanted: Collection[str], saved_keys: Collection[str], scaler: LossScaler, log: Callable[[str], None]
) -> set[str]:
    """The parts of `wanted` a checkpoint holding `saved_keys` ('scaler.scale', ...) can give.

    The loss scaler is left out, and so starts afresh, when the checkpoint's is of the other kind:
    trainer.precision or model.native_amp_static_scale changed between fp16's dynamic scale (with its
    trackers) and a constant one (bf16/fp32's 1.0, fp16's static scale). Neither kind's state means
    anything to the other; a constant scaler keeps its configured scale anyway.
    """
    parts = {part for part in wanted if any(key.startswith(f"{part}.") for key in saved_keys)}
    saved_scaler = {key.split(".", 1)[1] for key in saved_keys if key.startswith("scaler.")}
    if "scaler" in parts and saved_scaler != set(scaler.state_dict()):
        parts.discard("scaler")
        log(
            f"loss scaler reset: the checkpoint was saved with {_scaler_kind(saved_scaler)}, this run "
            f"(trainer.precision or model.native_amp_static_scale changed) uses "
            f"{_scaler_kind(set(scaler.state_dict()))}"
        )
    return parts


def _scaler_kind(keys: set[str]) -> str:
    if "growth_tracker" in keys:
        return "a dynamic loss scale (fp16)"
    return "a constant loss scale (bf16/fp32, or fp16's model.native_amp_static_scale)"


def checkpoint_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: LRSchedule,
    scaler: LossScaler,
    train: TrainState,
    parts: Collection[str] = PARTS,
    saved: Collection[str] | None = None,
) -> dict[str, Any]:
    """The DCP state dict (same keys on every rank; tensors may be sharded), or some `parts` of it.

    Only the parts asked for are built: building the optimizer's gives a fresh optimizer state
    (torch fills it by a step with zero gradients), which a run that does not load it must not have.
    `saved`: the keys of the checkpoint this state is to be loaded from (the optimizer's are laid
    out as it holds them: `gptrain.parallel.state_dict.optimizer_state_dict`); None: as saved now.
    """
    optim_keys = (
        None if saved is None else [key.removeprefix("optim.") for key in saved if key.startswith("optim.")]
    )
    build = {
        "model": lambda: model_state_dict(model),
        "optim": lambda: optimizer_state_dict(model, optimizer, optim_keys),
        "schedule": lambda: saved_values("schedule", _schedule_values(schedule, saved), saved),
        "scaler": scaler.state_dict,
        "train": lambda: saved_values("train", train.state_dict(), saved),
    }
    return {part: build[part]() for part in parts}


def _schedule_values(schedule: LRSchedule, saved: Collection[str] | None) -> dict[str, Any]:
    """The schedule's state, and to load into, a place for each setting of another schedule
    (RECORDED_WHERE_SET) that this config's lacks: the record a resume compares must be whole, or a
    WarmupStableDecay checkpoint resumed under another schedule is no schedule and its change unsaid."""
    values = schedule.state_dict()
    return values if saved is None else dict.fromkeys(RECORDED_WHERE_SET) | values


def saved_values(part: str, values: dict[str, Any], saved: Collection[str] | None) -> dict[str, Any]:
    """The values of `part` that a checkpoint with keys `saved` holds (all when None): one written
    before a counter (or the schedule's global batch) existed loads, and that value keeps its default."""
    if saved is None:
        return values
    return {key: value for key, value in values.items() if f"{part}.{key}" in saved}


def apply_checkpoint_state(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: LRSchedule,
    scaler: LossScaler,
    train: TrainState,
    log: Callable[[str], None] | None = None,
) -> None:
    """Put a loaded DCP state dict back into the live objects: the parts it has (`log`: told of the
    optimizer settings the checkpoint lacks or holds otherwise than the config, which applies).

    Starting from another run's checkpoint may take only some parts; a weights-only checkpoint
    (`gptrain import`) has only "model", and the optimizer, schedule, loss scale and counters
    then stay as built, so training continues from those weights afresh.
    """
    load_model_state_dict(model, state["model"])
    if "optim" in state:
        notes = load_optimizer_state_dict(model, optimizer, state["optim"])
        # the schedule sets an increment's at every step, as the rate; with a record, the weight decay's
        # changes are its own line at the resume (resuming.log_schedule_change)
        if schedule.weight_decay is not None or recorded_weight_decay(state.get("schedule", {})) is not None:
            notes = [note for note in notes if not note.startswith("weight_decay ")]
        if notes and log is not None:
            log(f"optimizer settings from this run's config, not the checkpoint: {', '.join(notes)}")
    if "schedule" in state and (note := schedule.load_state_dict(state["schedule"])) and log is not None:
        log(note)
    if "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    if "train" in state:
        train.load_state_dict(state["train"])
