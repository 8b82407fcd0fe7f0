"""`gptrain plan` end to end: no torch without --measure, Megatron's lines, ranking, --measure on CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plan_helpers import TINY

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.plan.hardware import Cluster, GpuSpec, gpu_spec
from gptrain.plan.rank import Candidate, rank_layouts
from gptrain.plan.spec import model_config, workload_from_config

CODE = """
import contextlib, io, sys
from gptrain.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main({args!r})
print(code, ','.join(m for m in ('torch',) if m in sys.modules))
"""


def test_plan_prints_megatron_lines_and_imports_no_torch(tmp_path: Path) -> None:
    args = [
        "plan",
        "gpt3/126m",
        "model.tensor_model_parallel_size=4",
        "--nodes",
        "1",
        "--json",
        str(tmp_path / "p.json"),
    ]
    out = subprocess.run(
        [sys.executable, "-c", CODE.format(args=args)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]
    plan = json.loads((tmp_path / "p.json").read_text())
    assert " > padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)" in plan["lines"]
    ranks = [line for line in plan["lines"] if "model parallel rank" in line]
    assert len(ranks) == 4 and ranks[3].startswith(
        " > number of parameters on (tensor, pipeline) model parallel rank (3, 0): "
    )
    assert plan["requested"]["layout"].startswith("tp4 pp1 dp2")
    assert plan["candidates"] and all(c["fits"] for c in plan["candidates"])


def test_bad_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "gpt3/126m", "--gpu", "tpu"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_plan_model_config_is_the_one_train_builds() -> None:
    """One torch-free function serves both; the config carries the overrides through."""
    cfg = load_training_config("gpt3/126m", ["model.activation=swiglu", "model.num_query_groups=4"])
    config = model_config(cfg, 50304)
    assert (config.vocab_size, config.gated_mlp, config.query_groups) == (50304, True, 4)
    assert (config.num_layers, config.hidden_size, config.seq_length) == (12, 768, 2048)


def test_plan_workload_carries_the_batch_ramp() -> None:
    """The memory estimate takes a ramp's smaller batches (gptrain.plan.memory.step_batches)."""
    cfg = load_training_config(
        "gpt3/126m", ["model.global_batch_size=64", "model.rampup_batch_size=[16,16,100]"]
    )
    assert workload_from_config(cfg).ramp_batches == (16, 32, 48)
    assert workload_from_config(load_training_config("gpt3/126m", [])).ramp_batches == ()


def test_ranking_hand_checkable() -> None:
    """Two GPUs, a model whose replica does not fit one: only TP2 or PP2 remain; fast links make
    TP2 win (PP2 pays a bubble of (pp - 1) / microbatches), slow links make PP2 win."""
    cfg = load_training_config("gpt3/126m", [*TINY, "trainer.num_nodes=1", "trainer.devices=2"])
    work = workload_from_config(cfg)

    def best(gbps: float, memory_gib: float) -> list[str]:
        # a slow GPU, so compute (equal for both) dwarfs the fixed per-micro-batch launch cost
        gpu = GpuSpec("test", memory_gib, 1e-6, None, gbps, gbps, "test")
        ranked = rank_layouts(work, cfg.model, Cluster(1, 2, gpu), 0.5, 0.0)
        return [c.layout.label() for c in ranked]

    from gptrain.plan.memory import GIB, estimate_memory
    from gptrain.plan.spec import Layout

    replica = estimate_memory(work, Layout(dp=2, micro_batch_size=1, recompute="full")).total
    split = estimate_memory(
        work, Layout(tp=2, micro_batch_size=1, sequence_parallel=True, recompute="full")
    ).total
    assert split < replica
    limit = (split + replica) / 2 / GIB
    fast, slow = best(1e6, limit), best(1e-6, limit)
    assert fast and all("dp1" in label for label in fast)  # no data-parallel layout fits
    assert fast[0].startswith("tp2") and slow[0].startswith("tp1 pp2")


@pytest.mark.distributed
def test_measure_on_cpu_with_two_processes(tmp_path: Path) -> None:
    out, js = tmp_path / "best.yaml", tmp_path / "plan.json"
    args = ["plan", "gpt3/126m", *TINY, "--nodes", "1", "--gpu", "cpu", "--gpus-per-node", "2", "--top", "2"]
    args += ["--measure", "--steps", "3", "--output", str(out), "--json", str(js)]
    done = subprocess.run(
        [sys.executable, "-m", "gptrain", *args], capture_output=True, text=True, cwd=tmp_path, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(js.read_text())
    measured = [c for c in plan["candidates"] if c["measured_step_s"] is not None]
    assert len(measured) == 2 and all(c["measured_peak_gib"] > 0 for c in measured)
    steps = [c["measured_step_s"] for c in plan["candidates"]]
    assert steps == sorted(steps)  # re-ranked by measurement
    cfg = load_training_config(None, [], config_file=str(out))
    winner = plan["candidates"][0]["overrides"]
    assert f"model.micro_batch_size={cfg.model.micro_batch_size}" in winner
    assert cfg.trainer.devices == 2 and cfg.model.data.mock_vocab_size == 100


def test_trial_results_are_read_back_per_rank(tmp_path: Path) -> None:
    """Step time from the logging rank, peak over ranks; a missing or failed rank is an error."""
    import dataclasses

    from gptrain.plan.measure import read_results
    from gptrain.plan.trial import median_step_s

    cfg = load_training_config("gpt3/126m", [*TINY, "trainer.num_nodes=1", "trainer.devices=2"])
    gpu = GpuSpec("test", 80, 1.0, None, 1.0, 1.0, "test")
    [first, *_] = rank_layouts(workload_from_config(cfg), cfg.model, Cluster(1, 2, gpu), 0.5, 0.0)
    measured = tmp_path / "measured"
    measured.mkdir()

    def rank(r: int, code: int = 0, step: float | None = None, peak: float = 1.0) -> None:
        result = {"rank": r, "exit_code": code, "error": None, "step_s": step, "peak_gib": peak}
        (measured / f"rank-{r}.json").write_text(json.dumps(result))

    rank(0, step=0.25, peak=1.5)
    one = dataclasses.replace(first)
    read_results(tmp_path, 2, one, "see log")
    assert one.measured_step_s is None and one.error == "1 of 2 ranks reported: see log"
    rank(1, peak=2.0)
    both = dataclasses.replace(first)
    read_results(tmp_path, 2, both, "see log")
    assert (both.measured_step_s, both.measured_peak_gib, both.error) == (0.25, 2.0, None)
    rank(1, code=2, peak=2.0)
    failed = dataclasses.replace(first)
    read_results(tmp_path, 2, failed, "gptrain: error: bad key")
    assert failed.measured_step_s is None and failed.error == "rank 1 exit 2: gptrain: error: bad key"
    line = "iteration 1/ 3 | elapsed time per iteration (ms): {} | lm loss: 4.0 |"
    assert median_step_s("\n".join(line.format(ms) for ms in (900.0, 100.0, 300.0, 200.0))) == 0.2


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--headroom", "1.5"], "--headroom=1.5 must be a fraction of GPU memory in [0, 1)"),
        (["--headroom", "nan"], "--headroom=nan must be a fraction of GPU memory in [0, 1)"),
        (["--headroom", "-1"], "--headroom=-1.0 must be a fraction of GPU memory in [0, 1)"),
        (["--gpus-per-node", "0"], "--gpus-per-node=0 must be a positive integer"),
        (["--vocab-size", "0"], "--vocab-size=0 must be >= 1 (the tokenizer's unpadded size)"),
        (["--tokens=-3e11"], "--tokens=-3e+11 must be a positive number of tokens"),
        (["--tokens", "nan"], "--tokens=nan must be a positive number of tokens"),
        (["--trial-timeout", "nan"], "--trial-timeout=nan must be > 0 seconds"),
        (
            ["--trial-time-limit", "half an hour"],
            "--trial-time-limit: 'half an hour' is not a Slurm time; use minutes, MM:SS, HH:MM:SS, D-HH,"
            " D-HH:MM or D-HH:MM:SS (e.g. 04:00:00)",
        ),
    ],
)
def test_out_of_range_inputs_are_one_line_not_a_default(
    capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    assert main(["plan", "gpt3/126m", *option]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {message}"


def test_header_and_table_use_the_same_fp32_peak(tmp_path: Path) -> None:
    """fp32 is planned at the plain fp32 peak (66.9 against 989.4 TFLOP/s on an H100: gptrain leaves
    TF32 off, and training's MFU uses the same peak): the table's compute is at that peak, and the
    header's tokens/s and days are the requested layout's estimated step, about 989.4 / 66.9 times
    bf16's (launches and communication do not scale with the peak)."""
    from gptrain.plan.sizes import model_sizes

    def plan(precision: str) -> dict:
        js = tmp_path / f"{precision}.json"
        args = ["plan", "gpt3/126m", f"trainer.precision={precision}", "--nodes", "1", "--top", "1"]
        assert main([*args, "--gpus-per-node", "8", "--json", str(js)]) == 0
        return json.loads(js.read_text())

    def header(p: dict) -> tuple[float, float]:
        line = next(x for x in p["lines"] if x.startswith("at MFU"))
        tokens, days = line.split(": ")[1].split(" tokens/s, ")
        return float(tokens.replace(",", "")), float(days.split(" days")[0])

    bf16, fp32 = plan("bf16"), plan("32")
    for p in (bf16, fp32):
        step = p["requested"]["step_time_s"]["total"]  # rounded to the microsecond
        tokens, days = header(p)
        expected = 256 * 2048 / step  # printed to the token, from a step known to 0.5 us
        assert tokens == pytest.approx(expected, abs=0.5 + expected * 0.5e-6 / step)
        assert days == pytest.approx(3e11 / tokens / 86400, abs=0.05)
    assert header(fp32)[0] == pytest.approx(header(bf16)[0] * 66.9 / 989.4, rel=0.2)
    best = fp32["candidates"][0]
    work = workload_from_config(load_training_config("gpt3/126m", ["trainer.precision=32"]))
    flops = model_sizes(work.padded(1), work.global_batch_size).flops_per_iteration
    # the table's step time has compute at the same peak and MFU plus launch and DP costs
    assert flops / (8 * best["step_time_s"]["compute"]) / 0.4 == pytest.approx(66.9e12, rel=0.01)
    assert fp32["lines"][3].startswith("at MFU 0.40 of the fp32 peak on the busiest rank, requested layout")


def test_nothing_fits_is_one_line_naming_what_to_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpt3/175b on one node: the sizes are printed, then one error line, exit 2 (as for any
    config this cluster cannot run), no empty table."""
    js = tmp_path / "p.json"
    assert main(["plan", "gpt3/175b", "--nodes", "1", "--json", str(js)]) == 2
    out, err = capsys.readouterr()
    assert "174,604,836,864 parameters" in out and "layouts that fit" not in out
    assert err.count("\n") == 1 and err.startswith(
        "gptrain: error: no valid layout of gpt3/175b on 1 x 8 h100-80gb fits: the smallest, "
    )
    assert "GiB per GPU where 71.2 GiB are usable (79 GiB less --headroom 0.1)" in err
    assert "use more GPUs (--nodes, --gpus-per-node)" in err
    assert json.loads(js.read_text())["valid_layouts_that_fit"] == 0


def test_no_valid_layout_at_all_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """5 GPUs, a global batch of 2: TP 5 divides neither the 96 heads nor the 12288 hidden size,
    PP 5 not the 96 layers, and DP 5 not the batch."""
    args = ["plan", "gpt3/175b", "model.global_batch_size=2", "model.micro_batch_size=1"]
    assert main([*args, "--nodes", "1", "--gpus-per-node", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "passes gptrain's layout checks" in err, err


def test_under_a_batch_ramp_only_layouts_training_takes_are_ranked() -> None:
    """Every ramp batch must split into micro-batches over the DP ranks; a layout whose micro batch
    x DP does not divide the ramp's start was ranked first and then refused by `gptrain train`."""
    from gptrain.train.rampup import BatchRamp

    ramp = [2, 2, 100]
    cfg = load_training_config(
        "gpt3/126m", [*TINY, "trainer.num_nodes=1", "trainer.devices=4", f"model.rampup_batch_size={ramp}"]
    )
    gpu = GpuSpec("test", 80, 1.0, None, 1.0, 1.0, "test")
    ranked = rank_layouts(workload_from_config(cfg), cfg.model, Cluster(1, 4, gpu), 0.5, 0.0)
    assert ranked
    for candidate in ranked:  # each one training would take
        BatchRamp.from_config(ramp, 4, candidate.layout.micro_batch_size * candidate.layout.dp)
    assert all(c.layout.micro_batch_size * c.layout.dp <= 2 for c in ranked)


def test_the_chosen_sharding_survives_a_config_that_sets_nemos_fsdp_switch() -> None:
    from gptrain.plan.spec import Layout

    for sharding in ("ddp", "full_shard"):
        layout = Layout(dp=2, micro_batch_size=1, sharding=sharding, dp_shard=2 if sharding != "ddp" else 0)
        cfg = load_training_config("gpt3/126m", ["model.fsdp=true", *layout.overrides()])
        assert cfg.model.data_parallel_sharding == sharding


def test_a_layout_round_trips_through_its_overrides_with_any_block_count() -> None:
    """`block` with 0 checkpointed layers is a layout of its own (no block rebuilt): its overrides
    must select it again, not 1."""
    from gptrain.plan.spec import Layout, layout_from_config

    for count in (None, 0, 2):
        layout = Layout(micro_batch_size=1, recompute="full", recompute_num_layers=count)
        cfg = load_training_config("gpt3/126m", [*TINY, "trainer.devices=1", *layout.overrides()])
        assert layout_from_config(cfg, world_size=1).recompute_num_layers == count


def test_hybrid_shard_without_replicas_is_not_ranked_beside_its_full_shard_twin() -> None:
    """On 2 nodes x 8 GPUs, hybrid_shard shards over one node's data-parallel ranks; where those are
    the whole DP group (PP 2 x DP 8: a stage per node) it is full_shard, the same mesh and code.
    Such twins filled the table in pairs of equal figures ('tp1 pp2 dp8 mbs2 fsdp', then
    '... hsdp') and --measure --top N timed the same layout twice."""
    cfg = load_training_config("gpt3/126m", ["trainer.num_nodes=2", "trainer.devices=8"])
    work = workload_from_config(cfg)
    ranked = rank_layouts(work, cfg.model, Cluster(2, 8, gpu_spec("h100-80gb")), 0.4, 0.1)
    hybrids = [c.layout for c in ranked if c.layout.sharding == "hybrid_shard"]
    assert hybrids and all(layout.dp_shard < layout.dp for layout in hybrids)
    # whatever the row's split (a lighter last stage may be faster): the twins are about sharding
    labels = [dataclasses.replace(c.layout, num_layers_in_last_pipeline_stage=None).label() for c in ranked]
    assert "tp1 pp2 dp8 mbs1 fsdp" in labels and "tp1 pp2 dp8 mbs1 hsdp" not in labels
    assert "tp1 pp1 dp16 mbs1 hsdp" in labels  # 2 replicas of a node's 8 shards: a layout of its own


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "plan:\n  intra_node_GBps: fast\n",
            "plan.intra_node_GBps must be a positive number of GB/s per GPU, got 'fast'",
        ),
        (
            "plan:\n  inter_node_GBps: -50\n",
            "plan.inter_node_GBps must be a positive number of GB/s per GPU, got -50",
        ),
        (
            "plan:\n  inter_node_GBps: 0\n",
            "plan.inter_node_GBps must be a positive number of GB/s per GPU, got 0",
        ),
        (
            "plan:\n  inter_node_Gbps: 25\n",
            "unknown key plan.inter_node_Gbps; known: gpu, inter_node_GBps, intra_node_GBps",
        ),
        (
            "plan:\n  gpu: [h100]\n",
            "plan.gpu=['h100'] is not known; use one of h100-80gb, h200-141gb, b200-180gb, a100-80gb, a100-40gb, cpu",
        ),
        (
            "plan:\n  gpu: h300\n",
            "plan.gpu='h300' is not known; use one of h100-80gb, h200-141gb, b200-180gb, a100-80gb, a100-40gb, cpu",
        ),
        ("gpus_per_node: eight\n", "gpus_per_node: expected a whole number, got 'eight' (str)"),
    ],
)
def test_a_cluster_files_plan_block_is_checked_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    """A rate that is no number was a traceback, a negative one made the step shorter than its
    compute, 0 and a misspelt key were ignored, and a bad GPU was blamed on --gpu."""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    assert main(["plan", "gpt3/126m", "--nodes", "2", "--cluster", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {path}: {message}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "gpus_per_node: 4\nplna:\n  gpu: a100-40gb\n",
            "cluster.plna: unknown cluster key; did you mean 'cluster.plan'?",
        ),
        (
            "gpus_per_nod: 4\n",
            "cluster.gpus_per_nod: unknown cluster key; did you mean 'cluster.gpus_per_node'?",
        ),
        ("gpu: a100-40gb\n", "gpu is a key of the plan block; put it under plan: (plan.gpu)"),
    ],
)
def test_a_cluster_files_misplaced_or_misspelt_keys_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    """A misspelt plan: or gpus_per_node:, or a plan key beside plan: instead of under it, was
    ignored: the run was planned on 8 H100s a node, not the cluster's 4 A100s."""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    assert main(["plan", "gpt3/126m", "--nodes", "2", "--cluster", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {path}: {message}"


def test_a_cluster_files_null_plan_values_keep_the_gpus_own(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "gpus_per_node: 4\nplan:\n  gpu: a100-80gb\n  intra_node_GBps: null\n  inter_node_GBps: 12.5\n"
    )
    from gptrain.plan.hardware import build_cluster

    cluster = build_cluster(2, None, None, str(path))
    assert (cluster.gpus_per_node, cluster.gpu.name) == (4, "a100-80gb")
    assert (cluster.gpu.intra_node_GBps, cluster.gpu.inter_node_GBps) == (300.0, 12.5)


@pytest.mark.parametrize("profile", ["aws_p4d", "aws_p5", "azure_nd_a100_v4"])
def test_a_shipped_profile_plans_on_the_gpu_its_validation_expects(profile: str) -> None:
    """The validation thresholds are 60% of the GPU's dense bf16 peak and of its links: the plan
    of the same cluster must use that GPU (azure_nd_a100_v4 had no plan: block and was planned
    on H100s, three times the A100's compute)."""
    from gptrain.plan.hardware import build_cluster
    from gptrain.validate.thresholds import load_thresholds

    cluster = build_cluster(1, None, None, profile)
    gpu, thresholds = cluster.gpu, load_thresholds(profile)
    assert thresholds.matmul_tflops == pytest.approx(0.6 * gpu.bf16_tflops, abs=1)
    assert thresholds.intra_node_busbw_GBps == pytest.approx(0.6 * gpu.intra_node_GBps, abs=1)
    # validation compares a node's NICs together, the plan has one NIC's share per GPU
    node_GBps = gpu.inter_node_GBps * cluster.gpus_per_node
    assert thresholds.inter_node_busbw_GBps == pytest.approx(0.6 * node_GBps, abs=1)


@pytest.mark.parametrize(("tp", "nics"), [(1, 8), (2, 4), (8, 1)])
def test_a_data_parallel_all_reduce_across_nodes_uses_its_members_nics(tp: int, nics: int) -> None:
    """aws_p5, 2 nodes x 8 H100 (one 50 GB/s EFA share per GPU): NCCL runs a ring per NIC, so the
    gradient all-reduce of a DP group with `nics` members per node has their NICs' bus bandwidth
    (with every GPU in it, the node's 400 GB/s that `gptrain validate --profile aws_p5` expects at
    least 60% of). The planner ran every group at one NIC's 50 GB/s: DP across nodes cost 8 times
    what it does, and its layouts ranked below TP/PP ones they beat."""
    from gptrain.plan.hardware import build_cluster
    from gptrain.plan.sizes import rank_parameters
    from gptrain.plan.spec import Layout
    from gptrain.plan.time import DDP_OVERLAP, estimate_step_time
    from gptrain.validate.thresholds import load_thresholds

    cluster = build_cluster(2, None, None, "aws_p5")
    work = workload_from_config(load_training_config("gpt3/126m", []))
    dp = 16 // tp
    layout = Layout(tp=tp, dp=dp, micro_batch_size=1, sequence_parallel=tp > 1)
    params = max(rank_parameters(work.padded(tp), tp, 1))
    busbw = nics * 50e9
    expected = 2 * (dp - 1) / dp * 4 * params / busbw * ((1 - DDP_OVERLAP) if tp == 1 else 1)
    assert estimate_step_time(work, layout, cluster, 0.4).dp_comm == pytest.approx(expected, rel=1e-12)
    if tp == 1:
        assert busbw * 0.6 / 1e9 == pytest.approx(load_thresholds("aws_p5").inter_node_busbw_GBps)


def test_a_requested_layout_that_does_not_fit_names_the_usable_memory(tmp_path: Path) -> None:
    """31 GiB on a 79 GiB H100 with --headroom 0.7: the line said 'does NOT fit 79 GiB' and then
    '-> 31.11 GiB'; it now names the 23.7 GiB that are usable."""
    js = tmp_path / "p.json"
    args = ["plan", "gpt3/126m", "model.micro_batch_size=16", "--nodes", "1", "--headroom", "0.7"]
    assert main([*args, "--json", str(js)]) == 0
    line = next(x for x in json.loads(js.read_text())["lines"] if x.startswith("requested layout"))
    total = float(line.rsplit("-> ", 1)[1].split(" GiB")[0])
    assert 0.3 * 79.1 < total < 79.1
    assert "does NOT fit the 23.7 GiB usable (79 GiB less --headroom 0.7); " in line, line


def test_the_measured_table_keeps_whole_numbers_and_labels_in_a_pipe() -> None:
    """Printed to a file or pipe (80 columns), the seven-column table after --measure cut
    tokens/s to '3,642,3…' and wrapped each layout over several lines; it is printed at its
    natural width."""
    import io
    from argparse import Namespace

    from rich.console import Console

    from gptrain.plan.build import build_plan
    from gptrain.plan.report import print_plan, tokens_per_second

    args = Namespace(
        preset="gpt3/126m", overrides=[], config_file=None, nodes=1, gpus_per_node=8, gpu=None,
        cluster=None, mfu=0.4, tokens=3e11, headroom=0.1, vocab_size=None, top=3,
    )  # fmt: skip
    plan = build_plan(args)
    for i, c in enumerate(plan.shown()):
        c.measured_step_s, c.measured_peak_gib = 0.123 + i, 12.5
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=80, highlight=False, soft_wrap=True))
    text = out.getvalue()
    assert "…" not in text, text
    for c in plan.shown():
        row = next(line for line in text.splitlines() if f" {c.layout.label()} " in line)
        assert f"{tokens_per_second(plan.work, c):,.0f}" in row and f"{c.measured_step_s:.3f}" in row


@pytest.mark.parametrize("gpu", ["a100-80gb", "cpu"])
def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_as_training_refuses_it(
    capsys: pytest.CaptureFixture[str], gpu: str
) -> None:
    """model.fp8=true on A100s was planned and ranked, and the winner then stopped at the
    training's start ('needs FP8 tensor cores'); the plan now says so. fp8_emulate (FP8
    numerics without FP8 hardware) is still planned."""
    assert main(["plan", "gpt3/126m", "model.fp8=true", "--gpu", gpu, "--nodes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gptrain: error: model.fp8=true needs FP8 tensor cores (Hopper or Ada) and the planned GPU, {gpu},"
        " has none (training would refuse it): set model.fp8=false, or plan for --gpu h100-80gb"
    )
    emulated = ["plan", "gpt3/126m", "model.fp8=true", "model.fp8_emulate=true", "--gpu", gpu, "--nodes", "1"]
    assert main([*emulated, "--gpus-per-node", "8", "model.micro_batch_size=1"]) == 0


def test_a_local_trial_that_training_refuses_shows_trainings_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ranks stop with gptrain's one-line error (exit 2, so the trial's JSON has no error of
    its own): the candidate's error was torchrun's last log line ('E1128 ... failed (exitcode: 2)
    local_rank: 1 (p'); it is now the reason training gave."""
    from argparse import Namespace

    from gptrain.plan import measure
    from gptrain.plan.build import build_plan

    args = Namespace(
        preset="gpt3/126m", overrides=list(TINY), config_file=None, nodes=1, gpus_per_node=2, gpu=None,
        cluster=None, mfu=0.4, tokens=3e11, headroom=0.1, vocab_size=None, top=1, steps=2,
        trial_timeout=60.0,
    )  # fmt: skip
    plan = build_plan(args)
    candidate = plan.shown()[0]
    reason = "trainer.accelerator=gpu but no CUDA device is visible; use trainer.accelerator=cpu"
    stderr = (
        f"gptrain: error: {reason}\ngptrain: error: {reason}\nTraceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "E1128 16:12:14.210000 17200 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        "(exitcode: 2) local_rank: 1 (pid: 5) of binary: python\n"
    )

    def fake_run(command: list[str], *args: object) -> subprocess.CompletedProcess:
        measured = tmp_path / "trial" / "measured"
        measured.mkdir(parents=True, exist_ok=True)
        for rank in range(2):
            row = {"rank": rank, "exit_code": 2, "error": None, "step_s": None, "peak_gib": 0.3}
            (measured / f"rank-{rank}.json").write_text(json.dumps(row))
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(measure, "run_trial_command", fake_run)
    measure.run_local_trial(plan, args, candidate, tmp_path / "trial")
    assert candidate.error == f"rank 0 exit 2: {reason}"


# torchrun as torch starts ranks: each in a session of its own; the rank records its pid, then sleeps
FAKE_TORCHRUN = """
import os, subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as file:
    file.write(str(rank.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
rank.wait()
"""

MEASURE_WITH_FAKE_TORCHRUN = """
import sys
from gptrain.cli import main
from gptrain.plan import measure
measure.rank_command = lambda python, args, nproc, local: [sys.executable, {fake!r}, {pid_file!r}]
sys.exit(main({argv!r}))
"""


def is_running(pid: int) -> bool:
    """Whether `pid` is alive, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until_ended(pid: int, seconds: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not is_running(pid)


def measure_argv(tmp_path: Path, *options: str) -> list[str]:
    return ["plan", "gpt3/126m", *TINY, "--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "1", "--top", "1",
            "--measure", "--output", str(tmp_path / "best.yaml"), *options]  # fmt: skip


def test_a_local_trial_past_its_timeout_ends_with_its_ranks(tmp_path: Path, monkeypatch, capsys) -> None:
    """--trial-timeout killed torchrun only: the ranks, each in a session of its own, ran on (and
    the next trial was timed beside them)."""
    from gptrain.plan import measure

    (tmp_path / "fake_torchrun.py").write_text(FAKE_TORCHRUN)
    pid_file = tmp_path / "rank.pid"
    fake = [sys.executable, str(tmp_path / "fake_torchrun.py"), str(pid_file)]
    monkeypatch.setattr(measure, "rank_command", lambda python, args, nproc, local: fake)
    assert main(measure_argv(tmp_path, "--trial-timeout", "3")) == 1  # no trial ran to the end
    assert "timed out after 3 s (--trial-timeout)" in capsys.readouterr().out
    assert not (tmp_path / "best.yaml").exists()
    rank = int(pid_file.read_text())
    try:
        assert wait_until_ended(rank), "the timed-out trial's rank is still running"
    finally:
        if is_running(rank):
            os.kill(rank, signal.SIGKILL)


@pytest.mark.parametrize("ending", ["every trial failed", "ctrl-c"])
def test_a_measure_that_wrote_no_winner_fails_and_sets_an_earlier_winner_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ending: str
) -> None:
    """`plan --measure` whose trials all failed (Slurm unreachable, each one timed out) said 'nothing
    written' and exited 0, and an earlier run's best.yaml stayed: `plan --measure && gptrain train
    --config-file best.yaml` trained a stale winner. It now exits 1 (130 on Ctrl-C, as any command),
    and the earlier file is renamed aside, said on stderr."""
    from gptrain.plan import measure

    def failed_trial(plan: object, args: object, candidate: Candidate, trial_dir: Path) -> None:
        if ending == "ctrl-c":
            raise KeyboardInterrupt
        candidate.error = "sbatch: error: Slurm controller not responding"

    monkeypatch.setattr(measure, "run_local_trial", failed_trial)
    monkeypatch.chdir(tmp_path)
    earlier = "# gptrain plan --measure: winner tp1 pp1 dp1 at 0.500 s/step\nmodel: {}\n"
    (tmp_path / "best.yaml").write_text(earlier)
    assert main(measure_argv(tmp_path)) == (130 if ending == "ctrl-c" else 1)
    out, err = capsys.readouterr()
    assert not (tmp_path / "best.yaml").exists()
    [aside] = tmp_path.glob("best.yaml.stale-*")
    assert aside.read_text() == earlier
    assert f"plan: {tmp_path / 'best.yaml'} is not this plan's winner: renamed to {aside}" in err.splitlines()
    if ending != "ctrl-c":
        assert "Slurm controller not responding" in out
        assert err.splitlines()[-1] == (
            "gptrain: plan --measure: no trial ran to the end (the table gives each one's error); nothing written"
        )


def test_a_measure_that_wrote_no_winner_leaves_a_file_that_is_no_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed `plan --measure` renamed whatever was at --output (another run's file, the user's
    own config) to .stale-<time>; only a file with write_winner's header is set aside now."""
    from gptrain.plan import measure

    def failed_trial(plan: object, args: object, candidate: Candidate, trial_dir: Path) -> None:
        candidate.error = "sbatch: error: Slurm controller not responding"

    monkeypatch.setattr(measure, "run_local_trial", failed_trial)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "best.yaml").write_text("model: {}\n")
    assert main(measure_argv(tmp_path)) == 1
    assert (tmp_path / "best.yaml").read_text() == "model: {}\n"
    assert not list(tmp_path.glob("best.yaml.stale-*"))
    assert "is not this plan's winner" not in capsys.readouterr().err


def test_plan_measure_refuses_an_output_that_is_its_input_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gptrain plan plan-best.yaml --measure` (re-planning from the last winner) measured with its
    input as --output: a winner overwrote it, no winner renamed it away. Refused before any trial."""
    text = input_config_where_no_trial_runs(tmp_path, monkeypatch, "plan-best.yaml")
    for given in (["plan-best.yaml"], ["--config-file", str(tmp_path / "plan-best.yaml")]):
        argv = ["plan", *given, *TINY, "--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "1", "--measure"]
        assert main(argv) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            "gptrain: error: --output plan-best.yaml: is the plan's input config; give another --output"
            " (the winner is written there)"
        )
        assert (tmp_path / "plan-best.yaml").read_text() == text


def test_plan_refuses_a_json_that_is_its_input_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gptrain plan run.yaml --json run.yaml` (with or without --measure) replaced the user's config
    with the plan's JSON once the plan (and its trials) ended. Refused before anything runs, as
    --output is."""
    text = input_config_where_no_trial_runs(tmp_path, monkeypatch, "run.yaml")
    layout = [*TINY, "--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "1"]
    for given in (["run.yaml"], ["--config-file", str(tmp_path / "run.yaml")]):
        for measuring in ([], ["--measure", "--output", "best.yaml"]):
            assert main(["plan", *given, *layout, *measuring, "--json", "./run.yaml"]) == 2
            assert capsys.readouterr().err.splitlines()[-1] == (
                "gptrain: error: --json ./run.yaml: is the plan's input config; give another --json"
                " (the plan's JSON is written there)"
            )
            assert (tmp_path / "run.yaml").read_text() == text
    assert not (tmp_path / "best.yaml").exists()


def test_plan_measure_refuses_a_json_at_the_winners_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --measure --json plan-best.yaml` wrote the plan's JSON after the winner, over it:
    `gptrain train --config-file plan-best.yaml` then read the JSON. Refused before any trial."""
    from gptrain.plan import measure

    def no_trial(*args: object) -> None:
        raise AssertionError("a trial ran")

    monkeypatch.setattr(measure, "run_local_trial", no_trial)
    monkeypatch.chdir(tmp_path)
    layout = [*TINY, "--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "1", "--measure"]
    for outputs in (["--json", "plan-best.yaml"], ["--json", "./best.yaml", "--output", "best.yaml"]):
        assert main(["plan", *layout, *outputs]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"gptrain: error: --json {outputs[1]}: is --output's path, where the winner is written; "
            "give another --json"
        )
    assert list(tmp_path.iterdir()) == []


def test_sigterm_to_plan_measure_ends_the_trial_and_removes_its_temporary_directory(tmp_path: Path) -> None:
    """SIGTERM (timeout, kill, a Slurm job's end) ended the planner at once: the running trial's
    torchrun and ranks went on alone and the temporary trials directory stayed."""
    (tmp_path / "fake_torchrun.py").write_text(FAKE_TORCHRUN)
    pid_file, temp = tmp_path / "rank.pid", tmp_path / "tmp"
    temp.mkdir()
    code = MEASURE_WITH_FAKE_TORCHRUN.format(
        fake=str(tmp_path / "fake_torchrun.py"), pid_file=str(pid_file), argv=measure_argv(tmp_path)
    )
    env = {**os.environ, "TMPDIR": str(temp)}
    planner = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
    rank = None
    try:
        assert wait_until_created(pid_file, planner)
        rank = int(pid_file.read_text())
        planner.send_signal(signal.SIGTERM)
        _, stderr = planner.communicate(timeout=60)
        assert planner.returncode == 128 + signal.SIGTERM
        assert stderr.splitlines()[-1] == "gptrain: terminated by SIGTERM"
        assert wait_until_ended(rank), "the trial's rank outlived the planner"
        assert list(temp.iterdir()) == []
    finally:
        planner.kill()
        if rank is not None and is_running(rank):
            os.kill(rank, signal.SIGKILL)


def wait_until_created(path: Path, process: subprocess.Popen, seconds: float = 120.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_measure_for_gpus_this_machine_lacks_is_one_line_before_any_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--measure` with the default --gpu h100-80gb on a machine without them ran every trial under
    torchrun, each stopping at training's start, and wrote nothing; it now stops at once."""
    import torch

    wanted = torch.cuda.device_count() + 1 if torch.cuda.is_available() else 2
    args = ["plan", "gpt3/126m", *TINY, "--nodes", "1", "--gpus-per-node", str(wanted), "--top", "1"]
    assert main([*args, "--measure", "--steps", "2", "--trials-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptrain: error: --measure runs its trials here on {wanted} h100-80gb GPUs"), err
    assert "use --gpu cpu" in err and not any(tmp_path.iterdir())


@pytest.mark.parametrize("option", ["--json", "--output"])
def test_an_output_that_cannot_be_written_is_refused_before_any_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    """With --measure, a --json or --output that cannot be written (under a file) failed only when
    written, after every trial had run (hours of Slurm jobs lost); it is refused first. A directory
    that does not exist yet is made when the file is written, as before."""
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "out.file"
    args = ["plan", "gpt3/126m", *TINY, "--nodes", "1", "--gpu", "cpu", "--gpus-per-node", "1", "--top", "1"]
    args += ["--measure", "--steps", "2", "--trials-dir", str(tmp_path / "trials"), option, str(target)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.strip() == (
        f"gptrain: error: {option} {target}: cannot write it ({target.parent} is not a directory); give a writable path"
    )
    assert "best" not in out and not (tmp_path / "trials").exists()
    if option == "--json":  # a directory that does not exist yet is made
        fresh = tmp_path / "new" / "plan.json"
        assert (
            main(
                [
                    "plan",
                    "gpt3/126m",
                    *TINY,
                    "--nodes",
                    "1",
                    "--gpu",
                    "cpu",
                    "--gpus-per-node",
                    "1",
                    "--json",
                    str(fresh),
                ]
            )
            == 0
        )
        assert json.loads(fresh.read_text())


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("conf/cluster/site", "conf/cluster/site.yaml"),  # the launcher's cluster=<name>: no .yaml
        ("conf/cluster/site.yaml", "conf/cluster/site.yaml"),
        ("aws_p4d.yaml", "BUNDLED/aws_p4d.yaml"),  # a bundled profile named with its suffix
        ("cluster=aws_p4d", "BUNDLED/aws_p4d.yaml"),  # NeMo's group choice, as typed for `launch`
    ],
)
def test_cluster_is_found_as_the_launcher_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, used: str
) -> None:
    """A cluster file of one's own given without .yaml (as `gptrain launch cluster=...` names it) was
    looked up as configs/cluster/conf/cluster/site.yaml inside the package: 'no such profile'."""
    from gptrain.launch.cluster_profiles import CLUSTER_DIR, cluster_profile_path

    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "site.yaml").write_text("gpus_per_node: 4\nplan:\n  gpu: a100-40gb\n")
    monkeypatch.chdir(tmp_path)
    expected = Path(used.replace("BUNDLED", str(CLUSTER_DIR)))
    assert cluster_profile_path(given).resolve() == expected.resolve()
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--cluster", given, "--json", "p.json"]) == 0
    cluster = json.loads((tmp_path / "p.json").read_text())["cluster"]
    profile = yaml.safe_load(expected.read_text())
    assert cluster["gpus_per_node"] == profile["gpus_per_node"]


def test_a_missing_cluster_file_or_a_launch_group_choice_is_one_line_saying_what_plan_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "gpt3/126m", "--cluster", "conf/cluster/nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptrain: error: --cluster conf/cluster/nope: no file conf/cluster/nope.yaml;")
    assert "give a bundled profile (aws_p4d, " in err and "configs/cluster/conf" not in err
    assert main(["plan", "gpt3/126m", "--cluster", "bcmx"]) == 2
    assert "no file bcmx.yaml and no bundled profile of that name" in capsys.readouterr().err
    assert main(["plan", "gpt3/126m", "cluster=bcm"]) == 2  # was: unknown key 'cluster'
    assert capsys.readouterr().err.strip() == (
        "gptrain: error: override 'cluster=bcm' chooses a launcher group; gptrain plan takes --cluster bcm"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "cpu", "--nodes", "1", "--trials-dir", "afile"],
         "--trials-dir afile: cannot make the trials there (afile is not a directory); give a writable directory"),
        (["--cluster-type", "slurm", "--trials-dir", "afile/t"],
         "--trials-dir afile/t: cannot make the trials there (afile is not a directory); give a writable directory"),
        (["--cluster-type", "slurm", "--exclude-file", "adir"],
         "--exclude-file adir: is a directory; give a file name (the nodes a failed validation blames go there,"
         " one Slurm host list)"),
        (["--cluster-type", "slurm", "--exclude-file", "bad"],
         "--exclude-file bad:1: cannot parse host list item 'n[1-' (Slurm's form: n[1-3,7],gpu-[01-04]); fix the"
         " file or delete it"),
    ],
)  # fmt: skip
def test_measure_checks_its_trial_paths_before_any_trial(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    """A --trials-dir under a file failed inside the first trial ('...: Not a directory (GPTRAIN_DEBUG=1
    shows where)'), and a bad --exclude-file was blamed on the launcher's validation.exclude_file once
    the first Slurm trial was being rendered."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    (tmp_path / "bad").write_text("n[1-\n")
    trials: list[str] = []
    monkeypatch.setattr("gptrain.plan.measure.measure_plan", lambda plan, a: trials.append("ran"))
    assert main(["plan", "gpt3/126m", "--measure", *args]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {message}"
    assert trials == []


def test_a_six_gpu_node_plans_every_tensor_parallel_size_that_divides_it() -> None:
    """TP sizes were powers of two up to the node's GPUs: on 6-GPU nodes a 12-head model never got
    TP 3 or 6 (which training takes: 12 heads, 768 hidden and 3072 FFN divide by both), and got
    TP 4, whose groups straddle two nodes; now every divisor of the node's GPUs is planned (without
    sequence parallel where it does not divide the 2048-token sequence)."""
    import dataclasses

    from gptrain.parallel.layout import check_layout

    cfg = load_training_config("gpt3/126m", ["trainer.num_nodes=2", "trainer.devices=6"])
    gpu = GpuSpec("test", 80, 1.0, None, 1.0, 1.0, "test")
    ranked = rank_layouts(workload_from_config(cfg), cfg.model, Cluster(2, 6, gpu), 0.5, 0.0)
    assert {c.layout.tp for c in ranked} == {1, 2, 3, 6}
    for tp in (3, 6):  # training takes both
        check_layout(dataclasses.replace(cfg.model, tensor_model_parallel_size=tp), 12, 6)


@pytest.mark.parametrize("gres", ["gpu:4", "gpu:a100:4,nvme:1"])
def test_a_profile_asking_for_gpus_by_gres_only_plans_that_many_per_node(tmp_path: Path, gres: str) -> None:
    """A cluster file with `gres: gpu:4` and no gpus_per_node (the launcher's jobs ask for 4 GPUs a
    node) was planned for 8 GPUs a node, the default: layouts with TP 8 and twice the data
    parallelism its jobs get; the gres count is now the default for --gpus-per-node."""
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump({"gres": gres, "gpus_per_node": None, "plan": {"gpu": "a100-80gb"}}))
    js = tmp_path / "p.json"
    assert main(["plan", "gpt3/126m", "--cluster", str(profile), "--nodes", "2", "--json", str(js)]) == 0
    plan = json.loads(js.read_text())
    assert plan["cluster"]["gpus_per_node"] == 4
    assert {c["layout"].split()[0] for c in plan["candidates"]} <= {"tp1", "tp2", "tp4"}
    assert (
        main(["plan", "gpt3/126m", "--cluster", str(profile), "--gpus-per-node", "2", "--json", str(js)]) == 0
    )
    assert json.loads(js.read_text())["cluster"]["gpus_per_node"] == 2  # the command line still wins


def test_a_profiles_gpus_per_node_is_read_as_the_launcher_reads_it(tmp_path: Path) -> None:
    """gpus_per_node: "4" (text; the launcher asks for 4 GPUs a node) was refused as no positive
    integer, and 0 (the launcher asks for none: its gres's count) too; both now plan what a launch gets."""
    profile = tmp_path / "site.yaml"
    js = tmp_path / "p.json"
    for text in ('gpus_per_node: "4"\n', "gpus_per_node: 0\ngres: gpu:4\n"):
        profile.write_text(text)
        assert main(["plan", "gpt3/126m", "--cluster", str(profile), "--nodes", "2", "--json", str(js)]) == 0
        assert json.loads(js.read_text())["cluster"]["gpus_per_node"] == 4


def test_the_requested_layouts_row_in_the_ranking_says_so(tmp_path: Path) -> None:
    """--json's candidates each carry `requested`, but it was false on every one, the requested
    layout's own row included; that row (the same label as `requested`) now says true."""
    js = tmp_path / "p.json"
    layout = [
        "model.tensor_model_parallel_size=2",
        "model.sequence_parallel=true",
        "model.micro_batch_size=2",
    ]
    assert main(["plan", "gpt3/126m", *layout, "--nodes", "1", "--top", "1000", "--json", str(js)]) == 0
    plan = json.loads(js.read_text())
    assert plan["requested"]["layout"] == "tp2 pp1 dp4 mbs2 sp zero2"
    rows = [c["layout"] for c in plan["candidates"] if c["requested"]]
    assert rows == [plan["requested"]["layout"]]


def test_when_nothing_fits_the_json_names_the_smallest_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error line names the layout that needs the least memory and its GiB per GPU; the JSON
    written beside it had no candidates and no such layout, so a script reading it could not say
    how far the job was from fitting. It is now `smallest` (null when something fits)."""
    js = tmp_path / "p.json"
    assert main(["plan", "gpt3/175b", "--nodes", "1", "--json", str(js)]) == 2
    err = capsys.readouterr().err
    smallest = json.loads(js.read_text())["smallest"]
    assert (
        f"the smallest, {smallest['layout']}, needs {smallest['memory_gib']['total']:.1f} GiB per GPU" in err
    )
    assert not smallest["fits"] and smallest["overrides"]
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["smallest"] is None


def test_plan_plans_the_configs_devices_as_launch_runs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan gpt3/126m trainer.devices=4` planned 8 GPUs a node (the default) and set trainer.devices=8
    in its config: the override was dropped without a word, and a launch of that config runs 4 a node.
    --gpus-per-node still wins; the same key typed with another value is one line, not a pick."""
    from gptrain.config.loader import preset_path

    js = tmp_path / "p.json"

    def per_node(*args: str) -> int:
        assert main(["plan", *args, "--nodes", "1", "--json", str(js)]) == 0
        return json.loads(js.read_text())["cluster"]["gpus_per_node"]

    own = tmp_path / "own.yaml"
    own.write_text(preset_path("gpt3/126m").read_text().replace("  devices: 8\n", "  devices: 2\n"))
    assert per_node("gpt3/126m", "trainer.devices=4") == 4
    assert per_node("--config-file", str(own)) == 2
    assert per_node("--config-file", str(own), "--gpus-per-node", "8") == 8
    assert per_node("gpt3/126m", "trainer.devices=8", "--gpus-per-node", "8") == 8
    capsys.readouterr()
    assert main(["plan", "gpt3/126m", "trainer.devices=4", "--gpus-per-node", "8"]) == 2
    assert main(["plan", "gpt3/126m", "training.trainer.num_nodes=2", "--nodes", "4"]) == 2
    # a mapping sets its keys as typed ones: --gpus-per-node won over it without a word
    assert main(["plan", "gpt3/126m", "trainer={devices: 4}", "--gpus-per-node", "8"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gptrain: error: --gpus-per-node 8 and the override trainer.devices=4 ask for different worlds;"
        " give one of them",
        "gptrain: error: --nodes 4 and the override trainer.num_nodes=2 ask for different worlds; give one of them",
        "gptrain: error: --gpus-per-node 8 and the override trainer.devices=4 ask for different worlds;"
        " give one of them",
    ]


def test_a_cluster_profile_bounds_the_configs_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile of 4-GPU nodes: the preset's 8 ranks a node are planned as 4 (the nodes it names), fewer
    are planned as asked; 8 typed on the command line is refused in one line, as the launcher refuses it."""
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump({"gpus_per_node": 4, "plan": {"gpu": "a100-80gb"}}))
    js = tmp_path / "p.json"
    for devices, planned in ((None, 4), (2, 2)):
        typed = [f"trainer.devices={devices}"] if devices else []
        assert (
            main(["plan", "gpt3/126m", *typed, "--cluster", str(profile), "--nodes", "1", "--json", str(js)])
            == 0
        )
        assert json.loads(js.read_text())["cluster"]["gpus_per_node"] == planned
    capsys.readouterr()
    assert main(["plan", "gpt3/126m", "trainer.devices=8", "--cluster", str(profile), "--nodes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gptrain: error: trainer.devices=8 ranks per node, but --cluster {profile} gives 4 GPUs per node"
        " (the launcher runs one rank per GPU); lower trainer.devices, or plan another node with --gpus-per-node"
    )


def record_signals(monkeypatch) -> list[tuple[str, int, int]]:
    """Every os.kill/os.killpg from here on, in order, as (call, pid, signal); each still sent."""
    sent: list[tuple[str, int, int]] = []
    real_kill, real_killpg = os.kill, os.killpg

    def kill(pid: int, signum: int) -> None:
        sent.append(("kill", pid, signum))
        real_kill(pid, signum)

    def killpg(group: int, signum: int) -> None:
        sent.append(("killpg", group, signum))
        real_killpg(group, signum)

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(os, "killpg", killpg)
    return sent


def test_ending_a_trial_kills_its_ranks_before_torchrun(tmp_path: Path, monkeypatch) -> None:
    """torchrun was killed before its ranks: once it died, a rank that had already exited was
    reaped by init and its pid could be another process's by the time it was signalled."""
    from gptrain.plan.measure import end_trial

    (tmp_path / "fake_torchrun.py").write_text(FAKE_TORCHRUN)
    pid_file = tmp_path / "rank.pid"
    torchrun = subprocess.Popen([sys.executable, str(tmp_path / "fake_torchrun.py"), str(pid_file)])
    rank = None
    try:
        assert wait_until_created(pid_file, torchrun, 60)
        rank = int(pid_file.read_text())
        sent = record_signals(monkeypatch)
        end_trial(torchrun)
        monkeypatch.undo()
        assert sent == [
            ("kill", torchrun.pid, signal.SIGSTOP),
            ("killpg", rank, signal.SIGKILL),
            ("kill", torchrun.pid, signal.SIGKILL),
        ]
        assert torchrun.returncode == -signal.SIGKILL and wait_until_ended(rank)
    finally:
        torchrun.kill()
        if rank is not None and is_running(rank):
            os.kill(rank, signal.SIGKILL)


def test_ending_a_trial_whose_torchrun_was_reaped_signals_nothing(monkeypatch) -> None:
    """A reaped torchrun's pid is free for reuse: os.kill(pid, SIGSTOP) could stop another process."""
    from gptrain.plan.measure import end_trial

    torchrun = subprocess.Popen([sys.executable, "-c", "pass"])
    torchrun.wait()
    sent = record_signals(monkeypatch)
    end_trial(torchrun)
    assert sent == [] and torchrun.returncode == 0


@pytest.mark.parametrize(
    ("args", "world"),
    [
        # on a CPU-only laptop: the preset's 8 nodes of 8, which looked like the planner's own default
        (
            ["--gpu", "cpu"],
            "8 x 8 cpu (the config's trainer.num_nodes x trainer.devices; --nodes and --gpus-per-node plan"
            " another world)",
        ),
        (
            ["--gpu", "cpu", "--nodes", "1"],
            "1 x 8 cpu (--nodes x the config's trainer.devices; --nodes and --gpus-per-node plan another world)",
        ),
        (["--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "2"], "1 x 2 cpu (--nodes x --gpus-per-node)"),
        (
            ["--cluster", "{site}", "--nodes", "1"],
            "1 x 4 h100-80gb (--nodes x --cluster {site}'s GPUs per node; --nodes and --gpus-per-node plan"
            " another world)",
        ),
    ],
)
def test_the_first_line_says_where_the_planned_world_comes_from(
    tmp_path: Path, args: list[str], world: str
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("gpus_per_node: 4\n")
    js = tmp_path / "p.json"
    assert main(["plan", "gpt3/126m", *(a.format(site=site) for a in args), "--json", str(js)]) == 0
    first = json.loads(js.read_text())["lines"][0]
    assert first.endswith(f"(Megatron's formula); {world.format(site=site)}")


def test_a_config_that_trains_on_cpus_is_planned_on_cpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """trainer.accelerator=cpu was planned on 8 H100s a node, and --measure's winner was written with
    trainer.accelerator=gpu: the config's device is planned, as its nodes and devices are; --gpu wins,
    and --gpu and the same key typed with another device are one line."""
    from gptrain.config.loader import preset_path

    js = tmp_path / "p.json"

    def gpu(*args: str) -> str:
        assert main(["plan", *args, "--nodes", "1", "--json", str(js)]) == 0
        return json.loads(js.read_text())["cluster"]["gpu"]["name"]

    own = tmp_path / "own.yaml"
    own.write_text(
        preset_path("gpt3/126m").read_text().replace("  accelerator: auto\n", "  accelerator: cpu\n")
    )
    assert gpu("gpt3/126m", "trainer.accelerator=cpu") == "cpu"
    assert gpu("--config-file", str(own)) == "cpu"
    assert gpu("--config-file", str(own), "--gpu", "a100-80gb") == "a100-80gb"
    assert gpu("gpt3/126m", "trainer.accelerator=auto", "--gpu", "cpu") == "cpu"
    assert gpu("gpt3/126m") == "h100-80gb"
    capsys.readouterr()
    assert main(["plan", "gpt3/126m", "trainer.accelerator=cpu", "--gpu", "h100-80gb"]) == 2
    assert main(["plan", "gpt3/126m", "training.trainer.accelerator=gpu", "--gpu", "cpu"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gptrain: error: --gpu h100-80gb and the override trainer.accelerator=cpu ask for different devices;"
        " give one of them",
        "gptrain: error: --gpu cpu and the override trainer.accelerator=gpu ask for different devices;"
        " give one of them",
    ]


def test_a_json_path_under_a_directory_that_may_not_be_searched_is_one_line(
    unsearchable_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Path.is_dir raised PermissionError (Python 3.11) under a directory the user may not search,
    said as a bare '<path>: Permission denied', no flag and nothing to do. Root may search any
    directory, so the refusal is stood in for."""
    locked = unsearchable_dir
    assert main(["plan", "gpt3/126m", "--json", str(locked / "p.json")]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: --json {locked}/p.json: cannot be looked up (Permission denied); check the"
        f" permissions of {locked} and the directories above it\n"
    )


def test_plan_reads_megatrons_tiktoken_vocabulary_size_from_the_config() -> None:
    """Megatron's TikTokenizer vocabulary file has exactly vocab_size ids (2**17 unless set); before,
    the planner said the vocabulary was unknown and asked for --vocab-size."""
    tiktoken = ["model.tokenizer.type=TikTokenizer", "model.tokenizer.model=/v/tokenizer.json"]
    tiktoken += ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    cfg = load_training_config("gpt3/126m", tiktoken)
    assert workload_from_config(cfg).model.vocab_size == 131072
    cfg = load_training_config("gpt3/126m", [*tiktoken, "model.tokenizer.vocab_size=1263"])
    assert workload_from_config(cfg).model.vocab_size == 1263
    named = load_training_config(
        "gpt3/126m", [*tiktoken[:1], "model.tokenizer.model=o200k_base", *tiktoken[2:]]
    )
    with pytest.raises(ConfigError, match="vocabulary size unknown to the planner"):
        workload_from_config(named)


def input_config_where_no_trial_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    """gpt3/126m's config written to tmp_path/`name` (the working directory now), with any local
    trial failing the test: the refusals under test come before trials. Returns the file's text."""
    from gptrain.config import load_training_config
    from gptrain.plan import measure

    def no_trial(*args: object) -> None:
        raise AssertionError("a trial ran")

    monkeypatch.setattr(measure, "run_local_trial", no_trial)
    monkeypatch.chdir(tmp_path)
    text = load_training_config("gpt3/126m").to_yaml()
    (tmp_path / name).write_text(text)
    return text


@pytest.mark.parametrize(
    ("tokens", "unit", "scale"), [("3e13", "days", 1.0), ("3e11", "hours", 24.0), ("1e9", "minutes", 1440.0)]
)
def test_the_header_gives_a_short_budget_in_hours_or_minutes(capsys, tokens, unit, scale) -> None:
    """`0.0 days` hid a budget of minutes: under a day the header says hours, under an hour minutes,
    each the tokens over the same tokens/s."""
    import re

    assert main(["plan", "gpt3/126m", "--tokens", tokens]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "tokens/s" in line)
    rate = float(re.search(r": ([\d,]+) tokens/s", header).group(1).replace(",", ""))
    took = float(re.search(rf", ([\d.]+) {unit} for ", header).group(1))
    assert took == pytest.approx(float(tokens) / rate / 86400 * scale, abs=0.05)


@pytest.mark.parametrize("key", ["dirpath", "filepath"])
def test_a_trial_saves_in_its_own_directory_not_the_users_checkpoint_dirpath(
    tmp_path: Path, key: str
) -> None:
    """A user's checkpoint_callback_params.dirpath (or NeMo's filepath) was inherited by every trial:
    the first trial saved step_N there, the next was refused as a fresh start over it, and a later
    real run could resume the trial's checkpoint. Each trial now saves under its own directory."""
    from argparse import Namespace

    from gptrain.plan import measure
    from gptrain.plan.build import build_plan

    users = tmp_path / "ckpts"
    given = f"{users}/model.ckpt" if key == "filepath" else str(users)
    overrides = [*TINY, f"exp_manager.checkpoint_callback_params.{key}={given}"]
    args = Namespace(
        preset="gpt3/126m", overrides=overrides, config_file=None, nodes=1, gpus_per_node=2, gpu=None,
        cluster=None, mfu=0.4, tokens=3e11, headroom=0.1, vocab_size=None, top=1, steps=2,
        trial_timeout=60.0,
    )  # fmt: skip
    plan = build_plan(args)
    trial = measure.write_trial_config(plan, args, plan.shown()[0], tmp_path / "trial")
    cfg = load_training_config(None, [], config_file=str(trial))
    assert cfg.exp_manager.checkpoints_dir == str(tmp_path / "trial" / "results" / "checkpoints")


def test_a_null_tokenizer_run_is_planned_with_its_vocab_size():
    """NullTokenizer's vocabulary is model.tokenizer.vocab_size, no files: before, the planner said
    'vocabulary size unknown' of a config that holds it."""
    null = ["model.tokenizer.type=NullTokenizer", "model.tokenizer.vocab_size=128256"]
    assert workload_from_config(load_training_config("gpt3/126m", null)).vocab_size == 128256


def test_the_winners_train_command_is_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The note `gptrain train --config-file PATH` is pasted into a shell: an --output named with a
    space or brackets was two words or a glob there."""
    import shlex
    from types import SimpleNamespace

    from gptrain.plan import build, measure

    config = SimpleNamespace(to_yaml=lambda: "model: {}\n")
    monkeypatch.setattr(build, "load_config", lambda args, overrides: (config, None, None))
    monkeypatch.setattr(build, "cluster_overrides", lambda cluster: [])
    layout = SimpleNamespace(label=lambda: "tp1", overrides=lambda: [])
    winner = SimpleNamespace(layout=layout, measured_step_s=1.0)
    plan = SimpleNamespace(cluster=None, notes=[])
    output = tmp_path / "best [v2].yaml"
    measure.write_winner(plan, SimpleNamespace(output=str(output)), winner)
    command = plan.notes[0].split(": ", 1)[1]
    assert shlex.split(command) == ["gptrain", "train", "--config-file", str(output)]


def test_the_grid_tries_every_interleaving_megatron_accepts() -> None:
    """Review E1: the grid tried v 2 and 4 only, so 12 layers on 4 stages (3 a stage) got no
    interleaved row and 6 a stage no v3 or v6, though Megatron runs any v dividing a stage's layers."""
    from gptrain.plan.rank import layout_grid

    cfg = load_training_config("gpt3/126m", ["trainer.num_nodes=2", "trainer.devices=8"])
    work = workload_from_config(cfg)
    pairs = {(layout.pp, layout.vpp) for layout in layout_grid(work, Cluster(2, 8, gpu_spec("h100-80gb")))}
    assert {(4, 3), (2, 3), (2, 6), (2, 2), (4, 1)} <= pairs
    assert (4, 2) not in pairs and (3, 3) not in pairs  # 12 / (4 * 2), 12 / (3 * 3): no whole stages


def test_a_recompute_row_costing_more_memory_and_time_than_none_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review E2: under TP + SP selective recompute kept more than none (the gathered norm outputs),
    so the table listed 'ac=sele' rows needing more memory AND more time than the same layout
    without recompute. The policy no longer keeps them; should selective again save nothing (here:
    the old gathered outputs added back to its estimate), such a row is dropped, one that saves
    memory stays, and the requested layout keeps its row."""
    import gptrain.plan.rank as rank
    from gptrain.plan.memory import estimate_memory
    from gptrain.plan.spec import Layout

    def old_policy(work, layout):
        memory = estimate_memory(work, layout)
        if layout.recompute == "selective" and layout.sequence_parallel:
            tokens = layout.micro_batch_size * work.model.seq_length * work.model.num_layers
            memory = dataclasses.replace(memory, activations=memory.activations + 4 * tokens * 768)
        return memory

    monkeypatch.setattr(rank, "estimate_memory", old_policy)
    cfg = load_training_config("gpt3/126m", ["trainer.num_nodes=1", "trainer.devices=8"])
    work, cluster = workload_from_config(cfg), Cluster(1, 8, gpu_spec("h100-80gb"))
    ranked = rank_layouts(work, cfg.model, cluster, 0.4, 0.1)

    def bare(layout):
        return dataclasses.replace(
            layout, recompute=None, recompute_num_layers=None, num_layers_in_last_pipeline_stage=None
        )

    plain = {bare(c.layout): c for c in ranked if c.layout.recompute is None}
    twins = [(c, plain[bare(c.layout)]) for c in ranked if c.layout.recompute and bare(c.layout) in plain]
    assert twins
    assert not [
        c.layout.label()
        for c, none in twins
        if c.memory.total >= none.memory.total and c.time.total >= none.time.total
    ]
    assert any(c.layout.recompute == "selective" and c.layout.tp == 1 for c in ranked)  # saves memory: kept
    asked = Layout(tp=4, dp=2, micro_batch_size=8, sequence_parallel=True, recompute="selective")
    rows = rank_layouts(work, cfg.model, cluster, 0.4, 0.1, requested=asked)
    assert asked not in [c.layout for c in ranked] and asked in [c.layout for c in rows]
