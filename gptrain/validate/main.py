"""Run the chosen checks on every rank; rank 0 reports, decides the exit status, names nodes.

torch is imported only once the arguments and the profile are known to be good: a usage error
is one line, exit 2, before any process group starts (and without torch's import time).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError, GptrainError
from gptrain.utils.atomic import atomic_write_text
from gptrain.utils.paths import directory_blocker, look_up
from gptrain.validate import report
from gptrain.validate.bandwidth import size_sweep
from gptrain.validate.thresholds import Thresholds, load_thresholds

if TYPE_CHECKING:
    from gptrain.validate.runtime import Context

GPU_MAX_BYTES, CPU_MAX_BYTES = 8 << 30, 1 << 20
GPU_PAIR_BYTES, CPU_PAIR_BYTES = 256 << 20, 1 << 20
BISECTION_ROUNDS = 3


@dataclass
class Outcome:
    """Failed checks (one line each) and the nodes they blame."""

    failures: list[str] = field(default_factory=list)
    bad_nodes: set[str] = field(default_factory=set)
    summary: dict[str, Any] = field(default_factory=dict)


def say(ctx: Context, text: str) -> None:
    if ctx.rank == 0:
        print(text, flush=True)


def checked_sizes(low: int | None, high: int) -> list[int]:
    try:
        return size_sweep(low or 8, high)
    except ValueError as error:
        raise ConfigError(f"--min-bytes/--max-bytes: {error}") from None


def sizes_for(args: argparse.Namespace, ctx: Context) -> list[int]:
    return checked_sizes(args.min_bytes, args.max_bytes or (GPU_MAX_BYTES if ctx.is_gpu else CPU_MAX_BYTES))


def check_sizes_early(args: argparse.Namespace) -> None:
    """The sweep's bounds, before any process group: an explicit --max-bytes, or else the largest
    default (a --min-bytes above the CPU default is only found on a CPU world, once started)."""
    if args.check not in ("collectives", "all"):
        return
    if args.max_bytes is None and (args.min_bytes or 0) > GPU_MAX_BYTES:
        raise ConfigError(
            f"--min-bytes {args.min_bytes} is above the default --max-bytes ({GPU_MAX_BYTES} on GPUs, "
            f"{CPU_MAX_BYTES} on CPUs); pass a --max-bytes"
        )
    checked_sizes(args.min_bytes, args.max_bytes or GPU_MAX_BYTES)


def check_collectives(ctx: Context, args: argparse.Namespace, limits: Thresholds, out: Outcome) -> None:
    from gptrain.validate.collectives import sweep

    directory = Path(args.output_dir)
    rows: list[dict[str, Any]] = []

    def keep(row: Any) -> None:  # a sweep that stops (a hang, a lost GPU) leaves the rows it measured
        rows.append(row.as_dict())
        report.write_json(directory / "collectives.json", rows)

    sizes = fitting_sizes(ctx, args, out)
    sweep(ctx, sizes, args.iters, args.warmup, on_row=keep if ctx.rank == 0 else None)
    if ctx.rank != 0:
        return
    print(report.table(rows), flush=True)
    report.plot_busbw(directory / "collectives.png", rows)
    out.failures.extend(wrong_result_lines(rows))
    busbw_threshold(rows, limits, ctx, out)


def wrong_result_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A failure for each call whose output had wrong elements (nccl-tests' #wrong), naming its
    placement as the table's columns do: all_gather and reduce_scatter run both, and two lines
    alike could not say which of them was wrong."""
    return [
        f"collectives: {r['op']} ({'in-place' if r['in_place'] else 'out-of-place'}) at {r['bytes']} B"
        f" gave {r['wrong']} wrong element(s)"
        for r in rows
        if r["wrong"]
    ]


def fitting_sizes(ctx: Context, args: argparse.Namespace, out: Outcome) -> dict[str, list[int]]:
    """Each op's sizes that fit in the fullest rank's memory; the skipped ones said once."""
    from gptrain.validate.bandwidth import OPS
    from gptrain.validate.memory import fit_sizes, memory_budget

    sizes, skipped = fit_sizes(OPS, sizes_for(args, ctx), ctx.size, memory_budget(ctx))
    for item in skipped:
        say(ctx, item.line())
    out.summary["collectives_skipped"] = [item.as_dict() for item in skipped]
    return sizes


def busbw_threshold(rows: list[dict[str, Any]], limits: Thresholds, ctx: Context, out: Outcome) -> None:
    """The best all_reduce busbw at large sizes (or the largest size run) against the threshold."""
    reduce = [r for r in rows if r["op"] == "all_reduce"]
    large = [r for r in reduce if r["bytes"] >= limits.large_message_bytes] or [
        max(reduce, key=lambda r: r["bytes"])
    ]
    best = max(large, key=lambda r: r["busbw_GBps"])
    out.summary["all_reduce_large_busbw_GBps"] = best["busbw_GBps"]
    minimum = limits.busbw_threshold(ctx.multi_node)
    if minimum is not None and ctx.size == 1:  # first: no size or flag would make it apply
        print("collectives: busbw threshold not applied: a world of 1 moves no data between ranks")
        minimum = None
    if minimum is not None and not limits.holds_at(best["bytes"]):
        print(
            f"collectives: busbw threshold not applied: {short_of_large(best['bytes'], limits, '--max-bytes')}"
        )
        minimum = None
    if minimum is not None and ctx.multi_node:
        ranks_per_node = min(Counter(ctx.nodes).values())  # a ring goes at its thinnest node's rate
        share = limits.partial_node_share(ranks_per_node)
        if share < 1:
            minimum *= share
            say(
                ctx,
                f"collectives: {ranks_per_node} rank(s) a node of the profile's {limits.gpus_per_node}: the "
                f"inter-node busbw threshold is scaled to {minimum:.3g} GB/s (their NICs' share)",
            )
    out.summary["busbw_threshold_GBps"] = minimum
    if minimum is None:
        return
    if best["busbw_GBps"] < minimum:
        out.failures.append(
            f"collectives: all_reduce busbw {best['busbw_GBps']:.3g} GB/s at {best['bytes']} B is below "
            f"the threshold {minimum:.3g} GB/s"
        )


def short_of_large(nbytes: int, limits: Thresholds, flag: str) -> str:
    """Why a profile's busbw threshold does not judge a message of `nbytes` (Thresholds.holds_at):
    a healthy node measured below it was failed, and excluded."""
    from gptrain.validate.memory import size_text

    return (
        f"{size_text(nbytes)} is below the {size_text(limits.large_message_bytes)} the profile's threshold is"
        f" set for (large_message_bytes); raise {flag}, or give --min-busbw-GBps"
    )


def check_pairwise(ctx: Context, args: argparse.Namespace, limits: Thresholds, out: Outcome) -> None:
    from gptrain.validate import pairwise as pw

    nbytes = args.pair_bytes or (GPU_PAIR_BYTES if ctx.is_gpu else CPU_PAIR_BYTES)
    node_bytes = nbytes
    if not args.pair_bytes and ctx.is_gpu and limits.busbw_threshold(True) is not None:
        node_bytes = max(nbytes, limits.large_message_bytes)  # the size the threshold is set for
    levels = {
        "node": pw.node_rounds(ctx, args.max_all_pairs, BISECTION_ROUNDS),
        "rank": pw.rank_rounds(ctx, args.max_all_pairs, BISECTION_ROUNDS),
    }
    data: dict[str, Any] = {}
    for level, rounds in levels.items():
        results = [
            r
            for pairs in rounds
            for r in pw.run_round(
                ctx, level, pairs, node_bytes if level == "node" else nbytes, args.iters, args.warmup
            )
        ]
        floor = limits.busbw_threshold(True) if level == "node" else None
        if floor is not None and results and not limits.holds_at(node_bytes):
            say(
                ctx,
                f"pairwise: node pairs not held to the busbw threshold: {short_of_large(node_bytes, limits, '--pair-bytes')}",
            )
            floor = None
        if floor is not None:  # a node pair crosses the NICs of its ranks' GPUs only, as in collectives
            floor *= limits.partial_node_share(min(Counter(ctx.nodes).values()))
        verdict = pw.find_slow(level, results, limits.slow_pct, floor)
        if verdict.fabric:
            out.failures.append(f"pairwise: {verdict.fabric}")
        data[level] = {
            "rounds": len(rounds),
            "pairs": [vars(r) for r in results],
            "verdict": verdict.as_dict(),
        }
        for member, why in verdict.flagged.items():
            node = member if level == "node" else ctx.nodes[int(member)]
            where = f"node {node}" if level == "node" else f"rank {member} on {node}"
            out.failures.append(f"pairwise: {where}: {why}")
            out.bad_nodes.add(node)
        say(ctx, pair_summary(level, results, verdict))
        if ctx.rank == 0:  # the node pairs stay on record when the rank pairs then stop (a hang)
            report.write_json(Path(args.output_dir) / "pairwise.json", data)


def pair_summary(level: str, results: list[Any], verdict: Any) -> str:
    if not results:
        return f"pairwise {level}s: fewer than two {level}s to pair"
    low = min(results, key=lambda r: r.busbw_GBps)
    return (
        f"pairwise {level}s: {len(results)} pair(s), median best-pair busbw {verdict.median:.3g} GB/s, "
        f"slowest pair {low.a}-{low.b} {low.busbw_GBps:.3g} GB/s, flagged: {', '.join(verdict.flagged) or 'none'}"
    )


def check_gpus(ctx: Context, args: argparse.Namespace, limits: Thresholds, out: Outcome) -> None:
    from gptrain.validate.dcgm_gpus import dcgm_skipped_lines
    from gptrain.validate.fabric import fabric_down
    from gptrain.validate.gpus import dcgm_warning_lines, gpu_label, gpu_line, gpus_expected, judge, run_gpus
    from gptrain.validate.xid_findings import report_xids

    records = run_gpus(ctx, args.iters, args.warmup, args.dcgm_level, args.xid_since)
    if records is None:
        expected = gpus_expected(limits, args.expect_gpus)
        no_gpu(ctx, expected, Path(args.output_dir) / "gpus.json", out, args.check)
        return
    if ctx.rank != 0:
        return
    path = Path(args.output_dir) / "gpus.json"
    records = judge(records, limits)
    for r in records:
        print(gpu_line(r))
        for flag in r["flags"]:
            out.failures.append(f"gpus: rank {r['rank']} on {r['node']} {gpu_label(r)}: {flag}")
            out.bad_nodes.add(r["node"])
    for line in dcgm_warning_lines(records) + dcgm_skipped_lines(records):
        print(line)
    for node, line in fabric_down(records):
        print(line)
        out.failures.append(line)
        out.bad_nodes.add(node)
    xids = report_xids(records, out)
    report.write_json(path, {"gpus": records, **xids})


def no_gpu(ctx: Context, expected: str | None, path: Path, out: Outcome, check: str = "gpus") -> None:
    """No rank sees a CUDA GPU: skipped on a CPU machine (saying what does run there), a failure
    of each node that should have one."""
    from gptrain.validate.fabric import no_cuda_fabric_problem
    from gptrain.validate.runtime import gather_objects

    fabric = no_cuda_fabric_problem() if expected else None  # CUDA waits for the fabric manager
    reasons = gather_objects((ctx.node, expected, fabric))  # each node's own environment says
    if ctx.rank != 0:
        return
    missing = {node: why for node, why, _ in reasons if why}
    fabric_down = {node: problem for node, why, problem in reasons if why and problem}
    if not missing:
        cpu_checks = (
            "collectives and pairwise ran on the CPUs (gloo)"
            if check == "all"
            else "nothing was checked; `gptrain validate collectives` and `pairwise` run on CPUs (gloo)"
        )
        print(
            f"gpus: no CUDA GPU on {ctx.node}: the GPU checks (NVML health, bf16 matmul, copy bandwidth,"
            f" dcgmi diag) need one and were skipped; {cpu_checks}"
        )
        report.write_json(path, {"gpus": [], "skipped": f"no CUDA GPU on {ctx.node}"})
        return
    for node, why in sorted(missing.items()):
        cause = f"; NVML: {fabric_down[node]}" if node in fabric_down else ""
        out.failures.append(f"gpus: no CUDA GPU visible on {node}, but {why}{cause}")
        out.bad_nodes.add(node)
    report.write_json(path, {"gpus": [], "missing": missing})


CHECKS = {"collectives": check_collectives, "pairwise": check_pairwise, "gpus": check_gpus}


def conclude(ctx: Context, args: argparse.Namespace, out: Outcome) -> int:
    """Rank 0: print the verdict and the --exclude line, write validation.json; all ranks: its code."""
    code = 0
    if ctx.rank == 0:
        code = 1 if out.failures else 0
        if out.failures and not out.bad_nodes and len(set(ctx.nodes)) == 1:
            out.bad_nodes.update(ctx.nodes)  # one node ran every rank: it is the one to blame
        for line in out.failures:
            print(f"FAILED {line}")
        exclude = report.exclude_line(out.bad_nodes) if out.bad_nodes else None
        if exclude:
            print(exclude)
            if args.exclude_file:
                add_to_exclude_file(Path(args.exclude_file), out.bad_nodes)
        elif out.failures:
            print(no_node_to_blame(args.check))
        print("validation passed" if code == 0 else "validation FAILED", flush=True)
        raw = report.exclude_line(out.bad_nodes, quoted=False) if out.bad_nodes else None
        summary = {"passed": code == 0, "state": "done", "failures": out.failures, "exclude": raw}
        summary.update(out.summary)
        summary.update({"world_size": ctx.size, "nodes": sorted(set(ctx.nodes)), "check": args.check})
        report.write_json(Path(args.output_dir) / "validation.json", summary)
    import torch.distributed as dist

    decision = [code]
    dist.broadcast_object_list(decision, src=0)
    return int(decision[0])


def no_node_to_blame(check: str) -> str:
    """What to do when checks failed and named no node: find it with pairwise, unless pairwise
    just ran (check all) and found none slower than its peers (a slow fabric, said above)."""
    if check in ("pairwise", "all"):
        return "no single node is to blame: pairwise found none slower than its peers (see the lines above)"
    return "no single node is to blame; run `gptrain validate pairwise` across the nodes to find it"


def add_to_exclude_file(path: Path, nodes: set[str]) -> None:
    """Merge `nodes` into the one-line host list the launcher reads into cluster.exclude."""
    merged = read_exclude_file(path) | nodes
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, report.compress_hostlist(merged) + "\n")


def check_paths_early(args: argparse.Namespace) -> None:
    """--output-dir and --exclude-file, before any process group: found after the sweep, a bad one
    would cost its results (validation.json's verdict is written last) or blame nodes to nobody."""
    why = directory_blocker(args.output_dir, must_write=True)
    if why:
        raise ConfigError(
            f"--output-dir {args.output_dir}: cannot write the reports there ({why}); give a directory"
        )
    if args.exclude_file:
        path = Path(args.exclude_file)
        found = look_up(path)  # Path.is_dir raised PermissionError where it may not be looked up
        if found.kind == "unreachable":
            raise ConfigError(f"--exclude-file {path}: {found.why}")
        if found.kind == "directory":
            raise ConfigError(f"--exclude-file {path}: is a directory; give a file name (one host list line)")
        why = directory_blocker(path.parent, must_write=True)
        if why:
            raise ConfigError(f"--exclude-file {path}: cannot write it ({why}); give a writable path")
        read_exclude_file(path)


def read_exclude_file(path: Path) -> set[str]:
    """The hosts an exclude file lists (none when it does not exist); a line that is no Slurm host
    list is a ConfigError naming the file."""
    from gptrain.utils.hostlist import expand_hostlist, read_hostlist_file

    if not path.is_file():
        return set()
    return set(expand_hostlist(read_hostlist_file(path, "--exclude-file")))


def validate(args: argparse.Namespace) -> int:
    limits = load_thresholds(args.profile, args.min_busbw_GBps)  # bad profile: one line, before torch starts
    check_sizes_early(args)
    check_paths_early(args)
    from gptrain.validate.runtime import finish, start, start_failure

    first = (os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0") == "0"  # rank 0 to be
    if first:  # before the group forms: a run whose group never forms must not leave the last "passed"
        report.open_verdict(Path(args.output_dir), {"check": args.check})
    try:
        ctx = start(args.timeout)
    except GptrainError:
        raise
    except Exception as error:
        if os.environ.get("GPTRAIN_DEBUG"):
            raise
        error_line(line := start_failure(error, args.timeout))
        if first:
            report.stopped_verdict(Path(args.output_dir), line)
        return 1
    stage, together = "setup", False
    try:
        out = Outcome()
        checks = list(CHECKS) if args.check == "all" else [args.check]
        for stage in checks:
            CHECKS[stage](ctx, args, limits, out)
        stage = "the verdict"
        code = conclude(ctx, args, out)
        together = True
    except GptrainError as error:
        together = True  # every rank refuses alike (sizes no memory holds) and they leave together
        if ctx.rank == 0:
            report.stopped_verdict(Path(args.output_dir), (str(error).splitlines() or [""])[0])
        raise
    except Exception as error:
        if os.environ.get("GPTRAIN_DEBUG"):
            raise
        hint, listed = hung_peers(ctx, error, args.timeout, args.exclude_file)
        line = rank_failure(ctx, stage, error, hint)
        error_line(line)
        if ctx.rank == 0:
            report.stopped_verdict(Path(args.output_dir), line)
        if listed:
            from gptrain.validate.runtime import hang_reported

            hang_reported(ctx)  # the others' lines too, before any exit lets the launcher end them
        return 1
    finally:
        finish(wait_for_peers=together)
    sys.stdout.flush()
    return code


def error_line(line: str) -> None:
    """`line` and its newline in one write: the ranks that waited for a hung one print theirs at the
    same moment into the launcher's one stderr, and print's two writes (unbuffered, as under
    PYTHONUNBUFFERED=1) let another rank's line in before the newline."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def hung_peers(
    ctx: Context, error: Exception, timeout_s: float, exclude_file: str | None = None
) -> tuple[str, bool]:
    """For a collective that timed out: the ranks that never came (rank, node, --exclude=), found
    with the other ranks that timed out ('' for any other error or where they cannot be told), and
    whether this rank is on their list (it then waits for their lines before leaving).
    One of the ranks that timed out adds their nodes to --exclude-file, as a failed check would."""
    from gptrain.validate.runtime import HUNG_GRACE_S, is_peer_gone, is_timeout, unanswered_ranks

    timed_out = is_timeout(error)
    if ctx.size == 1 or not (timed_out or is_peer_gone(error)):
        return "", False
    grace = min(timeout_s, HUNG_GRACE_S)
    found = unanswered_ranks(
        ctx, grace, None if timed_out else 2 * grace + 5.0
    )  # its cutter fixes it in grace
    if found is None:
        return "", False
    if not found[0]:  # every rank timed out (said once, by the rank that fixed the list), or a crash
        return (EVERY_RANK_TIMED_OUT if timed_out and found[1] else ""), True
    missing, writer = found
    shown = ", ".join(f"rank {r} on {ctx.nodes[r]}" for r in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    exclude = report.exclude_line({ctx.nodes[r] for r in missing})
    added = ""
    if exclude_file and writer:  # once, before any rank's exit
        try:
            add_to_exclude_file(Path(exclude_file), {ctx.nodes[r] for r in missing})
            added = f", added to {exclude_file}"
        except (OSError, GptrainError) as failure:  # the line about the hang must still come out
            added = f"; not added to {exclude_file}: {(str(failure).splitlines() or [''])[0]}"
    return (
        f"; {'it' if timed_out else 'its peers'} waited --timeout {timeout_s:g} s for {shown}{more},"
        " which did not answer (hung or"
        f" stopped; every other rank timed out too): leave it out ({exclude}{added})"
    ), True


EVERY_RANK_TIMED_OUT = (
    "; every rank timed out together: the fabric or the collective hung, no rank to blame"
    " (`gptrain validate pairwise` finds a slow node or link)"
)


def rank_failure(ctx: Context, stage: str, error: Exception, hint: str = "") -> str:
    """One line for a rank that stopped alone (a GPU fallen off the bus, a disk full): who, where,
    why, and what to do; the launcher then ends the ranks waiting for it. `hint`: the ranks a
    timed-out collective waited for. A peer gone (gloo's or NCCL's wording) or a timeout is not
    blamed on this rank's node."""
    from gptrain.validate.runtime import is_peer_gone, is_timeout

    where = f"rank {ctx.rank} on {ctx.node}" + (f" (cuda:{ctx.device.index})" if ctx.is_gpu else "")
    reason = (str(error).strip().splitlines() or [""])[0]
    own = any(word in reason for word in ("CUDA", "NCCL", "cuda", "GPU")) and not is_timeout(error)
    if not hint and is_peer_gone(error):  # the peer's own line says why; not this node's fault
        hint = "; a peer rank stopped or the network to it failed: see the other ranks' lines"
    elif not hint and own:  # a timeout is no node's own: hung_peers named the ranks waited for
        hint = (
            f"; a GPU or network error there is the node's: leave it out ({report.exclude_line([ctx.node])})"
        )
    return (
        f"gptrain: error: validate: {where} stopped during {stage}: {type(error).__name__}: {reason}{hint}"
        " (GPTRAIN_DEBUG=1 shows where)"
    )
