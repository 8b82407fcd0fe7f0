"""GPT as a plain PyTorch module, shaped so parallelism can be applied from outside.

Build on the meta device, parallelize, `to_empty(device)`, then `init_weights(generator)`:
`__init__` only creates modules. Names follow torchtitan so TP/PP plans can address them
(`tok_embeddings`, `layers["i"].attention.wq`, `mlp.w1`, `norm`, `output`). Blocks live in a
`ModuleDict` keyed by layer number: a pipeline stage deletes entries (or sets
`tok_embeddings`/`norm`/`output` to None) and every remaining parameter keeps its name.
Attention reshapes with `-1` heads, so a column-sharded local shard of wq/wk/wv just works.
Under autocast, plain linears that read the same input run as one GEMM (see `fused_linears`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptrain.models.config import GPTConfig

try:  # DTensor parameters (after TP/FSDP) are initialised from the same full tensors.
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - torch builds without distributed
    DTensor = None  # type: ignore[assignment,misc]
    distribute_tensor = None  # type: ignore[assignment]

# Fixed piece numbers for per-piece init seeds: a stage that lacks some pieces still gets
# exactly the weights the whole model would have.
_SEED_TOKEN_EMBEDDING, _SEED_POSITION_EMBEDDING, _SEED_OUTPUT, _SEED_FIRST_LAYER = 0, 1, 2, 3


def build_norm(config: GPTConfig) -> nn.Module:
    """The configured normalization over the hidden dimension."""
    if config.normalization == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.layernorm_epsilon)
    return nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)


def rope_tables(
    config: GPTConfig, dtype: torch.dtype, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [seq_length, rotary_dim] in the rotate-half layout (Megatron, HF Llama).

    Computed in float64 and cast, so a float64 model gets float64-accurate tables.
    """
    dim = config.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    inv_freq = 1.0 / (float(config.rotary_base) ** exponents)
    positions = torch.arange(config.seq_length, dtype=torch.float64, device=device)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` dims of each head of x [B, S, H, D].

    cos/sin are [B, S, R] (from position ids) or a [>= S, R] table whose first S rows are used: the
    length comes from x, which under sequence parallelism is gathered while the block input is not.
    """
    if cos.dim() == 2:
        cos, sin = cos[: x.shape[1]], sin[: x.shape[1]]
    rot = cos.shape[-1]
    compute = torch.promote_types(x.dtype, cos.dtype)
    x_rot, x_pass = x[..., :rot].to(compute), x[..., rot:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    first, second = x_rot.chunk(2, dim=-1)
    rotated = x_rot * cos + torch.cat((-second, first), dim=-1) * sin
    return torch.cat((rotated.to(x.dtype), x_pass), dim=-1)


def _is_plain_linear(module: nn.Module) -> bool:
    """An nn.Linear (not a subclass such as torchao's Float8Linear) with ordinary tensors and no hooks
    (tensor parallelism attaches its layouts as hooks and DTensor parameters)."""
    if type(module) is not nn.Linear or module._forward_hooks or module._forward_pre_hooks:
        return False
    return DTensor is None or not any(isinstance(p, DTensor) for p in module.parameters())


def _autocast_copies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether autocast makes a 16-bit copy of `weight` for a linear on `x` (fp32 master weights
    under bf16/fp16 autocast; not FSDP's bf16-gathered parameters, nor an fp32 run)."""
    return weight.dtype == torch.float32 and torch.is_autocast_enabled(x.device.type)


def runs_fused(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> bool:
    """Whether `linears` on x run as one GEMM over their concatenated weights (`concatenated_linears`).

    One wide GEMM keeps the GPU busier than several narrow ones (wq/wk/wv at width 768 are what kept
    the 126m step behind a fused-qkv script), and the input is cast once instead of once per linear.
    The concatenated weight is what the backward keeps, so they are fused only where autocast keeps a
    16-bit copy of each weight anyway; elsewhere (fp32, FSDP's bf16 parameters) it would be a
    weight-sized copy per layer. The weights keep their own names, so checkpoints, TP plans, FP8
    conversion and exports see the same parameters; a linear that is not plain (TP, FP8) runs alone.
    """
    biased = {linear.bias is not None for linear in linears}
    plain = len(biased) == 1 and all(_is_plain_linear(linear) for linear in linears)
    return plain and _autocast_copies(x, linears[0].weight)


def fused_linears(
    x: torch.Tensor, linears: tuple[nn.Linear, ...], allowed: bool = True
) -> tuple[torch.Tensor, ...]:
    """`tuple(linear(x) for linear in linears)`, as one GEMM where allowed and `runs_fused`."""
    if allowed and runs_fused(x, linears):
        return concatenated_linears(x, linears)
    return tuple(linear(x) for linear in linears)


def separate_projections(model: nn.Module) -> None:
    """Run every attention's q/k/v and every MLP's w1/w3 as separate GEMMs.

    For pipeline stages: autocast casts a weight once per autocast region and every micro-batch shares
    that 16-bit copy, but a concatenated weight is no parameter, so each micro-batch between its
    forward and its backward would keep a copy of its own (8 in flight at width 2048: ~2 GB more).
    """
    for module in model.modules():
        if isinstance(module, (Attention, MLP)):
            module.fuse_projections = False


def concatenated_linears(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The outputs of `linears` on x from one GEMM over their concatenated weights (and biases)."""
    weight = torch.cat([linear.weight for linear in linears])
    bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
    widths = [linear.weight.shape[0] for linear in linears]
    return tuple(F.linear(x, weight, bias).split(widths, dim=-1))


class Attention(nn.Module):
    """Causal self-attention with separate q/k/v projections (run as one GEMM) and optional GQA."""

    fuse_projections = True
    """q/k/v as one GEMM where `runs_fused` (see `separate_projections` for where not)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        q_dim = config.num_attention_heads * config.head_dim
        kv_dim = config.query_groups * config.head_dim
        self.head_dim = config.head_dim
        self.dropout_p = config.attention_dropout
        self.wq = nn.Linear(config.hidden_size, q_dim, bias=config.bias)
        self.wk = nn.Linear(config.hidden_size, kv_dim, bias=config.bias)
        self.wv = nn.Linear(config.hidden_size, kv_dim, bias=config.bias)
        self.wo = nn.Linear(q_dim, config.hidden_size, bias=config.bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, seq = x.shape[0], x.shape[1]
        projections = (self.wq, self.wk, self.wv)
        fused = self.fuse_projections and runs_fused(x, projections)
        outputs = concatenated_linears(x, projections) if fused else (p(x) for p in projections)
        # -1 heads: under tensor parallelism these are the local heads of this rank.
        q, k, v = (t.view(batch, seq, -1, self.head_dim) for t in outputs)
        rope = cos is not None and sin is not None
        if rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        repeats = q.shape[1] // k.shape[1]
        if repeats > 1:  # query head j uses key/value head j // repeats, as Megatron groups them
            k = k.repeat_interleave(repeats, dim=1)
            v = v.repeat_interleave(repeats, dim=1)
        if fused and rope != (repeats > 1):
            # One of q, k, v is still a view of the fused output, which SDPA would keep whole for
            # the backward (rotated q and k, or repeated k and v, are copies): copy it out instead.
            q, v = (q, v.clone()) if rope else (q.clone(), v)
        dropout_p = self.dropout_p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """GELU MLP (w1 up, w2 down) or SwiGLU (w1 gate, w3 up, w2 down; w1 and w3 as one GEMM)."""

    fuse_projections = True
    """w1/w3 as one GEMM where `runs_fused` (see `separate_projections`)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gated = config.gated_mlp
        self.gelu_approximation = "tanh" if config.openai_gelu else "none"
        self.w1 = nn.Linear(config.hidden_size, config.ffn_size, bias=config.bias)
        self.w3 = nn.Linear(config.hidden_size, config.ffn_size, bias=config.bias) if self.gated else None
        self.w2 = nn.Linear(config.ffn_size, config.hidden_size, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            gate, up = fused_linears(x, (self.w1, self.w3), self.fuse_projections)
            return self.w2(F.silu(gate) * up)
        return self.w2(F.gelu(self.w1(x), approximate=self.gelu_approximation))


class TransformerBlock(nn.Module):
    """Pre-LN block: x + drop(attn(norm(x))), then h + drop(mlp(norm(h)))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attention_norm = build_norm(config)
        self.attention = Attention(config)
        self.attention_dropout = nn.Dropout(config.hidden_dropout)
        self.mlp_norm = build_norm(config)
        self.mlp = MLP(config)
        self.mlp_dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = x + self.attention_dropout(self.attention(self.attention_norm(x), cos, sin))
        return h + self.mlp_dropout(self.mlp(self.mlp_norm(h)))


class GPT(nn.Module):
    """Decoder-only transformer; forward(tokens) -> logits [B, S, V] (no loss inside)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(config.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = None
        if config.position_embedding_type == "learned_absolute":
            self.pos_embeddings = nn.Embedding(config.position_rows, h)
        self.embedding_dropout: nn.Module | None = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(config) for i in range(config.num_layers)})
        self.norm: nn.Module | None = build_norm(config)
        self.output: nn.Linear | None = nn.Linear(h, config.vocab_size, bias=False)
        if config.share_embeddings_and_output_weights:
            self.output.weight = self.tok_embeddings.weight
        self.freqs_cos: torch.Tensor | None
        self.freqs_sin: torch.Tensor | None
        if config.position_embedding_type == "rope":
            cos, sin = rope_tables(config, torch.get_default_dtype())
            self.register_buffer("freqs_cos", cos, persistent=False)
            self.register_buffer("freqs_sin", sin, persistent=False)
        else:
            self.freqs_cos = self.freqs_sin = None

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, S] (or hidden states [B, S, h] on a stage without embeddings) -> logits [B, S, V].

        position_ids [B, S] or [S] default to 0..S-1; a stage without `output` returns hidden states.
        """
        seq = tokens.shape[1]
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                positions = position_ids if position_ids is not None else torch.arange(seq, device=h.device)
                h = h + self.pos_embeddings(positions)
            if self.embedding_dropout is not None:
                h = self.embedding_dropout(h)
        else:
            h = tokens
        cos, sin = self._rope(position_ids)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def _rope(self, position_ids: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.freqs_cos is None or self.freqs_sin is None:
            return None, None
        if position_ids is None:  # whole tables: attention slices them to its (gathered) length
            return self.freqs_cos, self.freqs_sin
        return self.freqs_cos[position_ids], self.freqs_sin[position_ids]

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Megatron's init: normal(0, std) weights, std/sqrt(2L) on wo and w2, zero biases, unit norms.

        With a generator, one number drawn from it seeds a separate generator per piece
        (embeddings, each layer, output) on that piece's device, and every weight is drawn in
        full: the result does not depend on the parallel layout (DTensor shards are cut from the
        same full tensor) or on which layers a pipeline stage kept, only on the seed and the device
        type (CPU and CUDA generators differ). Without one, `nn.init` draws in place from the
        default RNG (DTensors from their own RNG). Call after `to_empty`; it also re-ties output
        to tok_embeddings (`to_empty` unties them) and recomputes the rope tables.
        """
        config = self.config
        std = config.init_method_std
        base_seed = None
        if generator is not None:
            base_seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))

        def piece_rng(index: int, module: nn.Module) -> torch.Generator | None:
            if base_seed is None:
                return None
            device = next(module.parameters()).device
            if device.type == "meta":
                raise RuntimeError("GPT.init_weights: move the model off the meta device first (to_empty)")
            return torch.Generator(device=device).manual_seed(base_seed + 1_000_003 * index)

        self.tie_weights()
        for index, name in (
            (_SEED_TOKEN_EMBEDDING, "tok_embeddings"),
            (_SEED_POSITION_EMBEDDING, "pos_embeddings"),
        ):
            module = getattr(self, name)
            if module is not None:
                _normal_(module.weight, std, piece_rng(index, module))
        if self.output is not None and not self._tied():
            _normal_(self.output.weight, std, piece_rng(_SEED_OUTPUT, self.output))
        out_std = std / math.sqrt(2 * config.num_layers) if config.apply_residual_scaling_init else std
        for name, layer in self.layers.items():
            _init_block(layer, std, out_std, piece_rng(_SEED_FIRST_LAYER + int(name), layer))
        if self.norm is not None:
            _init_norm(self.norm)
        self._reset_rope()

    def tie_weights(self) -> None:
        """Make output.weight the same Parameter as tok_embeddings.weight when configured and both exist."""
        if (
            self.config.share_embeddings_and_output_weights
            and self.tok_embeddings is not None
            and self.output is not None
            and self.output.weight is not self.tok_embeddings.weight
        ):
            self.output.weight = self.tok_embeddings.weight

    def _tied(self) -> bool:
        return (
            self.tok_embeddings is not None
            and self.output is not None
            and self.output.weight is self.tok_embeddings.weight
        )

    def _reset_rope(self) -> None:
        if self.freqs_cos is None or self.freqs_sin is None:
            return
        cos, sin = rope_tables(self.config, self.freqs_cos.dtype, self.freqs_cos.device)
        self.freqs_cos.copy_(cos)
        self.freqs_sin.copy_(sin)


def _init_block(block: TransformerBlock, std: float, out_std: float, rng: torch.Generator | None) -> None:
    attention, mlp = block.attention, block.mlp
    linears = [(attention.wq, std), (attention.wk, std), (attention.wv, std), (attention.wo, out_std)]
    linears += [(mlp.w1, std)] + ([(mlp.w3, std)] if mlp.w3 is not None else []) + [(mlp.w2, out_std)]
    for linear, linear_std in linears:
        _normal_(linear.weight, linear_std, rng)
        if linear.bias is not None:
            linear.bias.zero_()
    _init_norm(block.attention_norm)
    _init_norm(block.mlp_norm)


def _init_norm(norm: nn.Module) -> None:
    norm.weight.fill_(1.0)
    bias = getattr(norm, "bias", None)
    if bias is not None:
        bias.zero_()


def _normal_(param: torch.Tensor, std: float, rng: torch.Generator | None) -> None:
    """Fill param with normal(0, std): in place from the default RNG, or from rng via a full tensor."""
    if rng is None:
        nn.init.normal_(param, mean=0.0, std=std)
        return
    full = torch.empty(param.shape, dtype=torch.float32, device=rng.device).normal_(0.0, std, generator=rng)
    if DTensor is not None and isinstance(param, DTensor):
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full)
