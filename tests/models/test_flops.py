"""Vocab padding, parameter counts (vs the built model and Megatron's table), FLOPs, peak TFLOP/s."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.flops import (
    PEAK_TFLOPS,
    count_parameters,
    device_peak_tflops,
    embedding_parameters,
    layer_parameters,
    megatron_flops_per_iteration,
    pad_vocab_size,
)
from gptrain.models.gpt import GPT

BASE = dict(vocab_size=128, seq_length=32, num_layers=3, hidden_size=48, num_attention_heads=6)
COUNT_VARIANTS = [
    {},
    dict(position_embedding_type="rope"),
    dict(activation="swiglu", ffn_hidden_size=100),
    dict(normalization="rmsnorm"),
    dict(bias=False),
    dict(num_query_groups=2),
    dict(num_query_groups=1, kv_channels=12),
    dict(share_embeddings_and_output_weights=False),
    dict(
        position_embedding_type="rope",
        activation="fast-swiglu",
        normalization="rmsnorm",
        bias=False,
        num_query_groups=3,
        share_embeddings_and_output_weights=False,
    ),
]


@pytest.mark.parametrize(
    "vocab, divisible_by, tp, expected",
    [
        (50257, 128, 1, 50304),
        (50257, 128, 2, 50432),
        (50304, 128, 1, 50304),
        (1, 128, 8, 1024),
        (100, 1, 1, 100),
    ],
)
def test_pad_vocab_size(vocab, divisible_by, tp, expected):
    assert pad_vocab_size(vocab, divisible_by, tp) == expected


def test_pad_vocab_size_rejects_bad_values():
    with pytest.raises(ConfigError, match="make_vocab_size_divisible_by"):
        pad_vocab_size(50257, 0)
    with pytest.raises(ConfigError, match="vocab_size"):
        pad_vocab_size(-3)


@pytest.mark.parametrize(
    "overrides", COUNT_VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_count_parameters_equals_the_built_model(overrides):
    config = GPTConfig(**BASE, **overrides)
    with torch.device("meta"):
        model = GPT(config)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    assert layer_parameters(config) == sum(p.numel() for p in model.layers["0"].parameters())
    embeddings = model.tok_embeddings.weight.numel()
    if model.pos_embeddings is not None:
        embeddings += model.pos_embeddings.weight.numel()
    assert embedding_parameters(config) == embeddings


def test_classic_gpt_count_matches_the_closed_form():
    # 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)) + final layernorm 2h (Narayanan et al. 2021).
    config = GPTConfig(
        vocab_size=51200, seq_length=2048, num_layers=24, hidden_size=2048, num_attention_heads=16
    )
    h, layers = 2048, 24
    assert count_parameters(config) == 12 * layers * h * h + 13 * layers * h + (51200 + 2048) * h + 2 * h


@pytest.mark.parametrize(
    "hidden, layers, heads, billions",
    [
        (2304, 24, 24, "1.7"),
        (3072, 30, 32, "3.6"),
        (4096, 36, 32, "7.5"),
        (6144, 40, 48, "18.4"),
        (8192, 48, 64, "39.1"),
        (10240, 60, 80, "76.1"),
        (12288, 80, 96, "145.6"),
        (16384, 96, 128, "310.1"),
    ],
)
def test_megatron_published_parameter_table(hidden, layers, heads, billions):
    config = GPTConfig(
        vocab_size=pad_vocab_size(50257, 1024),  # the table's 51,200
        seq_length=2048,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
    )
    assert config.vocab_size == 51200
    assert f"{count_parameters(config) / 1e9:.1f}" == billions


@pytest.mark.parametrize(
    "batch, seq, layers, hidden, vocab", [(512, 2048, 24, 2048, 50304), (8, 128, 2, 64, 1000)]
)
def test_flops_of_a_classic_gpt_match_the_closed_form(batch, seq, layers, hidden, vocab):
    config = GPTConfig(
        vocab_size=vocab, seq_length=seq, num_layers=layers, hidden_size=hidden, num_attention_heads=16
    )
    expected = (
        72 * batch * seq * layers * hidden**2 * (1 + seq / (12 * hidden) + vocab / (12 * layers * hidden))
    )
    assert megatron_flops_per_iteration(config, batch) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(activation="swiglu", ffn_hidden_size=40, num_query_groups=2, position_embedding_type="rope")],
)
def test_flops_match_counted_matmuls_of_forward_and_backward(overrides):
    """torch's FlopCounter over one forward+backward: matmuls as counted, attention halved (causal)."""
    config = GPTConfig(**{**BASE, **overrides, "hidden_dropout": 0.0, "attention_dropout": 0.0})
    model = GPT(config)
    batch = 2
    tokens = torch.randint(0, config.vocab_size, (batch, config.seq_length))
    # The math backend runs attention as counted bmm ops (the fused CPU kernel is not counted).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).sum().backward()
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    # Only attention uses batched matmuls (SDPA's math path on CPU) or an SDPA kernel.
    is_attention = {op: "bmm" in op or "attention" in op for op in counts}
    attention = sum(flops for op, flops in counts.items() if is_attention[op])
    matmuls = sum(flops for op, flops in counts.items() if not is_attention[op])
    assert attention > 0 and matmuls > 0
    assert megatron_flops_per_iteration(config, batch) == pytest.approx(matmuls + attention / 2, rel=1e-12)


def test_flops_reject_bad_batch():
    with pytest.raises(ConfigError, match="global_batch_size"):
        megatron_flops_per_iteration(GPTConfig(**BASE), 0)


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.4),
        ("NVIDIA H100 80GB HBM3", "torch.bfloat16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H200", "16-mixed", 989.4),
        ("NVIDIA H200 NVL", "bf16", 835.5),  # the H100 NVL's peak, not the SXM H200's
        ("NVIDIA H800", "bf16", 989.4),
        ("NVIDIA H800 PCIe", "bf16", 756.5),  # the H100 PCIe's tensor cores, not the SXM's
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA GB200", "bf16", 2500.0),  # not the HGX B200's 2250
        ("NVIDIA GB200", "fp8", 5000.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "fp16", 312.0),
        ("NVIDIA A100-SXM4-40GB", "32", 19.5),
        ("NVIDIA A10", "bf16", 125.0),
        ("NVIDIA A10G", "bf16", None),
        ("NVIDIA L40", "bf16", 181.05),  # not the L4's 121
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("Tesla V100-SXM2-32GB", "bf16", None),
        ("NVIDIA GeForce RTX 2080", "bf16", None),
        ("NVIDIA H100 80GB HBM3", "int4", None),
    ],
)
def test_device_peak_tflops(name, dtype, expected):
    assert device_peak_tflops(name, dtype) == expected


def test_peak_table_patterns_do_not_shadow_each_other():
    patterns = list(PEAK_TFLOPS)
    for i, later in enumerate(patterns):
        for earlier in patterns[:i]:
            assert earlier.lower() not in later.lower(), f"{earlier!r} would match {later!r} first"


def test_formulas_do_not_import_torch():
    """`gptrain plan` and the launcher use them on login nodes, where importing torch is slow."""
    import subprocess
    import sys

    code = "import sys, gptrain.models.flops, gptrain.models.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
