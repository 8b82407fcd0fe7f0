"""Issue 9's headline figures from bench/gpu_suite.sh's results.jsonl, against their targets.

    python bench/suite_summary.py OUT/results.jsonl [OUT/summary.json]

Reads the `quick` part's items (whichever finished: a call cut short leaves the earlier ones) and
prints one line per figure: 126m against the compiled reference (target 1.1x), 1.3B MFU (target
50%), FP8 tensorwise against bf16 at 1.3B (target 1.3x), the async save's stall at 1.3B (target
under 1 s). Writes the same figures as JSON where a second path is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gptrain.utils.atomic import atomic_write_text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path, help="gpu_suite.sh's OUT/results.jsonl")
    parser.add_argument("summary", type=Path, nargs="?", help="write the figures here as JSON")
    return parser.parse_args(argv)


def read_items(path: Path) -> dict[str, dict]:
    """Each item's line (the last one of a name run twice); a line cut or mangled is skipped."""
    items = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and "item" in item:
            items[item["item"]] = item
    return items


def rows(item: dict | None) -> list[dict]:
    result = (item or {}).get("result") or {}
    return result.get("results") or []


def step_126m(item: dict | None) -> dict | None:
    found = {row["name"]: row["seconds_per_step"] for row in rows(item)}
    reference = next((s for name, s in found.items() if "reference" in name), None)
    alone = next(iter(found.values()), None)
    ahead = next((s for name, s in found.items() if name.endswith("run ahead")), None)
    if reference is None or alone is None:
        return None
    return {
        "ms_reference": 1000 * reference,
        "ms_step_alone": 1000 * alone,
        "ms_run_ahead": 1000 * ahead if ahead else None,
        "vs_reference_step_alone": reference / alone,
        "vs_reference_run_ahead": reference / ahead if ahead else None,
    }


def first_row(item: dict | None) -> dict | None:
    found = rows(item)
    return found[0] if found else None


def checkpoint(item: dict | None) -> dict | None:
    result = (item or {}).get("result") or {}
    for found in result.get("rounds", []):
        for row in found["rows"]:
            if row["mode"].startswith("async") and row.get("saves"):
                return {
                    "stall_ms": row["stall_ms_median"],
                    "write_GBps": row["write_GBps"],
                    "GB": row["bytes"] / 1e9,
                }
    return None


def summarize(items: dict[str, dict]) -> dict:
    bf16, fp8 = first_row(items.get("quick_1p3b")), first_row(items.get("quick_1p3b_fp8"))
    return {
        "device": (items.get("env") or {}).get("device"),
        "126m": step_126m(items.get("quick_126m")),
        "1p3b_bf16": bf16
        and {k: bf16[k] for k in ("seconds_per_step", "tokens_per_second", "mfu", "peak_memory_gib")},
        "1p3b_fp8": fp8
        and {k: fp8[k] for k in ("seconds_per_step", "tokens_per_second", "mfu", "peak_memory_gib")},
        "fp8_over_bf16": bf16["seconds_per_step"] / fp8["seconds_per_step"] if bf16 and fp8 else None,
        "checkpoint_1p3b": checkpoint(items.get("quick_checkpoint_1p3b")),
        "items": {
            name: {k: item.get(k) for k in ("exit", "seconds", "limit")}
            for name, item in items.items()
            if name != "env"
        },
    }


def verdict(value: float | None, ok: bool) -> str:
    return "not measured" if value is None else ("met" if ok else "NOT met")


def report(summary: dict) -> list[str]:
    lines = [f"issue 9 on {summary['device'] or 'no GPU'}:"]
    step = summary["126m"]
    if step:
        ahead = step["vs_reference_run_ahead"]
        loop = ahead or step["vs_reference_step_alone"]  # run ahead is how `gptrain train` runs it
        lines.append(
            f"  126m vs compiled reference: {loop:.3f}x as the loop runs it "
            f"({'run ahead' if ahead else 'run ahead not measured'}; step alone "
            f"{step['vs_reference_step_alone']:.3f}x; reference {step['ms_reference']:.1f} ms) - target 1.1x: "
            + verdict(loop, loop >= 1.1)
        )
    else:
        lines.append("  126m vs compiled reference: not measured")
    bf16 = summary["1p3b_bf16"]
    mfu = bf16 and bf16["mfu"]
    lines.append(
        f"  1.3B MFU: {100 * mfu:.1f}% ({1000 * bf16['seconds_per_step']:.1f} ms/step) - target 50%: {verdict(mfu, mfu >= 0.5)}"
        if mfu is not None
        else "  1.3B MFU: not measured"
    )
    ratio = summary["fp8_over_bf16"]
    lines.append(
        f"  1.3B FP8 tensorwise vs bf16: {ratio:.3f}x - target 1.3x: {verdict(ratio, ratio >= 1.3)}"
        if ratio is not None
        else "  1.3B FP8 vs bf16: not measured"
    )
    save = summary["checkpoint_1p3b"]
    lines.append(
        f"  1.3B async save stall: {save['stall_ms']:.0f} ms ({save['GB']:.1f} GB written at "
        f"{save['write_GBps']:.2f} GB/s) - target under 1 s: {verdict(save['stall_ms'], save['stall_ms'] < 1000)}"
        if save
        else "  1.3B async save stall: not measured"
    )
    for name, item in summary["items"].items():
        if item["exit"]:
            why = "timed out" if item["exit"] == 124 else f"exit {item['exit']}"
            lines.append(
                f"  {name}: {why} after {item['seconds']} s (limit {item['limit']} s); see {name}.log"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = summarize(read_items(args.results))
    print("\n".join(report(summary)))
    if args.summary:
        atomic_write_text(args.summary, json.dumps(summary, indent=1) + "\n")  # never a cut file
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
