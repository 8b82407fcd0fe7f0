"""Memory per GPU of a layout: weights, gradients, optimizer state, activations, logits.

The activation model is an inventory of the tensors gptrain's blocks save for the backward
(docs/planning.md lists it with Korthikanti et al. 2022's Table 2 for comparison); tests/plan
measures the same inventory with saved-tensor hooks on CPU. Everything is in bytes and per rank;
the estimate of a layout is that of its fullest pipeline rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gptrain.models.config import GPTConfig
from gptrain.parallel.layout import BLOCKS_AND_LOSS, WHOLE, interleaved_rounds
from gptrain.parallel.layout import compile_scope as parallel_compile_scope
from gptrain.parallel.mesh import ParallelDims
from gptrain.plan.sizes import rank_parameters
from gptrain.plan.spec import Layout, Workload

GIB = float(2**30)
EAGER = "eager"
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


@dataclass(frozen=True)
class _Dtypes:
    act: int  # bytes of a matmul input/output (2 under 16-bit autocast, else 4)
    mixed: bool


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


def _dtypes(work: Workload) -> _Dtypes:
    return _Dtypes(act=2 if work.mixed else 4, mixed=work.mixed)


def _mask_bytes(work: Workload, input_bytes: int) -> int:
    """A dropout mask: bools from CUDA's fused kernel; the scaled noise itself on CPU."""
    return 1 if work.device_type == "cuda" else input_bytes


def compile_scope(work: Workload, layout: Layout) -> str:
    """What torch.compile covers under this layout: 'eager' without model.compile, else the
    scope gptrain.parallel.compile applies ('whole', 'blocks+loss' or 'blocks')."""
    if not work.compile:
        return EAGER
    dims = ParallelDims(layout.world_size, layout.tp, layout.pp, layout.vpp, layout.dp_shard)
    return parallel_compile_scope(dims)


def fp8_linear(work: Workload, in_features: int, out_features: int) -> bool:
    """torchao FP8 replaces a block Linear whose both sizes are multiples of 16
    (gptrain.parallel.float8.fp8_linear_filter)."""
    return work.fp8 and in_features % 16 == 0 and out_features % 16 == 0


def layer_bytes_per_token(
    work: Workload, layout: Layout, config: GPTConfig | None = None, scope: str | None = None
) -> float:
    """Bytes one transformer block saves for its backward, per token of a micro batch, on one TP rank."""
    c = config or work.padded(layout.tp)
    scope = scope or compile_scope(work, layout)
    if layout.recompute == "selective":
        return _selective_layer_bytes(work, layout, c)
    if scope != EAGER:
        return _compiled_layer_bytes(work, layout, c)
    d, t = _dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    q, kv = _attention_widths(c)
    seq_shard = t if layout.sequence_parallel else 1
    stats = 8 if c.normalization == "layernorm" else 4  # mean + rstd (fp32) or rstd
    norms = 2 * (4 * h + stats) / seq_shard  # norms run in fp32 (autocast policy) and keep their input
    masks = (
        2 * h * _mask_bytes(work, d.act) / seq_shard if c.hidden_dropout > 0 else 0
    )  # after attention, MLP
    if d.mixed:  # autocast (and Float8Linear) casts the fp32 norm output once per GEMM that reads it
        linear_inputs = _norm_output_casts(work, layout, c) * d.act * h
        mlp = d.act * f * (4 if c.gated_mlp else 2) / t
    else:  # fp32: the linears that read a norm output share it
        linear_inputs = 2 * 4 * h
        mlp = 4 * f * (4 if c.gated_mlp else 2) / t
    attention = d.act * (q + 2 * kv) / t + d.act * q / t  # q, k, v and the output, kept by SDPA
    attention += _attention_core(work, layout, c, d)
    return norms + linear_inputs + attention + mlp + masks


def _selective_layer_bytes(work: Workload, layout: Layout, c: GPTConfig) -> float:
    """What a block under selective recompute keeps (gptrain.parallel.activation_checkpoint): its
    fp32 input and the outputs of its GEMMs (q, k, v before any repeat for GQA; the attention's
    output projection; the up projection(s); the down projection); everything else is recomputed
    from them. Under TP also the outputs of the collectives, which are saved rather than run again
    (each row-parallel output reduced; under sequence parallelism each gathered norm output).
    Measured on CPU in eager mode (tests/plan/test_plan_recompute.py); the TP terms and a compiled
    block are not measured."""
    d, t = _dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    seq_shard = t if layout.sequence_parallel else 1
    q, kv = c.num_attention_heads * c.head_dim, c.query_groups * c.head_dim
    gemms = d.act * ((q + 2 * kv) / t + h + f / t * (2 if c.gated_mlp else 1) + h)
    collectives = 0.0
    if t > 1:
        collectives = 2 * d.act * h / seq_shard + (2 * d.act * h if layout.sequence_parallel else 0)
    return 4 * h / seq_shard + gemms + collectives


def _norm_output_casts(work: Workload, layout: Layout, c: GPTConfig) -> int:
    """Eager casts of the two norm outputs: one per linear that reads them (q, k, v; w1 and w3 when
    gated), where gptrain.models.gpt.fused_linears runs a group as one GEMM, one per group. It
    fuses plain linears with fp32 weights: not under TP or PP, not FP8 ones, not FSDP's bf16 gather."""
    q, _ = _attention_widths(c)
    kv = c.query_groups * c.head_dim
    fsdp_bf16 = layout.sharding != "ddp" and layout.dp > 1 and "bf16" in str(work.precision).lower()
    plain = layout.tp == 1 and layout.pp == 1 and not fsdp_bf16  # gpt.separate_projections under PP
    qkv_fused = plain and not (fp8_linear(work, c.hidden_size, q) or fp8_linear(work, c.hidden_size, kv))
    mlp_fused = plain and c.gated_mlp and not fp8_linear(work, c.hidden_size, c.ffn_size)
    return (1 if qkv_fused else 3) + (1 if mlp_fused or not c.gated_mlp else 2)


def _attention_widths(c: GPTConfig) -> tuple[int, int]:
    """Widths of q and of k/v as SDPA sees them (GQA's k/v after repeat_interleave: q-sized)."""
    q = c.num_attention_heads * c.head_dim
    return q, q if c.query_groups != c.num_attention_heads else c.query_groups * c.head_dim


def _compiled_layer_bytes(work: Workload, layout: Layout, c: GPTConfig) -> float:
    """What the min-cut partitioner of AOTAutograd (inductor's) saves from a compiled block.

    Matmul and attention outputs cannot be recomputed; a cast or pointwise result that only a
    matmul reads in the backward is saved rather than recomputed (it would be materialised
    anyway), once per tensor (the graph shares the cast of a norm output among q, k and v);
    everything else is recomputed from those. Float8Linear's casts are recomputed from the
    high-precision tensors, so an FP8 linear's input is not kept (tests/plan checks all this
    on CPU against the partitioner itself).
    """
    d, t = _dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    q, kv = _attention_widths(c)
    seq_shard = t if layout.sequence_parallel else 1
    # both norms: their fp32 input (x-hat for LayerNorm, whose mean is folded in) and 1/rms
    norms = 2 * (4 * h + 4) / seq_shard
    # a norm's 16-bit output is kept for the linears that read it, unless they run in FP8
    kv_width = c.query_groups * c.head_dim
    qkv_fp8 = fp8_linear(work, h, q // t) and fp8_linear(work, h, kv_width // t)
    mlp_fp8 = fp8_linear(work, h, f // t)
    norm_outputs = d.act * h * ((0 if qkv_fp8 else 1) + (0 if mlp_fp8 else 1))
    attention = d.act * (q + 2 * kv) / t + d.act * q / t + _attention_core(work, layout, c, d)
    # the up projection(s) keep their outputs; the activation's output feeds w2
    mlp = d.act * f / t * ((2 if c.gated_mlp else 1) + (0 if fp8_linear(work, f // t, h) else 1))
    masks = 2 * h / seq_shard if c.hidden_dropout > 0 else 0  # bool masks, from inductor's RNG
    return norms + norm_outputs + attention + mlp + masks


def _attention_core(work: Workload, layout: Layout, c: GPTConfig, d: _Dtypes) -> float:
    """Per token, beyond q, k, v and the output: flash keeps the log-sum-exp, the math path s x s
    probabilities (and a dropout mask and result)."""
    heads, t = c.num_attention_heads, layout.tp
    if work.flash_attention:
        return 4.0 * heads / t
    # math path: softmax output, and with dropout its mask and result; no statistics, and its
    # output is not kept (the transposed copy `wo` keeps stands in for it)
    per_score = d.act + ((_mask_bytes(work, d.act) + d.act) if c.attention_dropout > 0 else 0)
    return heads / t * c.seq_length * per_score


def embedding_bytes_per_token(work: Workload, layout: Layout, config: GPTConfig, scope: str = EAGER) -> float:
    """The embedding keeps only its dropout mask (token ids are the batch itself)."""
    seq_shard = layout.tp if layout.sequence_parallel else 1
    if config.hidden_dropout <= 0:
        return 0.0
    if scope == WHOLE:  # compiled with the model: a bool mask
        return config.hidden_size / seq_shard
    return config.hidden_size * _mask_bytes(work, 4) / seq_shard  # the embedding output is fp32


def head_bytes_per_token(work: Workload, layout: Layout, config: GPTConfig, scope: str = EAGER) -> float:
    """Final norm (input + stats) and the output layer's input, per token."""
    seq_shard = layout.tp if layout.sequence_parallel else 1
    stats = 4 if scope == WHOLE or config.normalization != "layernorm" else 8
    return (4 * config.hidden_size + stats) / seq_shard + _dtypes(work).act * config.hidden_size


def logits_bytes_per_token(
    layout: Layout, config: GPTConfig, work: Workload | None = None, scope: str = EAGER
) -> float:
    """Peak of the loss per token, vocabulary-parallel over TP.

    Eager loss (also under TP/PP): the backward of log_softmax holds its saved fp32 output, the
    incoming fp32 gradient and its own fp32 result, 12 bytes per vocabulary entry. Compiled with
    the model ('whole'): the 16-bit logits are saved (the fp32 upcast and softmax are recomputed
    in one kernel) and their gradient is written into that same, donated buffer; plus the
    log-sum-exp and max (8 bytes). Compiled on its own ('blocks+loss'): the logits are an input
    of the loss graph, which cannot be donated: the logits and their 16-bit gradient.
    """
    v = config.vocab_size / layout.tp
    act = _dtypes(work).act if work is not None else 2
    if scope == WHOLE:
        return act * v + 8.0
    if scope == BLOCKS_AND_LOSS:
        return 2.0 * act * v
    return 12.0 * v


def runs_gpipe(layout: Layout, microbatches: int) -> bool:
    """A plain pipeline over fewer micro batches than stages runs torch's ScheduleGPipe
    (gptrain.parallel.pipeline): every forward, and on the last rank every loss, before a backward."""
    return layout.pp > 1 and layout.vpp == 1 and microbatches < layout.pp


def loss_saved_bytes_per_token(
    layout: Layout, config: GPTConfig, work: Workload | None = None, scope: str = EAGER
) -> float:
    """What a pipeline's last rank keeps per token of a micro batch whose loss waits for its
    backward: the eager loss's fp32 log-softmax output and the stage's output (the logits, kept by
    torch's PipelineStage until that backward). A pipeline's loss runs eager; a compiled loss is
    counted at its whole peak, an upper bound."""
    if scope in (WHOLE, BLOCKS_AND_LOSS):
        return logits_bytes_per_token(layout, config, work, scope)
    act = _dtypes(work).act if work is not None else 2
    return (4.0 + act) * config.vocab_size / layout.tp


def waiting_losses(work: Workload, layout: Layout, scope: str) -> float:
    """On the last rank of a GPipe step, the losses of the other m - 1 micro batches, which wait
    for their backward while the first one runs its own (and rebuilds its checkpointed blocks)."""
    m = layout.microbatches(work.global_batch_size)
    if not runs_gpipe(layout, m):
        return 0.0
    c = work.padded(layout.tp)
    return (
        (m - 1) * loss_saved_bytes_per_token(layout, c, work, scope) * layout.micro_batch_size * c.seq_length
    )


def in_flight(layout: Layout, microbatches: int, rank: int) -> float:
    """Micro batches whose activations pipeline rank `rank` holds at its peak, in units of
    (layers per rank): 1F1B keeps pp - rank (GPipe, over m < pp micro batches, all m); interleaved
    keeps the warmup count of chunks, (v - 1) g + 2 (pp - 1 - rank) + 1, each 1/v of the rank's
    layers, where g, the micro batches a round takes through the chunks, is pp (Megatron's) when pp
    divides them, more when not (torch's schedule: gptrain.parallel.layout.interleaved_rounds)."""
    pp, v = layout.pp, layout.vpp
    if pp == 1:
        return 1.0
    if v == 1:
        return float(microbatches if runs_gpipe(layout, microbatches) else pp - rank)
    per_round = microbatches // interleaved_rounds(microbatches, pp)
    chunks = min((v - 1) * per_round + 2 * (pp - 1 - rank) + 1, microbatches * v)
    return chunks / v


def chunks_in_flight(layout: Layout, microbatches: int, rank: int, costs: list[float]) -> list[int]:
    """Forwards of each of pipeline rank `rank`'s chunks whose backward has not run, at the peak of
    their summed `costs` (one per chunk), in the order of torch's ScheduleInterleaved1F1B: a warmup
    of W = min((v - 1) g + 2 (pp - 1 - rank), m v) forwards, chunk (j // g) mod v for the j-th,
    then 1F1B steps of a forward and then a backward, chunk v - 1 - ((j - W) // g) mod v. Chunks of
    unequal cost (a standalone embedding or loss stage) peak elsewhere than after the warmup. The
    held set repeats every g v steps (each step adds and removes a whole cycle's worth), so one
    cycle of steps gives the peak of any micro-batch count."""
    v, pp = layout.vpp, layout.pp
    per_round = microbatches // interleaved_rounds(microbatches, pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), microbatches * v)
    steady = microbatches * v - warmup
    held = [0] * v
    for step in range(warmup):
        held[(step // per_round) % v] += 1
    peak = list(held)
    for step in range(warmup, warmup + min(steady, per_round * v)):
        held[(step // per_round) % v] += 1
        if _held_cost(held, costs) > _held_cost(peak, costs):
            peak = list(held)
        held[v - 1 - ((step - warmup) // per_round) % v] -= 1
    return peak


def _held_cost(held: list[int] | list[float], costs: list[float]) -> float:
    return sum(count * cost for count, cost in zip(held, costs, strict=True))


def held_chunks(layout: Layout, microbatches: int, rank: int, costs: list[float]) -> list[float]:
    """Micro batches of each of the rank's chunks held at its peak: interleaved, counted in torch's
    order (chunks_in_flight); one chunk otherwise, `in_flight` of them."""
    if layout.vpp == 1:
        return [in_flight(layout, microbatches, rank)]
    return [float(count) for count in chunks_in_flight(layout, microbatches, rank, costs)]


def rank_chunks(layout: Layout, num_layers: int, rank: int) -> list[int]:
    """Layers of each chunk of pipeline rank `rank`, in its local order (stages rank, rank + pp, ...)."""
    return layout.stage_layers(num_layers)[rank :: layout.pp]


def checkpointed_blocks(layout: Layout, chunk: int) -> int:
    """Blocks of a chunk of `chunk` layers that full recompute wraps (gptrain.parallel.activation_checkpoint:
    all of them, or with method block its first N)."""
    if layout.recompute != "full":
        return 0
    return chunk if layout.recompute_num_layers is None else min(chunk, layout.recompute_num_layers)


def activation_bytes(work: Workload, layout: Layout, rank: int, scope: str | None = None) -> dict[str, float]:
    """Activations saved on pipeline rank `rank` at the start of its backward, by part."""
    c = work.padded(layout.tp)
    tokens = layout.micro_batch_size * c.seq_length
    m = layout.microbatches(work.global_batch_size)
    scope = scope or compile_scope(work, layout)
    per_layer = layer_bytes_per_token(work, layout, c, scope) * tokens
    seq_shard = layout.tp if layout.sequence_parallel else 1
    block_input = 4 * c.hidden_size / seq_shard * tokens  # what a checkpointed block keeps (fp32 residual)
    chunks = rank_chunks(layout, c.num_layers, rank)
    wrapped = [checkpointed_blocks(layout, chunk) for chunk in chunks]
    blocks = [n * block_input + (chunk - n) * per_layer for chunk, n in zip(chunks, wrapped, strict=True)]
    # every chunk's output (fp32 residual stream), which torch's PipelineStage keeps until its
    # gradient returns; the model's last stage's is the logits, counted with the loss
    outputs = [block_input if layout.pp > 1 else 0.0] * layout.vpp
    if rank == layout.pp - 1:
        outputs[-1] = 0.0
    embedding = [0.0] * layout.vpp
    if rank == 0:
        embedding[0] = embedding_bytes_per_token(work, layout, c, scope) * tokens
    costs = [sum(chunk) for chunk in zip(blocks, outputs, embedding, strict=True)]
    held = held_chunks(layout, m, rank, costs)
    parts = {"blocks": _held_cost(held, blocks)}
    if rank == 0:
        parts["embedding"] = _held_cost(held, embedding)
    if rank == layout.pp - 1:  # GPipe: every micro batch's head waits for its backward
        heads = m if runs_gpipe(layout, m) else 1
        parts["head"] = heads * head_bytes_per_token(work, layout, c, scope) * tokens
    if any(outputs):
        parts["stage_outputs"] = _held_cost(held, outputs)
    return parts


def rebuild_bytes(work: Workload, layout: Layout, rank: int, scope: str | None = None) -> float:
    """Activations live while the backward rebuilds the first checkpointed block of a micro batch's
    chunk, at the largest over the rank's chunks (full recompute; 0 without a checkpointed block).

    By then the micro batch's head saved tensors and loss are freed (GPipe's others wait), and so
    are the saved tensors of the chunk's blocks after the checkpointed ones (method block): least
    in the chunk with the fewest such blocks, which may hold fewer layers than the others (a
    standalone embedding or loss stage holds none). The rebuilt block keeps what an uncheckpointed
    one keeps, less its input (the stored one), while its backward holds the incoming fp32
    residual gradient and the gradient of the down projection's input."""
    c = work.padded(layout.tp)
    rebuilt = [
        chunk for chunk in rank_chunks(layout, c.num_layers, rank) if checkpointed_blocks(layout, chunk)
    ]
    if not rebuilt:
        return 0.0
    after_checkpointed = min(chunk - checkpointed_blocks(layout, chunk) for chunk in rebuilt)
    tokens = layout.micro_batch_size * c.seq_length
    scope = scope or compile_scope(work, layout)
    parts = activation_bytes(work, layout, rank, scope)
    per_layer = layer_bytes_per_token(work, layout, c, scope) * tokens
    seq_shard = layout.tp if layout.sequence_parallel else 1
    block_input = 4 * c.hidden_size / seq_shard * tokens
    freed = after_checkpointed * per_layer
    gradients = block_input + _dtypes(work).act * c.ffn_size / layout.tp * tokens
    head_of_one = head_bytes_per_token(work, layout, c, scope) * tokens if "head" in parts else 0.0
    stored = sum(parts.values()) - head_of_one - freed
    if rank == layout.pp - 1:
        stored += waiting_losses(work, layout, scope)
    return stored + per_layer - block_input + gradients


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


def _matmul_weights(work: Workload, config: GPTConfig, layout: Layout, rank: int) -> int:
    """Linear weights on this rank whose 16-bit copies (autocast's casts) are saved for the
    backward, eager or compiled (biases and norms are cast too but not kept; embedding lookups
    are not cast). Float8Linear saves the fp32 parameter itself and recasts it."""
    h, t = config.hidden_size, layout.tp
    shapes = _block_linear_shapes(config, t)
    block = sum(i * o for i, o in shapes if not fp8_linear(work, i, o))
    total = layout.rank_layers(config.num_layers)[rank] * block
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
        logits += _dtypes(work).act * c.vocab_size / layout.tp * c.hidden_size
    logits += waiting_losses(work, layout, scope)
    transient = _transient(work, layout, c, rank, params)
    rebuild = rebuild_bytes(work, layout, rank, scope)
    if rebuild:
        rebuild += transient - _copies_freed_before_rebuild(work, layout, c, rank)
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


def _transient(work: Workload, layout: Layout, c: GPTConfig, rank: int, params: int) -> float:
    """Copies that live through a forward/backward besides the persistent state."""
    act = _dtypes(work).act
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
    copies = 2 * _matmul_weights(work, c, layout, rank) if work.mixed else 0.0
    if layout.sharding == "ddp" and layout.dp > 1 and layout.tp == 1 and layout.pp == 1:
        copies += GRAD_BYTES * params  # torch DDP's gradient buckets (not views of .grad)
    return copies


def _copies_freed_before_rebuild(work: Workload, layout: Layout, c: GPTConfig, rank: int) -> float:
    """Autocast's 16-bit weight copies (in `_transient`) that are not live while a checkpointed
    block is rebuilt: autocast's cache holds every copy until the forward's autocast region ends,
    but a checkpointed block saves none of its own, and the output layer's is freed with the head;
    the rebuilt block casts its weights again."""
    if not work.mixed or (_sharded(layout) and work.bf16):  # no copies; FSDP bf16 gathers in bf16 already
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
