"""The rebuild of a checkpointed block with a narrow MLP (ffn_hidden_size < 2h) peaks in its forward."""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.plan.rank_activations import rebuild_bytes
from gptrain.plan.spec import Layout
from tests.plan.test_plan_recompute import (
    FULL,
    fsdp_activation_trace,
    one_rank_mesh,
    recompute_fields,
    workload,
)

torch = pytest.importorskip("torch")

__all__ = ["one_rank_mesh"]  # the fixture, shared with test_plan_recompute


@pytest.mark.parametrize(
    ("activation", "ffn"), [("gelu", 16), ("gelu", 48), ("gelu", 64), ("swiglu", 16), ("swiglu", 32)]
)
@pytest.mark.parametrize("precision", ["bf16", "16"])
@pytest.mark.parametrize("mode", FULL[:2])
def test_a_narrow_mlps_rebuild_holds_the_second_norms_output(
    mode: tuple, precision: str, activation: str, ffn: int
) -> None:
    """Replicated mixed precision, h = 32, 320 tokens: the rebuild's forward reaches the MLP's
    activation holding every saved tensor of the block, the fp32 residual gradient and its 16-bit
    cast, and the second norm's fp32 output (the block hands it to its MLP; the linears save only
    its cast): 4h bytes a token where the backward after it holds the gradient of the down
    projection's input, 2f (GELU; SwiGLU 2f + max(2f, 2h)). The estimate took the backward's:
    GELU 96, 32 and 0 bytes a token under at f = 16, 48, 64 (2(2h - f) below 2h), SwiGLU 96 and 64
    at f = 16, 32. Activations only, exactly (CUDA's norm policy, no dropout)."""
    work = dataclasses.replace(
        workload(precision, activation=activation, ffn_hidden_size=ffn),
        device_type="cuda",
        global_batch_size=5,
    )
    layout = Layout(**recompute_fields(mode, 5))
    _, rebuild = fsdp_activation_trace(work, 5, mode)
    assert rebuild == rebuild_bytes(work, layout, 0)


@pytest.mark.parametrize("ffn", [32, 128])
def test_a_narrow_mlps_rebuild_under_fsdp_with_bf16(one_rank_mesh, ffn: int) -> None:
    """FSDP with bf16 (CUDA's fp32 norms): the bf16 residual gradient, no cast, and the second
    norm's fp32 output: at f = h, 2h + 4h bytes a token against the backward's 2h + 2f."""
    work = dataclasses.replace(
        workload("bf16", ffn_hidden_size=ffn), device_type="cuda", global_batch_size=20
    )
    layout = Layout(micro_batch_size=5, dp=2, sharding="full_shard", dp_shard=2, recompute="full")
    _, rebuild = fsdp_activation_trace(work, 5, FULL[0], one_rank_mesh)
    assert rebuild == rebuild_bytes(work, layout, 0)
