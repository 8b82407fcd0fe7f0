"""Two gloo ranks resuming checkpoints that are damaged for one of them only."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("rank_load_worker.py")


def run_ranks(*args: str | Path) -> None:
    """Both ranks of rank_load_worker.py to the end; any still running after 120 s is killed, so that
    a hang fails the test instead of the suite."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    processes = []
    for rank in range(2):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": "2"}
        env.update(LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        command = [sys.executable, str(WORKER), *map(str, args)]
        processes.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errors = [process.communicate(timeout=120)[1] for process in processes]
    finally:
        for process in processes:
            process.kill()
    for rank, (process, err) in enumerate(zip(processes, errors, strict=True)):
        assert process.returncode == 0, f"rank {rank} exited {process.returncode}: {err[-3000:]}"


@pytest.mark.distributed
def test_every_rank_passes_over_a_checkpoint_whose_rank_file_fails_on_one_rank(tmp_path):
    """Rank 1's file of step_4 does not load (a checkpoint without a CRC-32 for it) and rank 0's does:
    both ranks resume step_2 (rank 0 went on with step_4 alone and the job hung in its first
    collective). Rank 1's damaged file of step_6 is found by its CRC-32 before anything is loaded."""
    root = tmp_path / "checkpoints"
    run_ranks(root, tmp_path)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert result["resumed"] == "step_2" and result["w"] == [2.0] * 4 and result["ranks"] == 2
        assert result["extra"] == {"step": 2, "rank": rank}
        six, four = result["warnings"][:2]
        assert six.startswith(f"checkpoint step_6 is damaged: {root / 'step_6' / 'rank_1.pt'} has CRC-32 ")
        assert four.startswith(
            f"checkpoint step_4 is damaged: {root / 'step_4' / 'rank_1.pt'} does not load ("
        )
    assert sorted(p.name.split(".")[0] for p in root.iterdir()) == ["latest", "step_2", "step_4", "step_6"]
    assert len(list(root.glob("step_[46].damaged-*/rank_1.pt"))) == 2  # kept for inspection
