"""A save's hang allowance is the largest rank's: every rank waits in the save's collectives for the
slowest writer, and a rank holding less ended a save a larger rank was still writing within its own
allowance (review X4)."""

import json
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks

from gptrain.train.saving import SAVE_BYTES_PER_SECOND, save_allowance_s, state_bytes

WORKER = Path(__file__).with_name("save_allowance_worker.py")
ELEMENTS = 2_000_000


def test_a_states_bytes_are_every_tensor_it_holds_at_its_own_width():
    state = {
        "model": {"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)},
        "optimizer": {"state": [torch.zeros(7, dtype=torch.float64), (torch.zeros(2, dtype=torch.int8),)]},
        "step": 12,
        "name": "adam",
    }
    assert state_bytes(state) == 12 * 4 + 5 * 2 + 7 * 8 + 2 * 1


@pytest.mark.distributed
def test_every_rank_gets_the_allowance_of_the_largest_ranks_state_from_one_collective(tmp_path):
    run_ranks(WORKER, tmp_path)
    ranks = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    assert [r["bytes"] for r in ranks] == [(rank + 1) * ELEMENTS * 12 for rank in range(2)]
    largest = 2 * ELEMENTS * 12
    expected = largest / SAVE_BYTES_PER_SECOND  # 1.92 s, above the 0.3 s floor of a 0.001 min timeout
    assert save_allowance_s(0.001, largest) == pytest.approx(expected)
    assert ranks[0]["allowances"] == ranks[1]["allowances"] == [pytest.approx(expected)] * 3
    assert [r["collectives"] for r in ranks] == [1, 1]  # at the first save only: none per save after it
