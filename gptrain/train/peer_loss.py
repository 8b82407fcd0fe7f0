"""A collective that failed because another rank ended, said in one line."""

from __future__ import annotations

from gptrain.errors import GptrainError
from gptrain.parallel.mesh import World
from gptrain.train.session import Session
from gptrain.train.watchdog import Watchdog

# How torch's gloo and NCCL backends say a peer's connection ended under a collective.
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "remote process exited")


def lost_a_peer(error: Exception, world: World, watchdog: Watchdog, s: Session | None) -> GptrainError | None:
    """A collective that failed because another rank ended (SIGKILL from the out-of-memory killer, a
    crash): one line naming the rank where it can be found, instead of the backend's traceback
    naming a socket address.

    It exits 2, not a requeued 75/76: srun reports its tasks' highest status, so a requeued code here
    would requeue a job whose other rank failed for good (a config error's 2, a crash's 1) until
    cluster.max_requeues is spent; a rank killed by a signal (137) outranks any code anyway. The
    rank that ended decides, and the line says to launch again."""
    if world.world_size < 2 or not any(marker in str(error) for marker in PEER_GONE):
        return None
    where = " during start-up" if s is None else f" {s.activity or f'at iteration {s.state.step + 1}'}"
    gone = watchdog.gone_peers() or "another rank (its own output, or the launcher's, says which and why)"
    newest = s.checkpoints.newest() if s is not None else None
    return GptrainError(
        f"rank {world.rank}: a collective lost its peer{where}: {gone} ended; exit 2, not requeued (the "
        "rank that ended says why); launch the same command again to resume from the last complete "
        f"checkpoint ({newest or 'none yet: it starts over'})"
    )
