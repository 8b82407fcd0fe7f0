"""The straggler line of `gptrain status`, from the per-rank step times training writes.

Each rank's newest line in `<explicit_log_dir>/step_times/rank-<r>.jsonl` (see
gptrain/train/step_times.py) gives its busy time per step (wall time minus the wait at the
step-end agreement); ranks more than `slow_pct` above the median are named with their node.
Only lines of the step and world size of the file written last are compared: a job resumed
with fewer ranks leaves the files of the ranks it lacks behind, ending at another step.
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
    """Each rank file's last line, those of the file written last first (the current job's)."""
    found = []
    for path in directory.glob("rank-*.jsonl"):
        try:
            mtime = path.stat().st_mtime
            found.append((mtime, path.name, json.loads(last_line(path))))
        except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            continue  # a file being written or cut: skip that rank this time
    found.sort(key=lambda x: (-x[0], -int(x[2].get("step", 0)), x[1]))  # same mtime: newer step
    return [line for _, _, line in found]


def last_line(path: Path, block: int = 4096) -> str:
    """The file's last non-empty line, reading only its end: a rank's file holds thousands of logged
    steps (up to gptrain.train.step_times.ROTATE_BYTES), and status reads one file per rank."""
    with open(path, "rb") as handle:
        end = handle.seek(0, 2)
        start = end
        tail = b""
        while start > 0:
            start = max(0, start - block)
            handle.seek(start)
            tail = handle.read(end - start)
            lines = tail.strip().splitlines()
            if len(lines) > 1 or (lines and start == 0):
                return lines[-1].decode()
            block *= 2
        raise ValueError(f"{path} has no line")


def current_job(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of the first line's step and world size: the job that wrote last. A resumed job
    with fewer ranks leaves the other ranks' files at an older step (or, after going back to an
    earlier checkpoint, a later one); lines without `world` (older files) match any world."""
    if not lines:
        return []
    step, world = lines[0]["step"], lines[0].get("world")
    return [x for x in lines if x["step"] == step and x.get("world", world) == world]


def straggler_line(lines: list[dict[str, Any]], slow_pct: float = SLOW_PCT) -> str | None:
    """'stragglers at step S: rank 3 (n2) +25% busy vs the median ...' or a line saying none.

    `lines` come as `newest_lines` gives them: the current job's first."""
    lines = current_job(lines)
    if len(lines) < 2:
        return None
    busy = {int(x["rank"]): max(0.0, float(x["step_ms"]) - float(x["wait_ms"])) for x in lines}
    nodes = {int(x["rank"]): str(x.get("node", "?")) for x in lines}
    median = statistics.median(busy.values())
    step = int(lines[0]["step"])
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
