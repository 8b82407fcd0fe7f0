"""Bandwidth sweep of the collectives training uses, reported as nccl-tests reports it.

For each operation, message size and placement: one checked call (inputs with known
values, the number of wrong output elements counted as nccl-tests' `#wrong`), then warm-up
and timed calls on zeroed buffers. torch.distributed's all_reduce and broadcast work in
place only; all_gather and reduce_scatter run out of place and in place (the input is the
output's own chunk, as NCCL defines in-place); all_to_all runs out of place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from gptrain.validate.bandwidth import (
    algbw_GBps,
    busbw_GBps,
    call_count,
    distinct_messages,
    element_count,
)
from gptrain.validate.runtime import Context, mean_over_ranks, time_per_call

PLACEMENTS = {
    "all_reduce": (True,),
    "all_gather": (False, True),
    "reduce_scatter": (False, True),
    "all_to_all": (False,),
    "broadcast": (True,),
}
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}
# Elements compared at once (64 MiB of float32): the check's mask is 16 MiB, not the message's size.
COMPARE_CHUNK = 16 << 20


@dataclass
class Row:
    """One line of the report: an operation at one size and placement."""

    op: str
    bytes: int
    """the whole message (all_gather's gathered output), nccl-tests' size"""
    count: int
    """the call's count: elements per rank for the chunked ops, as nccl-tests prints it"""
    dtype: str
    redop: str
    root: int
    in_place: bool
    world_size: int
    nodes: int
    backend: str
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Buffers:
    """Input and output of one call; `expected` is the output the checked call must give."""

    inp: torch.Tensor
    out: torch.Tensor
    expected: torch.Tensor


def make_buffers(op: str, count: int, in_place: bool, ctx: Context) -> Buffers:
    """Buffers filled so that each op's correct result is known on every rank."""
    n, r, dev = ctx.size, ctx.rank, ctx.device
    chunk = count // n

    def full(value: float, length: int = count) -> torch.Tensor:
        return torch.full((length,), float(value), dtype=torch.float32, device=dev)

    if op == "all_reduce":
        out = full(r + 1)
        return Buffers(out, out, full(n * (n + 1) / 2))
    if op == "broadcast":
        out = full(7 if r == 0 else 0)
        return Buffers(out, out, full(7))
    if op == "all_gather":
        out = full(0)
        inp = out[r * chunk : (r + 1) * chunk] if in_place else full(0, chunk)
        inp.fill_(r + 1)
        expected = torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat_interleave(chunk)
        return Buffers(inp, out, expected)
    if op == "reduce_scatter":
        inp = full(r + 1)
        out = inp[r * chunk : (r + 1) * chunk] if in_place else full(0, chunk)
        return Buffers(inp, out, full(n * (n + 1) / 2, chunk))
    if op == "all_to_all":  # chunk j of rank r goes to rank j: value r*n + j + 1
        inp = (r * n + 1 + torch.arange(n, device=dev, dtype=torch.float32)).repeat_interleave(chunk)
        expected = (torch.arange(n, device=dev, dtype=torch.float32) * n + r + 1).repeat_interleave(chunk)
        return Buffers(inp, full(0), expected)
    raise ValueError(f"unknown collective {op!r}")


def caller(op: str, buf: Buffers, group: object = None) -> Callable[[], object]:
    if op == "all_reduce":
        return lambda: dist.all_reduce(buf.out, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(buf.out, src=0, group=group)
    if op == "all_gather":  # torch >= 2.13 names it all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(buf.out, buf.inp, group=group)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(buf.out, buf.inp, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(buf.out, buf.inp, group=group)
    raise ValueError(f"unknown collective {op!r}")


def wrong_elements(out: torch.Tensor, expected: torch.Tensor, chunk: int = COMPARE_CHUNK) -> torch.Tensor:
    """Elements of `out` unequal to `expected` (a 0-d int64 tensor), compared `chunk` at a time so
    that no temporary is as large as the message."""
    wrong = torch.zeros((), dtype=torch.int64, device=out.device)
    for start in range(0, out.numel(), chunk):
        wrong += torch.count_nonzero(out[start : start + chunk] != expected[start : start + chunk])
    return wrong


def count_wrong(op: str, count: int, in_place: bool, ctx: Context) -> int:
    """Run the op once on known inputs; wrong output elements summed over ranks."""
    buf = make_buffers(op, count, in_place, ctx)
    caller(op, buf)()
    wrong = wrong_elements(buf.out, buf.expected).to(torch.float64)
    dist.all_reduce(wrong)
    return int(wrong.item())


def measure(op: str, nbytes: int, in_place: bool, ctx: Context, iters: int, warmup: int) -> Row:
    count = element_count(op, nbytes, ctx.size)
    size = count * 4
    wrong = count_wrong(op, count, in_place, ctx)
    buf = make_buffers(op, count, in_place, ctx)
    buf.inp.zero_()  # repeated in-place sums of non-zero data would overflow to inf
    buf.out.zero_()
    seconds = mean_over_ranks(time_per_call(caller(op, buf), ctx, iters, warmup), ctx)
    del buf
    return Row(
        op=op,
        bytes=size,
        count=call_count(op, count, ctx.size),
        dtype="float",
        redop=REDOP.get(op, "none"),
        root=0 if op == "broadcast" else -1,
        in_place=in_place,
        world_size=ctx.size,
        nodes=len(set(ctx.nodes)),
        backend=ctx.backend,
        time_us=seconds * 1e6,
        algbw_GBps=algbw_GBps(size, seconds),
        busbw_GBps=busbw_GBps(op, size, seconds, ctx.size),
        wrong=wrong,
    )


def sweep(
    ctx: Context,
    sizes: dict[str, list[int]],
    iters: int,
    warmup: int,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Every op x its distinct messages x placement; `on_row` sees each row as it is measured
    (rank 0 prints)."""
    rows = []
    for op, op_sizes in sizes.items():
        for nbytes in distinct_messages(op, op_sizes, ctx.size):
            for in_place in PLACEMENTS[op]:
                row = measure(op, nbytes, in_place, ctx, iters, warmup)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows
