"""Autoregressive sampling from a GPT: greedy, temperature, top-k and top-p (nucleus).

A GPT generates with a key/value cache (`gptrain.models.kv_cache`): each new token costs one
position's forward while the text fits the model's context; past it the window slides, every
position moves, and each token costs a forward of the whole window, as without a cache. Sampling
happens on the CPU, the softmax in float64 (a tiny temperature stays finite), so a seeded generator
gives the same tokens whatever device the model is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import torch
from torch import nn

from gptrain.errors import ConfigError
from gptrain.models.gpt import GPT
from gptrain.models.kv_cache import KVCache, forward_cached


def generate(
    model: nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    eod: int | Collection[int] | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    valid_vocab_size: int | None = None,
    stop: Callable[[list[int]], bool] | None = None,
    excluded_ids: Collection[int] = (),
    use_cache: bool = True,
) -> list[int]:
    """Return the new token ids only (not the prompt); the last one is `eod` (or one of them: an
    imported model may declare several end tokens) if generation stopped on it.

    The context is cropped to the model's `config.seq_length` most recent tokens. `generator` must be
    a CPU generator. `valid_vocab_size` (the tokenizer's unpadded size) keeps the padding rows of a
    padded vocab from ever being sampled, and `excluded_ids` (ids the tokenizer cannot decode) too.
    `stop`, called with the new ids after each token, ends generation when it returns True (a stop
    string in the decoded text). `use_cache=False` reruns the context for every token (the
    reference the cache is tested against; a model other than a whole GPT always does).
    """
    _check_arguments(prompt_ids, max_new_tokens, temperature, top_k, greedy, top_p)
    seq_length = model.config.seq_length
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    tokens, new_tokens = list(prompt_ids), []
    ends = {eod} if isinstance(eod, int) else set(eod or ())
    excluded = torch.tensor(sorted(excluded_ids), dtype=torch.long)
    cache = None
    if use_cache and caches(model):
        cache = KVCache(capacity=min(seq_length, len(tokens) + max_new_tokens))
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = next_logits(model, tokens, cache, device).float().cpu()
                if valid_vocab_size is not None:
                    logits = logits[:valid_vocab_size]
                logits[excluded] = float("-inf")
                next_id = next_token(
                    logits, temperature, top_k=top_k, top_p=top_p, greedy=greedy, generator=generator
                )
                tokens.append(next_id)
                new_tokens.append(next_id)
                if next_id in ends or (stop is not None and stop(new_tokens)):
                    break
    finally:
        model.train(was_training)
    return new_tokens


def caches(model: nn.Module) -> bool:
    """Whether `model` can generate with a KV cache: a whole GPT (not a test double, nor a stage)."""
    pieces = (model.tok_embeddings, model.norm, model.output) if isinstance(model, GPT) else (None,)
    return all(piece is not None for piece in pieces)


def next_logits(
    model: nn.Module, tokens: list[int], cache: KVCache | None, device: torch.device
) -> torch.Tensor:
    """The model's 1-D logits for the token after `tokens`: the cache runs the tokens it lacks; past
    the context (or without a cache), the model runs its last config.seq_length tokens."""
    seq_length = model.config.seq_length
    if cache is None or len(tokens) > seq_length:
        return model(torch.tensor([tokens[-seq_length:]], dtype=torch.long, device=device))[0, -1]
    new = torch.tensor([tokens[cache.length :]], dtype=torch.long, device=device)
    return forward_cached(model, new, cache)[0, -1]


def next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    *,
    top_k: int | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
) -> int:
    """Pick one id from 1-D logits: argmax if greedy (or top_k=1, or temperature 0), else sample
    softmax(logits / T) over the top k, then over the fewest most likely ids whose probability reaches
    top_p (the order Hugging Face applies them in). top_k=0 and top_p=0 turn their filter off, as in
    Megatron and NeMo."""
    if greedy or top_k == 1 or temperature == 0:  # top_k=1 is Megatron's greedy, T=0 vLLM's and OpenAI's
        return int(torch.argmax(logits))
    # Shift by the max before dividing, in float64: a tiny temperature then sends the others to
    # -inf (probability 0) instead of every logit to +-inf (inf - inf = nan in the softmax).
    shifted = logits.double()
    scaled = (shifted - shifted.max()) / temperature
    if top_k and top_k < scaled.numel():
        kth_largest = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    if top_p and top_p < 1:
        scaled = _keep_nucleus(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _keep_nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scaled` with -inf outside the nucleus: the most likely ids, in order, until their probability
    reaches top_p (the most likely id always stays)."""
    probs, order = torch.sort(torch.softmax(scaled, dim=-1), descending=True)
    reached_before = (probs.cumsum(0) - probs) >= top_p  # the mass of the more likely ids already suffices
    outside = torch.empty_like(reached_before).scatter_(0, order, reached_before)
    return scaled.masked_fill(outside, float("-inf"))


def _check_arguments(
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    greedy: bool,
    top_p: float | None,
) -> None:
    if not prompt_ids:
        raise ConfigError("the prompt is empty: give at least one token (--prompt)")
    check_sampling(max_new_tokens, temperature, top_k, greedy, top_p)


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None, greedy: bool, top_p: float | None = None
) -> None:
    """The sampling flags, checked before a model is loaded for them."""
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 0 (--max-new-tokens)")
    if not greedy and not (temperature >= 0 and math.isfinite(temperature)):
        raise ConfigError(
            f"temperature={temperature} must be finite and >= 0 (--temperature; 0 is greedy, as --greedy)"
        )
    if top_k is not None and top_k < 0:
        raise ConfigError(f"top_k={top_k} must be >= 0 (--top-k; 0 keeps every token)")
    if top_p is not None and not 0 <= top_p <= 1:
        raise ConfigError(f"top_p={top_p} must be in [0, 1] (--top-p; 0 or 1 keeps every token)")
