"""Single-process pieces of the parallel layer: stage split, activation checkpointing, norms,
per-rank dropout seeds."""

from __future__ import annotations

import copy
import math
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import free_port
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT
from gptrain.parallel import data_parallel
from gptrain.parallel.activation_checkpoint import apply_ac, blocks_to_checkpoint
from gptrain.parallel.grad_norm import clip_grads, global_grad_norm
from gptrain.parallel.layout import stage_layer_ranges
from gptrain.parallel.mesh import ParallelDims, World
from gptrain.parallel.pipeline import is_tied, split_stage, stage_ids
from gptrain.parallel.rng import dropout_seed, model_parallel_ranks, rank_dropout_seed, stream_warnings


def tiny_gpt(layers: int = 4, **overrides: object) -> GPT:
    config = GPTConfig(
        vocab_size=64,
        seq_length=8,
        num_layers=layers,
        hidden_size=16,
        num_attention_heads=2,
        **{"hidden_dropout": 0.0, "attention_dropout": 0.0, **overrides},
    )
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def test_stage_ids_interleave_chunks_over_ranks() -> None:
    assert stage_ids(0, 2, 2) == [0, 2]
    assert stage_ids(1, 4, 3) == [1, 5, 9]
    assert list(stage_layer_ranges([2, 2, 2, 2])[2]) == [4, 5]


def test_stages_keep_names_and_chain_to_the_full_forward() -> None:
    model = tiny_gpt()
    stages = [split_stage(model, s, 4, range(s, s + 1)) for s in range(4)]
    assert [list(s.layers.keys()) for s in stages] == [["0"], ["1"], ["2"], ["3"]]
    assert stages[0].tok_embeddings is not None and stages[0].output is None
    assert (
        stages[3].tok_embeddings is None and stages[3].pos_embeddings is None and stages[3].norm is not None
    )
    names = set().union(*(s.state_dict().keys() for s in stages))
    assert names == set(model.state_dict().keys())  # output.weight included: a tied model reports it too
    hidden = tokens()
    with torch.no_grad():
        for stage in stages:
            hidden = stage(hidden)
        torch.testing.assert_close(hidden, model(tokens()), rtol=0, atol=0)
    assert is_tied(model) and not is_tied(stages[3])


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def counted_step(model: GPT) -> tuple[Counter[str], dict[str, torch.Tensor]]:
    counter = OpCounter()
    with counter:
        model(tokens()).float().square().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return counter.counts, grads


def sdpa_calls(counts: Counter[str]) -> int:
    return sum(n for op, n in counts.items() if op.startswith("_scaled_dot_product") and "backward" not in op)


@pytest.mark.parametrize(
    ("granularity", "method", "num_layers", "wrapped"),
    [
        ("full", "uniform", 1, 2),
        ("full", "block", 1, 1),
        ("full", "block", None, 2),
        ("selective", None, None, 2),
    ],
)
def test_activation_checkpointing_recomputes_and_keeps_gradients(
    granularity, method, num_layers, wrapped
) -> None:
    base = tiny_gpt(layers=2)
    counts_plain, grads_plain = counted_step(base)
    model = apply_ac(copy.deepcopy(base), granularity, method, num_layers)
    for p in model.parameters():
        p.grad = None
    counts_ac, grads_ac = counted_step(model)
    kinds = [type(block).__name__ for block in model.layers.values()]
    assert kinds.count("CheckpointWrapper") == wrapped
    assert sdpa_calls(counts_plain) == 2
    assert sdpa_calls(counts_ac) == 2 + wrapped  # each checkpointed block runs attention again
    if granularity == "selective":  # only the attention core: no linear layer runs twice
        assert counts_ac["mm"] + counts_ac["addmm"] == counts_plain["mm"] + counts_plain["addmm"]
    else:
        assert counts_ac["addmm"] > counts_plain["addmm"]
    # checkpoint_wrapper renames parameters; compare by position.
    for (_, expected), (_, actual) in zip(sorted(grads_plain.items()), sorted(grads_ac.items()), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7)


def test_block_recompute_of_more_layers_than_a_chunk_holds_recomputes_the_whole_chunk(capsys) -> None:
    """`activations_checkpoint_method: block` with `activations_checkpoint_num_layers` above the
    layers of a pipeline chunk (5 of 2 under PP2 x 2 virtual stages) was refused; Megatron
    recomputes every layer of the chunk. It is taken, said once at load, and a chunk recomputes all
    its blocks with the gradients of no recompute (float64: the same ops rerun, bit for bit)."""
    from gptrain.config import load_training_config
    from gptrain.parallel.layout import check_layout

    overrides = [
        "trainer.devices=2",
        "model.num_layers=8",
        "model.pipeline_model_parallel_size=2",
        "model.virtual_pipeline_model_parallel_size=2",
        "model.activations_checkpoint_granularity=full",
        "model.activations_checkpoint_method=block",
        "model.activations_checkpoint_num_layers=5",
    ]
    cfg = load_training_config("gpt3/126m", overrides)
    note = "model.activations_checkpoint_num_layers=5 is more than the 2 layers of a pipeline chunk"
    assert note in capsys.readouterr().err
    assert check_layout(cfg.model, world_size=2).vpp == 2
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        chunk = split_stage(tiny_gpt(layers=8), 2, 4, range(4, 6))  # a middle chunk
        hidden = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
        plain = [p.grad for p in _chunk_gradients(chunk, hidden)]
        wrapped = apply_ac(copy.deepcopy(chunk), "full", "block", 5)
        assert [type(block).__name__ for block in wrapped.layers.values()] == ["CheckpointWrapper"] * 2
        recomputed = [p.grad for p in _chunk_gradients(wrapped, hidden)]
    finally:
        torch.set_default_dtype(previous)
    assert len(plain) == len(recomputed) == 2 * len(list(chunk.layers["4"].parameters()))
    for expected, actual in zip(plain, recomputed, strict=True):
        assert torch.equal(actual, expected)


def _chunk_gradients(chunk: GPT, hidden: torch.Tensor) -> list[torch.nn.Parameter]:
    """The parameters of `chunk` after one backward of a sum of squares of its output."""
    hidden = hidden.clone().requires_grad_(True)
    chunk(hidden).square().sum().backward()
    return list(chunk.parameters())


@pytest.mark.parametrize("fields", [{"position_embedding_type": "rope"}, {"num_query_groups": 1}])
def test_selective_checkpointing_saves_no_copy_of_fused_weights_or_projections(monkeypatch, fields) -> None:
    """Under autocast q/k/v (and w1/w3) run as one GEMM over their concatenated fp32 weights, and v
    (rope) or q (GQA) is copied out of its output (gptrain.models.gpt): saved, the concatenation was
    a second fp32 copy of the weights per layer and the copy a second copy of a saved output."""
    from torch.utils.checkpoint import CheckpointPolicy

    from gptrain.parallel import activation_checkpoint

    policy = activation_checkpoint._save_matmuls_only
    decisions = []

    def spy(ctx, op, *args, **kwargs):
        weights = op is torch.ops.aten.cat.default and all(isinstance(t, torch.nn.Parameter) for t in args[0])
        decisions.append(("weights" if weights else op, policy(ctx, op, *args, **kwargs)))
        return decisions[-1][1]

    monkeypatch.setattr(activation_checkpoint, "_save_matmuls_only", spy)
    base = tiny_gpt(layers=2, activation="swiglu", **fields)
    model = apply_ac(copy.deepcopy(base), "selective", None, None)
    grads = []
    for net in (base, model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(tokens()).float().square().mean()
        loss.backward()
        grads.append([p.grad for p in net.parameters()])
    copies = ("weights", torch.ops.aten.clone.default)  # concatenated weights; v or q copied out
    ran = {op for op, _ in decisions if op in copies}
    assert ran == set(copies)  # the fused GEMMs and the copy out of one ran under the policy
    assert not [op for op, decision in decisions if op in copies and decision == CheckpointPolicy.MUST_SAVE]
    for expected, actual in zip(*grads, strict=True):  # the same bf16 ops, recomputed: the same values
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize("granularity", ["selective", "full"])
def test_checkpointing_with_dropout_gives_the_gradients_of_the_plain_model(granularity) -> None:
    """Dropout masks are drawn again in the recomputation from the restored RNG state (float64: exact)."""
    base = tiny_gpt(layers=2, hidden_dropout=0.2, attention_dropout=0.2).double()
    model = apply_ac(copy.deepcopy(base), granularity, None, None)
    grads = []
    for net in (base, model):
        net.train()
        torch.manual_seed(5)
        net(tokens()).sum().backward()
        grads.append([p.grad for p in net.parameters()])
    for expected, actual in zip(*grads, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-14)


def test_blocks_to_checkpoint_follows_megatron_methods() -> None:
    keys = ["4", "5", "6"]
    assert blocks_to_checkpoint(keys, "uniform", 2) == keys
    assert blocks_to_checkpoint(keys, "block", 2) == ["4", "5"]
    assert blocks_to_checkpoint(keys, "block", 0) == []


def test_global_grad_norm_and_clipping_match_hand_computation() -> None:
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]
    assert float(global_grad_norm(grads)) == pytest.approx(13.0)
    assert float(global_grad_norm(grads, norm_type=math.inf)) == pytest.approx(12.0)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    clip_grads(params, 1.3, global_grad_norm([p.grad for p in params]))
    torch.testing.assert_close(params[0].grad, torch.tensor([0.3, 0.4]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params[1].grad, torch.tensor([[1.2]]), rtol=1e-5, atol=1e-6)


@pytest.fixture
def one_process_group():
    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_grad_all_reduce_buckets_and_copies_back(one_process_group, monkeypatch: pytest.MonkeyPatch) -> None:
    """World of one, told DP is 2: every gradient must come back exactly halved, across buckets."""
    model = tiny_gpt(layers=2)
    model(tokens()).sum().backward()
    expected = {name: p.grad.clone() / 2 for name, p in model.named_parameters()}
    monkeypatch.setattr(data_parallel, "BUCKET_BYTES", 3000)  # several buckets of mixed sizes
    data_parallel.GradAllReduce([model], one_process_group, dp_size=2)()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_dropout_seed_is_megatrons_per_rank_seed(tp: int, sequence_parallel: bool) -> None:
    """seed + 100 x pipeline rank; + 2718 + tensor rank only where dropout acts on TP shards (SP)."""
    seeds = {}
    for pp_rank in range(3):
        for tp_rank in range(tp):
            tensor_stream = 2718 + tp_rank if tp > 1 and sequence_parallel else 0
            seeds[pp_rank, tp_rank] = dropout_seed(1234, pp_rank, tp_rank, tp, sequence_parallel)
            assert seeds[pp_rank, tp_rank] == 1234 + 100 * pp_rank + tensor_stream
    own_stream = len(set(seeds.values())) == len(seeds)
    assert own_stream == (tp == 1 or sequence_parallel)  # else the tensor ranks of a stage share one


@pytest.mark.parametrize(
    "dims",
    [
        ParallelDims(world_size=8, tp=2, pp=2),
        ParallelDims(world_size=12, tp=2, pp=3),
        ParallelDims(world_size=16, tp=2, pp=2, dp_shard=2),  # hybrid: pp x dp_rep x dp_shard x tp
        ParallelDims(world_size=4, pp=4),
        ParallelDims(world_size=4, tp=4),
    ],
)
def test_model_parallel_ranks_are_the_meshs_coordinates(dims: ParallelDims) -> None:
    """The arithmetic (no mesh needed before seeding) against the mesh's own rank layout."""
    shape, names = dims.mesh_shape()
    grid = torch.arange(dims.world_size).reshape(shape)
    for rank in range(dims.world_size):
        coords = dict(zip(names, (int(i) for i in (grid == rank).nonzero()[0]), strict=True))
        assert model_parallel_ranks(dims, rank) == (coords["pp"], coords["tp"])


def test_rank_dropout_seed_reads_the_layout_from_the_config() -> None:
    cfg = TrainingConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.num_attention_heads, m.encoder_seq_length = 4, 32, 4, 16
    m.micro_batch_size, m.global_batch_size, m.seed = 1, 8, 7
    m.tensor_model_parallel_size, m.pipeline_model_parallel_size = 2, 2
    cfg.trainer.devices = 8

    def seeds(sequence_parallel: bool) -> list[int]:
        m.sequence_parallel = sequence_parallel
        return [rank_dropout_seed(cfg, World(rank, 8, rank, "127.0.0.1", 0)) for rank in range(8)]

    # ranks on the pp x dp x tp mesh: 0-3 stage 0, 4-7 stage 1, tp rank = rank % 2, dp keeps the seed
    assert seeds(True) == [2725, 2726, 2725, 2726, 2825, 2826, 2825, 2826]
    assert seeds(False) == [7, 7, 7, 7, 107, 107, 107, 107]
    m.tensor_model_parallel_size, m.pipeline_model_parallel_size = 1, 1
    assert rank_dropout_seed(cfg, World(0, 1, 0, "127.0.0.1", 0)) == 7  # one process: model.seed


def test_fp8_tp_plan_gives_torchaos_float8_styles_to_float8_linears_only() -> None:
    """ffn 176 is a multiple of 16 but its TP=2 shard (88) is not, so w1 and w2 stay nn.Linear: they
    take the plain styles (torchao's float8 styles reject an nn.Linear at startup) and the MLP input
    is gathered unconverted; the attention keeps the float8 styles and its float8 input cast."""
    pytest.importorskip("torchao")
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    from gptrain.parallel.float8 import apply_fp8
    from gptrain.parallel.tensor_parallel import AutocastPrepareModuleInput, block_plan

    config = GPTConfig(
        vocab_size=64, seq_length=8, num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=176
    )
    with torch.device("meta"):
        model = GPT(config)
    apply_fp8(model, "tensorwise", tp=2)
    plan = block_plan(model.layers["0"], sequence_parallel=True, fp8_recipe="tensorwise")
    assert {name: type(style) for name, style in plan.items() if not name.endswith("norm")} == {
        "attention": PrepareFloat8ModuleInput,
        "attention.wq": Float8ColwiseParallel,
        "attention.wk": Float8ColwiseParallel,
        "attention.wv": Float8ColwiseParallel,
        "attention.wo": Float8RowwiseParallel,
        "mlp": AutocastPrepareModuleInput,  # cast to the autocast dtype, then gathered
        "mlp.w1": ColwiseParallel,
        "mlp.w2": RowwiseParallel,
    }


@pytest.mark.parametrize(
    ("tp", "sequence_parallel", "attention_dropout", "warned"),
    [(2, False, 0.1, True), (2, True, 0.1, False), (2, False, 0.0, False), (1, False, 0.1, False)],
)
def test_a_layout_whose_tensor_ranks_repeat_attention_dropout_masks_is_named_at_start(
    tp: int, sequence_parallel: bool, attention_dropout: float, warned: bool
) -> None:
    """Only TP without SP shares one stream across the ranks' heads while attention dropout is on."""
    m = TrainingConfig().model
    m.tensor_model_parallel_size, m.sequence_parallel, m.attention_dropout = (
        tp,
        sequence_parallel,
        attention_dropout,
    )
    warnings = stream_warnings(m)
    assert len(warnings) == int(warned)
    if warned:
        assert "model.sequence_parallel=true" in warnings[0] and "num_attention_heads/2" in warnings[0]


def test_pipeline_schedules_are_built_anew_when_evaluation_and_training_alternate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schedule first run by a validation prepared receive buffers without grad (torch < 2.13 kept
    them, and the next training step failed), so a switch of mode never reuses a schedule."""
    from gptrain.parallel import pipeline

    built: list[tuple[int, object]] = []

    def schedule(stages: list, count: int, loss_fn: object) -> object:
        built.append((count, object()))
        return built[-1][1]

    monkeypatch.setattr(pipeline, "_schedule", schedule)
    schedules = pipeline.PipelineSchedules([], loss_fn=None)
    first = schedules.for_microbatches(4)
    assert schedules.for_microbatches(4) is first  # the same mode and count: reused
    for_eval = schedules.for_microbatches(4, training=False)
    assert for_eval is not first and schedules.for_microbatches(4, training=False) is for_eval
    assert schedules.for_microbatches(4) not in (first, for_eval)
    assert [count for count, _ in built] == [4, 4, 4]


@pytest.mark.parametrize(
    ("tp", "recompute", "version", "refused"),
    [
        (2, "selective", "2.13.0+cpu", True),
        (2, "full", "2.13.1", True),
        (2, "selective", "2.12.1+cu130", True),
        (2, "full", "2.12.0", True),
        (2, "selective", "2.11.0+cu130", False),
        (2, "selective", "2.14.1", False),
        (2, "selective", "2.15.0+cu132", False),
        (1, "selective", "2.13.0", False),
        (2, None, "2.13.0", False),
    ],
)
def test_compile_under_tp_with_recompute_is_refused_where_torch_asserts(tp, recompute, version, refused):
    """torch 2.12's and 2.13's compiled backward of a checkpointed TP block stopped the run at its
    first step with torch's AssertionError traceback (reproduced in plain torch on 2.12.0, 2.12.1 and 2.13.0;
    2.11.0, 2.14.1 and 2.15.0 run it); 2.12 was not refused."""
    from gptrain.parallel.parallelize import check_compile_under_tp_recompute

    if refused:
        with pytest.raises(
            ConfigError, match=rf"^model.compile=true with .* fails in torch {re.escape(version)}"
        ):
            check_compile_under_tp_recompute(tp, recompute, version)
    else:
        check_compile_under_tp_recompute(tp, recompute, version)


@pytest.mark.distributed
@pytest.mark.slow
def test_compile_under_tp_with_recompute_is_refused_exactly_where_this_torch_fails(tmp_path) -> None:
    """The plain-torch case (two gloo ranks, nothing of gptrain) on the installed torch: the refusal
    must be there where torch fails it, and only there, whichever torch the suite runs under."""
    import json

    from gloo_ranks import run_ranks

    from gptrain.parallel.parallelize import check_compile_under_tp_recompute

    out = tmp_path / "outcomes.json"
    run_ranks(Path(__file__).with_name("tp_recompute_compile_worker.py"), out, timeout_s=600)
    outcomes = json.loads(out.read_text())
    for granularity, outcome in outcomes.items():
        if outcome == "runs":
            check_compile_under_tp_recompute(2, granularity)
        else:
            assert "tensors_saved_with_vc_check" in outcome, outcome  # the failure the check names
            with pytest.raises(ConfigError, match=f"fails in torch {re.escape(torch.__version__)}"):
                check_compile_under_tp_recompute(2, granularity)


def test_the_tp_input_cast_acts_only_on_fp32_under_autocast() -> None:
    """gptrain.parallel.tensor_parallel casts a sublayer's input before it is gathered, to the dtype
    the column linears would cast it to: only an fp32 input, only where autocast is on for its
    device (float64 runs, the layout tests' precision, and fp32 runs go through untouched)."""
    from gptrain.parallel.tensor_parallel import cast_to_autocast_dtype

    fp32, rope = torch.ones(2, 3), torch.ones(3)
    assert cast_to_autocast_dtype(nn.Identity(), (fp32, rope)) is None
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            cast, kept = cast_to_autocast_dtype(nn.Identity(), (fp32, rope))
            assert cast.dtype == dtype and torch.equal(cast.float(), fp32) and kept is rope
            assert cast_to_autocast_dtype(nn.Identity(), (fp32.double(),)) is None
            assert cast_to_autocast_dtype(nn.Identity(), (fp32.bfloat16(),)) is None
