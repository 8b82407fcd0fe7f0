"""--lr-decay-style inverse-square-root and WSD with the --lr-wsd-* flags: what they translate to, and
the combinations Megatron's scheduler asserts against or ignores (the rates: tests/train/test_megatron_schedules)."""

import shlex

import pytest

from gptrain.cli import main
from gptrain.megatron.translate import translate

BASE = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    " --mock-data --vocab-size 64 --lr 1e-4"
)
SCHED = "model.optim.sched."


def values(flags):
    return translate(shlex.split(f"{BASE} {flags}"), {})


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--train-iters 100 --lr-decay-style inverse-square-root", {"name": "MegatronInverseSquareRoot"}),
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-iters 20",
            {"name": "WarmupStableDecay", "wsd_decay_steps": 20},
        ),
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-iters 20 --lr-wsd-decay-style minus_sqrt",
            {"name": "WarmupStableDecay", "wsd_decay_steps": 20, "wsd_decay_style": "minus_sqrt"},
        ),
        (
            "--train-samples 1000 --lr-decay-style WSD --lr-wsd-decay-samples 300 --lr-wsd-decay-style cosine",
            {"name": "WarmupStableDecay", "wsd_decay_samples": 300, "wsd_decay_style": "cosine"},
        ),
    ],
)
def test_the_decay_styles_translate_to_their_schedules(flags, expected, capsys):
    t = values(flags)
    got = {key: t.values[SCHED + key] for key in expected}
    assert got == expected
    for key in ("wsd_decay_steps", "wsd_decay_samples", "wsd_decay_style"):
        assert (SCHED + key in t.values) == (key in expected)
    assert main(["megatron", "--dry-run", *shlex.split(f"{BASE} {flags}")]) == 0  # the config loads


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            "--train-iters 100 --lr-decay-style WSD",
            "--lr-decay-style WSD with --train-iters needs --lr-wsd-decay-iters, the length of the annealing to"
            " --min-lr at the decay's end (Megatron asserts it); give --lr-wsd-decay-iters",
        ),
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-samples 30",
            "--lr-decay-style WSD with --train-iters needs --lr-wsd-decay-iters, the length of the annealing to"
            " --min-lr at the decay's end (Megatron asserts it; it ignores --lr-wsd-decay-samples with"
            " --train-iters); give --lr-wsd-decay-iters",
        ),
        (
            "--train-samples 1000 --lr-decay-style WSD --lr-wsd-decay-iters 30",
            "--lr-decay-style WSD with --train-samples needs --lr-wsd-decay-samples",
        ),
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-iters -3",
            "--lr-wsd-decay-iters -3: the annealing's length must be 0 or more; give its length",
        ),
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-iters 3 --lr-wsd-decay-style square",
            "--lr-wsd-decay-style square: not supported; use one of linear, cosine, exponential, minus_sqrt",
        ),
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-iters 30 --lr-warmup-iters 100",
            "--lr-warmup-iters 100 and the decay over --train-iters 100: the warmup must end before the decay",
        ),
        ("--train-iters 100 --lr-decay-style wsd", "--lr-decay-style wsd: not supported; use one of"),
    ],
)
def test_what_megatron_asserts_against_is_refused_in_one_line(flags, refusal, capsys):
    assert main(["megatron", "--dry-run", *shlex.split(f"{BASE} {flags}")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"gptrain: error: {refusal}"), err


@pytest.mark.parametrize(
    ("flags", "note", "dropped"),
    [
        (
            "--train-iters 100 --lr-decay-style WSD --lr-wsd-decay-iters 30 --lr-wsd-decay-samples 4",
            "--lr-wsd-decay-samples (Megatron reads --lr-wsd-decay-iters with --train-iters)",
            "wsd_decay_samples",
        ),
        (
            "--train-samples 1000 --lr-decay-style WSD --lr-wsd-decay-samples 300 --lr-wsd-decay-iters 4",
            "--lr-wsd-decay-iters (Megatron reads --lr-wsd-decay-samples with --train-samples)",
            "wsd_decay_steps",
        ),
        (
            "--train-iters 100 --lr-decay-style cosine --lr-wsd-decay-iters 30",
            "--lr-wsd-decay-iters (Megatron reads it only with --lr-decay-style WSD)",
            "wsd_decay_steps",
        ),
        (
            "--train-iters 100 --lr-wsd-decay-style cosine",
            "--lr-wsd-decay-style (Megatron reads it only with --lr-decay-style WSD)",
            "wsd_decay_style",
        ),
    ],
)
def test_a_wsd_flag_megatron_ignores_is_said_and_not_set(flags, note, dropped):
    t = values(flags)
    assert note in t.notes
    assert SCHED + dropped not in t.values
    assert main(["megatron", "--dry-run", *shlex.split(f"{BASE} {flags}")]) == 0


def test_a_ramp_beside_train_iters_advises_the_wsd_annealing_in_samples_too(capsys):
    """The refusal of --rampup-batch-size with --train-iters names each --lr-*-iters flag in samples
    so the schedule keeps its iterations; the WSD annealing, counted back from the decay's end, is the
    samples between iteration 60 - 15 and 60 (all of full batches of 8, the ramp long over: 120)."""
    flags = (
        "--global-batch-size 8 --rampup-batch-size 4 2 30 --train-iters 80 --lr-decay-iters 60"
        " --lr-decay-style WSD --lr-wsd-decay-iters 15"
    )
    assert main(["megatron", "--dry-run", *shlex.split(f"{BASE} {flags}")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "--lr-decay-samples 458 in place of --lr-decay-iters 60, --lr-wsd-decay-samples 120 in place of"
        in err
    )
    assert err.count("\n") == 0
