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
    """Keys and values of the first `length` columns, per layer [batch, kv_heads, capacity, head_dim].

    Keys are stored rotated, one per key/value head (a GQA group's query heads share them). The
    tensors are allocated on first use, in the projections' dtype and device, `capacity` columns
    long: the prompt plus the tokens to generate, not the model's whole context (an imported model's
    128k positions would be gigabytes). A batch of prompts of several lengths is padded on the left:
    row b's tokens start at column pad[b], at position 0, and no query attends to padding.
    """

    capacity: int
    pad: list[int] | None = None
    """Padding columns before each row's first token (None: every row starts at column 0)."""
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    length: int = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, H, S, D] at columns length..length+S-1; the keys and values of all of
        columns 0..length+S-1."""
        end = self.length + k.shape[2]
        if layer not in self.keys:
            shape = (*k.shape[:2], self.capacity, k.shape[3])
            self.keys[layer] = k.new_empty(shape)
            self.values[layer] = v.new_empty(shape)
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (in this order): finished generations leave the batch."""
        for cached in (self.keys, self.values):
            for layer, tensor in cached.items():
                cached[layer] = tensor[rows]
        if self.pad is not None:
            self.pad = [self.pad[row] for row in rows]

    def row_cache(self, row: int, length: int) -> KVCache:
        """A one-row cache for `row`'s `length` tokens, ending at the last column filled so far plus
        `length` (left padding); once this cache's tensors exist, it writes straight into them."""
        alone = KVCache(capacity=length)
        start = self.pad[row] if self.pad is not None else 0
        for cached, own in ((self.keys, alone.keys), (self.values, alone.values)):
            for layer, tensor in cached.items():
                own[layer] = tensor[row : row + 1, :, start : start + length]
        return alone

    def place(self, row: int, alone: KVCache) -> None:
        """Allocate this cache's tensors like `alone`'s and copy them into `row` (the first row run).

        Zeros, not empty memory: the padding columns are never written, and a masked key's zero
        weight times a NaN left in memory would still be NaN."""
        start = self.pad[row] if self.pad is not None else 0
        rows = len(self.pad) if self.pad is not None else 1
        for cached, own in ((self.keys, alone.keys), (self.values, alone.values)):
            for layer, tensor in own.items():
                cached[layer] = tensor.new_zeros((rows, tensor.shape[1], self.capacity, tensor.shape[3]))
                cached[layer][row, :, start : start + alone.length] = tensor[0, :, : alone.length]

    def padded(self) -> bool:
        return self.pad is not None and any(self.pad)


def forward_cached(
    model: GPT, tokens: torch.Tensor, cache: KVCache, *, last_only: bool = False
) -> torch.Tensor:
    """tokens [B, S] at columns cache.length.. -> logits [B, S, V], the keys and values kept.

    Same result as `model(all tokens so far)[:, -S:]` for each row alone (its padding aside); the
    caller keeps to the model's context (positions below config.seq_length) and to the cache's
    capacity. `last_only`: logits [B, 1, V] of the last position only (HF's logits_to_keep=1), all
    generation needs: a prompt's other positions would cost S x V memory and S x hidden x V flops.
    """
    start, seq = cache.length, tokens.shape[1]
    last_position = start + seq - 1 - min(cache.pad or [0])
    if start + seq > cache.capacity or last_position >= model.config.seq_length:
        raise ValueError(
            f"forward_cached: columns up to {start + seq} exceed the cache ({cache.capacity}) "
            f"or positions up to {last_position + 1} the model's context ({model.config.seq_length})"
        )
    positions = _positions(cache, seq, tokens.device)
    h = model.tok_embeddings(tokens)
    if model.pos_embeddings is not None:
        h = h + model.pos_embeddings(positions)
    if model.embedding_dropout is not None:
        h = model.embedding_dropout(h)
    cos, sin = model._rope(positions)
    visible = _visible_keys(cache, seq, tokens.device)
    for index, block in enumerate(model.layers.values()):
        h = _block_cached(block, h, cos, sin, cache, index, visible)
    cache.length = start + seq
    if last_only:
        h = h[:, -1:]
    return model.output(model.norm(h))


def prefill_padded(model: GPT, prompts: list[list[int]], cache: KVCache) -> torch.Tensor:
    """Run each prompt alone into its row of an empty left-padded cache; the logits [B, V] after each.

    One padded forward would need a [B, 1, S, S] mask, which SDPA turns into floats outside its
    memory-saving causal kernels (8 prompts of 16k: ~8 GB); alone, each runs training's is_causal.
    """
    device = next(model.parameters()).device
    if len(prompts) == 1 and not cache.padded():  # no copy of a long prompt's keys
        return forward_cached(model, torch.tensor(prompts, device=device), cache, last_only=True)[:, -1]
    last: torch.Tensor | None = None
    for row, prompt in enumerate(prompts):
        alone = cache.row_cache(row, len(prompt))
        logits = forward_cached(model, torch.tensor([prompt], device=device), alone, last_only=True)
        if last is None:  # copied out: a view kept its row's logits alive until the last row ran
            last = logits.new_empty((len(prompts), logits.shape[-1]))
        last[row] = logits[0, -1]
        del logits
        if row == 0:
            cache.place(row, alone)
    cache.length = max(len(prompt) for prompt in prompts)
    assert last is not None
    return last


def _positions(cache: KVCache, seq: int, device: torch.device) -> torch.Tensor:
    """Positions of the new columns: [S], or [B, S] when rows are padded (padding at position 0)."""
    columns = torch.arange(cache.length, cache.length + seq, device=device)
    if not cache.padded():
        return columns
    pad = torch.tensor(cache.pad, device=device)
    return (columns[None, :] - pad[:, None]).clamp(min=0)


def _block_cached(
    block: TransformerBlock,
    x: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    cache: KVCache,
    layer: int,
    visible: torch.Tensor | None,
) -> torch.Tensor:
    """`TransformerBlock.forward` with cached attention."""
    normed = block.attention_norm(x)
    attended = _attention_cached(block.attention, normed, cos, sin, cache, layer, visible)
    h = x + block.attention_dropout(attended)
    return h + block.mlp_dropout(block.mlp(block.mlp_norm(h)))


def _attention_cached(
    attention: Attention,
    x: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    cache: KVCache,
    layer: int,
    visible: torch.Tensor | None,
) -> torch.Tensor:
    """`Attention.forward` for new columns: their queries over every cached key and their own."""
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
    if cache.length == 0 and visible is None:  # the prompt: training's causal kernel, no square mask
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=seq > 1, **grouped)
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, **grouped)
    return attention.wo(out.transpose(1, 2).reshape(batch, seq, -1))


def _visible_keys(cache: KVCache, seq: int, device: torch.device) -> torch.Tensor | None:
    """Which keys each new query sees: [S, keys], or [B, 1, S, keys] for padded rows; None where
    every query sees every key (one new token, no padding) or SDPA's is_causal does (the prompt).

    Not SDPA's is_causal after cached keys, which aligns a short query block with the first keys,
    not the last. A padding query sees itself, so its attention stays finite: SDPA kernels do not
    agree on a row of only masked keys (zeros in torch's math kernel, NaN elsewhere), and NaN values
    times a zero weight would still reach the real queries.
    """
    start = cache.length
    if not cache.padded():
        if seq == 1 or start == 0:
            return None
        return _causal(start, seq, device)
    keys = torch.arange(start + seq, device=device)
    queries = torch.arange(start, start + seq, device=device)[:, None]
    pad = torch.tensor(cache.pad, device=device)[:, None, None, None]
    return _causal(start, seq, device) & ((keys >= pad) | (keys == queries))


def _causal(start: int, seq: int, device: torch.device) -> torch.Tensor:
    """Query i (column start + i) sees keys 0..start + i."""
    queries = torch.arange(start, start + seq, device=device)
    return torch.arange(start + seq, device=device)[None, :] <= queries[:, None]
