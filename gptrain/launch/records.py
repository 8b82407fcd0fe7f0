"""`launcher.log`: one JSON object per line recording what a launch submitted or ran.

`gptrain status/cancel/logs` read it back, so a run is found by its directory alone.
Events: `submitted` (slurm job id, or local pid and the process's start time, script, log
pattern, and `dependency`: the job of this launch's stage before it, which tells launches into
one run dir apart, with `dependency_dir` where that job's run dir is another, and `array`, an array's
task count), `finished` (local runs: exit code) and `waited_on_by` (Slurm: the job of the
launch's next stage, in another run dir, that waits for job `after` of this one, and its `waiting_dir`).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

LAUNCHER_LOG = "launcher.log"
SLURM_JOB_ID = re.compile(r"[1-9][0-9]*")
LOCAL_JOB_ID = re.compile(r"local-[1-9][0-9]*")


def append_record(run_dir: Path, event: str, **fields: Any) -> dict[str, Any]:
    """One line, in one write to the end of the log. A line cut by a crash (a full disk mid-write,
    the launcher killed) is ended first: the record was glued onto it, and the two were skipped."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, **fields}
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(run_dir / LAUNCHER_LOG, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        while line:
            line = line[os.write(fd, line) :]
    finally:
        os.close(fd)
    return record


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / LAUNCHER_LOG
    if not path.exists():
        return []
    records = []
    for line in path.read_bytes().splitlines():
        record = _parsed(line)
        if isinstance(record, dict) and not unnamed_submission(record := with_array_unread(record)):
            records.append(record)  # other JSON is no record either
    return records


def _parsed(line: bytes) -> Any:
    """The line's JSON, or None for a line cut by a crash (skipped, the rest kept). An earlier
    gptrain glued the next record onto such a line: it is read from where it starts."""
    try:
        return json.loads(line)
    except ValueError:  # JSONDecodeError, or UnicodeDecodeError for bytes a crash left
        pass
    start = line.rfind(b'{"time": ')
    try:
        return json.loads(line[start:]) if start > 0 else None
    except ValueError:
        return None


def with_array_unread(record: dict[str, Any]) -> dict[str, Any]:
    """A Slurm record with sbatch's job id but an `array` that is no task count (hand-edited) is
    kept, its count unknown: skipped, `gptrain status` said "nothing launched yet" and `cancel` left
    the job running. `array_unread` holds the value found; its task logs cannot say the job ended."""
    array = record.get("array")
    if record.get("executor") == "local" or array is None or positive_int(array) or not names_a_job(record):
        return record
    return {**record, "array": None, "array_unread": array}


def unnamed_submission(record: dict[str, Any]) -> bool:
    """A `submitted` line without a job id gptrain writes (hand-edited, another tool's): no job to
    ask about or cancel. Read, a missing id was a KeyError in `gptrain status` and `cancel`, and an
    id "" or 0 ran `scontrol show job ""` (every job on the controller) and `scancel ""`."""
    return record.get("event") == "submitted" and not (names_a_job(record) and counts_are_usable(record))


def names_a_job(record: dict[str, Any]) -> bool:
    """Whether the record's job id has the form its executor's ids have: sbatch's positive job id
    (sbatch prints an array's as a plain job's) or local-<pid>."""
    job_id = record.get("job_id")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str):
        return False
    form = LOCAL_JOB_ID if record.get("executor") == "local" else SLURM_JOB_ID
    return form.fullmatch(job_id) is not None


def counts_are_usable(record: dict[str, Any]) -> bool:
    """Whether a local record's `pid` and a Slurm array's task count `array` are the positive ints
    gptrain writes: a missing pid was a KeyError in `gptrain status` and `cancel`, `"array": "x"` a
    ValueError where the logs are counted, and pid 0 or -1 would signal a process group (a Slurm
    record's other `array` is set aside first: with_array_unread)."""
    pid_needed = record.get("executor") == "local"
    return (not pid_needed or positive_int(record.get("pid"))) and (
        record.get("array") is None or positive_int(record["array"])
    )


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def process_start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc/<pid>/stat field 22), or None.

    A pid alone may be reused once the launcher is gone (SIGKILL, SIGHUP): pid and start time
    together name one process. None where the process does not exist or there is no /proc.
    """
    try:
        with open(f"/proc/{int(pid)}/stat") as handle:
            stat = handle.read()
    except (OSError, ValueError):
        return None
    # field 2 (the command name) may hold spaces and parentheses: count from the last ')'
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[22 - 3])
    except (IndexError, ValueError):
        return None
