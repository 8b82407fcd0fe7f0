"""Batch-size ramp-up as Megatron-LM does it (`--rampup-batch-size START INCREMENT SAMPLES`,
NeMo's `model.rampup_batch_size: [START, INCREMENT, SAMPLES]`).

The global batch starts at START and grows by INCREMENT each time another
SAMPLES / ((global_batch_size - START) / INCREMENT) samples have been consumed, until it reaches
model.global_batch_size (after SAMPLES samples). It is a pure function of the consumed samples,
so a resumed run continues the ramp exactly. Every batch of the ramp must split into whole
micro-batches on every data-parallel rank: START and INCREMENT are multiples of
micro_batch_size x data-parallel size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gptrain.errors import ConfigError

KEY = "model.rampup_batch_size"


@dataclass(frozen=True)
class BatchRamp:
    """The global batch size as a function of consumed samples (constant without a ramp)."""

    global_batch_size: int
    start: int | None = None
    increment: int = 0
    samples: int = 0

    @classmethod
    def from_config(cls, value: list[int] | None, global_batch_size: int, micro_times_dp: int) -> BatchRamp:
        if value is None:
            return cls(global_batch_size)
        if len(value) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value):
            raise ConfigError(f"{KEY}={value}: give three positive integers [start, increment, samples]")
        start, increment, samples = value
        if start > global_batch_size or (global_batch_size - start) % increment:
            raise ConfigError(
                f"{KEY}={value}: model.global_batch_size={global_batch_size} minus the start {start} must be a "
                f"non-negative multiple of the increment {increment}"
            )
        for name, size in (("start", start), ("increment", increment)):
            if size % micro_times_dp:
                raise ConfigError(
                    f"{KEY}={value}: the {name} {size} is not a multiple of model.micro_batch_size x "
                    f"data-parallel size = {micro_times_dp}, so a ramp batch would not split into micro-batches"
                )
        return cls(global_batch_size, start, increment, samples)

    def at(self, consumed_samples: int) -> int:
        """Global batch size of the step that starts after `consumed_samples` samples (Megatron's rule)."""
        if self.start is None or consumed_samples > self.samples or self.start == self.global_batch_size:
            return self.global_batch_size
        increments = (self.global_batch_size - self.start) // self.increment
        per_increment = self.samples / increments
        return self.start + int(consumed_samples / per_increment) * self.increment

    def samples_for(self, iterations: int, after: int = 0) -> int:
        """The samples `iterations` steps consume once `after` samples are (the ramp's smaller batches first)."""
        done, consumed = 0, after
        while done < iterations and self.start is not None and consumed <= self.samples:
            consumed += self.at(consumed)
            done += 1
        return consumed - after + (iterations - done) * self.global_batch_size

    def train_samples_for(self, iterations: int) -> int:
        """The --train-samples that trains exactly `iterations` steps under iterations_for's loop: that
        loop takes one more step while the samples consumed are within the ramp and the run, so a run
        ending inside (or at the end of) the ramp asks for one sample less than its steps consume."""
        consumed = self.samples_for(iterations)
        if self.start is not None and consumed <= self.samples:
            return consumed - 1
        return consumed

    def iterations_to_consume(self, samples: float) -> int:
        """The fewest iterations that consume at least `samples` samples (the ramp's smaller batches first)."""
        done = consumed = 0
        while consumed < samples and self.start is not None and consumed <= self.samples:
            consumed += self.at(consumed)
            done += 1
        return done + max(0, math.ceil((samples - consumed) / self.global_batch_size))

    def iterations_for(self, train_samples: int) -> int:
        """Megatron's iteration count for --train-samples under this ramp (a partial last batch dropped)."""
        iterations = consumed = 0
        while self.start is not None and consumed <= self.samples and consumed <= train_samples:
            consumed += self.at(consumed)
            iterations += 1
        if train_samples > consumed:
            iterations += (train_samples - consumed) // self.global_batch_size
        return iterations
