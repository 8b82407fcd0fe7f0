"""How long checkpoints stall training: no saves vs synchronous vs asynchronous saves, same command.

    python bench/checkpoint.py --layers 12 --hidden 768 --steps 8 --every 2 [--dir /tmp/ckpt-bench]

Each mode trains the same GPT (real forward/backward/AdamW steps of gptrain's train_step on a
small random batch, so the optimizer state exists) for `--steps` steps, saving every `--every`
steps through gptrain's CheckpointManager exactly as `gptrain train` does (the optimizer waits for
a background save's staging copy before it changes the weights). Reported per mode: the stall of
each save (the time the loop was blocked by it), the write time and bandwidth, and the extra wall
time over the run without saves (the async run still waits for its last write before it ends: the
"exit wait" column). The run's last save is one it waits for at once, as `gptrain train`'s is
(`waited_for`: on CPU written in place, synchronously, its time in the wall and not in the async
stalls); the mode `async_last_background` writes it in the background too, as gptrain did before
2026-11-26 (third session). Shards are written as `gptrain train` writes them (direct I/O on a local
disk); `sync_buffered` and `async_buffered` write them through the page cache, as before 2026-11-26
(fourth session), and `async_buffered`'s ratios are against `sync_buffered` where it ran. `--spaced` waits for each background write before the next save
(untimed), as a run whose saves are minutes apart: the async stall is then the staging copy alone.
Prints a table per round and one JSON line; with `--rounds N` the modes run N times in turn and the
ratios are the medians over the rounds (a shared VM's step time can vary by 30% from minute to minute).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from gptrain.checkpoint.manager import CheckpointManager
from gptrain.checkpoint.save_report import SaveReport
from gptrain.errors import GptrainError
from gptrain.models.config import GPTConfig
from gptrain.train.builders import build_model
from gptrain.train.loss_scale import build_loss_scaler
from gptrain.train.optim import build_optimizer
from gptrain.train.state import model_state_dict, optimizer_state_dict
from gptrain.train.step import StepOptions, train_step

ASYNC_MODES = ("async", "async_last_background", "async_buffered")
"""The modes whose saves go to the background (the second one its last save too)."""
MODES = ("none", "sync", "sync_buffered", *ASYNC_MODES)
"""Every mode: any other name would run as a synchronous save under its own label."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=int, default=2, help="save every N steps")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--modes", default="none,sync,async")
    parser.add_argument(
        "--spaced",
        action="store_true",
        help="before each save, wait (untimed) for the previous background write, as in a run whose "
        "saves are further apart than one write: the stall is then the staging copy alone",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the modes N times, alternating; ratios are medians"
    )
    args = parser.parse_args(argv)
    if unknown := [mode for mode in args.modes.split(",") if mode not in MODES]:
        parser.error(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")
    if not 1 <= args.every <= args.steps:  # no save to time: the ratios would divide by nothing
        parser.error(
            f"--every {args.every} saves nothing in --steps {args.steps}: give 1 <= --every <= --steps"
        )
    return args


def run_mode(mode: str, args: argparse.Namespace, root: Path, device: torch.device) -> dict:
    config = GPTConfig(
        vocab_size=args.vocab, seq_length=args.seq_length, num_layers=args.layers,
        hidden_size=args.hidden, num_attention_heads=args.heads, hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = build_model(config, device, seed=1234)
    optimizer = build_optimizer(model, "adamw", 1e-4, 0.1, (0.9, 0.95), 1e-8, device.type)
    precision = "bf16" if device.type == "cuda" else "32"
    scaler, opts = (
        build_loss_scaler(precision, 2**16, 1000, 2),
        StepOptions(precision=precision, clip_grad=1.0),
    )
    tokens = torch.randint(0, args.vocab, (args.micro_batch_size, args.seq_length + 1))
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(tokens[:, 1:].shape)}
    reports: list[SaveReport] = []
    shutil.rmtree(root / mode, ignore_errors=True)
    background = mode in ASYNC_MODES
    manager = CheckpointManager(
        root / mode,
        keep_last=1,
        async_save=background,
        on_saved=reports.append,
        direct_io=False if mode.endswith("_buffered") else None,
    )
    optimizer.register_step_pre_hook(lambda *_: manager.wait_for_staging())
    train_step(model, optimizer, [batch], scaler, device, opts)  # warm-up: optimizer state exists
    if background:  # as `gptrain train` does after its first step (pinned buffer, CUDA only)
        manager.prepare_staging(
            {"model": model_state_dict(model), "optim": optimizer_state_dict(model, optimizer)}
        )
    sync(device)
    prepare_wait = 0.0
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        train_step(model, optimizer, [batch], scaler, device, opts)
        manager.poll()
        if mode != "none" and step % args.every == 0:
            if args.spaced:
                waited = time.perf_counter()
                manager.wait_for_preparation()  # the pinned buffer, allocated ahead (CUDA)
                prepare_wait += time.perf_counter() - waited
                manager.wait()
            state = {"model": model_state_dict(model), "optim": optimizer_state_dict(model, optimizer)}
            manager.save(step, state, {}, waited_for=step == args.steps and mode != "async_last_background")
    closing = time.perf_counter()
    manager.close()
    sync(device)
    wall = time.perf_counter() - started
    shutil.rmtree(root / mode, ignore_errors=True)
    row = summarize(mode, wall, reports) | {
        "exit_wait_s": wall - (closing - started),
        "direct_io": manager.direct_io,  # false where the directory's file system is not a local disk
    }
    if args.spaced and background:  # untimed in the stalls: in a run, steps go on meanwhile
        row["prepare_wait_s"] = prepare_wait
        print(f"async: waited {prepare_wait:.1f} s (untimed) for the staging buffer pinned ahead")
    return row


def summarize(mode: str, wall: float, reports: list[SaveReport]) -> dict:
    """Stalls of the background saves where there are any: a last save written in place is waited
    for as the exit wait of one written in the background is (both are in the wall time)."""
    row = {"mode": mode, "wall_s": wall, "saves": len(reports)}
    stalled = [r for r in reports if r.background] or reports
    if reports:
        row |= {
            "stall_ms_median": 1000 * statistics.median(r.stall_s for r in stalled),
            "stall_ms_max": 1000 * max(r.stall_s for r in stalled),
            "write_s_median": statistics.median(r.write_s for r in reports),
            "bytes": reports[-1].bytes,
            "write_GBps": reports[-1].bytes / 1e9 / statistics.median(r.write_s for r in reports),
            "stalls_ms": [round(1000 * r.stall_s, 1) for r in reports],
        }
    return row


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in (
        "mode",
        "wall s",
        "extra wall s",
        "saves",
        "stall ms (median/max)",
        "exit wait s",
        "write s",
        "GB",
        "GB/s",
    ):
        table.add_column(column, justify="right")
    base = next((r["wall_s"] for r in rows if r["mode"] == "none"), None)
    for r in rows:
        extra = f"{r['wall_s'] - base:.2f}" if base is not None else "-"
        if r["saves"]:
            stall = f"{r['stall_ms_median']:.0f} / {r['stall_ms_max']:.0f}"
            write, size, bw = (
                f"{r['write_s_median']:.2f}",
                f"{r['bytes'] / 1e9:.2f}",
                f"{r['write_GBps']:.2f}",
            )
        else:
            stall = write = size = bw = "-"
        exit_wait = f"{r['exit_wait_s']:.2f}"
        table.add_row(
            r["mode"], f"{r['wall_s']:.2f}", extra, str(r["saves"]), stall, exit_wait, write, size, bw
        )
    Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160).print(table)  # logs: no wrapping


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gptrain-ckpt-bench-"))
    name = (
        torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    )
    result: dict = {"bench": "checkpoint", "device": name, "args": vars(args), "rounds": []}
    for round_index in range(1, args.rounds + 1):
        rows = [run_mode(mode, args, root, device) for mode in args.modes.split(",")]
        title = f"{args.layers} x {args.hidden}, save every {args.every} of {args.steps} steps, on {name}"
        print_table(rows, title + (f", round {round_index} of {args.rounds}" if args.rounds > 1 else ""))
        result["rounds"].append({"rows": rows} | ratios(rows))
    result |= median_ratios(result["rounds"])
    print(json.dumps(result))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def ratios(rows: list[dict]) -> dict:
    """Each async mode against sync within one round: the stall, and the extra wall time over no
    saves (keys prefixed by the mode)."""
    by_mode = {r["mode"]: r for r in rows}
    found = {}
    for mode in (m for m in ASYNC_MODES if m in by_mode):
        base = "sync_buffered" if mode.endswith("_buffered") and "sync_buffered" in by_mode else "sync"
        if not {"none", base} <= by_mode.keys():
            continue
        extra_sync = by_mode[base]["wall_s"] - by_mode["none"]["wall_s"]
        extra = by_mode[mode]["wall_s"] - by_mode["none"]["wall_s"]
        stall = by_mode[mode]["stall_ms_median"] / by_mode[base]["stall_ms_median"]
        wall = extra / extra_sync if extra_sync > 0 else None
        found |= {
            f"{mode}_stall_over_sync": stall,
            f"{mode}_extra_wall_over_sync": wall,
            f"{mode}_base": base,
        }
        print(
            f"{mode}: stall / {base} stall {stall:.3f}; extra wall / {base} extra wall {wall or float('nan'):.3f}"
        )
    return found


def median_ratios(rounds: list[dict]) -> dict:
    """Over several rounds (modes alternate, so slow spells of a shared machine hit each mode alike)."""
    found = {}
    for key in (
        f"{mode}_{ratio}" for mode in ASYNC_MODES for ratio in ("stall_over_sync", "extra_wall_over_sync")
    ):
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            found[key] = statistics.median(values)
    if len(rounds) > 1 and found:
        print("median over rounds: " + "; ".join(f"{key} {value:.3f}" for key, value in found.items()))
    return found


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GptrainError as error:  # bad input (a shape, a key.sub=value): one line, no traceback
        raise SystemExit(f"checkpoint.py: {error}") from None
