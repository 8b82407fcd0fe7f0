"""The planner's estimate of the run's own layout, at start and when the GPU runs out of memory."""

from __future__ import annotations

import pytest
import torch
from train_e2e_helpers import MOCK, TINY

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.train import step_loop
from gptrain.train.memory_check import GIB, estimate_gib, out_of_memory, start_warning

GPT2_VOCAB = 50257
# The tutorial's NeMo 5b on two 8-GPU nodes (nemo-megatron-on-slurm-aws.md, bmk-pretrain-gpt3-5b2.sh)
TUTORIAL_5B = ["trainer.num_nodes=2", "trainer.devices=8", "trainer.precision=bf16"]


def config(*overrides: str):
    return load_training_config("gpt3/5b", [*TUTORIAL_5B, *overrides], report_ignored=False)


def test_nemos_5b_on_two_nodes_fits_with_its_distributed_optimizer():
    """The preset's distributed_fused_adam means shard_grad_op (AdamW state and gradients sharded, as
    NeMo runs it): it fits where the replicated layout (gptrain's reading of it before) did not."""
    cfg = config()
    assert cfg.model.data_parallel_sharding == "shard_grad_op"
    grad_op, _ = estimate_gib(cfg, GPT2_VOCAB)
    replicated, _ = estimate_gib(cfg, GPT2_VOCAB, "ddp")
    full, _ = estimate_gib(cfg, GPT2_VOCAB, "full_shard")
    assert full < grad_op < 80 < replicated
    assert start_warning(cfg, GPT2_VOCAB, int(80 * GIB)) is None
    assert config("model.optim.name=adamw").model.data_parallel_sharding == "ddp"


def test_a_replicated_5b_on_two_nodes_is_warned_with_the_sharded_figure():
    """Replicated AdamW state (an explicit ddp) does not fit; the warning gives the sharded figure."""
    cfg = config("model.data_parallel_sharding=ddp")
    replicated, _ = estimate_gib(cfg, GPT2_VOCAB)
    sharded, _ = estimate_gib(cfg, GPT2_VOCAB, "full_shard")
    assert sharded < 80 < replicated  # the planner's own figures: does not fit / fits on 80 GiB
    warning = start_warning(cfg, GPT2_VOCAB, int(80 * GIB))
    assert warning is not None and "\n" not in warning
    assert f"estimates {replicated:.1f} GiB per GPU" in warning and "above this GPU's 80.0 GiB" in warning
    assert (
        f"model.data_parallel_sharding=full_shard (sharded weights, gradients and AdamW state) {sharded:.1f} GiB"
        in warning
    )
    assert start_warning(cfg, GPT2_VOCAB, int((replicated + 1) * GIB)) is None
    sharded_cfg = config("model.data_parallel_sharding=full_shard")
    assert start_warning(sharded_cfg, GPT2_VOCAB, int(80 * GIB)) is None


def test_out_of_memory_is_one_line_with_the_estimate():
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nSee documentation")
    message = str(
        out_of_memory(config("model.data_parallel_sharding=ddp"), GPT2_VOCAB, 3, int(80 * GIB), error)
    )
    assert "\n" not in message
    assert message.startswith(
        "out of memory on rank 3 of 80.0 GiB (CUDA out of memory. Tried to allocate 2.00 GiB.)"
    )
    assert "the planner estimates" in message and "full_shard" in message and "gptrain plan" in message


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_out_of_memory_error_during_training_ends_the_run_in_one_line(
    tmp_path, monkeypatch, capsys, wrapped
):
    """Also when wrapped: torch's pipeline schedule re-raises a stage's failure as a RuntimeError."""

    def run_out_of_memory(*args, **kwargs):
        oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB\nmore text")
        if not wrapped:
            raise oom
        try:
            raise oom
        except torch.OutOfMemoryError as error:
            raise RuntimeError("[Stage 1] failed to run backward stage") from error

    monkeypatch.setattr(step_loop, "run", run_out_of_memory)
    assert main(["train", "gpt3/126m", *TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "gptrain: error: out of memory on rank 0 (CUDA out of memory. Tried to allocate 20.00 MiB)"
    )
    assert "the planner estimates" in err and "model.micro_batch_size" in err


@pytest.mark.parametrize(
    "preset",
    ["126m", "400m_improved", "1b_improved", "5b", "7b_improved", "20b", "40b", "40b_improved", "175b"],
)
def test_every_nemo_preset_fits_an_80_gib_gpu_on_its_own_cluster(preset: str) -> None:
    """As shipped (trainer.num_nodes x devices, NeMo's layout, distributed_fused_adam), by the planner.
    Read as replicated AdamW state, 5b, 20b, 40b and 175b needed 122-197 GiB per GPU."""
    cfg = load_training_config(f"gpt3/{preset}", [], report_ignored=False)
    assert cfg.model.data_parallel_sharding == "shard_grad_op"
    estimate, breakdown = estimate_gib(cfg, GPT2_VOCAB)
    assert estimate < 80, breakdown
