"""What `gptrain plan` prints (a rich table) and writes (JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from gptrain.plan.hardware import Cluster, cluster_overrides
from gptrain.plan.memory import GIB
from gptrain.plan.rank import Candidate, layouts_that_fit, memory_line, step_seconds, tokens_per_second
from gptrain.plan.sizes import SECONDS_PER_DAY, megatron_parameter_lines, model_sizes, padded_vocab_line
from gptrain.plan.spec import Workload
from gptrain.plan.time import peak_tflops
from gptrain.utils.atomic import atomic_write_text


@dataclass
class Plan:
    """Everything one `gptrain plan` run found."""

    name: str
    work: Workload
    cluster: Cluster
    mfu: float
    tokens: float
    requested: Candidate | None
    requested_error: str | None
    ranked: list[Candidate]
    top: int
    notes: list[str] = field(default_factory=list)
    headroom: float = 0.0
    """--headroom: the fraction of GPU memory kept free."""
    smallest: Candidate | None = None
    """When nothing fits: the valid layout that needs the least memory."""
    world_from: str = ""
    """Where nodes x devices a node came from (the config's trainer keys, the options, the profile)."""

    def shown(self) -> list[Candidate]:
        return self.ranked[: self.top]


def header_lines(plan: Plan) -> list[str]:
    """Sizes at the requested TP, Megatron's padding and per-rank lines, time to train."""
    layout = plan.requested.layout if plan.requested else None
    tp, pp = (layout.tp, layout.pp) if layout else (1, 1)
    model = plan.work.padded(tp)
    rank_layers = layout.rank_layers(model.num_layers) if layout else None
    sizes = model_sizes(model, plan.work.global_batch_size)
    lines = [
        f"{plan.name}: {sizes.parameters:,} parameters, {sizes.flops_per_token / 1e9:.2f} GFLOPs per token "
        f"(Megatron's formula); {plan.cluster.nodes} x {plan.cluster.gpus_per_node} {plan.cluster.gpu.name}"
        + (f" ({plan.world_from})" if plan.world_from else ""),
        padded_vocab_line(plan.work.vocab_size, model.vocab_size),
        *megatron_parameter_lines(model, tp, pp, rank_layers),
        throughput_line(plan),
    ]
    if plan.requested:
        c = plan.requested
        gpu = plan.cluster.gpu  # the device less --headroom: 75 GiB does not fit a 79 GiB GPU at 10%
        usable = f"{gpu.memory_gib * (1 - plan.headroom):.1f} GiB usable"
        verdict = (
            "fits"
            if c.fits
            else f"does NOT fit the {usable} ({gpu.memory_gib:.0f} GiB less --headroom {plan.headroom:g})"
        )
        lines.append(f"requested layout {c.layout.label()}: {verdict}; {memory_line(c)}")
        lines.append(f"  estimated step {c.time.total:.3f} s ({_time_parts(c)})")
    if plan.requested_error:
        lines.append(f"requested layout is not valid here: {plan.requested_error}")
    return lines + plan.notes


def throughput_line(plan: Plan) -> str:
    """Tokens/s and days at the step of the requested layout (else the fastest that fits): the
    table's figure for that row (its measured step after --measure, else its estimate), with the
    model FLOPs utilisation over every GPU that step means (what training's log prints), below
    --mfu, which is the busiest rank's compute alone. With no layout to time, the ceiling: every
    GPU computing at --mfu."""
    work, gpus = plan.work, plan.cluster.world_size
    peak = peak_tflops(work, plan.cluster.gpu)
    mfu = f"at MFU {plan.mfu:.2f}{'' if work.mixed else ' of the fp32 peak'}"
    candidate = _headline_candidate(plan)
    if candidate is None:
        sizes = model_sizes(work.padded(1), work.global_batch_size)
        tokens = sizes.tokens_per_second(gpus, peak, plan.mfu)
        return f"{mfu} on every GPU, the ceiling: {tokens:,.0f} tokens/s, {_days(plan, tokens)}"
    step = step_seconds(candidate)
    tokens = tokens_per_second(work, candidate)
    flops = model_sizes(work.padded(candidate.layout.tp), work.global_batch_size).flops_per_iteration
    which = "requested" if plan.requested else "fastest"
    premise = "measured" if candidate.measured_step_s else f"{mfu} on the busiest rank"
    return (
        f"{premise}, {which} layout {candidate.layout.label()}: {tokens:,.0f} tokens/s, "
        f"{_days(plan, tokens)}; model FLOPs utilisation {flops / (step * gpus * peak * 1e12):.2f} "
        f"over {'the GPU' if gpus == 1 else f'the {gpus} GPUs'}"
    )


def _headline_candidate(plan: Plan) -> Candidate | None:
    """The requested layout's row of the ranking once --measure measured it there, else the
    requested layout as estimated (it may not fit; under its own label where its row runs it as
    another: gptrain.plan.rank.runs_as), else the first row."""
    if plan.requested:
        row = next((c for c in plan.ranked if c.requested), None)
        return row if row is not None and row.measured_step_s is not None else plan.requested
    return plan.ranked[0] if plan.ranked else None


def _days(plan: Plan, tokens_per_second: float) -> str:
    """Days for the token budget; hours or minutes under a day (`0.0 days` hid a short budget)."""
    days = plan.tokens / tokens_per_second / SECONDS_PER_DAY
    if days >= 1:
        took = f"{days:.1f} days"
    elif days * 24 >= 1:
        took = f"{days * 24:.1f} hours"
    else:
        took = f"{days * 24 * 60:.1f} minutes"
    return f"{took} for {plan.tokens:.3g} tokens"


def nothing_fits_line(plan: Plan) -> str:
    """Why the ranking is empty and what to change: the search already tried micro batch 1 and
    full recompute, so only more or larger GPUs, less headroom or a smaller job help."""
    c, gpu = plan.cluster, plan.cluster.gpu
    where = f"{plan.name} on {c.nodes} x {c.gpus_per_node} {gpu.name}"
    if plan.smallest is None:
        return (
            f"no layout of {where} passes gptrain's layout checks (TP x PP x DP = {c.world_size} GPUs, "
            "PP dividing model.num_layers with at least PP micro batches of model.global_batch_size / DP); "
            "change --nodes, --gpus-per-node or model.global_batch_size"
        )
    allowed = gpu.memory_gib * (1 - plan.headroom)
    return (
        f"no valid layout of {where} fits: the smallest, {plan.smallest.layout.label()}, needs "
        f"{plan.smallest.memory.total / GIB:.1f} GiB per GPU where {allowed:.1f} GiB are usable "
        f"({gpu.memory_gib:.0f} GiB less --headroom {plan.headroom:g}), with micro batch 1 and full "
        "recompute already tried; use more GPUs (--nodes, --gpus-per-node), a GPU with more memory "
        "(--gpu), or a smaller model or model.encoder_seq_length"
    )


def _time_parts(c: Candidate) -> str:
    t = c.time
    parts = (
        ("compute", t.compute),
        ("launch", t.launch),
        ("bubble", t.bubble),
        ("TP", t.tp_comm),
        ("PP", t.pp_comm),
        ("DP", t.dp_comm),
    )
    return ", ".join(f"{name} {value:.3f}" for name, value in parts if value > 0 or name == "compute")


def table(plan: Plan) -> Table:
    measured = any(c.measured_step_s is not None or c.error for c in plan.shown())
    t = Table(title=f"best {len(plan.shown())} of {layouts_that_fit(plan.ranked)} layouts that fit")
    for column in ("#", "layout", "memory GiB", "step s (est.)", "tokens/s"):
        t.add_column(column, justify="left" if column == "layout" else "right")
    if measured:
        t.add_column("step s (meas.)", justify="right")
        t.add_column("peak GiB (meas.)", justify="right")
    for i, c in enumerate(plan.shown(), 1):
        row = [str(i), c.layout.label(), f"{c.memory.total / GIB:.2f}", f"{c.time.total:.3f}"]
        row.append(f"{tokens_per_second(plan.work, c):,.0f}")
        if measured:
            row.append(f"{c.measured_step_s:.3f}" if c.measured_step_s is not None else (c.error or "-"))
            row.append(f"{c.measured_peak_gib:.2f}" if c.measured_peak_gib is not None else "-")
        t.add_row(*row)
    return t


def print_plan(plan: Plan, console: Console | None = None, with_table: bool = True) -> None:
    console = console or Console(highlight=False, soft_wrap=True)
    for line in header_lines(plan):
        console.print(line, markup=False)
    if with_table:
        print_wide(console, table(plan))


def print_wide(console: Console, renderable: Table) -> None:
    """The table at its natural width: rich fits a table to the console, 80 columns where the
    output is a file or a pipe (a Slurm log), and cut the measured table's numbers short
    ('11,113,5…') and wrapped each layout over several lines."""
    natural = Measurement.get(console, console.options.update_width(10_000), renderable).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(renderable)
    finally:
        console.width = width


def plan_dict(plan: Plan) -> dict[str, Any]:
    world = cluster_overrides(plan.cluster)  # each row's overrides run it in the planned world
    return {
        "model": plan.name,
        "cluster": {
            "nodes": plan.cluster.nodes,
            "gpus_per_node": plan.cluster.gpus_per_node,
            "gpu": plan.cluster.gpu.__dict__,
        },
        "mfu": plan.mfu,
        "lines": header_lines(plan),
        "requested": plan.requested.to_dict(world) if plan.requested else None,
        "requested_error": plan.requested_error,
        "candidates": [c.to_dict(world) for c in plan.shown()],
        "valid_layouts_that_fit": layouts_that_fit(plan.ranked),
        "smallest": plan.smallest.to_dict(world)
        if plan.smallest
        else None,  # nothing fits: the error's layout
    }


def write_json(plan: Plan, path: str) -> None:
    atomic_write_text(Path(path), json.dumps(plan_dict(plan), indent=2) + "\n")
