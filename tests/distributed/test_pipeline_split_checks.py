"""Uneven pipeline splits: the layers of each stage as Megatron's rules give them, and every split
Megatron refuses (or gptrain cannot run) refused before any process group, in one line naming the keys."""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.cli import main
from gptrain.config.schema import ModelConfig
from gptrain.errors import ConfigError
from gptrain.parallel.layout import check_layout, pipeline_rank_layers, stage_layer_counts, stage_layer_ranges

FIRST, LAST = "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"
EMBEDDING, LOSS = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"


def model(**overrides: object) -> ModelConfig:
    base = dict(num_layers=8, hidden_size=64, num_attention_heads=8, micro_batch_size=1, global_batch_size=16)
    return dataclasses.replace(ModelConfig(), **{**base, **overrides})


@pytest.mark.parametrize(
    ("overrides", "pp", "vpp", "counts"),
    [
        ({}, 2, 2, [2, 2, 2, 2]),
        ({FIRST: 3, "num_layers": 7}, 2, 1, [3, 4]),  # the last stage takes the rest
        ({FIRST: 2}, 3, 1, [2, 3, 3]),
        ({LAST: 2}, 4, 1, [2, 2, 2, 2]),
        ({FIRST: 2, LAST: 2, "num_layers": 10}, 4, 1, [2, 3, 3, 2]),
        # interleaved: stage v x pp + r is rank r's chunk v; rank 0 holds 2, ranks 1-2 hold 4, rank 3 holds 2
        ({FIRST: 2, LAST: 2, "num_layers": 12}, 4, 2, [1, 2, 2, 1, 1, 2, 2, 1]),
        ({EMBEDDING: True, "num_layers": 7}, 2, 1, [3, 4]),
        ({EMBEDDING: True, LOSS: True, "num_layers": 6}, 4, 1, [1, 2, 2, 1]),
        ({EMBEDDING: True, LOSS: True, "num_layers": 6}, 2, 2, [1, 2, 2, 1]),
        ({LOSS: True, "num_layers": 7}, 1, 1, [7]),  # one stage: nothing to account for, as in Megatron
        # the embedding (loss) counted as the first (last) stage's only layer: Megatron's standalone
        # embedding (loss) stage, no transformer layer (its get_num_layers_to_build asserts >= 0)
        ({EMBEDDING: True, "num_layers": 7}, 8, 1, [0, 1, 1, 1, 1, 1, 1, 1]),
        ({LOSS: True, "num_layers": 7}, 8, 1, [1, 1, 1, 1, 1, 1, 1, 0]),
        ({EMBEDDING: True, LOSS: True, "num_layers": 6}, 2, 4, [0, 1, 1, 1, 1, 1, 1, 0]),
    ],
)
def test_layers_per_stage_follow_megatrons_rules(
    overrides: dict, pp: int, vpp: int, counts: list[int]
) -> None:
    m = model(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    m = dataclasses.replace(m, **overrides)
    assert stage_layer_counts(m, pp, vpp) == counts
    assert sum(pipeline_rank_layers(counts, pp)) == m.num_layers
    assert [i for r in stage_layer_ranges(counts) for i in r] == list(range(m.num_layers))


def test_interleaved_chunks_take_consecutive_layers_in_stage_order() -> None:
    ranges = stage_layer_ranges([1, 2, 2, 1, 1, 2, 2, 1])
    assert [list(r) for r in ranges[0::4]] == [[0], [6]]  # rank 0's chunks
    assert [list(r) for r in ranges[1::4]] == [[1, 2], [7, 8]]  # rank 1's chunks


@pytest.mark.parametrize(
    ("overrides", "world", "expected"),
    [
        (
            {FIRST: 5, LAST: 4, "pipeline_model_parallel_size": 3},
            3,
            f"model.{FIRST}=5 and model.{LAST}=4 together hold more than model.num_layers=8",
        ),
        (
            {FIRST: 3, "pipeline_model_parallel_size": 3},
            3,
            f"the 5 layers left by model.{FIRST}=3 (model.num_layers=8) do not split evenly over the other 2 of "
            "model.pipeline_model_parallel_size=3 stages, as Megatron requires",
        ),
        (
            {FIRST: 3, LAST: 3, "pipeline_model_parallel_size": 2},
            2,
            f"model.{FIRST}=3 and model.{LAST}=3 must add up to model.num_layers=8: with "
            "model.pipeline_model_parallel_size=2 the first and last stage are every stage",
        ),
        ({FIRST: 2}, 1, f"model.{FIRST}=2 needs model.pipeline_model_parallel_size > 1 (it is 1): drop it"),
        ({LAST: 0, "pipeline_model_parallel_size": 2}, 2, f"model.{LAST}=0 must be >= 1 or null"),
        (
            {FIRST: 1, EMBEDDING: True, "pipeline_model_parallel_size": 2},
            2,
            f"model.{FIRST}=1 cannot be combined with model.{EMBEDDING}=true (Megatron refuses the pair)",
        ),
        (
            {FIRST: 3, "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
            2,
            f"pipeline rank 0's 3 layers (model.{FIRST}=3) are not divisible by "
            "model.virtual_pipeline_model_parallel_size=2",
        ),
        (
            {EMBEDDING: True, "pipeline_model_parallel_size": 2},
            2,
            "model.num_layers + 1 (embedding) = 9 is not divisible by model.pipeline_model_parallel_size=2 "
            f"(model.{EMBEDDING}=true)",
        ),
        (
            {FIRST: 4, LAST: 4, "pipeline_model_parallel_size": 3},
            3,
            f"model.pipeline_model_parallel_size=3 with model.{FIRST}=4 and model.{LAST}=4 leaves pipeline "
            "stage 1 without transformer layers (layers per stage: [4, 0, 4]), which Megatron refuses between "
            "the first and last stage",
        ),
        (
            {"pipeline_model_parallel_size": 3},
            3,
            "model.num_layers=8 is not divisible by model.pipeline_model_parallel_size=3",
        ),
    ],
)
def test_refused_splits_name_the_keys(overrides: dict, world: int, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_layout(model(**overrides), world_size=world)
    assert str(error.value).startswith(expected)
    assert "\n" not in str(error.value)


def test_the_planner_says_why_a_requested_split_is_not_valid(capsys: pytest.CaptureFixture[str]) -> None:
    overrides = ["model.pipeline_model_parallel_size=2", "model.num_layers_in_first_pipeline_stage=13"]
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--gpu", "h100-80gb", *overrides]) == 0
    expected = (
        "requested layout is not valid here: model.num_layers_in_first_pipeline_stage=13 together hold more "
        "than model.num_layers=12"
    )
    assert expected in capsys.readouterr().out.splitlines()


def test_no_chunk_size_note_where_the_chunks_differ(capsys: pytest.CaptureFixture[str]) -> None:
    """The block-recompute note names one chunk size; under an uneven split ([2, 6] here) it would be
    wrong for some chunk (5 recomputes all of the first stage's 2 but 5 of the last's 6)."""
    from gptrain.config import load_training_config

    overrides = [
        "trainer.devices=2",
        "model.num_layers=8",
        "model.pipeline_model_parallel_size=2",
        "model.activations_checkpoint_granularity=full",
        "model.activations_checkpoint_method=block",
        "model.activations_checkpoint_num_layers=5",
    ]
    load_training_config("gpt3/126m", overrides)
    assert "more than the 4 layers of a pipeline chunk" in capsys.readouterr().err
    load_training_config("gpt3/126m", [*overrides, "model.num_layers_in_first_pipeline_stage=2"])
    assert "of a pipeline chunk" not in capsys.readouterr().err
