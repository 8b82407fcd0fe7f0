"""Which process prints a job's one-time notices, before torch.distributed starts; no torch here.

torchrun sets RANK; `srun` without torchrun sets only SLURM_PROCID. Notices (the flags or NeMo
keys accepted without effect) print on rank 0 only, so a job of 192 processes prints them once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def is_rank_zero(env: Mapping[str, str] | None = None) -> bool:
    """RANK (torchrun), else SLURM_PROCID (srun), is 0; a process started by hand is rank 0."""
    env = os.environ if env is None else env
    return (env.get("RANK") or env.get("SLURM_PROCID") or "0").strip() == "0"
