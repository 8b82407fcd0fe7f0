"""Under torchrun/srun, trainer.num_nodes x trainer.devices that disagrees with the processes started:
a note naming both, and the run's records (hparams.yaml) hold the layout that ran."""

import importlib.machinery
import sys
import types

import pytest
import yaml
from train_e2e_helpers import MOCK, log_lines, tiny_config

from gptrain.parallel.mesh import started_layout

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def fake_wandb(configs: list) -> types.ModuleType:
    """`wandb` as the loop uses it, keeping the config each run is started with."""

    class Run:
        def log(self, data, step=None):
            pass

        def define_metric(self, name, step_metric=None):
            pass

        def finish(self, exit_code=0):
            pass

    def init(config=None, **_):
        configs.append(config)
        return Run()

    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init, fake.teardown = init, lambda: None
    return fake


@pytest.mark.parametrize(
    ("env", "layout"),
    [
        ({}, None),  # not started by a launcher: one process, nothing to compare
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, (2,)),
        ({"RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, (8, 8)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_TASKS_PER_NODE": "8(x2)"}, (8, 8)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "12", "SLURM_NTASKS_PER_NODE": "4"}, (4, 4, 4)),
        ({"RANK": "0", "WORLD_SIZE": "4"}, (4,)),  # no per-node count: one node
        # uneven (review X F3): the first node's count times the nodes was taken as the world (16)
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "12", "SLURM_TASKS_PER_NODE": "8,4"}, (8, 4)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "20", "SLURM_TASKS_PER_NODE": "8(x2),4"}, (8, 8, 4)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "14", "SLURM_TASKS_PER_NODE": "2,4(x3)"}, (2, 4, 4, 4)),
        ({"RANK": "0", "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"}, (8, 4)),
        # the allocation's counts, not this step's (srun -n 4 in a 2 x 8 allocation): the tasks per node asked
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "8(x2)"}, (4,)),
    ],
)
def test_the_started_layout_is_read_from_torchrun_or_srun(env, layout):
    assert started_layout(env) == layout


@pytest.mark.parametrize(
    ("configured", "started", "note", "recorded"),
    [
        ((2, 8), (8, 4), "2 x 8 = 16, but 12 processes were started (2 nodes: 8 + 4)", (1, 12)),
        ((1, 12), (8, 4), None, (1, 12)),  # as many as configured: nothing to note, the config kept
        ((2, 8), (8, 8), None, (2, 8)),
        ((2, 8), (4, 4), "2 x 8 = 16, but 8 processes were started (2 nodes x 4)", (2, 4)),
        ((1, 1), (8, 8, 4), "1 x 1 = 1, but 20 processes were started (3 nodes: 8 + 8 + 4)", (1, 20)),
    ],
)
def test_the_note_and_record_compare_the_processes_that_run(tmp_path, configured, started, note, recorded):
    """With uneven nodes the note compared nodes x the first node's count (16) with the config: 12
    processes under a 2 x 8 config went unnoted, and a 1 x 12 config got a note of 16 and a record
    of 2 x 8 (review X F3). An uneven layout is recorded as one node of all the processes (no
    trainer.num_nodes x trainer.devices describes it; their product, the world, stays true)."""
    from gptrain.train.results import run_record, started_layout_note

    nodes, devices = configured
    cfg = tiny_config(tmp_path, *MOCK, f"trainer.num_nodes={nodes}", f"trainer.devices={devices}")
    text = started_layout_note(cfg, started)
    if note is None:
        assert text is None
    else:
        assert text is not None and note in text, text
        assert f"hparams.yaml records trainer.num_nodes={recorded[0]} trainer.devices={recorded[1]}" in text
    record = run_record(cfg, started)["trainer"]
    assert (record["num_nodes"], record["devices"]) == recorded


def test_a_layout_other_than_the_started_one_is_noted_and_the_started_one_recorded(tmp_path, monkeypatch):
    """torchrun --nproc-per-node 1 ... trainer.num_nodes=2 trainer.devices=8 trained on the one
    process without a word, and hparams.yaml said 2 x 8 (Lightning refuses it; README's torchrun
    example runs 8 processes on a preset of 8 x 8, so it is a note)."""
    from gptrain.train import loop

    configs = []  # what W&B is given as the run's config
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(configs))
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    log_dir = tmp_path / "run"
    overrides = [
        "trainer.num_nodes=2",
        "trainer.devices=8",
        "trainer.max_steps=1",
        "trainer.limit_val_batches=0",
    ]
    cfg = tiny_config(
        log_dir, *MOCK, *overrides, "trainer.limit_test_batches=0", "exp_manager.create_wandb_logger=true"
    )
    assert loop.train(cfg) == 0
    hparams = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert (hparams["trainer"]["num_nodes"], hparams["trainer"]["devices"]) == (1, 1)
    [config] = configs
    assert (config["trainer"]["num_nodes"], config["trainer"]["devices"]) == (1, 1)
    notes = [line for line in log_lines(log_dir) if "trainer.num_nodes x trainer.devices" in line]
    assert len(notes) == 1 and "2 x 8 = 16" in notes[0] and "1 process" in notes[0], notes
