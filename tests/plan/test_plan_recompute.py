"""The activation model under activation recompute against what gptrain's checkpointed blocks hold.

Under full recompute the blocks' saved tensors are hidden in checkpoint frames (no saved-tensor
hook of ours sees them), so the reference here is the allocator's view instead: every storage an
op makes, followed through a weak reference, and its bytes summed while it is alive.
"""

from __future__ import annotations

import dataclasses

import pytest
from gloo_ranks import free_port

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


def recompute_fields(mode: tuple, micro_batch_size: int) -> dict:
    """A Layout's recompute keys for a (granularity, method, num_layers) mode of these tests."""
    granularity, method, num_layers = mode
    return dict(
        micro_batch_size=micro_batch_size,
        recompute=granularity,
        recompute_num_layers=num_layers if method == "block" else None,
    )


@pytest.mark.parametrize("precision", ["32", "bf16"])
@pytest.mark.parametrize("mode", [*FULL, SELECTIVE])
def test_recompute_matches_live_storages(precision: str, mode: tuple) -> None:
    granularity, method, num_layers = mode
    work = workload(precision)
    layout = Layout(**recompute_fields(mode, 4))
    saved, rebuild = live_bytes_trace(work, granularity, method, num_layers)
    # a checkpointed block keeps only its fp32 input: the forward's saved bytes, within 0.5%
    assert saved == pytest.approx(sum(activation_bytes(work, layout, 0).values()), rel=0.005)
    if granularity != "full" or num_layers == 0:
        return
    # the rebuild of the last checkpointed block (with its 16-bit weight copies, and the
    # gradients its backward holds): what is left is weight-sized and not modelled (a weight's
    # gradient in flight; under bf16 also its 16-bit gradient and the fused q/k/v's fp32
    # concatenated weight), 2% of this tiny model's peak in fp32 and 5% in bf16, far less at
    # training sizes where a block's weights are small against its activations
    tolerance = 0.03 if precision == "32" else 0.06
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


@pytest.fixture(scope="module")
def one_rank_mesh():
    """A CPU device mesh over a gloo group of one: FSDP2 still gathers each block into unsharded
    parameters in its param_dtype, as over any shard group."""

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def run_norms_as_cuda_autocast_does(model) -> None:
    """CUDA's autocast runs layer_norm and rms_norm in fp32 (AT_FORALL_FP32 in ATen's
    autocast_mode.h): a bf16 input is cast up and that fp32 copy is what the norm saves. CPU's
    autocast leaves them in the input's dtype, so each norm here does the cast itself."""
    import torch.nn.functional as F

    def fp32_forward(norm):
        def forward(x):
            if not torch.is_autocast_enabled("cpu"):
                return type(norm).forward(norm, x)
            bias = getattr(norm, "bias", None)
            with torch.autocast("cpu", enabled=False):
                if isinstance(norm, torch.nn.RMSNorm):
                    return F.rms_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.eps)
                bias = None if bias is None else bias.float()
                return F.layer_norm(x.float(), norm.normalized_shape, norm.weight.float(), bias, norm.eps)

        return forward

    for module in model.modules():
        if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
            module.forward = fp32_forward(module)


def fsdp_activation_trace(
    work: Workload, batch: int, mode: tuple, mesh=None, cuda_norms: bool = True
) -> tuple[int, int]:
    """(bytes saved at the end of the forward, peak bytes from the rebuild of the last checkpointed
    block on) of gptrain's model under activation checkpointing and FSDP2 (as gptrain.parallel
    applies them; without a mesh, replicated), counting the storages ops make whose leading size is the micro batch's or its
    token count: activations and their gradients, no parameter, gathered copy or weight gradient
    (none of this model's sizes is 5 or 320)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from gptrain.models.gpt import GPT
    from gptrain.parallel.activation_checkpoint import apply_ac
    from gptrain.parallel.data_parallel import apply_fsdp, mixed_precision_policy

    granularity, method, num_layers = mode
    torch.manual_seed(0)
    model = GPT(work.padded(1))
    model.init_weights(torch.Generator().manual_seed(0))
    if cuda_norms:
        run_norms_as_cuda_autocast_does(model)
    apply_ac(model.train(), granularity, method, num_layers)
    if mesh is not None:
        apply_fsdp(model, mesh, mixed_precision_policy(work.precision), reshard=True)
    seq = work.model.seq_length
    tokens = torch.randint(0, work.vocab_size, (batch, seq))
    made: dict[int, tuple[StorageWeakRef, int]] = {}
    trace: list[list[int]] = []

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] in (batch, batch * seq):
                    made.setdefault(
                        t.untyped_storage()._cdata, (StorageWeakRef(t.untyped_storage()), t.nbytes)
                    )
            trace.append([k for k, (ref, _) in made.items() if not ref.expired()])
            return out

    rebuilding: list[int] = []

    def mark_rebuild(_module, args) -> None:  # the last checkpointed block's output gets its gradient
        args[0].register_hook(lambda _grad: rebuilding.append(len(trace)))

    layers = list(model.layers.values())
    checkpointed = len(layers) if method != "block" else num_layers
    after = layers[checkpointed] if granularity == "full" and checkpointed < len(layers) else model.norm
    after.register_forward_pre_hook(mark_rebuild)
    dtype = torch.bfloat16 if work.bf16 else torch.float16
    with Track():
        with torch.autocast("cpu", dtype=dtype):
            logits = model(tokens)
            output = logits.untyped_storage()._cdata
            saved = sum(n for k, (ref, n) in made.items() if not ref.expired() and k != output)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        del logits
        loss.backward()
    return saved, max(sum(made[k][1] for k in live) for live in trace[rebuilding[0] :])


@pytest.mark.parametrize(
    ("precision", "mode", "activation"),
    [
        *[(p, m, "gelu") for p in ("bf16", "16") for m in [*FULL[:3], SELECTIVE, (None, None, None)]],
        *[("bf16", m, "swiglu") for m in FULL[:3]],
        ("16", FULL[0], "swiglu"),
    ],
)
def test_fsdp_keeps_the_residual_stream_in_its_param_dtype(
    one_rank_mesh, precision: str, mode: tuple, activation: str
) -> None:
    """FSDP2 with bf16 gathers the embedding in bf16, so the residual stream is bf16: a checkpointed
    block keeps 2 bytes a value of its input, not 4, and its rebuild holds its first norm's own fp32
    cast (not the stored input) and a bf16 residual gradient. The estimate counted the fp32 stream
    of replicated training (here 61,440 bytes too many for 3 checkpointed blocks of 320 tokens,
    h = 32). fp16 gathers the fp32 parameters: its stream stays fp32 and its estimate the same as
    without FSDP. Measured exactly (CUDA's autocast policy for the norms; no dropout). SwiGLU's
    rebuild peaks in the backward of silu(gate) * up, which holds the gradients of both (see
    the test below)."""
    work = dataclasses.replace(
        workload(precision, activation=activation), device_type="cuda", global_batch_size=20
    )
    fields = recompute_fields(mode, 5)
    layout = Layout(dp=2, sharding="full_shard", dp_shard=2, **fields)
    saved, rebuild = fsdp_activation_trace(work, 5, mode, one_rank_mesh)
    assert saved == sum(activation_bytes(work, layout, 0).values())
    if precision == "16":
        assert activation_bytes(work, layout, 0) == activation_bytes(work, Layout(**fields), 0)
        assert rebuild_bytes(work, layout, 0) == rebuild_bytes(work, Layout(**fields), 0)
    if fields["recompute"] == "full":
        assert rebuild == rebuild_bytes(work, layout, 0)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("precision", ["bf16", "16"])
@pytest.mark.parametrize("mode", FULL[:3])
def test_a_rebuilt_block_casts_the_fp32_residual_gradient_for_its_down_projection(
    precision: str, mode: tuple, activation: str
) -> None:
    """Replicated mixed precision: the residual stream is fp32 and the down projection's output
    16-bit, so the add's backward makes a 16-bit copy of the residual gradient (2 bytes a value)
    beside the fp32 one while the projection's backward runs; the estimate left it out (20,480
    bytes here, 320 tokens of h = 32). Activations only, exactly (CUDA's norm policy, no dropout).
    SwiGLU: once the down projection's backward has freed that copy and its own saved input, the
    backward of silu(gate) * up holds the gradient of its output and of both its inputs, one
    ffn-wide gradient more than the estimate counted (61,440 bytes here at ffn 128; under FSDP
    with bf16 81,920)."""
    work = dataclasses.replace(
        workload(precision, activation=activation), device_type="cuda", global_batch_size=5
    )
    layout = Layout(**recompute_fields(mode, 5))
    saved, rebuild = fsdp_activation_trace(work, 5, mode)
    assert saved == sum(activation_bytes(work, layout, 0).values())
    assert rebuild == rebuild_bytes(work, layout, 0)


@pytest.mark.parametrize("precision", ["bf16", "16"])
def test_a_pipeline_chunk_under_fsdp_keeps_its_output_in_the_streams_dtype(
    one_rank_mesh, precision: str
) -> None:
    """torch's PipelineStage keeps each chunk's output until its gradient returns: a block's output,
    bf16 under FSDP with bf16 (half what the estimate counted), fp32 under fp16. The first of
    pp 2 ranks holds 2 micro batches' in 1F1B; the block's output is measured."""
    from gptrain.models.gpt import GPT
    from gptrain.parallel.data_parallel import apply_fsdp, mixed_precision_policy

    work = dataclasses.replace(workload(precision, num_layers=2), global_batch_size=40)
    model = GPT(work.padded(1))
    model.init_weights(torch.Generator().manual_seed(0))
    apply_fsdp(model, one_rank_mesh, mixed_precision_policy(precision), reshard=True)
    outputs = []
    model.layers["0"].register_forward_hook(
        lambda _m, _args, out: outputs.append(out.untyped_storage().nbytes())
    )
    with torch.autocast("cpu", dtype=torch.bfloat16 if work.bf16 else torch.float16):
        model(torch.randint(0, work.vocab_size, (5, work.model.seq_length)))
    layout = Layout(pp=2, dp=2, sharding="full_shard", dp_shard=2, micro_batch_size=5)
    assert activation_bytes(work, layout, 0)["stage_outputs"] == 2 * outputs[0]


def test_the_embedding_dropout_under_fsdp_with_bf16_keeps_bf16_noise_on_cpu(one_rank_mesh) -> None:
    """On CPU dropout keeps its scaled noise, in its input's dtype: the embedding's output, bf16
    under FSDP with bf16 (its weight gathered in bf16), where the estimate counted fp32."""
    from gptrain.models.gpt import GPT
    from gptrain.parallel.data_parallel import apply_fsdp, mixed_precision_policy

    work = dataclasses.replace(workload("bf16", hidden_dropout=0.1), global_batch_size=10)
    model = GPT(work.padded(1))
    model.init_weights(torch.Generator().manual_seed(0))
    apply_fsdp(model.train(), one_rank_mesh, mixed_precision_policy("bf16"), reshard=True)
    inside, saved = [], {}
    model.embedding_dropout.register_forward_pre_hook(lambda _m, _args: inside.append(True))
    model.embedding_dropout.register_forward_hook(lambda _m, _args, _out: inside.clear())

    def pack(t):
        if inside:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        model(torch.randint(0, work.vocab_size, (5, work.model.seq_length)))
    layout = Layout(dp=2, sharding="full_shard", dp_shard=2, micro_batch_size=5)
    assert activation_bytes(work, layout, 0)["embedding"] == sum(saved.values()) == 2 * 32 * 320


@pytest.mark.parametrize("normalization", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("mode", [FULL[0], (None, None, None)])
def test_fsdp_with_bf16_on_cpu_normalises_the_bf16_stream_in_bf16(
    one_rank_mesh, mode: tuple, dropout: float, normalization: str
) -> None:
    """CPU's autocast leaves layer_norm alone (CUDA's runs it in fp32): under FSDP with bf16 each
    norm keeps its bf16 input and bf16 mean and rstd, and its bf16 output feeds every linear as it
    is, with no cast. The estimate counted CUDA's fp32 inputs and one cast per linear: 27% over
    the measured saved bytes here without recompute (451,840 against 356,480). RMSNorm, which
    autocast also leaves alone, runs torch.rms_norm's composite on CPU: it keeps its fp32 cast of
    the bf16 input, fp32 rstd and fp32 product, 8h + 4 bytes a token, and the rebuild does not
    share the stored bf16 input; the estimate counted LayerNorm's 2h + 2 (1,043,840 against
    1,478,400 without recompute, a rebuild of 477,440 against 622,080)."""
    work = dataclasses.replace(
        workload("bf16", hidden_dropout=dropout, normalization=normalization),
        device_type="cpu",
        global_batch_size=20,
    )
    granularity, _, _ = mode
    layout = Layout(dp=2, sharding="full_shard", dp_shard=2, micro_batch_size=5, recompute=granularity)
    torch.manual_seed(0)
    saved, rebuild = fsdp_activation_trace(work, 5, mode, one_rank_mesh, cuda_norms=False)
    assert saved == sum(activation_bytes(work, layout, 0).values())
    if granularity == "full":
        assert rebuild == rebuild_bytes(work, layout, 0)


@pytest.mark.parametrize("mode", [FULL[0], (None, None, None)])
def test_rmsnorm_on_cpu_keeps_its_input_rstd_and_product_from_the_fp32_stream(mode: tuple) -> None:
    """Replicated bf16 on CPU: each RMSNorm keeps the fp32 stream, its fp32 rstd and also its fp32
    normalised product (torch.rms_norm's composite), 8h + 4 bytes a token where the estimate
    counted 4h + 4 (1,191,680 against the measured 1,478,400 without recompute)."""
    work = dataclasses.replace(workload("bf16", normalization="rmsnorm"), global_batch_size=5)
    granularity, _, _ = mode
    layout = Layout(micro_batch_size=5, recompute=granularity)
    torch.manual_seed(0)
    saved, rebuild = fsdp_activation_trace(work, 5, mode, cuda_norms=False)
    assert saved == sum(activation_bytes(work, layout, 0).values())
    if granularity == "full":
        assert rebuild == rebuild_bytes(work, layout, 0)
