"""The model-only configuration of a GPT: shapes and architecture choices, nothing about the job.

Field names follow Megatron/NeMo (`hidden_size`, `num_query_groups`, `kv_channels`, ...) so a NeMo
`model:` section maps onto it one to one. Optional fields keep `None` as written (so
`dataclasses.replace` and YAML round trips behave); the resolved values are properties
(`ffn_size`, `head_dim`, `query_groups`, `rotary_dim`). This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptrain.errors import ConfigError

POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope")
ACTIVATIONS = ("gelu", "swiglu", "fast-swiglu")
NORMALIZATIONS = ("layernorm", "rmsnorm")


@dataclass
class GPTConfig:
    """Shape and architecture of a decoder-only GPT (pre-LN, causal)."""

    vocab_size: int
    """Embedding rows, already padded (see `gptrain.models.flops.pad_vocab_size`)."""
    seq_length: int
    """Longest sequence; size of the learned position table or of the rope tables."""
    num_layers: int
    """Number of transformer blocks."""
    hidden_size: int
    """Model width h."""
    num_attention_heads: int
    """Query heads."""
    ffn_hidden_size: int | None = None
    """MLP inner width (each branch for SwiGLU); None means 4 * hidden_size."""
    num_query_groups: int | None = None
    """Key/value heads for grouped-query attention; None means one per query head (MHA)."""
    kv_channels: int | None = None
    """Head dimension; None means hidden_size / num_attention_heads."""
    position_embedding_type: str = "learned_absolute"
    """'learned_absolute' (GPT-2/3 position table) or 'rope' (rotary, applied to q and k)."""
    rotary_percentage: float = 1.0
    """Fraction of each head's dimensions that rope rotates (GPT-NeoX style partial rotary)."""
    rotary_base: int = 10000
    """Rope frequency base (theta)."""
    activation: str = "gelu"
    """'gelu' (the exact erf GELU, or with openai_gelu its tanh approximation: Megatron's and NeMo's
    default fused bias-GELU) or 'swiglu' ('fast-swiglu' as NeMo spells it)."""
    openai_gelu: bool = False
    """GELU's tanh approximation instead (GPT-2's `gelu_new`; Megatron's --openai-gelu;
    exported as `gelu_pytorch_tanh`, the same kernel)."""
    normalization: str = "layernorm"
    """'layernorm' (always with a bias, as Megatron) or 'rmsnorm'."""
    layernorm_epsilon: float = 1e-5
    """Epsilon inside the norms."""
    bias: bool = True
    """Biases on the linear layers (Megatron's add_bias_linear); the output layer never has one."""
    share_embeddings_and_output_weights: bool = True
    """Tie the output projection to the token embedding."""
    hidden_dropout: float = 0.1
    """Dropout on the embeddings and on the attention and MLP outputs before the residual add."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities (training only)."""
    init_method_std: float = 0.02
    """Std of the normal init of embeddings and linear weights."""
    apply_residual_scaling_init: bool = True
    """Init output projections (wo, w2) with std / sqrt(2 * num_layers), as Megatron."""
    max_position_embeddings: int | None = None
    """Rows of the learned position table (Megatron's --max-position-embeddings, at least
    seq_length: a run may go on at a longer sequence from the same checkpoint); with rope, the
    context the model is declared for (export's max_position_embeddings, generate's window).
    None: seq_length."""

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_heads()
        self._check_choices()
        self._check_fractions()

    @property
    def ffn_size(self) -> int:
        """MLP inner width actually used."""
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """Per-head dimension actually used."""
        if self.kv_channels is not None:
            return self.kv_channels
        return self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """Number of key/value heads actually used."""
        return self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads

    @property
    def gated_mlp(self) -> bool:
        """True for SwiGLU (two input projections w1, w3)."""
        return self.activation in ("swiglu", "fast-swiglu")

    @property
    def max_positions(self) -> int:
        """The longest sequence the model is declared for: max_position_embeddings where it is above
        the training length seq_length (an imported model trained on shorter samples than its context)."""
        return max(self.seq_length, self.max_position_embeddings or 0)

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (0 without one)."""
        if self.position_embedding_type != "learned_absolute":
            return 0
        return self.max_positions

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head rotated by rope (0 without rope)."""
        if self.position_embedding_type != "rope":
            return 0
        return int(self.head_dim * self.rotary_percentage)

    def _check_sizes(self) -> None:
        for key in ("vocab_size", "seq_length", "num_layers", "hidden_size", "num_attention_heads"):
            _require_positive_int(key, getattr(self, key))
        for key in ("ffn_hidden_size", "num_query_groups", "kv_channels"):
            value = getattr(self, key)
            if value is not None:
                _require_positive_int(key, value)

    def _check_heads(self) -> None:
        heads = self.num_attention_heads
        if self.kv_channels is None and self.hidden_size % heads != 0:
            raise ConfigError(
                f"model.num_attention_heads={heads} must divide model.hidden_size={self.hidden_size} "
                "(or set model.kv_channels)"
            )
        if heads % self.query_groups != 0:
            raise ConfigError(
                f"model.num_query_groups={self.num_query_groups} must divide "
                f"model.num_attention_heads={heads}"
            )

    def _check_choices(self) -> None:
        for key, allowed in (
            ("position_embedding_type", POSITION_EMBEDDING_TYPES),
            ("activation", ACTIVATIONS),
            ("normalization", NORMALIZATIONS),
        ):
            value = getattr(self, key)
            if value not in allowed:
                raise ConfigError(f"model.{key}={value!r} is not supported; use one of {', '.join(allowed)}")

    def _check_fractions(self) -> None:
        for key in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"model.{key}={value} must be in [0, 1)")
        for key in ("layernorm_epsilon", "init_method_std"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"model.{key}={getattr(self, key)} must be > 0")
        if not 0.0 < self.rotary_percentage <= 1.0:
            raise ConfigError(f"model.rotary_percentage={self.rotary_percentage} must be in (0, 1]")
        if self.position_embedding_type == "rope":
            _require_positive_int("rotary_base", self.rotary_base)
            if self.rotary_dim < 2 or self.rotary_dim % 2:
                raise ConfigError(
                    f"model.rotary_percentage={self.rotary_percentage} of head dim {self.head_dim} gives "
                    f"{self.rotary_dim} rotary dims; it must be even and at least 2"
                )


def _require_positive_int(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"model.{key}={value!r} must be a positive integer")
