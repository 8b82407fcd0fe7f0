"""Rank/world/master address from torchrun or Slurm variables; Slurm host lists in Python."""

from __future__ import annotations

import pytest

from gptrain.errors import ConfigError, LaunchError
from gptrain.parallel.layout import check_layout
from gptrain.parallel.mesh import cuda_index, first_host, world_from_env
from gptrain.utils.hostlist import expand_hostlist


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node7", ["node7"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu-[01-04,07]", ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"]),
        ("a1,b[3-4],c", ["a1", "b3", "b4", "c"]),
        ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
        ("x[9-11]", ["x9", "x10", "x11"]),
        ("dgx[098-100].cluster", ["dgx098.cluster", "dgx099.cluster", "dgx100.cluster"]),
    ],
)
def test_slurm_nodelist_expansion(nodelist: str, hosts: list[str]) -> None:
    assert expand_hostlist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["n[1-", "n[a-b]", "n]1[", "n[3-1]"])  # a reversed range too
def test_bad_nodelist_is_a_launch_error(nodelist: str) -> None:
    with pytest.raises(LaunchError, match="SLURM_JOB_NODELIST: .*host list item"):
        first_host(nodelist)


def test_torchrun_variables_win() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "1234",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
    }
    world = world_from_env(env)
    assert (world.rank, world.world_size, world.local_rank, world.master_addr, world.master_port) == (
        3,
        8,
        1,
        "h0",
        1234,
    )


def test_slurm_variables_and_first_host_as_master() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu-[03-06]",
    }
    world = world_from_env(env)
    assert (world.rank, world.world_size, world.local_rank, world.master_addr, world.master_port) == (
        5,
        8,
        1,
        "gpu-03",
        29500,
    )
    assert (
        world_from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODELIST": "z[2,4]"}).master_addr
        == "z2"
    )


def test_no_variables_is_one_local_process() -> None:
    world = world_from_env({})
    assert (world.rank, world.world_size, world.master_addr) == (0, 1, "127.0.0.1")


def test_rank_outside_world_is_rejected() -> None:
    with pytest.raises(LaunchError, match="rank 4 is outside world size 4"):
        world_from_env({"RANK": "4", "WORLD_SIZE": "4"})


@pytest.mark.parametrize(
    ("world_size", "tp", "pp", "sharding", "devices"),
    [(8, 2, 2, "ddp", 8), (8, 1, 2, "ddp", 8), (16, 2, 1, "hybrid_shard", 4), (4, 4, 1, "ddp", 4)],
)
def test_sampler_dp_rank_is_the_mesh_coordinate(world_size, tp, pp, sharding, devices) -> None:
    """Independent reference: the rank grid of the mesh shape, indexed by coordinates."""
    import numpy as np

    from gptrain.config import TrainingConfig
    from gptrain.parallel.training import data_parallel_rank_size, is_logging_rank

    cfg = TrainingConfig()
    m = cfg.model
    m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.data_parallel_sharding = tp, pp, sharding
    m.num_layers, m.num_attention_heads, m.micro_batch_size, m.global_batch_size = 8, 8, 1, 64
    cfg.trainer.devices = devices
    dims = check_layout(m, world_size, devices)
    shape, _ = dims.mesh_shape()
    grid = np.arange(world_size).reshape(shape[0], dims.dp, tp)  # (pp, dp_rep x dp_shard flattened, tp)
    for (_, dp_index, _), rank in np.ndenumerate(grid):
        world = world_from_env({"RANK": str(rank), "WORLD_SIZE": str(world_size)})
        assert data_parallel_rank_size(cfg, world) == (dp_index, dims.dp)
        assert is_logging_rank(cfg, world) == (rank == world_size - 1)


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [(0, 8, 0), (5, 8, 5), (0, 1, 0), (3, 1, 0)],  # all of a node's GPUs visible; one per task
)
def test_each_rank_takes_its_own_gpu_however_slurm_shows_them(local_rank, visible, index) -> None:
    assert cuda_index(local_rank, visible) == index


def test_more_tasks_than_visible_gpus_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match=r"^local rank 3 sees 2 CUDA devices \(CUDA_VISIBLE_DEVICES=0,1\)"):
        cuda_index(3, 2)


def test_no_visible_gpu_says_to_train_on_the_cpu() -> None:
    with pytest.raises(ConfigError, match="no CUDA device is visible; use trainer.accelerator=cpu"):
        cuda_index(0, 0)


def test_ranks_under_a_plain_srun_agree_on_a_port_of_their_job_and_step() -> None:
    """`srun gptrain train ...` (or `gptrain megatron` under srun) without MASTER_PORT met on
    torch's 29500 on every job: two jobs whose first node is shared, or two steps of one job,
    failed with EADDRINUSE. Every task of a step now derives the same port from its job and step."""
    from gptrain.utils.ports import PORT_LOW, PORT_SPAN, STEP_STRIDE

    def port(**env: str) -> int:
        base = {"SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "123456"}
        return world_from_env({**base, **env}).master_port

    step0 = {port(SLURM_PROCID=str(rank), SLURM_STEP_ID="0") for rank in range(4)}
    assert step0 == {PORT_LOW + 123456 % PORT_SPAN}
    step3 = {port(SLURM_PROCID=str(rank), SLURM_STEP_ID="3") for rank in range(4)}
    assert step3 == {PORT_LOW + (123456 + 3 * STEP_STRIDE) % PORT_SPAN} and step3 != step0
    assert port(SLURM_PROCID="0", SLURM_JOB_ID=str(123456 + 20000)) != port(SLURM_PROCID="0")  # was one port
    assert port(SLURM_PROCID="2", SLURM_STEP_RESV_PORTS="12001-12004") == 12001  # reserved by Slurm
    assert port(SLURM_PROCID="2", MASTER_PORT="29400", SLURM_STEP_RESV_PORTS="12001") == 29400  # given
    assert all(PORT_LOW <= port(SLURM_PROCID="0", SLURM_JOB_ID=str(j)) < 32768 for j in range(0, 10**6, 7777))
