"""`gptrain validate {collectives,pairwise,gpus,all}` (light: argparse only; torch inside the handler)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

# dcgmi diag's run levels: 1 quick, 2 medium, 3 long, 4 extended
MAX_DCGM_LEVEL = 4

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


def _whole(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def _non_negative(text: str) -> int:
    return _whole(text, 0)


def _at_least_one(text: str) -> int:
    # 0 timed calls would time nothing and report a made-up bandwidth
    return _whole(text, 1)


def _dcgm_level(text: str) -> int:
    # dcgmi diag -r takes 1 to 4; another level makes dcgmi fail, which would blame a healthy node
    value = _whole(text, 0)
    if value > MAX_DCGM_LEVEL:
        raise argparse.ArgumentTypeError(f"must be 0 (skip) to {MAX_DCGM_LEVEL} (dcgmi diag -r), got {value}")
    return value


def _xid_since(text: str) -> float | None:
    from gptrain.validate.kernel_log import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _finite(text: str, unit: str, low: float, inclusive: bool) -> float:
    """A finite number above `low` (or at it, `inclusive`): nan would fail no comparison, so a
    threshold or timeout given as nan would silently be off."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (value == low and not inclusive):
        raise argparse.ArgumentTypeError(
            f"must be a number of {unit} {'>=' if inclusive else '>'} {low:g}, got {text}"
        )
    return value


def _seconds(text: str) -> float:
    return _finite(text, "seconds", 0, inclusive=False)


def _bandwidth(text: str) -> float:
    return _finite(text, "GB/s", 0, inclusive=True)


# The value checks of the options a launch's validation stage passes (gptrain.launch.validation_stage
# checks its config with these, so a bad value is found before the job waits in the queue).
OPTION_TYPES: dict[str, Callable[[str], Any]] = {
    "--min-bytes": _size,
    "--max-bytes": _size,
    "--iters": _at_least_one,
    "--warmup": _non_negative,
    "--pair-bytes": _size,
    "--min-busbw-GBps": _bandwidth,
    "--dcgm-level": _dcgm_level,
    "--xid-since": _xid_since,
}


def common_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--output-dir", required=True, help="where the JSON reports and the PNG go")
    parent.add_argument("--min-bytes", type=_size, default=None, help="smallest message (default 8)")
    parent.add_argument(
        "--max-bytes", type=_size, default=None, help="largest message (default 8G on GPUs, 1M on CPUs)"
    )
    parent.add_argument("--iters", type=_at_least_one, default=20, help="timed calls per size (default 20)")
    parent.add_argument("--warmup", type=_non_negative, default=5, help="untimed calls first (default 5)")
    parent.add_argument(
        "--profile",
        default=None,
        help="cluster profile with thresholds: aws_p4d, aws_p5, azure_nd_a100_v4, bcm (relative checks only; "
        "configs/cluster/NAME.yaml) or a YAML path",
    )
    parent.add_argument(
        "--min-busbw-GBps",
        dest="min_busbw_GBps",
        type=_bandwidth,
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
        type=_non_negative,
        default=16,
        help="above this many members, a bisection instead of all pairs (default %(default)s)",
    )
    parent.add_argument(
        "--dcgm-level",
        type=_dcgm_level,
        default=1,
        help="dcgmi diag -r LEVEL (1 to 4) where DCGM is installed; 0: skip (default %(default)s)",
    )
    parent.add_argument(
        "--xid-since",
        type=_xid_since,
        default=None,
        metavar="DURATION",
        help="judge only the Xids of the last DURATION (30m, 2h, 1d): an older one was followed by a GPU"
        " reset; default boot (every Xid since boot, or since the NVIDIA driver was last reloaded)",
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
