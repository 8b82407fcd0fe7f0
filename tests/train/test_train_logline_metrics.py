import re
from datetime import datetime

import pytest

from gptrain.train.logline import IterationLog, format_iteration_line, format_suffix, format_validation_lines
from gptrain.train.metrics import mfu, tflops_per_gpu, tokens_per_second

NOW = datetime(2026, 11, 21, 23, 5, 7, 123456)


def sample_log(**changes):
    values = dict(
        iteration=10,
        train_iters=500,
        consumed_samples=2560,
        elapsed_ms_per_iteration=1234.56,
        throughput_tflops=123.456,
        learning_rate=6e-4,
        global_batch_size=256,
        lm_loss=7.123456789,
        loss_scale=1.0,
        grad_norm=1.23456,
        skipped_iterations=0,
        nan_iterations=2,
    )
    values.update(changes)
    return IterationLog(**values)


def test_iteration_line_exact_string():
    expected = (
        " [2026-11-21 23:05:07.123456] iteration       10/     500 | consumed samples:         2560 |"
        " elapsed time per iteration (ms): 1234.6 | throughput per GPU (TFLOP/s/GPU): 123.5 |"
        " learning rate: 6.000000E-04 | global batch size:   256 | lm loss: 7.123457E+00 |"
        " loss scale: 1.0 | grad norm: 1.235 | number of skipped iterations:   0 |"
        " number of nan iterations:   2 |"
    )
    assert format_iteration_line(sample_log(), NOW) == expected


def test_optional_fields_follow_megatron_rules():
    line = format_iteration_line(
        sample_log(
            skipped_samples=3, throughput_tflops=None, grad_norm=None, lm_loss=None, loss_scale=65536.0
        ),
        NOW,
    )
    assert " consumed samples:         2560 | skipped samples:            3 | elapsed" in line
    assert "throughput" not in line and "grad norm" not in line and "lm loss" not in line
    assert " loss scale: 65536.0 |" in line


def test_iteration_line_regex_for_log_parsers():
    pattern = re.compile(
        r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration +(\d+)/ *(\d+) \| consumed samples: +(\d+) \|"
        r" elapsed time per iteration \(ms\): ([\d.]+) \| throughput per GPU \(TFLOP/s/GPU\): ([\d.]+) \|"
        r" learning rate: ([\d.E+-]+) \| global batch size: +(\d+) \| lm loss: ([\d.E+-]+) \|"
        r" loss scale: ([\d.]+) \| grad norm: ([\d.]+) \| number of skipped iterations: +(\d+) \|"
        r" number of nan iterations: +(\d+) \|$"
    )
    match = pattern.match(format_iteration_line(sample_log(iteration=12345678, train_iters=99999999)))
    assert match and match.group(1) == "12345678" and float(match.group(8)) == pytest.approx(7.123457)


def test_suffix_and_validation_block():
    assert format_suffix(0.4123, 3723.9) == " MFU: 41.2% | ETA 01:02:03 |"
    assert format_suffix(None, None) == ""
    dashes, text, dashes2 = format_validation_lines(100, 2.0)
    assert (
        text
        == " validation loss at iteration 100 | lm loss value: 2.000000E+00 | lm loss PPL: 7.389056E+00 | "
    )
    assert dashes == dashes2 == "-" * (len(text) + 1)
    assert "PPL: 4.851652E+08" in format_validation_lines(1, 25.0)[1]  # exp capped at 20 as Megatron
    test_line = format_validation_lines(6, 1.0, " on test set")[1]
    assert test_line.startswith(" validation loss at iteration 6 on test set | lm loss value: 1.000000E+00 |")


def test_throughput_formula():
    # GPT-3 126M style: B=256, s=2048, L=12, h=768, V=50304, MHA, f=4h (section 11 closed form)
    b, s, layers, h, v = 256, 2048, 12, 768, 50304
    flops = 72 * b * s * layers * h**2 * (1 + s / (12 * h) + v / (12 * layers * h))
    seconds, world = 2.5, 8
    assert tflops_per_gpu(flops, seconds, world) == pytest.approx(flops / (seconds * 1e12 * world))
    assert tflops_per_gpu(flops, seconds, world) == pytest.approx(22.404, abs=0.001)
    assert tokens_per_second(b, s, seconds) == pytest.approx(209715.2)
    assert mfu(494.5, 989.0) == pytest.approx(0.5) and mfu(1.0, None) is None


def test_saves_and_validation_inside_an_interval_are_not_iteration_time(monkeypatch):
    """Megatron stops its interval timer around checkpoints and evaluation: a save must not
    make the iteration line report a slow step (the ETA counts it at its share of the run's time)."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    meter = meter_module.IntervalMeter(started=clock[0])
    for _ in range(2):
        clock[0] += 1.0  # a step of 1 s
        meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
    with meter.excluded():
        clock[0] += 8.0  # a checkpoint save
    clock[0] += 1.0
    meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
    assert meter.seconds_per_iteration(clock[0]) == 1.0
    meter.reset(clock[0])
    clock[0] += 2.0
    meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
    assert meter.seconds_per_iteration(clock[0]) == 2.0  # the exclusion ended with its interval


def test_the_first_line_of_a_process_has_no_eta(monkeypatch):
    """The process's first step carries compilation and warm-up (25 s against 25 ms a step on an
    H100): an ETA from it is many times too long, so the first line has none; the next has one."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    shape = meter_module.RunShape(
        flops_per_iteration=1e12,
        peak_tflops=None,
        world_size=1,
        global_batch_size=1,
        seq_length=8,
        max_steps=100,
    )
    meter = meter_module.IntervalMeter(start_step=40, started=clock[0])  # resumed at step 40
    clock[0] += 25.0
    meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
    first = meter_module.interval_report(meter, 41, 41, shape).line
    assert "ETA" not in first and "elapsed time per iteration (ms): 25000.0" in first
    meter.reset(clock[0])
    for _ in range(9):
        clock[0] += 0.5
        meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
    assert meter_module.interval_report(meter, 50, 50, shape).line.endswith(" ETA 00:00:25 |")  # 50 x 0.5 s


def test_sample_counts_past_2_to_the_24_stay_exact_in_tensorboard(tmp_path, monkeypatch):
    """float32, TensorBoard's usual scalar, holds integers exactly only up to 2**24 (16.8M samples,
    passed within hours by any real run): the consumed-samples curves showed rounded counts. Counts
    are written as float64 and read back exactly, and the `vs samples` x axis is the exact count."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    from gptrain.train import meter as meter_module
    from gptrain.train.results import Scalars
    from gptrain.train.step import StepResult

    consumed, step = 2**24 + 3, 2**24 + 1  # neither is a float32
    shape = meter_module.RunShape(
        1e12, None, world_size=1, global_batch_size=1, seq_length=8, max_steps=2**25
    )
    meter = meter_module.IntervalMeter(start_step=step - 2)
    meter.add(StepResult(loss=2.5, updated=True), lr=1e-3, scale=1.0, batch=1)
    report = meter_module.interval_report(meter, step, consumed, shape)
    scalars = Scalars(tmp_path, enabled=True)
    scalars.add(report.by_step, step)
    scalars.add_vs_samples(report.vs_samples, consumed, step)
    scalars.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "scalars": 0}).Reload()

    def exact(tag: str) -> list[tuple[int, float]]:  # as TensorBoard reads either form
        if tag in events.Tags()["scalars"]:
            return [(e.step, e.value) for e in events.Scalars(tag)]
        return [(e.step, make_ndarray(e.tensor_proto).item()) for e in events.Tensors(tag)]

    assert exact("consumed samples") == exact("consumed_samples") == [(step, consumed)]
    assert exact("global_step") == [(step, step)]
    assert [(e.step, e.value) for e in events.Scalars("lm loss vs samples")] == [(consumed, 2.5)]
    assert [e.step for e in events.Scalars("lm loss")] == [step]  # the other series stay float32 scalars


def test_the_eta_counts_the_validations_and_saves_the_run_spends_its_time_on(monkeypatch):
    """The ETA was the steps left times the time per iteration, which leaves validation and saves
    out (as Megatron's rate does): a run validating for 10 s every 5 steps of 1 s was told a third of
    the time it took. It is now the steps left at the wall-clock pace since the first line."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    shape = meter_module.RunShape(1e12, None, world_size=1, global_batch_size=1, seq_length=8, max_steps=100)
    meter = meter_module.IntervalMeter(start_step=40, started=clock[0])
    clock[0] += 25.0  # the warm-up step
    meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
    assert "ETA" not in meter_module.interval_report(meter, 41, 41, shape).line
    lines = []
    for step in range(42, 52):
        clock[0] += 1.0
        meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0)
        if step % 5 == 0:
            lines.append(meter_module.interval_report(meter, step, step, shape).line)
            with meter.excluded():
                clock[0] += 10.0  # validation
    # at 45: 4 steps in 4 s; at 50: 9 steps in 9 s + 10 s of validation
    assert lines[0].endswith(" ETA 00:00:55 |") and "elapsed time per iteration (ms): 1000.0" in lines[0]
    assert lines[1].endswith(f" ETA 00:01:{int(50 * 19 / 9) - 60:02d} |")  # 50 steps x 19 s / 9
    assert "elapsed time per iteration (ms): 1000.0" in lines[1]


def test_megatrons_throughput_tag_is_the_lines_tflops_per_gpu(monkeypatch):
    """Megatron writes `throughput` (TFLOP/s/GPU, the line's number) beside `iteration-time`, by
    iteration only; gptrain wrote `iteration-time` but not it, so a Megatron dashboard's throughput
    panel stayed empty. 6e12 FLOPs a step, 2 s a step on 3 ranks: 1 TFLOP/s/GPU."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    shape = meter_module.RunShape(6e12, None, world_size=3, global_batch_size=4, seq_length=8, max_steps=10)
    meter = meter_module.IntervalMeter(started=clock[0])
    for _ in range(2):
        clock[0] += 2.0
        meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0, batch=4)
    report = meter_module.interval_report(meter, 2, 8, shape)
    assert "throughput per GPU (TFLOP/s/GPU): 1.0 |" in report.line
    assert report.by_step["throughput"] == pytest.approx(1.0)
    assert report.by_step["iteration-time"] == pytest.approx(2.0)
    assert not any(tag.startswith(("throughput", "iteration-time")) for tag in report.vs_samples)
    # with trainer.tensorboard_log_interval the timing series stay with the line: this one too
    assert meter_module.timing_only(report.by_step)["throughput"] == pytest.approx(1.0)


@pytest.mark.parametrize("log_throughput", [False, True])
def test_the_throughput_field_is_in_the_line_only_where_asked_as_megatrons(log_throughput, monkeypatch):
    """Megatron prints `throughput per GPU (TFLOP/s/GPU)` only with --log-throughput: without it the
    learning rate follows the time per iteration. gptrain printed it always, so under `gptrain megatron`
    a parser that reads the line's fields by position read the throughput as the learning rate."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    shape = meter_module.RunShape(6e12, 2.0, 3, 4, 8, 10, log_throughput=log_throughput)
    meter = meter_module.IntervalMeter(started=clock[0])
    clock[0] += 2.0
    meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0, batch=4)
    line = meter_module.interval_report(meter, 1, 4, shape).line
    field = " throughput per GPU (TFLOP/s/GPU): 1.0 |" if log_throughput else ""
    assert f" elapsed time per iteration (ms): 2000.0 |{field} learning rate: 1.000000E-03 |" in line
    assert line.endswith(" number of nan iterations:   0 | MFU: 50.0% |")  # gptrain's, after Megatron's


def test_an_interval_of_skipped_iterations_prints_a_zero_loss_as_megatron(monkeypatch):
    """Megatron's training_log keeps a loss key once an iteration of the process has updated and
    prints its sum over max(1, advanced iterations): an interval made only of skipped iterations
    prints `lm loss: 0.000000E+00`. Before any update (fp16's first overflows) it has no key and no
    field. The dashboards get the mean of such an interval's own losses (0 is no loss; before, they got
    none, where Megatron writes a skipped iteration's loss to TensorBoard)."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    shape = meter_module.RunShape(
        flops_per_iteration=1e12,
        peak_tflops=None,
        world_size=1,
        global_batch_size=1,
        seq_length=8,
        max_steps=9,
    )
    meter = meter_module.IntervalMeter()

    def skipped(loss):  # an overflow of the gradients: the loss itself is finite
        return StepResult(loss=loss, updated=False, overflow=True)

    meter.add(skipped(3.0), lr=1e-3, scale=2.0**32)
    first = meter_module.interval_report(meter, 1, 1, shape)
    assert "lm loss" not in first.line and first.by_step["lm loss"] == 3.0
    meter.add(StepResult(loss=2.5, grad_norm=1.0, updated=True), lr=1e-3, scale=2.0**31)
    meter.add(skipped(3.0), lr=1e-3, scale=2.0**30)
    second = meter_module.interval_report(meter, 3, 3, shape)
    assert " lm loss: 2.500000E+00 | loss scale:" in second.line and second.by_step["lm loss"] == 2.5
    meter.add(skipped(3.0), lr=1e-3, scale=2.0**29)
    meter.add(skipped(4.5), lr=1e-3, scale=2.0**28)
    report = meter_module.interval_report(meter, 5, 5, shape)
    assert " global batch size:     1 | lm loss: 0.000000E+00 | loss scale: 268435456.0 |" in report.line
    assert " number of skipped iterations:   2 |" in report.line
    assert report.by_step["lm loss"] == report.vs_samples["lm loss vs samples"] == 3.75


def test_a_loss_of_zero_is_printed_as_megatron_prints_it():
    """Megatron prints every average that is >= 0.0, zero included."""
    line = format_iteration_line(sample_log(lm_loss=0.0), NOW)
    assert " global batch size:   256 | lm loss: 0.000000E+00 | loss scale: 1.0 |" in line


def test_the_eta_of_a_batch_ramp_up_counts_the_samples_left_not_the_steps(monkeypatch):
    """The ETA was the steps left times the mean time of the steps so far: during a batch ramp-up
    those are small-batch steps and the steps left are mostly full ones (GPT-3 175B's ramp printed
    3 hours left with 265 to go). It is now the samples left, walked along the ramp, at the time per
    sample so far. Ramp [2, 2, 12] to 8: batches 2, 2, 4, 6, then 8; a step takes 0.5 s a sample."""
    from gptrain.train import meter as meter_module
    from gptrain.train.rampup import BatchRamp
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    ramp = BatchRamp.from_config([2, 2, 12], 8, 2)
    shape = meter_module.RunShape(1e12, None, 1, global_batch_size=8, seq_length=8, max_steps=10, ramp=ramp)
    meter = meter_module.IntervalMeter(started=clock[0])
    consumed, lines = 0, []
    for step, batch in enumerate([2, 2, 4], start=1):
        clock[0] += 0.5 * batch
        consumed += batch
        meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0, batch=batch)
        if step in (1, 3):
            lines.append(meter_module.interval_report(meter, step, consumed, shape).line)
    assert "ETA" not in lines[0]  # the first line: the warm-up step alone
    # 7 steps left, of 6 + 8 x 6 = 54 samples, at (1 + 2) s / (2 + 4) samples since the first line
    assert lines[1].endswith(" ETA 00:00:27 |")


def test_a_ramp_up_step_is_charged_its_batchs_share_of_the_flops_and_tokens(monkeypatch):
    """A ramp-up step of half the global batch does half a full step's work: TFLOP/s, MFU and tokens/s
    count that half (no test failed with IntervalMeter.batch_share returning 1). Global batch 4, steps
    of 2 samples taking 2 s each, 6e12 FLOPs a full step on 3 ranks of a 2 TFLOP/s peak, sequence 8:
    3e12 / 2 s / 3 = 0.5 TFLOP/s/GPU, MFU 25%, 2 x 8 / 2 s = 8 tokens/s."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])
    shape = meter_module.RunShape(6e12, 2.0, world_size=3, global_batch_size=4, seq_length=8, max_steps=10)
    meter = meter_module.IntervalMeter(started=clock[0])
    for _ in range(2):
        clock[0] += 2.0
        meter.add(StepResult(loss=1.0, updated=True), lr=1e-3, scale=1.0, batch=2)
    report = meter_module.interval_report(meter, 2, 4, shape)
    assert "throughput per GPU (TFLOP/s/GPU): 0.5 |" in report.line and " MFU: 25.0% |" in report.line
    assert report.by_step["TFLOP/s/GPU"] == pytest.approx(0.5)
    assert report.by_step["throughput"] == pytest.approx(0.5)
    assert report.by_step["tokens per second"] == pytest.approx(8.0)


def test_the_first_line_of_a_process_does_not_end_its_loss_interval_as_megatrons(monkeypatch):
    """Megatron's first line of a process is a peek: its next line averages the loss and counts the
    skipped and nan iterations over every iteration since the process began. gptrain's reset them
    there, so the line after a resume averaged other iterations than Megatron's (iteration 8 alone
    where Megatron's averaged 7 and 8). Its time per iteration still leaves the warm-up out. A first
    line on the interval (log_every_n_steps=1) is an ordinary one: the next line is its iteration's."""
    from gptrain.train import meter as meter_module
    from gptrain.train.step import StepResult

    clock = [100.0]
    monkeypatch.setattr(meter_module.time, "perf_counter", lambda: clock[0])

    def lines(log_every, results):  # a process resumed at 4, its first step 25 s, the next 1 s each
        shape = meter_module.RunShape(1e12, None, 1, 1, 8, max_steps=100, log_every_n_steps=log_every)
        meter = meter_module.IntervalMeter(start_step=4, started=clock[0])
        printed = []
        for step, result in enumerate(results, start=5):
            clock[0] += 25.0 if step == 5 else 1.0
            meter.add(result, lr=1e-3, scale=1.0)
            if step == 5 or step % log_every == 0:
                printed.append(meter_module.interval_report(meter, step, step, shape))
        return printed

    def updated(loss):
        return StepResult(loss=loss, grad_norm=1.0, updated=True)

    first, second, third = lines(3, [updated(6.0), updated(3.0), updated(2.0), updated(2.0), updated(2.0)])
    assert " lm loss: 6.000000E+00 |" in first.line
    assert " elapsed time per iteration (ms): 1000.0 |" in second.line  # iteration 6 alone: 1 s
    assert " lm loss: 4.500000E+00 |" in second.line and second.by_step["lm loss"] == 4.5  # (6 + 3) / 2
    assert " lm loss: 2.000000E+00 |" in third.line  # the line at 6 ended its interval: 7 to 9
    # a first step skipped (an fp16 overflow at a resume): counted in the next line too, as Megatron's
    skipped = StepResult(loss=float("nan"), updated=False, nonfinite=True)
    first, second = lines(3, [skipped, updated(3.0)])
    assert " number of skipped iterations:   1 | number of nan iterations:   1 |" in first.line
    assert " number of skipped iterations:   1 | number of nan iterations:   1 |" in second.line
    first, second = lines(1, [updated(6.0), updated(3.0)])  # every line on the interval
    assert " lm loss: 3.000000E+00 |" in second.line
