"""A checkpoint root that is not one directory for every rank (node-local storage, such as /tmp or a
DGX's /raid, under the same path on each node) is refused at the first save, in one line on every
rank. Before, rank 0 listed only its own node's files and marked a checkpoint of half the shards
COMPLETE ("saved checkpoint step_2"); the resume then called every checkpoint damaged, or, requeued
onto other nodes, found none and started over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from reliability_helpers import finish_ranks, free_port, subprocess_env, train_args

from gptrain.checkpoint.integrity import COMPLETE

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def start_ranks_on_own_disks(base: Path) -> list[subprocess.Popen]:
    """Two gloo ranks of a tiny run, each writing its run directory on its own "node" (its own path
    here: what node-local storage under one path is to the ranks)."""
    port, processes = free_port(), []
    for rank in range(2):
        env = subprocess_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        args = [sys.executable, "-m", "gptrain", *train_args(base / f"node{rank}", "trainer.devices=2")]
        processes.append(
            subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return processes


@pytest.mark.distributed
def test_a_checkpoint_directory_each_node_has_its_own_of_is_refused_at_the_first_save(tmp_path):
    ranks = start_ranks_on_own_disks(tmp_path)
    outputs = finish_ranks(ranks)
    codes = [rank.returncode for rank in ranks]
    assert codes == [2, 2], [err[-2000:] for _, err in outputs]
    step_2 = tmp_path / "node0" / "checkpoints" / "step_2"
    for _, err in outputs:
        assert "Traceback" not in err, err[-3000:]
        line = next(x for x in err.splitlines() if "was not marked complete" in x)
        assert line.startswith(
            f"gptrain: error: checkpoint {step_2} was not marked complete: rank 0 cannot see"
        )
        assert "every node mounts" in line and ".checksums.rank1.json" in line
    assert not list(tmp_path.glob(f"node*/checkpoints/step_*/{COMPLETE}"))
    assert not list(tmp_path.glob("node*/checkpoints/latest"))
