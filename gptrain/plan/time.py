"""Step time of a layout: compute at an MFU, the pipeline bubble, and communication over bandwidths.

  compute  = the busiest pipeline rank's model FLOPs per step plus its recomputed FLOPs
             / (TP x DP GPUs x peak x MFU): each rank its own layers' share of the layer FLOPs, the
             last rank also the output layer's (logits GEMM; Megatron counts no embedding FLOPs),
             so an even split paces at the last rank; without a pipeline FLOPs / GPUs
  bubble   = the other ranks' compute (and launches) / (v x microbatches): 1F1B runs m micro
             batches at the slowest rank's pace plus one pass through the others, which is
             (pp - 1) / (v m) of a step when they are equal (Narayanan et al. 2021, sec. 2.2)
  TP       = per layer and micro batch 4 collectives of b s h activation bytes (2 forward,
             2 backward; all-reduce, or all-gather + reduce-scatter with SP: the same bytes),
             each moving 2 (t - 1) / t of its size per GPU (ring), 2 more for each block full
             recompute reruns (all, or with method block the first N of each chunk);
             per micro batch one more for the embedding's output (first rank) and one for the
             final norm's (last rank)
  PP       = each micro batch sends b s h / (t if SP) elements of the residual stream (fp32, bf16
             under FSDP's bf16 gather) forward and back per chunk boundary
  DP       = gradient all-reduce 2 (d - 1)/d x 4 bytes/param (fp32), once per step; or FSDP over
             its shard group s, (s - 1)/s of each all-gather of the weights (bf16; fp32 under fp16
             and fp32; 1 byte for float8-gathered FP8 block weights) and each reduce-scatter of the
             fp32 gradients, as often as gptrain runs them: full_shard and hybrid_shard gather the
             blocks for every micro batch's forward and again for its backward, the root once per
             micro batch, and reduce-scatter every micro batch; shard_grad_op gathers once per step;
             under a pipeline every sharding gathers and reduce-scatters once per step
             (tests/distributed counts them). hybrid_shard adds the all-reduce of the gradient
             shards across its d/s replicas, once per step;
             torch DDP overlaps its all-reduce with the backward (half assumed hidden), the bucketed
             all-reduce used with TP/PP and FSDP's prefetch are counted as they are
A group's bandwidth is NVLink's when it fits in a node, the network's otherwise. Each micro batch
also pays a fixed launch cost per layer (kernels that are too small to fill the GPU), so of two
layouts with the same FLOPs the one with fewer, larger micro batches wins, as measured in practice.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptrain.models.config import GPTConfig
from gptrain.models.flops import megatron_output_flops_per_iteration
from gptrain.plan.hardware import Cluster, GpuSpec
from gptrain.plan.memory import (
    float8_gathered_weights,
    gathered_through_the_step,
    root_parameters,
    unsharded_gradients,
)
from gptrain.plan.sizes import model_sizes, rank_parameters
from gptrain.plan.spec import Layout, Workload

DDP_OVERLAP = 0.5
LAUNCH_S_PER_LAYER = 60e-6
"""Forward + backward of one block for one micro batch: ~30 kernels at ~2 us of launch each."""


@dataclass(frozen=True)
class StepTime:
    """Seconds per step, by part."""

    compute: float
    launch: float
    bubble: float
    tp_comm: float
    pp_comm: float
    dp_comm: float

    @property
    def total(self) -> float:
        return self.compute + self.launch + self.bubble + self.tp_comm + self.pp_comm + self.dp_comm

    def to_dict(self) -> dict[str, float]:
        keys = ("compute", "launch", "bubble", "tp_comm", "pp_comm", "dp_comm")
        return {k: round(getattr(self, k), 6) for k in keys} | {"total": round(self.total, 6)}


def layer_and_output_flops(work: Workload, layout: Layout) -> tuple[float, float]:
    """Model FLOPs of one step in one transformer layer (every layer costs the same) and in the
    output layer (logits GEMM), Megatron's formula split in its two parts."""
    c = work.padded(layout.tp)
    total = model_sizes(c, work.global_batch_size).flops_per_iteration
    output = megatron_output_flops_per_iteration(c, work.global_batch_size)
    return (total - output) / c.num_layers, output


def rank_flops(work: Workload, layout: Layout) -> list[float]:
    """Model FLOPs of one step on each pipeline rank: its own layers', and on the last rank the
    output layer's, which is all computed there."""
    per_layer, output = layer_and_output_flops(work, layout)
    flops = [per_layer * layers for layers in layout.rank_layers(work.model.num_layers)]
    flops[-1] += output
    return flops


def recomputed_flops(work: Workload, layout: Layout) -> list[float]:
    """FLOPs each pipeline rank recomputes in one step: full recompute reruns the forward (a third
    of the model FLOPs) of its checkpointed blocks, all of them, or with method block the first N of
    each chunk; selective the attention core's forward, 2 s q FLOPs per token and layer. The output
    layer is never recomputed."""
    c = work.model
    if layout.recompute == "full":
        per_layer, _ = layer_and_output_flops(work, layout)
        return [per_layer / 3.0 * blocks for blocks in rebuilt_blocks(layout, c.num_layers)]
    if layout.recompute == "selective":
        tokens = work.global_batch_size * c.seq_length
        core = 2.0 * c.seq_length * c.num_attention_heads * c.head_dim * tokens
        return [core * layers for layers in layout.rank_layers(c.num_layers)]
    return [0.0] * layout.pp


def rebuilt_blocks(layout: Layout, num_layers: int) -> list[int]:
    """Blocks each pipeline rank reruns in its backward under full recompute: its chunks'
    checkpointed ones (all of them, or with method block the first N of each); none otherwise."""
    if layout.recompute != "full":
        return [0] * layout.pp
    n, stages = layout.recompute_num_layers, layout.stage_layers(num_layers)
    done = [min(k, n) if n is not None else k for k in stages]
    return [sum(done[rank :: layout.pp]) for rank in range(layout.pp)]


def residual_bytes(work: Workload, layout: Layout) -> int:
    """Bytes an element of the residual stream takes, what a pipeline stage sends (and gets the
    gradient of): fp32 under autocast too (fp32 master weights: the embedding's output is fp32, and
    fp32 + a 16-bit block output is fp32), bf16 where FSDP gathers the weights in bf16 (it casts each
    block's input to them)."""
    fsdp_bf16 = work.bf16 and layout.sharding != "ddp" and layout.dp > 1
    return 2 if fsdp_bf16 else 4


def _bandwidth(cluster: Cluster, group: int, stride: int, collective: bool = True) -> float:
    """Bus bytes/s of a group of `group` ranks `stride` apart in the rank order.

    Across nodes a collective runs one ring per NIC (NCCL), so the group's members on a node send
    through their NICs together: members per node x one NIC's rate, the busbw nccl-tests measures
    (about the node's network total for a group of every GPU; `gptrain validate` expects that).
    A pipeline send goes from one GPU through its own NIC."""
    if group * stride <= cluster.gpus_per_node:
        return cluster.gpu.intra_node_GBps * 1e9
    members_per_node = max(1, cluster.gpus_per_node // stride) if collective else 1
    return min(cluster.gpu.intra_node_GBps, members_per_node * cluster.gpu.inter_node_GBps) * 1e9


def peak_tflops(work: Workload, gpu: GpuSpec) -> float:
    """The dense matmul peak `--mfu` is a fraction of, the one training's MFU is measured against:
    bf16/fp16 autocast at the GPU's bf16 rate; fp32 at the plain fp32 rate (gptrain does not turn
    TF32 on; 66.9 against 989.4 TFLOP/s on an H100), or half the bf16 one where the spec has none.
    The step time and the header's tokens/s and days both use it."""
    if work.mixed:
        return gpu.bf16_tflops
    return gpu.fp32_tflops if gpu.fp32_tflops is not None else gpu.bf16_tflops * 0.5


def rank_busy_seconds(
    work: Workload, layout: Layout, cluster: Cluster, mfu: float
) -> tuple[list[float], list[float]]:
    """Each pipeline rank's compute (its model and recomputed FLOPs over the TP x DP GPUs of a
    stage at peak x MFU) and its kernel launches in one step."""
    peak = peak_tflops(work, cluster.gpu) * 1e12
    gpus_per_stage = layout.tp * layout.dp
    flops = zip(rank_flops(work, layout), recomputed_flops(work, layout), strict=True)
    compute = [(model + again) / (gpus_per_stage * peak * mfu) for model, again in flops]
    m = layout.microbatches(work.global_batch_size)
    launch = [LAUNCH_S_PER_LAYER * m * layers for layers in layout.rank_layers(work.model.num_layers)]
    return compute, launch


def estimate_step_time(work: Workload, layout: Layout, cluster: Cluster, mfu: float) -> StepTime:
    c = work.padded(layout.tp)
    computes, launches = rank_busy_seconds(work, layout, cluster, mfu)
    busy = [compute + launch for compute, launch in zip(computes, launches, strict=True)]
    slowest = busy.index(max(busy))  # every rank waits for it
    compute, launch = computes[slowest], launches[slowest]
    m = layout.microbatches(work.global_batch_size)
    bubble = (sum(busy) - busy[slowest]) / (layout.vpp * m)
    tokens = layout.micro_batch_size * c.seq_length
    tp_comm = pp_comm = dp_comm = 0.0
    if layout.tp > 1:
        tp_comm = tp_seconds(work, layout, cluster, c)
    if layout.pp > 1:
        shard = layout.tp if layout.sequence_parallel else 1
        per_send = tokens * c.hidden_size * residual_bytes(work, layout) / shard
        link = _bandwidth(cluster, layout.pp, layout.tp * layout.dp, collective=False)
        pp_comm = 2 * per_send * m * layout.vpp / link
    if layout.dp > 1 and layout.sharding == "ddp":
        params = max(rank_parameters(c, layout.tp, layout.pp, layout.rank_layers(c.num_layers)))
        bw = _bandwidth(cluster, layout.dp, layout.tp)
        dp_comm = 2 * (layout.dp - 1) / layout.dp * params * 4 / bw
        if layout.tp == 1 and layout.pp == 1:
            dp_comm *= 1 - DDP_OVERLAP
    elif layout.dp > 1:
        dp_comm = fsdp_seconds(work, layout, cluster, c)
    return StepTime(compute, launch, bubble, tp_comm, pp_comm, dp_comm)


def tp_seconds(work: Workload, layout: Layout, cluster: Cluster, c: GPTConfig) -> float:
    """TP's traffic in one step on the pipeline rank that sends the most, in b s h elements per
    micro batch: per layer 4 collectives (6 for a block full recompute reruns) of 16-bit elements under autocast
    (gptrain.parallel.tensor_parallel casts each gathered norm output, so every block collective is
    16-bit, as Megatron's), fp32 otherwise; the first rank also reduces the embedding's output (the
    residual stream's dtype) and the last gathers the final norm's output (cast as a block's)."""
    act = 2 if work.mixed else 4
    layers = layout.rank_layers(c.num_layers)
    rebuilt = rebuilt_blocks(layout, c.num_layers)
    per_rank = [(4 * n + 2 * r) * act for n, r in zip(layers, rebuilt, strict=True)]
    per_rank[0] += residual_bytes(work, layout)
    per_rank[-1] += act
    elements = 2 * (layout.tp - 1) / layout.tp * layout.micro_batch_size * c.seq_length * c.hidden_size
    m = layout.microbatches(work.global_batch_size)
    return max(per_rank) * elements * m / _bandwidth(cluster, layout.tp, 1)


def fsdp_seconds(work: Workload, layout: Layout, cluster: Cluster, c: GPTConfig) -> float:
    """FSDP's traffic in one step on the fullest pipeline rank: the gathers and reduce-scatters
    inside the shard group (a node under hybrid_shard) as often as gptrain runs them, and
    hybrid_shard's all-reduce of the gradient shards across the replicas."""
    layers = layout.rank_layers(c.num_layers)
    per_rank = rank_parameters(c, layout.tp, layout.pp, layers)
    rank = per_rank.index(max(per_rank))
    params, root = per_rank[rank], root_parameters(c, layout, rank)
    float8 = float8_gathered_weights(work, c, layout) * layers[rank]
    gather = 2 if work.bf16 else 4  # FSDP's param_dtype: bf16, else the fp32 parameters themselves
    blocks = gather * (params - root - float8) + float8  # float8-gathered weights move 1 byte
    m = layout.microbatches(work.global_batch_size)
    through = gathered_through_the_step(layout)
    gathered = (1 if through else 2 * m) * blocks + (1 if through else m) * gather * root
    reduced = (1 if unsharded_gradients(layout) else m) * 4 * params
    shard = layout.dp_shard or layout.dp
    seconds = (shard - 1) / shard * (gathered + reduced) / _bandwidth(cluster, shard, layout.tp)
    replicas = layout.dp // shard
    if replicas > 1:
        shards = 4 * params / shard
        seconds += 2 * (replicas - 1) / replicas * shards / _bandwidth(cluster, replicas, layout.tp * shard)
    return seconds
