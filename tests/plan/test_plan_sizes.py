"""Per-(TP, PP)-rank parameter counts: Megatron's own log, hand arithmetic, and gptrain's real model."""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.models.config import GPTConfig
from gptrain.models.flops import count_parameters, pad_vocab_size
from gptrain.plan.sizes import megatron_parameter_lines, padded_vocab_line, rank_parameters


def test_megatron_tutorial_log_is_reproduced() -> None:
    # 7.5B row of Megatron's table under TP=8 (the tutorial's log in /work/shared/tutorials):
    # "> padded vocab (size: 50257) with 943 dummy tokens (new size: 51200)" and
    # "> number of parameters on (tensor, pipeline) model parallel rank (4, 0): 941594624"
    padded = pad_vocab_size(50257, 128, 8)
    assert (
        padded_vocab_line(50257, padded)
        == " > padded vocab (size: 50257) with 943 dummy tokens (new size: 51200)"
    )
    config = GPTConfig(
        vocab_size=padded, seq_length=2048, num_layers=36, hidden_size=4096, num_attention_heads=32
    )
    lines = megatron_parameter_lines(config, tp=8, pp=1)
    assert len(lines) == 8
    assert lines[4] == " > number of parameters on (tensor, pipeline) model parallel rank (4, 0): 941594624"


def test_tp2_pp2_split_by_hand() -> None:
    # h=8, 2 heads, ffn 32, 4 layers, seq 16, vocab 10 padded to a multiple of 4 x TP 2 = 16, tied.
    config = GPTConfig(
        vocab_size=pad_vocab_size(10, 4, 2),
        seq_length=16,
        num_layers=4,
        hidden_size=8,
        num_attention_heads=2,
        ffn_hidden_size=32,
    )
    assert config.vocab_size == 16
    norms = 2 * (8 + 8)  # two LayerNorms, weight + bias, whole on every TP rank
    qkv = (8 * 24 + 24) // 2  # column-parallel weight and bias
    wo = 8 * 8 // 2 + 8  # row-parallel weight, whole bias
    w1 = (8 * 32 + 32) // 2
    w2 = 32 * 8 // 2 + 8
    block = norms + qkv + wo + w1 + w2
    first = 2 * block + 16 // 2 * 8 + 16 * 8  # vocabulary rows split, position table whole
    last = 2 * block + 16 + 16 // 2 * 8  # final norm, output copy of the tied embedding
    assert rank_parameters(config, tp=2, pp=2) == [first, last]
    assert rank_parameters(config, tp=1, pp=1) == [count_parameters(config)]
    lines = megatron_parameter_lines(config, tp=2, pp=2)
    assert lines[3].endswith("rank (1, 1): " + str(last))


def test_untied_rmsnorm_swiglu_gqa_without_bias() -> None:
    config = GPTConfig(
        vocab_size=64,
        seq_length=8,
        num_layers=2,
        hidden_size=16,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=24,
        activation="swiglu",
        normalization="rmsnorm",
        bias=False,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    block = 2 * 16 + (16 * (16 + 2 * 8) + 2 * 16 * 24) // 2 + (16 * 16 + 24 * 16) // 2
    assert rank_parameters(config, tp=2, pp=1) == [2 * block + 32 * 16 + 16 + 32 * 16]
    assert rank_parameters(config, tp=1, pp=1) == [count_parameters(config)]


CONFIGS = [
    dict(vocab_size=64, seq_length=16, num_layers=4, hidden_size=16, num_attention_heads=4),
    dict(
        vocab_size=64,
        seq_length=16,
        num_layers=4,
        hidden_size=16,
        num_attention_heads=4,
        num_query_groups=2,
        activation="swiglu",
        normalization="rmsnorm",
        bias=False,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        ffn_hidden_size=24,
    ),
]


@pytest.mark.parametrize("fields", CONFIGS)
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2), (4, 4)])
def test_counts_match_gptrains_real_split(fields: dict, tp: int, pp: int) -> None:
    """Pipeline stages cut by gptrain.parallel.pipeline, shards by the styles of its TP plan."""
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from gptrain.models.gpt import GPT
    from gptrain.parallel.pipeline import split_stage
    from gptrain.parallel.tensor_parallel import block_plan, top_plan

    config = GPTConfig(**fields)
    with torch.device("meta"):
        model = GPT(config)
    counts = []
    for stage in range(pp):
        share = config.num_layers // pp
        part = split_stage(model, stage, pp, range(stage * share, (stage + 1) * share))
        styles = dict(top_plan(part, False, True))
        for key, block in part.layers.items():
            styles |= {f"layers.{key}.{name}": s for name, s in block_plan(block, False).items()}
        total = 0
        for name, param in {id(p): (n, p) for n, p in part.named_parameters()}.values():
            module, kind = name.rsplit(".", 1)
            style = styles.get(module)
            split = isinstance(style, ColwiseParallel) or (
                isinstance(style, RowwiseParallel) and kind == "weight"
            )
            total += param.numel() // tp if split else param.numel()
        counts.append(total)
    assert rank_parameters(config, tp, pp) == counts


def test_sizes_refuse_an_unpadded_vocabulary() -> None:
    from gptrain.errors import ConfigError

    config = GPTConfig(vocab_size=100, seq_length=8, num_layers=2, hidden_size=8, num_attention_heads=2)
    with pytest.raises(ConfigError, match="not divisible by TP=8"):
        rank_parameters(config, tp=8)
    assert dataclasses.replace(config, vocab_size=pad_vocab_size(100, 4, 8)).vocab_size == 128
