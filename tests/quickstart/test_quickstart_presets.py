"""The quickstart presets load, resolve their paths from the root keys, and stay small."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gptrain.config import list_presets, load_training_config
from gptrain.models.config import GPTConfig
from gptrain.models.flops import count_parameters, pad_vocab_size

ROOT = Path(__file__).resolve().parents[2]
ROOT_KEYS = ["data_dir=/qs/data", "base_results_dir=/qs/results"]


@pytest.mark.parametrize("preset", ["quickstart/cpu", "quickstart/gpu"])
def test_preset_paths_follow_the_root_keys(preset: str) -> None:
    cfg = load_training_config(preset, ROOT_KEYS, report_ignored=False)
    name = preset.replace("/", "_")
    assert cfg.run.name == name
    assert cfg.exp_manager.explicit_log_dir == f"/qs/results/{name}/results"
    assert cfg.model.tokenizer.vocab_file == "/qs/data/vocab.json"
    assert cfg.model.tokenizer.merge_file == "/qs/data/merges.txt"
    assert cfg.model.data.data_prefix == [1.0, "/qs/data/corpus_text_document"]
    assert cfg.model.data.seq_length == cfg.model.encoder_seq_length == cfg.model.max_position_embeddings
    assert cfg.exp_manager.resume_if_exists is False  # every quickstart run starts fresh
    assert cfg.trainer.max_steps % cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 0


def test_cpu_preset_is_small_enough_for_two_cores() -> None:
    cfg = load_training_config("quickstart/cpu", ROOT_KEYS, report_ignored=False)
    m = cfg.model
    vocab = pad_vocab_size(50257, m.make_vocab_size_divisible_by, 1)
    config = GPTConfig(vocab, m.encoder_seq_length, m.num_layers, m.hidden_size, m.num_attention_heads)
    # 50304 x 128 tied embedding + 128 positions x 128 + 4 layers of 12 h^2 + 13 h
    h = 128
    expected = 50304 * h + 128 * h + 4 * (12 * h * h + 13 * h) + 2 * h
    assert count_parameters(config) == expected
    assert cfg.trainer.precision == "32" and cfg.trainer.accelerator == "cpu"
    assert cfg.trainer.max_steps * m.global_batch_size * m.encoder_seq_length == 512_000


def test_script_is_valid_bash_and_names_shipped_presets() -> None:
    script = ROOT / "scripts" / "quickstart.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    named = set(re.findall(r"PRESET=(quickstart/\w+)", text))
    assert named == {"quickstart/cpu", "quickstart/gpu"}
    assert named <= set(list_presets())
