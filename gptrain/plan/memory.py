"""Memory per GPU of a layout: weights, gradients, optimizer state, activations, logits.

The activation model is an inventory of the tensors gptrain's blocks save for the backward
(docs/planning.md lists it with Korthikanti et al. 2022's Table 2 for comparison); tests/plan
measures the same inventory with saved-tensor hooks on CPU. Everything is in bytes and per rank;
the estimate of a layout is that of its fullest pipeline rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gptrain.models.config import GPTConfig
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
    parts: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        """Peak: the state, plus the larger of the start of a backward (activations, the loss and
        working copies, with gradients when they accumulate) and its end (all gradients)."""
        live_grads = self.gradients if self.accumulating else 0.0
        backward_start = self.activations + self.logits + self.transient + live_grads
        return self.weights + self.optimizer + max(backward_start, self.gradients + self.transient)

    def gib(self) -> dict[str, float]:
        out = {k: round(getattr(self, k) / GIB, 3) for k in ("weights", "gradients", "optimizer")}
        out |= {k: round(getattr(self, k) / GIB, 3) for k in ("activations", "logits", "transient")}
        return out | {"total": round(self.total / GIB, 3), "pipeline_rank": self.pipeline_rank}


@dataclass(frozen=True)
class _Dtypes:
    act: int  # bytes of a matmul input/output (2 under 16-bit autocast, else 4)
    mixed: bool


def _dtypes(work: Workload) -> _Dtypes:
    return _Dtypes(act=2 if work.mixed else 4, mixed=work.mixed)


def _mask_bytes(work: Workload, input_bytes: int) -> int:
    """A dropout mask: bools from CUDA's fused kernel; the scaled noise itself on CPU."""
    return 1 if work.device_type == "cuda" else input_bytes


def layer_bytes_per_token(work: Workload, layout: Layout, config: GPTConfig | None = None) -> float:
    """Bytes one transformer block saves for its backward, per token of a micro batch, on one TP rank."""
    c = config or work.padded(layout.tp)
    d, t = _dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    q = c.num_attention_heads * c.head_dim
    kv = q if c.query_groups != c.num_attention_heads else c.query_groups * c.head_dim  # repeat_interleave
    seq_shard = t if layout.sequence_parallel else 1
    stats = 8 if c.normalization == "layernorm" else 4  # mean + rstd (fp32) or rstd
    norms = 2 * (4 * h + stats) / seq_shard  # norms run in fp32 (autocast policy) and keep their input
    masks = (
        2 * h * _mask_bytes(work, d.act) / seq_shard if c.hidden_dropout > 0 else 0
    )  # after attention, MLP
    mlp_inputs = 2 if c.gated_mlp else 1
    if work.compile:  # inductor: one cast per norm output, pointwise ops recomputed, no dropout masks
        linear_inputs = 2 * d.act * h
        mlp = d.act * f * (2 if c.gated_mlp else 1) / t
        masks = 0
    elif d.mixed:  # autocast casts the fp32 norm output once per linear that reads it
        linear_inputs = (3 + mlp_inputs) * d.act * h
        mlp = d.act * f * (4 if c.gated_mlp else 2) / t
    else:  # fp32: the linears that read a norm output share it
        linear_inputs = 2 * 4 * h
        mlp = 4 * f * (4 if c.gated_mlp else 2) / t
    attention = d.act * (q + 2 * kv) / t + d.act * q / t  # q, k, v and the output, kept by SDPA
    attention += _attention_core(work, layout, c, d)
    return norms + linear_inputs + attention + mlp + masks


def _attention_core(work: Workload, layout: Layout, c: GPTConfig, d: _Dtypes) -> float:
    """Per token, beyond q, k, v and the output: flash keeps the log-sum-exp, the math path s x s
    probabilities (and a dropout mask and result)."""
    heads, t = c.num_attention_heads, layout.tp
    if layout.recompute == "selective":  # SDPA recomputed: its output and statistics are not kept
        return -d.act * c.num_attention_heads * c.head_dim / t
    if work.flash_attention:
        return 4.0 * heads / t
    # math path: softmax output, and with dropout its mask and result; no statistics, and its
    # output is not kept (the transposed copy `wo` keeps stands in for it)
    per_score = d.act + ((_mask_bytes(work, d.act) + d.act) if c.attention_dropout > 0 else 0)
    return heads / t * c.seq_length * per_score


def embedding_bytes_per_token(work: Workload, layout: Layout, config: GPTConfig) -> float:
    """The embedding keeps only its dropout mask (token ids are the batch itself)."""
    seq_shard = layout.tp if layout.sequence_parallel else 1
    if config.hidden_dropout <= 0 or work.compile:
        return 0.0
    return config.hidden_size * _mask_bytes(work, 4) / seq_shard  # the embedding output is fp32


def head_bytes_per_token(work: Workload, layout: Layout, config: GPTConfig) -> float:
    """Final norm (input + stats) and the output layer's input, per token."""
    seq_shard = layout.tp if layout.sequence_parallel else 1
    stats = 8 if config.normalization == "layernorm" else 4
    return (4 * config.hidden_size + stats) / seq_shard + _dtypes(work).act * config.hidden_size


def logits_bytes_per_token(layout: Layout, config: GPTConfig) -> float:
    """Peak of the loss: the backward of log_softmax holds its saved fp32 output, the incoming fp32
    gradient and its own fp32 result, 12 bytes per vocabulary entry (vocabulary-parallel over TP)."""
    return 12.0 * config.vocab_size / layout.tp


def in_flight(layout: Layout, microbatches: int, rank: int) -> float:
    """Micro batches whose activations pipeline rank `rank` holds at its peak, in units of
    (layers per rank): 1F1B keeps pp - rank; interleaved keeps Megatron's warmup count of
    chunks, (v - 1) pp + 2 (pp - 1 - rank) + 1, each 1/v of the rank's layers."""
    pp, v = layout.pp, layout.vpp
    if pp == 1:
        return 1.0
    if v == 1:
        return float(min(pp - rank, microbatches))
    chunks = min((v - 1) * pp + 2 * (pp - 1 - rank) + 1, microbatches * v)
    return chunks / v


def activation_bytes(work: Workload, layout: Layout, rank: int) -> dict[str, float]:
    """Activations saved on pipeline rank `rank` at its peak, by part."""
    c = work.padded(layout.tp)
    tokens = layout.micro_batch_size * c.seq_length
    m = layout.microbatches(work.global_batch_size)
    layers = c.num_layers // layout.pp
    flight = in_flight(layout, m, rank)
    per_layer = layer_bytes_per_token(work, layout, c) * tokens
    seq_shard = layout.tp if layout.sequence_parallel else 1
    block_input = 4 * c.hidden_size / seq_shard * tokens  # what a fully checkpointed block keeps
    if layout.recompute == "full":
        checkpointed = (
            layers
            if layout.recompute_num_layers is None
            else min(layers, layout.recompute_num_layers * layout.vpp)
        )
        blocks = flight * (checkpointed * block_input + (layers - checkpointed) * per_layer) + per_layer
    else:
        blocks = flight * layers * per_layer
    parts = {"blocks": blocks}
    if rank == 0:
        parts["embedding"] = min(layout.pp, m) * embedding_bytes_per_token(work, layout, c) * tokens
    if rank == layout.pp - 1:
        parts["head"] = head_bytes_per_token(work, layout, c) * tokens
    if layout.pp > 1 and rank != layout.pp - 1:  # stage outputs kept until their gradient returns
        parts["stage_outputs"] = flight * 4 * c.hidden_size / seq_shard * tokens
    return parts


def _matmul_weights(config: GPTConfig, layout: Layout, rank: int) -> int:
    """Linear weights on this rank: autocast's 16-bit copies of them are saved for the backward
    (biases and norms are cast too but not kept; embedding lookups are not cast)."""
    h, f, t = config.hidden_size, config.ffn_size, layout.tp
    q = config.num_attention_heads * config.head_dim
    kv = config.query_groups * config.head_dim
    block = (h * (q + 2 * kv) + q * h + (3 if config.gated_mlp else 2) * h * f) // t
    total = config.num_layers // layout.pp * block
    if rank == layout.pp - 1:
        total += config.vocab_size // t * h  # the output layer (the tied embedding, cast for the matmul)
    return total


def estimate_memory(work: Workload, layout: Layout) -> MemoryEstimate:
    """The fullest pipeline rank's peak (the largest total over ranks)."""
    return max((estimate_rank(work, layout, r) for r in range(layout.pp)), key=lambda e: e.total)


def estimate_rank(work: Workload, layout: Layout, rank: int) -> MemoryEstimate:
    c = work.padded(layout.tp)
    params = rank_parameters(c, layout.tp, layout.pp)[rank]
    shard = layout.dp_shard if layout.sharding != "ddp" and layout.dp > 1 else 1
    acts = activation_bytes(work, layout, rank)
    logits = logits_bytes_per_token(layout, c) * layout.micro_batch_size * c.seq_length
    return MemoryEstimate(
        weights=WEIGHT_BYTES * params / shard,
        gradients=GRAD_BYTES * params / shard,
        optimizer=ADAM_BYTES * params / shard,
        activations=sum(acts.values()),
        logits=logits if rank == layout.pp - 1 else 0.0,
        transient=_transient(work, layout, c, rank, params, shard),
        accumulating=layout.microbatches(work.global_batch_size) > 1 or layout.pp > 1,
        pipeline_rank=rank,
        parts=acts,
    )


def _transient(work: Workload, layout: Layout, c: GPTConfig, rank: int, params: int, shard: int) -> float:
    """Copies that live through a forward/backward besides the persistent state."""
    act = _dtypes(work).act
    if shard > 1:  # FSDP2: blocks all-gathered one ahead (2 unsharded), the root stays gathered
        block = rank_parameters(c, layout.tp, layout.pp)[rank] - _root_parameters(c, layout, rank)
        per_block = block / max(1, c.num_layers // layout.pp)
        root = _root_parameters(c, layout, rank)
        return act * (2 * per_block + root) + (act + 4) * max(per_block, root)
    copies = 2 * _matmul_weights(c, layout, rank) if work.mixed else 0.0
    if layout.sharding == "ddp" and layout.dp > 1 and layout.tp == 1 and layout.pp == 1:
        copies += GRAD_BYTES * params  # torch DDP's gradient buckets (not views of .grad)
    return copies


def _root_parameters(c: GPTConfig, layout: Layout, rank: int) -> int:
    h = c.hidden_size
    root = 0
    if rank == 0:
        root += c.vocab_size // layout.tp * h
        root += c.seq_length * h if c.position_embedding_type == "learned_absolute" else 0
    if rank == layout.pp - 1:
        root += h * (2 if c.normalization == "layernorm" else 1)
        if not c.share_embeddings_and_output_weights or layout.pp > 1:
            root += c.vocab_size // layout.tp * h
    return root


def fits(estimate: MemoryEstimate, memory_gib: float, headroom: float) -> bool:
    """Within (1 - headroom) of the device: the allocator's fragmentation and the CUDA context."""
    return estimate.total <= memory_gib * GIB * (1.0 - headroom)
