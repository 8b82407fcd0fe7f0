"""Sampling loop: greedy determinism, eod, top-k, context cropping, argument checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT
from gptrain.trained.sampling import generate, next_token


class BigramModel(nn.Module):
    """Logits depend only on the last token through a fixed table; records every context it sees."""

    def __init__(self, table: torch.Tensor, seq_length: int) -> None:
        super().__init__()
        self.table = nn.Parameter(table)
        self.config = SimpleNamespace(seq_length=seq_length)
        self.contexts: list[list[int]] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.contexts.append(tokens[0].tolist())
        return self.table[tokens]


def cycle_table(vocab: int) -> torch.Tensor:
    """Greedy successor of t is (t + 1) % vocab; the runner-up is (t + 2) % vocab."""
    table = torch.zeros(vocab, vocab)
    for t in range(vocab):
        table[t, (t + 1) % vocab] = 5.0
        table[t, (t + 2) % vocab] = 4.0
    return table


def tiny_gpt() -> GPT:
    config = GPTConfig(vocab_size=50, seq_length=6, num_layers=2, hidden_size=16, num_attention_heads=2)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_greedy_follows_the_argmax_and_crops_the_context():
    model = BigramModel(cycle_table(10), seq_length=4)
    assert generate(model, [0, 1, 2], 8, greedy=True) == [3, 4, 5, 6, 7, 8, 9, 0]
    assert all(len(context) <= 4 for context in model.contexts)
    assert model.contexts[0] == [0, 1, 2] and model.contexts[-1] == [6, 7, 8, 9]


def test_greedy_on_a_real_model_matches_a_manual_argmax_loop():
    model = tiny_gpt().train()
    prompt = [3, 1, 4, 1, 5]
    produced = generate(model, prompt, 7, greedy=True)
    assert model.training  # mode restored
    assert produced == generate(model, prompt, 7, greedy=True)
    model.eval()
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(7):
            logits = model(torch.tensor([tokens[-6:]]))[0, -1]
            tokens.append(int(logits.argmax()))
    assert produced == tokens[len(prompt) :]


def test_stops_at_eod_and_includes_it():
    model = BigramModel(cycle_table(10), seq_length=8)
    assert generate(model, [5], 20, greedy=True, eod=8) == [6, 7, 8]
    assert generate(model, [5], 2, greedy=True, eod=8) == [6, 7]
    assert generate(model, [5], 20, greedy=True, eod={9, 7}) == [6, 7]  # several end tokens


def test_top_k_samples_only_the_k_best():
    table = torch.arange(10, dtype=torch.float32).repeat(10, 1) / 2  # token 9 best, then 8, 7 ...
    model = BigramModel(table, seq_length=8)
    generator = torch.Generator().manual_seed(0)
    sampled = generate(model, [0], 300, top_k=2, generator=generator)
    assert set(sampled) == {8, 9}
    assert generate(model, [0], 50, top_k=1, generator=generator) == [9] * 50
    unrestricted = generate(model, [0], 300, generator=generator)
    assert len(set(unrestricted)) > 2


def test_seeded_sampling_is_reproducible_and_temperature_sharpens():
    model = tiny_gpt()
    first = generate(model, [1, 2], 20, temperature=1.0, generator=torch.Generator().manual_seed(3))
    again = generate(model, [1, 2], 20, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert first == again
    cold = generate(model, [1, 2], 20, temperature=1e-4, generator=torch.Generator().manual_seed(3))
    assert cold == generate(model, [1, 2], 20, greedy=True)


def test_next_token_probabilities_follow_softmax():
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7]))
    generator = torch.Generator().manual_seed(0)
    draws = [next_token(logits, generator=generator) for _ in range(4000)]
    frequencies = [draws.count(i) / len(draws) for i in range(3)]
    assert frequencies == pytest.approx([0.1, 0.2, 0.7], abs=0.03)


def nucleus_reference(probabilities: list[float], top_p: float) -> dict[int, float]:
    """The fewest most likely ids whose probability reaches top_p, renormalised (float64 loop)."""
    kept, mass = [], 0.0
    for index in sorted(range(len(probabilities)), key=lambda i: -probabilities[i]):
        if mass >= top_p:
            break
        kept.append(index)
        mass += probabilities[index]
    return {index: probabilities[index] / mass for index in kept}


@pytest.mark.parametrize(
    ("top_p", "temperature", "top_k"), [(0.7, 1.0, None), (0.45, 1.0, None), (0.9, 1.0, 3), (0.6, 2.0, None)]
)
def test_top_p_samples_the_nucleus_in_proportion(top_p, temperature, top_k):
    """--top-p: the most likely ids until their probability reaches p, after temperature and top-k."""
    base = [0.05, 0.5, 0.15, 0.3]
    logits = torch.log(torch.tensor(base, dtype=torch.float64)).float()
    tempered = [p ** (1 / temperature) for p in base]
    if top_k is not None:
        cut = sorted(tempered, reverse=True)[top_k - 1]
        tempered = [p if p >= cut else 0.0 for p in tempered]
    expected = nucleus_reference([p / sum(tempered) for p in tempered], top_p)
    generator = torch.Generator().manual_seed(0)
    draws = [
        next_token(logits, temperature, top_k=top_k, generator=generator, top_p=top_p) for _ in range(4000)
    ]
    assert set(draws) == set(expected)
    for index, probability in expected.items():  # 5 standard deviations of a binomial frequency
        assert draws.count(index) / len(draws) == pytest.approx(probability, abs=5 * (0.25 / 4000) ** 0.5)


@pytest.mark.parametrize(("top_p", "kept"), [(0.25, 1), (0.5, 2), (0.75, 3), (0.7, 3)])
def test_top_p_stops_where_the_mass_reaches_p_exactly(top_p, kept):
    """Four equal logits (probability 1/4 each, exact in binary): the nucleus is the fewest ids whose
    probability reaches top_p, so a mass equal to top_p ends it (Hugging Face's TopPLogitsWarper keeps
    1 of [0, 0] at top_p=0.5); `>` in place of `>=` would keep one id more at 0.25, 0.5 and 0.75."""
    generator = torch.Generator().manual_seed(0)
    draws = {next_token(torch.zeros(4), top_p=top_p, generator=generator) for _ in range(400)}
    assert len(draws) == kept == len(nucleus_reference([0.25] * 4, top_p))


def test_valid_vocab_size_never_samples_padding():
    table = torch.zeros(10, 10)
    table[:, 8:] = 10.0  # padding rows 8, 9 would win
    model = BigramModel(table, seq_length=8)
    assert set(
        generate(model, [0], 100, valid_vocab_size=8, generator=torch.Generator().manual_seed(1))
    ) <= set(range(8))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(prompt_ids=[]), "prompt"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=-0.1), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_arguments_raise_config_error(kwargs, key):
    model = BigramModel(cycle_table(4), seq_length=4)
    arguments = {"prompt_ids": [1], "max_new_tokens": 3, **kwargs}
    with pytest.raises(ConfigError, match=key):
        generate(model, **arguments)


@pytest.mark.parametrize("off", [dict(top_k=0), dict(top_p=0.0), dict(top_k=0, top_p=0.0)])
def test_zero_turns_top_k_and_top_p_off_as_in_megatron(off):
    """Megatron's and NeMo's 0 means "no filter"; it was refused, so their settings failed here."""
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    filtered = [
        next_token(logits, 1.0, generator=torch.Generator().manual_seed(s), **off) for s in range(200)
    ]
    unfiltered = [next_token(logits, 1.0, generator=torch.Generator().manual_seed(s)) for s in range(200)]
    assert filtered == unfiltered
    assert len(set(filtered)) == 5  # every id is still drawn (a top-1 filter would draw only id 0)


@pytest.mark.parametrize("temperature", [1e-38, 1e-300, 5e-324])
def test_tiny_temperatures_pick_the_argmax_instead_of_nan(temperature):
    logits = torch.tensor([1.0, 30.0, 29.99, -5.0])  # 30 / 1e-38 overflows float32
    generator = torch.Generator().manual_seed(0)
    assert {next_token(logits, temperature, generator=generator) for _ in range(20)} == {1}
    assert next_token(logits, temperature, top_k=2, generator=generator) == 1
    model = tiny_gpt()
    assert generate(model, [1, 2], 8, temperature=temperature) == generate(model, [1, 2], 8, greedy=True)


def test_infinite_temperature_is_refused():
    with pytest.raises(ConfigError, match="must be finite and >= 0"):
        generate(tiny_gpt(), [1], 2, temperature=float("inf"))


def test_a_stop_condition_ends_generation_after_the_token_that_met_it():
    model = BigramModel(cycle_table(10), seq_length=8)
    seen: list[list[int]] = []

    def stop(new_ids: list[int]) -> bool:
        seen.append(list(new_ids))
        return new_ids[-1] == 7

    assert generate(model, [5], 20, greedy=True, stop=stop) == [6, 7]
    assert seen == [[6], [6, 7]]
    assert generate(model, [5], 20, greedy=True, eod=6, stop=stop) == [6]  # EOD first


def test_excluded_ids_are_never_sampled():
    model = BigramModel(cycle_table(10), seq_length=8)
    assert generate(model, [5], 5, greedy=True, excluded_ids={7}) == [6, 8, 9, 0, 1]  # 7's runner-up: 8
    generator = torch.Generator().manual_seed(0)
    assert 7 not in generate(model, [5], 200, temperature=5.0, excluded_ids={7}, generator=generator)


def float64_gpt(**architecture) -> GPT:
    config = GPTConfig(
        vocab_size=50, seq_length=12, num_layers=2, hidden_size=32, num_attention_heads=4, **architecture
    )
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(5))
    return model.double()


LLAMA_LIKE = dict(
    position_embedding_type="rope",
    normalization="rmsnorm",
    activation="swiglu",
    ffn_hidden_size=48,
    bias=False,
    num_query_groups=2,
    share_embeddings_and_output_weights=False,
)


@pytest.mark.parametrize("architecture", [{}, LLAMA_LIKE], ids=["gpt3", "llama_like"])
def test_the_kv_cache_gives_the_tokens_of_the_full_forward_also_past_the_context(architecture, monkeypatch):
    """Greedy and seeded sampling pick the same tokens with and without the cache, before and after
    the window slides (prompt 4 + 20 new tokens > context 12); within the context, the whole model's
    forward never runs (each token is one cached position)."""
    model = float64_gpt(**architecture)
    prompt = [7, 3, 9, 1]
    for options in (dict(greedy=True), dict(temperature=0.8, top_k=20)):
        uncached = generate(
            model, prompt, 20, use_cache=False, generator=torch.Generator().manual_seed(2), **options
        )
        cached = generate(model, prompt, 20, generator=torch.Generator().manual_seed(2), **options)
        assert cached == uncached
    assert len(set(uncached)) > 3  # sampled text that varies, not a constant loop
    expected = generate(model, prompt, 8, greedy=True, use_cache=False)
    monkeypatch.setattr(GPT, "forward", lambda self, tokens: pytest.fail("the whole model ran"))
    assert generate(model, prompt, 8, greedy=True) == expected


def test_temperature_0_and_top_k_1_are_greedy_as_in_vllm_and_megatron():
    """--temperature 0 was refused ('use --greedy'); Megatron's greedy is top_k=1 (an argmax), which
    sampled among tied best ids; vLLM and OpenAI read temperature 0 as greedy. Both are now the argmax
    (the first of tied ids) and draw nothing from the generator."""
    tied = torch.tensor([1.0, 3.0, 3.0, -2.0])
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert {next_token(tied, 1.0, top_k=1, generator=generator) for _ in range(30)} == {1}
    assert {next_token(tied, 0.0, generator=generator) for _ in range(30)} == {1}
    assert {next_token(tied, 0.0, top_p=0.9, top_k=3, generator=generator) for _ in range(30)} == {1}
    assert torch.equal(generator.get_state(), state)
    model = tiny_gpt()
    greedy = generate(model, [1, 2], 10, greedy=True)
    assert generate(model, [1, 2], 10, temperature=0.0, generator=generator) == greedy
    assert generate(model, [1, 2], 10, temperature=1.5, top_k=1, generator=generator) == greedy


@pytest.mark.parametrize("architecture", [{}, LLAMA_LIKE], ids=["gpt3", "llama_like"])
def test_a_batch_of_prompts_of_several_lengths_gives_each_the_tokens_it_gets_alone(architecture, monkeypatch):
    """Prompts of 4, 1 and 7 tokens run as one left-padded batch through the KV cache (context 12:
    the 7-token prompt outgrows it after 6 new tokens, the 4-token one after 9, and each goes on
    alone with the sliding window); a 14-token prompt, past the context from the start, never
    joins the batch. Greedy and seeded sampling (a generator per prompt) give each prompt the tokens
    it gets alone; a row that stops (its stop condition, an end token) leaves the others running."""
    from gptrain.models import kv_cache
    from gptrain.trained import sampling
    from gptrain.trained.sampling import generate_batch

    model = float64_gpt(**architecture)
    prompts = [[7, 3, 9, 1], [5], [2, 8, 4, 6, 1, 3, 9], [4] * 13 + [1]]
    batch_sizes: list[int] = []

    def recording(model, tokens, cache, **options):
        batch_sizes.append(tokens.shape[0])
        return kv_cache.forward_cached(model, tokens, cache, **options)

    monkeypatch.setattr(sampling, "forward_cached", recording)
    for options in (dict(greedy=True), dict(temperature=0.8, top_k=20)):
        alone = [
            generate(model, p, 10, generator=torch.Generator().manual_seed(i), **options)
            for i, p in enumerate(prompts)
        ]
        generators = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
        assert generate_batch(model, prompts, 10, generators=generators, **options) == alone
    assert len({tuple(tokens) for tokens in alone}) == 4 and len(set(alone[1])) > 3  # sampled: varied
    batch_sizes.clear()
    stops = [None, lambda new: len(new) == 3, None, None]
    expected = [alone[0], alone[1][:3], alone[2], alone[3]]
    generators = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    assert (
        generate_batch(model, prompts, 10, generators=generators, stops=stops, temperature=0.8, top_k=20)
        == expected
    )
    assert batch_sizes == [3] * 2 + [2] * 3 + [1] * 3  # row 1 stops, row 2 outgrows, row 0 outgrows
    end = alone[0][2]
    ended = generate_batch(
        model,
        prompts,
        10,
        generators=[torch.Generator().manual_seed(i) for i in range(len(prompts))],
        eod=end,
        temperature=0.8,
        top_k=20,
    )
    for tokens, own in zip(ended, alone, strict=True):
        assert tokens == (own[: own.index(end) + 1] if end in own else own)


def test_a_padded_batch_prefills_each_prompt_with_the_causal_kernel_not_a_square_mask(monkeypatch):
    """A left-padded batch's prompt ran with a [batch, 1, prompt, prompt] mask, which SDPA turns into
    floats outside its memory-saving causal kernels (8 prompts of 16k: ~8 GB). Each prompt now fills
    its rows of the cache alone, with is_causal as one prompt does; only the one-token steps after
    it carry a mask, [batch, 1, 1, columns]."""
    from gptrain.models import kv_cache
    from gptrain.trained.sampling import generate_batch

    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, is_causal=False, **grouped):
        calls.append(
            (q.shape[0], q.shape[2], None if attn_mask is None else tuple(attn_mask.shape), is_causal)
        )
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **grouped)

    model = float64_gpt(**LLAMA_LIKE)
    prompts = [[7, 3, 9, 1], [5], [2, 8, 4]]
    alone = [generate(model, p, 3, greedy=True) for p in prompts]
    monkeypatch.setattr(kv_cache.F, "scaled_dot_product_attention", recording)
    assert generate_batch(model, prompts, 3, greedy=True) == alone
    layers = model.config.num_layers
    prefill = [(1, 4, None, True)] * layers + [(1, 1, None, False)] * layers + [(1, 3, None, True)] * layers
    steps = [(3, 1, (3, 1, 1, 5), False)] * layers + [(3, 1, (3, 1, 1, 6), False)] * layers
    assert calls == prefill + steps


def test_a_padded_batch_never_reads_what_memory_its_padding_columns_held(monkeypatch):
    """The padding columns of a batch's cache are never written: allocated empty, whatever memory
    held there (NaN here, as freed memory may) reached every row through its zero attention weight."""
    from gptrain.trained.sampling import generate_batch

    model = float64_gpt()
    prompts = [[7, 3, 9, 1], [5], [2, 8, 4, 6, 1, 3, 9], [4]]
    alone = [generate(model, p, 5, greedy=True) for p in prompts]
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, shape: self.new_full(shape, float("nan")))
    assert generate_batch(model, prompts, 5, greedy=True) == alone


def test_one_long_prompt_among_short_ones_does_not_pad_them_all_to_its_length(monkeypatch):
    """Every prompt of a batch was padded to the longest: one 30-token prompt with seven of 2
    tokens made a cache of 8 x 34 columns (4 new tokens), where alone they need 34 + 7 x 6. A batch
    now closes before its cache would hold over twice the columns its rows need alone, so the seven
    short prompts run together (7 x 6 columns) and the long one by itself (34); each prompt still
    gets, in its place, the tokens it gets alone."""
    from gptrain.models import kv_cache
    from gptrain.trained import sampling
    from gptrain.trained.sampling import generate_batch

    config = GPTConfig(vocab_size=50, seq_length=48, num_layers=2, hidden_size=32, num_attention_heads=4)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(5))
    model = model.double()
    caches: list[tuple[int, int]] = []

    def recording(model, prompts, cache):
        logits = kv_cache.prefill_padded(model, prompts, cache)
        rows, heads, columns, head_dim = cache.keys[0].shape
        assert cache.keys[0].untyped_storage().nbytes() == rows * heads * columns * head_dim * 8
        caches.append((rows, columns))
        return logits

    short = [[1 + i, 7] for i in range(7)]
    prompts = short[:3] + [[(5 * i) % 50 for i in range(30)]] + short[3:]
    alone = [generate(model, prompt, 4, greedy=True) for prompt in prompts]
    monkeypatch.setattr(sampling, "prefill_padded", recording)
    assert generate_batch(model, prompts, 4, greedy=True) == alone
    assert caches == [(7, 6), (1, 34)]


def test_rows_without_a_generator_each_sample_from_their_own():
    """Rows given no generator all drew from torch's global one in turn, so a row's tokens depended
    on the other rows (how many were still drawing) and a prompt in a batch got other text than
    alone. Each such row now samples from a generator of its own, seeded from the global one in row
    order (torch.manual_seed still repeats a call); greedy draws nothing from it."""
    from gptrain.trained.sampling import generate_batch

    model = float64_gpt()
    prompts = [[7, 3, 9, 1], [5, 2]]
    options = dict(temperature=1.0, top_k=30)
    torch.manual_seed(3)
    alone = generate(model, prompts[0], 8, **options)
    torch.manual_seed(3)
    together = generate_batch(model, prompts, 8, **options)
    torch.manual_seed(3)
    first_stops = generate_batch(model, prompts, 8, stops=[lambda new: len(new) == 2, None], **options)
    assert together[0] == alone and len(set(alone)) > 3  # sampled text that varies
    assert first_stops == [alone[:2], together[1]]
    state = torch.get_rng_state()
    generate_batch(model, prompts, 8, greedy=True)
    generate_batch(model, prompts, 8, temperature=0.0)
    assert torch.equal(torch.get_rng_state(), state)
