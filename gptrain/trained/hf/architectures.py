"""Which transformers class expresses a gptrain model, and the config of each side (no torch).

GPT-2/3 shapes (learned positions, LayerNorm, exact-erf GELU MLP) map to `GPT2LMHeadModel`;
rope + LayerNorm + SwiGLU without biases (the `_improved` presets) to `StableLmForCausalLM`,
whose partial rotary rotates the first dims of each head in the rotate-half layout as gptrain
does; rope + RMSNorm + SwiGLU to `LlamaForCausalLM` (whole-head rotary only). Anything else is
refused in one line naming the option, never approximated.
"""

from __future__ import annotations

from typing import Any

from gptrain.errors import ConfigError, DataError
from gptrain.models.config import GPTConfig

GPT2, STABLELM, LLAMA = "gpt2", "stablelm", "llama"
CLASS_NAMES = {GPT2: "GPT2LMHeadModel", STABLELM: "StableLmForCausalLM", LLAMA: "LlamaForCausalLM"}
# The gptrain preset an imported model's training config starts from (shapes are overridden).
# transformers' GPT-2 activations gptrain has: the erf GELU, and its tanh approximation (openai_gelu)
GPT2_GELUS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
BASE_PRESETS = {GPT2: "gpt3/126m", STABLELM: "gpt3/400m_improved", LLAMA: "gpt3/400m_improved"}
# The default sample length of an imported run: a model's whole context (16384 for CodeLlama,
# 200000 for Yi-200K) as samples, at the preset's global batch of 256, is memory nobody asked for.
DEFAULT_SEQ_LENGTH_CAP = 4096


def choose_architecture(config: GPTConfig) -> str:
    """GPT2, STABLELM or LLAMA for `config`; ConfigError naming the option transformers lacks."""
    if config.position_embedding_type == "learned_absolute":
        return _check_gpt2(config)
    if not config.gated_mlp:
        _refuse(
            "activation", config.activation, "rope models export as StableLM or Llama, whose MLP is SwiGLU"
        )
    if config.normalization == "layernorm":
        return _check_stablelm(config)
    return _check_llama(config)


def _refuse(key: str, value: object, why: str) -> None:
    raise ConfigError(f"cannot export model.{key}={value} to Hugging Face: {why}")


def _require_head_dim_from_width(config: GPTConfig, why: str) -> None:
    """GPT-2 and StableLM derive the head dim from the width; only Llama takes kv_channels apart."""
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        _refuse("kv_channels", config.kv_channels, f"{why}, whose head dim is hidden_size / heads")


def _check_gpt2(config: GPTConfig) -> str:
    why = "learned position embeddings export as GPT2LMHeadModel"
    if config.gated_mlp:
        _refuse("activation", config.activation, f"{why}, whose MLP is GELU (use rope for SwiGLU)")
    if config.normalization != "layernorm":
        _refuse("normalization", config.normalization, f"{why}, which has LayerNorm")
    if config.query_groups != config.num_attention_heads:
        _refuse("num_query_groups", config.num_query_groups, f"{why}, which has no grouped-query attention")
    _require_head_dim_from_width(config, why)
    return GPT2


def _check_stablelm(config: GPTConfig) -> str:
    why = "rope + LayerNorm + SwiGLU exports as StableLmForCausalLM"
    if config.bias:
        _refuse("bias", config.bias, f"{why}, which has no bias on o_proj and the MLP")
    _require_head_dim_from_width(config, why)
    return STABLELM


def _check_llama(config: GPTConfig) -> str:
    why = "rope + RMSNorm + SwiGLU exports as LlamaForCausalLM"
    if config.rotary_percentage != 1.0:
        _refuse("rotary_percentage", config.rotary_percentage, f"{why}, which rotates whole heads")
    if config.hidden_size % config.num_attention_heads:
        _refuse(
            "num_attention_heads", config.num_attention_heads, f"{why}, which needs it to divide hidden_size"
        )
    return LLAMA


def hf_config_kwargs(
    config: GPTConfig, arch: str, vocab_size: int, token_ids: dict[str, int | None]
) -> dict[str, Any]:
    """Keyword arguments of the transformers config class for `arch` (vocabulary unpadded;
    `token_ids`: bos_token_id, eos_token_id and maybe pad_token_id)."""
    tokens = {**token_ids, "tie_word_embeddings": _tied(config)}
    if arch == GPT2:
        return {
            "vocab_size": vocab_size,
            "n_positions": config.position_rows,
            "n_embd": config.hidden_size,
            "n_layer": config.num_layers,
            "n_head": config.num_attention_heads,
            "n_inner": config.ffn_size,
            # exact erf GELU, or its tanh approximation as the kernel gptrain runs: GPT-2's own
            # "gelu_new" is the same formula as separate ops, which round apart in bf16/fp16
            "activation_function": "gelu_pytorch_tanh" if config.openai_gelu else "gelu",
            "resid_pdrop": config.hidden_dropout,
            "embd_pdrop": config.hidden_dropout,
            "attn_pdrop": config.attention_dropout,
            "layer_norm_epsilon": config.layernorm_epsilon,
            "initializer_range": config.init_method_std,
            **tokens,
        }
    common = {
        "vocab_size": vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.query_groups,
        "hidden_act": "silu",
        # model.max_position_embeddings where it is above the training length, as GPT-2's n_positions
        "max_position_embeddings": config.max_positions,
        "attention_dropout": config.attention_dropout,
        "initializer_range": config.init_method_std,
        **tokens,
    }
    rope = {"rope_type": "default", "rope_theta": float(config.rotary_base)}
    if arch == STABLELM:
        rope["partial_rotary_factor"] = config.rotary_percentage
        return {
            **common,
            "rope_parameters": rope,
            "layer_norm_eps": config.layernorm_epsilon,
            "hidden_dropout": config.hidden_dropout,
            "use_qkv_bias": False,
            "qk_layernorm": False,
            "use_parallel_residual": False,
        }
    return {
        **common,
        "rope_parameters": rope,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.layernorm_epsilon,
        "attention_bias": config.bias,
        "mlp_bias": config.bias,
    }


def _tied(config: GPTConfig) -> bool:
    return config.share_embeddings_and_output_weights


def architecture_of(hf_config: Any, source: str) -> str:
    """GPT2, STABLELM or LLAMA from a transformers config's model_type."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in CLASS_NAMES:
        supported = ", ".join(f"{kind} ({name})" for kind, name in CLASS_NAMES.items())
        raise DataError(
            f"{source}: model_type {model_type!r} cannot be imported; supported model_type: {supported}"
        )
    return model_type


def model_overrides(hf_config: Any, arch: str, source: str) -> dict[str, Any]:
    """The `model.*` training-config values that rebuild the transformers model in gptrain, its
    context as model.max_position_embeddings (the length of the samples it trains on is the
    importer's choice: model.encoder_seq_length)."""
    _refuse_quantized(hf_config, source)
    if arch == GPT2:
        return _gpt2_overrides(hf_config, source)
    return _rope_overrides(hf_config, arch, source)


def _refuse_quantized(hf_config: Any, source: str) -> None:
    """A GPTQ/AWQ/bitsandbytes checkpoint stores packed integer weights under the model's own
    model_type: it was refused as a missing or misshapen tensor, or died in transformers' load."""
    quantization = getattr(hf_config, "quantization_config", None)
    if not quantization:
        return
    method = (
        quantization.get("quant_method")
        if isinstance(quantization, dict)
        else getattr(quantization, "quant_method", None)
    )
    raise DataError(
        f"{source}: quantization_config (quant_method {method}): a quantized model cannot be imported "
        "(gptrain trains floating-point weights); import the model it was quantized from"
    )


def _require(source: str, key: str, value: object, expected: object, why: str) -> None:
    if value != expected:
        raise DataError(f"{source}: {key}={value!r} cannot be imported ({why}); gptrain needs {expected!r}")


def _gpt2_overrides(c: Any, source: str) -> dict[str, Any]:
    if c.activation_function not in GPT2_GELUS:
        raise DataError(
            f"{source}: activation_function={c.activation_function!r} cannot be imported "
            f"(gptrain has the erf GELU and its tanh approximation: {', '.join(GPT2_GELUS)})"
        )
    _require(source, "scale_attn_weights", c.scale_attn_weights, True, "gptrain scales by 1/sqrt(head dim)")
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        _require(source, key, bool(getattr(c, key, False)), False, "gptrain has no such attention")
    return {
        "num_layers": c.n_layer,
        "hidden_size": c.n_embd,
        "num_attention_heads": c.n_head,
        "num_query_groups": None,
        "kv_channels": None,
        "ffn_hidden_size": c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        "max_position_embeddings": c.n_positions,
        "position_embedding_type": "learned_absolute",
        "activation": "gelu",
        "openai_gelu": GPT2_GELUS[c.activation_function],
        # the preset's fused bias-GELU would make an erf model's GELU the tanh one (see ModelConfig)
        "bias_activation_fusion": GPT2_GELUS[c.activation_function],
        "normalization": "layernorm",
        "layernorm_epsilon": c.layer_norm_epsilon,
        "bias": True,
        "share_embeddings_and_output_weights": bool(c.tie_word_embeddings),
        "hidden_dropout": c.resid_pdrop,
        "attention_dropout": c.attn_pdrop,
        "init_method_std": c.initializer_range,
    }


# transformers' ACT2FN runs "swish" as the same SiLU as "silu" (older Llama configs write it)
SILU_NAMES = ("silu", "swish")


def _rope_overrides(c: Any, arch: str, source: str) -> dict[str, Any]:
    hidden_act = "silu" if c.hidden_act in SILU_NAMES else c.hidden_act
    _require(source, "hidden_act", hidden_act, "silu", "gptrain's gated MLP is SwiGLU")
    rope = dict(c.rope_parameters or {})
    _require(
        source, "rope_parameters.rope_type", rope.get("rope_type", "default"), "default", "no rope scaling"
    )
    theta = float(rope.get("rope_theta", 10000.0))
    _require(
        source, "rope_parameters.rope_theta", theta, float(int(theta)), "gptrain's rotary_base is an integer"
    )
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    out = {
        "num_layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "num_query_groups": c.num_key_value_heads,
        "kv_channels": head_dim if head_dim * c.num_attention_heads != c.hidden_size else None,
        "ffn_hidden_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": int(theta),
        "activation": "swiglu",
        "share_embeddings_and_output_weights": bool(c.tie_word_embeddings),
        "attention_dropout": float(c.attention_dropout or 0.0),
        "init_method_std": c.initializer_range,
    }
    if arch == STABLELM:
        for key in ("use_qkv_bias", "qk_layernorm", "use_parallel_residual"):
            _require(source, key, bool(getattr(c, key)), False, "gptrain's blocks have no such variant")
        factor = float(rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)))
        _check_rotary_dims(factor, head_dim, source)
        return {
            **out,
            "rotary_percentage": factor,
            "normalization": "layernorm",
            "layernorm_epsilon": c.layer_norm_eps,
            "bias": False,
            "hidden_dropout": float(c.hidden_dropout or 0.0),
        }
    _require(source, "mlp_bias", bool(c.mlp_bias), bool(c.attention_bias), "gptrain has one bias switch")
    factor = float(rope.get("partial_rotary_factor", 1.0))
    _require(source, "rope_parameters.partial_rotary_factor", factor, 1.0, "Llama rotates whole heads")
    return {
        **out,
        "rotary_percentage": 1.0,
        "normalization": "rmsnorm",
        "layernorm_epsilon": c.rms_norm_eps,
        "bias": bool(c.attention_bias),
        "hidden_dropout": 0.0,
    }


def _check_rotary_dims(factor: float, head_dim: int, source: str) -> None:
    """StableLM rotates int(head dim x partial_rotary_factor) dims of each head, as gptrain does with
    model.rotary_percentage, in pairs; refused here, naming the key of config.json (gptrain's own
    check named model.rotary_percentage, after the weights and the tokenizer were read)."""
    rotary = int(head_dim * factor)
    if not 2 <= rotary <= head_dim or rotary % 2:
        raise DataError(
            f"{source}: rope_parameters.partial_rotary_factor={factor!r} of head dim {head_dim} gives {rotary} "
            f"rotary dims, which cannot be imported (rotary dims turn in pairs); gptrain needs an even number "
            f"from 2 to {head_dim}"
        )
