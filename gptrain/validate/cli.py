"""`gptrain validate {collectives,pairwise,gpus,all}` (light: argparse only; torch inside the handler)."""

from __future__ import annotations

import argparse
import math

CHECKS = {
    "collectives": "bandwidth sweep of all_reduce, all_gather, reduce_scatter, all_to_all, broadcast",
    "pairwise": "all_reduce between pairs of nodes (or a bisection) and of GPUs inside each node: name the slow one",
    "gpus": "per-GPU NVML health, bf16 matmul rate, copy bandwidth, dcgmi diag; flags GPUs below the median",
    "all": "collectives, pairwise and gpus in one job",
}


def _size(text: str) -> int:
    from gptrain.validate.bandwidth import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _at_least_one(text: str) -> int:
    # 0 timed calls would time nothing and report a made-up bandwidth
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def common_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--output-dir", required=True, help="where the JSON reports and the PNG go")
    parent.add_argument("--min-bytes", type=_size, default=None, help="smallest message (default 8)")
    parent.add_argument(
        "--max-bytes", type=_size, default=None, help="largest message (default 8G on GPUs, 1M on CPUs)"
    )
    parent.add_argument("--iters", type=_at_least_one, default=20, help="timed calls per size (default 20)")
    parent.add_argument("--warmup", type=_positive, default=5, help="untimed calls first (default 5)")
    parent.add_argument(
        "--profile",
        default=None,
        help="cluster profile with thresholds: aws_p4d, aws_p5, azure_nd_a100_v4 or a YAML path",
    )
    parent.add_argument(
        "--min-busbw-GBps",
        dest="min_busbw_GBps",
        type=float,
        default=None,
        help="all_reduce bus bandwidth at large messages below this fails (overrides the profile)",
    )
    parent.add_argument(
        "--pair-bytes",
        type=_size,
        default=None,
        help="pairwise message size (default 256M on GPUs, 1M on CPUs)",
    )
    parent.add_argument(
        "--max-all-pairs",
        type=int,
        default=16,
        help="above this many members, a bisection instead of all pairs (default %(default)s)",
    )
    parent.add_argument(
        "--dcgm-level",
        type=int,
        default=1,
        help="dcgmi diag -r LEVEL where DCGM is installed; 0: skip (default %(default)s)",
    )
    parent.add_argument(
        "--expect-gpus",
        action="store_true",
        help="a node without a visible CUDA GPU fails (implied by a profile with GPU thresholds or a Slurm GPU job)",
    )
    parent.add_argument(
        "--exclude-file", default=None, help="add the nodes to exclude to this file (one line, Slurm syntax)"
    )
    parent.add_argument(
        "--timeout", type=_seconds, default=600.0, help="seconds a collective may wait (default 600)"
    )
    return parent


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check collectives bandwidth, node pairs and GPU health before a long run",
        description=(
            "Cluster validation, started like training (torchrun or srun; one process alone is a world of 1). "
            "Prints nccl-tests style tables, writes JSON reports and a PNG to --output-dir, exits 1 when a "
            "threshold is missed and prints the nodes to leave out in Slurm's --exclude syntax."
        ),
    )
    checks = parser.add_subparsers(dest="check", metavar="CHECK", required=True)
    parent = common_options()
    for name, text in CHECKS.items():
        sub = checks.add_parser(name, parents=[parent], help=text, description=text)
        sub.set_defaults(func=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    from gptrain.validate.main import validate

    return validate(args)
