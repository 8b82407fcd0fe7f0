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
    naming a socket address."""
    if world.world_size < 2 or not any(marker in str(error) for marker in PEER_GONE):
        return None
    where = f" at iteration {s.state.step + 1}" if s is not None else " during start-up"
    gone = watchdog.gone_peers() or "another rank (its own output, or the launcher's, says which and why)"
    newest = s.checkpoints.newest() if s is not None else None
    return GptrainError(
        f"rank {world.rank}: a collective lost its peer{where}: {gone} ended; the same command resumes "
        f"from the last complete checkpoint ({newest or 'none yet: it starts over'})"
    )
