"""Start `gptrain validate` on N local processes (gloo), each with its own environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gloo_ranks import free_port

REPO = Path(__file__).resolve().parents[2]
FAST = ["--max-bytes", "4K", "--iters", "2", "--warmup", "1", "--pair-bytes", "16K", "--timeout", "60"]


def end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def start_ranks(
    argv: list[str], world: int, tmp: Path, extra_env: list[dict[str, str]] | None = None
) -> tuple[list[subprocess.Popen], list[Path]]:
    """`python ARGV` started as `world` ranks, and the files their output goes to."""
    port = free_port()
    procs, logs = [], []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
            PYTHONWARNINGS="ignore",
        )
        env.update((extra_env or [{}] * world)[rank])
        log = tmp / f"rank{rank}.log"
        logs.append(log)
        with open(log, "w") as handle:
            procs.append(
                subprocess.Popen([sys.executable, *argv], env=env, stdout=handle, stderr=subprocess.STDOUT)
            )
    return procs, logs
