"""The architecture settings a checkpoint was trained with, recorded beside it and checked at resume.

The shape check (gptrain.checkpoint.compat) misses every setting that changes what the model
computes but no tensor's shape: 8 heads of 64 or 16 of 32 in a 512-wide model, GELU or SwiGLU's
other approximation, the rope base, the norm's epsilon. A run resumed with one changed would load
the weights and train another function with them. Each setting is recorded under its config key,
resolved as the model reads it (null defaults filled in, NeMo's spellings of one function made
one), and only where it takes part in the computation (rope settings with rope only). Settings a
resume may change are left out: dropout, initialisation, sequence length and the position table's
rows, vocabulary padding, precision, the parallel layout, the optimizer and batch sizes.
"""

from __future__ import annotations

from typing import Any

from gptrain.models.config import GPTConfig


def record(config: GPTConfig) -> dict[str, Any]:
    """{config key: value as the model computes with it} of `config`, for a checkpoint's COMPLETE marker."""
    entry: dict[str, Any] = {
        "model.num_layers": config.num_layers,
        "model.hidden_size": config.hidden_size,
        "model.num_attention_heads": config.num_attention_heads,
        "model.num_query_groups": config.query_groups,
        "model.kv_channels": config.head_dim,
        "model.ffn_hidden_size": config.ffn_size,
        "model.activation": "swiglu" if config.gated_mlp else config.activation,
        "model.normalization": config.normalization,
        "model.layernorm_epsilon": config.layernorm_epsilon,
        "model.bias": config.bias,
        "model.share_embeddings_and_output_weights": config.share_embeddings_and_output_weights,
        "model.position_embedding_type": config.position_embedding_type,
    }
    if not config.gated_mlp:
        entry["model.openai_gelu"] = config.openai_gelu
    if config.position_embedding_type == "rope":
        entry["model.rotary_percentage"] = config.rotary_percentage
        entry["model.rotary_base"] = config.rotary_base
    return entry


def changes(saved: dict[str, Any] | None, live: dict[str, Any] | None) -> list[str]:
    """'model.num_attention_heads 8 -> 16' for each key both records hold with other values. A key
    one of them lacks (a checkpoint saved before the record, or by a gptrain that recorded fewer
    keys; a setting that does not apply) is not compared."""
    if not isinstance(saved, dict) or live is None:
        return []
    return [
        f"{key} {_text(saved[key])} -> {_text(value)}{HINTS.get((key, value), '')}"
        for key, value in live.items()
        if key in saved and not _same(saved[key], value)
    ]


# keys the record does not hold that decide a setting it does (normalize derives openai_gelu from the
# fused bias-GELU): an override of one changes that setting on purpose
DECIDING = {"model.bias_activation_fusion": ("model.openai_gelu",)}

# where the old value is not set by its own key: the fused bias-GELU (on by default) makes openai_gelu true
HINTS = {
    ("model.openai_gelu", True): (
        " (model.bias_activation_fusion, true by default as in NeMo and Megatron, runs GELU's tanh "
        "approximation: model.bias_activation_fusion=false keeps the erf GELU)"
    )
}


def _same(saved: Any, live: Any) -> bool:
    """Equal as JSON keeps them: 1 and 1.0 are one value, true and 1 are not."""
    return saved == live and isinstance(saved, bool) == isinstance(live, bool)


def _text(value: Any) -> str:
    """A value as a config override spells it (true, not True)."""
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def mismatch_text(path: object, found: list[str]) -> str:
    """The one line a resume with changed architecture settings stops with."""
    return (
        f"checkpoint {path} was trained with other model settings than the config gives "
        f"({'; '.join(found)}): the weights would load into a model that computes something else; "
        "set the old values (the run's hparams.yaml has them), or start a new run directory "
        "(another run.name) to train the new model, from this checkpoint with exp_manager.resume_from_checkpoint"
    )
