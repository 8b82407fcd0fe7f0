"""Who am I in the job, and the device mesh of the parallel layout.

The rank/world come from torchrun's variables or, under `srun` without torchrun, from
Slurm's. The master address falls back to the first host of the Slurm node list, parsed
here in Python so that no `scontrol` call is needed on compute nodes; the port to one every
task of the step derives alike (gptrain.utils.ports).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError, LaunchError
from gptrain.utils.hostlist import expand_hostlist
from gptrain.utils.ports import slurm_rendezvous_port

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class World:
    """This process's place in the job, read from the environment."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of the layout; dp is derived as world / (tp * pp).

    `dp_shard` < dp means hybrid sharding: dp = dp_replicate x dp_shard, FSDP shards
    inside a group of `dp_shard` ranks (usually one node) and replicates across groups.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    dp_shard: int = 0

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard if self.dp_shard else 1

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Shape and names of the mesh, outermost (slowest) dimension first.

        tp is innermost so that tensor-parallel ranks sit on one node (fast links), pp is
        outermost as in Megatron's default rank order.
        """
        if self.dp_shard and self.dp_shard != self.dp:
            return (self.pp, self.dp_replicate, self.dp_shard, self.tp), ("pp", "dp_rep", "dp_shard", "tp")
        return (self.pp, self.dp, self.tp), ("pp", "dp", "tp")


def world_from_env(env: Mapping[str, str] | None = None) -> World:
    """Rank, world size and rendezvous address from torchrun or Slurm variables."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", "0"))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, size = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local = int(env.get("SLURM_LOCALID", "0"))
    else:
        rank, size, local = 0, 1, 0
    addr = env.get("MASTER_ADDR")
    if not addr:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = first_host(nodelist) if nodelist else "127.0.0.1"
    port = int(env.get("MASTER_PORT") or slurm_rendezvous_port(env) or DEFAULT_MASTER_PORT)
    if not 0 <= rank < size:
        raise LaunchError(f"rank {rank} is outside world size {size}: check RANK/WORLD_SIZE or SLURM_PROCID")
    return World(rank=rank, world_size=size, local_rank=local, master_addr=addr, master_port=port)


def started_layout(env: Mapping[str, str] | None = None) -> tuple[int, ...] | None:
    """The processes torchrun or srun started on each node, as world_from_env finds them; None
    outside both. Slurm's tasks per node (`8(x2),4`: 8 on each of two nodes, then 4) where they add up
    to SLURM_NTASKS; else the count per node asked (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, the
    first of Slurm's) on each node and the rest on the last (WORLD_SIZE=12 LOCAL_WORLD_SIZE=8: 8, 4)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world, per_node = int(env["WORLD_SIZE"]), env.get("LOCAL_WORLD_SIZE")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        counts = slurm_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""))
        if counts is not None and sum(counts) == world:
            return counts
        per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    else:
        return None
    digits = re.match(r"\d+", per_node or "")
    local = min(max(int(digits.group()), 1), world) if digits else world
    return (local,) * (world // local) + ((world % local,) if world % local else ())


def slurm_tasks_per_node(text: str) -> tuple[int, ...] | None:
    """Slurm's compressed count per node (`8(x2),4` -> 8, 8, 4); None where `text` is not one."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return tuple(counts)


def first_host(nodelist: str) -> str:
    """The first host of Slurm's job node list: rank 0's, the rendezvous address."""
    try:
        return expand_hostlist(nodelist)[0]
    except LaunchError as error:
        raise LaunchError(f"SLURM_JOB_NODELIST: {error}") from None


def device_for(world: World, accelerator: str) -> str:
    """`cuda:<index>` on GPU (`cuda_index`), `cpu` otherwise."""
    return f"cuda:{cuda_index(world.local_rank)}" if accelerator == "gpu" else "cpu"


def cuda_index(local_rank: int, visible: int | None = None) -> int:
    """This rank's CUDA device among those it sees: its local rank where the node's GPUs are all
    visible, 0 where Slurm shows each task only its own (`--gpus-per-task=1`, cluster.gpus_per_task).
    `visible`: the device count (read from torch when None)."""
    if visible is None:
        import torch

        visible = torch.cuda.device_count()
    if visible == 0:
        raise ConfigError(
            "trainer.accelerator=gpu but no CUDA device is visible; use trainer.accelerator=cpu"
        )
    if local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise ConfigError(
        f"local rank {local_rank} sees {visible} CUDA devices"
        + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
        + ": run at most as many tasks per node as it has GPUs (trainer.devices), or give each task "
        "one GPU of its own (cluster.gpus_per_task=1)"
    )


def init_distributed(world: World, accelerator: str, timeout_minutes: float = 30.0) -> None:
    """Start the default process group (nccl on GPU, gloo on CPU) if not started yet."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if accelerator == "gpu":
        torch.cuda.set_device(cuda_index(world.local_rank))
    os.environ.setdefault("MASTER_ADDR", world.master_addr)
    os.environ.setdefault("MASTER_PORT", str(world.master_port))
    dist.init_process_group(
        backend="nccl" if accelerator == "gpu" else "gloo",
        init_method=f"tcp://{world.master_addr}:{world.master_port}",
        rank=world.rank,
        world_size=world.world_size,
        timeout=timedelta(minutes=timeout_minutes),
    )


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """The device mesh with named dims pp, dp (flattened for hybrid), tp, each dimension's groups
    with the default group's timeout (gptrain.utils.group_timeout: torch's own default otherwise)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape, names = dims.mesh_shape()
    timed = {name: options for name, size in zip(names, shape, strict=True) if (options := _timed(size))}
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=names, backend_override=timed)
    if "dp_rep" in names:
        mesh["dp_rep", "dp_shard"]._flatten("dp", backend_override=_timed(dims.dp))
    return mesh


def _timed(size: int) -> Any:
    """Options carrying the default group's timeout for the groups of a mesh dimension of `size`
    ranks, None for a dimension whose group is the default group itself (one spanning the world:
    torch makes no group for it, except for a gloo default group where CUDA is available)."""
    import torch
    import torch.distributed as dist

    from gptrain.utils.group_timeout import default_group_timeout

    timeout, backend = default_group_timeout(), dist.get_backend()
    spans_world = size == dist.get_world_size()
    if timeout is None or (spans_world and not (backend == "gloo" and torch.cuda.is_available())):
        return None
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return options
    from torch._C._distributed_c10d import Backend

    return Backend.Options(backend, timeout)  # gloo reads no other option


def shutdown(wait_for_peers: bool = True) -> None:
    """End a distributed process: barrier, then destroy the group.

    Without the barrier, gloo worker threads may release tensors during interpreter
    shutdown and abort the process after a correct run. A rank leaving by an error skips it
    (`wait_for_peers=False`): its peers may be blocked in a collective it will never join, and
    only its exit lets the launcher (srun --kill-on-bad-exit, torchrun) end them.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()
