"""DCP's save planner with its plan cache, one cache per checkpoint manager.

Every DCP save plans before it writes: each rank sends its list of items (about 1,000 for a GPT,
200 KB pickled) to rank 0, which deduplicates the replicated ones across all ranks and sends each
its share back. At 256 ranks of a replicated 124M state that is 1 s on rank 0 and 52 MB gathered
per save (bench/save_plan.py), growing with the ranks; yet a run's state has the same items at
every save. With the cache a rank whose items did not change sends an empty plan and rank 0
reuses the global plan and metadata it made last time. A changed plan (a resume under another
layout is a new process) is planned in full again.

DCP keeps the cache in class attributes under a key, its class name by default: each manager
gets a key of its own, so two managers in one process (an import, then training) never share
plans, and `forget` drops its entries when the manager closes.
"""

from __future__ import annotations

import itertools

from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlanner

_CACHES = (
    "_cached_save_plan",
    "_cached_final_save_plan",
    "_cached_all_plans",
    "_cached_global_plan",
    "_cached_metadata",
)
"""SavePlanner's class-level caches (torch 2.11-2.14), each a dict keyed by the planner's key."""
_keys = itertools.count()


class CachingSavePlanner(DefaultSavePlanner):
    """DefaultSavePlanner with plan caching, under `key` instead of the class-wide default."""

    def __init__(self, key: str) -> None:
        try:
            super().__init__(enable_plan_caching=True)
        except TypeError:  # a torch without plan caching (before 2.7): every save is planned in full
            super().__init__()
        self._cached_plans_key = key


def new_key() -> str:
    """A cache key no other manager of this process has (the same on every rank is not needed:
    each rank's cache is its own)."""
    return f"gptrain-checkpoint-{next(_keys)}"


def forget(key: str) -> None:
    """Drop what the plan cache holds under `key` (rank 0 holds every rank's plans)."""
    for name in _CACHES:
        getattr(SavePlanner, name, {}).pop(key, None)
