"""`gptrain logs`: which launches' logs to show, and following them (`-f`) while the jobs may run."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptrain.errors import LaunchError
from gptrain.launch.records import LAUNCHER_LOG, read_records
from gptrain.launch.run_dirs import latest_jobs, launches


def launch_number(found: list[list[dict[str, Any]]], number: int, run_dir: Path) -> list[dict[str, Any]]:
    """Launch `number` (1 the first, -1 the latest), or a one-line error naming the valid range."""
    total = len(found)
    if not total:
        raise LaunchError(f"--launch {number}: nothing launched yet in {run_dir}")
    if number == 0 or not -total <= number <= total:
        raise LaunchError(
            f"--launch {number}: {run_dir} has {total} launch{'es' if total > 1 else ''};"
            f" pass 1..{total} (1 the first) or -{total}..-1 (-1 the latest)"
        )
    return found[number - 1 if number > 0 else number]


def launch_header(number: int, total: int, records: list[dict[str, Any]]) -> str:
    """'==> launch 2 of 3, 2026-11-26T10:00:00: training job 1234 <==' (the launch's first record time)."""
    stages = ", ".join(f"{r.get('stage')} job {r.get('job_id')}" for r in records)
    return f"==> launch {number} of {total}, {records[0].get('time', '?')}: {stages} <=="


def logs_to_show(
    run_dir: Path, number: int | None = None, every: bool = False, stage: str | None = None
) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """What `gptrain logs` prints, as (header line or None, records): by default the latest job of
    each stage, else launch `number`, or with `every` each launch under its header."""

    def kept(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if stage in (None, r.get("stage"))]

    chosen: list[tuple[str | None, list[dict[str, Any]]]]
    if every:
        found = launches(run_dir)
        if not found:
            raise LaunchError(nothing_launched(run_dir))
        shown = [(n, kept(records)) for n, records in enumerate(found, 1)]
        chosen = [(launch_header(n, len(found), records), records) for n, records in shown if records]
    elif number is None:
        latest = latest_jobs(run_dir)
        if not latest:
            raise LaunchError(nothing_launched(run_dir))
        chosen = [(None, kept(latest))]
    else:  # launch_number refuses a run dir with no launch itself
        chosen = [(None, kept(launch_number(launches(run_dir), number, run_dir)))]
    if stage and not any(records for _, records in chosen):
        raise LaunchError(missing_stage(run_dir, stage, number))
    return chosen


def nothing_launched(run_dir: Path) -> str:
    """Why `gptrain logs` has no log to show (a launch that stopped before it submitted a job):
    said, where printing nothing read as an empty log."""
    return f"{run_dir}: nothing launched yet ({LAUNCHER_LOG} records no job), so there is no log to show"


def missing_stage(run_dir: Path, stage: str, number: int | None) -> str:
    """The line for `--stage S` where the launches asked for have no such job: a data preparation
    runs in a run dir of its own, which the stage of its launch that waited on it names."""
    where = f"launch {number} of {run_dir}" if number is not None else str(run_dir)
    upstream = [
        str(r["dependency_dir"])
        for r in read_records(run_dir)
        if r.get("event") == "submitted" and r.get("dependency_dir")
    ]
    elsewhere = (
        f"; this run's data preparation ran in {upstream[-1]}: gptrain logs {shlex.quote(upstream[-1])}"
        if upstream and stage == "data_preparation"
        else ""
    )
    return f"--stage {stage}: no {stage} job in {where}{elsewhere}"


def log_header(record: dict[str, Any], path: Path) -> str:
    """'==> training job 1234: <path> <==', the line `gptrain logs` prints before each of several logs
    (as `tail` does); an array task's job as Slurm writes it: 1234_5."""
    job = str(record.get("job_id", "?"))
    head, array, _ = Path(str(record.get("log", ""))).name.rpartition("%A_%a")
    if array and path.stem.startswith(f"{head}{job}_"):
        job = path.stem[len(head) :]
    return f"==> {record.get('stage', '?')} job {job}: {path} <=="


# While Slurm does not answer, `follow` asks it again after twice as many quiet reads each time,
# up to this many (30 s at the default 0.5 s): a controller that is down is not asked (squeue,
# scontrol, sacct) every half second for as long as the user follows; the log is still read.
MAX_QUIET_READS_BETWEEN_ASKS = 60
SLURM_SILENT = "gptrain: Slurm did not answer: still following; Ctrl-C to stop"
SLURM_BACK = "gptrain: Slurm answers again"
LOG_ENDED = "gptrain: the log ends with the job's exit line: stopped following (Slurm still does not answer)"


def follow(
    paths: Callable[[], list[Path]],
    is_done: Callable[[], bool | None],
    poll: float = 0.5,
    header: Callable[[Path], str] | None = None,
    log_says_ended: Callable[[], bool] | None = None,
) -> None:
    """Print new lines of the files `paths()` names (array tasks appear late) until `is_done()`;
    with several files, `header(path)`'s line before text from a file other than the last one's.
    `is_done()` is True once the jobs ended, False while they may run, None when Slurm did not
    answer (they may run: following goes on, asking less and less often, and says so on stderr).
    While it does not answer, a log that `log_says_ended()` (the exit line of a job that is over)
    has Slurm asked again at once, and then ends the following if it still does not answer.

    The job's state (a squeue per job) is asked only when a read found nothing new, so a chatty
    log does not poll the controller in a loop; once it says done, one more read prints what the
    job wrote just before it ended."""
    followed = _Followed(header=header)
    finished, silent = False, False
    reads_between_asks, quiet_reads = 1, 0
    while True:
        if _print_new_text(paths(), followed):
            continue
        if finished:
            return
        quiet_reads += 1
        log_ended = silent and log_says_ended is not None and log_says_ended()
        if quiet_reads >= reads_between_asks or log_ended:
            done, quiet_reads = is_done(), 0
            finished = bool(done) or (done is None and log_ended)
            if (done is None) != silent:
                silent = done is None
                print(SLURM_SILENT if silent else SLURM_BACK, file=sys.stderr, flush=True)
            elif finished and silent:
                print(LOG_ENDED, file=sys.stderr, flush=True)
            reads_between_asks = min(2 * reads_between_asks, MAX_QUIET_READS_BETWEEN_ASKS) if silent else 1
        if not finished:
            time.sleep(poll)


@dataclass
class _Followed:
    """Where `follow` is: the offset reached in each file, and the file and character it printed last."""

    header: Callable[[Path], str] | None = None
    offsets: dict[Path, int] = field(default_factory=dict)
    last_path: Path | None = None
    last_char: str = ""


def _print_new_text(paths: list[Path], followed: _Followed) -> bool:
    """Print what each file gained since its offset; whether any did."""
    grew = False
    existing = [path for path in paths if path.exists()]  # a .err stderr_to_stdout never writes is none
    for path in existing:
        offset = followed.offsets.get(path, 0)
        if path.stat().st_size <= offset:
            continue
        switched = path != followed.last_path and (followed.last_path is not None or len(existing) > 1)
        if followed.header and switched:
            newline = "\n" if followed.last_char not in ("", "\n") else ""
            sys.stdout.write(f"{newline}{followed.header(path)}\n")
        followed.offsets[path], last = print_text(path, offset)
        if last:
            followed.last_path, followed.last_char = path, last
            grew = True
    return grew


# How much of a log `gptrain logs` holds at once: a job of many ranks (NCCL_DEBUG=INFO, a warning
# per rank per step) writes gigabytes, more memory than a login node gives one command.
PRINT_CHUNK = 1 << 20


def print_text(path: Path, offset: int = 0) -> tuple[int, str]:
    """Print the file from `offset` on, a piece at a time; return the offset reached and the last
    character printed ('' where there was nothing new)."""
    last = ""
    with open(path, errors="replace") as handle:
        handle.seek(offset)
        for piece in iter(lambda: handle.read(PRINT_CHUNK), ""):
            sys.stdout.write(piece)
            last = piece[-1]
        sys.stdout.flush()
        return handle.tell(), last
