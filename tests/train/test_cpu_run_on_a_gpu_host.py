"""A CPU run (trainer.accelerator=cpu, gloo) on a machine with GPUs must leave them alone: pinned
memory, pinned checkpoint staging or reading the CUDA RNG would each create a CUDA context on GPU 0
for every rank (hundreds of MB each, taken from whatever job uses that GPU)."""

from __future__ import annotations

import pytest
import torch

from gptrain.config.loader import load_training_config
from gptrain.parallel.mesh import World
from gptrain.train import state as state_module
from gptrain.train.batches import build_loader
from gptrain.train.builders import build_checkpoint_manager


@pytest.fixture
def gpu_host(monkeypatch):
    """CUDA present but never touched by this process; touching it fails the test."""

    def touched(*args, **kwargs):
        raise AssertionError("a CPU run touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state", touched)


def test_checkpoint_staging_is_pinned_for_a_cuda_run_only(tmp_path, gpu_host):
    world = World(rank=0, world_size=1, local_rank=0, master_addr="localhost", master_port=29500)
    cfg = load_training_config("quickstart/cpu", [f"exp_manager.explicit_log_dir={tmp_path}"])
    assert build_checkpoint_manager(cfg, world, 100, torch.device("cpu")).pinned_staging is False
    assert build_checkpoint_manager(cfg, world, 100, torch.device("cuda", 0)).pinned_staging is True


def test_the_loader_pins_for_a_cuda_run_only():
    samples = [{"tokens": torch.zeros(4, dtype=torch.long)}] * 4
    assert build_loader(samples, 0, 2).pin_memory is False
    assert build_loader(samples, 0, 2, pin_memory=True).pin_memory is True


def test_the_rng_state_of_a_cpu_run_leaves_cuda_alone(gpu_host):
    assert "cuda" not in state_module.rng_state()
