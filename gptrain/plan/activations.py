"""What one token of a micro batch keeps for the backward: in a block, the embedding, the head, the loss."""

from __future__ import annotations

from dataclasses import dataclass

from gptrain.models.config import GPTConfig
from gptrain.parallel.layout import BLOCKS_AND_LOSS, WHOLE
from gptrain.parallel.layout import compile_scope as parallel_compile_scope
from gptrain.parallel.mesh import ParallelDims
from gptrain.plan.spec import Layout, Workload

EAGER = "eager"


@dataclass(frozen=True)
class _Dtypes:
    act: int  # bytes of a matmul input/output (2 under 16-bit autocast, else 4)
    mixed: bool


def dtypes(work: Workload) -> _Dtypes:
    return _Dtypes(act=2 if work.mixed else 4, mixed=work.mixed)


def fsdp_bf16(work: Workload, layout: Layout) -> bool:
    """FSDP2 with bf16 (gptrain.parallel.data_parallel.mixed_precision_policy): every parameter is
    gathered in bf16, the embedding's among them."""
    return layout.sharding != "ddp" and layout.dp > 1 and work.bf16


def residual_bytes(work: Workload, layout: Layout) -> int:
    """Bytes of a value of the residual stream (the embedding's output, every block's input and
    output): fp32 from the fp32 embedding, whatever autocast does to the matmuls; bf16 under FSDP
    with bf16, whose embedding is gathered in bf16 (a norm then keeps its own fp32 cast of it,
    autocast's fp32 policy on CUDA). Measured in tests/plan/test_plan_recompute.py."""
    return 2 if fsdp_bf16(work, layout) else 4


def norm_bytes(work: Workload, layout: Layout) -> int:
    """Bytes of a value a norm outputs, and a LayerNorm saves (its input, mean and rstd): fp32, from
    the fp32 stream or, under FSDP with bf16, from autocast's cast on CUDA, whose policy runs
    layer_norm and rms_norm in fp32 (AT_FORALL_FP32 in ATen's autocast_mode.h). CPU's autocast
    leaves them alone: there a bf16 stream is normalised in bf16 by LayerNorm (RMSNorm: see
    `_cpu_rms_norm`), and the bf16 output feeds every linear uncast."""
    return 2 if fsdp_bf16(work, layout) and work.device_type == "cpu" else 4


def _cpu_rms_norm(work: Workload, c: GPTConfig) -> bool:
    """An eager RMSNorm on CPU runs torch.rms_norm's composite (no fused kernel there): it casts
    its input up to fp32 and saves that, the fp32 rstd and the fp32 normalised product, 8h + 4
    bytes a token whatever the stream's dtype (tests/plan/test_plan_recompute.py)."""
    return c.normalization == "rmsnorm" and work.device_type == "cpu"


def norm_input_bytes(work: Workload, layout: Layout, c: GPTConfig) -> int:
    """Bytes of a value of the input an eager norm saves: the stream itself where this equals
    `residual_bytes`, else a copy of its own."""
    return 4 if _cpu_rms_norm(work, c) else norm_bytes(work, layout)


def _norm_saved_bytes(work: Workload, layout: Layout, c: GPTConfig, eager: bool) -> float:
    """One norm's saved input and statistics (rstd; LayerNorm's mean too where it runs eager, a
    compiled one folds it in), per token."""
    if eager and _cpu_rms_norm(work, c):
        return 8 * c.hidden_size + 4
    n = norm_bytes(work, layout)
    return n * c.hidden_size + n * (2 if eager and c.normalization == "layernorm" else 1)


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
        return _compiled_layer_bytes(work, layout, c, scope)
    d, t = dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    q, kv = _attention_widths(c)
    seq_shard = t if layout.sequence_parallel else 1
    norms = 2 * _norm_saved_bytes(work, layout, c, eager=True) / seq_shard  # each keeps its input
    masks = (
        2 * h * _mask_bytes(work, d.act) / seq_shard if c.hidden_dropout > 0 else 0
    )  # after attention, MLP
    if norm_bytes(work, layout) == 2:  # bf16 norm outputs, read by their linears as they are
        linear_inputs = 2 * 2 * h
    elif d.mixed:  # autocast (and Float8Linear) casts the fp32 norm output once per GEMM that reads it
        linear_inputs = _norm_output_casts(work, layout, c) * d.act * h
    else:  # fp32: the linears that read a norm output share it
        linear_inputs = 2 * 4 * h
    mlp = d.act * f * (4 if c.gated_mlp else 2) / t  # the up projection(s)' outputs, the activation's
    attention = d.act * (q + 2 * kv) / t + d.act * q / t  # q, k, v and the output, kept by SDPA
    attention += _attention_core(work, layout, c, d)
    return norms + linear_inputs + attention + mlp + masks


def _selective_layer_bytes(work: Workload, layout: Layout, c: GPTConfig) -> float:
    """What a block under selective recompute keeps (gptrain.parallel.activation_checkpoint): its
    input (`residual_bytes`) and the outputs of its GEMMs (q, k, v before any repeat for GQA; the attention's
    output projection; the up projection(s); the down projection); everything else is recomputed
    from them. Under TP also the outputs of the reductions, which are saved rather than run again
    (each row-parallel output reduced); under sequence parallelism the norm outputs are gathered
    again in the backward, not kept (review E2: kept, selective kept more than no recompute).
    Measured on CPU in eager mode (tests/plan/test_plan_recompute.py); the TP terms and a compiled
    block are not measured."""
    d, t = dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    seq_shard = t if layout.sequence_parallel else 1
    q, kv = c.num_attention_heads * c.head_dim, c.query_groups * c.head_dim
    gemms = d.act * ((q + 2 * kv) / t + h + f / t * (2 if c.gated_mlp else 1) + h)
    collectives = 0.0
    if t > 1:
        collectives = 2 * d.act * h / seq_shard
    return residual_bytes(work, layout) * h / seq_shard + gemms + collectives


def _norm_output_casts(work: Workload, layout: Layout, c: GPTConfig) -> int:
    """Eager casts of the two norm outputs: one per linear that reads them (q, k, v; w1 and w3 when
    gated), where gptrain.models.gpt.fused_linears runs a group as one GEMM, one per group. It
    fuses plain linears with fp32 weights: not under TP or PP, not FP8 ones, not FSDP's bf16 gather.
    Under TP a sublayer casts its input once, before gathering it
    (gptrain.parallel.tensor_parallel.cast_to_autocast_dtype), and its column linears share that
    copy: one per sublayer, unless all its column linears are FP8 (torchao gathers the input in
    float8 then; counted per linear as before, not measured). Measured on 2 CPU ranks against the
    saved tensors (tests/plan/test_plan_tp_saved.py)."""
    q, _ = _attention_widths(c)
    kv = c.query_groups * c.head_dim
    h, t = c.hidden_size, layout.tp
    if t > 1:
        qkv_fp8 = fp8_linear(work, h, q // t) and fp8_linear(work, h, kv // t)
        mlp_fp8 = fp8_linear(work, h, c.ffn_size // t)
        mlp_linears = 2 if c.gated_mlp else 1
        return (3 if qkv_fp8 else 1) + (mlp_linears if mlp_fp8 else 1)
    plain = layout.pp == 1 and not fsdp_bf16(work, layout)  # separate_projections under PP
    qkv_fused = plain and not (fp8_linear(work, h, q) or fp8_linear(work, h, kv))
    mlp_fused = plain and c.gated_mlp and not fp8_linear(work, h, c.ffn_size)
    return (1 if qkv_fused else 3) + (1 if mlp_fused or not c.gated_mlp else 2)


def _attention_widths(c: GPTConfig) -> tuple[int, int]:
    """Widths of q and of k/v as SDPA sees them (GQA's k/v after repeat_interleave: q-sized)."""
    q = c.num_attention_heads * c.head_dim
    return q, q if c.query_groups != c.num_attention_heads else c.query_groups * c.head_dim


def _compiled_layer_bytes(work: Workload, layout: Layout, c: GPTConfig, scope: str) -> float:
    """What the min-cut partitioner of AOTAutograd (inductor's) saves from a compiled block.

    Matmul and attention outputs cannot be recomputed; a cast or pointwise result that only a
    matmul reads in the backward is saved rather than recomputed (it would be materialised
    anyway), once per tensor (the graph shares the cast of a norm output among q, k and v);
    everything else is recomputed from those. Float8Linear's casts are recomputed from the
    high-precision tensors, so an FP8 linear's input is not kept (tests/plan checks all this
    on CPU against the partitioner itself).
    """
    d, t = dtypes(work), layout.tp
    h, f = c.hidden_size, c.ffn_size
    q, kv = _attention_widths(c)
    seq_shard = t if layout.sequence_parallel else 1
    if scope == WHOLE:  # both norms: their fp32 input (x-hat for LayerNorm, mean folded in), 1/rms
        norms = 2 * (residual_bytes(work, layout) * h + 4) / seq_shard
    else:
        # compiled on its own, a block keeps its input (a graph input, the stream's dtype) and the
        # 16-bit output projection the second norm's input is recomputed from; each RMSNorm its
        # fp32 1/rms, each LayerNorm its mean and 1/std in the dtype it normalises in (tests/plan)
        stats = 2 * norm_bytes(work, layout) if c.normalization == "layernorm" else 4
        norms = (residual_bytes(work, layout) * h + d.act * h + 2 * stats) / seq_shard
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
    noise = residual_bytes(work, layout)  # on CPU: the scaled noise, in the embedding output's dtype
    return config.hidden_size * _mask_bytes(work, noise) / seq_shard


def head_bytes_per_token(work: Workload, layout: Layout, config: GPTConfig, scope: str = EAGER) -> float:
    """Final norm (input + stats) and the output layer's input, per token."""
    seq_shard = layout.tp if layout.sequence_parallel else 1
    norm = _norm_saved_bytes(work, layout, config, eager=scope != WHOLE)
    return norm / seq_shard + dtypes(work).act * config.hidden_size


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
    act = dtypes(work).act if work is not None else 2
    if scope == WHOLE:
        return act * v + 8.0
    if scope == BLOCKS_AND_LOSS:
        return 2.0 * act * v
    return 12.0 * v


def loss_saved_bytes_per_token(
    layout: Layout, config: GPTConfig, work: Workload | None = None, scope: str = EAGER
) -> float:
    """What a pipeline's last rank keeps per token of a micro batch whose loss waits for its
    backward: the eager loss's fp32 log-softmax output and the stage's output (the logits, kept by
    torch's PipelineStage until that backward). A pipeline's loss runs eager; a compiled loss is
    counted at its whole peak, an upper bound."""
    if scope in (WHOLE, BLOCKS_AND_LOSS):
        return logits_bytes_per_token(layout, config, work, scope)
    act = dtypes(work).act if work is not None else 2
    return (4.0 + act) * config.vocab_size / layout.tp
