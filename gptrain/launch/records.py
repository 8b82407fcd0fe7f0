"""`launcher.log`: one JSON object per line recording what a launch submitted or ran.

`gptrain status/cancel/logs` read it back, so a run is found by its directory alone.
Events: `submitted` (slurm job id or local pid, script, log pattern) and `finished`
(local runs: exit code).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

LAUNCHER_LOG = "launcher.log"


def append_record(run_dir: Path, event: str, **fields: Any) -> dict[str, Any]:
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, **fields}
    with open(run_dir / LAUNCHER_LOG, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / LAUNCHER_LOG
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: skip it, keep the rest
    return records
