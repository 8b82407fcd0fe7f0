"""`gptrain eval`: loss and perplexity of a checkpoint on a split of the run's data or on any dataset.

Runs in one process (the whole model: TP=PP=1 whatever the run trained with) or under
torchrun/srun with the layout given as overrides (`model.tensor_model_parallel_size=2`, ...),
whatever layout saved the checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gptrain.errors import ConfigError


def add_eval_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `eval` (torch is imported only when it runs)."""
    parser = subparsers.add_parser(
        "eval",
        help="loss and perplexity of a trained checkpoint",
        description=(
            "Evaluate the newest complete checkpoint of a run (or one step_N dir) on a split of the "
            "data it trained on, or on the indexed dataset(s) of --data-prefix, in global batches as "
            "in training. Prints one line; --json writes the result. key=value overrides change the "
            "layout or batch sizes (one process evaluates with TP=PP=1; model.tensor_model_parallel_size=2 "
            "under torchrun). Batches past the end of the data read it again, as in training; a warning "
            "then says so and --json records distinct_tokens."
        ),
    )
    parser.add_argument(
        "checkpoint",
        metavar="RUN_OR_CHECKPOINT",
        help="a run directory (results/<run.name>), its results/ or checkpoints/ directory, or a step_<N> directory",
    )
    parser.add_argument(
        "--split",
        choices=("validation", "test", "train"),
        default="validation",
        help="split of the run's data (default validation; the training's validation batches)",
    )
    parser.add_argument(
        "--data-prefix",
        nargs="+",
        action="extend",  # `--data-prefix 1 A --data-prefix 1 B` is the blend, not B alone
        metavar="PREFIX",
        help="evaluate on these indexed datasets instead (a prefix, or weight prefix pairs of a blend); "
        "may be repeated",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="global batches to evaluate (default: trainer.limit_val_batches/limit_test_batches of the run; "
        "as many as the run's split holds are read in its order, more rebuild it larger, in another; "
        "with --data-prefix, one pass over the data in whole global batches (a note says what is left out); --split train holds the batches training read)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="dotted config overrides"
    )
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from gptrain.trained.evaluate import EvalRequest, evaluate_checkpoint
    from gptrain.utils.overrides import OVERRIDE

    if args.json:  # before the evaluation, not after it
        check_json_path(args.json)
    prefixes = [item for item in args.data_prefix or [] if not OVERRIDE.match(item)]
    overrides = [item for item in args.data_prefix or [] if OVERRIDE.match(item)]  # after --data-prefix
    request = EvalRequest(
        checkpoint=args.checkpoint,
        split=args.split,
        data_prefix=prefixes or None,
        batches=args.batches,
        json_path=args.json,
        overrides=[*args.overrides, *overrides],
    )
    evaluate_checkpoint(request)
    return 0


def check_json_path(path: str) -> None:
    """--json names a file that can be written: one under a file or in a read-only directory
    failed only after the whole evaluation."""
    from gptrain.utils.paths import directory_blocker, look_up

    found = look_up(path)  # Path.is_dir raised PermissionError where it may not be looked up
    if found.kind == "unreachable":
        raise ConfigError(f"--json {path}: {found.why}")
    if found.kind == "directory":
        raise ConfigError(f"--json {path}: is a directory; give a file name")
    blocker = directory_blocker(Path(path).parent, must_write=True)
    if blocker is not None:
        raise ConfigError(f"--json {path}: {blocker}; give a file in a directory that can be written")
