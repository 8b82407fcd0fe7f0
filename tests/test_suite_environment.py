"""The suite runs the same inside a Slurm allocation (or a torchrun job) as outside one."""

import os
import subprocess
import sys
from pathlib import Path

from gptrain.parallel.mesh import world_from_env
from gptrain.utils.rank import is_rank_zero

REPO = Path(__file__).resolve().parents[1]
# What `salloc --ntasks=8` on two GPU nodes (a requeued job), plus a debugging user, hands a shell.
INSIDE_AN_ALLOCATION = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "3",
    "SLURM_NTASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu-[01-02]",
    "SLURM_RESTART_COUNT": "1",
    "SLURMD_NODENAME": "gpu-01",
    "GPTRAIN_DEBUG": "1",
}


def test_a_test_sees_a_process_started_by_hand():
    world = world_from_env()
    assert (world.rank, world.world_size, world.master_addr) == (0, 1, "127.0.0.1")
    assert is_rank_zero()
    assert not [name for name in INSIDE_AN_ALLOCATION if name in os.environ]


def test_inside_an_allocation_the_tests_still_see_a_process_started_by_hand():
    """Run inside an allocation of 8 tasks, one-process training tests waited for 7 peers (rank 3
    of 8 at gpu-01), a requeued job's notes appeared, and GPTRAIN_DEBUG turned one-line errors
    into tracebacks."""
    node = f"{Path(__file__).relative_to(REPO)}::test_a_test_sees_a_process_started_by_hand"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
        cwd=REPO,
        env={**os.environ, **INSIDE_AN_ALLOCATION},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:]
