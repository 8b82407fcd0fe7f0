"""Bandwidth arithmetic of nccl-tests (no torch): sizes, element counts, algbw and busbw.

nccl-tests reports, for a message of S bytes timed at t seconds per operation,
algbw = S / t and busbw = algbw x factor(op, n), where the factor makes busbw comparable to
the hardware's link bandwidth whatever the number of ranks n (nccl-tests' PERFORMANCE.md):
all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast 1.
S is the size of the whole message: for all_gather the gathered output, for reduce_scatter
the input that is scattered, for all_to_all the buffer each rank sends. GB means 1e9 bytes.
"""

from __future__ import annotations

import math

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
# Operations whose buffer is split in n equal chunks: element counts are multiples of n.
CHUNKED = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
ELEMENT_BYTES = 4  # float32, nccl-tests' default type


def bus_factor(op: str, world_size: int) -> float:
    """busbw / algbw for `op` on `world_size` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in CHUNKED:
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def algbw_GBps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw_GBps(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    return algbw_GBps(nbytes, seconds) * bus_factor(op, world_size)


def element_count(op: str, nbytes: int, world_size: int) -> int:
    """float32 elements for a message of about `nbytes` (rounded down, at least one per rank)."""
    count = max(1, nbytes // ELEMENT_BYTES)
    if op in CHUNKED:
        count = max(world_size, count // world_size * world_size)
    return count


def call_count(op: str, count: int, world_size: int) -> int:
    """The count nccl-tests prints for a message of `count` elements: the NCCL call's own count
    argument, one rank's chunk for the chunked ops (all_gather's sendcount, reduce_scatter's
    recvcount, all_to_all's count per peer), the whole buffer for the others."""
    return count // world_size if op in CHUNKED else count


def distinct_messages(op: str, sizes: list[int], world_size: int) -> list[int]:
    """`sizes` less those whose message, once rounded to whole elements (and n equal chunks), an
    earlier size already sends: on 512 ranks all_gather's 8 B to 2 KiB are all one 2 KiB message,
    which was measured nine times (the table kept one row, the JSON and the plot all nine)."""
    seen: set[int] = set()
    kept = []
    for nbytes in sizes:
        count = element_count(op, nbytes, world_size)
        if count not in seen:
            seen.add(count)
            kept.append(nbytes)
    return kept


def size_sweep(min_bytes: int, max_bytes: int) -> list[int]:
    """min, 2 min, 4 min, ... up to max (nccl-tests -f 2); max is included when not a power step."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError(f"need 0 < min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


def parse_bytes(text: str) -> int:
    """`8`, `64K`, `1M`, `8G`, `1GiB`, `512MB` -> bytes (K/M/G are powers of 1024, as nccl-tests)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if value.endswith(suffix):
            value, scale = value[:-1], factor
            break
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 8, 64K, 1M, 8G)") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"size must be a positive finite number of bytes: {text!r}")
    if not (number * scale).is_integer():  # int() cut 0.5 to no bytes, 1.5 to 1: a size nobody wrote
        raise ValueError(f"size must be a whole number of bytes: {text!r}")
    return int(number * scale)
