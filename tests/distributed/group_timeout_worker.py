"""One gloo rank of tests/distributed/test_group_timeouts.py: start the default group with a raised
timeout, make every process group gptrain makes (device meshes of several layouts, the pipeline's
embedding pairs, the background saves' group) and write what each one's timeout and ranks are.

argv: the default group's timeout in minutes, the output directory (one JSON per rank)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from gptrain.checkpoint.background_save import background_save_group
from gptrain.parallel.mesh import ParallelDims, build_mesh, init_distributed, shutdown, world_from_env
from gptrain.parallel.pipeline import embedding_group


def described(group: dist.ProcessGroup) -> dict[str, object]:
    """The group's timeout as its gloo backend holds it (read here, not through gptrain), its ranks,
    and whether it is the default group itself."""
    timeout = group._get_backend(torch.device("cpu")).options._timeout
    return {
        "timeout_s": timeout.total_seconds(),
        "ranks": dist.get_process_group_ranks(group),
        "default": group is dist.group.WORLD,
    }


def main() -> None:
    minutes, out = float(sys.argv[1]), Path(sys.argv[2])
    world = world_from_env()
    init_distributed(world, "cpu", minutes)
    groups = {"default": described(dist.group.WORLD)}
    layouts = {  # 4 ranks: pp x dp x tp, pipeline with hybrid sharding (flattened dp of 2), plain dp
        "tp2": ParallelDims(4, tp=2),
        "pp2-hsdp": ParallelDims(4, pp=2, dp_shard=1),
        "dp4": ParallelDims(4),
    }
    for label, dims in layouts.items():
        mesh = build_mesh(dims, "cpu")
        for name in (*mesh.mesh_dim_names, *(["dp"] if "dp_rep" in mesh.mesh_dim_names else [])):
            groups[f"{label}/{name}"] = described(mesh[name].get_group())
        if dims.pp > 1:
            pair = embedding_group(mesh)
            assert pair is not None  # two stages: every rank is on the first or the last
            groups[f"{label}/embedding"] = described(pair)
    groups["background_save"] = described(background_save_group())
    (out / f"rank{world.rank}.json").write_text(json.dumps(groups))
    shutdown()


if __name__ == "__main__":
    main()
