"""Run-directory bookkeeping: finding a launched run (a directory with a `launcher.log`, see records.py),
its launches and latest jobs, and the files each job writes its output to."""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

from gptrain.errors import LaunchError
from gptrain.launch.compose import STAGES, closest
from gptrain.launch.records import LAUNCHER_LOG, read_records
from gptrain.utils.paths import look_up


def run_dirs(base: Path) -> list[Path]:
    """Every directory under `base` holding a launcher.log (unique_output runs are nested)."""
    if _kind(base) != "directory":
        return []
    return sorted(p.parent for p in base.glob(f"**/{LAUNCHER_LOG}"))


def _kind(path: Path) -> str:
    """What `path` (given to status, logs or cancel, or under one given) is; one the file system
    refuses to look up is a LaunchError naming the directory to check (Path.is_dir raised
    PermissionError there, said as a bare '<path>: Permission denied')."""
    found = look_up(path)
    if found.kind == "unreachable":
        raise LaunchError(f"{path}: {found.why}")
    return found.kind


# a directory of one launch under <run.name>/ named by its time: unique_output's (compose.make_unique's
# 20261130-100000[-1]) or a results_dir of Hydra's ${now:%Y-%m-%d_%H-%M-%S} (2026-11-30_10-00-00)
STAMP = re.compile(r"\d{8}-\d{6}(-\d+)?|\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(-\d+)?")


def find_run(run: str, base: Path, one_nested: bool = False) -> Path:
    """A run given as a directory or a run name under `base`; a `<name>/` of launches named by their
    time (STAMP) gives its newest launch, and with `one_nested` (status, logs) a directory holding one
    run gives it. A directory holding other runs (a results dir) names none of them: cancel must never
    act on a run the user did not name."""
    for candidate in (Path(run), base / run):
        if _kind(candidate / LAUNCHER_LOG) == "file":
            return candidate
        nested = run_dirs(candidate)
        stamped = all(p.parent == candidate and STAMP.fullmatch(p.name) for p in nested)
        if nested and (stamped or (one_nested and len(nested) == 1)):
            return newest(nested)
        if nested:
            raise LaunchError(holds_runs(run, candidate, nested))
    given, named = Path(run), base / run
    names = sorted({str(p.relative_to(base)).split("/")[0] for p in run_dirs(base)})
    if given.is_file() or (given.is_dir() and given.resolve() != base.resolve()):
        nearby = closest(run, names) if names else ""  # a run name that is also a path here
        also = f"; of the runs in {base}{nearby}" if nearby.startswith(" (did you mean") else ""
        raise LaunchError(f"{run}: {not_launched(given)}{also}")
    if named.is_dir() and named.resolve() != base.resolve():  # `gptrain train`'s results/<name>, a dry run
        raise LaunchError(f"{named}: {not_launched(named)}")
    raise LaunchError(
        f"no launched run '{run}' in {base}{closest(run, names)}; pass a run dir or --results-dir"
    )


def newest(runs: list[Path]) -> Path:
    """The run launched last (its launcher.log written last)."""
    return max(runs, key=lambda p: (p / LAUNCHER_LOG).stat().st_mtime)


def holds_runs(run: str, directory: Path, nested: list[Path]) -> str:
    """Why a directory holding several runs (or one below its own name) is no run to act on."""
    names = [str(p.relative_to(directory)) for p in nested]
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (
        f"{run}: not a run; it holds {len(names)} launched run{'s' if len(names) > 1 else ''} ({shown}):"
        f" name one (as {newest(nested)}); for the state of them all: gptrain status --results-dir {directory}"
    )


def not_launched(path: Path) -> str:
    """Why `path`, which exists, is no launched run: status, logs and cancel follow `gptrain launch`'s
    runs (its launcher.log); a `gptrain train` run's own log is where to look instead."""
    if path.is_file():
        return f"not a run directory; pass the directory `gptrain launch` wrote ({LAUNCHER_LOG} in it)"
    from gptrain.launch.stages import DRY_RUN_DIR
    from gptrain.train.results import log_file_name  # torch-free

    train_log = log_file_name(0, 0)  # rank 0's log of a `gptrain train` run
    logs = [d / train_log for d in (path, path / "results") if (d / train_log).is_file()]
    where = f"; its training log is {logs[0]}" if logs else ""
    # where `launch --dry-run` writes its preview: <run>/dry-run, or <run>/<time>/dry-run (unique_output)
    previews = (
        [path / DRY_RUN_DIR] if (path / DRY_RUN_DIR).is_dir() else sorted(path.glob(f"*/{DRY_RUN_DIR}"))
    )
    if previews:
        preview = previews[-1].relative_to(path)
        where += f"; {preview}/ is a `gptrain launch --dry-run` preview, which submits nothing: launch without --dry-run"
    return (
        f"no {LAUNCHER_LOG} here or below: not a run started by `gptrain launch` (status, logs and "
        f"cancel follow those){where}"
    )


def latest_jobs(run_dir: Path) -> list[dict[str, Any]]:
    """The submitted records of the latest launch in this dir (one per stage)."""
    records = [r for r in read_records(run_dir) if r.get("event") == "submitted"]
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        latest[record.get("stage", "?")] = record
    return list(latest.values())


def launches(run_dir: Path) -> list[list[dict[str, Any]]]:
    """The submitted records of each launch into this dir, oldest first: `gptrain logs --launch N`
    counts them from 1. Separate launches have separate jobs (a Slurm requeue keeps its job id and
    log), so a record joins the launch before it only when it ran after one of its jobs."""
    found: list[list[dict[str, Any]]] = []
    for record in read_records(run_dir):
        if record.get("event") != "submitted":
            continue
        if found and ran_after(record, found[-1]):
            found[-1].append(record)
        else:
            found.append([record])
    return found


def ran_after(record: dict[str, Any], launch: list[dict[str, Any]]) -> bool:
    """Whether a stage's record belongs to `launch`: its `dependency` is a job of it. Local
    records written before they named one join when their stage comes later in stage order."""
    if "dependency" in record:
        after = record["dependency"]
        return after is not None and str(after) in {str(r.get("job_id")) for r in launch}

    def order(r: dict[str, Any]) -> int:
        return STAGES.index(r["stage"]) if r.get("stage") in STAGES else len(STAGES)

    return order(record) > order(launch[-1])


def log_files(record: dict[str, Any]) -> list[Path]:
    """The log files of a record; only the job-id slot at the end of a Slurm pattern is filled in
    (a run named `run%j` keeps its name)."""
    pattern = Path(str(record.get("log", "")))
    job_id = str(record.get("job_id", ""))
    if record.get("executor") == "local":
        return [pattern]
    head, array, tail = pattern.name.rpartition("%A_%a")
    if array:  # in task order: _2 before _10
        prefix = f"{head}{job_id}_"
        found = pattern.parent.glob(f"{glob.escape(prefix)}*{glob.escape(tail)}")
        return sorted(found, key=lambda path: task_order(path.name[len(prefix) : len(path.name) - len(tail)]))
    head, slot, tail = pattern.name.rpartition("%j")
    return [pattern.parent / (f"{head}{job_id}{tail}" if slot else pattern.name)]


def stderr_logs(log: Path) -> list[Path]:
    """Where the job's stderr goes with cluster.stderr_to_stdout=false: log-<job>_<id>.err beside its
    .out (the batch script's own lines, a traceback, the training's one-line error); [] for a log
    that is no .out."""
    return [log.with_suffix(".err")] if log.suffix == ".out" else []


def output_files(record: dict[str, Any]) -> list[Path]:
    """Every file a record's job writes its output to: each log, then its stderr file (which exists
    only with cluster.stderr_to_stdout=false)."""
    return [path for log in log_files(record) for path in (log, *stderr_logs(log))]


def task_order(index: str) -> tuple[int, str]:
    """An array task's log sorted by its task id as a number (anything else after them)."""
    return (int(index), "") if index.isdigit() else (1 << 62, index)
