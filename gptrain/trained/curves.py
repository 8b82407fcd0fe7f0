"""Training curves from a run's logs: parse Megatron log lines (or TensorBoard events), draw PNGs.

The iteration and validation lines gptrain prints are Megatron-LM's, so this also plots
logs of Megatron-LM and NeMo runs. A resumed run repeats the steps after its last
checkpoint; files are read in the order their attempts began, and where the iterations go back (a resume) every
point from there on is dropped: the steps an abandoned attempt logged past the checkpoint are
not the run's, even where the resumed attempt has not reached them yet.
"""

from __future__ import annotations

import io
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gptrain.errors import DataError
from gptrain.train.logline import PROCESS_START, SKIPPED, measured_loss
from gptrain.utils.atomic import atomic_write_bytes
from gptrain.utils.paths import look_up

LOSS = "lm loss"
LEARNING_RATE = "learning rate"
STEP_TIME = "elapsed time per iteration (ms)"
THROUGHPUT = "throughput per GPU (TFLOP/s/GPU)"
PLOTTED = (LOSS, LEARNING_RATE, STEP_TIME, THROUGHPUT)
# A process's first iteration line is its first step alone, compilation and warm-up included (hundreds of
# times a step): its time and throughput are no point of the curves, a spike after every restart that
# set the chart's scale. Its loss is.
WARM_UP_FIELDS = (STEP_TIME, THROUGHPUT)
# Where a Megatron-LM process starts (its log has no gptrain banner): its arguments block, and its line
# before the first step ('[before the start of training step] datetime: ...'); after `srun -l`'s task id too.
MEGATRON_PROCESS_START = re.compile(r"-{8,} arguments -{8,}|\[before the start of training step\]")

# The last iteration marker of a line: a line torn by a kill (a full disk, SIGKILL) has the resumed
# attempt's first line appended to it, and only that one is whole.
_ITERATION = re.compile(r".*\biteration\s+(\d+)/\s*\d+\s*\|(.*)$")
# The time stamp gptrain's and Megatron-LM's iteration lines start with (microseconds: gptrain's only).
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] iteration\s")
_VALIDATION = re.compile(r"\bvalidation loss at iteration (\d+)(?: on (\w+) set)?\s*\|(.*)$")
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
SKIP_DIRS = frozenset({"checkpoints", "plots", "__pycache__"})
MAX_LOG_BYTES = 1 << 30

# TensorBoard tags (normalised: lower case, separators as spaces) -> (series, is validation, scale).
# gptrain's own tags (gptrain.train.results) first, then Megatron-LM's and NeMo's spellings.
_TB_TAGS: dict[str, tuple[str, bool, float]] = {
    "lm loss": (LOSS, False, 1.0),
    "reduced train loss": (LOSS, False, 1.0),
    "val loss": (LOSS, True, 1.0),
    "lm loss validation": (LOSS, True, 1.0),
    "learning rate": (LEARNING_RATE, False, 1.0),
    "lr": (LEARNING_RATE, False, 1.0),
    "train step timing in s": (STEP_TIME, False, 1000.0),
    "iteration time": (STEP_TIME, False, 1000.0),
    "tflop s gpu": (THROUGHPUT, False, 1.0),  # TFLOP/s/GPU, normalised
    "throughput": (THROUGHPUT, False, 1.0),
}


@dataclass
class RunMetrics:
    """Series keyed by Megatron's field names, each {step: value}."""

    train: dict[str, dict[int, float]] = field(default_factory=dict)
    valid: dict[str, dict[int, float]] = field(default_factory=dict)
    last_step: int | None = None
    """The iteration of the last training line read (a lower one next is a resume)."""
    began: float | None = None
    """When the first training point read was logged (its line's time stamp, its event's wall time),
    in seconds; None where it says none."""

    def resume_at(self, step: int) -> None:
        """Drop every point at or after `step`: a resumed attempt logs the run from there on."""
        for series in (*self.train.values(), *self.valid.values()):
            for dropped in [point for point in series if point >= step]:
                del series[dropped]

    def first_step(self) -> int | None:
        """The first training iteration logged (None: validation lines only)."""
        return min((step for points in self.train.values() for step in points), default=None)

    def series(self, name: str, valid: bool = False) -> tuple[list[int], list[float]]:
        points = sorted((self.valid if valid else self.train).get(name, {}).items())
        return [step for step, _ in points], [value for _, value in points]

    def empty(self) -> bool:
        return not any(self.train.values()) and not any(self.valid.values())


def _fields(text: str) -> Iterable[tuple[str, float]]:
    """`name: value` pairs of a `|`-separated Megatron line; non-numeric values are skipped, and so is
    the text after the last `|`: every field of a whole line ends in one, so that is the field a line
    was torn in (a run still writing, or killed mid-line), its number perhaps cut short (`3.3E-0`)."""
    for part in text.split("|")[:-1]:
        name, sep, value = part.partition(": ")
        if not sep:
            continue
        try:
            yield name.strip(), float(value)
        except ValueError:
            continue


def _training_fields(text: str) -> dict[str, float]:
    """An iteration line's numbers, without the loss Megatron prints as 0 for an interval whose
    iterations were all skipped: no loss was measured there (logline.measured_loss)."""
    fields = dict(_fields(text))
    if measured_loss(fields.get(LOSS), fields.get(SKIPPED, 0)) is None:
        fields.pop(LOSS, None)
    return fields


def parse_log_lines(lines: Iterable[str], metrics: RunMetrics | None = None) -> RunMetrics:
    """Add the numbers of Megatron iteration and validation lines in `lines` to `metrics`."""
    metrics = metrics if metrics is not None else RunMetrics()
    warm_up = False  # the next iteration line is a process's first (a process's start came before it)
    for line in lines:
        if match := _ITERATION.match(line):  # anchored: the leading .* scans a line once
            step = int(match.group(1))
            if metrics.began is None and (stamps := _STAMP.findall(line)):  # torn: the whole line's
                metrics.began = datetime.fromisoformat(stamps[-1]).timestamp()
            if metrics.last_step is not None and step < metrics.last_step:  # equal: a line read twice
                metrics.resume_at(step)
            metrics.last_step = step
            fields = _training_fields(match.group(2))
            for name in WARM_UP_FIELDS if warm_up else ():
                fields.pop(name, None)
            warm_up = False
            for name, value in fields.items():
                metrics.train.setdefault(name, {})[step] = value
        elif PROCESS_START.match(line) or MEGATRON_PROCESS_START.search(line):
            warm_up = True
        elif (match := _VALIDATION.search(line)) and match.group(2) in (None, "validation"):
            step = int(match.group(1))
            for name, value in _fields(match.group(3)):
                if name.endswith(" value"):
                    metrics.valid.setdefault(name.removesuffix(" value"), {})[step] = value
    return metrics


def find_files(run_dir: Path, predicate) -> list[Path]:
    """Files under `run_dir` (not in checkpoint dirs) matching `predicate`, oldest first. A name
    that names no file (a link whose target is gone: W&B's wandb/debug.log once `wandb sync --clean`
    removed its run; a file a running job removed since the listing) is passed over: it has no curves,
    and one stopped the plot of the whole run."""
    found = []
    for directory, dirs, files in os.walk(run_dir):
        dirs[:] = sorted(name for name in dirs if name not in SKIP_DIRS)
        for path in (Path(directory, name) for name in files if predicate(name)):
            try:
                found.append((path.stat().st_mtime, str(path), path))
            except FileNotFoundError:
                continue
    return [path for *_, path in sorted(found)]


def read_logs(run_dir: Path) -> RunMetrics:
    parts = []
    for path in find_files(run_dir, lambda name: name.endswith(LOG_SUFFIXES)):
        try:
            parts += read_log(path)
        except FileNotFoundError:  # removed since it was listed (see find_files)
            continue
    return merge_attempts(parts)


def read_log(path: Path) -> list[RunMetrics]:
    """The numbers of one log file; none from one too large to read."""
    if path.stat().st_size > MAX_LOG_BYTES:  # e.g. a Slurm .out filled by NCCL_DEBUG=INFO
        print(f"gptrain: skipping {path}: over {MAX_LOG_BYTES:,} bytes, not read for curves", file=sys.stderr)
        return []
    with open(path, encoding="utf-8", errors="replace") as handle:
        return [parse_log_lines(handle)]


def merge_attempts(parts: list[RunMetrics]) -> RunMetrics:
    """One run from the files of its attempts (a Slurm .out or an events file each, or one log that
    holds them all), taken in the order they began: by the time their first point was logged where
    every file says it (not the file's time, which a copy does not keep; not the first step, as an
    attempt after a rewind to an earlier checkpoint starts before the abandoned one it replaces), else
    by their first iteration. A file that starts at or before what came before it is a resumed attempt,
    and replaces those steps."""
    merged = RunMetrics()
    stamped = all(part.began is not None for part in parts if part.first_step() is not None)
    for part in sorted(parts, key=lambda part: _attempt_order(part, stamped)):
        first = part.first_step()
        if first is not None and merged.last_step is not None and first <= merged.last_step:
            merged.resume_at(first)
        for source, target in ((part.train, merged.train), (part.valid, merged.valid)):
            for name, points in source.items():
                target.setdefault(name, {}).update(points)
        merged.last_step = max((step for points in merged.train.values() for step in points), default=None)
    return merged


def _attempt_order(part: RunMetrics, stamped: bool) -> tuple[bool, float, int, int]:
    """Files with training steps by when they began (`stamped`: where every one says it), then by
    their first step, then by their last (of two that start together, the one that goes further: the
    run's own log, which holds every attempt, after one attempt's .out); files with validation lines
    only last."""
    first, last = part.first_step(), max((s for points in part.train.values() for s in points), default=0)
    return first is None, (part.began or 0.0) if stamped else 0.0, first or 0, last


def _normalise_tag(tag: str) -> str:
    return re.sub(r"[-_/ ]+", " ", tag.lower()).strip()


def recorded_events_dir(run_dir: Path) -> Path | None:
    """The exp_manager.tensorboard_dir (Megatron's --tensorboard-dir) the run's hparams.yaml records,
    where its events went instead of the run directory; None where it records none."""
    import yaml

    try:
        hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    exp_manager = hparams.get("exp_manager") if isinstance(hparams, dict) else None
    board = exp_manager.get("tensorboard_dir") if isinstance(exp_manager, dict) else None
    return Path(run_dir, board) if isinstance(board, str) and board else None


def read_tensorboard(run_dir: Path) -> RunMetrics:
    """The same series from TensorBoard event files (for runs whose text logs are gone, or lack a
    series): those in the tensorboard_dir its hparams.yaml records, else those under the run directory."""
    events_dir = recorded_events_dir(run_dir) or run_dir
    paths = find_files(events_dir, lambda name: name.startswith("events.out.tfevents"))
    if not paths:  # tensorboard's import is not paid for a run without events
        return RunMetrics()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    parts = []
    for path in paths:
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        part = RunMetrics()  # one events file per process: an attempt of the run
        series, part.began = _tensorboard_series(accumulator)
        for (name, valid), points in series.items():
            (part.valid if valid else part.train).setdefault(name, {}).update(points)
        for name in WARM_UP_FIELDS:  # a process's first step: gptrain wrote its timing before it left it out
            part.train.get(name, {}).pop(part.first_step(), None)
        parts.append(part)
    return merge_attempts(parts)


def _tensorboard_series(accumulator) -> tuple[dict[tuple[str, bool], dict[int, float]], float | None]:
    """{(series, is validation): {step: value}} of one events file's known tags, and the wall time
    of its first training event."""
    found: dict[tuple[str, bool], dict[int, float]] = {}
    began = None
    for tag in accumulator.Tags().get("scalars", []):
        target = _TB_TAGS.get(_normalise_tag(tag))
        if target is None:
            continue
        name, valid, scale = target
        events = accumulator.Scalars(tag)
        found.setdefault((name, valid), {}).update({event.step: scale * event.value for event in events})
        if not valid and events:
            began = min(began or math.inf, *(event.wall_time for event in events))
    return found, began


def refuse_several_runs(root: Path) -> None:
    """A directory above several runs (results/ holding gpt3_126m and gpt3_350m) is refused: every
    file under it is taken for an attempt of one run, so one run's curves replaced the others' (or
    were spliced into them from the iteration the other began at), with nothing said. A run is a
    directory with an hparams.yaml, which gptrain and NeMo write into every run directory; one inside
    another is an attempt of the outer run (NeMo's exp_manager moves a resumed run's files, its
    hparams.yaml too, into run_<N>/ of the run directory)."""
    found = {path.parent for path in find_files(root, lambda name: name == "hparams.yaml")}
    runs = sorted(run for run in found if not found.intersection(run.parents))
    if len(runs) > 1:
        names = ", ".join(str(run.relative_to(root)) for run in runs[:3])
        more = f" and {len(runs) - 3} more" if len(runs) > 3 else ""
        raise DataError(
            f"{root}: holds {len(runs)} runs ({names}{more}), whose curves would be drawn as one run's; "
            "pass one run's directory"
        )


def lacks_a_plotted_series(metrics: RunMetrics) -> bool:
    """A curve the logs leave "not logged": `gptrain megatron` (as Megatron) prints throughput only
    with --log-throughput, yet its events hold TFLOP/s/GPU."""
    return any(not metrics.train.get(name) for name in PLOTTED) or not metrics.valid.get(LOSS)


def fill_from(metrics: RunMetrics, events: RunMetrics) -> None:
    """Take each series `metrics` lacks from `events`; a series the logs hold stays theirs."""
    for source, target in ((events.train, metrics.train), (events.valid, metrics.valid)):
        for name, points in source.items():
            if points and not target.get(name):
                target[name] = dict(points)


def read_run_metrics(run_dir: str | os.PathLike[str]) -> RunMetrics:
    """Metrics of a run: its text logs, and its TensorBoard events for the series they lack (all of
    them where the logs are gone)."""
    root = Path(run_dir)
    found = look_up(root)  # Path.is_dir raised PermissionError where it may not be looked up
    if found.kind == "unreachable":
        raise DataError(f"{root}: {found.why}")
    if found.kind != "directory":
        raise DataError(f"{root}: not a directory; pass a run's results directory")
    refuse_several_runs(root)
    metrics = read_logs(root)
    if metrics.empty():
        metrics = read_tensorboard(root)
    elif lacks_a_plotted_series(metrics):
        fill_from(metrics, read_tensorboard(root))
    if metrics.empty():
        raise DataError(
            f"{root}: no Megatron iteration lines (*.log/*.out) or TensorBoard scalars found; "
            "pass the results directory of a run that has logged at least one iteration"
        )
    return metrics


def _new_figure(rows: int, cols: int, size: tuple[float, float]):
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI; must precede pyplot
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    return plt, figure, axes.ravel()


def _draw_loss(ax, metrics: RunMetrics) -> None:
    steps, values = metrics.series(LOSS)
    ax.plot(steps, values, label="train", linewidth=1.2)
    steps, values = metrics.series(LOSS, valid=True)
    if steps:
        ax.plot(steps, values, "o-", label="validation", markersize=3)
    ax.set_title("lm loss")
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    ax.legend()


def _draw_series(ax, metrics: RunMetrics, name: str, title: str) -> None:
    steps, values = metrics.series(name)
    if steps:
        ax.plot(steps, values, linewidth=1.2)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)


def _save(plt, figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def write_plots(metrics: RunMetrics, output_dir: str | os.PathLike[str]) -> list[Path]:
    """Write loss.png (train + validation loss) and curves.png (loss, lr, step time, TFLOP/s/GPU)."""
    output = Path(output_dir)
    plt, figure, axes = _new_figure(1, 1, (7, 4.5))
    _draw_loss(axes[0], metrics)
    paths = [_save(plt, figure, output / "loss.png")]
    plt, figure, axes = _new_figure(2, 2, (12, 8))
    _draw_loss(axes[0], metrics)
    _draw_series(axes[1], metrics, LEARNING_RATE, "learning rate")
    _draw_series(axes[2], metrics, STEP_TIME, "step time (ms)")
    _draw_series(axes[3], metrics, THROUGHPUT, "throughput (TFLOP/s/GPU)")
    paths.append(_save(plt, figure, output / "curves.png"))
    return paths
