"""Which complete checkpoints a save keeps: PyTorch Lightning's ModelCheckpoint (NeMo's exp_manager),
the `save_top_k` best by the monitored metric plus the newest (its `save_last`: resume needs it).

A checkpoint's metric is read from its COMPLETE marker (`"metrics": {"val_loss": 3.12}`), so a
resumed run ranks the checkpoints saved before it as it ranks its own. Ranked best first:
checkpoints with a number, by `mode` (`min`: lowest first); then those without one (saved where no
validation ran, or before metrics were recorded); then those whose metric is NaN (a diverged
validation is worst, as in Lightning). Within each group, and between equal values, the newer step
first (Lightning keeps the older of a tie; the newer one has trained more). With no metric recorded
anywhere this is keeping the `save_top_k` newest. Standard library only: no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from gptrain.checkpoint.integrity import COMPLETE

MODES = ("min", "max")
STEP = "step"
"""The monitor every save has: its iteration (Lightning's `step`, always among its monitor candidates)."""


@dataclass(frozen=True)
class Ranked:
    """A complete checkpoint as retention sees it: its step and its recorded metric (None: none)."""

    step: int
    metric: float | None


@dataclass(frozen=True)
class Removal:
    """A checkpoint retention removes, and the reason its log line gives."""

    step: int
    reason: str
    link: str | None = None
    """Where the step was a symlink: its target (only the link was removed)."""
    target_removed: str | None = None
    """Where that target is another step directory of the run that this prune removes too: its name."""


def recorded_metric(step_dir: Path, monitor: str) -> float | None:
    """The value of `monitor` in the checkpoint's COMPLETE marker (`step`: the iteration it records,
    Lightning's global step); None where it records none (or the marker cannot be read: retention
    never fails a save over a marker the resume checks anyway)."""
    try:
        record = json.loads((step_dir / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    metrics = {"step": record.get("step")} if monitor == STEP else record.get("metrics")
    value = metrics.get(monitor) if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def rank_key(checkpoint: Ranked, mode: str) -> tuple[int, float, int]:
    """Sorts best first: numbers by `mode`, then no metric, then NaN; the newer step first within each."""
    if checkpoint.metric is None:
        return (1, 0.0, -checkpoint.step)
    if math.isnan(checkpoint.metric):
        return (2, 0.0, -checkpoint.step)
    value = checkpoint.metric if mode == "min" else -checkpoint.metric
    return (0, value, -checkpoint.step)


def removals(checkpoints: list[Ranked], top_k: int | None, mode: str, monitor: str | None) -> list[Removal]:
    """The checkpoints outside the `top_k` best and not the newest, oldest first; `top_k` None or
    negative keeps every one, 0 only the newest. `monitor` None ranks by recency alone."""
    if not checkpoints or top_k is None or top_k < 0:
        return []
    newest = max(checkpoint.step for checkpoint in checkpoints)
    if monitor is None:
        ranked = sorted(checkpoints, key=lambda checkpoint: -checkpoint.step)
    else:
        ranked = sorted(checkpoints, key=lambda checkpoint: rank_key(checkpoint, mode))
    doomed = [checkpoint for checkpoint in ranked[top_k:] if checkpoint.step != newest]
    return [
        Removal(checkpoint.step, _why(checkpoint, top_k, monitor))
        for checkpoint in sorted(doomed, key=lambda c: c.step)
    ]


def _why(checkpoint: Ranked, top_k: int, monitor: str | None) -> str:
    if monitor is None:
        return f"not among the {top_k} newest" if top_k else "save_top_k=0 keeps only the newest"
    best = f"not among the {top_k} best" if top_k else "save_top_k=0 keeps only the newest"
    if checkpoint.metric is None:
        return f"no {monitor} recorded, {best}"
    if monitor == STEP:  # an iteration: 120000, never 1.2e+05
        return f"{monitor} {checkpoint.metric:.0f}, {best}"
    return f"{monitor} {checkpoint.metric:.4g}, {best}"
