"""The planner under an uneven pipeline split: parameters per rank counted on gptrain's real stages,
the fullest stage bounding memory, and the split carried by the requested layout's overrides."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.config.schema import ModelConfig
from gptrain.models.config import GPTConfig
from gptrain.models.flops import megatron_flops_per_iteration
from gptrain.plan.hardware import build_cluster
from gptrain.plan.memory import WEIGHT_BYTES, estimate_memory, estimate_rank
from gptrain.plan.rank_activations import activation_bytes
from gptrain.plan.sizes import megatron_parameter_lines, rank_parameters
from gptrain.plan.spec import SPLIT_KEYS, Layout, Workload, layout_from_config, workload_from_config
from gptrain.plan.time import estimate_step_time
from tests.plan.plan_helpers import TINY

CONFIG = dict(vocab_size=128, seq_length=16, num_layers=8, hidden_size=16, num_attention_heads=2)
# (layout, each rank's layers): Megatron's rules give the counts; the test counts the real stages
SPLITS = [
    (Layout(pp=2, num_layers_in_first_pipeline_stage=2), [2, 6]),
    (Layout(pp=3, num_layers_in_first_pipeline_stage=2), [2, 3, 3]),
    (Layout(pp=4, num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=1), [1, 3, 3, 1]),
    (Layout(pp=2, vpp=2, num_layers_in_first_pipeline_stage=2), [2, 6]),
    (Layout(pp=3, account_for_embedding_in_pipeline_split=True), [2, 3, 3]),
    (
        Layout(pp=2, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
        [4, 4],
    ),
]


def real_stage_parameters(config: GPTConfig, layout: Layout) -> list[int]:
    """Parameters of each pipeline rank's chunks as gptrain.parallel cuts them from the meta model."""
    torch = pytest.importorskip("torch")
    from gptrain.models.gpt import GPT
    from gptrain.parallel.layout import stage_layer_counts, stage_layer_ranges
    from gptrain.parallel.pipeline import split_stage, stage_ids

    with torch.device("meta"):
        model = GPT(config)
    split = ModelConfig(num_layers=config.num_layers, **{key: getattr(layout, key) for key in SPLIT_KEYS})
    ranges = stage_layer_ranges(stage_layer_counts(split, layout.pp, layout.vpp))
    stages = layout.pp * layout.vpp
    counts = []
    for rank in range(layout.pp):
        parts = [split_stage(model, s, stages, ranges[s]) for s in stage_ids(rank, layout.pp, layout.vpp)]
        unique = {id(p): p for part in parts for p in part.parameters()}
        counts.append(sum(p.numel() for p in unique.values()))
    return counts


@pytest.mark.parametrize(("layout", "layers"), SPLITS)
def test_parameters_per_rank_are_those_of_the_real_stages(layout: Layout, layers: list[int]) -> None:
    config = GPTConfig(**CONFIG)
    assert layout.rank_layers(config.num_layers) == layers
    assert rank_parameters(config, 1, layout.pp, layers) == real_stage_parameters(config, layout)
    line = megatron_parameter_lines(config, 1, layout.pp, layers)[-1]
    assert line.endswith(f": {real_stage_parameters(config, layout)[-1]}")


def workload() -> Workload:
    return Workload(
        model=GPTConfig(**CONFIG), make_vocab_size_divisible_by=128, global_batch_size=8, precision="32"
    )


def test_the_fullest_stage_bounds_memory() -> None:
    """[2, 6] of 8 layers: rank 1 holds six blocks and the head, more than rank 0's embedding and
    two blocks; the estimate is that rank's, its weights its real parameters in fp32."""
    work = workload()
    layout = Layout(pp=2, micro_batch_size=1, num_layers_in_first_pipeline_stage=2)
    real = real_stage_parameters(work.padded(1), layout)
    estimate = estimate_memory(work, layout)
    assert estimate.pipeline_rank == 1
    assert estimate.weights == WEIGHT_BYTES * real[1]
    assert estimate.total == max(estimate_rank(work, layout, r).total for r in range(2))
    even = dataclasses.replace(layout, num_layers_in_first_pipeline_stage=None)
    # rank 1's in-flight blocks: six layers' activations instead of four, the same micro-batches
    blocks = activation_bytes(work, layout, 1)["blocks"]
    assert blocks == pytest.approx(activation_bytes(work, even, 1)["blocks"] * 6 / 4, rel=1e-12)
    assert estimate.total > estimate_memory(work, even).total


def test_the_requested_layout_keeps_the_split_and_another_layout_clears_it() -> None:
    split = [*TINY, "model.num_layers=4", "model.micro_batch_size=1", "model.pipeline_model_parallel_size=2"]
    split.append("model.num_layers_in_first_pipeline_stage=1")
    layout = layout_from_config(load_training_config("gpt3/126m", split), world_size=2)
    assert layout.num_layers_in_first_pipeline_stage == 1 and layout.rank_layers(4) == [1, 3]
    again = layout_from_config(load_training_config("gpt3/126m", [*TINY, *layout.overrides()]), world_size=2)
    assert again == layout
    # a ranked layout (even) applied onto that config leaves no uneven key on its pipeline size
    even = Layout(dp=2, micro_batch_size=1)
    plain = load_training_config("gpt3/126m", [*split, *even.overrides()])
    assert plain.model.num_layers_in_first_pipeline_stage is None
    assert layout_from_config(plain, world_size=2) == dataclasses.replace(even, dp_shard=0)


def gpt3_126m() -> Workload:
    return workload_from_config(load_training_config("gpt3/126m", []))


def gpt3_126m_time(recompute: str | None = None, first: int | None = None, last: int | None = None):
    """The step time of gpt3/126m at pp=2 x dp=4, micro batch 1, on 8 H100s at MFU 0.5."""
    work = gpt3_126m()
    layout = Layout(
        pp=2,
        dp=4,
        micro_batch_size=1,
        recompute=recompute,
        num_layers_in_first_pipeline_stage=first,
        num_layers_in_last_pipeline_stage=last,
    )
    return estimate_step_time(work, layout, build_cluster(1, None, None), mfu=0.5)


# gpt3/126m per token (Megatron's formula, f = 4h, MHA): a layer 72 h^2 + 6 h s = 51,904,512 FLOPs
# (h 768, s 2048), the output layer 6 h V = 231,800,832 (V 50304), all of it on the last stage;
# Megatron counts no FLOPs for the embedding (a lookup)
LAYER, OUTPUT, TOKENS, STAGE_FLOPS = 51_904_512, 231_800_832, 256 * 2048, 4 * 989.4e12 * 0.5


@pytest.mark.parametrize(
    ("first", "last", "layers", "rank_flops_per_token"),
    [
        (None, None, [6, 6], [311_427_072, 543_227_904]),  # the last stage's logits pace
        (2, None, [2, 10], [103_809_024, 750_845_952]),
        (None, 3, [9, 3], [467_140_608, 387_514_368]),  # the first stage paces
    ],
)
def test_each_stage_computes_its_own_layers_and_the_last_the_output_layer(
    first: int | None, last: int | None, layers: list[int], rank_flops_per_token: list[int]
) -> None:
    """Every rank waits for the slowest: the compute is the busiest rank's FLOPs over the 4 GPUs of
    a stage at half the bf16 peak; the bubble is the other ranks' time, once per micro batch (1F1B:
    m x slowest + the rest, Narayanan et al.'s (pp - 1)/m of a step when the ranks are equal).
    Counts by hand above; float64 within rounding."""
    work = gpt3_126m()
    c = work.padded(1)
    assert (c.hidden_size, c.seq_length, c.vocab_size, c.ffn_size) == (768, 2048, 50304, 3072)
    assert rank_flops_per_token == [layers[0] * LAYER, layers[1] * LAYER + OUTPUT]
    time = gpt3_126m_time(first=first, last=last)
    seconds = [TOKENS * flops / STAGE_FLOPS for flops in rank_flops_per_token]
    busy = [t + 60e-6 * 64 * n for t, n in zip(seconds, layers, strict=True)]  # 64 micro batches
    slowest = busy.index(max(busy))
    assert time.compute == pytest.approx(seconds[slowest], rel=1e-12)
    assert time.bubble == pytest.approx((sum(busy) - busy[slowest]) / 64, rel=1e-12)


def test_lightening_the_last_stage_is_faster_than_an_even_split() -> None:
    """[9, 3] paces at rank 0's 9 layers, less than [6, 6]'s 6 layers and the logits: Megatron's
    reason for num_layers_in_last_pipeline_stage; spreading the logits over the stages ranked it slower."""
    assert gpt3_126m_time(last=3).total < gpt3_126m_time().total
    assert gpt3_126m_time(first=2).total > gpt3_126m_time().total


def test_the_ranking_lightens_the_last_stage_where_that_is_faster() -> None:
    """gpt3/126m on 8 H100s: each pipeline row is the fastest fitting of its layout's even split and
    its last stage 1 or 2 layers lighter. On pp 2 the logits pace an even [6, 6]; [8, 4] (last=4; on v2
    last=5 leaves 7 layers to a rank of two chunks) is faster, in its label and
    overrides. pp 4's 3 layers a stage leave no split gptrain accepts (11 or 10 over 3 stages). One
    row per layout, as many as before, so --measure's trials stay --top."""
    from gptrain.plan.rank import evaluate, rank_layouts

    cfg = load_training_config("gpt3/126m", [])
    work, cluster = workload_from_config(cfg), build_cluster(1, 8, None)
    ranked = rank_layouts(work, cfg.model, cluster, 0.4, 0.1)
    assert len(ranked) == 525 == len({c.layout.label() for c in ranked})
    rows = {c.layout.label(): c for c in ranked}
    for label in ("tp1 pp2 dp4 mbs4 last=4", "tp1 pp2 v2 dp4 mbs4 fsdp last=4"):
        row = rows[label]
        assert row.layout.stage_layers(12)[-1 :: -row.layout.pp] == [4 // row.layout.vpp] * row.layout.vpp
        assert "model.num_layers_in_last_pipeline_stage=4" in row.layout.overrides()
        even = evaluate(
            work, dataclasses.replace(row.layout, num_layers_in_last_pipeline_stage=None), cluster, 0.4, 0.1
        )
        assert even.fits and row.time.total < even.time.total
    assert not [c for c in ranked if c.layout.pp == 4 and c.layout.num_layers_in_last_pipeline_stage]


@pytest.mark.parametrize("first", [None, 2])
def test_selective_recompute_adds_the_pacing_ranks_attention_core(first: int | None) -> None:
    """Selective recompute reruns each of the rank's layers' attention core forward, 2 h s per
    token and layer; the logits are not recomputed. [6, 6] and [2, 10]: the last rank paces."""
    layers = 6 if first is None else 10
    flops = TOKENS * (layers * (LAYER + 2 * 768 * 2048) + OUTPUT)
    assert gpt3_126m_time("selective", first).compute == pytest.approx(flops / STAGE_FLOPS, rel=1e-12)


@pytest.mark.parametrize(
    ("vpp", "blocks", "recomputed"), [(1, None, 6), (1, 2, 2), (3, None, 6), (3, 1, 3), (3, 2, 6)]
)
def test_full_recompute_reruns_the_blocks_forward_not_the_output_layer(
    vpp: int, blocks: int | None, recomputed: int
) -> None:
    """Full recompute adds a third of the checkpointed blocks' FLOPs (their forward), none of the
    logits': all 6 of the last rank's blocks (uniform), or the first N of each of its chunks (block):
    2 of its one chunk; over 3 chunks of 2 layers, 1 of each (3, not min(6, 1)) or both of each."""
    work = gpt3_126m()
    layout = Layout(pp=2, vpp=vpp, dp=4, micro_batch_size=1, recompute="full", recompute_num_layers=blocks)
    time = estimate_step_time(work, layout, build_cluster(1, None, None), mfu=0.5)
    flops = TOKENS * (6 * LAYER + recomputed * LAYER / 3 + OUTPUT)
    assert time.compute == pytest.approx(flops / STAGE_FLOPS, rel=1e-12)


def test_without_a_pipeline_the_compute_is_the_models_flops_over_every_gpu() -> None:
    """One stage holds every layer and the logits: the model's FLOPs per step over the 8 GPUs."""
    work = gpt3_126m()
    flops = megatron_flops_per_iteration(work.padded(1), work.global_batch_size)
    time = estimate_step_time(work, Layout(dp=8, micro_batch_size=1), build_cluster(1, None, None), mfu=0.5)
    assert time.compute == pytest.approx(flops / (8 * 989.4e12 * 0.5), rel=1e-12)
    assert time.bubble == 0.0


def header_throughput(tmp_path: Path, *overrides: str) -> str:
    """The plan header's tokens/s line for gpt3/126m on one node of 8 H100s."""
    js = tmp_path / "plan.json"
    args = ["plan", "gpt3/126m", *overrides, "--nodes", "1", "--gpus-per-node", "8", "--json", str(js)]
    assert main([*args, "--top", "1"]) == 0
    return next(line for line in json.loads(js.read_text())["lines"] if line.startswith("at MFU"))


def test_the_header_throughput_is_the_requested_layouts_paced_step(tmp_path: Path) -> None:
    """The header's tokens/s and days are those of the requested layout's estimated step, the
    table's figure: [2, 10] on pp=2 is slower than the even split, and the model FLOPs utilisation
    over the 8 GPUs is what that step means (what training's log prints), below the --mfu of the
    busiest rank's compute. It used to be 8 GPUs x peak x --mfu whatever the layout."""
    work = gpt3_126m()
    flops = megatron_flops_per_iteration(work.padded(1), work.global_batch_size)
    cluster = build_cluster(1, 8, None)
    lines = {}
    for first in (None, 2):
        split = [f"model.num_layers_in_first_pipeline_stage={first}"] if first else []
        line = header_throughput(tmp_path, "model.pipeline_model_parallel_size=2", *split)
        cfg = load_training_config("gpt3/126m", ["model.pipeline_model_parallel_size=2", *split])
        layout = layout_from_config(cfg, 8, world_size=8)
        step = estimate_step_time(work, layout, cluster, 0.4).total
        tokens = 256 * 2048 / step
        assert line == (
            f"at MFU 0.40 on the busiest rank, requested layout {layout.label()}: {tokens:,.0f} tokens/s, "
            f"{3e11 / tokens / 86400:.1f} days for 3e+11 tokens; model FLOPs utilisation "
            f"{flops / (step * 8 * 989.4e12):.2f} over the 8 GPUs"
        )
        lines[first] = tokens
    assert lines[2] < lines[None]


def test_without_a_requested_layout_the_header_is_the_fastest_ones(tmp_path: Path) -> None:
    """The requested layout is not valid (TP 3 does not divide the heads): the header gives the
    fastest fitting layout's figures, said as such."""
    line = header_throughput(tmp_path, "model.tensor_model_parallel_size=3")
    assert line.startswith("at MFU 0.40 on the busiest rank, fastest layout tp1 pp1 dp8 mbs")


@pytest.mark.parametrize("requested", ["even", "lighter", "first", None])
def test_after_measure_the_header_throughput_is_the_measured_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requested: str | None
) -> None:
    """After --measure the table's tokens/s is the measured step's; the header's figure is that
    row's (the requested layout's, else the fastest measured), not the estimate it used to keep.
    A requested even split keeps its row beside its faster lighter last stage (review G: the
    lighter one replaced it, and the header fell back to the estimate). The trials are stood in
    for: every row measures twice its estimate."""
    import gptrain.plan.measure as measure
    from gptrain.plan.rank import Candidate

    def measure_every_row(plan, _args):
        for candidate in plan.ranked:
            candidate.measured_step_s = 2.0 * candidate.time.total
        plan.ranked.sort(key=Candidate.sort_key)
        return plan.ranked[0]

    monkeypatch.setattr(measure, "measure_plan", measure_every_row)
    # a requested layout the ranking holds (its shard_grad_op is full_shard's code under PP: no
    # row); its even split is slower than its lighter last stage, and keeps a row of its own
    pipeline = ["model.pipeline_model_parallel_size=2", "model.data_parallel_sharding=full_shard"]
    if requested == "lighter":
        pipeline += ["model.num_layers_in_last_pipeline_stage=4"]
    if requested == "first":  # a split the ranking does not try (review I: it had no row either)
        pipeline += ["model.num_layers_in_first_pipeline_stage=7"]
    overrides = pipeline if requested else ["model.tensor_model_parallel_size=3"]
    js = tmp_path / "plan.json"
    args = ["plan", "gpt3/126m", *overrides, "--nodes", "1", "--gpus-per-node", "8", "--top", "2"]
    assert main([*args, "--measure", "--json", str(js)]) == 0
    out = json.loads(js.read_text())
    assert out["valid_layouts_that_fit"] == 525  # a requested split's extra row is no layout more
    line = next(x for x in out["lines"] if " tokens/s, " in x and " layout " in x)
    if requested:
        layout = layout_from_config(load_training_config("gpt3/126m", overrides), 8, world_size=8)
        step = 2.0 * estimate_step_time(gpt3_126m(), layout, build_cluster(1, 8, None), 0.4).total
        label, which = layout.label(), "requested"
    else:
        step, label, which = (
            out["candidates"][0]["measured_step_s"],
            out["candidates"][0]["layout"],
            "fastest",
        )
    tokens = 256 * 2048 / step
    days = 3e11 / tokens / 86400
    took = f"{days:.1f} days" if days >= 1 else f"{days * 24:.1f} hours"
    flops = megatron_flops_per_iteration(gpt3_126m().padded(1), 256)
    assert line == (
        f"measured, {which} layout {label}: {tokens:,.0f} tokens/s, {took} for 3e+11 tokens; "
        f"model FLOPs utilisation {flops / (step * 8 * 989.4e12):.2f} over the 8 GPUs"
    )


def test_the_header_on_one_gpu_names_one_gpu(tmp_path: Path) -> None:
    js = tmp_path / "plan.json"
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--gpus-per-node", "1", "--json", str(js)]) == 0
    line = next(x for x in json.loads(js.read_text())["lines"] if x.startswith("at MFU"))
    assert line.endswith(" over the GPU")


@pytest.mark.parametrize(("sharding", "dp_shard", "element_bytes"), [("ddp", 0, 4), ("full_shard", 4, 2)])
def test_a_pipeline_sends_the_residual_stream_at_its_own_width(
    sharding: str, dp_shard: int, element_bytes: int
) -> None:
    """A stage sends its last block's output, the residual stream, and gets its gradient back: fp32
    under bf16 autocast (fp32 master weights: the embedding's output is fp32, and fp32 + bf16 is
    fp32; the memory estimate keeps each chunk's output at 4 B an element), bf16 where FSDP gathers
    the weights in bf16 and casts each block's input. pp_comm counted the autocast width, 2 B, for
    both: half the bytes on a DDP pipeline."""
    work = gpt3_126m()
    layout = Layout(pp=2, dp=4, micro_batch_size=2, sharding=sharding, dp_shard=dp_shard)
    h, s, m = 768, 2048, 256 // (2 * 4)
    nvlink = 450e9  # the two stages' GPUs are on one node
    expected = 2 * (2 * s * h * element_bytes) * m / nvlink
    time = estimate_step_time(work, layout, build_cluster(1, None, None), mfu=0.5)
    assert time.pp_comm == pytest.approx(expected, rel=1e-12)
