"""Autoregressive sampling from a GPT: greedy, temperature, top-k and top-p (nucleus).

A GPT generates with a key/value cache (`gptrain.models.kv_cache`): each new token costs one
position's forward while the text fits the model's context; past it the window slides, every
position moves, and each token costs a forward of the whole window, as without a cache. Several
prompts run in left-padded batches (`generate_batch`), each as it would alone. Sampling
happens on the CPU, the softmax in float64 (a tiny temperature stays finite), so a seeded generator
gives the same tokens whatever device the model is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from gptrain.errors import ConfigError
from gptrain.models.gpt import GPT
from gptrain.models.kv_cache import KVCache, forward_cached, prefill_padded


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
    a CPU generator (without one, sampling uses a generator of its own seeded from torch's global
    one, as `generate_batch` gives each row). `valid_vocab_size` (the tokenizer's unpadded size) keeps the padding rows of a
    padded vocab from ever being sampled, and `excluded_ids` (ids the tokenizer cannot decode) too.
    `stop`, called with the new ids after each token, ends generation when it returns True (a stop
    string in the decoded text). `use_cache=False` reruns the context for every token (the
    reference the cache is tested against; a model other than a whole GPT always does).
    """
    picker = Picker(temperature, top_k, top_p, greedy, valid_vocab_size, excluded_ids, eod)
    return generate_batch(model, [prompt_ids], max_new_tokens, picker, [generator], [stop], use_cache)[0]


def generate_batch(
    model: nn.Module,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    picker: Picker | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
    stops: Sequence[Callable[[list[int]], bool] | None] | None = None,
    use_cache: bool = True,
    **sampling,
) -> list[list[int]]:
    """`generate` for several prompts at once, each with its own generator (`own_generators` where
    none is given) and stop condition: the new ids of each, as it gets them alone (up to rounding:
    a batch runs other GEMM shapes).

    A whole GPT runs the prompts that fit its context in left-padded batches through the KV cache
    (`padded_batches`: grouped by length, so padding at most doubles the cache); a prompt leaves
    its batch when it ends, or when it outgrows the context and goes on alone with
    the sliding window. `sampling`: `generate`'s temperature, top_k, top_p, greedy, eod,
    valid_vocab_size and excluded_ids, when no `picker` is given.
    """
    picker = picker or Picker(**sampling)
    for prompt in prompts:
        _check_arguments(
            prompt, max_new_tokens, picker.temperature, picker.top_k, picker.greedy, picker.top_p
        )
    rows = [
        Row(list(prompt), generator, stop, max_new_tokens)
        for prompt, generator, stop in zip(
            prompts,
            own_generators(generators, len(prompts), picker),
            stops or [None] * len(prompts),
            strict=True,
        )
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            alone = [row for row in rows if not row.done]
            if use_cache and caches(model):
                alone = _generate_cached(model, alone, picker)
            for row in alone:
                _generate_uncached(model, row, picker)
    finally:
        model.train(was_training)
    return [row.new for row in rows]


def own_generators(
    generators: Sequence[torch.Generator | None] | None, count: int, picker: Picker
) -> list[torch.Generator | None]:
    """A generator for each row: rows without one all drew from torch's global generator in turn,
    so a row's tokens depended on the others (how many were still drawing). Each gets its own,
    seeded from the global one in row order (torch.manual_seed still repeats a call, and the first
    row gets what it gets alone); greedy rows draw nothing."""
    given = list(generators) if generators is not None else [None] * count
    if picker.greedy_only() or all(generator is not None for generator in given):
        return given
    seeds = [int(torch.randint(2**62, ())) for _ in range(count)]  # one draw each: the first as alone
    return [
        generator if generator is not None else torch.Generator().manual_seed(seed)
        for generator, seed in zip(given, seeds, strict=True)
    ]


@dataclass
class Picker:
    """How the next token is chosen from a row of logits (`next_token`'s settings), and which ends."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    greedy: bool = False
    valid_vocab_size: int | None = None
    excluded_ids: Collection[int] = ()
    eod: int | Collection[int] | None = None

    def __post_init__(self) -> None:
        self.ends = {self.eod} if isinstance(self.eod, int) else set(self.eod or ())
        self.excluded = torch.tensor(sorted(self.excluded_ids), dtype=torch.long)

    def greedy_only(self) -> bool:
        """Whether every token is the argmax (no generator is drawn from)."""
        return is_greedy(self.greedy, self.top_k, self.temperature)

    def take(self, row: Row, logits: torch.Tensor) -> None:
        """Append the token picked from 1-D CPU float logits to `row`, and end the row where due."""
        if self.valid_vocab_size is not None:
            logits = logits[: self.valid_vocab_size]
        logits[self.excluded] = float("-inf")
        next_id = next_token(
            logits, self.temperature, top_k=self.top_k, top_p=self.top_p, greedy=self.greedy,
            generator=row.generator,
        )  # fmt: skip
        row.tokens.append(next_id)
        row.new.append(next_id)
        row.done = (
            next_id in self.ends
            or (row.stop is not None and row.stop(row.new))
            or len(row.new) == row.max_new_tokens
        )


@dataclass
class Row:
    """One prompt's generation: its tokens so far (prompt and new), its generator and stop test."""

    tokens: list[int]
    generator: torch.Generator | None
    stop: Callable[[list[int]], bool] | None
    max_new_tokens: int
    new: list[int] = field(default_factory=list)
    done: bool = False

    def __post_init__(self) -> None:
        self.done = self.max_new_tokens == 0


def caches(model: nn.Module) -> bool:
    """Whether `model` can generate with a KV cache: a whole GPT (not a test double, nor a stage)."""
    pieces = (model.tok_embeddings, model.norm, model.output) if isinstance(model, GPT) else (None,)
    return all(piece is not None for piece in pieces)


def _generate_cached(model: GPT, rows: list[Row], picker: Picker) -> list[Row]:
    """Run the rows that fit the context through the KV cache, in padded batches of bounded waste,
    until each ends; return those that outgrow the context (or started past it), to go on alone
    with the sliding window."""
    seq_length = model.config.seq_length
    outgrown = [row for row in rows if len(row.tokens) > seq_length]
    fitting = [row for row in rows if len(row.tokens) <= seq_length]
    for batch in padded_batches(fitting, seq_length):
        outgrown += _generate_padded(model, batch, picker)
    return outgrown


PADDING_WASTE = 2
"""A padded batch's cache holds at most this many times the columns its rows would hold alone."""


def padded_batches(rows: list[Row], seq_length: int) -> list[list[Row]]:
    """The rows grouped by prompt length (each batch in the rows' order) into batches whose cache
    holds at most PADDING_WASTE times the columns of their caches alone: every row is padded to
    the longest, so one long prompt among short ones multiplied its cache by the batch size (one
    16k prompt with seven short ones: 8 x 16k columns). Each row still gets what it gets alone."""
    batches: list[list[int]] = []
    for index in sorted(range(len(rows)), key=lambda index: len(rows[index].tokens)):
        grown = [rows[member] for member in (batches[-1] if batches else [])] + [rows[index]]
        alone = sum(_cache_columns([row], seq_length) for row in grown)
        if len(grown) > 1 and len(grown) * _cache_columns(grown, seq_length) <= PADDING_WASTE * alone:
            batches[-1].append(index)
        else:
            batches.append([index])
    return [[rows[index] for index in sorted(batch)] for batch in batches]


def _cache_columns(rows: list[Row], seq_length: int) -> int:
    """The columns of a padded batch's cache: its longest prompt plus the tokens to generate, up to
    where its shortest prompt outgrows the context (and leaves the batch)."""
    lengths = [len(row.tokens) for row in rows]
    return min(max(lengths) + rows[0].max_new_tokens, seq_length + max(lengths) - min(lengths))


def _generate_padded(model: GPT, rows: list[Row], picker: Picker) -> list[Row]:
    """Run the rows as one left-padded batch through the KV cache until each ends; return those
    that outgrow the context."""
    seq_length = model.config.seq_length
    device = next(model.parameters()).device
    longest = max(len(row.tokens) for row in rows)
    cache = KVCache(
        capacity=_cache_columns(rows, seq_length), pad=[longest - len(row.tokens) for row in rows]
    )
    logits = prefill_padded(model, [row.tokens for row in rows], cache)
    active, outgrown = rows, []
    while active:
        for row, row_logits in zip(active, logits.float().cpu(), strict=True):
            picker.take(row, row_logits)
        outgrown += [row for row in active if not row.done and len(row.tokens) > seq_length]
        going_on = [i for i, row in enumerate(active) if not row.done and len(row.tokens) <= seq_length]
        if len(going_on) < len(active):
            cache.keep_rows(going_on)
            active = [active[i] for i in going_on]
        if active:
            feed = torch.tensor([row.tokens[-1:] for row in active], dtype=torch.long, device=device)
            logits = forward_cached(model, feed, cache, last_only=True)[:, -1]
    return outgrown


def _generate_uncached(model: nn.Module, row: Row, picker: Picker) -> None:
    """Go on with one row, the model running its last config.seq_length tokens for every token."""
    seq_length = model.config.seq_length
    device = next(model.parameters()).device
    while not row.done:
        context = torch.tensor([row.tokens[-seq_length:]], dtype=torch.long, device=device)
        picker.take(row, model(context)[0, -1].float().cpu())


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
    if is_greedy(greedy, top_k, temperature):
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


def is_greedy(greedy: bool, top_k: int | None, temperature: float) -> bool:
    """--greedy, or top_k=1 (Megatron's greedy), or temperature 0 (vLLM's and OpenAI's)."""
    return greedy or top_k == 1 or temperature == 0


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
    if not (temperature >= 0 and math.isfinite(temperature)):  # also with --greedy: a typo, not unused
        raise ConfigError(
            f"temperature={temperature} must be finite and >= 0 (--temperature; 0 is greedy, as --greedy)"
        )
    if top_k is not None and top_k < 0:
        raise ConfigError(f"top_k={top_k} must be >= 0 (--top-k; 0 keeps every token)")
    if top_p is not None and not 0 <= top_p <= 1:
        raise ConfigError(f"top_p={top_p} must be in [0, 1] (--top-p; 0 or 1 keeps every token)")
