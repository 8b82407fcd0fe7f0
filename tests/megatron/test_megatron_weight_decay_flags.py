"""Megatron's weight-decay increment (--weight-decay-incr-style, --start-weight-decay,
--end-weight-decay): before, each was refused as a flag gptrain does not know. A constant decay is
taken as Megatron computes it (start = end: that value, whatever --weight-decay says), a rising one as
model.optim.weight_decay_incr_style (the rates: tests/train/test_weight_decay_schedule); the
combinations Megatron asserts against are refused in one line saying why."""

import shlex

import pytest

from gptrain.cli import main
from gptrain.megatron.translate import translate

BASE = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    " --mock-data --vocab-size 64 --lr 1e-4 --train-iters 100"
)


@pytest.mark.parametrize(
    ("flags", "optim", "notes"),
    [
        (
            "--weight-decay 0.1 --weight-decay-incr-style constant",
            {"weight_decay": 0.1},
            ["--weight-decay-incr-style constant (Megatron's default: the weight decay is --weight-decay)"],
        ),
        (
            "--weight-decay 0.1 --weight-decay-incr-style linear --start-weight-decay 0.05 --end-weight-decay 0.05",
            {"weight_decay": 0.05},
            [
                "--weight-decay (Megatron's decay is --start-weight-decay 0.05 to --end-weight-decay 0.05 instead)",
                "--weight-decay-incr-style linear (--start-weight-decay 0.05 = --end-weight-decay 0.05: a constant"
                " weight decay of 0.05)",
            ],
        ),
        (
            "--weight-decay-incr-style cosine --start-weight-decay 0.01 --end-weight-decay 0.1",
            {"weight_decay_incr_style": "cosine", "start_weight_decay": 0.01, "end_weight_decay": 0.1},
            [],
        ),
        (
            "--weight-decay 0.3 --weight-decay-incr-style linear --start-weight-decay 0 --end-weight-decay 0.1",
            {"weight_decay_incr_style": "linear", "start_weight_decay": 0.0, "end_weight_decay": 0.1},
            ["--weight-decay (Megatron's decay is --start-weight-decay 0 to --end-weight-decay 0.1 instead)"],
        ),
    ],
)
def test_the_weight_decay_is_taken_as_megatron_computes_it(flags, optim, notes):
    t = translate(shlex.split(f"{BASE} {flags}"), {})
    assert {key: t.values[f"model.optim.{key}"] for key in optim} == optim
    assert [note for note in t.notes if "weight-decay" in note] == notes
    if "weight_decay" in optim:
        assert "model.optim.weight_decay_incr_style" not in t.values
    assert main(["megatron", "--dry-run", *shlex.split(f"{BASE} {flags}")]) == 0


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            "--start-weight-decay 0.01 --end-weight-decay 0.1",
            "--start-weight-decay and --end-weight-decay with --weight-decay-incr-style constant (Megatron's"
            " default): Megatron asserts they are not given; give --weight-decay for a constant weight decay, or"
            " --weight-decay-incr-style linear or cosine",
        ),
        (
            "--weight-decay-incr-style constant --end-weight-decay 0.1",
            "--end-weight-decay with --weight-decay-incr-style constant",
        ),
        (
            "--weight-decay-incr-style linear --start-weight-decay 0.01",
            "--weight-decay-incr-style linear needs --start-weight-decay and --end-weight-decay (Megatron asserts"
            " both); give them",
        ),
        (
            "--weight-decay-incr-style cosine --start-weight-decay 0.1 --end-weight-decay 0.01",
            "--end-weight-decay 0.01 < --start-weight-decay 0.1: Megatron's weight decay only rises; give an end at"
            " least the start",
        ),
        (
            "--weight-decay-incr-style linear --start-weight-decay -0.1 --end-weight-decay -0.1",
            "--start-weight-decay -0.1: must be 0 or more (Megatron asserts it)",
        ),
        (
            "--weight-decay-incr-style exponential",
            "--weight-decay-incr-style exponential: not supported; use one of",
        ),
        ("--start-weight-decay x", "--start-weight-decay x: expects a number"),
    ],
)
def test_what_megatron_asserts_against_is_refused_in_one_line(flags, refusal, capsys):
    assert main(["megatron", "--dry-run", *shlex.split(f"{BASE} {flags}")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"gptrain: error: {refusal}"), err
