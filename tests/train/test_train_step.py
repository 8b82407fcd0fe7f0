import copy
import math

import pytest
import torch
import torch.nn.functional as F
from train_tiny_lm import TinyLM, random_batch, split

from gptrain.train.loss_scale import ConstantLossScaler, DynamicLossScaler
from gptrain.train.step import StepOptions, masked_lm_loss, train_step

CPU = torch.device("cpu")


def reference_loss(model, batch):
    """Token-weighted mean in float64 over the whole batch at once."""
    logits = model(batch["tokens"]).double()
    losses = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), reduction="none"
    )
    mask = batch["loss_mask"].reshape(-1).double()
    return (losses * mask).sum() / mask.sum()


def sgd(model, lr=0.1):
    return torch.optim.SGD(model.parameters(), lr=lr)


def test_microbatch_accumulation_equals_one_big_batch():
    batch = random_batch(8, 6, seed=1, masked=0.4)  # uneven token counts per micro-batch
    big, small = TinyLM(), TinyLM()
    result_big = train_step(big, sgd(big), [batch], ConstantLossScaler(), CPU, StepOptions())
    result_small = train_step(small, sgd(small), split(batch, 2), ConstantLossScaler(), CPU, StepOptions())
    expected = reference_loss(TinyLM(), batch).item()
    assert result_big.loss == pytest.approx(expected, rel=1e-6)
    assert result_small.loss == pytest.approx(expected, rel=1e-6)
    assert result_small.tokens == int(batch["loss_mask"].sum())
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_grad_norm_and_clipping_against_float64_reference():
    batch = random_batch(4, 5, seed=2)
    model = TinyLM()
    ref = copy.deepcopy(model).double()
    reference_loss(ref, {k: v for k, v in batch.items()}).backward()
    ref_norm = math.sqrt(sum(float((p.grad**2).sum()) for p in ref.parameters()))
    clip = ref_norm / 4
    lr = 0.5
    result = train_step(
        model, sgd(model, lr), [batch], ConstantLossScaler(), CPU, StepOptions(clip_grad=clip)
    )
    assert result.updated and result.grad_norm == pytest.approx(ref_norm, rel=1e-5)
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        expected = r.detach() - lr * r.grad * (clip / (ref_norm + 1e-6))
        torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-6)


def test_fp16_overflow_skips_step_and_backs_off_scale():
    batch = random_batch(2, 4, seed=3)
    model = TinyLM()
    before = [p.detach().clone() for p in model.parameters()]
    scaler = DynamicLossScaler(scale=2.0**10, hysteresis=1, growth_interval=2)
    opts = StepOptions(precision="16")
    handle = model.proj.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    result = train_step(model, sgd(model), [batch], scaler, CPU, opts)
    handle.remove()
    assert result.overflow and not result.updated and not result.nonfinite
    assert math.isfinite(result.loss) and not math.isfinite(result.grad_norm)
    assert scaler.scale == 2.0**9
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
    for _ in range(2):
        assert train_step(model, sgd(model), [batch], scaler, CPU, opts).updated
    assert scaler.scale == 2.0**10  # grew after growth_interval clean steps


def test_fp16_scaled_gradients_are_unscaled_before_the_update():
    batch = random_batch(2, 4, seed=4)
    plain, scaled = TinyLM(), TinyLM()
    r1 = train_step(plain, sgd(plain), [batch], ConstantLossScaler(), CPU, StepOptions())
    r2 = train_step(scaled, sgd(scaled), [batch], DynamicLossScaler(scale=2.0**12), CPU, StepOptions())
    assert r2.grad_norm == pytest.approx(r1.grad_norm, rel=1e-5)
    for a, b in zip(plain.parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_nan_loss_is_skipped_and_flagged():
    batch = random_batch(2, 4, seed=5)
    model = TinyLM()
    with torch.no_grad():
        model.proj.bias[0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, sgd(model), [batch], ConstantLossScaler(), CPU, StepOptions())
    assert result.nonfinite and not result.updated and math.isnan(result.loss)
    assert all(p.grad is None for p in model.parameters())
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.nan_to_num(), b.nan_to_num())


def test_bf16_autocast_runs_and_keeps_fp32_master_weights():
    model = TinyLM()
    result = train_step(
        model, sgd(model), [random_batch(2, 4)], ConstantLossScaler(), CPU, StepOptions("bf16")
    )
    assert result.updated and math.isfinite(result.loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_masked_lm_loss_sums_only_masked_tokens():
    batch = random_batch(2, 3, seed=6, masked=0.5)
    model = TinyLM()
    expected = reference_loss(model, batch) * batch["loss_mask"].sum()
    assert masked_lm_loss(model, batch).item() == pytest.approx(expected.item(), rel=1e-6)
