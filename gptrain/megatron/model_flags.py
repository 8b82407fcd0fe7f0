"""Model shape and recompute flags that combine, as Megatron's validate_args reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError
from gptrain.megatron.flag_parsing import convert_value

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


def query_groups(result: Translation) -> None:
    """Megatron reads --num-query-groups only with --group-query-attention (then 1 group, multi-query
    attention, unless given); without it attention is multi-head whatever --num-query-groups says."""
    given = result.given
    groups = convert_value("--num-query-groups", (given.get("--num-query-groups") or ["1"])[0], int)
    if "--group-query-attention" in given:
        result.values["model.num_query_groups"] = groups
    elif "--num-query-groups" in given:
        result.notes.append(
            "--num-query-groups (Megatron ignores it without --group-query-attention: multi-head attention)"
        )


def rotary_switch(result: Translation) -> None:
    """--use-rotary-position-embeddings (Megatron's name for rope before --position-embedding-type) makes
    rope whatever the order: Megatron's validate_args sets it after parsing, so a later
    --position-embedding-type learned_absolute (mid-2023 scripts carry both) does not undo it."""
    if "--use-rotary-position-embeddings" in result.given:
        result.values["model.position_embedding_type"] = "rope"


def openai_gelu(result: Translation) -> None:
    """--openai-gelu is the tanh GELU of Megatron's legacy models only: its core models (the default since
    May 2024, the only ones since May 2026) never read it, and run the fused bias-GELU's tanh with biases,
    the erf GELU without the fusion (as config.normalize decides). Tanh with --use-legacy-models."""
    if "--openai-gelu" not in result.given:
        return
    if "--use-legacy-models" in result.given:
        result.values["model.openai_gelu"] = True
        return
    result.notes.append(
        "--openai-gelu (Megatron's core models, its default since May 2024, do not read it: the fused "
        "bias-GELU is GELU's tanh approximation, erf without the fusion; the legacy models' tanh GELU with "
        "--use-legacy-models)"
    )


def no_position_embedding(result: Translation) -> None:
    """--no-position-embedding drops the learned position table. Beside rope (which has none; Megatron's
    llama-style scripts give both) it changes nothing; without rope Megatron since July 2023 raises
    that it is deprecated, and before it trained without any position embedding, which gptrain cannot."""
    if "--no-position-embedding" not in result.given:
        return
    if result.values.get("model.position_embedding_type") != "rope":
        raise ConfigError(
            "--no-position-embedding without rope: a model without position embeddings is not implemented "
            "(Megatron since July 2023 refuses the flag unless --position-embedding-type rope); give "
            "--position-embedding-type rope for rotary embeddings, or drop the flag for learned absolute ones"
        )
    result.notes.append("--no-position-embedding (rope has no learned position table)")


def qkv_bias(result: Translation) -> None:
    """--add-qkv-bias (Qwen's scripts) gives the query, key and value projections a bias: theirs already
    beside Megatron's default biased linear layers; alone, with --disable-bias-linear, not implemented."""
    if "--add-qkv-bias" not in result.given:
        return
    if "--disable-bias-linear" in result.given:
        raise ConfigError(
            "--add-qkv-bias with --disable-bias-linear: biases on the query, key and value projections alone "
            "are not implemented (gptrain's linear layers have biases all or none)"
        )
    result.notes.append(
        "--add-qkv-bias (the query, key and value projections have biases already, as every linear layer)"
    )


def swiglu_width(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron's validate_args: --swiglu without --ffn-hidden-size takes 2/3 of 4h, down to a
    multiple of 64 (the parameters of a 4h GELU MLP in three matrices), not 4h."""
    if "--swiglu" in given and "--ffn-hidden-size" not in given and "model.hidden_size" in v:
        v["model.ffn_hidden_size"] = int((4 * v["model.hidden_size"] * 2 / 3) / 64) * 64


def recompute_flags(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron's validate_args, whatever the order of the flags: --checkpoint-activations (before
    April 2023; later Megatron exits on it) is full recompute, uniform, of --recompute-num-layers
    (default 1) layers; then --recompute-activations makes the granularity selective. The names of
    August 2021 to April 2022, --activations-checkpoint-method/-num-layers, recompute full layers."""
    if "--activations-checkpoint-method" in given:
        v["model.activations_checkpoint_granularity"] = "full"
        v.setdefault("model.activations_checkpoint_num_layers", 1)
    if "--checkpoint-activations" in given:
        v["model.activations_checkpoint_granularity"] = "full"
        v["model.activations_checkpoint_method"] = "uniform"
        v.setdefault("model.activations_checkpoint_num_layers", 1)
    if "--recompute-activations" in given:
        v["model.activations_checkpoint_granularity"] = "selective"


def full_recompute_layers(result: Translation) -> None:
    """Full recompute needs a method and a layer count, as Megatron requires: --recompute-num-layers
    has no default since September 2023 (core 0.4), and its TransformerConfig refuses full recompute
    without it (gptrain would otherwise recompute every layer of a stage)."""
    v = result.values
    if v.get("model.activations_checkpoint_granularity") != "full":
        return
    if v.get("model.activations_checkpoint_method") is None:
        raise ConfigError(
            "--recompute-granularity full needs --recompute-method uniform or block (Megatron refuses it without)"
        )
    if "model.activations_checkpoint_num_layers" not in v:
        raise ConfigError(
            "--recompute-granularity full needs --recompute-num-layers N, the layers each uniform group or "
            "block recomputes (Megatron refuses it without)"
        )
