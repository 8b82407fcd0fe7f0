"""NeMo's other learning-rate schedules (nemo/core/optim/lr_scheduler.py): the rate at every step
against a float64 re-statement of NeMo's classes, hand-derived rates, a NeMo YAML that trains with
one, a resume that continues it exactly, and each bad setting refused in one line naming its key."""

import math
import re
from pathlib import Path

import pytest
from train_e2e_helpers import MOCK, TINY, log_lines, run_recording

from gptrain.config import load_training_config
from gptrain.config.loader import preset_path
from gptrain.config.validate import CHOICES
from gptrain.errors import ConfigError
from gptrain.train.schedule import SCHEDULES, LRSchedule, ScheduleSpec, lr_at, spec_from_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class NemoReference:
    """NeMo's scheduler of `name` built with these kwargs, its rate at last_epoch = step: each
    __init__ resolves warmup / hold as NeMo's does (a ratio is int(ratio x max_steps); a hold's
    `hold_steps` attribute is warmup + hold, or 0 without one), get_lr takes NeMo's branches in
    NeMo's order (warmup, hold, min_lr past max_steps, the class's _get_lr)."""

    HOLD = {
        "WarmupHoldPolicy",
        "PolynomialHoldDecayAnnealing",
        "WarmupHoldAnnealLinear",
        "WarmupHoldAnnealOneMinusSquareRoot",
        "NoamHoldAnnealing",
    }

    def __init__(self, name, lr, *, max_steps, min_lr=0.0, warmup_steps=None, warmup_ratio=None, **kw):
        assert not (warmup_steps is not None and warmup_ratio is not None)
        self.name, self.lr, self.min_lr, self.max_steps = name, lr, min_lr, max_steps
        self.warmup = warmup_steps if warmup_steps is not None else 0
        if warmup_ratio is not None:
            self.warmup = int(warmup_ratio * max_steps)
        hold_steps, hold_ratio = kw.pop("hold_steps", None), kw.pop("hold_ratio", None)
        self.hold = 0
        if hold_steps is not None:
            self.hold = hold_steps + self.warmup
        elif hold_ratio is not None:
            self.hold = int(hold_ratio * max_steps) + self.warmup
        self.d_model = kw.pop("d_model", None)
        self.power, self.cycle = kw.pop("power", 1.0), kw.pop("cycle", False)
        self.decay_rate = kw.pop("decay_rate", 0.5)
        assert not kw, kw

    def lr_at(self, step):
        if self.name == "NoamAnnealing":
            return self.noam(step)
        if step <= self.warmup and self.warmup > 0:
            return self.lr * (step + 1) / (self.warmup + 1)
        if self.name in self.HOLD and step >= self.warmup and step < self.hold:
            return self.lr
        if step > self.max_steps:
            return self.min_lr
        return self.get_lr(step)

    def get_lr(self, step):
        lr, low, top, w, h = self.lr, self.min_lr, self.max_steps, self.warmup, self.hold
        name = self.name
        if name in ("WarmupPolicy", "WarmupHoldPolicy"):
            return lr
        if name == "WarmupAnnealing":
            return low + (1 - (step - w) / (top - w)) * (lr - low)
        if name == "SquareAnnealing":
            return max(lr * (((top - w) - (step - w)) / (top - w)) ** 2, low)
        if name == "SquareRootAnnealing":
            return max(lr * ((top - step) / top) ** 0.5, low)
        if name == "InverseSquareRootAnnealing":
            return lr / ((step + 1) / (w + 1)) ** 0.5
        if name == "PolynomialDecayAnnealing":
            return self.poly(step - w, top - w)
        if name == "PolynomialHoldDecayAnnealing":
            return self.poly(step - h, top - max(w, h))
        if name == "WarmupHoldAnnealLinear":
            return lr - (lr - low) * (step - h) / (top - h)
        if name == "WarmupHoldAnnealOneMinusSquareRoot":
            return max(low, lr * (1 - ((step - h) / (top - h)) ** 0.5))
        assert name == "NoamHoldAnnealing"
        hold_only = h - w if h > 0 else 0
        return max(lr * max(1, w**self.decay_rate) / max(1, (step - hold_only) ** self.decay_rate), low)

    def poly(self, step, decay_steps):
        if self.cycle:
            decay_steps *= 1.0 if step == 0 else math.ceil(step / decay_steps)
        else:
            step = min(step, decay_steps)
        return (self.lr - self.min_lr) * math.pow(1.0 - step / decay_steps, self.power) + self.min_lr

    def noam(self, last_epoch):
        step = max(1, last_epoch)
        norm = self.d_model ** (-0.5)
        if self.warmup > 0:
            mult = norm * min(step ** (-0.5), step * (self.warmup ** (-1.5)))
        else:
            mult = norm * step ** (-0.5)
        out = self.lr * mult
        return max(out, self.min_lr) if step > self.warmup else out


def spec_of(name, lr, *, max_steps, min_lr=0.0, warmup_steps=None, warmup_ratio=None, hold_ratio=None, **kw):
    """The ScheduleSpec of the same settings (ratios resolved as spec_from_config does)."""
    warmup = int(warmup_ratio * max_steps) if warmup_ratio is not None else (warmup_steps or 0)
    if hold_ratio is not None:
        kw["hold_steps"] = int(hold_ratio * max_steps)
    return ScheduleSpec(name, lr, min_lr, max_steps, warmup_steps=warmup, **kw)


HOLDS = [{}, {"hold_steps": 0}, {"hold_steps": 3}, {"hold_ratio": 0.3}, {"hold_steps": 30}]
CASES = {
    "WarmupPolicy": [{}],
    "WarmupHoldPolicy": HOLDS,
    "WarmupAnnealing": [{}],
    "SquareAnnealing": [{}],
    "SquareRootAnnealing": [{}],
    "InverseSquareRootAnnealing": [{}],
    "PolynomialDecayAnnealing": [{}, {"power": 2.0}, {"power": 0.5, "cycle": True}],
    "PolynomialHoldDecayAnnealing": [*HOLDS, {"hold_steps": 2, "power": 2.0}, {"power": 3.0, "cycle": True}],
    "WarmupHoldAnnealLinear": HOLDS,
    "WarmupHoldAnnealOneMinusSquareRoot": HOLDS,
    "NoamAnnealing": [{"d_model": 16}, {"d_model": 768}],
}
WARMUPS = [{"warmup_steps": 0}, {"warmup_steps": 4}, {"warmup_ratio": 0.25}, {"warmup_steps": None}]
PARAMS = [
    (name, extra | warmup, min_lr, max_steps)
    for name, extras in CASES.items()
    for extra in extras
    for warmup in WARMUPS
    for min_lr in (0.0, 1e-4)
    for max_steps in (10, 17)
] + [
    ("NoamHoldAnnealing", extra | warmup, min_lr, 17)
    for extra in [*HOLDS, {"decay_rate": 1.0}]
    for warmup in ({"warmup_steps": 4}, {"warmup_ratio": 0.25})
    for min_lr in (0.0, 1e-4)
]


@pytest.mark.parametrize("name, kwargs, min_lr, max_steps", PARAMS)
def test_each_nemo_schedule_is_nemos_at_every_step(name, kwargs, min_lr, max_steps):
    """Float64 on both sides through the same few operations in another order: within 1e-12."""
    reference = NemoReference(name, 1e-3, max_steps=max_steps, min_lr=min_lr, **kwargs)
    spec = spec_of(name, 1e-3, max_steps=max_steps, min_lr=min_lr, **kwargs)
    for step in range(max_steps + 40):
        expected = reference.lr_at(step)
        assert lr_at(step, spec) == pytest.approx(expected, rel=1e-12, abs=1e-18), step


def rates(spec, steps):
    return [lr_at(step, spec) for step in steps]


def test_hand_derived_rates_at_the_phase_ends():
    """lr 1, min_lr 0 unless said, max_steps 12, warmup 2 (step 0 runs at 1/3, step 2 at 1)."""
    warm = {"max_steps": 12, "warmup_steps": 2}
    assert rates(spec_of("WarmupPolicy", 1.0, min_lr=0.1, **warm), (0, 1, 2, 12, 13)) == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 1.0, 0.1]  # past max_steps: min_lr, even for the constant policy
    )
    hold = spec_of("WarmupHoldPolicy", 1.0, min_lr=0.1, hold_steps=3, **warm)
    assert rates(hold, (2, 4, 5, 12, 13)) == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.1])
    assert rates(spec_of("WarmupAnnealing", 1.0, **warm), (2, 7, 12, 13)) == pytest.approx([1, 0.5, 0, 0])
    square = spec_of("SquareAnnealing", 1.0, min_lr=0.01, **warm)
    assert rates(square, (7, 10, 12, 13)) == pytest.approx([0.25, 0.04, 0.01, 0.01])  # ((12-s)/10)**2
    root = spec_of("SquareRootAnnealing", 1.0, max_steps=16, warmup_steps=3)
    assert rates(root, (4, 12, 16, 17)) == pytest.approx([math.sqrt(0.75), 0.5, 0.0, 0.0])  # from step 0
    inverse = spec_of("InverseSquareRootAnnealing", 1.0, max_steps=16, warmup_steps=3, min_lr=0.01)
    assert rates(inverse, (3, 15, 16, 17)) == pytest.approx([1.0, 0.5, 2 / math.sqrt(17), 0.01])
    poly = spec_of("PolynomialDecayAnnealing", 1.0, power=2.0, **warm)
    assert rates(poly, (2, 7, 12)) == pytest.approx([1.0, 0.25, 0.0])
    poly_hold = spec_of("PolynomialHoldDecayAnnealing", 1.0, power=2.0, hold_steps=2, **warm)
    assert rates(poly_hold, (3, 4, 8, 12)) == pytest.approx([1.0, 1.0, 0.25, 0.0])  # over 12 - 4 steps
    linear_hold = spec_of("WarmupHoldAnnealLinear", 1.0, hold_steps=2, **warm)
    assert rates(linear_hold, (4, 8, 12, 13)) == pytest.approx([1.0, 0.5, 0.0, 0.0])
    noam = spec_of("NoamAnnealing", 1.0, max_steps=12, warmup_steps=4, d_model=16)
    assert rates(noam, (0, 1, 4, 16, 64)) == pytest.approx([1 / 32, 1 / 32, 1 / 8, 1 / 16, 1 / 32])
    noam_hold = spec_of("NoamHoldAnnealing", 1.0, max_steps=40, warmup_steps=4, hold_steps=2)
    assert rates(noam_hold, (4, 5, 6, 18, 41)) == pytest.approx([1.0, 1.0, 1.0, 0.5, 0.0])  # 2 / sqrt(16)


def test_the_config_accepts_every_schedule_this_module_computes():
    assert set(CHOICES["model.optim.sched.name"]) == set(SCHEDULES)


def nemo_yaml(tmp_path: Path, sched: str) -> Path:
    """The launcher's 126m file with its sched block replaced by `sched` (indented YAML lines)."""
    text = Path(preset_path("gpt3/126m")).read_text()
    old = "      name: CosineAnnealing\n      warmup_steps: 636\n      constant_steps: 100000\n      min_lr: 6e-05\n"
    assert old in text
    path = tmp_path / "126m_sched.yaml"
    path.write_text(text.replace(old, sched))
    return path


POLY_HOLD = (
    "      name: PolynomialHoldDecayAnnealing\n      warmup_steps: null\n      warmup_ratio: 0.2\n"
    "      hold_steps: 1\n      power: 2.0\n      cycle: false\n      min_lr: 1.0e-05\n"
)
TRAIN = [o for o in TINY if not o.startswith(("model.optim.sched.",))]


def logged_rates(run: Path) -> dict[int, float]:
    found = {}
    for line in log_lines(run):
        match = re.search(r"iteration +(\d+)/ *\d+ \|.* learning rate: (\S+) \|", line)
        if match:
            found[int(match.group(1))] = float(match.group(2))
    return found


def test_a_nemo_yaml_with_a_hold_schedule_trains_at_nemos_rates(tmp_path, monkeypatch):
    """Each iteration line prints the rate after its step (the next iteration's, as Megatron), to 7
    significant digits: NeMo's at last_epoch = iteration, within half a unit of the 7th digit."""
    run = tmp_path / "run"
    path = nemo_yaml(tmp_path, POLY_HOLD)
    cfg = load_training_config(
        config_file=str(path), overrides=[*TRAIN, *MOCK, f"exp_manager.explicit_log_dir={run}"]
    )
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    nemo = NemoReference(
        "PolynomialHoldDecayAnnealing",
        cfg.model.optim.lr,
        max_steps=6,
        min_lr=1e-5,
        warmup_ratio=0.2,
        hold_steps=1,
        power=2.0,
    )
    printed = logged_rates(run)
    assert sorted(printed) == [1, 2, 3, 4, 5, 6]
    for iteration, rate in printed.items():
        assert rate == pytest.approx(nemo.lr_at(iteration), rel=5e-7), iteration


def test_a_resumed_run_goes_on_with_the_same_rates_and_losses(tmp_path, monkeypatch):
    """A requeue at iteration 3 of a NoamAnnealing run: iterations 4 to 6 resumed have the rates
    and losses of the run that went through (the schedule is a function of the step)."""
    sched = ["model.optim.sched.name=NoamAnnealing", "model.optim.sched.warmup_steps=2"]
    sched += ["model.optim.sched.d_model=16", "model.optim.lr=1e-2", "model.optim.sched.constant_steps=0"]

    def config(run):
        return load_training_config(
            "gpt3/126m", [*TRAIN, *MOCK, *sched, f"exp_manager.explicit_log_dir={run}"]
        )

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    code, straight = run_recording(monkeypatch, config(whole))
    assert code == 0
    assert run_recording(monkeypatch, config(parts), signal_at=3)[0] != 0
    code, resumed = run_recording(monkeypatch, config(parts))
    assert code == 0 and sorted(resumed) == [4, 5, 6]
    assert {i: straight[i] for i in resumed} == resumed
    assert {i: r for i, r in logged_rates(parts).items() if i > 3} == {
        i: r for i, r in logged_rates(whole).items() if i > 3
    }


BAD = [
    (["model.optim.sched.name=WarmupAnnealing", "model.optim.sched.hold_steps=3"], "hold_steps=3"),
    (["model.optim.sched.name=SquareAnnealing", "model.optim.sched.hold_ratio=0.1"], "hold_ratio=0.1"),
    (["model.optim.sched.name=CosineAnnealing", "model.optim.sched.d_model=64"], "d_model=64"),
    (["model.optim.sched.name=WarmupHoldPolicy", "model.optim.sched.power=2"], "power=2.0"),
    (["model.optim.sched.name=NoamAnnealing", "model.optim.sched.cycle=true"], "cycle=True"),
    (["model.optim.sched.name=WarmupAnnealing"], "constant_steps=100000"),  # the preset's
    (["model.optim.sched.name=NoamHoldAnnealing", "model.optim.sched.warmup_steps=0"], "warmup_steps"),
    (["model.optim.sched.name=WarmupHoldPolicy", "model.optim.sched.hold_steps=2"], None),  # with a ratio
]


@pytest.mark.parametrize("overrides, key", BAD)
def test_a_setting_its_schedule_does_not_take_is_one_line_naming_it(overrides, key):
    cfg = load_training_config(
        "gpt3/126m",
        [*overrides, *(["model.optim.sched.constant_steps=0"] if key != "constant_steps=100000" else [])],
        report_ignored=False,
    )
    if key is None:  # hold_steps and hold_ratio together, as NeMo asserts
        cfg.model.optim.sched.hold_ratio = 0.1
        key = "hold_steps=2 and model.optim.sched.hold_ratio=0.1: give only one"
    with pytest.raises(ConfigError) as error:
        spec_from_config(cfg)
    message = str(error.value)
    assert f"model.optim.sched.{key}" in message and "\n" not in message


@pytest.mark.parametrize(
    "override",
    [
        "model.optim.sched.d_model=0",
        "model.optim.sched.power=-1",
        "model.optim.sched.decay_rate=-0.5",
        "model.optim.sched.hold_steps=-2",
        "model.optim.sched.hold_ratio=-0.1",
    ],
)
def test_an_impossible_value_is_refused_at_load_naming_the_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}: must be"):
        load_training_config("gpt3/126m", [override], report_ignored=False)


def test_noam_takes_the_models_width_without_d_model_and_refuses_megatrons_warmup():
    overrides = ["model.optim.sched.name=NoamAnnealing", "model.optim.sched.constant_steps=0"]
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    assert spec_from_config(cfg).d_model == cfg.model.hidden_size == 768
    megatron = load_training_config(
        "gpt3/126m", [*overrides, "model.optim.sched.warmup_style=megatron"], report_ignored=False
    )
    with pytest.raises(ConfigError, match="warmup_style=megatron: NoamAnnealing's warmup is its own"):
        spec_from_config(megatron)


def test_megatrons_warmup_style_warms_nemos_policies_from_warmup_init_lr():
    spec = ScheduleSpec(
        "WarmupAnnealing", 1.0, 0.0, 12, warmup_steps=4, warmup_style="megatron", warmup_init_lr=0.2
    )
    assert rates(spec, (0, 2, 4, 8)) == pytest.approx([0.2, 0.6, 1.0, 0.5])
    with pytest.raises(ConfigError, match="warmup_init_lr=0.2: NeMo's WarmupAnnealing warmup starts at lr /"):
        ScheduleSpec("WarmupAnnealing", 1.0, 0.0, 12, warmup_steps=4, warmup_init_lr=0.2)


def test_the_checkpoint_records_the_new_settings_and_a_resume_names_their_change():
    from gptrain.train.schedule_checks import resumed_schedule_change

    def config(*extra):
        base = ["model.optim.sched.name=PolynomialDecayAnnealing", "model.optim.sched.constant_steps=0"]
        return load_training_config("gpt3/126m", [*base, *extra], report_ignored=False)

    saved = LRSchedule(None, spec_from_config(config("model.optim.sched.power=2")))
    saved.step = 10
    state = saved.state_dict()
    assert state["power"] == 2.0 and "d_model" not in state and "cycle" not in state
    changed = config("model.optim.sched.power=3")
    schedule = LRSchedule(None, spec_from_config(changed))
    schedule.load_state_dict(state)
    line = resumed_schedule_change(changed, schedule, 11)
    assert line is not None and "model.optim.sched.power 2 -> 3;" in line
    same = LRSchedule(None, spec_from_config(config("model.optim.sched.power=2")))
    same.load_state_dict(state)
    assert resumed_schedule_change(config("model.optim.sched.power=2"), same, 11) is None


def test_start_warnings_speak_only_of_a_decay_the_schedule_has():
    """A schedule longer than the run leaves a decay unfinished only where it comes down to min_lr at
    max_steps; one shorter drops every schedule but Noam's to min_lr for the rest of the run."""
    from gptrain.train.schedule_checks import schedule_warnings

    def spec(name, max_steps, **kw):
        return spec_of(name, 1.0, max_steps=max_steps, min_lr=0.1, warmup_steps=2, **kw)

    assert schedule_warnings(spec("WarmupPolicy", 200), 100) == []
    assert schedule_warnings(spec("InverseSquareRootAnnealing", 200), 100) == []
    assert schedule_warnings(spec("NoamAnnealing", 10, d_model=64), 100) == []
    assert "the decay ends after the run" in schedule_warnings(spec("SquareAnnealing", 200), 100)[0]
    for name in ("WarmupHoldPolicy", "InverseSquareRootAnnealing"):
        assert "the last 50 steps run at min_lr=0.1" in schedule_warnings(spec(name, 50), 100)[0]


def test_a_nemo_yaml_without_min_lr_takes_its_schedules_default(tmp_path):
    """NeMo passes only the keys the file gives: SquareAnnealing's min_lr defaults to 1e-5 (its
    class's and SquareAnnealingParams'), every other schedule's to 0; a given min_lr wins."""
    square = "      name: SquareAnnealing\n      warmup_steps: 2\n      constant_steps: 0\n"
    cfg = load_training_config(config_file=str(nemo_yaml(tmp_path, square)), report_ignored=False)
    assert cfg.model.optim.sched.min_lr == 1e-5
    spec = spec_from_config(cfg)
    assert spec.min_lr == 1e-5 and lr_at(spec.max_steps, spec) == 1e-5
    cosine = load_training_config(
        config_file=str(nemo_yaml(tmp_path, square.replace("SquareAnnealing", "CosineAnnealing"))),
        report_ignored=False,
    )
    assert cosine.model.optim.sched.min_lr == 0.0
    given = load_training_config(
        config_file=str(nemo_yaml(tmp_path, square + "      min_lr: 0.0\n")), report_ignored=False
    )
    assert given.model.optim.sched.min_lr == 0.0


def test_a_schedule_at_min_lr_by_the_runs_end_is_not_said_to_end_after_the_run():
    """SquareAnnealing (max_steps 13, warmup 3) is max(((13 - s) / 10) ** 2, 0.05): 0.09 at step 10,
    the floor 0.05 from step 11; PolynomialHoldDecayAnnealing without a hold decays from step 0 over
    12 - 2 steps: 0.1 at step 9, min_lr 0 from step 10. A run whose last step is at the floor has
    nothing left to decay, though the schedule is longer; one a step shorter has."""
    from gptrain.train.schedule_checks import schedule_warnings

    square = spec_of("SquareAnnealing", 1.0, max_steps=13, min_lr=0.05, warmup_steps=3)
    assert lr_at(11, square) == 0.05 and lr_at(10, square) == pytest.approx(0.09)
    poly = spec_of("PolynomialHoldDecayAnnealing", 1.0, max_steps=12, min_lr=0.0, warmup_steps=2)
    assert lr_at(10, poly) == 0.0 and lr_at(9, poly) == pytest.approx(0.1)
    assert schedule_warnings(square, 12) == schedule_warnings(poly, 11) == []
    assert "so the last rate is 0.09, not min_lr=0.05;" in schedule_warnings(square, 11)[0]
    assert "so the last rate is 0.1, not min_lr=0;" in schedule_warnings(poly, 10)[0]


@pytest.mark.parametrize(
    "name, unset, explicit, changed",
    [
        ("PolynomialDecayAnnealing", [], ["power=1.0", "cycle=false"], ["power=2"]),
        (
            "NoamHoldAnnealing",
            ["warmup_steps=5"],
            ["warmup_steps=5", "decay_rate=0.5"],
            ["warmup_steps=5", "decay_rate=1"],
        ),
    ],
)
def test_a_resume_that_only_writes_out_nemos_default_is_no_change(name, unset, explicit, changed):
    """A null power, cycle or decay_rate is NeMo's 1.0, false, 0.5: writing it out, either way, changes
    no rate and is not said; another value is."""
    from gptrain.train.schedule_checks import resumed_schedule_change

    def config(settings):
        base = [f"model.optim.sched.name={name}", "model.optim.sched.constant_steps=0"]
        overrides = [*base, *(f"model.optim.sched.{s}" for s in settings)]
        return load_training_config("gpt3/126m", overrides, report_ignored=False)

    def resumed(before, after):
        saved = LRSchedule(None, spec_from_config(config(before)))
        saved.step = 600
        schedule = LRSchedule(None, spec_from_config(config(after)))
        schedule.load_state_dict(saved.state_dict())
        return resumed_schedule_change(config(after), schedule, 600)

    assert resumed(unset, explicit) is None and resumed(explicit, unset) is None
    line = resumed(unset, changed)
    key, value = changed[-1].split("=")
    assert line is not None and f"model.optim.sched.{key} null -> {value};" in line


@pytest.mark.parametrize("style", ["nemo", "megatron"])
def test_noam_with_a_warmup_init_lr_is_told_to_remove_it(style):
    """Noam's warmup is its own under either style: the line says to remove warmup_init_lr, not to
    set warmup_style=megatron (which Noam refuses in turn)."""
    overrides = ["model.optim.sched.name=NoamAnnealing", "model.optim.sched.constant_steps=0"]
    overrides += ["model.optim.sched.warmup_init_lr=1e-6", f"model.optim.sched.warmup_style={style}"]
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    with pytest.raises(ConfigError) as error:
        spec_from_config(cfg)
    assert str(error.value) == (
        "model.optim.sched.warmup_init_lr=1e-06: NoamAnnealing takes no warmup_init_lr; remove it"
    )


def test_square_annealings_default_min_lr_above_a_small_lr_is_named_as_the_default():
    """The user set no min_lr: the line names SquareAnnealing's NeMo default and the key to set, not a
    min_lr of 1e-05 as if they had written it; one they wrote is refused as before."""
    square = ["model.optim.sched.name=SquareAnnealing", "model.optim.sched.constant_steps=0"]
    small = [*square, "model.optim.lr=5e-6"]
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [*small, "model.optim.sched.min_lr=null"], report_ignored=False)
    assert str(error.value) == (
        "model.optim.sched.min_lr: not set, so SquareAnnealing's NeMo default 1e-05, which is above"
        " model.optim.lr=5e-06; set model.optim.sched.min_lr (0 up to lr)"
    )
    with pytest.raises(ConfigError, match=r"min_lr \(1e-05\) between 0 and lr"):
        load_training_config("gpt3/126m", [*small, "model.optim.sched.min_lr=1e-5"], report_ignored=False)
    fits = load_training_config(
        "gpt3/126m", [*square, "model.optim.lr=1e-5", "model.optim.sched.min_lr=null"]
    )
    assert fits.model.optim.sched.min_lr == 1e-5


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("PolynomialDecayAnnealing", {"power": 0}),
        ("PolynomialDecayAnnealing", {"power": 0, "cycle": True}),
        ("PolynomialHoldDecayAnnealing", {"power": 0}),
        ("PolynomialHoldDecayAnnealing", {"power": 0, "hold_steps": 3}),
        ("NoamHoldAnnealing", {"decay_rate": 0}),
        ("NoamHoldAnnealing", {"decay_rate": 0, "hold_steps": 3}),
    ],
)
def test_an_exponent_of_0_is_taken_and_holds_lr_as_nemo(name, kwargs):
    """NeMo takes power 0 and decay_rate 0: x ** 0 is 1 for every x, 0 ** 0 at the decay's end (or
    the hold's) included (math.pow(0.0, 0) == 1.0), so the rate is lr from the warmup's end to
    max_steps, min_lr past it; a negative exponent stays refused (0 ** -x divides by zero)."""
    sched = [
        f"model.optim.sched.name={name}",
        "model.optim.sched.constant_steps=0",
        "model.optim.sched.warmup_steps=2",
    ]
    sched += [f"model.optim.sched.{key}={value}" for key, value in kwargs.items()]
    cfg = load_training_config("gpt3/126m", [*sched, "trainer.max_steps=12"], report_ignored=False)
    key = next(iter(kwargs))
    assert getattr(spec_from_config(cfg), key) == 0
    spec = spec_of(name, 1.0, max_steps=12, min_lr=0.1, warmup_steps=2, **kwargs)
    reference = NemoReference(name, 1.0, max_steps=12, min_lr=0.1, warmup_steps=2, **kwargs)
    assert rates(spec, range(2, 14)) == [1.0] * 11 + [0.1]
    assert rates(spec, range(20)) == [reference.lr_at(step) for step in range(20)]
    with pytest.raises(ConfigError, match=f"^model.optim.sched.{key}: must be 0 or more, got -0.5$"):
        load_training_config("gpt3/126m", [*sched, f"model.optim.sched.{key}=-0.5"], report_ignored=False)
