"""Start N worker processes (gloo, CPU) on a free port and return rank 0's results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gloo_ranks import free_port

WORKER = Path(__file__).with_name("parallel_worker.py")
REPO = Path(__file__).resolve().parents[2]


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
    runs: list[dict[str, Any]], world_size: int, tmp_path: Path, timeout: float = 900.0
) -> list[dict]:
    """Run parallel_worker.py on `world_size` processes over `runs` in turn; rank 0's results.

    Logs go to files (a full pipe could block a rank inside a collective). The timeout only ends a
    hang: a shared launch of every layout passed 240 s on a 2-core machine under load (the whole
    suite then failed at once), so it is far above what a quiet machine takes (~2 min).
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


# One launch per world size for the layout runs of every module (start-up dominates on CPU: ~3 s of
# CPU per rank on the 2-core CI machine before any training). A module names its runs at import
# (`share_launch`); the first test that needs a world size's results launches the runs of every
# module with a test selected in this session, in turn, and each module gets its own back by name.
# Each module's files go under its own directory of one session directory (`shared_dir`), so its
# later launches can resume the checkpoints its shared runs saved.
Runs = Callable[[Path], list[tuple[str, dict[str, Any]]]]
SHARED: dict[int, dict[str, Runs]] = {}  # world size -> module name -> its runs


def share_launch(world: int, module: str, runs: Runs) -> None:
    """Called at a module's import: its runs of `world` ranks join the shared launch."""
    SHARED.setdefault(world, {})[module] = runs


def shared_dir(root: Path, module: str) -> Path:
    directory = root / module.rsplit(".", 1)[-1]
    directory.mkdir(exist_ok=True)
    return directory


class SharedLaunches:
    """Each world size launched once, on first use, with every selected module's runs."""

    def __init__(self, root: Path, selected: set[str]) -> None:
        self.root, self.selected = root, selected
        self.results: dict[int, dict[str, dict[str, dict]]] = {}

    def get(self, world: int, module: str) -> dict[str, dict]:
        """`module`'s results by run name (its runs: `share_launch`)."""
        self.selected.add(module)  # were the hooks that deselect tests run after the one noting modules
        if world not in self.results:
            self.results[world] = self.launch(world)
        return self.results[world][module]

    def launch(self, world: int) -> dict[str, dict[str, dict]]:
        """One launch running the selected modules' runs in turn, each in its own directory."""
        named = {
            module: runs(shared_dir(self.root, module))
            for module, runs in SHARED.get(world, {}).items()
            if module in self.selected
        }
        specs = [spec for runs in named.values() for _, spec in runs]
        results = iter(run_layouts(specs, world, self.root))
        return {module: {name: next(results) for name, _ in runs} for module, runs in named.items()}
