"""Which random stream each rank's dropout draws from: Megatron's per-rank seeds.

Dropout draws from the global torch generator (compiled code too: inductor takes its seeds from
it). `gptrain.train.builders.seed_everything` seeds it, per rank, with `dropout_seed`:

- `seed + 100 x pipeline rank`, always: the stages hold different layers, and with one seed
  each stage would draw the same sequence of masks.
- `+ 2718 + tensor rank` under sequence parallelism (Megatron's tensor-parallel stream,
  `model_parallel_cuda_manual_seed`, which it forks to for the whole sequence-parallel
  transformer): every dropout then acts on this rank's shard (embedding and hidden dropout on
  its slice of the sequence, attention dropout on its heads), and a shared stream would give
  token t and token t + S/TP the same mask.
- Without sequence parallelism the tensor ranks keep one stream: the hidden dropout acts on
  activations every tensor rank holds whole, and different masks would make the copies drift
  apart. Attention dropout then draws the same masks for every rank's heads (head h and
  h + heads/TP share one), and the run says so at start (`stream_warnings`). Megatron forks to
  the tensor-parallel stream around attention only; here that fork would have to be a graph
  break inside every compiled block (torch.compile cannot trace a generator's state), and inside
  an activation-checkpointed block dynamo then runs the whole block eagerly: the fix would cost
  the layout its compile. Sequence parallelism gives every rank its own masks at no such cost.
- Data-parallel ranks keep one seed (Megatron's default): they see other samples.

Weights never draw from these streams (`init_weights` gets a generator seeded with model.seed),
nor does the data order (the sampler is arithmetic; the DataLoader has its own generator).
Every dropout runs on local tensors, never on a DTensor, so DTensor's own RNG tracker (CUDA
only, which broadcasts rank 0's state) is never created. Imports no torch.
"""

from __future__ import annotations

from typing import Any

from gptrain.parallel.layout import STARTED, check_layout
from gptrain.parallel.mesh import ParallelDims, World

PIPELINE_SEED_STRIDE = 100  # Megatron's _set_random_seed: seed + 100 * pipeline rank
TENSOR_PARALLEL_SEED_OFFSET = 2718  # Megatron's model_parallel_cuda_manual_seed: + 2718 + tensor rank


def dropout_seed(seed: int, pp_rank: int, tp_rank: int, tp: int, sequence_parallel: bool) -> int:
    """The seed of the stream this rank's dropout draws from (see the module docstring)."""
    stream = seed + PIPELINE_SEED_STRIDE * pp_rank
    if tp > 1 and sequence_parallel:
        stream += TENSOR_PARALLEL_SEED_OFFSET + tp_rank
    return stream


def stream_warnings(model: Any) -> list[str]:
    """One line when `model`'s tensor ranks repeat each other's attention-dropout masks."""
    tp = model.tensor_model_parallel_size
    if tp > 1 and not model.sequence_parallel and model.attention_dropout > 0:
        return [
            f"model.attention_dropout={model.attention_dropout:g} with tensor_model_parallel_size={tp}"
            " and sequence_parallel=false: every tensor rank's heads draw the same attention-dropout"
            f" masks (head h and h + num_attention_heads/{tp} share one); set"
            " model.sequence_parallel=true (the same traffic, less memory) for independent masks,"
            " or model.attention_dropout=0"
        ]
    return []


def model_parallel_ranks(dims: ParallelDims, rank: int) -> tuple[int, int]:
    """(pipeline rank, tensor rank) of global `rank` on the pp x dp x tp mesh (tp fastest, pp
    slowest: `ParallelDims.mesh_shape`), known before any process group or mesh exists."""
    return rank // (dims.dp * dims.tp), rank % dims.tp


def rank_dropout_seed(cfg: Any, world: World) -> int:
    """`dropout_seed` of this process under `cfg.model`'s layout (model.seed when it runs alone)."""
    m = cfg.model
    dims = check_layout(m, world.world_size, cfg.trainer.devices, STARTED)
    pp_rank, tp_rank = model_parallel_ranks(dims, world.rank)
    return dropout_seed(m.seed, pp_rank, tp_rank, dims.tp, bool(m.sequence_parallel))


def stream_layout(cfg: Any, world: World) -> dict[str, Any]:
    """What decides every rank's stream; a checkpoint's streams fit a run with the same, whatever its
    data-parallel size (`streams_fit`).

    A rank takes the stream of the saved rank at its own (stage, tensor rank) coordinate
    (gptrain.checkpoint.rank_state.read_rank_state); under other TP or PP sizes no saved rank has
    this rank's stream, and tensor ranks that must share one could get different ones.
    """
    m = cfg.model
    return {
        "world_size": world.world_size,
        "tensor_model_parallel_size": m.tensor_model_parallel_size,
        "pipeline_model_parallel_size": m.pipeline_model_parallel_size,
        "sequence_parallel": bool(m.sequence_parallel),
    }


def streams_fit(saved: dict[str, Any] | None, layout: dict[str, Any]) -> bool:
    """Whether streams saved under `saved` (a `stream_layout`; None when the checkpoint did not record
    one) may be restored under `layout`: the same TP, PP and sequence parallelism, whatever the number
    of ranks (the data-parallel ranks of a coordinate share its stream, as in Megatron, which restores
    the same (pp, tp) rank's streams after a change of the data-parallel size), or one process (no
    peers to keep in step)."""
    if layout["world_size"] == 1:
        return True
    if saved is None:
        return False
    return {**saved, "world_size": 0} == {**layout, "world_size": 0}


def describe_layout(layout: dict[str, Any] | None) -> str:
    if layout is None:
        return "a layout it did not record"
    sp = "on" if layout["sequence_parallel"] else "off"
    return (
        f"{layout['world_size']} ranks, TP {layout['tensor_model_parallel_size']}, "
        f"PP {layout['pipeline_model_parallel_size']}, sequence parallel {sp}"
    )
