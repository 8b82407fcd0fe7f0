"""What gptrain's tensor-parallel collectives carry under bf16 autocast (2 gloo ranks, CPU autocast).

tp_autocast_worker.py runs one forward/backward of a 2-layer TP2 model, with sequence parallelism
(GELU, learned positions, tied output) and without (SwiGLU, rope, grouped queries, untied), as
gptrain builds it and with its input cast made a no-op (the earlier fp32 gather and reductions).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

LAYERS = 2
BASE = {"precision": "bf16", "layers": LAYERS, "mbs": 4, "gbs": 4}
SPECS = {
    "sp": {**BASE, "model": {"tensor_model_parallel_size": 2, "sequence_parallel": True}},
    "no_sp": {
        **BASE,
        "model": {"tensor_model_parallel_size": 2},
        "positions": "rope",
        "activation": "swiglu",
        "tied": False,
        "query_groups": 2,
    },
}
ACTIVATION = 4 * 16 * 32  # micro batch x seq x hidden (parallel_worker's model)
BF16_UNIT_ROUNDOFF = 2.0**-8


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    from gloo_ranks import run_ranks

    out = tmp_path_factory.mktemp("tp_autocast") / "records.json"
    worker = Path(__file__).with_name("tp_autocast_worker.py")
    run_ranks(worker, out, json.dumps(list(SPECS.values())), timeout_s=600)
    return dict(zip(SPECS, json.loads(out.read_text()), strict=True))


def activation_dtypes(record: dict) -> list[str]:
    """Dtypes of the collectives of whole or sequence-split activations, in the order they ran."""
    return [dtype for _, dtype, numel in record["collectives"] if numel in (ACTIVATION, ACTIVATION // 2)]


@pytest.mark.parametrize("layout", list(SPECS))
def test_every_block_and_final_norm_collective_is_bf16_under_bf16_autocast(records, layout) -> None:
    """Per layer, the gathered sublayer inputs (SP: all-gather forward, reduce-scatter backward;
    without SP: their gradients' all-reduce) were fp32, the norm's output: 1.5x the bytes Megatron
    sends. Now every block collective, and the final norm's gather and its gradient's reduction,
    carry bf16; only the embedding's (its fp32 output joins the fp32 residual stream; nothing casts
    it) stay fp32: its forward reduction and, under SP, its gradient's gather."""
    sp = layout == "sp"
    expected = (["float32"] + ["bfloat16"] * (8 * LAYERS + 2) + ["float32"]) if sp else None
    if not sp:
        expected = ["float32"] + ["bfloat16"] * (4 * LAYERS + 1)
    assert activation_dtypes(records[layout]["cast"]) == expected, records[layout]["cast"]["collectives"]
    # the recorder sees fp32 where it was sent: the uncast model's gathered inputs, or the gradients
    uncast = activation_dtypes(records[layout]["uncast"])
    assert len(uncast) == len(expected) and uncast.count("float32") == (
        2 + 2 * (2 * LAYERS + 1) if sp else 1 + 2 * LAYERS + 1
    ), uncast


@pytest.mark.parametrize("layout", list(SPECS))
def test_the_cast_leaves_the_forward_alone_and_moves_gradients_by_bf16_rounding(records, layout) -> None:
    """The column linears cast their input to bf16 anyway: the loss is bit for bit the uncast one.
    The input gradients are now summed (q, k, v; w1, w3) and reduced in bf16, as Megatron does: a
    reduced gradient takes at most three bf16 roundings (two sums, one reduction; ~u each, relative
    to it), and every parameter's gradient is linear in those, so each moves by a few u of its
    norm (measured: up to 2.4u). The key bias is left out: softmax does not see it (q.b is the same
    for every key), so its gradient is 0 but for rounding in both runs."""
    cast, uncast = records[layout]["cast"], records[layout]["uncast"]
    assert cast["loss"] == uncast["loss"]
    moved = 0
    for name, expected in uncast["grads"].items():
        if name.endswith("attention.wk.bias"):
            continue
        actual = cast["grads"][name]
        norm = math.sqrt(sum(e * e for e in expected))
        diff = math.sqrt(sum((a - e) ** 2 for a, e in zip(actual, expected, strict=True)))
        assert diff <= 4 * BF16_UNIT_ROUNDOFF * norm, (name, diff / norm / BF16_UNIT_ROUNDOFF)
        moved += diff > 0
    assert moved > 0  # the backward did change: its reductions are bf16 now
