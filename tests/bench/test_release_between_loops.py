"""bench/train_step.py and bench/profile_step.py free each measured loop (its model, optimizer state,
grads: all held by the loop's step closure) before the next loop is built, so a loop's peak memory
and the reference's profile do not carry the previous model."""

import weakref

from tests.bench.test_bench_scripts import TINY, load

SMALL = ["--preset", "quickstart/cpu", "--micro-batch-size", "2", "--seq-length", "16", "--precision", "32"]


def track_loops(monkeypatch, bench) -> tuple[list, list]:
    """Each loop's step closure (a stand-in holding nothing) by weak reference, and at every
    release() whether a loop built before it is still alive."""
    built, alive_at_release = [], []

    def loop(*args, **kwargs):
        def step() -> float:
            return 1.0

        built.append(weakref.ref(step))
        return step

    def release(device):
        alive_at_release.append([ref() is not None for ref in built])

    monkeypatch.setattr(bench, "gptrain_step", loop)
    monkeypatch.setattr(bench, "gptrain_run_ahead", loop)  # on the CPU the real one measures nothing
    monkeypatch.setattr(bench, "reference_step", loop)
    monkeypatch.setattr(bench, "release", release)
    return built, alive_at_release


def test_train_step_frees_each_loop_before_the_next_is_built(monkeypatch, capsys):
    train_step = load("train_step")
    built, alive_at_release = track_loops(monkeypatch, train_step)
    row = train_step.Measurement("loop", 1.0, 1.0, 1.0, None, 1.0, 1.0, None)
    monkeypatch.setattr(train_step, "measure", lambda name, step, args, work: step() and row)
    argv = [*SMALL, "--run-ahead", "--separate-projections", "--reference", "both", *TINY]
    assert train_step.main(argv) == 0
    capsys.readouterr()
    assert len(built) == 5  # gptrain, run ahead, separate GEMMs, compiled reference, eager reference
    assert alive_at_release == [[False] * 1, [False] * 2, [False] * 3, [False] * 4]


def test_profile_step_frees_gptrains_loop_before_the_reference_is_built(monkeypatch):
    profile_step = load("profile_step")
    built, alive_at_release = track_loops(monkeypatch, profile_step.bench)
    monkeypatch.setattr(profile_step, "profile", lambda name, step, *rest: step() and {"name": name})
    monkeypatch.setattr(profile_step, "report", lambda rows: None)
    assert profile_step.main([*SMALL, "--reference", "compiled", *TINY]) == 0
    assert len(built) == 2
    assert alive_at_release == [[False]]
