"""Start a worker script as two (or more) gloo ranks on this machine and wait for all of them."""

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A port no process listens on now (the rendezvous of a launch, or of one run inside it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(worker: Path, *args: str | Path, world: int = 2, timeout_s: float = 120) -> None:
    """Every rank of `worker` to the end; any still running after `timeout_s` is killed, so that a
    hang fails the test instead of the suite. Each rank must exit 0 (its stderr tail otherwise)."""
    port = free_port()
    processes = []
    for rank in range(world):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": str(world)}
        env.update(LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        command = [sys.executable, str(worker), *map(str, args)]
        processes.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errors = [process.communicate(timeout=timeout_s)[1] for process in processes]
    finally:
        for process in processes:
            process.kill()
    for rank, (process, err) in enumerate(zip(processes, errors, strict=True)):
        assert process.returncode == 0, f"rank {rank} exited {process.returncode}: {err[-3000:]}"
