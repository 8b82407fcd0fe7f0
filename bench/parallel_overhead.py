"""Step-time overhead of each parallel layout against one process, on CPU (gloo).

    .venv/bin/python bench/parallel_overhead.py [--steps 8] [--layouts ddp_dp2,tp2_sp]

Every layout trains the same small GPT (fp32) on the same global batch; the table gives
the median step time of rank 0 after warm-up and its ratio to the single-process step (run
first, whether --layouts names it or not).
On a CPU box the numbers measure the framework's overhead (DTensor dispatch, pipeline
bubbles, gloo collectives, process oversubscription), not a GPU speed-up. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TP2 = {"tensor_model_parallel_size": 2}
PP2 = {"pipeline_model_parallel_size": 2}
LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {
    "single": (1, {}),
    "ddp_dp2": (2, {}),
    "fsdp_dp2": (2, {"data_parallel_sharding": "full_shard"}),
    "tp2": (2, TP2),
    "tp2_sp": (2, {**TP2, "sequence_parallel": True}),
    "pp2_1f1b": (2, PP2),
    "pp2_interleaved": (2, {**PP2, "virtual_pipeline_model_parallel_size": 2}),
    "dp2_tp2_fsdp": (4, {**TP2, "sequence_parallel": True, "data_parallel_sharding": "full_shard"}),
    "tp2_pp2": (4, {**TP2, "sequence_parallel": True, **PP2}),
}
MODEL = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "encoder_seq_length": 128}
BATCH = {"micro_batch_size": 2, "global_batch_size": 8}
VOCAB = 512


def worker(spec: dict[str, Any]) -> None:
    """One rank: build, parallelize, time `steps` steps after 2 warm-up steps."""
    import torch

    from gptrain.config import TrainingConfig
    from gptrain.models.config import GPTConfig
    from gptrain.models.gpt import GPT
    from gptrain.parallel.mesh import init_distributed, world_from_env
    from gptrain.parallel.parallelize import parallelize
    from gptrain.parallel.runtime import forward_backward

    torch.set_num_threads(1)
    world = world_from_env()
    if world.world_size > 1:
        init_distributed(world, "cpu")
    cfg = TrainingConfig()
    cfg.trainer.devices, cfg.trainer.precision = world.world_size, "32"
    for key, value in {**MODEL, **BATCH, **spec["model"]}.items():
        setattr(cfg.model, key, value)
    m = cfg.model
    config = GPTConfig(
        VOCAB,
        m.encoder_seq_length,
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    with torch.device("meta"):
        meta_model = GPT(config)
    model = parallelize(meta_model, cfg, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dp = model.ctx.dims.dp
    n_micro = m.global_batch_size // (m.micro_batch_size * dp)
    seq = m.encoder_seq_length
    batch = torch.randint(0, VOCAB, (m.micro_batch_size, seq + 1), generator=torch.Generator().manual_seed(0))
    micro = [
        {"tokens": batch[:, :-1], "labels": batch[:, 1:], "loss_mask": torch.ones(batch.shape[0], seq)}
    ] * n_micro
    times = []
    for step in range(spec["steps"] + 2):
        start = time.perf_counter()
        forward_backward(model, micro, scale=1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:
            times.append(time.perf_counter() - start)
    if world.rank == 0:
        Path(spec["out"]).write_text(json.dumps({"median_s": statistics.median(times)}))


def run(name: str, steps: int, tmp: Path) -> float:
    world, model = LAYOUTS[name]
    out = tmp / f"{name}.json"
    spec = json.dumps({"model": model, "steps": steps, "out": str(out)})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", spec], env=env))
    if any(proc.wait() for proc in procs):
        raise SystemExit(f"layout {name} failed")
    return json.loads(out.read_text())["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        _finish()
    names = layouts_to_run(args.layouts)
    if unknown := [name for name in names if name not in LAYOUTS]:
        parser.error(f"--layouts: unknown {', '.join(unknown)}; known: {', '.join(LAYOUTS)}")
    print(f"model {MODEL}, vocab {VOCAB}, batch {BATCH}, fp32, {os.cpu_count()} CPUs, 1 thread per process")
    print("| layout | processes | step (ms) | vs single |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        base = None
        for name in names:
            seconds = run(name, args.steps, Path(tmp))
            base = base or seconds  # the first is the single process
            print(
                f"| {name} | {LAYOUTS[name][0]} | {seconds * 1000:.1f} | {seconds / base:.2f}x |", flush=True
            )


def layouts_to_run(text: str) -> list[str]:
    """The layouts asked for, after the single process every ratio is against (run first, once)."""
    return ["single", *(name for name in text.split(",") if name != "single")]


def _finish() -> None:
    """barrier + destroy + os._exit: gloo threads can abort a process that exits normally."""
    from gptrain.parallel.mesh import shutdown

    shutdown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
