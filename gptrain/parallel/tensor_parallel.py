"""Tensor and sequence parallelism with DTensor plans (Megatron's layout, PyTorch-native).

Attention q/k/v and MLP w1/w3 are split by output columns (heads, ffn), wo and w2 by
input rows, so each block needs one all-reduce forward and one backward (or, with
sequence parallelism, a reduce-scatter/all-gather pair around norms and dropout that
then run on a slice of the sequence). Embedding and output are split over the
vocabulary (the embedding looked up as Megatron's VocabParallelEmbedding, so its gradient is
this rank's rows too); with loss_parallel the cross entropy runs on vocabulary shards so the full
logits are never gathered.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle


class ReplicateParallel(ParallelStyle):
    """Keep a module's parameters whole but as Replicate DTensors.

    Parameters not split by a plan (norms without sequence parallelism, learned
    positions) must still be DTensors: a plain tensor cannot meet a DTensor in the
    optimizer, the grad-norm or FSDP on a 2-D mesh. Inputs become Replicate DTensors;
    the output is turned into `output_layout` and handed on as a local tensor.
    `seq_dim_from_end` picks the sequence dim for Shard outputs ((S, H) and (B, S, H)
    both have it second from the end).
    """

    def __init__(self, output_shard_seq: bool = False, seq_dim_from_end: int = 2) -> None:
        super().__init__()
        self.output_shard_seq = output_shard_seq
        self.seq_dim_from_end = seq_dim_from_end

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for key, param in list(module.named_parameters(recurse=False)):
            dist_param = nn.Parameter(distribute_tensor(param, mesh, [Replicate()]), param.requires_grad)
            module.register_parameter(key, dist_param)

    @staticmethod
    def _input(mod: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        return tuple(
            DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )

    def _output(self, mod: nn.Module, output: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        if not isinstance(output, DTensor):
            return output
        if self.output_shard_seq:
            output = output.redistribute(mesh, [Shard(output.ndim - self.seq_dim_from_end)])
        return output.to_local()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            self._partition,
            self._input,
            lambda mod, out, mesh: self._output(mod, out, mesh),
        )


class VocabParallelEmbedding(RowwiseParallel):
    """An nn.Embedding split over the vocabulary rows and looked up as Megatron's VocabParallelEmbedding.

    Each tensor rank looks the ids of its own rows up in its local shard (zeros for the others) and the
    outputs are summed over the ranks: an all-reduce into `output_layout` Replicate, a reduce-scatter
    into the sequence-parallel region under Shard(1). The weight's gradient is then this rank's rows
    only. RowwiseParallel's DTensor lookup gives the same output, but DTensor's embedding backward has
    no vocabulary-sharded strategy: the gradient came back whole (Replicate) on every tensor rank,
    vocab x hidden x (1 - 1/TP) more numbers kept until the optimizer step (the planner counts the
    shard), which the data-parallel all-reduce of TP + DDP carried too. A RowwiseParallel, so that
    what reads a plan by its styles' types (tests/plan's parameter counts) sees the weight split.
    """

    def __init__(self, output_layout: Shard | Replicate) -> None:
        super().__init__(input_layouts=Replicate(), output_layouts=output_layout)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Embedding) or module.padding_idx is not None or module.max_norm:
            raise NotImplementedError(f"VocabParallelEmbedding takes a plain nn.Embedding, not {module}")
        self._partition_embedding_fn("", module, device_mesh)  # the weight as Shard(0)
        # the module's own forward would run on the DTensor weight (DTensor's lookup): this one instead
        module.forward = partial(vocab_parallel_lookup, module, device_mesh, self.output_layouts[0])
        return module


def vocab_parallel_lookup(
    module: nn.Embedding, mesh: DeviceMesh, output_layout: Shard | Replicate, ids: torch.Tensor
) -> torch.Tensor:
    """Rows of `ids` [B, S] from this rank's vocabulary shard, summed over `mesh` into `output_layout`.

    `module.weight` is read at each call: FSDP2 puts the gathered weight there before the forward.
    """
    rows = module.weight.to_local()  # its gradient comes back as the weight's Shard(0) DTensor
    first = mesh.get_local_rank() * rows.shape[0]
    elsewhere = (ids < first) | (ids >= first + rows.shape[0])
    looked_up = F.embedding(torch.where(elsewhere, 0, ids - first), rows)
    mine = looked_up.masked_fill(elsewhere.unsqueeze(-1), 0.0)
    # Partial -> Replicate / Shard(1) forward; the backward hands every rank the whole output gradient
    summed = DTensor.from_local(mine, mesh, [Partial()], run_check=False)
    return summed.redistribute(mesh, [output_layout], async_op=True).to_local()


def cast_to_autocast_dtype(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook: the first input in the autocast dtype where autocast is on for its device.

    A norm's output is fp32 (the fp32 residual stream; CUDA autocast runs layer_norm and rms_norm
    in fp32), and the column linears that read it cast it to bf16/fp16 anyway. Cast before the
    input is gathered (SP), the all-gather carries 16 bits, and in the backward the gradient is
    summed over the linears and reduced (reduce-scatter under SP, all-reduce without) in 16 bits
    too, as Megatron sends them: each was fp32, 1.5x the bytes of a block's TP traffic. The
    forward is unchanged bit for bit; without autocast (fp32, float64) this does nothing.
    """
    x = args[0] if args else None
    # fp32 only: autocast leaves float64 alone, and a 16-bit input is no wider than its cast
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        return None
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return None
    return (x.to(torch.get_autocast_dtype(device)), *args[1:])


class _CastInputFirst:
    """Mixin for a style whose module casts its input anyway: `cast_to_autocast_dtype` runs before
    the style's own input hook redistributes that input. A subclass, not a wrapper, so that
    whatever reads a plan by its styles' types (tests/plan's parameter counts) still sees them."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module = super()._apply(module, device_mesh)  # type: ignore[misc]
        # looked up here, not at import: tests/distributed/tp_autocast_worker.py swaps it for a no-op
        module.register_forward_pre_hook(cast_to_autocast_dtype, prepend=True)
        return module


class AutocastPrepareModuleInput(_CastInputFirst, PrepareModuleInput):
    """PrepareModuleInput of a sublayer whose column linears read its first input."""


class AutocastColwiseParallel(_CastInputFirst, ColwiseParallel):
    """ColwiseParallel that gathers (SP) and reduces its input's gradient in the autocast dtype."""


def _norm_style(sequence_parallel: bool) -> ParallelStyle:
    return SequenceParallel() if sequence_parallel else ReplicateParallel()


def _gather_input(
    act_layout: Shard | Replicate, extra_inputs: int = 2, prepare: Any = None, first_linear: str = ""
) -> ParallelStyle:
    """Whole-sequence input for attention/MLP; the extra inputs (rope cos/sin) pass as they are.
    With torchao's float8 `prepare`, the input is cast as `first_linear` casts it, then gathered.

    The gathered input stays a Replicate DTensor: the column linears' input gradients (wq, wk, wv;
    w1, w3) then add up as one Partial gradient, reduced once per sublayer (one reduce-scatter
    under SP, one all-reduce without), as Megatron does. A local tensor here was re-wrapped by each
    linear, which reduced each gradient on its own (3 + 1 or 2 collectives per layer instead of 2).
    """
    rest = (None,) * extra_inputs
    layouts = {"input_layouts": (act_layout, *rest), "desired_input_layouts": (Replicate(), *rest)}
    if prepare is not None:  # gathered as float8: no 16-bit cast before it
        return prepare(**layouts, fwd_config_submodule_fqn=first_linear)
    return AutocastPrepareModuleInput(**layouts)


def block_plan(
    block: nn.Module, sequence_parallel: bool, fp8_recipe: str | None = None
) -> dict[str, ParallelStyle]:
    """The TP plan of one transformer block, keyed by submodule name (float8 styles with FP8)."""
    act_layout = Shard(1) if sequence_parallel else Replicate()
    mlp_columns = ("w1", "w3") if getattr(block.mlp, "w3", None) is not None else ("w1",)
    return {
        "attention_norm": _norm_style(sequence_parallel),
        **_sublayer_plan(block, "attention", ("wq", "wk", "wv"), "wo", act_layout, fp8_recipe),
        "mlp_norm": _norm_style(sequence_parallel),
        **_sublayer_plan(block, "mlp", mlp_columns, "w2", act_layout, fp8_recipe),
    }


def _sublayer_plan(
    block: nn.Module,
    name: str,
    columns: tuple[str, ...],
    row: str,
    act_layout: Shard | Replicate,
    fp8_recipe: str | None,
) -> dict[str, ParallelStyle]:
    """Attention or MLP: the input gathered, `columns` split by output columns, `row` by input rows.

    With FP8, torchao's float8 styles go to the Float8Linears only: `fp8_linear_filter` leaves a
    linear whose local shard is no multiple of 16 in the training precision (a custom
    ffn_hidden_size, few query groups), and torchao's styles reject a plain nn.Linear. The input is
    cast to float8 before the gather only when every column linear is a Float8Linear: a plain
    linear cannot take a float8 input. Otherwise the input is gathered in the training precision
    and each Float8Linear casts its own copy, with the same tensorwise scale (taken over the whole
    gathered input) but one float8 cast per Float8Linear instead of one per sublayer.
    """
    column, row_style, prepare = ColwiseParallel, RowwiseParallel, None
    float8_linears: set[str] = set()
    if fp8_recipe is not None:
        from gptrain.parallel.float8 import fp8_tp_styles, is_float8_linear

        column, row_style, prepare = fp8_tp_styles(fp8_recipe)
        sublayer = block.get_submodule(name)
        float8_linears = {n for n in (*columns, row) if is_float8_linear(sublayer.get_submodule(n))}
    extra_inputs = 2 if name == "attention" else 0  # rope cos/sin
    if not float8_linears.issuperset(columns):
        prepare = None
    plan = {name: _gather_input(act_layout, extra_inputs, prepare, columns[0])}
    for linear in columns:
        plan[f"{name}.{linear}"] = (column if linear in float8_linears else ColwiseParallel)()
    row_style = row_style if row in float8_linears else RowwiseParallel
    plan[f"{name}.{row}"] = row_style(output_layouts=act_layout)
    return plan


def top_plan(model: nn.Module, sequence_parallel: bool, loss_parallel: bool) -> dict[str, ParallelStyle]:
    """Plan of the embedding, positions, final norm and output present on this stage."""
    act_layout = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        plan["tok_embeddings"] = VocabParallelEmbedding(output_layout=act_layout)
    if getattr(model, "pos_embeddings", None) is not None:
        plan["pos_embeddings"] = ReplicateParallel(output_shard_seq=sequence_parallel)
    if getattr(model, "norm", None) is not None:
        plan["norm"] = _norm_style(sequence_parallel)
    if getattr(model, "output", None) is not None:
        # the final norm's output, gathered (SP) and its gradient reduced in the autocast dtype
        plan["output"] = AutocastColwiseParallel(
            input_layouts=act_layout,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    sequence_parallel: bool,
    loss_parallel: bool,
    fp8_recipe: str | None = None,
) -> nn.Module:
    """Shard `model` (a whole GPT or one pipeline stage of it) over `tp_mesh` in place.

    `fp8_recipe`: the blocks were converted to torchao Float8Linear (before TP, as torchao
    requires), so those linears take the float8 styles. Tied input/output embeddings stay tied: both
    are split over the vocabulary rows
    (Shard(0)), so the output re-uses the embedding's DTensor parameter. Attention
    reshapes with -1 heads, so the local q/k/v shards need no head-count change.
    """
    tok, out = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    tied = tok is not None and out is not None and out.weight is tok.weight
    parallelize_module(model, tp_mesh, top_plan(model, sequence_parallel, loss_parallel))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan(block, sequence_parallel, fp8_recipe))
    if tied:
        model.output.weight = model.tok_embeddings.weight
    _check_all_distributed(model)
    return model


def _check_all_distributed(model: nn.Module) -> None:
    """A parameter no plan covered would meet DTensors later (optimizer, grad norm): fail early."""
    missed = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if missed:
        raise NotImplementedError(f"tensor parallel plan does not cover parameters {missed}")
