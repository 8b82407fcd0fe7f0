"""`gptrain status`: each stage's job state, with a one-line progress summary of a training."""

from __future__ import annotations

import re
from pathlib import Path

from gptrain.launch.job_states import NEVER_SATISFIED
from gptrain.launch.log_endings import lines_from_the_end
from gptrain.launch.ramp_eta import ramp_eta
from gptrain.launch.record_state import job_state
from gptrain.launch.records import read_records
from gptrain.launch.run_dirs import latest_jobs, log_files
from gptrain.launch.stragglers import stragglers_for
from gptrain.train.logline import PROCESS_START, SKIPPED, measured_loss
from gptrain.utils.progress import format_duration

ITERATION = re.compile(
    r"iteration\s+(?P<step>\d+)/\s*(?P<max>\d+) \|.*?"
    r"elapsed time per iteration \(ms\): (?P<ms>[\d.]+) \|(?:.*?lm loss: (?P<loss>[\d.Ee+-]+) \|)?"
    rf"(?:.*?{SKIPPED}:\s*(?P<skipped>\d+) \|)?"
)


# the training's own ETA at the end of its line (gptrain.train.meter): the wall-clock pace,
# validations and saves included, which the time per iteration leaves out
LINE_ETA = re.compile(r" ETA (?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d) \|\s*$")


def progress(log: Path, now: float | None = None, running: bool = True) -> str | None:
    """'step 120/1000 | loss 3.21 | 812 ms/step | ETA 00:11:54' from the last iteration line."""
    try:
        match, lines, last = last_iteration(log)
    except OSError:
        return None
    if match is None:
        return None
    step, total, ms = int(match["step"]), int(match["max"]), float(match["ms"])
    parts = [f"step {step}/{total}"]
    loss = measured_loss(float(match["loss"]), int(match["skipped"] or 0)) if match["loss"] else None
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    parts.append(f"{ms:.0f} ms/step")
    if running and lines > 1:  # a process's first line is its first step alone (compilation): no ETA from it
        own = LINE_ETA.search(last)
        eta = 3600 * int(own["h"]) + 60 * int(own["m"]) + int(own["s"]) if own else None
        if eta is None:  # Megatron's or NeMo's line: by the samples left where a batch ramp is on
            eta = ramp_eta(log, last, step, total, ms)
        if eta is None:
            eta = (total - step) * ms / 1000
        parts.append(f"ETA {format_duration(max(0, eta))}")
    return " | ".join(parts)


def last_iteration(log: Path) -> tuple[re.Match[str] | None, int, str]:
    """The log's last iteration line (its match and text), and how many lines of the process that
    wrote it there are, counted up to 2 (0: a process started after it, a requeue appending to the
    same log). Read from the end, which that line is near."""
    match, last, restarted = None, "", False
    for line in lines_from_the_end(log, holding=("iteration", "gptrain: ")):  # ITERATION's, PROCESS_START's
        found = ITERATION.search(line)
        if found and match is not None:
            return match, 2, last
        if found:
            match, last = found, line
            if restarted:
                return match, 0, last
        elif PROCESS_START.match(line):
            if match is not None:
                return match, 1, last
            restarted = True
    return match, 0 if match is None else 1, last


def status_lines(run_dir: Path, label: str | None = None) -> list[str]:
    """One line per stage of the latest launch, each starting with `label` (default: the dir's name)."""
    label = label or run_dir.name
    records = read_records(run_dir)
    lines = []
    for record in latest_jobs(run_dir):
        state = job_state(record, records)
        line = f"{label}  {record.get('stage')}  job {record.get('job_id')}  {state.describe()}"
        if "array_unread" in record:
            line += f"  (launcher.log gives its array task count as {record['array_unread']!r}: its logs cannot say it ended)"
        if state.reason == NEVER_SATISFIED:
            line += f": the stage it waits for (job {record.get('dependency')}) failed; gptrain cancel it"
        logs = log_files(record)
        summary = (
            progress(logs[-1], running=state.active) if logs and record.get("stage") == "training" else None
        )
        if summary:
            line += f"  | {summary}"
        lines.append(line)
        if record.get("stage") == "training":
            lines += [f"  {text}" for text in [stragglers_for(record)] if text]
    return lines or [f"{label}  nothing launched yet"]
