"""The message sizes of the collectives sweep that fit in memory, agreed by every rank.

A checked call holds its input, its output and the output it must give at once (all_gather's
output and all_to_all's buffers are each the full message), plus one chunk's comparison mask:
the default 8 GiB sweep needs 16 to 24 GiB per GPU, more than a 24 GB GPU has free. Sizes a
rank cannot hold are skipped by every rank (a collective one rank skips and others run hangs),
and said once; a sweep where an operation keeps no size at all is a one-line error.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from gptrain.errors import ConfigError
from gptrain.validate.bandwidth import ELEMENT_BYTES, element_count
from gptrain.validate.collectives import COMPARE_CHUNK, PLACEMENTS
from gptrain.validate.runtime import Context

GIB = 1 << 30
# Kept free beyond the buffers: NCCL's per-peer buffers and the CUDA context's lazy allocations
# (hundreds of MiB, growing with the peers), the caching allocator's 2 MiB rounding and
# fragmentation, gloo's copies on CPUs. A fraction of the total scales with the GPU; the fixed
# part covers the communicator on a small one. Both are guesses on the safe side: a skipped size
# costs one line of the table, an out-of-memory error the whole validation.
MARGIN_FRACTION = 0.10
MARGIN_FIXED = 1 << 30


def buffer_elements(op: str, count: int, in_place: bool, world_size: int) -> int:
    """float32 elements `make_buffers` allocates for a message of `count` (views cost none)."""
    chunk = count // world_size
    if op in ("all_reduce", "broadcast"):  # in place: out, expected
        return 2 * count
    if op == "all_gather":  # out, expected (count each), inp (a chunk, or a view of out)
        return 2 * count + (0 if in_place else chunk)
    if op == "reduce_scatter":  # inp (count), expected (a chunk), out (a chunk, or a view of inp)
        return count + (1 if in_place else 2) * chunk
    if op == "all_to_all":
        return 3 * count
    raise ValueError(f"unknown collective {op!r}")


def bytes_needed(
    op: str, nbytes: int, in_place: bool, world_size: int, compare_chunk: int = COMPARE_CHUNK
) -> int:
    """Peak bytes per rank of the checked call: its buffers and one chunk's bool mask."""
    count = element_count(op, nbytes, world_size)
    compared = count // world_size if op == "reduce_scatter" else count
    return buffer_elements(op, count, in_place, world_size) * ELEMENT_BYTES + min(compared, compare_chunk)


def op_need(op: str, nbytes: int, world_size: int) -> int:
    """Bytes per rank the op needs at `nbytes`: its hungriest placement."""
    return max(bytes_needed(op, nbytes, in_place, world_size) for in_place in PLACEMENTS[op])


@dataclass
class Budget:
    """Memory of the fullest rank: what one rank's buffers may take, and what was free."""

    usable: int  # bytes, the margin taken off and shared among the ranks on one memory
    free: int  # bytes free on the rank with the least
    where: str  # "GPU" or "process": what the figures are per


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(available, total) bytes of host memory: Linux's MemAvailable, else free pages."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024, int(fields["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def local_memory(ctx: Context) -> tuple[int, int]:
    """(free, total) bytes of this rank's GPU, or of the host on CPUs."""
    if not ctx.is_gpu:
        return host_memory()
    torch.cuda.empty_cache()  # memory torch cached but does not use is free for the sweep
    return torch.cuda.mem_get_info(ctx.device)


def usable_bytes(free: int, total: int, sharers: int) -> int:
    """Free memory less the margin, split among the ranks that share it (CPU ranks of a node)."""
    return max(0, int(free - MARGIN_FRACTION * total - MARGIN_FIXED) // sharers)


def min_over_ranks(values: list[int], ctx: Context) -> list[int]:
    """Each value's minimum over all ranks, so that every rank takes the same decision."""
    tensor = torch.tensor(values, dtype=torch.int64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return [int(v) for v in tensor.tolist()]


def memory_budget(ctx: Context) -> Budget:
    free, total = local_memory(ctx)
    sharers = 1 if ctx.is_gpu else ctx.nodes.count(ctx.node)
    usable, least_free = min_over_ranks([usable_bytes(free, total, sharers), free], ctx)
    return Budget(usable=usable, free=least_free, where="GPU" if ctx.is_gpu else "process")


def size_text(nbytes: int) -> str:
    """8 B, 64 KiB, 1.5 MiB, 8 GiB."""
    for unit, name in ((GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:.3g} {name}"
    return f"{nbytes} B"


@dataclass
class Skipped:
    """The sizes of one op left out of the sweep, and why."""

    op: str
    largest_kept: int
    sizes: list[int]
    need_bytes: int  # of the smallest size left out, per rank
    usable_bytes: int
    free_bytes: int
    per: str

    def line(self) -> str:
        return (
            f"collectives: {self.op}: sizes above {size_text(self.largest_kept)} skipped: "
            f"{size_text(self.sizes[0])} needs {self.need_bytes / GIB:.2f} GiB per {self.per}, "
            f"{self.usable_bytes / GIB:.2f} GiB usable of {self.free_bytes / GIB:.2f} GiB free"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def fit_sizes(
    ops: tuple[str, ...], sizes: list[int], world_size: int, budget: Budget
) -> tuple[dict[str, list[int]], list[Skipped]]:
    """Each op's sizes that fit the budget, and those skipped; ConfigError if an op keeps none."""
    kept: dict[str, list[int]] = {}
    skipped = []
    for op in ops:
        kept[op] = [s for s in sizes if op_need(op, s, world_size) <= budget.usable]
        left_out = [s for s in sizes if s not in kept[op]]
        need = op_need(op, left_out[0], world_size) if left_out else 0
        if not kept[op]:
            raise ConfigError(
                f"collectives: {op} at the smallest size, {size_text(sizes[0])}, needs {size_text(need)} per "
                f"{budget.where} and {size_text(budget.usable)} are usable ({budget.free / GIB:.2f} GiB free, "
                f"less a margin of {MARGIN_FRACTION:.0%} of the total + {size_text(MARGIN_FIXED)}): free "
                "memory, or pass a smaller --min-bytes and --max-bytes"
            )
        if left_out:
            skipped.append(
                Skipped(op, kept[op][-1], left_out, need, budget.usable, budget.free, budget.where)
            )
    return kept, skipped
