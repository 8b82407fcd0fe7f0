"""One gloo rank for tests/checkpoint/test_staging_buffer.py: an async save of a sharded state
(a DTensor split over the two ranks and a replicated one) through a staging buffer prepared
ahead by `host_buffer_like`, as on CUDA (here unpinned); the checkpoint is loaded back with DCP
into fresh DTensors and compared with the values at the save. Arguments: ROOT [cuda]; with cuda
(one rank per GPU) the buffer is torch's pinned host memory, allocated by gptrain's own function."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from gloo_worker import run_as_rank
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from gptrain.checkpoint import manager as manager_module
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.checkpoint.staging_buffer import host_buffer_like

FULL = torch.arange(24, dtype=torch.float64).reshape(6, 4)


def sharded_state(mesh, shift: float) -> dict:
    device = mesh.device_type
    return {
        "model": {
            "w": distribute_tensor((FULL + shift).to(device), mesh, [Shard(0)]),
            "b": distribute_tensor(torch.full((3,), 7.0 + shift, device=device), mesh, [Replicate()]),
        },
        "iteration": 5,
    }


def main() -> int:
    on_cuda = sys.argv[2:] == ["cuda"]
    dist.init_process_group("cpu:gloo,cuda:nccl" if on_cuda else "gloo")
    if on_cuda:
        torch.cuda.set_device(dist.get_rank())
    mesh = init_device_mesh("cuda" if on_cuda else "cpu", (dist.get_world_size(),))
    state = sharded_state(mesh, 0.0)
    allocated = host_buffer_like(state, pin_memory=on_cuda)
    for key in ("w", "b"):
        twin, source = allocated["model"][key], state["model"][key]
        assert isinstance(twin, DTensor) and twin.placements == source.placements, key
        assert twin.shape == source.shape and twin.to_local().shape == source.to_local().shape, key
        assert twin.to_local().untyped_storage().data_ptr() != source.to_local().untyped_storage().data_ptr()
        assert twin.to_local().device.type == "cpu" and twin.to_local().is_pinned() == on_cuda, key
    assert allocated["iteration"] == 5

    if not on_cuda:
        manager_module.allocate_pinned_staging = lambda s: host_buffer_like(s, pin_memory=False)
    manager = CheckpointManager(Path(sys.argv[1]), keep_last=2, async_save=True, pinned_staging=True)
    manager.prepare_staging(state)
    manager.wait_for_preparation()
    staged = manager._stager.state_dict_cache["model"]["w"]
    assert isinstance(staged, DTensor) and staged.to_local().is_pinned() == on_cuda  # prepared ahead
    manager.save(5, state, {})
    manager.wait_for_staging()
    state["model"]["w"].to_local().add_(100.0)  # training goes on; the save has its copy
    manager.close()

    target = sharded_state(mesh, -50.0)
    dcp.load(target, checkpoint_id=str(Path(sys.argv[1]) / "step_5"))
    assert torch.equal(target["model"]["w"].full_tensor().cpu(), FULL)
    assert torch.equal(target["model"]["b"].full_tensor().cpu(), torch.full((3,), 7.0))
    return 0


if __name__ == "__main__":
    run_as_rank(main)
