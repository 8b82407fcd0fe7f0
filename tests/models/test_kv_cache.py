"""KV cache: cached logits equal the full forward's in float64, for GPT-3-style and llama-like models."""

from __future__ import annotations

import pytest
import torch

from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT
from gptrain.models.kv_cache import KVCache, forward_cached

TINY = dict(vocab_size=41, seq_length=24, num_layers=3, hidden_size=32, num_attention_heads=4)
ARCHITECTURES = {
    "gpt3": {},  # learned positions, LayerNorm, GELU, biases, tied output
    "llama_like": dict(
        position_embedding_type="rope",
        normalization="rmsnorm",
        activation="swiglu",
        ffn_hidden_size=48,
        bias=False,
        num_query_groups=2,  # GQA: two query heads per key/value head
        share_embeddings_and_output_weights=False,
    ),
}
# float64 carries ~16 digits; the cached and full forwards only sum the same products in another
# order (a 1-row GEMM against a 24-row one, one query's softmax against a masked row), which moves a
# logit by a few ulps per accumulation (sums of <= 48 terms, 3 layers): 1e-12 of the largest logit
# leaves a thousandfold margin, while any real slip (a wrong position, mask or key) moves logits
# by 1e-3 and more at this init.
RELATIVE_TOLERANCE = 1e-12


def float64_model(architecture: str) -> GPT:
    config = GPTConfig(**TINY, hidden_dropout=0.0, attention_dropout=0.0, **ARCHITECTURES[architecture])
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(7))
    return model.double().eval()


def sampled(logits: torch.Tensor, generator: torch.Generator) -> int:
    """A token drawn from the logits (greedy decoding of this random model repeats one token)."""
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))


def assert_same_logits(cached: torch.Tensor, full: torch.Tensor) -> None:
    scale = full.abs().max().item()
    assert cached.dtype == full.dtype == torch.float64
    assert (cached - full).abs().max().item() <= RELATIVE_TOLERANCE * scale


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_cached_logits_at_every_generated_position_equal_the_full_forward(architecture):
    model = float64_model(architecture)
    tokens = [3, 17, 5, 40, 2]
    cache, generator = KVCache(capacity=24), torch.Generator().manual_seed(0)
    with torch.no_grad():
        prefill = forward_cached(model, torch.tensor([tokens]), cache)
        assert_same_logits(prefill, model(torch.tensor([tokens])))
        tokens.append(sampled(prefill[0, -1], generator))
        while len(tokens) < 24:  # feed the newest token; the cache holds the ones before it
            cached = forward_cached(model, torch.tensor([tokens[-1:]]), cache)[0, -1]
            full = model(torch.tensor([tokens]))[0, -1]
            assert_same_logits(cached, full)
            tokens.append(sampled(full, generator))
    assert cache.length == 23
    assert len(set(tokens[5:])) > 5  # no constant loop, which could hide a position slip


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_several_new_positions_at_once_attend_causally_after_the_cached_ones(architecture):
    """A block of new tokens after cached ones: SDPA's is_causal would align it with the first keys."""
    model = float64_model(architecture)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])
    cache = KVCache(capacity=16)
    with torch.no_grad():
        first = forward_cached(model, tokens[:, :4], cache)
        rest = forward_cached(model, tokens[:, 4:], cache)
        full = model(tokens)
    assert_same_logits(torch.cat([first, rest], dim=1), full)


def test_positions_past_the_cache_or_the_context_are_refused():
    model = float64_model("gpt3")
    with pytest.raises(ValueError, match="exceed the cache"), torch.no_grad():
        forward_cached(model, torch.zeros(1, 5, dtype=torch.long), KVCache(capacity=4))
    with pytest.raises(ValueError, match="model's context"), torch.no_grad():
        forward_cached(model, torch.zeros(1, 25, dtype=torch.long), KVCache(capacity=30))


def test_the_cache_holds_the_grouped_keys_only_as_long_as_asked():
    model = float64_model("llama_like")
    cache = KVCache(capacity=9)
    with torch.no_grad():
        forward_cached(model, torch.tensor([[4, 5, 6]]), cache)
    assert sorted(cache.keys) == [0, 1, 2]
    assert cache.keys[0].shape == (1, 2, 9, 8)  # 2 key/value heads of 8, not 4 repeated heads
    assert cache.length == 3


def test_the_prompt_runs_trainings_causal_kernel_without_a_square_mask(monkeypatch):
    """A mask of prompt x prompt booleans turned into floats made SDPA leave its memory-saving
    causal kernels (1.3 GB more at a 16k prompt on one CPU layer); with nothing cached yet,
    is_causal is the same attention. Later blocks after cached keys still pass their mask."""
    from gptrain.models import kv_cache

    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, is_causal=False):
        calls.append((q.shape[2], attn_mask is None, is_causal))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    monkeypatch.setattr(kv_cache.F, "scaled_dot_product_attention", recording)
    model, cache = float64_model("gpt3"), KVCache(capacity=16)
    with torch.no_grad():
        forward_cached(model, torch.tensor([[1, 2, 3, 4, 5]]), cache)
        forward_cached(model, torch.tensor([[6, 7, 8]]), cache)
        forward_cached(model, torch.tensor([[9]]), cache)
    layers = TINY["num_layers"]
    assert calls == [(5, True, True)] * layers + [(3, False, False)] * layers + [(1, True, False)] * layers


def test_grouped_keys_reach_attention_unrepeated(monkeypatch):
    """GQA repeated every cached key and value per query head at every new token (a copy of the
    whole cache, times the group size); SDPA's enable_gqa reads each group's heads in place."""
    from gptrain.models import kv_cache

    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        calls.append((q.shape[1], k.shape[1], v.shape[1], enable_gqa))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa)

    monkeypatch.setattr(kv_cache.F, "scaled_dot_product_attention", recording)
    model, cache = float64_model("llama_like"), KVCache(capacity=16)
    with torch.no_grad():
        forward_cached(model, torch.tensor([[1, 2, 3, 4, 5]]), cache)
        forward_cached(model, torch.tensor([[6, 7]]), cache)
        forward_cached(model, torch.tensor([[8]]), cache)
    assert calls == [(4, 2, 2, True)] * (3 * TINY["num_layers"])


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_left_padded_rows_give_each_prompt_the_logits_it_gets_alone(architecture):
    """Prompts of several lengths in one batch, padded on the left: each row's positions start at 0
    where its tokens start and no row attends to its padding, so its logits (prompt, a block of two
    new tokens, then one token at a time, after finished rows leave the batch) are the full forward
    of its tokens alone."""
    model = float64_model(architecture)
    rows = [[3, 17, 5, 40, 2, 8], [9], [11, 4, 30]]
    pad = [6 - len(tokens) for tokens in rows]
    cache, generator = KVCache(capacity=16, pad=pad), torch.Generator().manual_seed(0)

    def assert_each_alone(logits: torch.Tensor, tokens: list[list[int]], new: int) -> None:
        for row, own in enumerate(tokens):
            assert_same_logits(logits[row, -new:], model(torch.tensor([own]))[0, -new:])

    with torch.no_grad():
        prefill = forward_cached(
            model, torch.tensor([[0] * n + t for n, t in zip(pad, rows, strict=True)]), cache
        )
        for row, tokens in enumerate(rows):
            assert_same_logits(prefill[row, pad[row] :], model(torch.tensor([tokens]))[0])
        for row, tokens in enumerate(rows):
            tokens += [sampled(prefill[row, -1], generator), sampled(prefill[row, -1], generator)]
        logits = forward_cached(model, torch.tensor([t[-2:] for t in rows]), cache)
        assert_each_alone(logits, rows, 2)
        for step in range(8):
            for row, tokens in enumerate(rows):
                tokens.append(sampled(logits[row, -1], generator))
            if step == 3:  # the first row ends: the batch goes on without it
                cache.keep_rows([1, 2])
                rows = rows[1:]
            logits = forward_cached(model, torch.tensor([t[-1:] for t in rows]), cache)
            assert_each_alone(logits, rows, 1)
    assert cache.length == 16 and cache.pad == [5, 3]
    assert len(set(rows[0][1:])) > 5  # no constant loop, which could hide a position slip


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_rows_prefilled_alone_then_stepped_together_get_their_logits_alone(architecture):
    """What `generate` runs for a batch: each prompt prefilled into its row alone (`prefill_padded`),
    then one new token per row at a time, padded rows masked: every row's logits are the full
    forward of its own tokens."""
    from gptrain.models.kv_cache import prefill_padded

    model = float64_model(architecture)
    rows = [[3, 17, 5, 40], [9], [11, 4, 30, 2, 8, 1, 6]]
    cache = KVCache(capacity=17, pad=[7 - len(tokens) for tokens in rows])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logits = prefill_padded(model, rows, cache)
        for _ in range(10):
            for row, tokens in enumerate(rows):
                assert_same_logits(logits[row], model(torch.tensor([tokens]))[0, -1])
                tokens.append(sampled(logits[row], generator))
            logits = forward_cached(model, torch.tensor([t[-1:] for t in rows]), cache)[:, -1]
    assert cache.length == 17
    assert len(set(rows[1][1:])) > 5  # no constant loop, which could hide a position slip


def test_a_padded_prefill_keeps_no_rows_logits_but_its_last(monkeypatch):
    """`prefill_padded` kept a view of each row's last logits, and with it the row's whole
    [1, prompt, vocab] logits until all rows had run (8 prompts of 16k at a 50k vocab: 26 GB in
    float32). While each row runs, the earlier rows' logits still alive hold one vocab row each."""
    import weakref

    from gptrain.models.kv_cache import prefill_padded

    model = float64_model("gpt3")
    vocab_row = TINY["vocab_size"] * 8  # bytes of one float64 row of logits
    outputs: list[weakref.ref] = []
    held: list[int] = []

    def check_earlier(module, inputs, output):
        alive = [ref() for ref in outputs]
        held.append(sum(t.untyped_storage().nbytes() for t in alive if t is not None))
        outputs.append(weakref.ref(output))

    model.output.register_forward_hook(check_earlier)
    rows = [[3, 17, 5, 40, 2, 8, 1], [9, 4, 4, 30, 2, 1], [11, 4, 30, 2, 8]]
    with torch.no_grad():
        prefill_padded(model, rows, KVCache(capacity=9, pad=[7 - len(tokens) for tokens in rows]))
    assert len(held) == 3
    assert all(nbytes <= row * vocab_row for row, nbytes in enumerate(held))


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_generation_scores_only_the_last_position_of_a_prompt(architecture):
    """The prefill ran the final norm and the output layer on every prompt position (a 16k prompt
    at a 50k vocab: 3 GB of float32 logits and 16k x hidden x vocab multiply-adds) for the last
    one's logits only. Generation now scores the last position, as HF's logits_to_keep=1; its
    logits are the full forward's, and the whole prompt's are still there for who asks."""
    from gptrain.trained.sampling import generate_batch

    model = float64_model(architecture)
    scored: list[tuple[int, ...]] = []
    for module in (model.norm, model.output):
        module.register_forward_hook(lambda module, inputs, output: scored.append(tuple(inputs[0].shape)))
    prompts = [[3, 17, 5, 40, 2, 8, 1, 9], [9, 4], [11, 4, 30, 2, 8]]
    with torch.no_grad():
        generate_batch(model, prompts, 3, greedy=True)
        generate_batch(model, prompts[:1], 3, greedy=True)
    hidden = TINY["hidden_size"]
    assert scored == [(1, 1, hidden)] * 6 + [(3, 1, hidden)] * 4 + [(1, 1, hidden)] * 6
    tokens = torch.tensor([prompts[0]])
    with torch.no_grad():
        last = forward_cached(model, tokens, KVCache(capacity=8), last_only=True)
        every = forward_cached(model, tokens, KVCache(capacity=8))
        full = model(tokens)
    assert last.shape == (1, 1, TINY["vocab_size"]) and every.shape == full.shape
    assert_same_logits(last, full[:, -1:])
    assert_same_logits(every, full)
