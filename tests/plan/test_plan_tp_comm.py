"""The planner's tensor-parallel traffic against what training sends.

Per micro batch, tests/distributed/test_tp_autocast_collectives.py records (TP2, bf16 autocast):
4 collectives of b s h elements per layer in bf16 (2 forward, 2 backward; under SP each all-reduce
is an all-gather plus a reduce-scatter, the same bytes), one for the embedding's output in the
residual stream's dtype (fp32 under autocast: its forward reduction, under SP with its gradient's
gather) and one for the final norm's output in bf16 (under SP its gather, the gradient's
reduction in the backward; without SP that all-reduce alone). A ring moves 2 (t - 1) / t of each.
"""

from __future__ import annotations

import pytest

from gptrain.config import load_training_config
from gptrain.plan.hardware import build_cluster
from gptrain.plan.spec import Layout, workload_from_config
from gptrain.plan.time import estimate_step_time

# gpt3/126m: 12 layers, h 768, seq 2048, global batch 256; one node of 8 H100s (NVLink 450 GB/s)
LAYERS, HIDDEN, SEQ, BATCH, NVLINK = 12, 768, 2048, 256, 450e9


def tp_seconds(layout: Layout, precision: str = "bf16-mixed") -> float:
    work = workload_from_config(load_training_config("gpt3/126m", [f"trainer.precision={precision}"]))
    return estimate_step_time(work, layout, build_cluster(1, None, None), mfu=0.5).tp_comm


def ring(tp: int, micro_batch: int) -> float:
    """Seconds one collective of a micro batch's b s h elements takes per byte of an element."""
    return 2 * (tp - 1) / tp * micro_batch * SEQ * HIDDEN / NVLINK


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_tp_traffic_is_every_block_collective_in_bf16_and_the_embedding_and_final_norm(
    sequence_parallel: bool,
) -> None:
    """The four per layer were counted (in 16 bits, as gptrain now sends them), the embedding's
    fp32 reduction and the final norm's gather were not: 96 of the 102 bytes per element here."""
    layout = Layout(tp=2, dp=4, micro_batch_size=2, sequence_parallel=sequence_parallel)
    microbatches = BATCH // (2 * 4)
    per_microbatch = 4 * LAYERS * 2 + 4 + 2
    assert tp_seconds(layout) == pytest.approx(microbatches * per_microbatch * ring(2, 2), rel=1e-12)


def test_fp32_sends_every_tp_collective_in_fp32() -> None:
    layout = Layout(tp=4, dp=2, micro_batch_size=1, sequence_parallel=True)
    microbatches = BATCH // 2
    expected = microbatches * (4 * LAYERS * 4 + 4 + 4) * ring(4, 1)
    assert tp_seconds(layout, "32") == pytest.approx(expected, rel=1e-12)


def test_under_a_pipeline_the_embedding_is_on_the_first_rank_and_the_final_norm_on_the_last() -> None:
    """TP2 x PP2, 6 layers each: the first rank sends 6 x 4 x 2 + 4 bytes per element, the last
    6 x 4 x 2 + 2; the step waits for the first. With a first stage of 5 layers the last (7) sends
    the most: 7 x 4 x 2 + 2. Full recompute runs each block's 2 forward collectives again."""
    even = Layout(tp=2, pp=2, dp=2, micro_batch_size=1, sequence_parallel=True)
    assert tp_seconds(even) == pytest.approx(BATCH // 2 * (6 * 8 + 4) * ring(2, 1), rel=1e-12)
    uneven = Layout(tp=2, pp=2, dp=2, micro_batch_size=1, num_layers_in_first_pipeline_stage=5)
    assert tp_seconds(uneven) == pytest.approx(BATCH // 2 * (7 * 8 + 2) * ring(2, 1), rel=1e-12)
    recompute = Layout(tp=2, pp=2, dp=2, micro_batch_size=1, recompute="full", recompute_num_layers=6)
    assert tp_seconds(recompute) == pytest.approx(BATCH // 2 * (6 * 12 + 4) * ring(2, 1), rel=1e-12)


def test_under_fsdp_in_bf16_the_embedding_output_is_reduced_in_bf16() -> None:
    """FSDP gathers the embedding in bf16, so its output (the whole stream) is bf16 too."""
    layout = Layout(tp=2, dp=4, micro_batch_size=2, sharding="full_shard", sequence_parallel=True)
    expected = BATCH // 8 * (4 * LAYERS * 2 + 2 + 2) * ring(2, 2)
    assert tp_seconds(layout) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("method_layers", "rebuilt"), [(None, 12), (12, 12), (3, 3), (0, 0)])
def test_full_recompute_reruns_the_forward_collectives_of_the_checkpointed_blocks_only(
    method_layers: int | None, rebuilt: int
) -> None:
    """Full recompute with method block checkpoints the first N blocks of a chunk: only those run
    their 2 forward collectives again in the backward. Every layer was counted at 6 whatever N."""
    layout = Layout(tp=2, dp=4, micro_batch_size=2, recompute="full", recompute_num_layers=method_layers)
    per_microbatch = 4 * LAYERS * 2 + 2 * rebuilt * 2 + 4 + 2
    assert tp_seconds(layout) == pytest.approx(BATCH // 8 * per_microbatch * ring(2, 2), rel=1e-12)


def test_under_a_pipeline_each_rank_reruns_the_collectives_of_its_own_checkpointed_blocks() -> None:
    """TP2 x PP2 x VPP2, 3 layers a chunk, the first 2 of each checkpointed: 4 rebuilt blocks a
    rank (not 6), so the first rank sends 6 x 8 + 4 x 4 + 4 bytes per element."""
    layout = Layout(tp=2, pp=2, vpp=2, dp=2, micro_batch_size=1, recompute="full", recompute_num_layers=2)
    assert tp_seconds(layout) == pytest.approx(BATCH // 2 * (6 * 8 + 4 * 4 + 4) * ring(2, 1), rel=1e-12)
