"""Every process group gptrain makes waits as long as the default group: torch gives a group made
later its own default (30 minutes for gloo, 10 for NCCL), which would end a slow or hung collective
before the hang watchdog names the rank it waits for (docs/reliability.md, Hung rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

WORKER = Path(__file__).with_name("group_timeout_worker.py")


def test_every_group_gptrain_makes_has_the_default_groups_timeout(tmp_path: Path) -> None:
    minutes = 65.0  # collective_timeout_minutes at the default trainer.hang_timeout_minutes (10)
    run_ranks(WORKER, minutes, tmp_path, world=4, timeout_s=240)
    by_rank = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)]
    for rank, groups in enumerate(by_rank):
        wrong = {label: g["timeout_s"] for label, g in groups.items() if g["timeout_s"] != minutes * 60}
        assert wrong == {}, f"rank {rank}: groups not at {minutes * 60:.0f} s: {wrong}"
    # the groups are still the layout's: rank 0's, and rank 3's on the other side of every dimension
    zero, three = by_rank[0], by_rank[3]
    assert [zero[f"tp2/{d}"]["ranks"] for d in ("pp", "dp", "tp")] == [[0], [0, 2], [0, 1]]
    assert [three[f"tp2/{d}"]["ranks"] for d in ("pp", "dp", "tp")] == [[3], [1, 3], [2, 3]]
    hsdp = ("pp", "dp_rep", "dp_shard", "dp", "embedding")
    assert [zero[f"pp2-hsdp/{d}"]["ranks"] for d in hsdp] == [[0, 2], [0, 1], [0], [0, 1], [0, 2]]
    assert [three[f"pp2-hsdp/{d}"]["ranks"] for d in hsdp] == [[1, 3], [2, 3], [3], [2, 3], [1, 3]]
    assert zero["dp4/dp"]["ranks"] == [0, 1, 2, 3]
    assert zero["background_save"]["ranks"] == [0, 1, 2, 3] and not zero["background_save"]["default"]
    # a dimension spanning the world stays the default group (no second set of connections), where
    # torch does not make one of its own (a gloo default group where CUDA is available)
    assert zero["dp4/dp"]["default"] is not torch.cuda.is_available()
