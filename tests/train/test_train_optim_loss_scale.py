import numpy as np
import pytest
import torch
from torch import nn

from gptrain.train.loss_scale import ConstantLossScaler, DynamicLossScaler, build_loss_scaler
from gptrain.train.optim import build_optimizer, param_groups


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.frozen = nn.Linear(4, 4, bias=False)
        self.frozen.weight.requires_grad_(False)


def test_param_groups_exclude_biases_and_norms_from_decay():
    model = Tiny()
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert ids(decay) == {id(model.emb.weight), id(model.proj.weight)}
    assert ids(no_decay) == {id(model.proj.bias), id(model.norm.weight), id(model.norm.bias)}


def test_adamw_on_cpu_is_not_fused_and_decays_only_matrices():
    model = Tiny()
    optimizer = build_optimizer(model, "distributed_fused_adam", 1.0, 0.5, [0.9, 0.95], 1e-8, "cpu")
    assert optimizer.defaults["fused"] is False
    before_w, before_b = model.proj.weight.detach().clone(), model.proj.bias.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    optimizer.step()
    # zero gradients: Adam's update is 0, only decoupled decay moves weights: w * (1 - lr * wd)
    torch.testing.assert_close(model.proj.weight, before_w * 0.5)
    torch.testing.assert_close(model.proj.bias, before_b)


def test_dynamic_scaler_hysteresis_backoff_and_growth():
    scaler = DynamicLossScaler(scale=2.0**16, growth_interval=3, hysteresis=2)
    scaler.update(found_inf=True)
    assert scaler.scale == 2.0**16  # first overflow absorbed by hysteresis
    scaler.update(found_inf=True)
    assert scaler.scale == 2.0**15
    scaler.update(found_inf=True)  # hysteresis not restored until a growth: halves again
    assert scaler.scale == 2.0**14
    for _ in range(2):
        scaler.update(found_inf=False)
    assert scaler.scale == 2.0**14
    scaler.update(found_inf=False)
    assert scaler.scale == 2.0**15 and scaler.hysteresis_tracker == 2
    restored = DynamicLossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()


def test_a_resume_with_a_shorter_growth_interval_still_grows_the_scale():
    """model.native_amp_growth_interval lowered on a resume (1000 -> 500) below the checkpoint's count
    of clean iterations (700): growth waited for the count to equal the interval, which it had passed,
    so the scale never grew again until an overflow reset the count (none comes at a too-small scale)."""
    saved = DynamicLossScaler(scale=2.0**10, growth_interval=1000)
    for _ in range(700):
        saved.update(found_inf=False)
    resumed = DynamicLossScaler(scale=2.0**32, growth_interval=500)
    resumed.load_state_dict(saved.state_dict())
    resumed.update(found_inf=False)
    assert resumed.scale == 2.0**11 and resumed.growth_tracker == 0
    for _ in range(500):
        resumed.update(found_inf=False)
    assert resumed.scale == 2.0**12  # then every 500 clean iterations, as configured


def test_scaler_min_scale_and_precision_choice():
    scaler = DynamicLossScaler(scale=2.0, hysteresis=1, min_scale=1.0)
    for _ in range(3):
        scaler.update(True)
    assert scaler.scale == 1.0
    assert isinstance(build_loss_scaler("bf16", 2.0**32, 1000, 2), ConstantLossScaler)
    fp16 = build_loss_scaler("16", 2.0**32, 1000, 2)
    assert fp16.scale == 2.0**32 and fp16.growth_interval == 1000


def test_an_overflow_with_the_scale_at_its_floor_counts_as_non_finite():
    """Backing off can no longer help there: without counting, a diverged fp16 run would skip
    every step for the rest of its allocation instead of stopping after max_consecutive_nonfinite."""
    from gptrain.train.step import StepOptions, step_outcome

    options = StepOptions(precision="16")
    above = DynamicLossScaler(scale=4.0, min_scale=1.0, hysteresis=1)
    result = step_outcome(above, options, loss=2.0, tokens=8, norm=float("inf"))
    assert result.overflow and not result.nonfinite and above.scale == 2.0
    floor = DynamicLossScaler(scale=1.0, min_scale=1.0, hysteresis=1)
    result = step_outcome(floor, options, loss=2.0, tokens=8, norm=float("nan"))
    assert result.overflow and result.nonfinite and not result.updated and floor.scale == 1.0
    assert step_outcome(floor, options, loss=2.0, tokens=8, norm=3.0).updated


def test_an_overflow_under_a_static_scale_counts_as_non_finite():
    """A static scale cannot back off: an overflow is skipped and counted towards
    trainer.max_consecutive_nonfinite, else a run whose gradients keep overflowing skips forever."""
    from gptrain.train.step import StepOptions, step_outcome

    static = build_loss_scaler("16", 2.0**12, 1000, 2, static=True)
    assert isinstance(static, ConstantLossScaler) and static.scale == 2.0**12
    result = step_outcome(static, StepOptions(precision="16"), loss=2.0, tokens=8, norm=float("inf"))
    assert result.overflow and result.nonfinite and not result.updated and static.scale == 2.0**12


def test_the_checkpointed_run_total_of_nan_iterations_counts_what_the_line_counts():
    """TrainState.nan_iterations, the run's total saved in each checkpoint's "train" state, still counted
    an fp16 overflow the scaler cannot back off from (a finite loss), which the iteration line no longer
    counts as a nan iteration (Megatron's: a skipped iteration whose loss is inf or nan)."""
    from types import SimpleNamespace

    from gptrain.train.meter import IntervalMeter
    from gptrain.train.state import TrainState
    from gptrain.train.step import StepOptions, step_outcome
    from gptrain.train.step_loop import record

    fp16, bf16 = StepOptions(precision="16"), StepOptions(precision="bf16")
    static = build_loss_scaler("16", 2.0**12, 1000, 2, static=True)
    dynamic = DynamicLossScaler(scale=4.0, min_scale=1.0, hysteresis=1)
    results = [
        step_outcome(static, fp16, loss=float("nan"), tokens=8, norm=1.0),  # a nan loss
        step_outcome(
            static, fp16, loss=2.0, tokens=8, norm=float("inf")
        ),  # an overflow it cannot back off from
        step_outcome(dynamic, fp16, loss=2.0, tokens=8, norm=float("inf")),  # one it backs off from
        step_outcome(ConstantLossScaler(), bf16, loss=2.0, tokens=8, norm=float("inf")),  # inf gradients
        step_outcome(dynamic, fp16, loss=2.0, tokens=8, norm=3.0),
    ]
    s = SimpleNamespace(
        state=TrainState(),
        cfg=SimpleNamespace(model=SimpleNamespace(global_batch_size=8)),
        schedule=SimpleNamespace(advance=lambda fraction: None),
    )
    meter = IntervalMeter()
    for result in results:
        record(s, result)
        meter.add(result, lr=1e-4, scale=1.0)
    assert s.state.skipped_iterations == meter.skipped == 4
    assert s.state.nan_iterations == meter.nans == 2  # the nan loss and bf16's inf gradients
    assert s.state.consecutive_nonfinite == 0 and s.state.step == 5


def test_a_constant_scale_keeps_the_configured_value_over_the_checkpoints():
    """As Megatron's ConstantGradScaler: the config's scale applies on resume, not the saved one (a
    bf16 checkpoint's 1.0, or the static scale the run had before the config changed it)."""
    static = build_loss_scaler("16", 2.0**12, 1000, 2, static=True)
    static.load_state_dict({"scale": 1.0})
    assert static.scale == 2.0**12 and static.state_dict() == {"scale": 2.0**12}


class MegatronDynamicGradScaler:
    """Megatron's DynamicGradScaler.update restated (its scale a one-element float tensor, here float64):
    the hysteresis tracker is reset only by a growth and goes below zero in an overflow streak, each
    overflow then halving the scale down to min_scale; growth when the clean count equals the interval."""

    def __init__(self, scale, min_scale, growth_interval, hysteresis):
        self.scale, self.min_scale = np.float64(scale), np.float64(min_scale)
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self.growth_tracker, self.hysteresis_tracker = 0, hysteresis

    def update(self, found_inf):
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * np.float64(0.5), self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = self.scale * np.float64(2.0)


@pytest.mark.parametrize("seed", range(6))
def test_the_dynamic_scaler_follows_megatrons_over_long_random_overflow_runs_and_resumes(seed):
    """20,000 iterations of overflow bursts and clean stretches, resumed from state_dict at random
    iterations: scale and both trackers equal Megatron's at every iteration (a power of two: exact)."""
    rng = np.random.default_rng(seed)
    settings = {
        "min_scale": float(2.0 ** rng.integers(0, 4)),
        "growth_interval": int(rng.integers(1, 40)),
        "hysteresis": int(rng.integers(1, 5)),
    }
    start = float(2.0 ** rng.integers(4, 33))
    megatron = MegatronDynamicGradScaler(start, **settings)
    ours = DynamicLossScaler(scale=start, **settings)
    overflowing, resumes, seen = False, 0, set()
    for _ in range(20_000):
        if rng.random() < 0.02:  # a burst starts or ends: streaks long enough to reach min_scale
            overflowing = not overflowing
        found_inf = overflowing or rng.random() < 0.05
        before = ours.scale
        megatron.update(found_inf)
        ours.update(found_inf)
        if rng.random() < 0.01:  # a requeue: a fresh scaler (its configured start) loads the checkpoint's
            resumed = DynamicLossScaler(scale=2.0**32, **settings)
            resumed.load_state_dict({key: float(value) for key, value in ours.state_dict().items()})
            ours, resumes = resumed, resumes + 1
        assert (ours.scale, ours.growth_tracker, ours.hysteresis_tracker) == (
            megatron.scale,
            megatron.growth_tracker,
            megatron.hysteresis_tracker,
        )
        seen |= {"floor"} if ours.scale == settings["min_scale"] else set()
        seen |= {"below zero"} if ours.hysteresis_tracker < 0 else set()
        seen |= {"grown"} if ours.scale > before else set()
    assert resumes > 100 and seen == {"floor", "below zero", "grown"}  # every branch, many resumes
