"""The activation model under activation recompute against what gptrain's checkpointed blocks hold.

Under full recompute the blocks' saved tensors are hidden in checkpoint frames (no saved-tensor
hook of ours sees them), so the reference here is the allocator's view instead: every storage an
op makes, followed through a weak reference, and its bytes summed while it is alive.
"""

from __future__ import annotations

import pytest

from gptrain.models.config import GPTConfig
from gptrain.plan.memory import estimate_rank
from gptrain.plan.rank_activations import activation_bytes, rebuild_bytes
from gptrain.plan.spec import Layout, Workload

torch = pytest.importorskip("torch")


def workload(precision: str, num_layers: int = 3, **fields) -> Workload:
    # 256 tokens a micro batch against h = 32: the activations outweigh the weights and their
    # 16-bit copies, as at training sizes
    model = dict(vocab_size=96, seq_length=64, num_layers=num_layers, hidden_size=32, num_attention_heads=4)
    model |= dict(hidden_dropout=0.0, attention_dropout=0.0) | fields
    return Workload(
        model=GPTConfig(**model),
        make_vocab_size_divisible_by=64,
        global_batch_size=4,
        precision=precision,
        device_type="cpu",
    )


def live_bytes_trace(work: Workload, granularity: str | None, method: str | None, num_layers: int | None):
    """(bytes saved at the end of the model's forward, peak bytes from the backward of the last
    checkpointed block on): the storages made by ops and still alive, less parameters and their
    final gradients; the forward's less the logits and what is made of weights only (autocast's
    16-bit copies, the concatenated weights of a fused projection)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from gptrain.models.gpt import GPT
    from gptrain.parallel.activation_checkpoint import apply_ac

    torch.manual_seed(0)
    model = GPT(work.padded(1))
    model.init_weights(torch.Generator().manual_seed(0))
    apply_ac(model.train(), granularity, method, num_layers)
    tokens = torch.randint(0, work.vocab_size, (4, work.model.seq_length))
    known = {t.untyped_storage()._cdata for t in [*model.parameters(), tokens]}
    made: dict[int, tuple[StorageWeakRef, int, bool]] = {}
    trace: list[list[int]] = []
    weights = {p.untyped_storage()._cdata for p in model.parameters()}  # and what is made of them only

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = [
                t.untyped_storage()._cdata for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)
            ]
            copy = bool(inputs) and all(k in weights for k in inputs)  # a cast or concatenation of weights
            for t in tree_flatten(out)[0]:
                key = t.untyped_storage()._cdata if isinstance(t, torch.Tensor) else None
                if copy and key is not None:
                    weights.add(key)
                if key is not None and key not in known and key not in made:
                    made[key] = (StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes(), copy)
            trace.append([k for k, (ref, _, _) in made.items() if not ref.expired()])
            return out

    rebuilding: list[int] = []

    def mark_rebuild(_module, args) -> None:  # the last checkpointed block's output gets its gradient
        args[0].register_hook(lambda _grad: rebuilding.append(len(trace)))

    layers = list(model.layers.values())
    checkpointed = len(layers) if method != "block" else num_layers
    (layers[checkpointed] if checkpointed < len(layers) else model.norm).register_forward_pre_hook(
        mark_rebuild
    )
    dtype = torch.bfloat16 if work.mixed else torch.float32
    with Track():
        with torch.autocast("cpu", dtype=dtype, enabled=work.mixed):
            logits = model(tokens)
            output = logits.untyped_storage()._cdata
            saved = sum(n for k, (ref, n, copy) in made.items() if not (ref.expired() or copy or k == output))
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        del logits
        loss.backward()
    grads = {p.grad.untyped_storage()._cdata for p in model.parameters()}
    after = [sum(made[k][1] for k in live if k not in grads) for live in trace[rebuilding[0] :]]
    return saved, max(after)


FULL = [("full", "uniform", 1), ("full", "block", 1), ("full", "block", 2), ("full", "block", 0)]
SELECTIVE = ("selective", None, None)


@pytest.mark.parametrize("precision", ["32", "bf16"])
@pytest.mark.parametrize("mode", [*FULL, SELECTIVE])
def test_recompute_matches_live_storages(precision: str, mode: tuple) -> None:
    granularity, method, num_layers = mode
    work = workload(precision)
    layout = Layout(
        micro_batch_size=4,
        recompute=granularity,
        recompute_num_layers=num_layers if method == "block" else None,
    )
    saved, rebuild = live_bytes_trace(work, granularity, method, num_layers)
    # a checkpointed block keeps only its fp32 input: the forward's saved bytes, within 0.5%
    assert saved == pytest.approx(sum(activation_bytes(work, layout, 0).values()), rel=0.005)
    if granularity != "full" or num_layers == 0:
        return
    # the rebuild of the last checkpointed block (with its 16-bit weight copies, and the
    # gradients its backward holds): what is left is weight-sized and not modelled (a weight's
    # gradient in flight; under bf16 also its 16-bit gradient and the fused q/k/v's fp32
    # concatenated weight), 2% of this tiny model's peak in fp32 and 8% in bf16, far less at
    # training sizes where a block's weights are small against its activations
    tolerance = 0.03 if precision == "32" else 0.1
    assert estimate_rank(work, layout, 0).rebuild == pytest.approx(rebuild, rel=tolerance)


@pytest.mark.parametrize("precision", ["32", "bf16"])
def test_selective_recompute_keeps_far_less_than_none(precision: str) -> None:
    """Its policy once kept every non-attention op's output (torch's selective checkpoint caches
    each saved output, also where autograd keeps only the input): more than no recompute at all."""
    work = workload(precision)
    none, _ = live_bytes_trace(work, None, None, None)
    selective, _ = live_bytes_trace(work, "selective", None, None)
    assert selective < 0.7 * none


def test_selective_recompute_keeps_no_attention_scores_on_the_math_path() -> None:
    """Attention's math path (no fused kernel) multiplies with bmm; kept, its seq x seq scores are
    what selective recompute exists to drop. It keeps the same bytes as with a fused kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    work = workload("32")
    fused, _ = live_bytes_trace(work, "selective", None, None)
    with sdpa_kernel(SDPBackend.MATH):
        math, _ = live_bytes_trace(work, "selective", None, None)
    assert math == fused


def test_full_recompute_by_hand() -> None:
    """fp32, h = 1024, f = 4096, 16 heads, 2048 tokens a micro batch, 8 layers, flash attention."""
    c = GPTConfig(vocab_size=1024, seq_length=2048, num_layers=8, hidden_size=1024, num_attention_heads=16)
    c = GPTConfig(**(c.__dict__ | dict(hidden_dropout=0.0, attention_dropout=0.0)))
    work = Workload(model=c, make_vocab_size_divisible_by=128, global_batch_size=1, precision="32")
    tokens, h, f = 2048, 1024, 4096
    # an uncheckpointed block per token: norms 2 (4h + 8), linear inputs 2 x 4h, q k v 12h,
    # output 4h and log-sum-exp 4 x 16, GELU's input and output 2 x 4f
    per_layer = (2 * (4 * h + 8) + 8 * h + 12 * h + 4 * h + 64 + 8 * f) * tokens
    block_input = 4 * h * tokens  # 8,388,608
    gradients = (4 * h + 4 * f) * tokens  # the residual's and the down projection input's

    uniform = Layout(recompute="full")
    assert activation_bytes(work, uniform, 0)["blocks"] == 8 * block_input == 67_108_864
    rebuilt = 8 * block_input + per_layer - block_input + gradients
    assert rebuild_bytes(work, uniform, 0) == rebuilt == 235_044_864

    first_three = Layout(recompute="full", recompute_num_layers=3)
    assert activation_bytes(work, first_three, 0)["blocks"] == 3 * block_input + 5 * per_layer == 697_073_664
    # the five uncheckpointed blocks have run their backward before the third block is rebuilt
    assert rebuild_bytes(work, first_three, 0) == 3 * block_input + per_layer - block_input + gradients
    assert rebuild_bytes(work, Layout(recompute="full", recompute_num_layers=0), 0) == 0.0


@pytest.mark.parametrize("blocks", [None, 1])
def test_a_rank_with_fewer_layers_than_chunks_still_rebuilds_a_block(blocks: int | None) -> None:
    """pp 2 x v 5 with the embedding and loss counted as layers: 10 stages of 1 layer, the first and
    last empty, so each rank's 4 layers sit in 5 chunks. Every non-empty chunk rebuilds its block
    in the backward; counting 4 // 5 = 0 blocks a chunk dropped that peak (0 bytes)."""
    c = GPTConfig(vocab_size=1024, seq_length=2048, num_layers=8, hidden_size=1024, num_attention_heads=16)
    c = GPTConfig(**(c.__dict__ | dict(hidden_dropout=0.0, attention_dropout=0.0)))
    work = Workload(model=c, make_vocab_size_divisible_by=128, global_batch_size=4, precision="32")
    tokens, h, f = 2048, 1024, 4096
    per_layer = (2 * (4 * h + 8) + 8 * h + 12 * h + 4 * h + 64 + 8 * f) * tokens  # as by hand above
    block_input, gradients = 4 * h * tokens, (4 * h + 4 * f) * tokens
    split = dict(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    layout = Layout(pp=2, vpp=5, recompute="full", recompute_num_layers=blocks, **split)
    assert layout.stage_layers(8) == [0] + [1] * 8 + [0]
    for rank in range(2):
        parts = activation_bytes(work, layout, rank)
        head = 0 if rank == 0 else (4 * h + 8 + 4 * h) * tokens  # the one micro batch's head is freed
        stored = sum(parts.values()) - head
        assert rebuild_bytes(work, layout, rank) == stored + per_layer - block_input + gradients > 0, rank
