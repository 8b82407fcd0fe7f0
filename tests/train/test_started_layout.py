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
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, (1, 2)),
        ({"RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, (2, 8)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_TASKS_PER_NODE": "8(x2)"}, (2, 8)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "12", "SLURM_NTASKS_PER_NODE": "4"}, (3, 4)),
        ({"RANK": "0", "WORLD_SIZE": "4"}, (1, 4)),  # no per-node count: one node
    ],
)
def test_the_started_layout_is_read_from_torchrun_or_srun(env, layout):
    assert started_layout(env) == layout


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
