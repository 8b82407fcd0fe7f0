"""Megatron's `--step-batch-size-schedule "THRESHOLD:BATCH ..."` as gptrain's batch ramp.

Megatron-LM replaced `--rampup-batch-size` with this flag in April 2026 (its 175B example carries
it). The global batch is BATCH from THRESHOLD consumed tokens on (samples: tokens // seq_length);
thresholds take the suffixes K, M, B and T. A schedule of equal batch increments at equal sample
intervals from 0 is exactly Megatron's linear ramp `[START, INCREMENT, LAST_THRESHOLD]`, which
gptrain runs; any other shape has no gptrain equivalent and is refused by name.
"""

from __future__ import annotations

from gptrain.errors import ConfigError

FLAG = "--step-batch-size-schedule"
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def parse_schedule(text: str, seq_length: int) -> list[tuple[int, int]]:
    """[(threshold in samples, global batch), ...] sorted, checked as Megatron checks them."""
    schedule = []
    for entry in text.replace(",", " ").split():
        threshold, sep, batch = entry.partition(":")
        if not sep:
            raise ConfigError(f"{FLAG} '{text}': the entry '{entry}' is not THRESHOLD:BATCH")
        schedule.append((_number(text, threshold) // seq_length, _number(text, batch)))
    schedule.sort()
    if not schedule or schedule[0][0] != 0:
        raise ConfigError(f"{FLAG} '{text}': the first entry must start at 0 (Megatron asserts it)")
    thresholds = [threshold for threshold, _ in schedule]
    if len(set(thresholds)) != len(thresholds) or any(batch <= 0 for _, batch in schedule):
        raise ConfigError(
            f"{FLAG} '{text}': give each threshold once (in tokens) and positive batch sizes, as Megatron asserts"
        )
    return schedule


def _number(text: str, word: str) -> int:
    word = word.strip().upper()
    scale = SUFFIXES.get(word[-1:], 1)
    try:
        return int(float(word[:-1] if scale > 1 else word) * scale)
    except ValueError:
        raise ConfigError(f"{FLAG} '{text}': '{word}' is not a number (suffixes K, M, B, T)") from None


def as_ramp(schedule: list[tuple[int, int]], text: str) -> list[int] | None:
    """[start, increment, samples] of the equal-step ramp the schedule is; None for one batch size."""
    if len(schedule) == 1:
        return None
    start, interval = schedule[0][1], schedule[1][0]
    increment = schedule[1][1] - start
    steps = [(k * interval, start + k * increment) for k in range(len(schedule))]
    if increment <= 0 or schedule != steps:
        raise ConfigError(
            f"{FLAG} '{text}': gptrain ramps the batch by equal increments at equal intervals from 0 "
            "(Megatron's --rampup-batch-size); use such a schedule, or --global-batch-size alone"
        )
    return [start, increment, schedule[-1][0]]


def iterations_for(schedule: list[tuple[int, int]], train_samples: int) -> int:
    """Megatron's iteration count for --train-samples under the schedule: steps until the consumed
    samples reach train_samples (a last partial batch counts, unlike --rampup-batch-size's)."""
    iterations = consumed = 0
    for k, (_, batch) in enumerate(schedule):
        end = min(schedule[k + 1][0] if k + 1 < len(schedule) else train_samples, train_samples)
        if consumed < end:
            steps = -(-(end - consumed) // batch)
            iterations += steps
            consumed += steps * batch
    return iterations
