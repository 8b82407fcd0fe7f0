"""Turn `gptrain plan`'s arguments into a Plan: config, cluster, the requested layout, the ranking."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gptrain.errors import ConfigError
from gptrain.plan.hardware import Cluster, build_cluster
from gptrain.plan.rank import evaluate, least_memory, rank_layouts
from gptrain.plan.report import Plan
from gptrain.plan.spec import layout_from_config, workload_from_config


def cluster_overrides(cluster: Cluster) -> list[str]:
    """The trainer keys that make the config's world the cluster's."""
    accelerator = "cpu" if cluster.gpu.name == "cpu" else "gpu"
    return [
        f"trainer.num_nodes={cluster.nodes}",
        f"trainer.devices={cluster.gpus_per_node}",
        f"trainer.accelerator={accelerator}",
    ]


def load_config(args: argparse.Namespace, extra: list[str]) -> tuple[Any, str | None, list[str]]:
    from gptrain.config import load_training_config

    preset, overrides = args.preset, list(args.overrides)  # split by gptrain.plan.cli.parse_words
    if preset is None and args.config_file is None:
        preset = "gpt3/126m"
    cfg = load_training_config(
        preset, [*overrides, *extra], config_file=args.config_file, report_ignored=False
    )
    return cfg, preset, overrides


def check_fp8_hardware(model: Any, cluster: Cluster) -> None:
    """model.fp8 on a GPU without FP8 tensor cores (A100, a CPU): training refuses it at start
    (gptrain.parallel.float8.check_fp8_device), so a plan of it would be a plan nobody can run."""
    if model.fp8 and not model.fp8_emulate and cluster.gpu.fp8_tflops is None:
        raise ConfigError(
            f"model.fp8=true needs FP8 tensor cores (Hopper or Ada) and the planned GPU, {cluster.gpu.name},"
            " has none (training would refuse it): set model.fp8=false, or plan for --gpu h100-80gb"
        )


def build_plan(args: argparse.Namespace) -> Plan:
    probe, preset, _ = load_config(args, [])
    nodes = args.nodes if args.nodes is not None else probe.trainer.num_nodes
    cluster = build_cluster(nodes, args.gpus_per_node, args.gpu, args.cluster)
    cfg, _, _ = load_config(args, cluster_overrides(cluster))
    check_fp8_hardware(cfg.model, cluster)
    work = workload_from_config(cfg, args.vocab_size)
    if cluster.gpu.name == "cpu":  # CPU's flash kernel has no dropout; CPU dropout keeps its noise
        work = dataclasses.replace(work, device_type="cpu", flash_attention=cfg.model.attention_dropout == 0)
    requested, error = None, None
    try:
        requested = evaluate(
            work, layout_from_config(cfg, cluster.gpus_per_node), cluster, args.mfu, args.headroom
        )
        requested.requested = True
    except ConfigError as exc:
        error = str(exc)
    ranked = rank_layouts(work, cfg.model, cluster, args.mfu, args.headroom)
    for candidate in ranked:  # the requested layout's row in the ranking (--json's `requested`)
        candidate.requested = requested is not None and candidate.layout == requested.layout
    name = preset or str(args.config_file)
    plan = Plan(name, work, cluster, args.mfu, args.tokens, requested, error, ranked, args.top)
    plan.headroom = args.headroom
    if not ranked:  # for the error line: how far the smallest layout is from fitting
        plan.smallest = least_memory(work, cfg.model, cluster, args.mfu, args.headroom)
    return plan
