"""One rank of a `gptrain plan --measure` trial: run `gptrain train`, then write what this rank
measured as JSON, which the planner reads back (from this machine or from a Slurm job).

    python -m gptrain.plan.trial RESULT_DIR --config-file TRIAL.yaml

Started once per rank (by torchrun locally, by srun in a Slurm job; the rank comes from RANK).
`RESULT_DIR/rank-<r>.json` holds the exit code, this rank's median iteration time after the
first (from its own Megatron iteration lines, if this rank logs them) and its peak memory:
torch.cuda.max_memory_allocated on a GPU, the process's peak RSS on CPU (Python runtime included).
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

from gptrain.utils.atomic import atomic_write_text

ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
USAGE = "usage: python -m gptrain.plan.trial RESULT_DIR --config-file TRIAL.yaml"


def result_path(result_dir: Path, rank: int) -> Path:
    return result_dir / f"rank-{rank}.json"


def median_step_s(log_text: str) -> float | None:
    """Median iteration time in seconds after the first (which pays for start-up and compiling)."""
    elapsed = [float(x) / 1000.0 for x in ELAPSED.findall(log_text)]
    if len(elapsed) > 1:
        return statistics.median(elapsed[1:])
    return elapsed[0] if elapsed else None


def peak_memory() -> tuple[float, str]:
    """(GiB, what it is) for this process."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30, "max allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "peak RSS"  # KiB on Linux


def own_log(config_file: str | None, rank: int, local_rank: int) -> str:
    """This rank's training log (exp_manager.explicit_log_dir of the trial's config), or ''."""
    if config_file is None:
        return ""
    import yaml

    from gptrain.train.results import log_file_name

    cfg = yaml.safe_load(Path(config_file).read_text()) or {}
    log_dir = (cfg.get("exp_manager") or {}).get("explicit_log_dir")
    path = Path(str(log_dir)) / log_file_name(rank, local_rank) if log_dir else None
    return path.read_text(errors="replace") if path is not None and path.is_file() else ""


def run(result_dir: Path, train_args: list[str]) -> dict[str, Any]:
    """Train in this process, then measure; the result as written to rank-<r>.json."""
    from gptrain.cli import main as gptrain_main

    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    error = None
    try:
        code = gptrain_main(["train", *train_args])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except Exception as exc:  # a crash is a result too: the planner reports it for this candidate
        code, error = 1, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        print(f"gptrain plan trial: rank {rank}: {error}", file=sys.stderr)
    config_file = train_args[train_args.index("--config-file") + 1] if "--config-file" in train_args else None
    peak, kind = peak_memory()
    return {
        "rank": rank,
        "exit_code": code,
        "error": error,
        "step_s": median_step_s(own_log(config_file, rank, local_rank)),
        "peak_gib": round(peak, 4),
        "memory": kind,
    }


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    result_dir = Path(args[0])
    result = run(result_dir, args[1:])
    result_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(result_path(result_dir, result["rank"]), json.dumps(result) + "\n")
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
