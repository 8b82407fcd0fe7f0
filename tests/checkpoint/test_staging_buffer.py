"""The host buffers async saves copy a state into (pinned on CUDA; unpinned here)."""

from pathlib import Path

import gloo_ranks
import pytest
import torch
from torch.distributed._state_dict_utils import _copy_state_dict

from gptrain.checkpoint.staging_buffer import host_buffer_like

WORKER = Path(__file__).with_name("staging_buffer_worker.py")


def test_host_buffer_is_shaped_like_the_state_and_takes_its_values():
    weights = torch.randn(5, 3, dtype=torch.float64)
    state = {
        "model": {"w": weights.t(), "half": torch.randn(4, dtype=torch.bfloat16)},  # a transposed view too
        "optimizer": {"state": {0: {"step": torch.tensor(12.0), "exp_avg": torch.zeros(0, 2)}}},
        "ids": [torch.arange(3), (torch.ones(2, dtype=torch.int8), "name")],
        "iteration": 7,
    }
    buffer = host_buffer_like(state, pin_memory=False)
    copy = _copy_state_dict(state, buffer)  # what torch's stager does with a buffer it keeps
    assert isinstance(buffer["ids"][1], tuple) and buffer["ids"][1][1] == "name" and buffer["iteration"] == 7
    pairs = [
        (state["model"]["w"], buffer["model"]["w"]),
        (state["model"]["half"], buffer["model"]["half"]),
        (state["optimizer"]["state"][0]["step"], buffer["optimizer"]["state"][0]["step"]),
        (state["optimizer"]["state"][0]["exp_avg"], buffer["optimizer"]["state"][0]["exp_avg"]),
        (state["ids"][0], buffer["ids"][0]),
        (state["ids"][1][0], buffer["ids"][1][0]),
    ]
    for source, staged in pairs:
        assert staged.device.type == "cpu" and staged.dtype == source.dtype and staged.shape == source.shape
        assert torch.equal(staged, source)
        assert source.numel() == 0 or staged.data_ptr() != source.data_ptr()  # its own memory
    weights.fill_(3.0)  # the source changes after the copy: the buffer keeps the save's values
    assert not torch.equal(buffer["model"]["w"], state["model"]["w"])
    assert copy["model"]["w"] is buffer["model"]["w"]


def test_a_namedtuple_in_the_state_is_staged_as_a_tuple_as_torch_stages_it():
    """type(state)(generator) raised TypeError for a namedtuple (review I); torch's own allocator
    gives a plain tuple, which its copy into the buffer walks the same way."""
    from collections import namedtuple

    from torch.distributed._state_dict_utils import _create_cpu_state_dict

    Pair = namedtuple("Pair", "a b")
    state = {"pair": Pair(torch.ones(2), torch.zeros(3))}
    buffer = host_buffer_like(state, pin_memory=False)
    reference = _create_cpu_state_dict(state)
    assert type(buffer["pair"]) is type(reference["pair"]) is tuple
    _copy_state_dict(state, buffer)
    assert torch.equal(buffer["pair"][0], torch.ones(2)) and torch.equal(buffer["pair"][1], torch.zeros(3))


@pytest.mark.distributed
def test_a_sharded_state_is_staged_ahead_and_saved_through_its_host_twin(tmp_path):
    """A DTensor's host buffer takes the shard's spec without copying the shard, so FSDP2 and TP
    states are prepared in the background too; the save through it loads back exactly."""
    gloo_ranks.run_ranks(WORKER, tmp_path / "checkpoints")
    assert (tmp_path / "checkpoints" / "step_5" / "COMPLETE").is_file()
