"""Where a training step's GPU time goes: gptrain's step against the compiled reference, profiled.

    python bench/profile_step.py --micro-batch-size 8 --compile [--profile-steps 3] [key.sub=value ...]

Same arguments as bench/train_step.py (same shapes, same fixed batch). After warm-up, each loop
runs `--profile-steps` steps under torch.profiler; the table gives, per step: wall time, the time some
kernel ran on the GPU (busy) and the rest (idle: launch gaps, host reads), then the kernels that
took the most GPU time grouped by kind (GEMM, attention, fused elementwise/reduction, optimizer,
copy). Use it to see whether a gap is GPU work or idle time before choosing what to change.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step as bench  # noqa: E402

from gptrain.errors import GptrainError  # noqa: E402
from gptrain.models.flops import pad_vocab_size  # noqa: E402
from gptrain.train import builders  # noqa: E402

KINDS = (  # first match wins: substrings of kernel names, lower case
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "matmul", "_mm_", "triton_tem")),
    ("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel")),
    ("fused (triton)", ("triton",)),  # inductor's fused kernels; their names say `_to_copy` too
    ("copy/fill", ("memcpy", "memset", "copy", "fill", "cat")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, needles in KINDS:
        if any(needle in lowered for needle in needles):
            return kind
    return "other"


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in, ms out): time some kernel ran."""
    total, last_end = 0.0, -1.0
    for start, end in sorted(intervals):
        if start >= last_end:
            total += end - start
            last_end = end
        elif end > last_end:
            total += end - last_end
            last_end = end
    return total / 1000


def profile(name: str, step, steps: int, warmup: int, device: torch.device) -> dict:
    for _ in range(warmup):
        step()
    bench.synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        bench.synchronize(device)
        wall = (time.perf_counter() - start) * 1000 / steps
    kernels = [  # device events, less range annotations (the optimizer's, compiled graphs': spans)
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith(("Optimizer.", "## Call CompiledFxGraph", "CompiledFunction"))
    ]
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for e in kernels:
        ms = (e.time_range.end - e.time_range.start) / 1000 / steps
        by_kind[kind_of(e.name)] += ms
        by_name[e.name] += ms
    busy = busy_ms(intervals) / steps
    return {
        "name": name, "wall": wall, "busy": busy, "kernels": len(kernels) / steps,
        "by_kind": dict(by_kind), "top": sorted(by_name.items(), key=lambda kv: -kv[1])[:12],
    }  # fmt: skip


def report(rows: list[dict]) -> None:
    for row in rows:
        idle = row["wall"] - row["busy"]
        print(
            f"\n== {row['name']}: wall {row['wall']:.2f} ms/step, GPU busy {row['busy']:.2f} ms, "
            f"idle {idle:.2f} ms, {row['kernels']:.0f} kernels/step"
        )
        for kind, ms in sorted(row["by_kind"].items(), key=lambda kv: -kv[1]):
            print(f"   {kind:<16} {ms:8.2f} ms")
        for kernel, ms in row["top"]:
            print(f"     {ms:7.2f} ms  {kernel[:110]}")


def profile_steps(argv: list[str]) -> tuple[int, list[str]]:
    """--profile-steps N (default 3, at least 1) and the rest: bench/train_step.py's arguments."""
    parser = argparse.ArgumentParser(prog="profile_step.py", add_help=False)
    parser.add_argument("--profile-steps", type=int, default=3)
    known, rest = parser.parse_known_args(argv)
    if known.profile_steps < 1:
        parser.error(f"--profile-steps {known.profile_steps}: give at least 1")
    return known.profile_steps, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    steps, argv = profile_steps(argv)
    args = bench.parse_args(argv)
    cfg = bench.bench_config(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    padded = pad_vocab_size(bench.GPT2_VOCAB, cfg.model.make_vocab_size_divisible_by, 1)
    model_config = builders.build_model_config(cfg, padded)
    batches = bench.random_microbatches(cfg, bench.GPT2_VOCAB, device)
    step = bench.gptrain_step(cfg, model_config, device, batches)
    rows = [profile(args.label, step, steps, args.warmup, device)]
    del step  # gptrain's model and optimizer state, freed before the reference is built
    bench.release(device)
    if args.reference in ("both", "compiled"):
        step = bench.reference_step(cfg, model_config, device, batches, compiled=True)
        rows.append(profile("compiled reference", step, steps, args.warmup, device))
    report(rows)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GptrainError as error:  # bad input (a shape, a key.sub=value): one line, no traceback
        raise SystemExit(f"profile_step.py: {error}") from None
