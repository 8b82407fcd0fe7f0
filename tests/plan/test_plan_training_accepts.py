"""The planner ranks, and prints, only what `gptrain train` and `gptrain launch` then run as planned."""

from __future__ import annotations

import dataclasses

import pytest
from plan_helpers import TINY

from gptrain.config import load_training_config
from gptrain.plan.build import cluster_overrides
from gptrain.plan.hardware import build_cluster
from gptrain.plan.rank import rank_layouts
from gptrain.plan.spec import workload_from_config

REFUSING_TORCH = "2.13.0+cpu"  # a torch whose compiled backward of a checkpointed TP block asserts


def ranked_configs(preset: str, overrides: list[str], nodes: int, per_node: int, gpu: str | None):
    """Each ranked row's training config (the plan's world and the row's keys), with the plan's cluster."""
    cluster = build_cluster(nodes, per_node, gpu, None)
    cfg = load_training_config(preset, [*overrides, *cluster_overrides(cluster)], report_ignored=False)
    work = workload_from_config(cfg, None)
    if gpu == "cpu":
        work = dataclasses.replace(work, device_type="cpu", flash_attention=True)
    ranked = rank_layouts(work, cfg.model, cluster, 0.4, 0.1)
    for candidate in ranked:
        keys = [*cluster_overrides(cluster), *candidate.layout.overrides()]
        yield candidate, load_training_config(preset, [*overrides, *keys], report_ignored=False)


@pytest.mark.parametrize(
    ("preset", "overrides", "nodes", "per_node", "gpu"),
    [
        ("gpt3/20b", ["model.compile=true"], 16, 8, None),  # review Q1's repro 1
        ("gpt3/126m", [*TINY, "model.compile=true"], 1, 2, "cpu"),
        (
            "gpt3/126m",
            [*TINY, "model.hidden_size=64", "model.fp8=true", "model.fp8_emulate=true"],
            1,
            2,
            "cpu",
        ),
    ],
)
def test_every_ranked_row_passes_trainings_parallel_choices(
    monkeypatch: pytest.MonkeyPatch, preset, overrides, nodes, per_node, gpu
) -> None:
    """check_parallel_choices (compile + TP + recompute on torch 2.12/2.13; tensorwise FP8 + TP + SP
    on CPU) refused rows the planner ranked: a 16-node job stopped at its start. The sp=false twin
    of a refused sp row runs, and is offered."""
    from gptrain.parallel import layout
    from gptrain.parallel.parallelize import check_parallel_choices

    monkeypatch.setattr(layout, "installed_torch_version", lambda: REFUSING_TORCH)
    rows = list(ranked_configs(preset, overrides, nodes, per_node, gpu))
    assert rows
    for _, cfg in rows:
        check_parallel_choices(cfg, REFUSING_TORCH)
    if "model.fp8=true" in overrides:  # TP 2 without sequence parallel: ranked, not lost
        assert any(c.layout.tp == 2 and not c.layout.sequence_parallel for c, _ in rows)
    else:  # TP 2 without recompute stays
        assert any(c.layout.tp == 2 for c, _ in rows)


def test_a_requested_layout_training_refuses_is_said_so(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config's own compile + TP 2 + selective recompute, which training refuses on torch 2.13,
    was the plan's requested layout with an estimate; it is now the requested error, naming the keys."""
    import json

    from gptrain.cli import main
    from gptrain.parallel import layout

    monkeypatch.setattr(layout, "installed_torch_version", lambda: REFUSING_TORCH)
    keys = [
        "model.compile=true",
        "model.tensor_model_parallel_size=2",
        "model.activations_checkpoint_granularity=selective",
    ]
    js = tmp_path / "p.json"
    args = ["plan", "gpt3/126m", *TINY, *keys, "--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "2"]
    assert main([*args, "--json", str(js)]) == 0
    plan = json.loads(js.read_text())
    assert plan["requested"] is None
    assert plan["requested_error"].startswith("model.compile=true with model.tensor_model_parallel_size=2")


def test_the_winners_override_lines_launch_the_planned_world(tmp_path) -> None:
    """After --measure, the printed override line had the layout's model.* keys only: prefixed with
    `training.` as docs/planning.md said, `gptrain launch` ran the preset's 64 nodes (DP 128) instead of
    the planned 16 (DP 32). Both printed lines (and --json's `overrides`) now carry the planned world."""
    import shlex
    from types import SimpleNamespace

    from gptrain.launch.compose import compose
    from gptrain.launch.preflight import check_training_layout
    from gptrain.launch.stages import build_plan, render_run_files, validate_training
    from gptrain.plan import measure

    cluster = build_cluster(16, 8, None, None)
    cfg = load_training_config("gpt3/20b", cluster_overrides(cluster), report_ignored=False)
    assert cfg.trainer.num_nodes == 16
    [winner, *_] = rank_layouts(workload_from_config(cfg, None), cfg.model, cluster, 0.4, 0.1)
    winner.measured_step_s = 11.0
    lay = winner.layout
    assert (lay.tp, lay.pp, lay.dp) == (2, 2, 32)  # not the preset's own layout (TP 2, PP 1)
    plan = SimpleNamespace(cluster=cluster, notes=[])
    args = SimpleNamespace(
        output=str(tmp_path / "best.yaml"), preset="gpt3/20b", overrides=[], config_file=None
    )
    measure.write_winner(plan, args, winner)
    notes = {note.split(": ", 1)[0].strip(): note.split(": ", 1)[1] for note in plan.notes[1:]}

    keys = shlex.split(notes["or as overrides"])
    trained = load_training_config("gpt3/20b", keys, report_ignored=False)
    assert (trained.trainer.num_nodes, trained.trainer.devices, trained.trainer.accelerator) == (16, 8, "gpu")

    argv = ["training=gpt3/20b", "cluster_type=slurm", f"base_results_dir={tmp_path}/results"]
    launch = build_plan(compose([*argv, *shlex.split(notes["or with gptrain launch"])]))
    training = validate_training(launch, render_run_files(launch, argv))
    [line] = check_training_layout(training)
    assert line.startswith("ok  training: layout TP 2 x PP 2 x DP 32 (")
    assert line.endswith(" on 128 ranks (16 node(s) x 8)")


def test_the_json_candidates_overrides_carry_the_planned_world(tmp_path) -> None:
    """--json's `overrides` of each row were the model.* keys alone (the same line as the winner's)."""
    import json

    from gptrain.cli import main

    js = tmp_path / "p.json"
    assert main(["plan", "gpt3/20b", "--nodes", "16", "--gpus-per-node", "8", "--json", str(js)]) == 0
    [first, *_] = json.loads(js.read_text())["candidates"]
    cfg = load_training_config("gpt3/20b", first["overrides"], report_ignored=False)
    assert (cfg.trainer.num_nodes, cfg.trainer.devices, cfg.trainer.accelerator) == (16, 8, "gpu")
    assert first["layout"].startswith(f"tp{cfg.model.tensor_model_parallel_size} ")


ACCOUNTED = [
    *TINY,
    "model.num_layers=4",
    "model.pipeline_model_parallel_size=2",
    "model.micro_batch_size=1",
    "model.account_for_embedding_in_pipeline_split=true",
    "model.account_for_loss_in_pipeline_split=true",
    "model.data_parallel_sharding=ddp",
]
CPU_PAIR = ["--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "2"]


def test_rows_differing_only_in_the_accounted_split_have_their_own_labels_and_trials(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requested split accounting for the embedding and the loss (review Q4) and the even split
    both read `tp1 pp2 dp1 mbs1`; --measure ran both in one trial directory, and the second (the
    requested one) stopped on the first's checkpoints. Labels and trial directories now differ."""
    import argparse

    from gptrain.plan import measure
    from gptrain.plan.build import build_plan
    from gptrain.plan.cli import parse_words

    words = ["gpt3/126m", *ACCOUNTED, *CPU_PAIR, "--top", "40"]
    words += ["--trials-dir", str(tmp_path / "trials"), "--output", str(tmp_path / "best.yaml")]
    args = parse_words(argparse.Namespace(words=words))
    plan = build_plan(args)
    labels = [c.layout.label() for c in plan.ranked]
    assert len(set(labels)) == len(labels), labels
    [asked] = [c for c in plan.ranked if c.requested]
    assert asked.layout.label() == "tp1 pp2 dp1 mbs1 emb loss"

    trials: list = []

    def run_trial(plan, args, candidate, trial_dir) -> None:
        trials.append(trial_dir)
        candidate.measured_step_s = 1.0 + len(trials)

    monkeypatch.setattr(measure, "run_local_trial", run_trial)
    plan.ranked = [c for c in plan.ranked if c.layout.label() in ("tp1 pp2 dp1 mbs1", asked.layout.label())]
    assert len(plan.ranked) == 2
    plan.top = 2
    measure.measure_and_write_winner(plan, args)
    assert [t.name for t in trials] == ["01-tp1_pp2_dp1_mbs1", "02-tp1_pp2_dp1_mbs1_emb_loss"]
    trials.clear()  # a label that two rows still shared: each trial its own directory
    plan.ranked = [plan.ranked[0], dataclasses.replace(plan.ranked[0])]
    measure.measure_and_write_winner(plan, args)
    assert len(set(trials)) == 2, trials


@pytest.mark.parametrize(
    ("overrides", "per_node", "requested", "row"),
    [
        ([], 1, "tp1 pp1 dp1 mbs4 zero2", "tp1 pp1 dp1 mbs4"),  # DP 1: nothing to shard
        (["model.pipeline_model_parallel_size=2"], 8, "tp1 pp2 dp4 mbs4 zero2", "tp1 pp2 dp4 mbs4 fsdp"),
        (["model.data_parallel_sharding=hybrid_shard"], 8, "tp1 pp1 dp8 mbs4 hsdp", "tp1 pp1 dp8 mbs4 fsdp"),
    ],
)
def test_the_presets_own_layout_is_marked_where_it_runs_as_a_row(
    tmp_path, overrides, per_node, requested, row
) -> None:
    """The presets' shard_grad_op runs as plain data parallelism at DP 1 and as full_shard's code under
    a pipeline (as hybrid_shard does on one node), where the grid has those rows instead: no row was marked requested (review Q5), and after
    --measure the header gave the requested layout's estimate, not its row's measurement."""
    import json

    from gptrain.cli import main

    js = tmp_path / "p.json"
    args = ["plan", "gpt3/126m", *overrides, "--nodes", "1", "--gpus-per-node", str(per_node)]
    assert main([*args, "--top", "1000", "--json", str(js)]) == 0
    plan = json.loads(js.read_text())
    assert plan["requested"]["layout"] == requested
    [marked] = [c for c in plan["candidates"] if c["requested"]]
    assert marked["layout"] == row
    assert marked["memory_gib"] == pytest.approx(plan["requested"]["memory_gib"], rel=1e-9)
    assert marked["step_time_s"]["total"] == pytest.approx(
        plan["requested"]["step_time_s"]["total"], rel=1e-9
    )


def test_after_measure_the_header_is_the_requested_rows_measurement(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preset's zero2 at DP 1 is the row `tp1 pp1 dp1 mbs4`; after --measure the header's
    figure is that row's measured step (it was the requested layout's estimate). The trials are
    stood in for: every row measures three times its estimate."""
    import json

    import gptrain.plan.measure as measure
    from gptrain.cli import main
    from gptrain.plan.rank import Candidate

    def measure_every_row(plan, _args):
        for candidate in plan.ranked:
            candidate.measured_step_s = 3.0 * candidate.time.total
        plan.ranked.sort(key=Candidate.sort_key)
        return plan.ranked[0]

    monkeypatch.setattr(measure, "measure_plan", measure_every_row)
    js = tmp_path / "p.json"
    args = ["plan", "gpt3/126m", "--nodes", "1", "--gpus-per-node", "1", "--top", "1000"]
    assert main([*args, "--measure", "--json", str(js)]) == 0
    plan = json.loads(js.read_text())
    [row] = [c for c in plan["candidates"] if c["requested"]]
    tokens = 256 * 2048 / row["measured_step_s"]
    line = next(x for x in plan["lines"] if " tokens/s, " in x)
    assert line.startswith(f"measured, requested layout tp1 pp1 dp1 mbs4: {tokens:,.0f} tokens/s, ")
