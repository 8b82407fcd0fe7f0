"""Pipeline parallelism: split the GPT by layers into stages and run 1F1B schedules.

A stage is a copy of the (meta) model with the layers of other stages deleted from the
`layers` ModuleDict, so parameter names stay those of the whole model and checkpoints
reload under any layout, an uneven split too. The first stage keeps the token/position
embeddings, the last keeps the final norm and output; how many layers each holds is
gptrain.parallel.layout.stage_layer_counts (Megatron's rules).

Tied embeddings: when the first and last stage live on different ranks, the output
projection becomes its own parameter, initialised to the same values as the embedding;
after each backward the two gradients are summed over the first+last stage ranks
(`sync_tied_embedding_grads`), so both copies take identical optimizer steps and stay
equal, as in Megatron. The checkpoint holds both `tok_embeddings.weight` and
`output.weight`, which a non-pipelined (tied) model also reports, so reloading works.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from gptrain.utils.group_timeout import default_group_timeout

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle


def stage_ids(pp_rank: int, pp: int, vpp: int) -> list[int]:
    """Stages held by `pp_rank`: rank r holds r, r+pp, r+2pp... (interleaved placement)."""
    return [pp_rank + chunk * pp for chunk in range(vpp)]


def split_stage(model: nn.Module, stage: int, num_stages: int, layers: range) -> nn.Module:
    """A copy of `model` holding only what `stage` computes: its `layers` (global indices, from
    gptrain.parallel.layout.stage_layer_ranges), names unchanged."""
    part = copy.deepcopy(model)
    keep = {str(i) for i in layers}
    for name in list(part.layers.keys()):
        if name not in keep:
            del part.layers[name]
    if stage != 0:
        part.tok_embeddings = None
        if hasattr(part, "pos_embeddings"):
            part.pos_embeddings = None
    if stage != num_stages - 1:
        part.norm = None
        part.output = None
    return part


def is_tied(model: nn.Module) -> bool:
    tok, out = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    return tok is not None and out is not None and out.weight is tok.weight


def embedding_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """Process group of the first and last pipeline rank with this rank's dp/tp coordinates.

    Every rank must create every group (collective call); returns this rank's group, or
    None for ranks of middle stages.
    """
    ranks = mesh.mesh.reshape(mesh.mesh.shape[0], -1)
    mine = None
    timeout = default_group_timeout()  # torch's own default otherwise (10 minutes for NCCL)
    for column in range(ranks.shape[1]):
        pair = [int(ranks[0, column]), int(ranks[-1, column])]
        group = dist.new_group(pair, timeout=timeout)
        if dist.get_rank() in pair:
            mine = group
    return mine


def sync_tied_embedding_grads(parts: list[nn.Module], group: dist.ProcessGroup | None) -> None:
    """Sum the embedding gradient (first stage) and output gradient (last stage)."""
    if group is None:
        return
    for part in parts:
        for module in (getattr(part, "tok_embeddings", None), getattr(part, "output", None)):
            if module is None or module.weight.grad is None:
                continue
            grad = module.weight.grad  # both Shard(0) over the vocabulary under TP
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            dist.all_reduce(local, group=group)


class PipelineSchedules:
    """One schedule per micro-batch count, over the same pipeline stages.

    A batch-size ramp-up changes the micro-batches per step; a schedule is built for a count the
    first time a step has it (every pipeline rank reaches it at the same step: the ramp is a pure
    function of the consumed samples). Every micro-batch has the same shape whatever the count, so
    the stages' buffers fit them all.

    Switching between training and evaluation builds the schedules anew: a schedule prepares the
    stages' receive buffers once, for the mode it first ran in, and torch before 2.13 kept them
    across the switch (after a validation, received activations no longer required grad: "has
    gradients None and is expecting to send gradients"). Validation is rare; a rebuild costs one
    neighbour exchange and one shape-inference forward.
    """

    def __init__(self, stages: list, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.stages = stages
        self.loss_fn = loss_fn
        self._by_count: dict[int, PipelineScheduleSingle | PipelineScheduleMulti] = {}
        self._training = True

    def for_microbatches(
        self, count: int, training: bool = True
    ) -> PipelineScheduleSingle | PipelineScheduleMulti:
        if training != self._training:
            self._by_count.clear()
            self._training = training
        if count not in self._by_count:
            self._by_count[count] = _schedule(self.stages, count, self.loss_fn)
        return self._by_count[count]


def build_schedules(
    parts: list[nn.Module],
    stages: list[int],
    num_stages: int,
    pp_group: dist.ProcessGroup,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> PipelineSchedules:
    """1F1B with one stage per rank (GPipe over fewer micro-batches than stages), interleaved 1F1B
    with several.

    Gradients are not scaled by the schedule: `loss_fn` already divides by the number
    of loss tokens in the global batch: the per-token mean (see gptrain.train.step).
    """
    # Imported here: torch.distributed.pipelining pulls in sympy (~1 s) that other layouts never need.
    from torch.distributed.pipelining import PipelineStage

    pipeline_stages = [
        PipelineStage(part, stage, num_stages, device, group=pp_group)
        for part, stage in zip(parts, stages, strict=True)
    ]
    return PipelineSchedules(pipeline_stages, loss_fn)


def _schedule(
    stages: list, num_microbatches: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> PipelineScheduleSingle | PipelineScheduleMulti:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if len(stages) == 1 and num_microbatches < stages[0].num_stages:
        # torch's 1F1B refuses fewer micro-batches than stages, which Megatron's runs: its first
        # stages then run every forward before a backward anyway, and no rank holds more than
        # num_stages - 1 micro-batches' blocks, fewer than the first stage's 1F1B peak; the last
        # stage also holds their losses (gptrain.plan.memory counts them).
        return ScheduleGPipe(stages[0], num_microbatches, loss_fn=loss_fn, scale_grads=False)
    if len(stages) == 1:
        return Schedule1F1B(stages[0], num_microbatches, loss_fn=loss_fn, scale_grads=False)
    return ScheduleInterleaved1F1B(stages, num_microbatches, loss_fn=loss_fn, scale_grads=False)
