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
    """[start, increment, samples] of the equal-step ramp the schedule is; None for one batch size.

    Equal steps in tokens are equal in samples only up to Megatron's flooring of each threshold
    (tokens // seq_length): at 4096 tokens a sample, 2.4B-token steps fall at 585,937, 1,171,875,
    1,757,812, ... samples. Thresholds within one sample of the ramp's are taken (`floored_steps`
    says whether any differs)."""
    if len(schedule) == 1:
        return None
    start, samples = schedule[0][1], schedule[-1][0]
    increment, intervals = schedule[1][1] - start, len(schedule) - 1
    equal_batches = all(batch == start + k * increment for k, (_, batch) in enumerate(schedule))
    near_thresholds = all(
        abs(threshold - k * samples / intervals) < 1 for k, (threshold, _) in enumerate(schedule)
    )
    if increment <= 0 or not (equal_batches and near_thresholds):
        shown = ", ".join(f"{threshold}:{batch}" for threshold, batch in schedule)
        raise ConfigError(
            f"{FLAG} '{text}' ({shown} in samples): gptrain ramps the batch by equal increments at equal "
            "intervals from 0 (Megatron's --rampup-batch-size); use such a schedule, or --global-batch-size alone"
        )
    return [start, increment, samples]


def floored_steps(schedule: list[tuple[int, int]]) -> bool:
    """Whether a threshold of the schedule lies a fraction of a sample before the ramp's (as_ramp)."""
    samples, intervals = schedule[-1][0], len(schedule) - 1
    return any(threshold != k * samples / intervals for k, (threshold, _) in enumerate(schedule))


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
