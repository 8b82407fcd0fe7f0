"""Turn `gptrain plan`'s arguments into a Plan: config, cluster, the requested layout, the ranking."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gptrain.config.yamlio import override_value
from gptrain.errors import ConfigError
from gptrain.parallel.layout import check_device_choices
from gptrain.plan.hardware import Cluster, build_cluster, cluster_overrides, cluster_profile
from gptrain.plan.rank import evaluate, least_memory, rank_layouts, runs_as
from gptrain.plan.report import Plan
from gptrain.plan.spec import layout_from_config, workload_from_config
from gptrain.utils.overrides import merged_keys, split_override


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


def typed_keys(overrides: list[str]) -> set[str]:
    """The training keys the command line sets (`trainer.devices=4`, `training.trainer.devices=4`),
    each key of a mapping too (`trainer={devices: 4}` sets trainer.devices, the section keeping its
    other keys)."""
    keys: set[str] = set()
    for override in overrides:
        form = split_override(override, "trainer.max_steps=100")
        if form.delete:
            continue
        value = override_value(form)
        dotted = merged_keys(form.key, value) if isinstance(value, dict) else [form.key]
        keys.update(key.removeprefix("training.") for key in dotted)
    return keys


def flag_or_config(flag: str, given: int | None, key: str, configured: int, typed: set[str]) -> int:
    """The command-line option where given, else the config's key (what a launch of it would run);
    the option and the same key typed as an override with another value are one line, not a pick."""
    if given is not None and key in typed and given != configured:
        raise ConfigError(
            f"{flag} {given} and the override {key}={configured} ask for different worlds; give one of them"
        )
    return given if given is not None else configured


def planned_cluster(args: argparse.Namespace, probe: Any) -> Cluster:
    """Nodes and GPUs per node as a launch of the config runs them: --nodes and --gpus-per-node where
    given, else the config's trainer.num_nodes and trainer.devices (overrides included), within a
    --cluster profile's GPUs per node (the launcher runs one rank per GPU)."""
    typed = typed_keys(args.overrides)
    nodes = flag_or_config("--nodes", args.nodes, "trainer.num_nodes", probe.trainer.num_nodes, typed)
    per_node = flag_or_config(
        "--gpus-per-node", args.gpus_per_node, "trainer.devices", probe.trainer.devices, typed
    )
    if args.gpus_per_node is None and args.cluster:
        per_node = devices_within_profile(per_node, args.cluster, "trainer.devices" in typed)
    return build_cluster(
        nodes, per_node, planned_gpu(args.gpu, probe.trainer.accelerator, typed), args.cluster
    )


def planned_gpu(given: str | None, accelerator: str, typed: set[str]) -> str | None:
    """--gpu where given, else `cpu` for a config of trainer.accelerator=cpu (what a launch of it runs:
    it was planned on H100s and a --measure winner was written with accelerator=gpu), else None (the
    profile's GPU, or the default); --gpu and a typed accelerator that disagree are one line."""
    wants_cpu = {"cpu": True, "gpu": False}.get(accelerator)  # None for auto: whatever the machine has
    typed_other = "trainer.accelerator" in typed and wants_cpu is not None and wants_cpu != (given == "cpu")
    if given is not None and typed_other:
        raise ConfigError(
            f"--gpu {given} and the override trainer.accelerator={accelerator} ask for different devices;"
            " give one of them"
        )
    if given is None and accelerator == "cpu":
        return "cpu"
    return given


def devices_within_profile(devices: int, profile: str, typed: bool) -> int:
    """trainer.devices, or the profile's GPUs per node where it has fewer: a preset's 8 planned for
    the 4-GPU nodes the profile names; typed on the command line, that many ranks per node are asked
    for, and the launcher would refuse them, so that is one line."""
    gpus = cluster_profile(profile).get("gpus_per_node")
    if gpus is None or devices <= gpus:
        return devices
    if typed:
        raise ConfigError(
            f"trainer.devices={devices} ranks per node, but --cluster {profile} gives {gpus} GPUs per node"
            " (the launcher runs one rank per GPU); lower trainer.devices, or plan another node with"
            " --gpus-per-node"
        )
    return gpus


def world_source(args: argparse.Namespace, cluster: Cluster, configured_devices: int) -> str:
    """Where the planned nodes and devices a node come from, for the plan's first line: a preset's
    8 x 8 planned on a laptop with --gpu cpu read as the planner's own default, not the config's."""
    nodes = "--nodes" if args.nodes is not None else "the config's trainer.num_nodes"
    if args.gpus_per_node is not None:
        per_node = "--gpus-per-node"
    elif cluster.gpus_per_node < configured_devices:
        per_node = f"--cluster {args.cluster}'s GPUs per node"
    else:
        per_node = "trainer.devices" if args.nodes is None else "the config's trainer.devices"
    if args.nodes is not None and args.gpus_per_node is not None:
        return f"{nodes} x {per_node}"
    return f"{nodes} x {per_node}; --nodes and --gpus-per-node plan another world"


def build_plan(args: argparse.Namespace) -> Plan:
    probe, preset, _ = load_config(args, [])
    cluster = planned_cluster(args, probe)
    cfg, _, _ = load_config(args, cluster_overrides(cluster))
    check_fp8_hardware(cfg.model, cluster)
    work = workload_from_config(cfg, args.vocab_size)
    if cluster.gpu.name == "cpu":  # CPU's flash kernel has no dropout; CPU dropout keeps its noise
        work = dataclasses.replace(work, device_type="cpu", flash_attention=cfg.model.attention_dropout == 0)
    requested, error = None, None
    try:
        check_device_choices(cfg.model, "cpu" if cluster.gpu.name == "cpu" else "cuda")  # training's too
        requested = evaluate(
            work, layout_from_config(cfg, cluster.gpus_per_node), cluster, args.mfu, args.headroom
        )
        requested.requested = True
    except ConfigError as exc:
        error = str(exc)
    ranked = rank_layouts(
        work, cfg.model, cluster, args.mfu, args.headroom, requested.layout if requested else None
    )
    for candidate in ranked:  # the requested layout's row in the ranking (--json's `requested`)
        candidate.requested = requested is not None and runs_as(candidate.layout) == runs_as(requested.layout)
    name = preset or str(args.config_file)
    plan = Plan(name, work, cluster, args.mfu, args.tokens, requested, error, ranked, args.top)
    plan.headroom = args.headroom
    plan.world_from = world_source(args, cluster, probe.trainer.devices)
    if not ranked:  # for the error line: how far the smallest layout is from fitting
        plan.smallest = least_memory(work, cfg.model, cluster, args.mfu, args.headroom)
    return plan
