"""The time left of a Megatron-LM run under a batch-size ramp (`--rampup-batch-size`), for `gptrain
status`: by the samples left along the ramp, not the steps left.

Steps left x ms/iteration assumes every step left takes as long as the last; during a ramp the
later steps carry more samples (up to global_batch_size from the ramp's start) and take longer.
The ramp is read from the arguments block Megatron prints at its start; the iteration line gives
the consumed samples and the batch its time per iteration was measured at. Torch-free (login nodes).
"""

from __future__ import annotations

import re
from pathlib import Path

from gptrain.train.rampup import BatchRamp

ARGUMENTS_START = re.compile(r"-{8,} arguments -{8,}")
ARGUMENTS_END = re.compile(r"-{8,} end of arguments -{8,}")
ARGUMENT = re.compile(r"(?P<name>\w+) \.{2,} (?P<value>.*?)\s*$")  # `  train_iters ....... 5000`
# the block comes before the first step; a log without one is not read to its end for it
HEAD_LINES = 10_000
CONSUMED = re.compile(r"consumed samples:\s*(\d+) \|")
BATCH = re.compile(r"global batch size:\s*(\d+) \|")


def ramp_eta(log: Path, line: str, step: int, total: int, ms: float) -> float | None:
    """Seconds left for the run whose last iteration line is `line` (`step`/`total` at `ms` per
    iteration), or None where the log tells no ramp (the steps' estimate is right then)."""
    consumed, batch = CONSUMED.search(line), BATCH.search(line)
    if consumed is None or batch is None or int(batch[1]) == 0:
        return None
    found = ramp_of(arguments_block(log))
    if found is None:
        return None
    ramp, train_samples = found
    done = int(consumed[1])
    left = train_samples - done if train_samples is not None else ramp.samples_for(total - step, after=done)
    return max(0, left) * ms / int(batch[1]) / 1000  # the time per sample of the last step's batch


def arguments_block(log: Path) -> dict[str, str]:
    """The first `---- arguments ----` block of the log, name -> value as printed; {} without one."""
    values: dict[str, str] = {}
    inside = False
    try:
        with log.open(errors="replace") as lines:
            for number, text in enumerate(lines):
                if number >= HEAD_LINES or (inside and ARGUMENTS_END.search(text)):
                    break
                if not inside:
                    inside = ARGUMENTS_START.search(text) is not None
                elif found := ARGUMENT.search(text):
                    values[found["name"]] = found["value"]
    except OSError:
        return {}
    return values


def ramp_of(arguments: dict[str, str]) -> tuple[BatchRamp, int | None] | None:
    """The ramp (`rampup_batch_size ... ['32', '32', '2000000']`) and train_samples (None where the
    run is given in iterations), or None where the block gives no ramp Megatron would run."""
    numbers = re.findall(r"\d+", arguments.get("rampup_batch_size", ""))
    full = arguments.get("global_batch_size", "")
    if len(numbers) != 3 or not full.isdigit():
        return None
    start, increment, samples = (int(n) for n in numbers)
    if min(start, increment, samples) <= 0 or start > int(full) or (int(full) - start) % increment:
        return None
    train_samples = arguments.get("train_samples", "")
    return BatchRamp(int(full), start, increment, samples), int(
        train_samples
    ) if train_samples.isdigit() else None
