"""Under autocast, linears that read one input run as one GEMM while they are plain: same numbers,
no more memory."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT, concatenated_linears, fused_linears, separate_projections

GEMMS = {"aten.mm.default", "aten.addmm.default"}  # a linear folds its batch dims into one of these


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    def gemms(self) -> int:
        return sum(n for op, n in self.ops.items() if op in GEMMS)


def linears(bias: bool = True, dtype: torch.dtype = torch.float32) -> tuple[nn.Linear, ...]:
    torch.manual_seed(0)
    return tuple(nn.Linear(5, width, bias=bias, dtype=dtype) for width in (6, 4, 4))


def gemms(x: torch.Tensor, layers: tuple[nn.Linear, ...], autocast: bool = True) -> int:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), OpCounter() as counter:
        fused_linears(x, layers)
    return counter.gemms()


@pytest.mark.parametrize("bias", [True, False])
def test_concatenated_matches_separate_in_float64(bias: bool) -> None:
    layers = linears(bias, torch.float64)
    params = [p for layer in layers for p in layer.parameters()]
    x = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    fused = concatenated_linears(x, layers)
    grads_out = [torch.randn_like(t) for t in fused]
    fused_grads = torch.autograd.grad(fused, [*params, x], grads_out)
    separate = [layer(x) for layer in layers]
    separate_grads = torch.autograd.grad(separate, [*params, x], grads_out)
    # one GEMM or three: the same dot products over the same 5 terms, up to float64 rounding
    for a, b in zip([*fused, *fused_grads], [*separate, *separate_grads], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_plain_linears_under_autocast_run_as_one_gemm() -> None:
    x = torch.randn(2, 5)
    assert gemms(x, linears()) == 1
    assert gemms(x, linears(bias=False)) == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = fused_linears(x, linears())
        separate = [layer(x) for layer in linears()]
    for a, b in zip(fused, separate, strict=True):  # the same bf16 casts; fp32 accumulation of 5 terms
        torch.testing.assert_close(a, b)


def test_no_fusion_where_it_would_keep_a_weight_copy() -> None:
    """Without autocast (fp32), or with 16-bit weights (FSDP's bf16 gather), the backward would keep
    the concatenated weight as an extra copy: the linears run alone."""
    x = torch.randn(2, 5)
    assert gemms(x, linears(), autocast=False) == 3
    assert gemms(x.bfloat16(), linears(dtype=torch.bfloat16)) == 3


class Subclassed(nn.Linear):
    """Stands for a linear that must run its own forward (torchao's Float8Linear)."""


def test_linears_that_are_not_plain_run_on_their_own() -> None:
    x = torch.randn(2, 5)
    hooked = linears()
    calls: list[str] = []
    hooked[1].register_forward_pre_hook(lambda module, args: calls.append("hook"))
    assert gemms(x, hooked) == 3 and calls == ["hook"]
    assert gemms(x, (*linears()[:2], Subclassed(5, 4))) == 3
    mixed_bias = linears()
    mixed_bias[2].bias = None
    assert gemms(x, mixed_bias) == 3


def block_gemms(activation: str, separate: bool = False) -> tuple[int, int]:
    """GEMMs of one block's attention and MLP under bf16 autocast."""
    config = GPTConfig(
        vocab_size=37, seq_length=8, num_layers=1, hidden_size=16, num_attention_heads=4,
        num_query_groups=2, activation=activation, hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(1))
    if separate:
        separate_projections(model)
    block = model.layers["0"]
    x = torch.randn(2, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with OpCounter() as attention:
            block.attention(x)
        with OpCounter() as mlp:
            block.mlp(x)
    return attention.gemms(), mlp.gemms()


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_block_runs_qkv_and_gate_up_as_one_gemm_each(activation: str) -> None:
    # attention: qkv, wo (the attention core is SDPA's, batched); MLP: w1 (with w3 when gated), w2
    assert block_gemms(activation) == (2, 2)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_pipeline_stages_run_every_projection_alone(activation: str) -> None:
    """A concatenated weight is no parameter, so autocast does not share its 16-bit copy between
    micro-batches: on a pipeline stage each one in flight would keep its own."""
    assert block_gemms(activation, separate=True) == (4, 3 if activation == "swiglu" else 2)
