"""Megatron's uneven pipeline split flags map onto NeMo 2's model keys, and the combinations
Megatron asserts against are refused in one line."""

from __future__ import annotations

import shlex

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.megatron.translate import translate
from gptrain.parallel.layout import check_layout, stage_layer_counts

BASE = "--num-layers 14 --hidden-size 64 --num-attention-heads 8 --seq-length 16 --micro-batch-size 1"
BASE += " --global-batch-size 16 --train-iters 4 --mock-data --vocab-size 64 --pipeline-model-parallel-size 4"
ENV = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}


def model_of(flags: str):  # noqa: ANN201
    t = translate(shlex.split(f"{BASE} {flags}"), ENV)
    return load_training_config(None, t.overrides, report_ignored=False).model


def test_first_and_last_stage_layers_become_nemos_keys_and_split_the_rest_evenly() -> None:
    m = model_of("--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 4")
    assert (m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage) == (2, 4)
    check_layout(m, world_size=4)
    assert stage_layer_counts(m, 4) == [2, 4, 4, 4]  # (14 - 2 - 4) / 2 middle stages


def test_embedding_and_loss_counted_as_layers_become_switches() -> None:
    m = model_of(
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --num-layers 10"
    )
    assert m.account_for_embedding_in_pipeline_split and m.account_for_loss_in_pipeline_split
    assert stage_layer_counts(m, 4) == [2, 3, 3, 2]  # (10 + 2) / 4, less one on the first and last


def test_virtual_stages_per_rank_give_the_interleaved_schedule_under_an_uneven_split() -> None:
    m = model_of(
        "--num-layers 12 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 "
        "--num-virtual-stages-per-pipeline-rank 2"
    )
    assert m.virtual_pipeline_model_parallel_size == 2
    assert stage_layer_counts(m, 4, 2) == [1, 2, 2, 1, 1, 2, 2, 1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--decoder-first-pipeline-num-layers 2 --num-layers-per-virtual-pipeline-stage 1",
            "--num-layers-per-virtual-pipeline-stage with --decoder-first-pipeline-num-layers: give the "
            "chunks per rank with --num-virtual-stages-per-pipeline-rank instead",
        ),
        (
            "--num-layers 16 --num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2",
            "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank: give one of them",
        ),
        (
            "--decoder-last-pipeline-num-layers x",
            "--decoder-last-pipeline-num-layers x: expects a whole number",
        ),
    ],
)
def test_combinations_megatron_asserts_against_are_one_line(flags: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        translate(shlex.split(f"{BASE} {flags}"), ENV)


def test_a_split_megatron_refuses_is_refused_naming_the_keys() -> None:
    m = model_of("--decoder-first-pipeline-num-layers 3")  # 11 layers left for 3 stages
    with pytest.raises(ConfigError, match="the 11 layers left by model.num_layers_in_first_pipeline_stage=3"):
        check_layout(m, world_size=4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--account-for-embedding-in-pipeline-split",
            "--num-layers + 1 (embedding) = 15 is not divisible by --pipeline-model-parallel-size=4 "
            "(--account-for-embedding-in-pipeline-split)",
        ),
        (
            "--decoder-last-pipeline-num-layers 2 --account-for-loss-in-pipeline-split",
            "--decoder-last-pipeline-num-layers=2 cannot be combined with --account-for-loss-in-pipeline-split "
            "(Megatron refuses the pair)",
        ),
    ],
)
def test_a_refused_split_names_the_flags_typed(
    flags: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The layout check names gptrain's keys; to a flag list it names the flags, switches too
    (`--account-for-embedding-in-pipeline-split`, not `model.account_for_..._split=true`)."""
    argv = [*shlex.split(BASE), "--lr", "1e-4", *shlex.split(flags)]
    assert main(["megatron", "--dry-run", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"gptrain: error: {message}")


def test_layers_per_virtual_stage_count_the_embedding_and_loss_switched_into_the_split() -> None:
    """Megatron divides num_layers + 1 per account-for switch: (14 + 2) / 4 stages = 4 layers a
    rank, 2 chunks of 2; the first and last chunk hold one fewer, as with the chunks flag."""
    m = model_of(
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
        "--num-layers-per-virtual-pipeline-stage 2"
    )
    assert m.virtual_pipeline_model_parallel_size == 2
    assert stage_layer_counts(m, 4, 2) == [1, 2, 2, 2, 2, 2, 2, 1]


def test_layers_per_virtual_stage_refused_naming_the_layers_counted() -> None:
    """14 + 1 (embedding) = 15 does not split over 4 stages: the line says what was counted."""
    with pytest.raises(
        ConfigError,
        match=r"^--num-layers-per-virtual-pipeline-stage 1: the 14 layers \+ 1 \(embedding\) = 15 per 4 "
        "pipeline stages must split",
    ):
        translate(
            shlex.split(
                f"{BASE} --account-for-embedding-in-pipeline-split --num-layers-per-virtual-pipeline-stage 1"
            ),
            ENV,
        )


@pytest.mark.parametrize("pp", ["1", "2"])
def test_one_chunk_a_rank_is_no_interleaving_and_runs_at_any_pipeline_size(pp: str) -> None:
    """Megatron computes (16 / pp) / per-chunk chunks and, at 1, runs the plain schedule: a flag list
    scaled down to one stage keeps working (it was refused, naming a split that divides)."""
    per_chunk = str(16 // int(pp))
    flags = BASE.replace("--num-layers 14", "--num-layers 16").replace(
        "--pipeline-model-parallel-size 4", f"--pipeline-model-parallel-size {pp}"
    )
    env = {"WORLD_SIZE": pp, "LOCAL_WORLD_SIZE": pp}
    t = translate(shlex.split(f"{flags} --num-layers-per-virtual-pipeline-stage {per_chunk}"), env)
    m = load_training_config(None, t.overrides, report_ignored=False).model
    assert m.virtual_pipeline_model_parallel_size == 1
    check_layout(m, world_size=int(pp))
