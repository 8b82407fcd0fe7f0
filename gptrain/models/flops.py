"""Closed-form sizes and costs of a GPT: vocab padding, parameter counts, Megatron's FLOPs, peak FLOP/s.

Pure arithmetic on `GPTConfig` (no torch import), so `gptrain plan` and the launcher can use it on a
login node. `count_parameters` equals `sum(p.numel() for p in GPT(config).parameters())` exactly.
"""

from __future__ import annotations

from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.utils.vocab_rows import pad_vocab_size as pad_vocab_size  # re-exported: its callers
from gptrain.utils.vocab_rows import vocab_rows as vocab_rows


def _norm_parameters(config: GPTConfig) -> int:
    # LayerNorm always carries a bias (as Megatron), RMSNorm only a weight.
    return config.hidden_size * (2 if config.normalization == "layernorm" else 1)


def layer_parameters(config: GPTConfig) -> int:
    """Parameters of one transformer block (two norms, attention, MLP)."""
    h, f = config.hidden_size, config.ffn_size
    q = config.num_attention_heads * config.head_dim
    kv = config.query_groups * config.head_dim
    attention = h * (q + 2 * kv) + q * h
    mlp_inputs = 2 if config.gated_mlp else 1
    mlp = mlp_inputs * h * f + f * h
    biases = (q + 2 * kv + h) + (mlp_inputs * f + h) if config.bias else 0
    return 2 * _norm_parameters(config) + attention + mlp + biases


def embedding_parameters(config: GPTConfig) -> int:
    """Token embedding plus the learned position table (if any)."""
    return (config.vocab_size + config.position_rows) * config.hidden_size


def count_parameters(config: GPTConfig) -> int:
    """All parameters of the model, tied embedding/output weights counted once."""
    output = 0 if config.share_embeddings_and_output_weights else config.vocab_size * config.hidden_size
    return (
        embedding_parameters(config)
        + config.num_layers * layer_parameters(config)
        + _norm_parameters(config)
        + output
    )


def megatron_flops_per_iteration(config: GPTConfig, global_batch_size: int) -> float:
    """Model FLOPs of one training iteration (forward + backward), as Megatron-LM counts them.

    6 * tokens * (matmul weights touched per token) plus causal attention 6 * q * L * B * s^2
    (half of the full s x s score matrix). SwiGLU's extra input projection and GQA's smaller
    k/v are included; no activation recomputation is counted, so this is model FLOPs (MFU).
    """
    if (
        isinstance(global_batch_size, bool)
        or not isinstance(global_batch_size, int)
        or global_batch_size <= 0
    ):
        raise ConfigError(f"global_batch_size={global_batch_size!r} must be a positive integer")
    batch, s, layers = global_batch_size, config.seq_length, config.num_layers
    h, f, vocab = config.hidden_size, config.ffn_size, config.vocab_size
    q = config.num_attention_heads * config.head_dim
    kv = config.query_groups * config.head_dim
    mlp_factor = 3 if config.gated_mlp else 2
    per_token = layers * h * f * mlp_factor + layers * (h * (q + 2 * kv) + q * h) + h * vocab
    token_linear = 6.0 * batch * s * per_token
    core_attention = 6.0 * q * layers * batch * s * s
    return token_linear + core_attention


def megatron_output_flops_per_iteration(config: GPTConfig, global_batch_size: int) -> float:
    """The output layer's (logits') share of `megatron_flops_per_iteration`, 6 * tokens * h * vocab:
    the rest is the transformer layers', equal for each layer."""
    return 6.0 * global_batch_size * config.seq_length * config.hidden_size * config.vocab_size


# Dense (no sparsity) peak tensor TFLOP/s per GPU from the vendors' datasheets. Patterns are matched
# case-insensitively against torch.cuda.get_device_name(); the first match wins, so the more specific
# names come first ("H100 PCIe" before "H100", "A100" before "A10", "GB200" before "B200": the
# Grace-Blackwell GPU runs at a higher power limit than the HGX B200, with higher peaks).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "tf32": 417.5, "fp32": 60.0},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "H800 PCIe": {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2},
    "H800": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "GB200": {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "tf32": 1250.0, "fp32": 80.0},  # before "B200"
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1125.0, "fp32": 75.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A800": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
    "L40": {"bf16": 181.05, "fp16": 181.05, "fp8": 362.1, "tf32": 90.5, "fp32": 90.5},  # before "L4"
    "A10G": {},  # no NVIDIA datasheet: no MFU rather than a wrong one (and it must not match "A10")
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp8": 242.0, "tf32": 60.0, "fp32": 30.3},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7, "fp32": 163.4},
}

_DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "16": "fp16",
    "16-mixed": "fp16",
    "16-true": "fp16",
    "fp8": "fp8",
    "tf32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "32": "fp32",
    "32-true": "fp32",
}


def device_peak_tflops(device_name: str, dtype: str) -> float | None:
    """Peak dense TFLOP/s of one GPU for MFU, or None when the device or dtype is not in the table.

    device_name as torch.cuda.get_device_name() gives it ("NVIDIA H100 80GB HBM3"); dtype as NeMo or
    torch spell a precision ("bf16-mixed", "bfloat16", "16", "fp32", "torch.float16", ...).
    """
    key = _DTYPE_ALIASES.get(str(dtype).strip().lower().removeprefix("torch."))
    if key is None:
        return None
    name = device_name.lower()
    for pattern, peaks in PEAK_TFLOPS.items():
        if pattern.lower() in name:
            return peaks.get(key)
    return None
