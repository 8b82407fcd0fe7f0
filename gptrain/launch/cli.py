"""`gptrain launch`, `status`, `cancel`, `logs` (light: no torch, no numpy, ever).

These run on login nodes; everything heavy happens inside the jobs they start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gptrain.errors import LaunchError

# gptrain.launch.compose.STAGES, here without its imports (this parser loads on every command)
STAGE_NAMES = ("data_preparation", "validation", "training")

DEFAULT_RESULTS = "results"

LOGS_DESCRIPTION = (
    "Print (or follow) the logs of a launched run: by default its latest launch (the newest job of "
    "each stage). Each launch into the same run dir (a resume after a stop, a relaunch after a "
    "failure) keeps its own logs, reached with --launch N or --all; a Slurm requeue appends to its "
    "job's log."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    launch = subparsers.add_parser(
        "launch",
        help="compose configs/config.yaml + overrides and run the stages locally or on Slurm",
        description=(
            "NeMo-launcher style launch: pick group files (training=gpt3/126m cluster=bcm "
            "data_preparation=download_shards stages=[data_preparation,training] cluster_type=slurm) "
            "and override dotted keys (training.trainer.num_nodes=2 cluster.partition=gpu). "
            "Writes <base_results_dir>/<run.name>/ with the resolved config, the scripts and logs. "
            "cluster_type=local runs each stage here, in order (training under torchrun --standalone, "
            "one node) and returns the exit status of the first that fails: 75 means the training "
            "stopped to be resumed (a checkpoint saved, or a stop during start-up that saved nothing: "
            "the line before says which); launch again with the same arguments. "
            "cluster_type=slurm submits with sbatch and returns 0."
        ),
    )
    launch.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="group choices and dotted overrides"
    )
    launch.add_argument(
        "--dry-run",
        action="store_true",
        help=(
            "check and render everything, write it under <run dir>/dry-run/ (the configs and scripts"
            " as a launch would submit them, marked as a preview) and submit or run nothing"
        ),
    )
    launch.add_argument(
        "--config-dir",
        "--config-path",
        "-cp",
        dest="config_dir",
        default=None,
        help="a conf tree of your own (e.g. NeMo's launcher_scripts/conf); default: gptrain's bundled configs",
    )
    launch.add_argument(
        "--config-name",
        "-cn",
        default="config",
        help="the root config file in the conf tree (default: config)",
    )
    launch.add_argument(
        "--quiet", action="store_true", help="local runs: do not echo the log to the terminal"
    )
    launch.set_defaults(func=run_launch)

    for name, text in (
        ("status", "state of launched runs (squeue/scontrol/sacct or pid) with training progress"),
        (
            "cancel",
            "cancel every stage of a launched run, and the data preparation its launch submitted"
            " (another run dir) unless another job waits on it",
        ),
        ("logs", "print (or follow) the logs of a launched run"),
    ):
        parser = subparsers.add_parser(
            name, help=text, description=LOGS_DESCRIPTION if name == "logs" else text
        )
        parser.add_argument("run", nargs="?" if name == "status" else None, help="run name or run directory")
        parser.add_argument(
            "--results-dir", default=DEFAULT_RESULTS, help="base_results_dir of the launch (default: results)"
        )
        if name == "logs":
            parser.add_argument(
                "-f", "--follow", action="store_true", help="keep printing until the jobs end"
            )
            parser.add_argument("--stage", default=None, choices=STAGE_NAMES, help="only this stage")
            which = parser.add_mutually_exclusive_group()
            which.add_argument(
                "--launch",
                type=int,
                metavar="N",
                help="launch N into the run dir: 1 the first, 2 the next, -1 the latest, -2 the one before",
            )
            which.add_argument(
                "--all",
                action="store_true",
                help="every launch, oldest first, each under a line '==> launch N of M, <time>: <stage> job <id> <=='",
            )
        parser.set_defaults(func={"status": run_status, "cancel": run_cancel, "logs": run_logs}[name])


def run_launch(args: argparse.Namespace) -> int:
    from gptrain.launch.launcher import launch

    if not args.config_dir:
        check_no_tree_here(args.config_name)
    root = Path(args.config_dir).resolve() if args.config_dir else None
    return launch(
        list(args.overrides),
        dry_run=args.dry_run,
        echo=not args.quiet,
        root=root,
        config_name=args.config_name,
    )


def run_status(args: argparse.Namespace) -> int:
    from gptrain.launch.run_dirs import find_run, run_dirs
    from gptrain.launch.slurm_queries import one_slurm_look, silence_note
    from gptrain.launch.status import status_lines

    base = Path(args.results_dir)
    dirs = [find_run(args.run, base, one_nested=True)] if args.run else run_dirs(base)
    if not dirs and base.exists() and not base.is_dir():  # "no launched runs in FILE" read as an answer
        raise LaunchError(
            f"--results-dir {base}: is a file; give the base_results_dir of a launch (a directory)"
        )
    if not dirs:
        print(f"no launched runs in {base.resolve()}")
        return 0
    with one_slurm_look() as silence:
        for run_dir in dirs:
            print("\n".join(status_lines(run_dir, run_label(run_dir, base))), flush=True)
    note = silence_note(silence)
    if note:
        print(note)
    return 0


def run_label(run_dir: Path, base: Path) -> str:
    """The run as `gptrain logs` and `cancel` take it back: its path under the results dir (a
    unique_output launch's `<run.name>/<time>`; its time alone named no run), else its name."""
    try:
        return str(run_dir.resolve().relative_to(base.resolve()))
    except ValueError:  # a run dir given outside the results dir
        return run_dir.name


def run_cancel(args: argparse.Namespace) -> int:
    from gptrain.launch.cancelling import cancel
    from gptrain.launch.run_dirs import find_run

    print("\n".join(cancel(find_run(args.run, Path(args.results_dir)))))
    return 0


def run_logs(args: argparse.Namespace) -> int:
    from gptrain.launch.job_logs import logs_to_show
    from gptrain.launch.run_dirs import find_run

    run_dir = find_run(args.run, Path(args.results_dir), one_nested=True)
    shown = logs_to_show(run_dir, args.launch, args.all, args.stage)
    followed = shown[-1:] if args.follow else []  # --all -f: the earlier launches printed, the last followed
    for header, records in shown[: len(shown) - len(followed)]:
        print_logs(header, records)
    for header, records in followed:
        if header:
            print(header, flush=True)
        follow_logs(run_dir, records)
    return 0


def print_logs(header: str | None, records: list[dict[str, Any]]) -> None:
    """The records' log files, under `header` if any; several (stages, array tasks, a .err) each
    under a line naming its job and file, one as it is. Each then ends in a newline, so the next
    header starts a line of its own."""
    from gptrain.launch.job_logs import log_header, print_text
    from gptrain.launch.run_dirs import output_files

    if header:
        print(header)
    files = [(r, p) for r in records for p in output_files(r) if p.exists()]
    for record in records:
        if not any(r is record for r, _ in files):
            say_no_log(record)
    for record, path in files:
        if len(files) > 1:
            print(log_header(record, path))
        _, last = print_text(path)
        if (header or len(files) > 1) and last not in ("", "\n"):
            sys.stdout.write("\n")
    sys.stdout.flush()


def say_no_log(record: dict[str, Any]) -> None:
    """A job with no log file, on stderr: a stage whose log was missing printed nothing and exit 0,
    as if the job had logged nothing (a Slurm job not started yet writes none; one may be removed)."""
    from gptrain.launch.run_dirs import log_files

    where = (log_files(record) or [record.get("log", "?")])[0]  # an array's pattern until a task starts
    print(
        f"gptrain: {record.get('stage', '?')} job {record.get('job_id', '?')}: no log at {where}"
        " (a job not started yet has written none; gptrain status says its state)",
        file=sys.stderr,
    )


def follow_logs(run_dir: Path, submitted: list[dict[str, Any]]) -> None:
    from gptrain.launch.job_logs import follow, log_header
    from gptrain.launch.job_states import NEVER_SATISFIED
    from gptrain.launch.log_endings import ended_for_good
    from gptrain.launch.record_state import job_state
    from gptrain.launch.records import read_records
    from gptrain.launch.run_dirs import output_files

    def done() -> bool | None:
        """True once every job ended; None when Slurm did not answer about one that may run."""
        records = read_records(run_dir)
        for record in submitted:
            state = job_state(record, records)
            if state.may_run:
                return None if state.unanswered else False
        return True

    def ended_by_log() -> bool:
        """While Slurm does not answer: every job's log ends as a job that is over ends."""
        return all(ended_for_good(record) for record in submitted)

    def paths() -> list[Path]:
        return [p for r in submitted for p in output_files(r)]

    def header(path: Path) -> str:
        record = next(r for r in submitted if path in output_files(r))
        return log_header(record, path)

    follow(paths, done, header=header, log_says_ended=ended_by_log)
    records = read_records(run_dir)
    for record in submitted:
        if job_state(record, records).reason == NEVER_SATISFIED:
            print(
                f"gptrain: {record.get('stage')} job {record.get('job_id')} waits on job"
                f" {record.get('dependency')}, which failed: it never starts; gptrain cancel it",
                file=sys.stderr,
            )


# Where a NeMo launcher's main.py finds its conf tree, as its users run it: in bignlp-scripts/ or
# launcher_scripts/ (conf/), or in the launcher's root (launcher_scripts/conf/).
TREES_HERE = ("conf", "launcher_scripts/conf")


def check_no_tree_here(config_name: str) -> None:
    """`gptrain launch ...` typed where `python3 main.py ...` ran read gptrain's bundled configs, not
    the conf tree there that the user had edited (its partition, env_vars, blend), without a word."""
    from gptrain.launch.compose import CONFIG_ROOT
    from gptrain.utils.paths import look_up

    for tree in TREES_HERE:
        config = Path(tree) / f"{config_name.removesuffix('.yaml')}.yaml"
        if look_up(config).kind == "file":
            raise LaunchError(
                f"{config} is a launcher conf tree, but without --config-dir gptrain launch reads its bundled"
                f" configs: give --config-dir {tree} to launch from it (NeMo's main.py reads its conf/), or"
                f" --config-dir {CONFIG_ROOT} for the bundled ones"
            )
