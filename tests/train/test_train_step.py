import copy
import math
from pathlib import Path

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


def test_the_reported_loss_of_a_float64_model_is_summed_in_float64():
    """Before, the micro-batch sums were added in float32: 3.6e-8 off where TP/PP's path was exact."""
    batch = random_batch(8, 6, seed=3, masked=0.4)
    model = TinyLM().double()
    expected = reference_loss(copy.deepcopy(model), batch).item()
    result = train_step(model, sgd(model), split(batch, 4), ConstantLossScaler(), CPU, StepOptions())
    assert result.loss == pytest.approx(expected, rel=1e-13)


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


def fused_adamw(model, eps=1.0):
    """Fused AdamW (as gptrain builds it on CUDA; the CPU has the kernel too). A large eps makes
    the update depend on the gradient's size, so clipping shows in the parameters."""
    return torch.optim.AdamW(model.parameters(), lr=0.1, eps=eps, weight_decay=0.1, fused=True)


def test_fused_adamw_clips_and_steps_on_the_device_like_the_reference_adamw():
    batches = [random_batch(4, 5, seed=seed) for seed in (11, 12, 13)]
    model = TinyLM().double()
    ref = copy.deepcopy(model)
    opt = fused_adamw(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, eps=1.0, weight_decay=0.1, foreach=False)
    clip = None
    for batch in batches:
        ref_opt.zero_grad()
        reference_loss(ref, batch).backward()
        ref_norm = math.sqrt(sum(float((p.grad**2).sum()) for p in ref.parameters()))
        clip = clip or ref_norm / 3  # the first steps are clipped
        factor = min(1.0, clip / (ref_norm + 1e-6))
        for p in ref.parameters():
            p.grad.mul_(factor)
        ref_opt.step()
        result = train_step(model, opt, [batch], ConstantLossScaler(), CPU, StepOptions(clip_grad=clip))
        assert result.updated and result.grad_norm == pytest.approx(ref_norm, rel=1e-6)
    # The fused kernel takes the clip factor as a float32 scalar (as GradScaler's scale): each
    # step's gradients carry its rounding, 2**-24 relative, so float64 agrees to about 1e-7.
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-9)
        assert int(opt.state[p]["step"]) == len(batches)
    assert opt.found_inf is None and opt.grad_scale is None  # nothing left for a later step


def host_clipped_reference() -> tuple[torch.nn.Module, list[float], float]:
    """One process's float64 AdamW over the workers' batches, the clip applied on the host:
    (model after the steps, each step's grad norm, the clip, a third of the first norm)."""
    torch.manual_seed(0)
    ref = TinyLM().double()  # the workers' seed: the same initial weights
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, eps=1.0, weight_decay=0.1, foreach=False)
    norms, clip = [], None
    for seed in (11, 12, 13):
        ref_opt.zero_grad()
        reference_loss(ref, random_batch(4, 5, seed=seed)).backward()
        norms.append(math.sqrt(sum(float((p.grad**2).sum()) for p in ref.parameters())))
        clip = clip or norms[0] / 3  # the first steps are clipped
        for p in ref.parameters():
            p.grad.mul_(min(1.0, clip / (norms[-1] + 1e-6)))
        ref_opt.step()
    return ref, norms, clip


@pytest.fixture(scope="module")
def device_updates(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Both FSDP2 tests' workers in one launch of two gloo ranks: {"fused": ..., "fp8": ... or None}."""
    import importlib.util
    import json

    from gloo_ranks import run_ranks

    out = tmp_path_factory.mktemp("device_update")
    fp8 = [out / "fp8.json"] if importlib.util.find_spec("torchao") else []
    run_ranks(
        Path(__file__).with_name("device_update_worker.py"),
        out / "out.json",
        host_clipped_reference()[2],
        *fp8,
    )
    return {
        "fused": json.loads((out / "out.json").read_text()),
        "fp8": json.loads(fp8[0].read_text()) if fp8 else None,
    }


@pytest.mark.distributed
def test_fused_adamw_steps_fsdp_dtensor_parameters_on_the_device_like_the_reference(device_updates):
    """The device path over FSDP2's DTensor parameters (2 gloo ranks, same batches on both) against
    one process's float64 AdamW with the clip applied on the host: the same norms and weights, to the
    float32 rounding of the clip factor that the fused kernel takes (as the one-process test)."""
    ref, norms, _ = host_clipped_reference()
    got = device_updates["fused"]
    assert got["norms"] == pytest.approx(norms, rel=1e-6)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(
            torch.tensor(got["weights"][name], dtype=torch.float64), p.detach(), rtol=1e-6, atol=1e-9
        )


@pytest.mark.distributed
def test_float8_gathered_fsdp_weights_keep_the_host_decided_update(device_updates):
    """Their post-step scale refresh assumes a skipped step does not step (gptrain.train.step)."""
    pytest.importorskip("torchao")
    got = device_updates["fp8"]
    assert got["device"] is False and got["shards"] != ["Tensor"], got


def test_fused_adamw_skips_a_nonfinite_step_on_the_device():
    batch = random_batch(2, 4, seed=5)
    model = TinyLM().double()
    opt = fused_adamw(model)
    assert train_step(model, opt, [batch], ConstantLossScaler(), CPU, StepOptions(clip_grad=1.0)).updated
    state = {p: {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    before = [p.detach().clone() for p in model.parameters()]
    handle = model.proj.weight.register_hook(lambda g: torch.full_like(g, float("nan")))
    result = train_step(model, opt, [batch], ConstantLossScaler(), CPU, StepOptions(clip_grad=1.0))
    handle.remove()
    assert result.nonfinite and not result.updated and math.isnan(result.grad_norm)
    assert all(p.grad is None for p in model.parameters())
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
        for key, value in state[p].items():
            assert torch.equal(opt.state[p][key], value), key  # moments and step count unchanged


def test_the_host_reads_the_step_after_the_update_is_queued(monkeypatch):
    import gptrain.train.step as step_module

    seen, original = [], step_module.read_on_host
    watched = {}

    def probe(*values):
        seen.append(not torch.equal(watched["param"], watched["before"]))  # already updated?
        return original(*values)

    # the host path's read, and the device path's
    monkeypatch.setattr(step_module, "read_on_host", probe)
    monkeypatch.setattr(step_module.QueuedResult, "read", lambda self: probe(*self.values))
    for model, make_optimizer, updated_before_read in ((TinyLM(), fused_adamw, True), (TinyLM(), sgd, False)):
        watched.update(param=model.proj.weight, before=model.proj.weight.detach().clone())
        opts = StepOptions(clip_grad=1.0)
        train_step(model, make_optimizer(model), [random_batch(2, 4)], ConstantLossScaler(), CPU, opts)
        # fused AdamW: the update was queued before the one host read; SGD: the read decides first
        assert seen.pop() == updated_before_read


def test_a_static_fp16_scale_never_changes_and_an_overflowing_step_leaves_the_weights():
    """Megatron's --loss-scale (model.native_amp_static_scale): the scale neither backs off on an
    overflow nor grows (growth_interval 1 and hysteresis 1 would move a dynamic one at every step).
    float64 weights are left alone by autocast, and scaling by a power of 2 is exact, so each update
    matches an unscaled float64 SGD step up to the summation order: a few ulps of sums of at most
    20 token losses, far inside rtol 1e-12."""
    from gptrain.train.loss_scale import build_loss_scaler

    batch, lr = random_batch(4, 5, seed=6), 0.1
    model = TinyLM().double()
    reference = copy.deepcopy(model)
    scaler = build_loss_scaler("16", 2.0**10, growth_interval=1, hysteresis=1, static=True)
    opts = StepOptions(precision="16")
    for step in range(4):
        before = [p.detach().clone() for p in model.parameters()]
        hook = (
            model.proj.weight.register_hook(lambda g: torch.full_like(g, float("inf"))) if step == 1 else None
        )
        result = train_step(model, sgd(model, lr), split(batch, 2), scaler, CPU, opts)
        if hook is not None:
            hook.remove()
        assert scaler.scale == 2.0**10, step
        if step == 1:
            assert result.overflow and result.nonfinite and not result.updated
            assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
            continue
        assert result.updated and not result.overflow
        reference.zero_grad()
        reference_loss(reference, batch).backward()
        with torch.no_grad():
            for r in reference.parameters():
                r -= lr * r.grad
        for p, r in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-12, atol=1e-14)
