"""The random streams a checkpoint carries, and their restore on a machine that sees other GPUs."""

from __future__ import annotations

import random

import numpy as np
import torch

from gptrain.train import state as state_module
from gptrain.train.state import rank_state, restore_rng_state, rng_state, set_rng_state


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

    def is_initialized(self) -> bool:  # a CUDA run: its model is on the GPU
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


def layout(world_size: int, tp: int = 1, pp: int = 1, sequence_parallel: bool = False) -> dict:
    return {
        "world_size": world_size,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "sequence_parallel": sequence_parallel,
    }


def test_a_ranks_streams_are_restored_only_under_the_layout_that_saved_them():
    """Rank r reads rank r's file: under another layout that is another stage's or tensor rank's
    stream, and tensor ranks sharing one (no SP) could get different ones."""
    tp2 = layout(2, tp=2)
    saved = rank_state(tp2)
    first = draws()
    lines: list[str] = []
    assert restore_rng_state(saved, tp2, lines.append) and draws() == first and lines == []

    pp2 = layout(2, pp=2)
    assert not restore_rng_state(saved, pp2, lines.append)
    assert draws() != first  # the streams this run has were kept
    assert lines == [
        "random streams not restored: saved under 2 ranks, TP 2, PP 1, sequence parallel off, this run "
        "has 2 ranks, TP 1, PP 2, sequence parallel off; dropout draws from the streams seeded for this layout"
    ]
    assert not restore_rng_state({"rng": saved["rng"]}, pp2, lines.append)  # older file: layout unknown
    assert "saved under a layout it did not record" in lines[-1]
    assert not restore_rng_state({}, tp2, lines.append)  # no streams saved (an import)


def test_one_process_restores_whatever_rank_0_saved():
    """No peers to keep in step with: a TP x PP run resumed in one process continues rank 0's stream."""
    saved = {"rng": rng_state()}  # a file from before the layout was recorded
    first = draws()
    assert restore_rng_state(saved, layout(1), print) and draws() == first
    saved = rank_state(layout(4, tp=2, pp=2, sequence_parallel=True))
    first = draws()
    assert restore_rng_state(saved, layout(1), print) and draws() == first
