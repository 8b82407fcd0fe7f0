"""GPT model: shapes, causality, tying, meta init, init statistics, float64 reference, pipeline split."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from gloo_ranks import free_port

from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT

TINY = dict(vocab_size=37, seq_length=8, num_layers=2, hidden_size=16, num_attention_heads=4)

VARIANTS = {
    "classic": {},
    "rope": dict(position_embedding_type="rope"),
    # head_dim 8, rotary_dim 4: two rotated pairs, so the base and the /rotary_dim exponent both count
    "partial_rope": dict(
        position_embedding_type="rope", rotary_percentage=0.5, rotary_base=500, kv_channels=8
    ),
    "swiglu": dict(activation="swiglu", ffn_hidden_size=24),
    "openai_gelu": dict(openai_gelu=True),
    "fast_swiglu_rmsnorm_nobias": dict(activation="fast-swiglu", normalization="rmsnorm", bias=False),
    "gqa_untied": dict(num_query_groups=2, share_embeddings_and_output_weights=False),
    "llama_like": dict(
        position_embedding_type="rope",
        activation="swiglu",
        normalization="rmsnorm",
        bias=False,
        num_query_groups=1,
        kv_channels=6,
        share_embeddings_and_output_weights=False,
        layernorm_epsilon=1e-6,
    ),
}


def tiny_config(**overrides) -> GPTConfig:
    return GPTConfig(**{**TINY, "hidden_dropout": 0.0, "attention_dropout": 0.0, **overrides})


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- float64 reference, written from the formulas


def ref_norm(x, weight, bias, config):
    if config.normalization == "rmsnorm":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + config.layernorm_epsilon) * weight
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + config.layernorm_epsilon) * weight + bias


def ref_linear(x, params, name):
    out = x @ params[f"{name}.weight"].T
    return out + params[f"{name}.bias"] if f"{name}.bias" in params else out


def ref_rope(x, positions, config):
    """Rotate pairs (j, j + R/2) of the first R dims by angle pos * base^(-2j/R). x [B,S,H,D]."""
    rot = config.rotary_dim
    out = x.clone()
    for j in range(rot // 2):
        angle = positions.double() * config.rotary_base ** (-2.0 * j / rot)  # [B, S]
        cos, sin = torch.cos(angle)[..., None], torch.sin(angle)[..., None]
        a, b = x[..., j], x[..., j + rot // 2]
        out[..., j] = a * cos - b * sin
        out[..., j + rot // 2] = a * sin + b * cos
    return out


def ref_attention(x, params, prefix, positions, config):
    batch, seq, _ = x.shape
    heads, groups, dim = config.num_attention_heads, config.query_groups, config.head_dim
    q = ref_linear(x, params, f"{prefix}.wq").reshape(batch, seq, heads, dim)
    k = ref_linear(x, params, f"{prefix}.wk").reshape(batch, seq, groups, dim)
    v = ref_linear(x, params, f"{prefix}.wv").reshape(batch, seq, groups, dim)
    if config.position_embedding_type == "rope":
        q, k = ref_rope(q, positions, config), ref_rope(k, positions, config)
    out = torch.zeros(batch, seq, heads, dim, dtype=torch.float64)
    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    for head in range(heads):
        group = head // (heads // groups)
        scores = torch.einsum("bsd,btd->bst", q[:, :, head], k[:, :, group]) / math.sqrt(dim)
        scores = scores.masked_fill(future, float("-inf"))
        weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
        weights = weights / weights.sum(-1, keepdim=True)
        out[:, :, head] = torch.einsum("bst,btd->bsd", weights, v[:, :, group])
    return ref_linear(out.reshape(batch, seq, heads * dim), params, f"{prefix}.wo")


def ref_mlp(x, params, prefix, config):
    up = ref_linear(x, params, f"{prefix}.w1")
    if config.gated_mlp:
        return ref_linear(
            up / (1 + torch.exp(-up)) * ref_linear(x, params, f"{prefix}.w3"), params, f"{prefix}.w2"
        )
    if config.openai_gelu:  # GPT-2's tanh approximation (Hendrycks & Gimpel 2016, eq. in section 2)
        gelu = 0.5 * up * (1 + torch.tanh(math.sqrt(2.0 / math.pi) * (up + 0.044715 * up**3)))
    else:
        gelu = 0.5 * up * (1 + torch.erf(up / math.sqrt(2.0)))
    return ref_linear(gelu, params, f"{prefix}.w2")


def reference_forward(params, config, tokens, positions):
    x = params["tok_embeddings.weight"][tokens]
    if config.position_embedding_type == "learned_absolute":
        x = x + params["pos_embeddings.weight"][positions]
    for i in range(config.num_layers):
        p = f"layers.{i}"
        a = ref_norm(x, params[f"{p}.attention_norm.weight"], params.get(f"{p}.attention_norm.bias"), config)
        x = x + ref_attention(a, params, f"{p}.attention", positions, config)
        m = ref_norm(x, params[f"{p}.mlp_norm.weight"], params.get(f"{p}.mlp_norm.bias"), config)
        x = x + ref_mlp(m, params, f"{p}.mlp", config)
    x = ref_norm(x, params["norm.weight"], params.get("norm.bias"), config)
    out_weight = params.get("output.weight", params["tok_embeddings.weight"])
    return x @ out_weight.T


def float64_model(config: GPTConfig, seed: int = 0) -> GPT:
    """A model in float64 with every parameter perturbed, so biases and norm weights matter."""
    model = GPT(config).double()
    model.init_weights(seeded(seed))  # after .double(): rope tables computed in float64
    noise = seeded(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=noise, dtype=torch.float64))
    return model.eval()


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_forward_matches_float64_reference(variant):
    config = tiny_config(**VARIANTS[variant])
    model = float64_model(config)
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_length), generator=seeded(3))
    positions = torch.arange(config.seq_length).expand(2, -1)
    params = dict(model.named_parameters())
    expected = reference_forward(params, config, tokens, positions)
    assert expected.dtype == torch.float64
    torch.testing.assert_close(model(tokens), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", ["classic", "partial_rope"])
def test_explicit_position_ids_match_reference(variant):
    config = tiny_config(**VARIANTS[variant])
    model = float64_model(config)
    tokens = torch.randint(0, config.vocab_size, (2, 5), generator=seeded(4))
    positions = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]])
    expected = reference_forward(dict(model.named_parameters()), config, tokens, positions)
    torch.testing.assert_close(model(tokens, positions), expected, rtol=0, atol=1e-10)
    # Shorter than seq_length without position ids: positions 0..4.
    default = reference_forward(dict(model.named_parameters()), config, tokens, torch.arange(5).expand(2, -1))
    torch.testing.assert_close(model(tokens), default, rtol=0, atol=1e-10)


def test_shapes_and_dtype():
    config = tiny_config(**VARIANTS["llama_like"])
    model = GPT(config)
    model.init_weights(seeded(0))
    logits = model(torch.randint(0, config.vocab_size, (3, 5)))
    assert logits.shape == (3, 5, config.vocab_size)
    assert logits.dtype == torch.float32
    assert list(model.layers.keys()) == ["0", "1"]
    assert model.pos_embeddings is None and model.layers["0"].mlp.w3 is not None
    assert GPT(tiny_config()).layers["0"].mlp.w3 is None


@pytest.mark.parametrize("variant", ["classic", "llama_like"])
def test_changing_a_future_token_never_changes_earlier_logits(variant):
    config = tiny_config(**VARIANTS[variant])
    model = GPT(config).eval()
    model.init_weights(seeded(1))
    tokens = torch.randint(0, config.vocab_size, (1, config.seq_length), generator=seeded(2))
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % config.vocab_size
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=0, atol=1e-6)
    assert (after[:, 5:] - before[:, 5:]).abs().max() > 1e-4


def test_tied_weights_are_one_parameter():
    model = GPT(tiny_config())
    assert model.output.weight is model.tok_embeddings.weight
    names = [name for name, _ in model.named_parameters()]
    assert "output.weight" not in names  # counted once
    untied = GPT(tiny_config(share_embeddings_and_output_weights=False))
    assert untied.output.weight is not untied.tok_embeddings.weight
    assert untied.output.bias is None


@pytest.mark.parametrize("variant", ["classic", "llama_like", "gqa_untied"])
def test_meta_build_to_empty_init_equals_direct_build(variant):
    config = tiny_config(**VARIANTS[variant])
    with torch.device("meta"):
        lazy = GPT(config)
    assert all(p.is_meta for p in lazy.parameters())
    lazy.to_empty(device="cpu")
    lazy.init_weights(seeded(7))
    direct = GPT(config)
    direct.init_weights(seeded(7))
    assert lazy.state_dict().keys() == direct.state_dict().keys()
    for name, value in direct.state_dict().items():
        assert torch.equal(lazy.state_dict()[name], value), name
    if config.position_embedding_type == "rope":
        assert torch.equal(lazy.freqs_cos, direct.freqs_cos) and torch.equal(lazy.freqs_sin, direct.freqs_sin)
    if config.share_embeddings_and_output_weights:
        assert lazy.output.weight is lazy.tok_embeddings.weight
    other = GPT(config)
    other.init_weights(seeded(8))
    assert not torch.equal(other.layers["0"].attention.wq.weight, direct.layers["0"].attention.wq.weight)


def test_init_statistics():
    config = GPTConfig(vocab_size=384, seq_length=128, num_layers=2, hidden_size=128, num_attention_heads=4)
    model = GPT(config)
    model.init_weights(seeded(0))
    std, scaled = 0.02, 0.02 / math.sqrt(2 * 2)
    block = model.layers["1"]
    for weight, expected in [
        (model.tok_embeddings.weight, std),
        (model.pos_embeddings.weight, std),
        (block.attention.wq.weight, std),
        (block.attention.wv.weight, std),
        (block.mlp.w1.weight, std),
        (block.attention.wo.weight, scaled),
        (block.mlp.w2.weight, scaled),
    ]:
        assert weight.std().item() == pytest.approx(expected, rel=0.03)
        assert abs(weight.mean().item()) < 0.1 * expected
    assert torch.all(block.attention.wq.bias == 0) and torch.all(block.mlp.w2.bias == 0)
    assert torch.all(block.attention_norm.weight == 1) and torch.all(model.norm.bias == 0)
    unscaled = GPT(GPTConfig(**{**vars(config), "apply_residual_scaling_init": False}))
    unscaled.init_weights(seeded(0))
    assert unscaled.layers["1"].mlp.w2.weight.std().item() == pytest.approx(std, rel=0.03)


def test_pipeline_split_chains_to_the_whole_model():
    config = tiny_config(num_layers=4, **VARIANTS["partial_rope"])
    model = GPT(config).eval()
    model.init_weights(seeded(5))
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    for key in ("2", "3"):
        del first.layers[key]
    first.norm = first.output = None
    for key in ("0", "1"):
        del second.layers[key]
    second.tok_embeddings = second.pos_embeddings = None
    second.tie_weights()  # nothing to tie without embeddings: must leave output alone
    full_state = model.state_dict()  # has both tok_embeddings.weight and output.weight when tied
    for stage in (first, second):
        for name, param in stage.named_parameters():
            assert torch.equal(param, full_state[name]), name
    assert "layers.2.attention.wq.weight" in dict(second.named_parameters())
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_length), generator=seeded(6))
    hidden = first(tokens)
    assert hidden.shape == (2, config.seq_length, config.hidden_size)
    torch.testing.assert_close(second(hidden), model(tokens), rtol=0, atol=1e-6)
    short = tokens[:, :5]  # rope tables are cut to the attention's length inside each block
    torch.testing.assert_close(second(first(short)), model(short), rtol=0, atol=1e-6)


def test_stage_init_matches_whole_model_init():
    config = tiny_config(num_layers=4, share_embeddings_and_output_weights=False)
    whole = GPT(config)
    whole.init_weights(seeded(11))
    with torch.device("meta"):
        stage = GPT(config)
    del stage.layers["0"], stage.layers["1"]
    stage.tok_embeddings = stage.pos_embeddings = None
    stage.to_empty(device="cpu")
    stage.init_weights(seeded(11))
    whole_params = dict(whole.named_parameters())
    for name, param in stage.named_parameters():
        assert torch.equal(param, whole_params[name]), name


def test_dropout_only_in_training():
    config = tiny_config(hidden_dropout=0.5, attention_dropout=0.5)
    model = GPT(config)
    model.init_weights(seeded(0))
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_length), generator=seeded(1))
    model.eval()
    assert torch.equal(model(tokens), model(tokens))
    model.train()
    assert not torch.equal(model(tokens), model(tokens))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(num_attention_heads=5), "num_attention_heads"),
        (dict(num_query_groups=3), "num_query_groups"),
        (dict(activation="relu"), "activation"),
        (dict(normalization="layernorm1p"), "normalization"),
        (dict(position_embedding_type="alibi"), "position_embedding_type"),
        (dict(hidden_dropout=1.0), "hidden_dropout"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(num_layers=2.0), "num_layers"),
        (dict(position_embedding_type="rope", rotary_percentage=0.1), "rotary_percentage"),
    ],
)
def test_config_validation_names_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        tiny_config(**overrides)


def test_config_resolved_values():
    config = tiny_config()
    assert (config.ffn_size, config.head_dim, config.query_groups, config.rotary_dim) == (64, 4, 4, 0)
    assert config.ffn_hidden_size is None and config.num_query_groups is None
    odd = tiny_config(
        num_attention_heads=3, kv_channels=8, position_embedding_type="rope", rotary_percentage=0.5
    )
    assert (odd.head_dim, odd.rotary_dim) == (8, 4)


TP_WORKER = """
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT

dist.init_process_group("gloo")
config = GPTConfig(**json.loads(sys.argv[1]))
whole = GPT(config).eval()
whole.init_weights(torch.Generator().manual_seed(3))
with torch.device("meta"):
    model = GPT(config)
plan = {}
for i in model.layers:
    for name in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1", "mlp.w3"):
        plan[f"layers.{i}.{name}"] = ColwiseParallel()
    for name in ("attention.wo", "mlp.w2"):
        plan[f"layers.{i}.{name}"] = RowwiseParallel()
parallelize_module(model, init_device_mesh("cpu", (2,)), plan)
model.to_empty(device="cpu")
model.init_weights(torch.Generator().manual_seed(3))
model.eval()
reference = whole.state_dict()
sharded = 0
for name, param in model.named_parameters():
    if isinstance(param, DTensor):
        sharded += 1
        param = param.full_tensor()
    assert torch.equal(param, reference[name]), name
assert sharded > 0
tokens = torch.randint(0, config.vocab_size, (2, config.seq_length), generator=torch.Generator().manual_seed(4))
torch.testing.assert_close(model(tokens), whole(tokens), rtol=0, atol=1e-5)
dist.barrier()
dist.destroy_process_group()
print("ok", flush=True)
os._exit(0)
"""


@pytest.mark.distributed
def test_tensor_parallel_shards_init_and_forward_like_the_whole_model(tmp_path):
    """Column/row-sharded q/k/v/o and MLP (2 ranks, gloo): same weights from init_weights, same logits."""
    import json
    import os
    import subprocess
    import sys

    config = dict(TINY, hidden_dropout=0.0, attention_dropout=0.0, **VARIANTS["llama_like"])
    config["num_query_groups"] = 2  # 2 local query heads and 1 local kv head per rank
    script = tmp_path / "tp_worker.py"
    script.write_text(TP_WORKER)
    port = free_port()
    env = dict(
        os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", OMP_NUM_THREADS="1"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), json.dumps(config)],
            env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0 and out.strip() == "ok", err[-3000:]


def test_the_position_table_has_max_position_embeddings_rows():
    """As Megatron builds it: a run may go on at a longer sequence from the same checkpoint. The
    parameter count (Megatron's line) and the planner count the same table."""
    from gptrain.models.flops import count_parameters
    from gptrain.plan.sizes import rank_parameters

    config = tiny_config(max_position_embeddings=3 * tiny_config().seq_length)
    model = GPT(config)
    assert model.pos_embeddings.weight.shape[0] == 3 * config.seq_length
    total = sum(p.numel() for p in model.parameters())
    assert count_parameters(config) == total == sum(rank_parameters(config, 1, 1))
    rope = GPT(tiny_config(position_embedding_type="rope", max_position_embeddings=64))
    assert rope.pos_embeddings is None
