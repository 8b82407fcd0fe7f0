"""Parameters per (TP, PP) rank as Megatron-LM counts and prints them, FLOPs and time to train.

Megatron prints, per model-parallel rank, the elements of that rank's own parameter shards:
column-parallel weights and biases (q/k/v, MLP input) are split over TP, row-parallel weights
(attention output, MLP output) too but their biases are whole, norms and the learned position
table are whole on every TP rank, the vocabulary rows of the embedding/output are split. The
first pipeline stage holds the embeddings, the last the final norm and the output layer (with
tied weights and PP > 1 that is a second, synchronised copy of the embedding). gptrain splits
the same way (parallel/tensor_parallel.py, parallel/pipeline.py), so these counts are exact for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.flops import count_parameters, megatron_flops_per_iteration

SECONDS_PER_DAY = 86400.0


def _norm(config: GPTConfig) -> int:
    return config.hidden_size * (2 if config.normalization == "layernorm" else 1)


def layer_parameters_on_rank(config: GPTConfig, tp: int) -> int:
    """One transformer block's parameters held by one TP rank."""
    h, f = config.hidden_size, config.ffn_size
    q = config.num_attention_heads * config.head_dim
    kv = config.query_groups * config.head_dim
    mlp_inputs = 2 if config.gated_mlp else 1
    for name, size in (("attention heads x head dim", q), ("query groups x head dim", kv), ("ffn", f)):
        if size % tp:
            raise ConfigError(f"{name} = {size} is not divisible by model.tensor_model_parallel_size={tp}")
    column = (h * (q + 2 * kv) + mlp_inputs * h * f) // tp
    row = (q * h + f * h) // tp
    biases = ((q + 2 * kv + mlp_inputs * f) // tp + 2 * h) if config.bias else 0
    return 2 * _norm(config) + column + row + biases


def rank_parameters(
    config: GPTConfig, tp: int = 1, pp: int = 1, rank_layers: list[int] | None = None
) -> list[int]:
    """Parameters on each pipeline rank p (the same for every TP rank t). `config.vocab_size` is
    the padded vocabulary, which must divide by tp (Megatron pads it to a multiple of TP).
    `rank_layers`: the transformer layers of each pipeline rank under an uneven split
    (gptrain.parallel.layout.pipeline_rank_layers); None: an equal share each."""
    if config.vocab_size % tp:
        raise ConfigError(f"padded vocabulary {config.vocab_size} is not divisible by TP={tp}")
    if rank_layers is None:
        if config.num_layers % pp:
            raise ConfigError(f"model.num_layers={config.num_layers} is not divisible by PP={pp}")
        rank_layers = [config.num_layers // pp] * pp
    h = config.hidden_size
    vocab_rows = config.vocab_size // tp * h
    positions = config.position_rows * h
    per_rank = [layers * layer_parameters_on_rank(config, tp) for layers in rank_layers]
    per_rank[0] += vocab_rows + positions
    per_rank[-1] += _norm(config)
    if not config.share_embeddings_and_output_weights or pp > 1:
        per_rank[-1] += vocab_rows
    return per_rank


def megatron_parameter_lines(
    config: GPTConfig, tp: int = 1, pp: int = 1, rank_layers: list[int] | None = None
) -> list[str]:
    """Megatron's start-of-run lines, one per (tensor, pipeline) rank, pipeline-major."""
    counts = rank_parameters(config, tp, pp, rank_layers)
    return [
        f" > number of parameters on (tensor, pipeline) model parallel rank ({t}, {p}): {counts[p]}"
        for p in range(pp)
        for t in range(tp)
    ]


def padded_vocab_line(vocab_size: int, padded: int) -> str:
    """Megatron's line for the vocabulary padding."""
    return (
        f" > padded vocab (size: {vocab_size}) with {padded - vocab_size} dummy tokens (new size: {padded})"
    )


@dataclass(frozen=True)
class Sizes:
    """Size and cost of a model at one TP size (the padding depends on it)."""

    parameters: int
    flops_per_token: float
    """Model FLOPs per trained token (forward + backward), Megatron's formula."""
    flops_per_iteration: float

    def tokens_per_second(self, gpus: int, peak_tflops: float, mfu: float) -> float:
        return gpus * peak_tflops * 1e12 * mfu / self.flops_per_token


def model_sizes(config: GPTConfig, global_batch_size: int) -> Sizes:
    flops = megatron_flops_per_iteration(config, global_batch_size)
    return Sizes(
        parameters=count_parameters(config),
        flops_per_token=flops / (global_batch_size * config.seq_length),
        flops_per_iteration=flops,
    )
