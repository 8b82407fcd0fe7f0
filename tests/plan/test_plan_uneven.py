"""The planner under an uneven pipeline split: parameters per rank counted on gptrain's real stages,
the fullest stage bounding memory, and the split carried by the requested layout's overrides."""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.config import load_training_config
from gptrain.config.schema import ModelConfig
from gptrain.models.config import GPTConfig
from gptrain.models.flops import megatron_flops_per_iteration
from gptrain.plan.hardware import build_cluster
from gptrain.plan.memory import WEIGHT_BYTES, activation_bytes, estimate_memory, estimate_rank
from gptrain.plan.sizes import megatron_parameter_lines, rank_parameters
from gptrain.plan.spec import SPLIT_KEYS, Layout, Workload, layout_from_config, workload_from_config
from gptrain.plan.time import estimate_step_time
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


def gpt3_126m() -> Workload:
    return workload_from_config(load_training_config("gpt3/126m", []))


def gpt3_126m_compute(recompute: str | None, first: int | None) -> float:
    """The step time's compute term for gpt3/126m at pp=2 x dp=4 on 8 H100s, `first` layers on rank 0."""
    work = gpt3_126m()
    layout = Layout(
        pp=2, dp=4, micro_batch_size=1, recompute=recompute, num_layers_in_first_pipeline_stage=first
    )
    return estimate_step_time(work, layout, build_cluster(1, None, None), mfu=0.5).compute


@pytest.mark.parametrize(
    ("first", "most_layers", "recompute"),
    [(None, 6, None), (2, 10, None), (None, 6, "selective"), (2, 10, "selective")],
)
def test_compute_is_that_of_the_rank_with_the_most_layers(
    first: int | None, most_layers: int, recompute: str | None
) -> None:
    """Every rank waits for the fullest one: [2, 10] paces at 10 layers, not the average 6. Hand
    count per token (Megatron's): 72 h^2 + 6 h s per layer (f = 4h), 6 h V for the logits, spread
    over the 2 stages; selective recompute adds each of the rank's layers' attention core forward,
    2 h s. Over the 4 GPUs of a stage at half the bf16 peak. All float64: within rounding."""
    work = gpt3_126m()
    c = work.padded(1)
    h, s, vocab = c.hidden_size, c.seq_length, c.vocab_size
    assert (c.ffn_size, c.gated_mlp, c.query_groups, vocab) == (4 * h, False, c.num_attention_heads, 50304)
    per_layer = 72 * h * h + 6 * h * s + (2 * h * s if recompute == "selective" else 0)
    tokens = work.global_batch_size * s
    expected = tokens * (most_layers * per_layer + 6 * h * vocab / 2) / (4 * 989.4e12 * 0.5)
    assert gpt3_126m_compute(recompute, first) == pytest.approx(expected, rel=1e-12)


def test_an_even_split_keeps_the_whole_models_flops_over_every_gpu() -> None:
    """Even: the compute is the model's FLOPs per step over the 8 GPUs, as before the pacing rank."""
    work = gpt3_126m()
    flops = megatron_flops_per_iteration(work.padded(1), work.global_batch_size)
    assert gpt3_126m_compute(None, None) == pytest.approx(flops / (8 * 989.4e12 * 0.5), rel=1e-12)
