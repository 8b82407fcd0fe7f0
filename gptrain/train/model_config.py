"""The model-only config of a training config (no torch: `gptrain plan` uses it on a login node)."""

from __future__ import annotations

from typing import Any

from gptrain.models.config import GPTConfig


def build_model_config(cfg: Any, vocab_size: int) -> GPTConfig:
    """GPTConfig from `cfg.model` and the padded vocabulary (gptrain.models never sees the job config)."""
    m = cfg.model
    return GPTConfig(
        vocab_size=vocab_size,
        seq_length=m.encoder_seq_length,
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        position_embedding_type=m.position_embedding_type,
        rotary_percentage=m.rotary_percentage,
        rotary_base=m.rotary_base,
        activation=m.activation,
        openai_gelu=m.openai_gelu,
        normalization="layernorm" if m.normalization == "layernorm1p" else m.normalization,
        layernorm_epsilon=m.layernorm_epsilon,
        bias=m.bias,
        share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        init_method_std=m.init_method_std,
        apply_residual_scaling_init=m.use_scaled_init_method,
        max_position_embeddings=m.max_position_embeddings,
    )
