"""The default process group's timeout, for every process group gptrain makes after it.

torch gives a group made later (new_group, and the groups of a device mesh's dimensions) a timeout
of its own, torch's default for its backend (30 minutes for gloo, 10 for NCCL), not the default
group's. gptrain raises the default group's above its hang watchdog's longest wait
(gptrain.train.watchdog.collective_timeout_minutes), so that the watchdog names a stuck rank before
a collective gives up; a group left at torch's default would give up first (NCCL's abort: exit 134,
not requeued, nobody named). torch is imported only when this is called: utils stays torch-free.
"""

from __future__ import annotations

from datetime import timedelta


def default_group_timeout() -> timedelta | None:
    """The timeout the default process group was started with; None where none is started (a new
    group then takes torch's default, as it would anyway)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return group_timeout(dist.group.WORLD)


def group_timeout(group: object) -> timedelta:
    """How long a collective of `group` (a ProcessGroup) waits: its backend's options, where torch
    keeps it (it has no public reader); one backend per device type, all given the same timeout."""
    device = group._device_types[0]  # type: ignore[attr-defined]
    return group._get_backend(device).options._timeout  # type: ignore[attr-defined]
