"""FSDP's float8 all-gather in the planner: FP8 block weights move and live gathered in 1 byte.

The counts are checked against a block small enough to add up by hand, and the differences the
gather makes against the formula of gptrain.plan.time's docstring.
"""

from __future__ import annotations

import dataclasses

import pytest
from plan_helpers import TINY

from gptrain.config import load_training_config
from gptrain.models.config import GPTConfig
from gptrain.models.flops import layer_parameters
from gptrain.plan.hardware import Cluster, gpu_spec
from gptrain.plan.memory import estimate_rank, float8_gathered_weights
from gptrain.plan.sizes import rank_parameters
from gptrain.plan.spec import Layout, Workload, workload_from_config
from gptrain.plan.time import estimate_step_time

# hidden 32, 4 heads, ffn 128: q, k, v, o are 32 x 32 and the MLP 32 x 128 and 128 x 32, all
# multiples of 16, so every block linear is float8: 4 x 1,024 + 2 x 4,096 = 12,288 weights a block.
BLOCK_FLOAT8 = 4 * 32 * 32 + 2 * 32 * 128
FSDP8 = Layout(dp=8, sharding="full_shard", dp_shard=8)


def workload(gather: bool, fp8: bool = True) -> Workload:
    model = GPTConfig(
        vocab_size=96, seq_length=32, num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=128
    )
    return Workload(
        model=model,
        make_vocab_size_divisible_by=64,
        global_batch_size=16,
        precision="bf16",
        fp8=fp8,
        fp8_fsdp_gather=gather,
    )


def test_float8_gathered_weights_by_hand() -> None:
    work = workload(gather=True)
    config = work.padded(1)
    assert float8_gathered_weights(work, config, FSDP8) == BLOCK_FLOAT8
    assert float8_gathered_weights(work, config, Layout(dp=8)) == 0  # DDP gathers nothing
    assert float8_gathered_weights(workload(gather=False), config, FSDP8) == 0
    assert float8_gathered_weights(workload(gather=True, fp8=False), config, FSDP8) == 0


def test_float8_gather_halves_the_gathered_block_weights_bytes() -> None:
    """bf16: each gathered float8 weight takes 1 byte instead of 2, twice (two blocks gathered)."""
    plain = estimate_rank(workload(gather=False), FSDP8, 0)
    gathered = estimate_rank(workload(gather=True), FSDP8, 0)
    assert plain.transient - gathered.transient == 2 * (2 - 1) * BLOCK_FLOAT8
    assert dataclasses.replace(plain, transient=0) == dataclasses.replace(gathered, transient=0)


def test_float8_gather_saves_one_byte_per_weight_in_each_block_gather() -> None:
    """Two micro batches per rank: full_shard gathers the blocks for each forward and each
    backward (4 times), the root (embedding, norm) once per micro batch, and reduce-scatters the
    fp32 gradients per micro batch; float8 block weights move 1 byte instead of 2."""
    cluster = Cluster(1, 8, gpu_spec("h100-80gb"))
    plain = estimate_step_time(workload(gather=False), FSDP8, cluster, mfu=0.4)
    gathered = estimate_step_time(workload(gather=True), FSDP8, cluster, mfu=0.4)
    config = workload(gather=False).padded(1)
    params = max(rank_parameters(config, 1, 1))
    blocks = 2 * layer_parameters(config)
    float8 = 2 * BLOCK_FLOAT8  # two layers
    m = FSDP8.microbatches(16)
    rest = m * 2 * (params - blocks) + m * 4 * params
    expected_ratio = (2 * m * (2 * (blocks - float8) + float8) + rest) / (2 * m * 2 * blocks + rest)
    assert gathered.dp_comm / plain.dp_comm == pytest.approx(expected_ratio, rel=1e-12)
    assert gathered.compute == plain.compute and gathered.tp_comm == plain.tp_comm


@pytest.mark.parametrize(
    ("overrides", "gather"),
    [
        (["model.fp8=true"], True),
        (["model.fp8=true", "model.fp8_recipe=rowwise"], False),
        (["model.fp8=true", "model.fp8_fsdp_all_gather=false"], False),
        ([], False),
    ],
)
def test_workload_takes_the_gather_from_the_config(overrides: list[str], gather: bool) -> None:
    cfg = load_training_config("gpt3/126m", [*TINY, *overrides])
    assert workload_from_config(cfg).fp8_fsdp_gather is gather
