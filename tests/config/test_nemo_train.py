"""Each release's upstream gpt3/126m.yaml trains unchanged on CPU (tiny sizes as extra overrides)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_nemo_trees import AZURE_TRAINING, conf

from gptrain.cli import main

TREES = Path(__file__).parent / "nemo_launcher"
TINY = [
    "trainer.accelerator=cpu", "trainer.devices=1", "trainer.num_nodes=1", "trainer.precision=32",
    "model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
    "model.encoder_seq_length=64", "model.data.seq_length=64", "model.max_position_embeddings=64",
    "model.global_batch_size=4", "model.micro_batch_size=2", "model.data.data_impl=mock",
    "model.data.mock_vocab_size=512", "trainer.max_steps=2", "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=0",
]  # fmt: skip


# 23.07's 126m.yaml checkpoints selectively with dropout on (it crashed before the policy recomputed
# dropout's in-place mask ops).
@pytest.mark.parametrize("release", ["23.07", "23.11", "24.05", "24.12"])
def test_upstream_126m_trains_on_cpu(release, tmp_path, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    path = TREES / release / "launcher_scripts" / "conf" / "training" / "gpt3" / "126m.yaml"
    assert main(["train", "--config-file", str(path), *TINY, f"base_results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "iteration        1/       2 |" in out and "validation loss at iteration 2 |" in out
    assert (tmp_path / "gpt3_126m" / "results" / "checkpoints").is_dir()


def test_azure_tutorial_command_launches_and_trains_from_the_upstream_tree(tmp_path):
    """`gptrain launch --config-path <launcher_scripts/conf> --config-name config` + the tutorial's ten
    training.* overrides, unchanged; tiny sizes, CPU, local executor and no container as extra overrides."""
    extra = [f"training.{override}" for override in TINY if not override.startswith("trainer.max_steps")]
    extra += [
        "training.trainer.max_steps=2",
        "training.model.micro_batch_size=2",
        "training.model.data.num_workers=0",
    ]
    extra += [
        "cluster_type=local",
        "container=null",
        "stages=[training]",
        f"launcher_scripts_path={tmp_path}",
    ]
    args = [
        "launch",
        "--quiet",
        "--config-path",
        str(conf("24.12")),
        "--config-name",
        "config",
        *AZURE_TRAINING,
        *extra,
    ]
    done = subprocess.run(
        [sys.executable, "-m", "gptrain", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "results" / "gpt3_126m-1n-tp1-pp1-mbs1"
    records = [json.loads(line) for line in (run / "launcher.log").read_text().splitlines()]
    assert records[-1] == {**records[-1], "event": "finished", "exit_code": 0}
    log = (run / "results" / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "iteration        2/       2 |" in log and "validation loss at iteration 2 |" in log
