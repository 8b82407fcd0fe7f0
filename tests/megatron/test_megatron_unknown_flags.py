"""`gptrain megatron`'s refusal of a flag outside its tables: Megatron's own flags, its renamed ones, typos."""

import shlex

import pytest

from gptrain.cli import main
from gptrain.errors import ConfigError
from gptrain.megatron.flags import NO_EFFECT, REFUSED, SPECIAL, SWITCH, VALUE
from gptrain.megatron.translate import translate
from gptrain.megatron.unimplemented_flags import NOT_IMPLEMENTED, RENAMED

BASE = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    " --global-batch-size 4 --train-iters 4 --mock-data --vocab-size 64"
)
CHECK = (
    "check what it changes in Megatron before removing it (docs/migrating.md lists the flags gptrain takes)"
)


def refusal(flags: str) -> str:
    with pytest.raises(ConfigError) as error:
        translate(shlex.split(f"{BASE} {flags}"), {})
    return str(error.value)


@pytest.mark.parametrize(
    "flag",
    [
        "--eval-micro-batch-size 8",  # was "did you mean --micro-batch-size?", which, given again, wins
        "--eval-global-batch-size 64",  # was "did you mean --global-batch-size?"
        "--save-retain-interval 5000",  # was "did you mean --save-interval?"
        "--decoder-num-layers 4",  # was "did you mean --recompute-num-layers?"
        "--rotary-scaling-factor 8",  # was "did you mean --rope-scaling-factor?"
        "--fp4-format e2m1",  # was "did you mean --fp8-format?"
        "--no-tp-comm-overlap-rs",  # was "did you mean --tp-comm-overlap?"
    ],
)
def test_a_megatron_flag_gptrain_does_not_implement_is_said_so_with_no_hint(flag):
    """Review M1: the difflib hint, meant for typos, named a different flag for Megatron's own flags
    (ValidationConfig's --eval-micro-batch-size, CheckpointConfig's --save-retain-interval, ...)."""
    name = flag.split()[0]
    assert refusal(flag) == f"{name}: a Megatron flag gptrain does not implement; {CHECK}"


@pytest.mark.parametrize(
    ("flag", "successor"),
    [
        ("--batch-size 4", "--micro-batch-size"),
        ("--model-parallel-size 2", "--tensor-model-parallel-size"),
        ("--warmup 10", "--lr-warmup-fraction"),
    ],
)
def test_megatrons_deprecated_names_name_their_successor(flag, successor):
    """Megatron's validate_args asserts 'no longer valid, use <successor> instead' for these three."""
    name = flag.split()[0]
    assert refusal(flag) == f"{name}: no longer a Megatron flag (Megatron refuses it too); use {successor}"


@pytest.mark.parametrize(
    ("flag", "hint"),
    [
        ("--train-iter 4", " (did you mean --train-iters?)"),  # a typo of a gptrain flag: hinted
        (
            "--eval-micro-batch-sizes 8",
            " (did you mean --eval-micro-batch-size, a Megatron flag gptrain does not implement either?)",
        ),  # a typo of Megatron's flag: not hinted to --micro-batch-size
        ("--foo 1", ""),
    ],
)
def test_a_flag_no_megatron_knows_is_hinted_to_the_nearest_of_megatrons_flags(flag, hint):
    name = flag.split()[0]
    assert refusal(flag) == f"{name}: gptrain does not know this flag{hint}; {CHECK}"


def test_megatrons_unimplemented_flags_are_not_in_the_tables():
    """A flag taken into a table leaves the list; the list holds flags only (no stray word)."""
    tables = {*VALUE, *SWITCH, *NO_EFFECT, *REFUSED, *SPECIAL}
    assert not NOT_IMPLEMENTED & tables and not RENAMED.keys() & tables
    assert not NOT_IMPLEMENTED & RENAMED.keys()
    assert all(name.startswith("--") and not name.startswith("--moe-") for name in NOT_IMPLEMENTED)
    assert {*RENAMED.values()} <= tables and len(NOT_IMPLEMENTED) > 500


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (  # load_training_config's check of model.optim.betas, which the SPECIAL --adam-beta1/2 set
            "--adam-beta2 1.0",
            "--adam-beta1/--adam-beta2 ([0.9, 1.0]) must be two values in [0, 1) and --adam-eps (1e-08) above 0",
        ),
        (  # BatchRamp's check, made inside translate() for --train-samples's iteration count
            "--global-batch-size 16 --train-samples 100 --rampup-batch-size 3 4 10",
            "--rampup-batch-size 3 4 10: --global-batch-size=16 minus the start 3 must be a non-negative "
            "multiple of the increment 4",
        ),
    ],
)
def test_checks_of_keys_that_flags_set_together_name_the_flags(flags, error, capsys):
    """Review M3: these refusals named model.optim.betas and model.rampup_batch_size, keys the user
    never typed: the betas had no flag in Translation.in_flags, and translate()'s own checks (the
    ramp's) were not passed through it."""
    base = (
        "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
        " --mock-data --vocab-size 64 --lr 1e-4"
    )
    if "--train-samples" not in flags:
        base += " --train-iters 4 --global-batch-size 4"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} {flags}")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"gptrain: error: {error}"
