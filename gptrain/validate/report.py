"""What `gptrain validate` writes: the nccl-tests table, JSON files, a PNG, the `--exclude=` line.

The table keeps nccl-tests' columns (size, count, type, redop, root, then time, algbw,
busbw and #wrong for out-of-place and for in-place), so people who read nccl-tests output
read this one; a placement torch.distributed does not offer shows N/A.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gptrain.utils.atomic import atomic_write_bytes, atomic_write_text

HEADER = (
    "#                                                              out-of-place                       in-place          \n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "
)


def _cells(row: dict[str, Any] | None) -> str:
    if row is None:
        return f"{'N/A':>8} {'N/A':>7} {'N/A':>7} {'N/A':>6}"
    return f"{row['time_us']:8.1f} {row['algbw_GBps']:7.2f} {row['busbw_GBps']:7.2f} {row['wrong']:6d}"


def table(rows: Iterable[dict[str, Any]]) -> str:
    """nccl-tests' layout: one block per operation, one line per size."""
    blocks: dict[str, dict[int, dict[bool, dict[str, Any]]]] = {}
    for row in rows:
        blocks.setdefault(row["op"], {}).setdefault(row["bytes"], {})[row["in_place"]] = row
    lines = []
    for op, sizes in blocks.items():
        first = next(iter(next(iter(sizes.values())).values()))
        lines.append(f"# {op}: {first['world_size']} rank(s) on {first['nodes']} node(s), {first['backend']}")
        lines.append(HEADER)
        for nbytes, placed in sizes.items():
            any_row = next(iter(placed.values()))
            lines.append(
                f"{nbytes:12d} {any_row['count']:13d} {any_row['dtype']:>9} {any_row['redop']:>7} "
                f"{any_row['root']:7d} {_cells(placed.get(False))} {_cells(placed.get(True))}"
            )
        busbw = [r["busbw_GBps"] for p in sizes.values() for r in p.values()]
        lines.append(f"# Avg bus bandwidth    : {sum(busbw) / len(busbw):.4g} GB/s")
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


CHECK_REPORTS = {
    "collectives": ("collectives.json", "collectives.png"),
    "pairwise": ("pairwise.json",),
    "gpus": ("gpus.json",),
}


def open_verdict(directory: Path, run: dict[str, Any]) -> None:
    """Before the first check: the last verdict, and the reports this run's checks will write, go to
    previous/ (a "passed": true must not outlive a run that stops or hangs); the other checks' reports
    stay where they are (one check at a time into one directory keeps each check's last report), and
    validation.json says this run is running."""
    directory.mkdir(parents=True, exist_ok=True)
    check = run.get("check", "all")
    rewritten = [name for key, names in CHECK_REPORTS.items() if check in (key, "all") for name in names]
    kept = directory / "previous"
    for name in ("validation.json", *rewritten):
        if (directory / name).exists():
            kept.mkdir(exist_ok=True)
            os.replace(directory / name, kept / name)
    write_json(directory / "validation.json", {"passed": False, "state": "running", **run})


def stopped_verdict(directory: Path, error: str) -> None:
    """Rank 0 stopped on an error: validation.json says so, with the error line."""
    path = directory / "validation.json"
    try:
        summary = json.loads(path.read_text())
        write_json(path, {**summary, "passed": False, "state": "stopped", "error": error})
    except (OSError, ValueError):  # the error line on stderr is what counts
        pass


def plot_busbw(path: Path, rows: list[dict[str, Any]]) -> None:
    """busbw against message size, one line per operation and placement (log-log axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    series: dict[tuple[str, bool], list[tuple[int, float]]] = {}
    for row in rows:
        series.setdefault((row["op"], row["in_place"]), []).append((row["bytes"], row["busbw_GBps"]))
    for (op, in_place), points in series.items():
        points.sort()
        ax.plot(
            [p[0] for p in points],
            [max(p[1], 1e-6) for p in points],
            marker="o",
            markersize=3,
            linestyle="--" if in_place else "-",
            label=f"{op} ({'in-place' if in_place else 'out-of-place'})",
        )
    first = rows[0] if rows else {"world_size": 0, "nodes": 0, "backend": "?"}
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(
        f"gptrain validate: {first['world_size']} rank(s), {first['nodes']} node(s), {first['backend']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def compress_hostlist(hosts: Iterable[str]) -> str:
    """Slurm host list syntax: n1,n2,n3,gpu07 -> n[1-3],gpu07 (zero padding kept)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for host in sorted(set(hosts)):
        match = re.fullmatch(r"(.*?)(\d+)", host)
        if match is None:
            plain.append(host)
            continue
        prefix, digits = match.groups()
        width = len(digits) if digits.startswith("0") else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    parts = list(plain)
    for (prefix, width), numbers in sorted(groups.items()):
        numbers.sort()
        ranges, start, prev = [], numbers[0], numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(prefix + (ranges[0] if len(numbers) == 1 else f"[{','.join(ranges)}]"))
    return ",".join(parts)


def exclude_line(nodes: Iterable[str], quoted: bool = True) -> str:
    """sbatch's --exclude= for `nodes`; quoted for the shell it is pasted into (n[1-2] is a glob to
    bash and an error to zsh's nomatch), unquoted for validation.json, which no shell reads."""
    hosts = compress_hostlist(nodes)
    return f"--exclude={shlex.quote(hosts) if quoted else hosts}"
