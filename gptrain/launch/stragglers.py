"""The straggler line of `gptrain status`, from the per-rank step times training writes.

Each rank's newest line in `<explicit_log_dir>/step_times/rank-<r>.jsonl` (see
gptrain/train/step_times.py) gives its busy time per step (wall time minus the wait at the
step-end agreement); ranks more than `slow_pct` above the median are named with their node.
No torch here: status runs on login nodes.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import yaml

SLOW_PCT = 10.0


def log_dir_of(record: dict[str, Any]) -> Path | None:
    """The training's explicit_log_dir, from the resolved config its launch record names (a
    record written before records named it: the config next to the script, as named then)."""
    script = str(record.get("script") or "")
    if record.get("config"):
        config = Path(record["config"])
    elif script.endswith("_submission.sh"):
        config = Path(script.removesuffix("_submission.sh") + "_hydra.yaml")
    else:
        return None
    try:
        data = yaml.safe_load(config.read_text()) or {}
        return Path(data["exp_manager"]["explicit_log_dir"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None


def newest_lines(directory: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(directory.glob("rank-*.jsonl")):
        try:
            text = path.read_text().strip().splitlines()
            lines.append(json.loads(text[-1]))
        except (OSError, IndexError, json.JSONDecodeError):
            continue  # a file being written or cut: skip that rank this time
    return lines


def straggler_line(lines: list[dict[str, Any]], slow_pct: float = SLOW_PCT) -> str | None:
    """'stragglers at step S: rank 3 (n2) +25% busy vs the median ...' or a line saying none."""
    if len(lines) < 2:
        return None
    busy = {int(x["rank"]): max(0.0, float(x["step_ms"]) - float(x["wait_ms"])) for x in lines}
    nodes = {int(x["rank"]): str(x.get("node", "?")) for x in lines}
    median = statistics.median(busy.values())
    step = max(int(x["step"]) for x in lines)
    slow = sorted(
        (r for r, b in busy.items() if median > 0 and b > median * (1 + slow_pct / 100)),
        key=busy.get,
        reverse=True,
    )
    if not slow:
        return f"stragglers at step {step}: none ({len(busy)} ranks within {slow_pct:.0f}% of the median busy {median:.0f} ms/step)"
    parts = [f"rank {r} ({nodes[r]}) {100 * (busy[r] / median - 1):+.0f}%" for r in slow[:8]]
    more = f" and {len(slow) - 8} more" if len(slow) > 8 else ""
    return f"stragglers at step {step}: {', '.join(parts)}{more} busy vs the median {median:.0f} ms/step"


def stragglers_for(record: dict[str, Any]) -> str | None:
    log_dir = log_dir_of(record)
    if log_dir is None:
        return None
    return straggler_line(newest_lines(log_dir / "step_times"))
