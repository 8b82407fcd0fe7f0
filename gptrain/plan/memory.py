"""Memory per GPU of a layout: weights, gradients, optimizer state, activations, logits.

Activations come from plan/activations.py (the inventory of the tensors gptrain's blocks save
for the backward: docs/planning.md lists it with Korthikanti et al. 2022's Table 2; tests/plan
measures it with saved-tensor hooks on CPU) and plan/rank_activations.py (what a pipeline rank
holds at its peak). Everything is in bytes and per rank;
the estimate of a layout is that of its fullest pipeline rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gptrain.models.config import GPTConfig
from gptrain.parallel.layout import WHOLE
from gptrain.plan.activations import EAGER, compile_scope, dtypes, fp8_linear, logits_bytes_per_token
from gptrain.plan.rank_activations import (
    activation_bytes,
    blocks_with_weight_copies,
    rebuild_bytes,
    runs_gpipe,
    waiting_losses,
)
from gptrain.plan.sizes import rank_parameters
from gptrain.plan.spec import Layout, Workload

GIB = float(2**30)
# Bytes per parameter kept for the whole run by gptrain: fp32 weights (the master copy is the
# parameter itself), fp32 gradients, AdamW's exp_avg and exp_avg_sq in fp32.
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes on the fullest rank, by kind."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    transient: float
    """Working copies: autocast's 16-bit weights, FSDP's unsharded blocks, DDP's buckets."""
    accumulating: bool = True
    """Gradients already live during the forward (several micro batches per step, or a pipeline)."""
    pipeline_rank: int = 0
    rebuild: float = 0.0
    """Full recompute: what is live besides the state while the backward rebuilds its first
    checkpointed block (the loss and the head are freed by then); 0 when no block is checkpointed."""
    parts: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        """Peak: the state, plus the largest of the start of a backward (activations, the loss and
        working copies, with gradients when they accumulate), the rebuild of a checkpointed block
        and the end of the backward (all gradients)."""
        live_grads = self.gradients if self.accumulating else 0.0
        backward_start = self.activations + self.logits + self.transient + live_grads
        rebuild = self.rebuild + live_grads if self.rebuild else 0.0
        return self.weights + self.optimizer + max(backward_start, rebuild, self.gradients + self.transient)

    def gib(self) -> dict[str, float]:
        out = {k: round(getattr(self, k) / GIB, 3) for k in ("weights", "gradients", "optimizer")}
        out |= {k: round(getattr(self, k) / GIB, 3) for k in ("activations", "logits", "transient")}
        return out | {"total": round(self.total / GIB, 3), "pipeline_rank": self.pipeline_rank}


def _sharded(layout: Layout) -> bool:
    """FSDP2 over 2+ data-parallel ranks (any sharding but ddp)."""
    return layout.sharding != "ddp" and layout.dp > 1


def gathered_through_the_step(layout: Layout) -> bool:
    """Every block stays gathered from the step's first forward to its last backward: shard_grad_op
    (gptrain.parallel.data_parallel), and any sharding under a pipeline, whose schedule (torch's
    PipelineStage) turns off FSDP's reshard after backward until the step's last one."""
    return _sharded(layout) and (layout.sharding == "shard_grad_op" or layout.pp > 1)


def unsharded_gradients(layout: Layout) -> bool:
    """FSDP under a pipeline reduce-scatters once per step: torch's PipelineStage turns FSDP's
    gradient sync off for every micro batch's backward, so each rank accumulates its stage's whole
    fp32 gradients (FSDP's reduce dtype) and shards them only at the step's end, as Megatron's
    distributed optimizer keeps a whole gradient buffer (its 6 + 12/DP bytes a parameter)."""
    return _sharded(layout) and layout.pp > 1


def _block_linear_shapes(config: GPTConfig, tp: int) -> list[tuple[int, int]]:
    """(in, out) of each Linear of one block on one TP rank."""
    h, f, t = config.hidden_size, config.ffn_size, tp
    q = config.num_attention_heads * config.head_dim
    kv = config.query_groups * config.head_dim
    shapes = [(h, q // t), (h, kv // t), (h, kv // t), (q // t, h)]
    return shapes + [(h, f // t)] * (2 if config.gated_mlp else 1) + [(f // t, h)]


def float8_gathered_weights(work: Workload, config: GPTConfig, layout: Layout) -> int:
    """Weights of one block that FSDP all-gathers as float8 (1 byte each) on one TP rank: the
    Float8Linear weights, under FSDP with tensorwise FP8 (`Workload.fp8_fsdp_gather`); else 0."""
    fsdp = layout.sharding != "ddp" and layout.dp > 1
    if not (work.fp8_fsdp_gather and fsdp):
        return 0
    return sum(i * o for i, o in _block_linear_shapes(config, layout.tp) if fp8_linear(work, i, o))


def _matmul_weights(
    work: Workload, config: GPTConfig, layout: Layout, rank: int, blocks: float | None = None
) -> float:
    """Linear weights on this rank whose 16-bit copies (autocast's casts) are saved for the
    backward, eager or compiled (biases and norms are cast too but not kept; embedding lookups
    are not cast), with `blocks` copies of the blocks' (default: the rank's layers, once each).
    Float8Linear saves the fp32 parameter itself and recasts it."""
    h, t = config.hidden_size, layout.tp
    shapes = _block_linear_shapes(config, t)
    block = sum(i * o for i, o in shapes if not fp8_linear(work, i, o))
    total = (layout.rank_layers(config.num_layers)[rank] if blocks is None else blocks) * block
    if rank == layout.pp - 1:
        total += config.vocab_size // t * h  # the output layer (the tied embedding, cast for the matmul)
    return total


def estimate_memory(work: Workload, layout: Layout, scope: str | None = None) -> MemoryEstimate:
    """The fullest pipeline rank's peak (the largest total over ranks and over the global batches a
    step trains: a ramp's first ones may run GPipe). `scope` overrides the compile scope the layout
    implies (bench/plan_memory_gpu.py compares them)."""
    steps = [dataclasses.replace(work, global_batch_size=batch) for batch in step_batches(work, layout)]
    ranks = (estimate_rank(step, layout, r, scope) for step in steps for r in range(layout.pp))
    return max(ranks, key=lambda e: e.total)


def step_batches(work: Workload, layout: Layout) -> list[int]:
    """The global batches whose steps hold different memory under `layout`: the full one and,
    under a pipeline, those of a batch ramp (model.rampup_batch_size) with other in-flight
    counts: each with fewer micro batches than stages (GPipe), any under an interleaved one."""
    batches = [work.global_batch_size]
    if layout.pp == 1:
        return batches  # fewer micro batches only end gradient accumulation: less memory
    seen = {layout.microbatches(work.global_batch_size)}
    for batch in work.ramp_batches:
        m = layout.microbatches(batch)
        if m >= 1 and m not in seen and (layout.vpp > 1 or runs_gpipe(layout, m)):
            seen.add(m)
            batches.append(batch)
    return batches


def estimate_rank(work: Workload, layout: Layout, rank: int, scope: str | None = None) -> MemoryEstimate:
    c = work.padded(layout.tp)
    params = rank_parameters(c, layout.tp, layout.pp, layout.rank_layers(c.num_layers))[rank]
    shard = layout.dp_shard if layout.sharding != "ddp" and layout.dp > 1 else 1
    scope = scope or compile_scope(work, layout)
    acts = activation_bytes(work, layout, rank, scope)
    tokens = layout.micro_batch_size * c.seq_length
    logits = logits_bytes_per_token(layout, c, work, scope) * tokens
    if scope == WHOLE:  # the output layer's 16-bit weight gradient, made while that buffer lives
        logits += dtypes(work).act * c.vocab_size / layout.tp * c.hidden_size
    logits += waiting_losses(work, layout, scope)
    transient = _transient(work, layout, c, rank, params, scope)
    rebuild = rebuild_bytes(work, layout, rank, scope)
    if rebuild:
        rebuild += transient - _copies_freed_before_rebuild(work, layout, c, rank, scope)
    return MemoryEstimate(
        weights=WEIGHT_BYTES * params / shard,
        gradients=GRAD_BYTES * params / (1 if unsharded_gradients(layout) else shard),
        optimizer=ADAM_BYTES * params / shard,
        activations=sum(acts.values()),
        logits=logits if rank == layout.pp - 1 else 0.0,
        transient=transient,
        accumulating=layout.microbatches(work.global_batch_size) > 1 or layout.pp > 1,
        pipeline_rank=rank,
        rebuild=rebuild,
        parts=acts,
    )


def _transient(work: Workload, layout: Layout, c: GPTConfig, rank: int, params: int, scope: str) -> float:
    """Copies that live through a forward/backward besides the persistent state."""
    act = dtypes(work).act
    # FSDP2: blocks all-gathered one ahead (2 unsharded; all under shard_grad_op), the root stays gathered;
    # also over a shard group of one (hybrid_shard with TP filling the node), where torch copies them
    if _sharded(layout):
        layers = layout.rank_layers(c.num_layers)[rank]
        per_block = (params - root_parameters(c, layout, rank)) / max(1, layers)
        float8 = float8_gathered_weights(work, c, layout)  # gathered in 1 byte instead of `act`
        # bf16 gathers in bf16 (FSDP's param_dtype); fp16 and fp32 gather the fp32 parameters
        gather = act if work.bf16 else 4
        gathered_block = gather * (per_block - float8) + float8
        root = root_parameters(c, layout, rank)
        gathered = layers if gathered_through_the_step(layout) else 2
        total = gathered * gathered_block + gather * root + (gather + 4) * max(per_block, root)
        if work.mixed and not work.bf16:  # fp16: autocast's 16-bit copy of every gathered
            total += 2 * _matmul_weights(work, c, layout, rank)  # weight lives until its backward
        return total
    blocks = blocks_with_weight_copies(work, layout, rank, scope)  # compiled: one per micro batch in flight
    copies = 2 * _matmul_weights(work, c, layout, rank, blocks) if work.mixed else 0.0
    if layout.sharding == "ddp" and layout.dp > 1 and layout.tp == 1 and layout.pp == 1:
        copies += GRAD_BYTES * params  # torch DDP's gradient buckets (not views of .grad)
    return copies


def _copies_freed_before_rebuild(
    work: Workload, layout: Layout, c: GPTConfig, rank: int, scope: str
) -> float:
    """Autocast's 16-bit weight copies (in `_transient`) that are not live while a checkpointed
    block is rebuilt: autocast's cache holds every copy until the forward's autocast region ends,
    but a checkpointed block saves none of its own, and the output layer's is freed with the head;
    the rebuilt block casts its weights again. A pipeline step is one autocast region, forwards
    and backwards (gptrain.parallel.runtime): there an eager stage's cache keeps every copy."""
    if not work.mixed or (_sharded(layout) and work.bf16):  # no copies; FSDP bf16 gathers in bf16 already
        return 0.0
    if layout.pp > 1 and scope == EAGER:
        return 0.0
    per_block = sum(i * o for i, o in _block_linear_shapes(c, layout.tp) if not fp8_linear(work, i, o))
    return 2.0 * (_matmul_weights(work, c, layout, rank) - per_block)


def root_parameters(c: GPTConfig, layout: Layout, rank: int) -> int:
    """Parameters of pipeline rank `rank` outside its blocks (embeddings, final norm, output): the
    FSDP root unit, gathered once per forward and kept through its backward."""
    h = c.hidden_size
    root = 0
    if rank == 0:
        root += c.vocab_size // layout.tp * h
        root += c.position_rows * h
    if rank == layout.pp - 1:
        root += h * (2 if c.normalization == "layernorm" else 1)
        if not c.share_embeddings_and_output_weights or layout.pp > 1:
            root += c.vocab_size // layout.tp * h
    return root


def fits(estimate: MemoryEstimate, memory_gib: float, headroom: float) -> bool:
    """Within (1 - headroom) of the device: the allocator's fragmentation and the CUDA context."""
    return estimate.total <= memory_gib * GIB * (1.0 - headroom)
