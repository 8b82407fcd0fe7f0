"""`gptrain status` on a Megatron-LM log under a batch-size ramp: the ETA by the samples left."""

import math

from gptrain.launch import status
from gptrain.utils.progress import format_duration

ARGUMENTS = """------------------------ arguments ------------------------
  global_batch_size ............................... 1024
  micro_batch_size ................................ 4
  rampup_batch_size ............................... ['32', '32', '200000']
  train_iters ..................................... 5000
  train_samples ................................... None
-------------------- end of arguments ---------------------
"""


def line(step: int, consumed: int, batch: int, ms: float = 800.0) -> str:
    return (
        f" [2026-11-30 05:00:00] iteration {step:8d}/    5000 | consumed samples: {consumed:12d} |"
        f" elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 |"
        f" global batch size: {batch:5d} | lm loss: 3.211000E+00 | loss scale: 1.0 |"
        " number of skipped iterations:   0 | number of nan iterations:   0 |"
    )


def samples_left_reference(steps: int, consumed: int) -> int:
    """Megatron's ramp, written out: the batch grows by 32 from 32 each 2e5 / ((1024 - 32) / 32)
    samples until 2e5 are consumed, then stays at 1024."""
    per_increment = 200_000 / 31
    total = 0
    for _ in range(steps):
        batch = 1024 if consumed > 200_000 else min(1024, 32 + 32 * math.floor(consumed / per_increment))
        total += batch
        consumed += batch
    return total


def test_a_megatron_log_under_a_ramp_estimates_by_the_samples_left(tmp_path):
    """The ETA was (5000 - 101) steps x 0.8 s = 1:05:19, as if every step left carried the 32
    samples of the ramp's first batch; the later ones carry up to 1024, and take longer."""
    log = tmp_path / "train.log"
    log.write_text(ARGUMENTS + line(100, 3200, 32) + "\n" + line(101, 3232, 32) + "\n")
    eta = samples_left_reference(5000 - 101, 3232) * 0.8 / 32
    assert eta > 10 * (5000 - 101) * 0.8  # the steps' estimate is that far off
    assert status.progress(log) == f"step 101/5000 | loss 3.2110 | 800 ms/step | ETA {format_duration(eta)}"


def test_without_a_ramp_or_its_arguments_the_estimate_stays_by_steps(tmp_path):
    log = tmp_path / "train.log"
    steps = (5000 - 101) * 0.8
    log.write_text(line(100, 3200, 32) + "\n" + line(101, 3232, 32) + "\n")  # no arguments block
    assert status.progress(log).endswith(f"| ETA {format_duration(steps)}")
    no_ramp = ARGUMENTS.replace("['32', '32', '200000']", "None")
    log.write_text(no_ramp + line(100, 3200, 32) + "\n" + line(101, 3232, 32) + "\n")
    assert status.progress(log).endswith(f"| ETA {format_duration(steps)}")


def test_a_ramp_run_by_train_samples_estimates_by_those_left(tmp_path):
    """--train-samples (train_iters None in the block): the samples left are train_samples - consumed."""
    by_samples = ARGUMENTS.replace("5000\n", "None\n").replace(
        "train_samples ................................... None",
        "train_samples ................................... 4000000",
    )
    log = tmp_path / "train.log"
    log.write_text(by_samples + line(100, 3200, 32) + "\n" + line(101, 3232, 32) + "\n")
    eta = (4_000_000 - 3232) * 0.8 / 32
    assert status.progress(log).endswith(f"| ETA {format_duration(eta)}")
