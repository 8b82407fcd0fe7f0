"""The random streams a checkpoint carries, and their restore on a machine that sees other GPUs."""

from __future__ import annotations

import random

import numpy as np
import torch

from gptrain.train import state as state_module
from gptrain.train.state import rng_state, set_rng_state


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_restored_streams_repeat_the_same_draws():
    saved = rng_state()
    first = draws()
    set_rng_state(saved)
    assert draws() == first


class FakeCuda:
    """torch.cuda's RNG calls for a process that sees `visible` GPUs and uses `current`."""

    def __init__(self, visible: int, current: int) -> None:
        self.visible, self.current, self.set_to = visible, current, None

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return self.current

    def get_rng_state(self) -> torch.Tensor:
        return torch.full((4,), self.current, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.set_to = int(state[0])


def test_cuda_stream_is_the_ranks_own_device_and_restores_where_fewer_gpus_are_visible(monkeypatch):
    torchrun_rank_3 = FakeCuda(visible=8, current=3)
    monkeypatch.setattr(state_module.torch, "cuda", torchrun_rank_3)
    saved = rng_state()
    assert int(saved["cuda"][0]) == 3  # one state, the rank's device's

    srun_one_gpu_per_task = FakeCuda(visible=1, current=0)
    monkeypatch.setattr(state_module.torch, "cuda", srun_one_gpu_per_task)
    set_rng_state(saved)
    assert srun_one_gpu_per_task.set_to == 3

    older = {**saved, "cuda": [torch.full((4,), device, dtype=torch.uint8) for device in range(8)]}
    set_rng_state(older)  # a checkpoint of before: one state per visible GPU, by index
    assert srun_one_gpu_per_task.set_to == 0
