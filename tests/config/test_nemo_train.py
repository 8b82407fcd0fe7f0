"""Each release's upstream gpt3/126m.yaml trains unchanged on CPU (tiny sizes as extra overrides)."""

from pathlib import Path

import pytest

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
