"""Every valid layout of a workload on a cluster, ranked by estimated step time under the memory limit.

Validity is gptrain.parallel.layout's check_layout and check_device_choices themselves (no torch:
the device type is the planned GPU's, torch's version its package's), run on the config with the
candidate's keys replaced, so the planner never proposes a layout `gptrain train` would refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gptrain.errors import ConfigError
from gptrain.plan.hardware import Cluster
from gptrain.plan.memory import GIB, MemoryEstimate, estimate_memory, fits
from gptrain.plan.spec import SPLIT_KEYS, Layout, Workload
from gptrain.plan.time import StepTime, estimate_step_time

MAX_MICRO_BATCH = 16
MAX_VIRTUAL = 8
"""The most model chunks a pipeline rank is planned with (Megatron accepts any v dividing a stage's
layers). Past 8 the bubble's (pp - 1) / (v m) shrinks by under an eighth of itself while each chunk
adds its sends; every divisor (v12 too) cost gpt3/175b on 64 nodes a quarter more planning time and
found no faster row than v6."""
RECOMPUTE_CHOICES: tuple[str | None, ...] = (None, "selective", "full")
LIGHTER_LAST_STAGE = (1, 2)
"""Layers fewer than an even share that the ranking also tries on the last pipeline stage, whose
logits pace it (Megatron's reason for model.num_layers_in_last_pipeline_stage)."""


@dataclass
class Candidate:
    """One layout with its estimates (and, after --measure, its measurements)."""

    layout: Layout
    memory: MemoryEstimate
    time: StepTime
    fits: bool
    requested: bool = False
    measured_step_s: float | None = None
    measured_peak_gib: float | None = None
    error: str | None = None

    def sort_key(self) -> tuple[float, float]:
        if self.measured_step_s is not None:
            return (0.0, self.measured_step_s)
        return (1.0, self.time.total)

    def to_dict(self, world: list[str] | None = None) -> dict[str, Any]:
        """`world`: the planned world's trainer keys (cluster_overrides), which lead `overrides`."""
        return {
            "layout": self.layout.label(),
            "overrides": [*(world or []), *self.layout.overrides()],
            "fits": self.fits,
            "requested": self.requested,
            "memory_gib": self.memory.gib(),
            "step_time_s": self.time.to_dict(),
            "measured_step_s": self.measured_step_s,
            "measured_peak_gib": self.measured_peak_gib,
            "error": self.error,
        }


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_grid(work: Workload, cluster: Cluster) -> Iterator[Layout]:
    """Every combination of the knobs worth trying (validity is checked afterwards)."""
    world, layers = cluster.world_size, work.model.num_layers
    # TP inside a node, as Megatron places it: any divisor of the node's GPUs (a 6-GPU node's 3 and 6;
    # a power of two that does not divide it, 4 of 6, would straddle two nodes)
    for tp in _divisors(cluster.gpus_per_node):
        for pp in (p for p in _divisors(layers) if world % (tp * p) == 0):
            dp = world // (tp * pp)
            sp = tp > 1 and work.model.seq_length % tp == 0  # sequence parallel splits the sequence
            # interleaving: any v up to MAX_VIRTUAL that splits a stage's layers into whole chunks
            vpps = [1] + ([v for v in _divisors(layers // pp) if 1 < v <= MAX_VIRTUAL] if pp > 1 else [])
            shardings = ["ddp"] + (["full_shard"] if dp > 1 else [])
            shardings += ["shard_grad_op"] if dp > 1 and pp == 1 else []  # under PP: full_shard's code
            shardings += ["hybrid_shard"] if dp > 1 and cluster.nodes > 1 else []
            for vpp in vpps:
                for mbs in _powers_of_two(min(MAX_MICRO_BATCH, max(1, work.global_batch_size // dp))):
                    for sharding in shardings:
                        for recompute in RECOMPUTE_CHOICES:
                            yield Layout(tp, pp, dp, vpp, mbs, sp, sharding, 0, recompute)


def checked(layout: Layout, model_cfg: Any, cluster: Cluster) -> Layout | None:
    """The layout with its FSDP shard group filled in, or None when gptrain would refuse it or
    when it is another's twin: hybrid_shard whose shard group is the whole DP group (one node's
    worth of data-parallel ranks) runs full_shard's mesh and code (gptrain.parallel.parallelize),
    and would take a second row of the table and a second --measure trial."""
    from gptrain.parallel.layout import check_device_choices, check_layout

    candidate = dataclasses.replace(
        model_cfg,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        micro_batch_size=layout.micro_batch_size,
        sequence_parallel=layout.sequence_parallel,
        data_parallel_sharding=layout.sharding,
        activations_checkpoint_granularity=layout.recompute,
        activations_checkpoint_method="uniform" if layout.recompute == "full" else None,
        activations_checkpoint_num_layers=None,
        **{key: getattr(layout, key) for key in SPLIT_KEYS},  # the grid's layouts split evenly
    )
    try:
        dims = check_layout(candidate, cluster.world_size, cluster.gpus_per_node)
        check_device_choices(candidate, "cpu" if cluster.gpu.name == "cpu" else "cuda")
    except ConfigError:
        return None
    if layout.sharding == "hybrid_shard" and dims.dp_shard == dims.dp:
        return None
    return dataclasses.replace(layout, dp_shard=dims.dp_shard)


def evaluate(work: Workload, layout: Layout, cluster: Cluster, mfu: float, headroom: float) -> Candidate:
    memory = estimate_memory(work, layout)
    return Candidate(
        layout=layout,
        memory=memory,
        time=estimate_step_time(work, layout, cluster, mfu),
        fits=fits(memory, cluster.gpu.memory_gib, headroom),
    )


def valid_candidates(
    work: Workload,
    model_cfg: Any,
    cluster: Cluster,
    mfu: float,
    headroom: float,
    requested: Layout | None = None,
) -> Iterator[Candidate]:
    """Every layout gptrain accepts, once each, with its estimates; the `requested` layout's own
    split keeps a row beside a faster split of the same layout (the user asked about that one)."""
    seen: set[Layout] = set()
    for raw in layout_grid(work, cluster):
        layout = checked(raw, model_cfg, cluster)
        if layout is None and raw.sequence_parallel:  # refused with SP (tensorwise FP8 on CPU)
            layout = checked(dataclasses.replace(raw, sequence_parallel=False), model_cfg, cluster)
        if layout is None or layout in seen:
            continue
        seen.add(layout)
        yield from split_rows(work, model_cfg, cluster, layout, mfu, headroom, requested)


def lighter_last_stages(layout: Layout, num_layers: int) -> list[Layout]:
    """The evenly split pipeline `layout` with 1 or 2 layers fewer on its last stage, the rest
    spread over the others (gptrain's checks then drop the splits it refuses); none without a
    pipeline. Moving them to the first stage instead (both keys) seldom paid: it doubled the
    planning time of gpt3/175b on 16 nodes and won no row there."""
    if layout.pp == 1:
        return []
    share = num_layers // layout.pp
    return [
        dataclasses.replace(layout, num_layers_in_last_pipeline_stage=share - fewer)
        for fewer in LIGHTER_LAST_STAGE
        if share - fewer >= 1
    ]


def split_rows(
    work: Workload,
    model_cfg: Any,
    cluster: Cluster,
    layout: Layout,
    mfu: float,
    headroom: float,
    requested: Layout | None = None,
) -> list[Candidate]:
    """One row per layout: the fastest of its even split and its lighter last stages that fits
    (the even split when none does), so the table and --measure's trials stay as many; and the
    requested split of this layout as a second row where it is not that one."""
    options = [evaluate(work, layout, cluster, mfu, headroom)]
    for lighter in lighter_last_stages(layout, work.model.num_layers):
        valid = checked(lighter, model_cfg, cluster)
        if valid is not None:
            options.append(evaluate(work, valid, cluster, mfu, headroom))
    asked_as = runs_as(requested) if requested is not None else None
    if (
        asked_as is not None
        and unsplit(asked_as) == layout
        and asked_as not in [runs_as(c.layout) for c in options]
    ):
        options.append(evaluate(work, requested, cluster, mfu, headroom))  # a split of its own (first=7)
    fitting = [c for c in options if c.fits]
    best = min(fitting, key=lambda c: (c.time.total, c.memory.total), default=options[0])
    asked = [c for c in options if runs_as(c.layout) == asked_as and c is not best]
    return [best, *asked]


def runs_as(layout: Layout) -> Layout:
    """`layout` as the grid's row that runs the same code (gptrain.parallel.parallelize): at DP 1
    any sharding is plain data parallelism (nothing to shard or reduce); under a pipeline
    shard_grad_op is full_shard (both keep the weights gathered through the schedule), and so is
    hybrid_shard whose shard group is the whole DP group."""
    if layout.dp == 1:
        return dataclasses.replace(layout, sharding="ddp", dp_shard=0)
    grad_op = layout.sharding == "shard_grad_op" and layout.pp > 1
    one_group = layout.sharding == "hybrid_shard" and layout.dp_shard == layout.dp  # see `checked`
    return dataclasses.replace(layout, sharding="full_shard") if grad_op or one_group else layout


def unsplit(layout: Layout) -> Layout:
    """`layout` split evenly: the grid's layout a split of it belongs to."""
    defaults = {field.name: field.default for field in dataclasses.fields(Layout) if field.name in SPLIT_KEYS}
    return dataclasses.replace(layout, **defaults)


def layouts_that_fit(ranked: list[Candidate]) -> int:
    """How many layouts the ranking holds, a requested split's extra row not counted."""
    return len({unsplit(candidate.layout) for candidate in ranked})


def rank_layouts(
    work: Workload,
    model_cfg: Any,
    cluster: Cluster,
    mfu: float,
    headroom: float,
    requested: Layout | None = None,
) -> list[Candidate]:
    """Valid layouts that fit, fastest first (ties: less memory first), less those whose recompute
    costs time and saves no memory; the `requested` layout keeps its row even where a lighter last
    stage of it is faster or its recompute saves nothing."""
    candidates = valid_candidates(work, model_cfg, cluster, mfu, headroom, requested)
    ranked = [c for c in candidates if c.fits]
    ranked.sort(key=lambda c: (c.time.total, c.memory.total))
    asked_as = runs_as(requested) if requested is not None else None
    plain: dict[Layout, list[Candidate]] = {}
    for c in ranked:
        if c.layout.recompute is None:
            plain.setdefault(_without_recompute(c.layout), []).append(c)
    return [c for c in ranked if runs_as(c.layout) == asked_as or not recompute_saves_nothing(c, plain)]


def _without_recompute(layout: Layout) -> Layout:
    return dataclasses.replace(unsplit(layout), recompute=None, recompute_num_layers=None)


def recompute_saves_nothing(candidate: Candidate, plain: dict[Layout, list[Candidate]]) -> bool:
    """Whether the same layout without recompute (any split; `plain`: the ranked rows without
    recompute by their layout) needs no more memory and no more time: selective recompute under
    TP + SP keeps the full-sequence partial sums before each reduce-scatter and the gathered norm
    outputs, more than plain autograd keeps (review E2)."""
    if candidate.layout.recompute is None:
        return False
    return any(
        other.memory.total <= candidate.memory.total and other.time.total <= candidate.time.total
        for other in plain.get(_without_recompute(candidate.layout), [])
    )


def least_memory(
    work: Workload, model_cfg: Any, cluster: Cluster, mfu: float, headroom: float
) -> Candidate | None:
    """The valid layout that needs the least memory per GPU (None: gptrain accepts none)."""
    candidates = valid_candidates(work, model_cfg, cluster, mfu, headroom)
    return min(candidates, key=lambda c: c.memory.total, default=None)


def step_seconds(candidate: Candidate) -> float:
    """The candidate's step: measured (--measure) when it was, else estimated."""
    return candidate.measured_step_s or candidate.time.total


def tokens_per_second(work: Workload, candidate: Candidate) -> float:
    return work.global_batch_size * work.model.seq_length / step_seconds(candidate)


def memory_line(candidate: Candidate) -> str:
    m = candidate.memory
    parts = ("weights", "gradients", "optimizer", "activations", "logits", "transient")
    return ", ".join(f"{p} {getattr(m, p) / GIB:.2f}" for p in parts) + f" -> {m.total / GIB:.2f} GiB"
