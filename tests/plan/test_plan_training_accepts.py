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
