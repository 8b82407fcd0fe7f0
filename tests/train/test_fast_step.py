"""The fast path on CPU: the compiled whole-step loss against the eager float64 reference, the compile
scope of each layout, FP8 conversion and its refusal off-GPU, one device wait per step."""

import contextlib
import subprocess
import sys

import pytest
import torch
import torch._inductor.config

from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.parallel.compile import BLOCKS, BLOCKS_AND_LOSS, WHOLE, compile_scope, compiled_loss_fn
from gptrain.parallel.mesh import ParallelDims
from gptrain.train.builders import build_model
from gptrain.train.loss_scale import ConstantLossScaler
from gptrain.train.step import StepOptions, masked_lm_loss, read_on_host, train_step

CPU = torch.device("cpu")


def tiny(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    config = GPTConfig(vocab_size=64, seq_length=16, num_layers=2, hidden_size=32, num_attention_heads=4,
                       hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip
    return build_model(config, CPU, seed=7).to(dtype)


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    tokens = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(3, 16)
    mask[:, :3] = 0  # a masked prefix: ignored tokens must not count
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask}


def loss_and_grads(model: torch.nn.Module, loss_fn, b: dict) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, b)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@contextlib.contextmanager
def float64_compiled_attention():
    """Inductor before torch 2.13 (seen on 2.11) gives the float64 CPU flash-attention backward a
    float32 buffer ("expected scalar type Double but found Float"); there the float64 comparison runs
    SDPA's math backend, without the FX graph cache (its key does not include the backend)."""
    if torch_version() >= (2, 13):
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch._inductor.config.patch(fx_graph_cache=False), sdpa_kernel(SDPBackend.MATH):
        yield


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.slow
def test_compiled_whole_loss_equals_eager_float64_reference():
    model, b = tiny(), batch()
    ref_loss, ref_grads = loss_and_grads(model, masked_lm_loss, b)
    with float64_compiled_attention():
        loss, grads = loss_and_grads(model, compiled_loss_fn(WHOLE), b)
    # Same float64 arithmetic in another order (fused kernels): agreement to ~1e-14; 1e-10 leaves margin.
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-12)
    # float32 compiled vs the float64 reference: a few hundred fp32 roundings of 6e-8 each -> < 1e-5.
    model32 = tiny(torch.float32)
    loss32, _ = loss_and_grads(model32, compiled_loss_fn(WHOLE), b)
    assert loss32 == pytest.approx(ref_loss, rel=1e-5)


@pytest.mark.slow
def test_compiled_loss_on_logits_equals_eager_float64_reference():
    model, b = tiny(), batch(1)
    ref_loss, ref_grads = loss_and_grads(model, masked_lm_loss, b)
    loss, grads = loss_and_grads(model, compiled_loss_fn(BLOCKS_AND_LOSS), b)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-12)


def test_masked_loss_ignores_masked_tokens_even_if_their_logits_are_not_finite():
    model, b = tiny(), batch()

    def poisoned(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens)
        return logits.index_put(
            (torch.tensor([0]), torch.tensor([0])), torch.tensor(float("inf"), dtype=logits.dtype)
        )

    loss = masked_lm_loss(poisoned, b)  # position 0 is masked in every sample
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "dims, scope",
    [
        (ParallelDims(world_size=1), WHOLE),
        (ParallelDims(world_size=2), WHOLE),  # DDP
        (ParallelDims(world_size=2, dp_shard=2), BLOCKS_AND_LOSS),  # FSDP2
        (ParallelDims(world_size=2, tp=2), BLOCKS),
        (ParallelDims(world_size=2, pp=2), BLOCKS),
    ],
)
def test_compile_scope_per_layout(dims, scope):
    assert compile_scope(dims) == scope


def test_fp8_is_a_one_line_error_off_gpu():
    from gptrain.parallel.float8 import check_fp8_device

    with pytest.raises(
        ConfigError, match=r"model.fp8=true needs a CUDA GPU .*: set model.fp8=false"
    ) as error:
        check_fp8_device(CPU)
    assert "\n" not in str(error.value)


def test_fp8_converts_block_linears_but_not_the_output():
    pytest.importorskip("torchao")
    from gptrain.parallel.float8 import apply_fp8

    model = tiny(torch.float32)
    apply_fp8(model, "rowwise")
    converted = {name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"}
    assert "layers.0.attention.wq" in converted and "layers.1.mlp.w2" in converted
    assert "output" not in converted
    assert {name for name, _ in model.named_parameters()} == {name for name, _ in tiny().named_parameters()}


IMPORT_THEN_WARN = """
import logging
from gptrain.utils.quiet_imports import import_torchao_quietly
import_torchao_quietly()
import torchao.float8
logging.getLogger("torchao").warning("a torchao warning after the import")
"""


def test_torchao_imports_without_its_extension_warnings_and_later_warnings_still_show():
    """torchao's start-up lines about compiled extensions it cannot load (every one on a CPU torch)
    stay out of the training log; the loggers' levels are back afterwards."""
    pytest.importorskip("torchao")
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_THEN_WARN], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Failed to load" not in done.stderr
    assert "register_constant" not in done.stderr
    assert "a torchao warning after the import" in done.stderr


@pytest.mark.parametrize(
    ("name", "in_features", "out_features", "tp", "converted"),
    [
        ("wq", 64, 64, 1, True),
        ("wq", 64, 48, 1, True),
        ("wq", 64, 48, 2, False),  # this rank's 24 output columns are no FP8 tile
        ("wq", 64, 64, 2, True),
        ("wo", 48, 64, 2, False),  # split by input rows: 24 each
        ("w2", 128, 64, 4, True),
        ("w1", 64, 40, 1, False),
        ("output", 64, 64, 1, False),
    ],
)
def test_fp8_filter_takes_this_ranks_shard(name, in_features, out_features, tp, converted):
    """FP8 GEMMs need multiples of 16 in the shard each rank multiplies, not in the whole matrix."""
    from gptrain.parallel.float8 import fp8_linear_filter

    linear = torch.nn.Linear(in_features, out_features, bias=False)
    assert fp8_linear_filter(linear, f"layers.0.attention.{name}", tp) is converted


def test_one_device_wait_per_step(monkeypatch):
    """train_step reads loss, tokens and grad norm in one transfer (the reference loop waits once too)."""
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(self.shape) or real(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("train_step must not call .item()"))
    model = tiny(torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = train_step(
        model, optimizer, [batch(), batch(2)], ConstantLossScaler(), CPU, StepOptions(clip_grad=1.0)
    )
    assert calls == [torch.Size([3])] and result.updated and result.tokens == 2 * 3 * 13


def test_read_on_host_mixes_numbers_and_tensors():
    assert read_on_host(1.5, torch.tensor(2.0), 3) == [1.5, 2.0, 3.0]
    assert read_on_host(1, 2) == [1.0, 2.0]
