"""Which node (or GPU) is slow: all_reduce between pairs, then the member whose best pair is slow.

Nodes: every pair of nodes in rounds (a round-robin tournament: each round pairs every node
once, so N nodes take N-1 rounds, N when N is odd: one sits out each round), or, above
`max_all_pairs` nodes, a few rounds of a bisection (the first half of the nodes against the
second, the halves rotated each round; an odd node out replaces a rotating first-half node
from the second round on).
A pair's all_reduce runs on all ranks of both nodes, so it crosses every NIC of the pair.
Ranks: the same, between the ranks of each node, on all nodes at once (the per-GPU straggler).

A member's score is the bus bandwidth of its best pair: a healthy member has at least one
healthy partner, a bad one slows every pair it is in. Members scoring `slow_pct` below the
median score are flagged, and so are all members of a pair below an absolute threshold when
no partner does better (two nodes alone cannot tell which of them is slow).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from gptrain.validate.bandwidth import busbw_GBps, element_count
from gptrain.validate.runtime import Context, gather_objects, mean_over_ranks, time_per_call


def round_robin(members: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds in which every pair of members meets exactly once (circle method)."""
    items: list[str | None] = list(members)
    if len(items) % 2:
        items.append(None)  # a bye
    n, rounds = len(items), []
    for _ in range(n - 1):
        pairs = [(items[i], items[n - 1 - i]) for i in range(n // 2)]
        rounds.append([tuple(sorted(p)) for p in pairs if p[0] is not None and p[1] is not None])
        items = [items[0], items[-1], *items[1:-1]]
    return rounds  # type: ignore[return-value]


def bisection(members: list[str], rounds: int) -> list[list[tuple[str, str]]]:
    """First half against the second half, rotated by one each round. An odd member out takes
    the place of a rotating first-half member from the second round on (so there are at least
    two rounds), which keeps every round's pairs disjoint and leaves no member untested."""
    half = len(members) // 2
    left, right, odd = members[:half], members[half : 2 * half], members[2 * half :]
    count = max(min(rounds, half), 2 if odd else 0)
    schedule = []
    for r in range(count):
        pairs = [(left[i], right[(i + r) % half]) for i in range(half)]
        if odd and r > 0:
            k = (r - 1) % half  # sits out this round, was paired in round 0
            pairs[k] = (odd[0], pairs[k][1])
        schedule.append([tuple(sorted(p)) for p in pairs])
    return schedule  # type: ignore[return-value]


def schedule(members: list[str], max_all_pairs: int, bisection_rounds: int) -> list[list[tuple[str, str]]]:
    if len(members) < 2:
        return []
    if len(members) <= max_all_pairs:
        return round_robin(members)
    return bisection(members, bisection_rounds)


@dataclass
class PairResult:
    level: str  # "node" or "rank"
    a: str
    b: str
    ranks: list[int]
    bytes: int
    time_us: float
    busbw_GBps: float


def pair_ranks(ctx: Context, level: str, a: str, b: str) -> list[int]:
    if level == "node":
        return [r for r, node in enumerate(ctx.nodes) if node in (a, b)]
    return [int(a), int(b)]


def member_of(ctx: Context, level: str) -> str:
    return ctx.node if level == "node" else str(ctx.rank)


def run_round(
    ctx: Context, level: str, pairs: list[tuple[str, str]], nbytes: int, iters: int, warmup: int
) -> list[PairResult]:
    """All pairs of one round at once; every rank creates every group (torch requires it)."""
    groups = [(a, b, pair_ranks(ctx, level, a, b)) for a, b in pairs]
    handles = [dist.new_group(ranks, timeout=ctx.timeout) for _, _, ranks in groups]
    mine = [i for i, (_, _, ranks) in enumerate(groups) if ctx.rank in ranks]
    result = None
    if mine:
        a, b, ranks = groups[mine[0]]
        group = handles[mine[0]]
        count = element_count("all_reduce", nbytes, len(ranks))
        buf = torch.zeros(count, dtype=torch.float32, device=ctx.device)
        seconds = time_per_call(lambda: dist.all_reduce(buf, group=group), ctx, iters, warmup, group)
        seconds = mean_over_ranks(seconds, ctx, group)
        bw = busbw_GBps("all_reduce", count * 4, seconds, len(ranks))
        result = PairResult(level, a, b, ranks, count * 4, seconds * 1e6, bw)
        del buf
    dist.barrier()
    for handle in handles:
        dist.destroy_process_group(handle)
    found = [r for i, r in enumerate(gather_objects(result)) if r is not None and i == r.ranks[0]]
    return found


def rank_rounds(ctx: Context, max_all_pairs: int, bisection_rounds: int) -> list[list[tuple[str, str]]]:
    """Pairs of ranks inside every node; round k of every node runs together."""
    per_node: dict[str, list[str]] = {}
    for rank, node in enumerate(ctx.nodes):
        per_node.setdefault(node, []).append(str(rank))
    schedules = [schedule(ranks, max_all_pairs, bisection_rounds) for ranks in per_node.values()]
    depth = max((len(s) for s in schedules), default=0)
    return [[p for s in schedules if k < len(s) for p in s[k]] for k in range(depth)]


def node_rounds(ctx: Context, max_all_pairs: int, bisection_rounds: int) -> list[list[tuple[str, str]]]:
    nodes = sorted(set(ctx.nodes), key=ctx.nodes.index)
    return schedule(nodes, max_all_pairs, bisection_rounds)


@dataclass
class Verdict:
    level: str
    scores: dict[str, float]  # member -> best pair busbw
    median: float
    flagged: dict[str, str]  # member -> why
    fabric: str | None = None  # every member below the threshold alike: the network, not a node

    def as_dict(self) -> dict:
        return asdict(self)


def find_slow(
    level: str, results: list[PairResult], slow_pct: float, min_busbw: float | None = None
) -> Verdict:
    """Score each member by its best pair; flag those far below the median (of three or more
    members from three or more distinct pairs) or all below min.

    When three or more members are all below `min_busbw`, the fabric is slow (EFA or InfiniBand not
    in use, a wrong NCCL transport), not a node: the verdict says so and flags only the members far
    below the others, since excluding every node would block every later launch (one member far
    below the median flagged every other member by the threshold: all of them were excluded)."""
    scores: dict[str, float] = {}
    for pair in results:
        for member in (pair.a, pair.b):
            scores[member] = max(scores.get(member, 0.0), pair.busbw_GBps)
    median = statistics.median(scores.values()) if scores else 0.0
    # members are not measurements: two nodes of two ranks give four scores from two pairs, and
    # the median of two pairs cannot tell which is slow (as two members alone cannot)
    judged = len(scores) > 2 and len({frozenset((pair.a, pair.b)) for pair in results}) > 2
    slow = {
        member: f"best pair {score:.3g} GB/s is {100 * (1 - score / median):.0f}% below the median {median:.3g} GB/s"
        for member, score in scores.items()
        if judged and score < median * (1 - slow_pct / 100)
    }
    if min_busbw is None:
        return Verdict(level, scores, median, slow)
    below = {
        member: f"best pair {score:.3g} GB/s is below the threshold {min_busbw:.3g} GB/s"
        for member, score in scores.items()
        if member not in slow and score < min_busbw
    }
    if len(scores) > 2 and all(score < min_busbw for score in scores.values()):
        best = max(scores.values())
        fabric = (
            f"every {level} pair is below the threshold {min_busbw:.3g} GB/s (best {best:.3g} GB/s): "
            "the fabric, not a node; check that NCCL uses the fast network (NCCL_DEBUG=INFO)"
        )
        return Verdict(level, scores, median, slow, fabric)
    return Verdict(level, scores, median, {**slow, **below})
