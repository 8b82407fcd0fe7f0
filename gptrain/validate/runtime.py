"""The validation processes: who am I, which node, the process group, timing and the test hook.

Started like training (torchrun or srun, one process per GPU; one process alone is a world
of 1). Under srun without torchrun's variables the rendezvous address is the first node of
the allocation, resolved here (emulated nodes have names that do not resolve, so Slurm's
NodeAddr is asked for). The port: MASTER_PORT when set (the batch script's choice,
gptrain.launch.rendezvous), else gptrain.utils.ports' from the step's own variables.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gptrain.parallel.mesh import World, cuda_index, world_from_env
from gptrain.utils.hostlist import expand_hostlist
from gptrain.utils.ports import slurm_rendezvous_port

# Test-only hook: "RANK:SECONDS" makes that rank sleep before each collective it times,
# which is how the tests make one rank (and so its node) slow on purpose.
DELAY_ENV = "GPTRAIN_VALIDATE_TEST_DELAY"
TIMED_OUT_KEY = "gptrain/validate/timed-out"  # "0,1,3," : the ranks whose collective timed out
TIMED_OUT_COUNT_KEY = "gptrain/validate/timed-out-count"
TIMED_OUT_FINAL_KEY = "gptrain/validate/timed-out-final"  # the list as the first rank done waiting read it
REPORTED_KEY = "gptrain/validate/timed-out-reported"  # how many of them have printed their line
LEFT_KEY = "gptrain/validate/timed-out-left"  # how many of those other than rank 0 are done with the store
TIMED_OUT_WRITER_KEY = "gptrain/validate/timed-out-writer"  # the first to take 1 writes --exclude-file
TIMED_OUT_OWN_KEY = "gptrain/validate/timed-out-own"  # how many of them timed out themselves (not cut off)
CUT_OFF_QUIET_S = 5.0  # a rank cut off by a peer gives up after this when no rank has timed out (a crash)
HUNG_GRACE_S = 30.0  # the most a rank that timed out waits for the others to time out too
REPORTED_WAIT_S = 10.0  # the most it then waits for them to print theirs (each has the list by then)


@dataclass
class Context:
    """This process in the validation job."""

    world: World
    node: str
    device: torch.device
    backend: str
    nodes: list[str]  # node name of every rank, by rank
    timeout: timedelta = timedelta(minutes=10)
    """--timeout: how long a collective waits, also in the groups made later (torch's new_group
    would otherwise give them its own default, 30 minutes for gloo)."""

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.world_size

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def multi_node(self) -> bool:
        return len(set(self.nodes)) > 1


def node_name(env: dict[str, str] | os._Environ = os.environ) -> str:
    """Slurm's node name (distinct for emulated nodes on one host), else the short host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def start_failure(error: Exception, timeout_s: float) -> str:
    """One line for a process group that did not form (a rank that never started: its node down
    or unable to reach the rendezvous), where torch gave a traceback ending in 'Timed out after
    6 seconds waiting for clients. 2/3 clients joined.'"""
    world = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or "?"
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    reason = (str(error).strip().splitlines() or [""])[0].rstrip(".")
    return (
        f"gptrain: error: validate: rank {rank} on {node_name()} could not start the process group of"
        f" {world} ranks at {address} within --timeout {timeout_s:g} s: {type(error).__name__}: {reason};"
        " a rank that never started (its node down) or cannot reach that address keeps every rank"
        " waiting: see which task failed in srun's or torchrun's output"
    )


def _slurm_node_addr(host: str) -> str:
    try:
        out = subprocess.run(["scontrol", "show", "node", host], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return host
    for word in out.stdout.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    return host


def rendezvous_env() -> None:
    """Fill MASTER_ADDR/MASTER_PORT under srun (torchrun sets them itself)."""
    if "SLURM_PROCID" not in os.environ or "RANK" in os.environ:
        return
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if "MASTER_ADDR" not in os.environ and nodelist:
        first = expand_hostlist(nodelist)[0]
        try:
            socket.gethostbyname(first)
            os.environ["MASTER_ADDR"] = first
        except OSError:
            os.environ["MASTER_ADDR"] = _slurm_node_addr(first)
    port = slurm_rendezvous_port(os.environ)
    if "MASTER_PORT" not in os.environ and port is not None:
        os.environ["MASTER_PORT"] = str(port)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def select_device(world: World) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = cuda_index(world.local_rank)  # 0 where each task sees one GPU of its own
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def start(timeout_s: float = 600.0) -> Context:
    """Start the process group (NCCL on GPUs, gloo on CPUs) and learn every rank's node."""
    rendezvous_env()
    world = world_from_env()
    device = select_device(world)
    backend = "nccl" if device.type == "cuda" else "gloo"
    port = world.master_port
    if world.world_size == 1 and "MASTER_PORT" not in os.environ:
        port = _free_port()  # a lone process must not collide with another on the default port
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{world.master_addr}:{port}",
        rank=world.rank,
        world_size=world.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    me = node_name()
    nodes = gather_objects(me)
    return Context(
        world=world,
        node=me,
        device=device,
        backend=backend,
        nodes=nodes,
        timeout=timedelta(seconds=timeout_s),
    )


def finish(wait_for_peers: bool = True) -> None:
    """Barrier then destroy: gloo threads may otherwise abort the process at exit. A rank leaving
    alone by an error skips the barrier: its peers wait in a collective it never joins, and only
    its exit lets the launcher (torchrun, srun --kill-on-bad-exit) end them."""
    if dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's `obj`, in rank order (of `group`)."""
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def test_delay(rank: int, env: dict[str, str] | os._Environ = os.environ) -> float:
    """Seconds this rank sleeps before each timed collective (0 unless the test hook is set)."""
    spec = env.get(DELAY_ENV, "")
    if not spec:
        return 0.0
    target, _, seconds = spec.partition(":")
    return float(seconds or 0.01) if int(target) == rank else 0.0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(call: Callable[[], Any], ctx: Context, iters: int, warmup: int, group: Any = None) -> float:
    """Seconds per call: warm-up, then `iters` calls back to back between two synchronizations."""
    delay = test_delay(ctx.rank)
    for _ in range(warmup):
        if delay:
            time.sleep(delay)
        call()
    synchronize(ctx.device)
    dist.barrier(group=group)
    start_time = time.perf_counter()
    for _ in range(iters):
        if delay:
            time.sleep(delay)
        call()
    synchronize(ctx.device)
    return (time.perf_counter() - start_time) / iters  # the CLI requires iters >= 1


def is_timeout(error: BaseException) -> bool:
    """A collective that waited --timeout for a peer (gloo: "Timed out waiting ...ms for recv";
    NCCL's watchdog: "collective operation timeout"); not CUDA's cudaErrorLaunchTimeout ("the launch
    timed out and was terminated"), a kernel this rank's GPU killed."""
    text = str(error).lower()
    return ("timed out" in text or "timeout" in text) and "launch timed out" not in text


PEER_GONE = (
    "connection closed by peer",  # gloo's
    "connection reset by peer",
    "broken pipe",
    "remote process exited",  # NCCL's ncclRemoteError: "remote process exited or there was a network error"
    "ncclremoteerror",
    "closed by remote peer",  # NCCL's sockets: "Net : Connection closed by remote peer <host>"
)


def is_peer_gone(error: BaseException) -> bool:
    """A collective ended by a peer that closed its connection (gloo: "Connection closed by peer";
    NCCL: ncclRemoteError), as the first rank to time out waiting for a hung one does: its
    neighbours see this, not their own timeout."""
    text = str(error).lower()
    return any(words in text for words in PEER_GONE)


def _heard(text: bytes | str) -> set[int]:
    words = text.decode() if isinstance(text, bytes) else text
    return {int(word) for word in words.split(",") if word}


def unanswered_ranks(
    ctx: Context, grace_s: float, cut_off_s: float | None = None
) -> tuple[list[int], bool] | None:
    """After a timeout: the ranks that did not time out too, i.e. the ones everyone waited for,
    and whether this rank is the one of them to write them down (the first to have the list).

    A collective's timeout names no peer. Every rank that timed out appends its rank to a key of
    the process group's store (a TCPStore server on rank 0, alive while its threads are) and waits
    up to `grace_s` for the others; the ranks never heard from are the hung ones. The first rank
    whose wait ends fixes the list (compare-and-set) and ends the others' wait: every rank names
    the same ranks, a late one too. The caller prints its line, then calls `hang_reported`, which
    keeps each of them (rank 0, the store's host, above all) until all have theirs. None where
    the store cannot be reached (rank 0's process gone).

    `cut_off_s`: this rank's collective ended because a peer closed its connection, before its own
    timeout: it joins the list but leaves fixing it to a rank that timed out, and waits for that up
    to `cut_off_s` (a peer that timed out fixes it within its grace; after a peer's crash the
    others still wait out --timeout, and a list fixed now would name them all); none by then, or
    no rank timed out within CUT_OFF_QUIET_S (a crash): none named."""
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=max(grace_s, 5.0)))
        store.append(TIMED_OUT_KEY, f"{ctx.rank},")
        count = store.add(TIMED_OUT_COUNT_KEY, 1)
        if cut_off_s is None:
            store.add(TIMED_OUT_OWN_KEY, 1)
        start = time.monotonic()
        deadline = start + (grace_s if cut_off_s is None else cut_off_s)
        while count < ctx.size and time.monotonic() < deadline and not store.check([TIMED_OUT_FINAL_KEY]):
            quiet = cut_off_s is not None and time.monotonic() > start + CUT_OFF_QUIET_S
            if quiet and not store.add(TIMED_OUT_OWN_KEY, 0):  # no rank timed out: its cutter crashed
                break
            time.sleep(0.2)
            count = store.add(TIMED_OUT_COUNT_KEY, 0)
        if cut_off_s is not None and count < ctx.size and not store.check([TIMED_OUT_FINAL_KEY]):
            return [], False
        final = store.compare_set(TIMED_OUT_FINAL_KEY, "", store.get(TIMED_OUT_KEY).decode())
        heard = _heard(final) | {ctx.rank}  # a rank later than the list names the others it lists
        writer = store.add(TIMED_OUT_WRITER_KEY, 1) == 1
    except Exception:
        return None
    return [rank for rank in range(ctx.size) if rank not in heard], writer


def hang_reported(ctx: Context, wait_s: float = REPORTED_WAIT_S) -> None:
    """After `unanswered_ranks` and this rank's line: count it as said, and wait (at most `wait_s`)
    until every rank that timed out has said its own. Rank 0 hosts the store the others read the
    list from, and the first exit lets the launcher (torchrun, srun --kill-on-bad-exit) end the
    ranks still waiting: whoever left first cost the others their line. Rank 0 leaves last, once
    the others are done with its store (a client that finds the store gone prints torch's warning
    and a C++ stack under the line)."""
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        done = store.add(REPORTED_KEY, 1)
        deadline = time.monotonic() + wait_s
        while done < len(_heard(store.get(TIMED_OUT_KEY))) and time.monotonic() < deadline:
            time.sleep(0.1)
            done = store.add(REPORTED_KEY, 0)
        if ctx.rank != 0:
            store.add(LEFT_KEY, 1)  # its last word to the store
            return
        deadline += 5.0
        while (
            store.add(LEFT_KEY, 0) < len(_heard(store.get(TIMED_OUT_KEY))) - 1 and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    except Exception:  # the store gone (rank 0's process ended): nothing to wait for
        return


def mean_over_ranks(value: float, ctx: Context, group: Any = None) -> float:
    """The average of `value` over the ranks of `group` (nccl-tests' default report)."""
    tensor = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, group=group)
    return float(tensor.item()) / dist.get_world_size(group)
