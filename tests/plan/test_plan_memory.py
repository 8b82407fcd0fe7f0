"""The memory model against what gptrain's real model and optimizer hold on CPU.

Weights, gradients and AdamW state are counted exactly; activations are the unique storages the
autograd graph saves for the backward (saved-tensor hooks), split into activations and autocast's
16-bit weight copies.
"""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.models.config import GPTConfig
from gptrain.plan.memory import activation_bytes, estimate_rank
from gptrain.plan.spec import Layout, Workload

torch = pytest.importorskip("torch")


def workload(precision: str = "32", **fields) -> Workload:
    base = dict(
        vocab_size=96,
        seq_length=32,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return Workload(
        model=GPTConfig(**(base | fields)),
        make_vocab_size_divisible_by=64,
        global_batch_size=4,
        precision=precision,
        device_type="cpu",
    )


def build(work: Workload):
    from gptrain.models.gpt import GPT

    torch.manual_seed(0)
    model = GPT(work.padded(1))
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_weights_gradients_and_adam_state_exactly() -> None:
    work = workload()
    model = build(work)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 96, (2, 32))
    model(tokens).float().logsumexp(-1).mean().backward()
    optimizer.step()
    params = {id(p): p for p in model.parameters()}.values()
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    state = [t for s in optimizer.state.values() for t in s.values() if t.dim() > 0]
    est = estimate_rank(work, Layout(micro_batch_size=2), 0)
    assert est.weights == nbytes(params)
    assert est.gradients == nbytes(p.grad for p in params)
    assert est.optimizer == nbytes(state)


def saved_storages(model, tokens, precision_dtype):
    """Unique storages saved for backward: (activation bytes, 16-bit weight-copy bytes)."""
    params = {p.data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()}
    seen: dict[int, tuple[int, bool]] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != tokens.data_ptr() and t.dtype != torch.int64:
            # a linear keeps its 16-bit weight as saved, transposed or not (no activation here has
            # a parameter's shape: 64 tokens is none of the model's sizes)
            weight_like = tuple(t.shape) in shapes or tuple(reversed(t.shape)) in shapes
            copy = precision_dtype is not None and t.dtype == precision_dtype and weight_like
            seen[ptr] = (t.untyped_storage().nbytes(), copy)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if precision_dtype is None:
            out = model(tokens)
        else:
            with torch.autocast("cpu", dtype=precision_dtype):
                out = model(tokens)
    acts = sum(n for n, copy in seen.values() if not copy)
    copies = sum(n for n, copy in seen.values() if copy)
    return acts, copies, out


CASES = [
    ("32", {}),
    ("bf16", {}),
    ("32", {"hidden_dropout": 0.1}),
    ("bf16", {"hidden_dropout": 0.1, "activation": "swiglu", "num_query_groups": 2}),
    ("32", {"attention_dropout": 0.1}),  # no flash kernel with dropout on CPU: the math path
]


@pytest.mark.parametrize(("precision", "fields"), CASES)
def test_activations_match_saved_tensors(precision: str, fields: dict) -> None:
    work = workload(precision, **fields)
    if fields.get("attention_dropout"):
        work = dataclasses.replace(work, flash_attention=False)
    model = build(work).train()
    tokens = torch.randint(0, 96, (2, 32))
    dtype = torch.bfloat16 if precision == "bf16" else None
    acts, copies, _ = saved_storages(model, tokens, dtype)
    layout = Layout(micro_batch_size=2)
    expected = sum(activation_bytes(work, layout, 0).values())
    assert acts == pytest.approx(expected, rel=0.005), activation_bytes(work, layout, 0)
    est = estimate_rank(work, layout, 0)
    assert copies == est.transient  # autocast's bf16 weights (biases are cast but not kept)
