"""Layout checks run before any process group: each names the keys and values at fault."""

from __future__ import annotations

import dataclasses

import pytest

from gptrain.config import TrainingConfig
from gptrain.config.schema import ModelConfig
from gptrain.errors import ConfigError
from gptrain.parallel.layout import check_layout, hybrid_shard_node_warning, num_microbatches
from gptrain.parallel.mesh import ParallelDims, World
from gptrain.parallel.rng import rank_dropout_seed


def model(**overrides: object) -> ModelConfig:
    base = dict(
        num_layers=8,
        hidden_size=64,
        num_attention_heads=8,
        encoder_seq_length=32,
        micro_batch_size=2,
        global_batch_size=16,
    )
    return dataclasses.replace(ModelConfig(), **{**base, **overrides})


def test_valid_layout_derives_data_parallel_size() -> None:
    dims = check_layout(model(tensor_model_parallel_size=2, pipeline_model_parallel_size=2), world_size=8)
    assert (dims.tp, dims.pp, dims.dp, dims.vpp, dims.dp_shard) == (2, 2, 2, 1, 0)
    assert num_microbatches(model(), dims.dp) == 16 // (2 * 2)


def test_hybrid_shard_groups_follow_node_size() -> None:
    dims = check_layout(
        model(data_parallel_sharding="hybrid_shard", global_batch_size=32), world_size=16, devices_per_node=4
    )
    assert (dims.dp, dims.dp_shard, dims.dp_replicate) == (16, 4, 4)
    assert dims.mesh_shape() == ((1, 4, 4, 1), ("pp", "dp_rep", "dp_shard", "tp"))
    full = check_layout(
        model(data_parallel_sharding="full_shard", global_batch_size=32), world_size=16, devices_per_node=4
    )
    assert full.mesh_shape() == ((1, 16, 1), ("pp", "dp", "tp"))


def test_mesh_puts_tp_innermost_and_pp_outermost() -> None:
    assert ParallelDims(world_size=8, tp=2, pp=2).mesh_shape() == ((2, 2, 2), ("pp", "dp", "tp"))


@pytest.mark.parametrize(
    ("overrides", "world", "expected"),
    [
        (
            {"tensor_model_parallel_size": 3},
            6,
            "model.num_attention_heads=8 is not divisible by model.tensor_model_parallel_size=3",
        ),
        (
            {"tensor_model_parallel_size": 4, "num_query_groups": 2},
            4,
            "model.num_query_groups=2 is not divisible by",
        ),
        (
            {"pipeline_model_parallel_size": 3},
            3,
            "model.num_layers=8 is not divisible by model.pipeline_model_parallel_size",
        ),
        ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 3}, 2, "= 2 x 3"),
        (
            {"tensor_model_parallel_size": 2},
            3,
            "world size 3 (trainer.num_nodes x trainer.devices) is not divisible",
        ),
        (
            {"global_batch_size": 12, "micro_batch_size": 4},
            2,
            "model.global_batch_size=12 is not divisible by model.micro_batch_size x data-parallel size = 4 x 2",
        ),
        (
            {"sequence_parallel": True},
            2,
            "model.sequence_parallel=true needs model.tensor_model_parallel_size > 1",
        ),
        (
            {"virtual_pipeline_model_parallel_size": 2},
            2,
            "model.virtual_pipeline_model_parallel_size=2 needs model.pipeline_model_parallel_size > 1",
        ),
        (
            {"tensor_model_parallel_size": 2, "sequence_parallel": True, "encoder_seq_length": 33},
            2,
            "model.encoder_seq_length=33 is not divisible by model.tensor_model_parallel_size=2",
        ),
        (
            {
                "pipeline_model_parallel_size": 2,
                "virtual_pipeline_model_parallel_size": 2,
                "global_batch_size": 1,
                "micro_batch_size": 1,
            },
            2,
            "1 microbatches per step (model.global_batch_size=1 / (micro batch 1 x DP 1)) is fewer than "
            "model.pipeline_model_parallel_size=2, which the interleaved pipeline",
        ),
        (
            {
                "pipeline_model_parallel_size": 2,
                "virtual_pipeline_model_parallel_size": 2,
                "global_batch_size": 5,
                "micro_batch_size": 1,
            },
            2,
            "runs 5 microbatches in 2 equal rounds (torch's schedule: microbatches // "
            "model.pipeline_model_parallel_size=2), and 5 is not a multiple of 2 (any multiple of 2 is): "
            "change model.global_batch_size=5",
        ),
        (
            {"data_parallel_sharding": "zero1"},
            1,
            "model.data_parallel_sharding='zero1' must be one of ddp, shard_grad_op, full_shard, hybrid_shard",
        ),
        (
            {"activations_checkpoint_granularity": "most"},
            1,
            "model.activations_checkpoint_granularity='most'",
        ),
        (
            {"activations_checkpoint_granularity": "full"},
            1,
            "model.activations_checkpoint_method=None must be uniform or block",
        ),
        (
            {"tensor_model_parallel_size": 2, "ffn_hidden_size": 33, "num_attention_heads": 2},
            2,
            "model.ffn_hidden_size=33 is not divisible",
        ),
        ({"tensor_model_parallel_size": 0}, 2, "must be >= 1"),
        # every ramp step must fill the pipeline as the full batch must
        (
            {
                "pipeline_model_parallel_size": 2,
                "virtual_pipeline_model_parallel_size": 2,
                "rampup_batch_size": [1, 1, 100],
                "micro_batch_size": 1,
            },
            2,
            "the first ramp batch 1 gives 1 microbatches (micro batch 1 x DP 1), fewer than "
            "model.pipeline_model_parallel_size=2, which the interleaved pipeline needs, as in Megatron: "
            "start the ramp at 2 or more",
        ),
        (
            {
                "pipeline_model_parallel_size": 2,
                "virtual_pipeline_model_parallel_size": 2,
                "rampup_batch_size": [2, 3, 100],
                "micro_batch_size": 1,
                "global_batch_size": 8,
            },
            2,
            "model.rampup_batch_size=[2, 3, 100]: the ramp batch 5 gives 5 microbatches (micro batch 1 x DP 1); "
            "the interleaved pipeline",
        ),
    ],
)
def test_layout_errors_name_keys_and_values(overrides: dict, world: int, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_layout(model(**overrides), world_size=world)
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("pp", "microbatches"), [(2, 3), (4, 6), (4, 10), (4, 7)])
def test_interleaved_pipeline_takes_microbatches_torch_splits_into_equal_rounds(
    pp: int, microbatches: int
) -> None:
    """The interleaved pipeline refused any micro-batch count that is no multiple of PP (3 with PP=2);
    torch's ScheduleInterleaved1F1B runs n in n // PP equal rounds, so only an n those do not divide
    (5 with PP=2: tested above) is refused. The first ramp batch follows the same rule."""
    layout = model(
        num_layers=4 * pp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=2,
        micro_batch_size=1,
        global_batch_size=microbatches,
    )
    dims = check_layout(layout, world_size=pp)
    assert (dims.pp, dims.vpp, num_microbatches(layout, dims.dp)) == (pp, 2, microbatches)
    ramped = dataclasses.replace(
        layout, global_batch_size=4 * pp, rampup_batch_size=[microbatches, 4 * pp - microbatches, 100]
    )
    assert check_layout(ramped, world_size=pp).vpp == 2


def test_a_pipeline_takes_fewer_microbatches_than_stages_as_megatron_does() -> None:
    """PP4 over 2 micro-batches a step, and a ramp starting at 1, were refused (Megatron's GPT-3 175B
    example, PP16 with a ramp from 16, starts at 16 / DP micro-batches): torch's 1F1B needs one per
    stage, so gptrain.parallel.pipeline runs GPipe for them."""
    few = model(pipeline_model_parallel_size=4, global_batch_size=2, micro_batch_size=1)
    assert num_microbatches(few, check_layout(few, world_size=4).dp) == 2
    ramp = model(pipeline_model_parallel_size=4, micro_batch_size=1, rampup_batch_size=[1, 1, 100])
    assert check_layout(ramp, world_size=4).pp == 4


def test_hybrid_shard_groups_that_span_the_started_nodes_are_warned_of() -> None:
    """Shard groups follow trainer.devices; a launch with another number of processes per node
    (LOCAL_WORLD_SIZE) made them span nodes without a word."""
    hybrid = check_layout(
        model(data_parallel_sharding="hybrid_shard", global_batch_size=32), world_size=16, devices_per_node=8
    )
    warning = hybrid_shard_node_warning(hybrid, 8, "4")
    assert (
        warning is not None
        and "groups of 8 from trainer.devices=8, but 4 processes run on this node" in warning
    )
    assert hybrid_shard_node_warning(hybrid, 8, "8") is None  # as configured
    assert hybrid_shard_node_warning(hybrid, 8, None) is None  # not started by torchrun/srun
    full = check_layout(
        model(data_parallel_sharding="full_shard", global_batch_size=32), world_size=16, devices_per_node=8
    )
    assert hybrid_shard_node_warning(full, 8, "4") is None  # one group over every rank: nothing to span


def test_hybrid_shard_that_does_not_tile_the_nodes_is_rejected() -> None:
    # dp = 6 with 4 ranks per node: shard groups of 4 cannot tile 6 ranks.
    with pytest.raises(
        ConfigError, match="hybrid_shard: data-parallel size 6 is not a multiple of the shard group 4"
    ):
        check_layout(
            model(data_parallel_sharding="hybrid_shard", global_batch_size=12),
            world_size=6,
            devices_per_node=4,
        )


def test_a_layout_run_in_one_process_is_told_to_start_one_per_device() -> None:
    """`gptrain train` of a TP=2 config without torchrun or srun: the error said 'world size 1
    (trainer.num_nodes x trainer.devices)' of a config with 2 devices, blaming the config. The
    training process counts the processes started, and says this one runs alone."""
    cfg = TrainingConfig()
    cfg.trainer.devices = 2
    cfg.model = model(tensor_model_parallel_size=2)
    alone = World(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=29500)
    with pytest.raises(ConfigError) as error:
        rank_dropout_seed(cfg, alone)  # the loop's first look at the layout
    message = str(error.value)
    assert "= 2 x 1 needs 2 processes" in message and "runs alone" in message
    assert "trainer.num_nodes x trainer.devices" not in message and "\n" not in message
    three = dataclasses.replace(alone, world_size=3)
    with pytest.raises(ConfigError, match=r"world size 3 \(processes started by torchrun or srun\)"):
        rank_dropout_seed(cfg, three)


def train_before_any_rendezvous(monkeypatch, run_dir, world_size: int, overrides: list[str]) -> str:
    """`gptrain train`'s error as rank 0 of `world_size` processes, with a process group that fails
    the test if it is started; nothing may be written into `run_dir` either."""
    from gptrain.config import load_training_config
    from gptrain.train import loop

    cfg = load_training_config("gpt3/126m", [*overrides, f"exp_manager.explicit_log_dir={run_dir}"])
    env = {"RANK": "0", "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def rendezvous(*args: object, **kwargs: object) -> None:
        raise AssertionError("the process group started before the layout was checked")

    monkeypatch.setattr(loop, "init_distributed", rendezvous)
    with pytest.raises(ConfigError) as error:
        loop.train(cfg)
    assert not run_dir.exists()
    return str(error.value)


def test_a_bad_layout_is_refused_before_the_process_group_starts(monkeypatch, tmp_path) -> None:
    """`gptrain train` under torchrun or srun started its process group (a rendezvous every rank
    waits in) before it looked at the layout: a peer that never joined left the others waiting
    there instead of saying what is wrong. The layout is now refused first, nothing started or
    written."""
    overrides = ["trainer.devices=3", "model.tensor_model_parallel_size=2"]
    message = train_before_any_rendezvous(monkeypatch, tmp_path / "run", 3, overrides)
    assert "world size 3 (processes started by torchrun or srun) is not divisible" in message


def test_a_layout_this_backend_cannot_run_is_refused_before_the_process_group_starts(
    monkeypatch, tmp_path
) -> None:
    """The layout choices that depend on the device or on torch (here tensorwise FP8 under sequence
    parallelism on the CPU, whose gloo cannot all-gather float8) were refused only inside
    parallelize: after the rendezvous, with the model already built. Now before either."""
    overrides = [
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "model.tensor_model_parallel_size=2",
        "model.sequence_parallel=true",
        "model.fp8=true",
        "model.fp8_recipe=tensorwise",
        "model.fp8_emulate=true",
    ]
    message = train_before_any_rendezvous(monkeypatch, tmp_path / "run", 2, overrides)
    assert "model.fp8_recipe=tensorwise with model.tensor_model_parallel_size=2" in message
