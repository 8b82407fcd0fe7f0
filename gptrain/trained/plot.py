"""`gptrain plot`: loss, learning-rate, step-time and throughput curves of a run as PNGs."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_plot_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `plot` (matplotlib is imported only when it runs)."""
    parser = subparsers.add_parser(
        "plot",
        help="plot a run's loss, learning rate, step time and TFLOP/s/GPU as PNGs",
        description=(
            "Read a run's Megatron iteration and validation lines (*.log, *.out under RUN_DIR; "
            "TensorBoard events for the series they lack) and write loss.png and curves.png."
        ),
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help=(
            "the run's results directory (or a directory above it that holds no other run), or a run "
            "name under --results-dir"
        ),
    )
    parser.add_argument(
        "--results-dir", default="results", help="where a run given by name is (default: results)"
    )
    parser.add_argument("--output", metavar="DIR", help="where to write the PNGs (default: RUN_DIR/plots)")
    parser.set_defaults(func=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    from gptrain.trained.curves import LOSS, read_run_metrics, write_plots

    run_dir = run_directory(args.run_dir, Path(args.results_dir))
    metrics = read_run_metrics(run_dir)
    output = Path(args.output) if args.output else run_dir / "plots"
    steps, losses = metrics.series(LOSS)
    if steps:
        print(f"train lm loss: {losses[0]:.3f} at iteration {steps[0]} -> {losses[-1]:.3f} at {steps[-1]}")
    steps, losses = metrics.series(LOSS, valid=True)
    if steps:
        print(f"validation lm loss: {losses[-1]:.3f} at iteration {steps[-1]}")
    for path in write_plots(metrics, output):
        print(f"wrote {path}")
    return 0


def run_directory(run: str, base: Path) -> Path:
    """`run` as a path, else as a run name under `base`, as status, logs and cancel take it."""
    from gptrain.errors import DataError
    from gptrain.utils.paths import look_up

    given = Path(run)
    if look_up(given).kind != "missing":
        return given  # read_run_metrics names what is wrong with it
    if not given.is_absolute() and look_up(base / run).kind == "directory":
        return base / run
    raise DataError(
        f"{run}: not a directory, nor a run under {base}; pass a run's results directory or its name "
        "(--results-dir: where the runs are)"
    )
