"""Start a worker script as two (or more) gloo ranks on this machine and wait for all of them."""

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

# Test rendezvous ports come from [10000, 20000): below gptrain's own Slurm rendezvous ports
# (gptrain.utils.ports, 20000-32767: the local-Slurm tests' jobs) and below Linux's ephemeral
# range (32768-60999), where a port picked by binding port 0 goes back to the pool the moment the
# probe closes and any outgoing connection (another test's gloo pairs or store clients) may take
# it before rank 0 listens: EADDRINUSE on a loaded machine. Each pytest-xdist worker takes its own
# slice, and each call moves on, so no two tests running at once are handed the same port.
TEST_PORT_LOW, TEST_PORT_SPAN = 10000, 10000
_calls = itertools.count(os.getpid())


def port_slice(worker: str = "", workers: str = "") -> range:
    """The ports this pytest process hands out: its xdist worker's share of the test range."""
    worker = worker or os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(workers or os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) % count if worker[2:].isdigit() else 0
    width = TEST_PORT_SPAN // count
    return range(TEST_PORT_LOW + index * width, TEST_PORT_LOW + (index + 1) * width)


def free_port() -> int:
    """A port of this process's slice that nothing listens on now (a launch's rendezvous, or that
    of one run inside it), never the one the previous call returned."""
    ports = port_slice()
    for _ in ports:
        port = ports[next(_calls) % len(ports)]
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


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
