"""The planner under an uneven pipeline split: parameters per rank counted on gptrain's real stages,
the fullest stage bounding memory, and the split carried by the requested layout's overrides."""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.config import load_training_config
from gptrain.config.schema import ModelConfig
from gptrain.models.config import GPTConfig
from gptrain.plan.memory import WEIGHT_BYTES, activation_bytes, estimate_memory, estimate_rank
from gptrain.plan.sizes import megatron_parameter_lines, rank_parameters
from gptrain.plan.spec import SPLIT_KEYS, Layout, Workload, layout_from_config
from tests.plan.plan_helpers import TINY

CONFIG = dict(vocab_size=128, seq_length=16, num_layers=8, hidden_size=16, num_attention_heads=2)
# (layout, each rank's layers): Megatron's rules give the counts; the test counts the real stages
SPLITS = [
    (Layout(pp=2, num_layers_in_first_pipeline_stage=2), [2, 6]),
    (Layout(pp=3, num_layers_in_first_pipeline_stage=2), [2, 3, 3]),
    (Layout(pp=4, num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=1), [1, 3, 3, 1]),
    (Layout(pp=2, vpp=2, num_layers_in_first_pipeline_stage=2), [2, 6]),
    (Layout(pp=3, account_for_embedding_in_pipeline_split=True), [2, 3, 3]),
    (
        Layout(pp=2, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
        [4, 4],
    ),
]


def real_stage_parameters(config: GPTConfig, layout: Layout) -> list[int]:
    """Parameters of each pipeline rank's chunks as gptrain.parallel cuts them from the meta model."""
    torch = pytest.importorskip("torch")
    from gptrain.models.gpt import GPT
    from gptrain.parallel.layout import stage_layer_counts, stage_layer_ranges
    from gptrain.parallel.pipeline import split_stage, stage_ids

    with torch.device("meta"):
        model = GPT(config)
    split = ModelConfig(num_layers=config.num_layers, **{key: getattr(layout, key) for key in SPLIT_KEYS})
    ranges = stage_layer_ranges(stage_layer_counts(split, layout.pp, layout.vpp))
    stages = layout.pp * layout.vpp
    counts = []
    for rank in range(layout.pp):
        parts = [split_stage(model, s, stages, ranges[s]) for s in stage_ids(rank, layout.pp, layout.vpp)]
        unique = {id(p): p for part in parts for p in part.parameters()}
        counts.append(sum(p.numel() for p in unique.values()))
    return counts


@pytest.mark.parametrize(("layout", "layers"), SPLITS)
def test_parameters_per_rank_are_those_of_the_real_stages(layout: Layout, layers: list[int]) -> None:
    config = GPTConfig(**CONFIG)
    assert layout.rank_layers(config.num_layers) == layers
    assert rank_parameters(config, 1, layout.pp, layers) == real_stage_parameters(config, layout)
    line = megatron_parameter_lines(config, 1, layout.pp, layers)[-1]
    assert line.endswith(f": {real_stage_parameters(config, layout)[-1]}")


def workload() -> Workload:
    return Workload(
        model=GPTConfig(**CONFIG), make_vocab_size_divisible_by=128, global_batch_size=8, precision="32"
    )


def test_the_fullest_stage_bounds_memory() -> None:
    """[2, 6] of 8 layers: rank 1 holds six blocks and the head, more than rank 0's embedding and
    two blocks; the estimate is that rank's, its weights its real parameters in fp32."""
    work = workload()
    layout = Layout(pp=2, micro_batch_size=1, num_layers_in_first_pipeline_stage=2)
    real = real_stage_parameters(work.padded(1), layout)
    estimate = estimate_memory(work, layout)
    assert estimate.pipeline_rank == 1
    assert estimate.weights == WEIGHT_BYTES * real[1]
    assert estimate.total == max(estimate_rank(work, layout, r).total for r in range(2))
    even = dataclasses.replace(layout, num_layers_in_first_pipeline_stage=None)
    # rank 1's in-flight blocks: six layers' activations instead of four, the same micro-batches
    blocks = activation_bytes(work, layout, 1)["blocks"]
    assert blocks == pytest.approx(activation_bytes(work, even, 1)["blocks"] * 6 / 4, rel=1e-12)
    assert estimate.total > estimate_memory(work, even).total


def test_the_requested_layout_keeps_the_split_and_another_layout_clears_it() -> None:
    split = [*TINY, "model.num_layers=4", "model.micro_batch_size=1", "model.pipeline_model_parallel_size=2"]
    split.append("model.num_layers_in_first_pipeline_stage=1")
    layout = layout_from_config(load_training_config("gpt3/126m", split), world_size=2)
    assert layout.num_layers_in_first_pipeline_stage == 1 and layout.rank_layers(4) == [1, 3]
    again = layout_from_config(load_training_config("gpt3/126m", [*TINY, *layout.overrides()]), world_size=2)
    assert again == layout
    # a ranked layout (even) applied onto that config leaves no uneven key on its pipeline size
    even = Layout(dp=2, micro_batch_size=1)
    plain = load_training_config("gpt3/126m", [*split, *even.overrides()])
    assert plain.model.num_layers_in_first_pipeline_stage is None
    assert layout_from_config(plain, world_size=2) == dataclasses.replace(even, dp_shard=0)
