"""The live pieces of one run, which the training loop's functions share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gptrain.checkpoint.manager import CheckpointManager
from gptrain.config import TrainingConfig
from gptrain.parallel.mesh import World
from gptrain.train.loss_scale import LossScaler
from gptrain.train.rampup import BatchRamp
from gptrain.train.results import RunLog, Scalars
from gptrain.train.schedule import LRSchedule, ScheduleSpec
from gptrain.train.schedule_checks import ScheduleNames, names_in_config
from gptrain.train.state import TrainState
from gptrain.train.step import Batch, StepOptions, StepResult, train_step
from gptrain.train.watchdog import Watchdog

# Names the schedule's settings as the user gave them, at the start and at a resume (ScheduleNames).
ScheduleNaming = Callable[[TrainingConfig, ScheduleSpec], ScheduleNames]


@dataclass
class Session:
    """The live pieces of one run (built by `train`, used by the loop functions)."""

    cfg: TrainingConfig
    world: World
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scaler: LossScaler
    step_opts: StepOptions
    checkpoints: CheckpointManager
    log: RunLog
    scalars: Scalars
    dp_rank: int = 0
    dp_size: int = 1
    logging_rank: bool = True
    flops_per_iteration: float = 0.0
    peak_tflops: float | None = None
    state: TrainState = field(default_factory=TrainState)
    step_fn: Callable[[list[Batch]], StepResult] | None = None
    watchdog: Watchdog = field(default_factory=lambda: Watchdog(0, 1, 0.0))  # disabled unless given
    train_split: Sequence[Any] | None = None
    """The train split's samples, in order (gptrain.train.data_order: its next samples are saved)."""
    train_built_for: int | None = None
    """The samples the train split was built for (its checkpoints record it: data_order)."""
    valid_split: Sequence[Any] | None = None
    """The validation split's samples, in order (its first ones are saved, as train_split's next)."""
    save_bytes: int | None = None
    """The largest rank's checkpoint state in bytes, for a save's hang allowance (saving.save_allowance)."""
    schedule_names: ScheduleNaming = names_in_config
    """`gptrain megatron` names its flags: in the start warnings and the line at a resume."""
    validation: tuple[int, float] | None = None
    """(iteration, loss) of this process's last validation: a save at that iteration records the loss
    in its COMPLETE (or, for a validation a stop left due, the checkpoint resumed from does), for
    retention by val_loss (gptrain.checkpoint.retention)."""
    memory_reported_at: int | None = None
    """The iteration of trainer.log_memory_interval's last memory report: the end's report, of the
    same iteration after a stop there, would print a second one."""

    activity: str | None = None
    """What the run is in, outside a training step ('while saving iteration 4's checkpoint'), for the
    line of a collective that fails in it (peer_loss); None: in the step after state.step."""

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """`activity` inside the block; left set when the block raises, for the line that reports it."""
        outer, self.activity = self.activity, what
        yield
        self.activity = outer

    def __post_init__(self) -> None:
        if self.step_fn is None:
            self.step_fn = lambda mbs: train_step(
                self.model, self.optimizer, mbs, self.scaler, self.device, self.step_opts
            )

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step at the full global batch (evaluation always uses it)."""
        m = self.cfg.model
        return m.global_batch_size // (m.micro_batch_size * self.dp_size)

    def batch_ramp(self) -> BatchRamp:
        """The global batch as a function of consumed samples (model.rampup_batch_size)."""
        m = self.cfg.model
        return BatchRamp.from_config(
            m.rampup_batch_size, m.global_batch_size, m.micro_batch_size * self.dp_size
        )

    def current_global_batch(self) -> int:
        """Global batch of the coming step (smaller during a batch-size ramp-up)."""
        return self.batch_ramp().at(self.state.consumed_samples)
