"""Training on a CUDA GPU: precisions with exact resume, compiled vs eager loss, FP8, async checkpoints.

Marked `gpu` and skipped where no CUDA device is visible (CI); run on a GPU machine with
`python -m pytest -m gpu tests/gpu`.
"""

import math
import sys
from pathlib import Path

import gloo_ranks
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_e2e_helpers import (  # noqa: E402
    MOCK,
    RUN_AHEAD_SHAPE,
    RUNS_AHEAD_AFTER,
    record_runs_ahead,
    run_recording,
    tiny_config,
)

from gptrain.checkpoint.directory import newest_complete  # noqa: E402
from gptrain.checkpoint.integrity import complete_steps  # noqa: E402
from gptrain.checkpoint.manager import CheckpointManager  # noqa: E402
from gptrain.config import load_training_config  # noqa: E402
from gptrain.errors import EXIT_REQUEUE  # noqa: E402
from gptrain.models.config import GPTConfig  # noqa: E402
from gptrain.parallel.compile import compiled_loss_fn  # noqa: E402
from gptrain.train.builders import build_model  # noqa: E402
from gptrain.train.step import masked_lm_loss  # noqa: E402

STAGING_WORKER = Path(__file__).resolve().parents[1] / "checkpoint" / "staging_buffer_worker.py"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GPU = [
    "trainer.accelerator=gpu",
    "model.hidden_size=64",
    "model.encoder_seq_length=64",
    "model.data.mock_vocab_size=256",
]


def has_fp8() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def record_float8_linears(monkeypatch) -> list[int]:
    """The number of Float8Linear modules in each model chunk `apply_fp8` converted, as runs build them."""
    from gptrain.parallel import parallelize
    from gptrain.parallel.float8 import is_float8_linear

    counts: list[int] = []
    real = parallelize.apply_fp8

    def counting(part, *args, **kwargs):
        converted = real(part, *args, **kwargs)
        counts.append(sum(is_float8_linear(module) for module in part.modules()))
        return converted

    monkeypatch.setattr(parallelize, "apply_fp8", counting)
    return counts


@pytest.mark.parametrize("precision", ["bf16", "16"])
@pytest.mark.parametrize("compile_model", ["false", "true"])
def test_resume_is_exact_on_gpu(tmp_path, monkeypatch, precision, compile_model):
    extra = [*MOCK, *GPU, f"trainer.precision={precision}", f"model.compile={compile_model}"]
    code, full = run_recording(monkeypatch, tiny_config(tmp_path / "full", *extra))
    assert code == 0 and all(math.isfinite(v) for v in full.values())
    code, first = run_recording(monkeypatch, tiny_config(tmp_path / "split", *extra), signal_at=3)
    assert code == EXIT_REQUEUE
    code, second = run_recording(monkeypatch, tiny_config(tmp_path / "split", *extra))
    assert code == 0
    # The same kernels on the same device in the same order: bit for bit.
    assert {**first, **second} == full


@pytest.mark.parametrize("compile_model", ["false", "true"])
def test_running_ahead_is_the_same_run_on_gpu(tmp_path, monkeypatch, compile_model):
    """trainer.run_ahead with the GPU's fused AdamW: the next step queued before the read (copied
    to pinned memory behind an event) gives the same losses as step by step, and a stop that comes
    while a step is queued ahead resumes exactly."""
    ahead = record_runs_ahead(monkeypatch.setattr)
    extra = [*MOCK, *GPU, *RUN_AHEAD_SHAPE, "trainer.precision=bf16", f"model.compile={compile_model}"]
    behind = run_recording(monkeypatch, tiny_config(tmp_path / "behind", *extra, "trainer.run_ahead=false"))
    assert ahead == [] and behind[0] == 0
    code, full = run_recording(monkeypatch, tiny_config(tmp_path / "ahead", *extra))
    assert ahead == RUNS_AHEAD_AFTER and (code, full) == behind
    code, first = run_recording(monkeypatch, tiny_config(tmp_path / "split", *extra), signal_at=2)
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]  # step 3 was queued: it finished
    code, second = run_recording(monkeypatch, tiny_config(tmp_path / "split", *extra))
    assert code == 0 and {**first, **second} == full


def test_compiled_loss_matches_eager_within_bf16_tolerance():
    config = GPTConfig(vocab_size=512, seq_length=128, num_layers=2, hidden_size=128, num_attention_heads=4,
                       hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip
    model = build_model(config, torch.device("cuda"), seed=3)
    tokens = torch.randint(0, 512, (4, 129), device="cuda")
    batch = {
        "tokens": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "loss_mask": torch.ones(4, 128, device="cuda"),
    }
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = masked_lm_loss(model, batch)
        compiled = compiled_loss_fn("whole")(model, batch)
    # bf16 keeps 8 bits of mantissa: each of the few matmul stages adds ~2^-8 relative error.
    assert compiled.item() == pytest.approx(eager.item(), rel=2e-2)


@pytest.mark.skipif(not has_fp8(), reason="needs FP8 tensor cores (compute capability >= 8.9)")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_training_follows_bf16(tmp_path, monkeypatch, recipe):
    common = [*MOCK, *GPU, "trainer.precision=bf16", "model.compile=true", "model.hidden_dropout=0",
              "model.attention_dropout=0", "trainer.max_steps=8"]  # fmt: skip
    fp8 = ["model.fp8=true", f"model.fp8_recipe={recipe}"]
    converted = record_float8_linears(monkeypatch)
    code, bf16_losses = run_recording(monkeypatch, tiny_config(tmp_path / "bf16", *common))
    assert code == 0 and converted == []
    code, fp8_losses = run_recording(monkeypatch, tiny_config(tmp_path / "fp8", *common, *fp8))
    assert code == 0 and all(math.isfinite(v) for v in fp8_losses.values())
    # FP8 ran: every block linear (2 layers x wq, wk, wv, wo, w1, w2; all multiples of 16) converted
    assert converted == [12]
    # e4m3 keeps 3 mantissa bits, but scaled per tensor/row and accumulated in fp32 the loss
    # of a small model moves by well under 1% (the bar for 300 steps of 126m).
    for step, loss in bf16_losses.items():
        assert fp8_losses[step] == pytest.approx(loss, rel=1e-2), step


def test_async_checkpoint_round_trip_from_gpu(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, async_save=True)
    weights = torch.randn(1024, 1024, device="cuda")
    manager.prepare_staging({"model": {"w": weights}})  # pinned in the background, as the loop does
    manager.wait()  # also waits for the buffer being prepared
    buffer = manager._stager.state_dict_cache
    assert buffer is not None and buffer["model"]["w"].is_pinned()  # before any save
    manager.save(5, {"model": {"w": weights}}, {})
    manager.wait_for_staging()  # the optimizer step waits here before changing the weights
    expected = weights.cpu().clone()
    weights.add_(1.0)
    manager.wait()
    second = {"model": {"w": weights}}
    manager.save(6, second, {}, waited_for=True)  # on CUDA still through the pinned buffer, reused
    assert manager.writing and manager._stager.state_dict_cache is buffer
    manager.close()
    assert complete_steps(tmp_path) == [5, 6] and newest_complete(tmp_path) == tmp_path / "step_6"
    target = {"model": {"w": torch.zeros(1024, 1024)}}
    manager.load(tmp_path / "step_5", target, lambda s: None)
    assert torch.equal(target["model"]["w"], expected)


def test_a_sharded_cuda_state_is_staged_in_pinned_host_memory_ahead(tmp_path):
    """The same on one GPU (a one-rank CUDA mesh): pinned twins, prepared ahead, saved and loaded."""
    gloo_ranks.run_ranks(STAGING_WORKER, tmp_path / "checkpoints", "cuda", world=1)
    assert (tmp_path / "checkpoints" / "step_5" / "COMPLETE").is_file()


def test_fp8_refused_on_a_gpu_without_fp8(monkeypatch):
    from gptrain.errors import ConfigError
    from gptrain.parallel.float8 import check_fp8_device

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    with pytest.raises(ConfigError, match="compute capability >= 8.9"):
        check_fp8_device(torch.device("cuda"))


def test_gpu_quickstart_preset_uses_the_fast_path():
    cfg = load_training_config("quickstart/gpu", [], report_ignored=False)
    assert cfg.model.compile
