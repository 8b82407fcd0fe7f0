"""Check `gptrain plan`'s memory model against measured peak memory on one GPU.

    python bench/plan_memory_gpu.py --out $OUT/plan_memory.json

Runs bench/train_step.py's single-device path for each shape (eager, model.compile=true, which
compiles the whole forward and loss as one graph, and FP8 tensorwise compiled) in a fresh
process, reads its peak GiB (torch.cuda.max_memory_allocated, `peak_memory_gib` of its JSON line; null
off CUDA, where the case's measurement is null), and
writes the estimate, the measurement and the relative error per case as JSON. Dropout 0, bf16,
sequence 2048, as in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TRAIN_STEP = Path(__file__).resolve().parent / "train_step.py"
NO_DROPOUT = ["model.hidden_dropout=0", "model.attention_dropout=0"]
CASES = {
    "gpt3/126m mbs8 seq2048": ["--preset", "gpt3/126m", "--micro-batch-size", "8", *NO_DROPOUT],
    "24x2048 mbs4 seq2048": [
        "--preset",
        "gpt3/126m",
        "--micro-batch-size",
        "4",
        "model.num_layers=24",
        "model.hidden_size=2048",
        "model.num_attention_heads=16",
        *NO_DROPOUT,
    ],
}
# (model.compile, model.fp8)
MODES = [(False, False), (True, False), (True, True)]


def estimate(case: list[str], compile_: bool, fp8: bool) -> float:
    from gptrain.config import load_training_config
    from gptrain.plan.memory import GIB, estimate_memory
    from gptrain.plan.spec import layout_from_config, workload_from_config

    overrides = [a for a in case if "=" in a]
    mbs = case[case.index("--micro-batch-size") + 1]
    overrides += [f"model.micro_batch_size={mbs}", f"model.global_batch_size={mbs}", "trainer.precision=bf16"]
    overrides += ["trainer.num_nodes=1", "trainer.devices=1", f"model.compile={compile_}", f"model.fp8={fp8}"]
    cfg = load_training_config(case[case.index("--preset") + 1], overrides)
    return estimate_memory(workload_from_config(cfg), layout_from_config(cfg)).total / GIB


def measure(case: list[str], compile_: bool, fp8: bool) -> float | None:
    """Peak GiB of gptrain's row in bench/train_step.py's JSON line; None where the run failed."""
    args = [sys.executable, str(TRAIN_STEP), *case, "--seq-length", "2048", "--precision", "bf16"]
    args += ["--steps", "5", "--warmup", "3", "--reference", "none", "--label", "gptrain"]
    args += ["--compile"] if compile_ else []
    args += ["model.fp8=true"] if fp8 else []
    done = subprocess.run(args, capture_output=True, text=True)
    peak = peak_gib(done.stdout) if done.returncode == 0 else None
    if peak is None:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    return peak


def peak_gib(stdout: str) -> float | None:
    """gptrain's peak memory from train_step's last JSON line: None without one, or off CUDA
    (no peak counter), never another number of the line (a loss read as GiB)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None
    results = json.loads(lines[-1])["results"]
    return results[0]["peak_memory_gib"] if results else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, case in CASES.items():
        for compile_, fp8 in MODES:
            est, meas = estimate(case, compile_, fp8), measure(case, compile_, fp8)
            err = None if meas is None else (est - meas) / meas
            row = {"case": name, "compile": compile_, "fp8": fp8, "estimate_gib": est, "measured_gib": meas}
            rows.append(row | {"error": err})
            print(json.dumps(rows[-1]), flush=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(rows, indent=2) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
