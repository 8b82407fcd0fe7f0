"""The line of a rank whose collective lost its peer: it says the job is not requeued for it.

Before: it said only "the same command resumes", which under Slurm read as the job resuming by
itself, while its exit 2 (kept: a requeued code would requeue a peer's config error or crash, as
srun reports the highest status) is never requeued by the batch script."""

from __future__ import annotations

from gptrain.errors import GptrainError
from gptrain.parallel.mesh import World
from gptrain.train.peer_loss import lost_a_peer
from gptrain.train.watchdog import Watchdog


def test_a_lost_peer_says_it_is_not_requeued_and_to_launch_again():
    world = World(rank=1, world_size=2, local_rank=1, master_addr="localhost", master_port=29500)
    watchdog = Watchdog(1, 2, 0.0)  # no store: the lost rank cannot be named
    error = RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4321")
    lost = lost_a_peer(error, world, watchdog, None)
    assert isinstance(lost, GptrainError)
    line = str(lost)
    assert "\n" not in line
    assert line.startswith("rank 1: a collective lost its peer during start-up: another rank")
    assert "exit 2, not requeued (the rank that ended says why)" in line
    assert "launch the same command again to resume from the last complete checkpoint (none yet" in line


def test_another_error_is_not_a_lost_peer():
    world = World(rank=1, world_size=2, local_rank=1, master_addr="localhost", master_port=29500)
    assert (
        lost_a_peer(RuntimeError("CUDA error: an illegal memory access"), world, Watchdog(1, 2, 0.0), None)
        is None
    )
