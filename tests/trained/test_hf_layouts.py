"""Export of checkpoints that training wrote under TP=2 and PP=2, and training resumed from an import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hf_helpers import ARCHITECTURES, SHAPE, free_port, gpt2_files, run_cli  # noqa: E402

TRAIN = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.max_time=null",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=100",
    "trainer.limit_val_batches=0",
    "trainer.limit_test_batches=0",
    "model.micro_batch_size=2",
    "model.global_batch_size=4",
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "model.data.num_workers=0",
    "model.data.data_impl=mock",
    "model.data.data_prefix=null",
    "model.optim.sched.warmup_steps=1",
    "exp_manager.create_tensorboard_logger=false",
]


def torchrun_train(log_dir: Path, arch: str, layout: list[str]) -> None:
    preset, overrides = ARCHITECTURES[arch]
    vocab, merges = gpt2_files()
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={free_port()}",
    ]
    args += ["-m", "gptrain", "train", preset, *TRAIN, *SHAPE, *overrides, *layout]
    args += [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={merges}"]
    args += ["trainer.devices=2", "trainer.max_steps=1", f"exp_manager.explicit_log_dir={log_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("arch", "layout"),
    [
        ("stablelm", ["model.tensor_model_parallel_size=2", "model.sequence_parallel=true"]),
        ("llama", ["model.pipeline_model_parallel_size=2"]),  # tied output: a copy on the last stage
    ],
    ids=["tp2", "pp2"],
)
def test_export_of_a_parallel_checkpoint_is_verified(
    tmp_path: Path, arch: str, layout: list[str], capsys
) -> None:
    run = tmp_path / "run"
    torchrun_train(run, arch, layout)
    shards = sorted(p.name for p in (run / "checkpoints" / "step_1").glob("*.distcp"))
    assert len(shards) == 2  # each rank wrote its part
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "hf")]) == 0
    line = capsys.readouterr().out
    assert "greedy continuation of 12 tokens identical" in line, line
    import json

    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 50257


def test_training_resumes_from_an_import_with_a_fresh_optimizer(tmp_path: Path) -> None:
    """With lr 1e-6, Adam moves each weight by at most about lr per step (its first updates are
    m/sqrt(v) = +-1): after two steps the weights are within 1e-5 of the imported ones, while a
    run that had not loaded them would differ by the init's 0.3 scale."""
    from hf_helpers import tiny_run
    from safetensors.torch import load_file

    from gptrain.config import load_training_config
    from gptrain.train import loop

    run, _ = tiny_run("stablelm", tmp_path)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "hf"), "--no-verify"]) == 0
    imported = tmp_path / "imported"
    assert run_cli(["import", str(tmp_path / "hf"), "--output", str(imported), "--no-verify"]) == 0
    frozen = [
        "model.optim.lr=1e-6",
        "model.optim.sched.min_lr=1e-7",
        "trainer.devices=1",
        "trainer.num_nodes=1",
    ]
    overrides = [
        *TRAIN,
        *frozen,
        "trainer.max_steps=2",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    ]
    cfg = load_training_config(config_file=str(imported / "hparams.yaml"), overrides=overrides)
    assert loop.train(cfg) == 0
    log = (imported / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "holds model weights only (an import): optimizer, LR schedule and counters start fresh" in log
    assert "iteration        2/       2" in log
    assert (imported / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert run_cli(["export", str(imported), "--to", "hf", str(tmp_path / "after")]) == 0
    before, after = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(tmp_path / "after" / "model.safetensors"),
    )
    moved = max(float((before[name] - after[name]).abs().max()) for name in before)
    assert 0 < moved < 1e-5
    # and the next run resumes the full checkpoint training wrote, counters included
    cfg = load_training_config(
        config_file=str(imported / "hparams.yaml"), overrides=[*overrides[:-2], "trainer.max_steps=3"]
    )
    assert loop.train(cfg) == 0
    log = (imported / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "at iteration 2" in log.split("resuming from")[-1]
