"""A key/value cache for generation: each new token costs one position's forward, not the context's.

Kept out of `GPT.forward` on purpose: training (and `torch.compile` of its blocks) never sees a
cache argument or a branch for it. `forward_cached` runs a whole GPT (one process, no parallelism)
with the model's own modules, in the order `TransformerBlock.forward` runs them, so it computes what
the full forward computes; tests/models/test_kv_cache.py holds it to the full forward in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gptrain.models.gpt import GPT, Attention, TransformerBlock, apply_rope


@dataclass
class KVCache:
    """Keys and values of the first `length` positions, per layer [batch, kv_heads, capacity, head_dim].

    Keys are stored rotated, one per key/value head (a GQA group's query heads share them). The tensors are
    allocated on first use, in the projections' dtype and device, `capacity` positions long: the
    prompt plus the tokens to generate, not the model's whole context (an imported model's 128k
    positions would be gigabytes).
    """

    capacity: int
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    length: int = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, H, S, D] at positions length..length+S-1; the keys and values of all of
        positions 0..length+S-1."""
        end = self.length + k.shape[2]
        if layer not in self.keys:
            shape = (*k.shape[:2], self.capacity, k.shape[3])
            self.keys[layer] = k.new_empty(shape)
            self.values[layer] = v.new_empty(shape)
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def forward_cached(model: GPT, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """tokens [B, S] at positions cache.length.. -> logits [B, S, V], the keys and values kept.

    Same result as `model(all tokens so far)[:, -S:]`; the caller keeps to the model's context
    (positions below config.seq_length) and to the cache's capacity.
    """
    start, seq = cache.length, tokens.shape[1]
    if start + seq > min(cache.capacity, model.config.seq_length):
        raise ValueError(
            f"forward_cached: positions up to {start + seq} exceed the cache ({cache.capacity}) "
            f"or the model's context ({model.config.seq_length})"
        )
    positions = torch.arange(start, start + seq, device=tokens.device)
    h = model.tok_embeddings(tokens)
    if model.pos_embeddings is not None:
        h = h + model.pos_embeddings(positions)
    if model.embedding_dropout is not None:
        h = model.embedding_dropout(h)
    cos, sin = model._rope(positions)
    for index, block in enumerate(model.layers.values()):
        h = _block_cached(block, h, cos, sin, cache, index)
    cache.length = start + seq
    return model.output(model.norm(h))


def _block_cached(
    block: TransformerBlock,
    x: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    cache: KVCache,
    layer: int,
) -> torch.Tensor:
    """`TransformerBlock.forward` with cached attention."""
    attended = _attention_cached(block.attention, block.attention_norm(x), cos, sin, cache, layer)
    h = x + block.attention_dropout(attended)
    return h + block.mlp_dropout(block.mlp(block.mlp_norm(h)))


def _attention_cached(
    attention: Attention,
    x: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    cache: KVCache,
    layer: int,
) -> torch.Tensor:
    """`Attention.forward` for new positions: their queries over every cached key and their own."""
    batch, seq = x.shape[0], x.shape[1]
    q, k, v = (
        p(x).view(batch, seq, -1, attention.head_dim) for p in (attention.wq, attention.wk, attention.wv)
    )
    if cos is not None and sin is not None:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    keys, values = cache.extend(layer, k, v)
    # GQA: query head j reads key/value head j // group (Attention.forward's repeat_interleave)
    # without a copy of the whole cache per group member at every new token (torch >= 2.5).
    grouped = {"enable_gqa": True} if q.shape[1] != keys.shape[1] else {}
    if cache.length == 0:  # the prompt: training's causal kernel, no seq x seq mask in memory
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=seq > 1, **grouped)
    else:
        mask = _causal_mask(cache.length, seq, x.device)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, **grouped)
    return attention.wo(out.transpose(1, 2).reshape(batch, seq, -1))


def _causal_mask(start: int, seq: int, device: torch.device) -> torch.Tensor | None:
    """Query i (position start + i) sees keys 0..start + i; None where it sees all (one new token).

    Not SDPA's is_causal, which aligns a short query block with the first keys, not the last.
    """
    if seq == 1:
        return None
    queries = torch.arange(start, start + seq, device=device)
    return torch.arange(start + seq, device=device)[None, :] <= queries[:, None]
