"""Start N worker processes (gloo, CPU) on a free port and return rank 0's results."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("parallel_worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }


def run_layouts(
    runs: list[dict[str, Any]], world_size: int, tmp_path: Path, timeout: float = 240.0
) -> list[dict]:
    """Run parallel_worker.py on `world_size` processes over `runs` in turn; rank 0's results.

    Logs go to files (a full pipe could block a rank inside a collective).
    """
    tag = os.urandom(4).hex()
    out = tmp_path / f"result-{tag}.json"
    job = json.dumps({"runs": runs, "out": str(out)})
    port = free_port()
    logs = [tmp_path / f"rank{rank}-{tag}.log" for rank in range(world_size)]
    procs = []
    for rank in range(world_size):
        with open(logs[rank], "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), job],
                    env=_env(rank, world_size, port),
                    stdout=log,
                    stderr=log,
                )
            )
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if any(codes) or not out.exists():
        tails = "\n".join(
            f"--- rank {rank} (exit {proc.returncode}) ---\n{logs[rank].read_text()[-3000:]}"
            for rank, proc in enumerate(procs)
        )
        raise AssertionError(f"layouts {runs} failed:\n{tails}")
    return json.loads(out.read_text())
