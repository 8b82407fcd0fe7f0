"""Export of checkpoints that training wrote under TP=2, PP=2 and FSDP2, and training resumed from an import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from gloo_ranks import free_port, run_ranks  # noqa: E402
from hf_helpers import ARCHITECTURES, SHAPE, gpt2_files, run_cli  # noqa: E402

WORKER = Path(__file__).parent.parent / "cli_runs_worker.py"

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


def train_args(log_dir: Path, arch: str, layout: list[str]) -> list[str]:
    preset, overrides = ARCHITECTURES[arch]
    vocab, merges = gpt2_files()
    args = ["train", preset, *TRAIN, *SHAPE, *overrides, *layout]
    args += [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={merges}"]
    return [*args, "trainer.devices=2", "trainer.max_steps=1", f"exp_manager.explicit_log_dir={log_dir}"]


LAYOUTS = {
    "tp2": ("stablelm", ["model.tensor_model_parallel_size=2", "model.sequence_parallel=true"]),
    "pp2": ("llama", ["model.pipeline_model_parallel_size=2"]),  # tied output: a copy on the last stage
    # Megatron's uneven split: layer 0 on the first stage, layers 1 and 2 on the last
    "pp2_uneven": (
        "llama",
        [
            "model.pipeline_model_parallel_size=2",
            "model.num_layers=3",
            "model.num_layers_in_first_pipeline_stage=1",
        ],
    ),
    # FSDP2: every weight cut in two along its rows, each rank writing its half
    "fsdp2": ("gpt2", ["model.data_parallel_sharding=full_shard"]),
}


@pytest.fixture(scope="module")
def parallel_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every layout's one-step run, in one launch of two ranks (one start-up): runs/<layout>."""
    root = tmp_path_factory.mktemp("runs")
    runs = [
        {"port": free_port(), "argv": train_args(root / name, arch, layout)}
        for name, (arch, layout) in LAYOUTS.items()
    ]
    run_ranks(WORKER, json.dumps(runs), timeout_s=400)
    return root


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_export_of_a_parallel_checkpoint_is_verified(
    tmp_path: Path, parallel_runs: Path, name: str, capsys
) -> None:
    run = parallel_runs / name
    shards = sorted(p.name for p in (run / "checkpoints" / "step_1").glob("*.distcp"))
    assert len(shards) == 2  # each rank wrote its part
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "hf")]) == 0
    line = capsys.readouterr().out
    assert "greedy continuation of 12 tokens identical" in line, line
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


def test_the_first_step_from_an_import_has_the_transformers_models_loss(tmp_path: Path, monkeypatch) -> None:
    """Import + start of training loses nothing (tied output, grouped queries, biases, rope base,
    RMSNorm eps): the first step's loss on its batch is transformers' loss of that batch computed
    in float64. 256 rows: no vocabulary padding (padding rows take part in the softmax). Bound:
    |d loss| <= 2 max |d logit| (log-sum-exp and the label's logit each move by at most that), and
    a float32 logit is off by at most ~n u |logit| with dot products of n <= 2 x 48 terms per
    layer, u = 6e-8 and logits below 10: 2 x 96 x 6e-8 x 10 ~ 1.2e-4."""
    import torch
    import transformers

    from gptrain.config import load_training_config
    from gptrain.train import loop, step_loop
    from gptrain.train.builders import _build_datasets

    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-3, tie_word_embeddings=True,
        attention_bias=True, mlp_bias=True, initializer_range=0.3,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(tmp_path / "hf"))
    assert run_cli(["import", str(tmp_path / "hf"), "--output", str(tmp_path / "imported")]) == 0
    overrides = [*TRAIN, "trainer.devices=1", "trainer.max_steps=1", "model.micro_batch_size=2"]
    cfg = load_training_config(config_file=str(tmp_path / "imported" / "hparams.yaml"), overrides=overrides)
    losses = []
    real_record = step_loop.record
    monkeypatch.setattr(
        step_loop, "record", lambda s, result, *a: (losses.append(result.loss), real_record(s, result, *a))
    )
    assert loop.train(cfg) == 0
    train, _, _ = _build_datasets(cfg, 256, None)
    samples = [train[index] for index in range(cfg.model.global_batch_size)]
    tokens, labels = (torch.stack([sample[key] for sample in samples]) for key in ("tokens", "labels"))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float64)
    with torch.no_grad():
        logits = theirs.eval()(input_ids=tokens).logits
    expected = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), labels.reshape(-1)))
    assert float(logits.abs().max()) < 10
    assert abs(losses[0] - expected) < 1.2e-4, (losses[0], expected)


def test_a_run_in_an_imports_directory_with_another_rope_base_is_refused(tmp_path: Path) -> None:
    """The import's step_0 recorded no architecture: a run resumed in its directory with another rope
    base (every tensor's shape the same) trained another function from the imported weights, unchecked."""
    import torch
    import transformers

    from gptrain.checkpoint.errors import ArchitectureChangedError
    from gptrain.config import load_training_config
    from gptrain.train import loop

    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(tmp_path / "hf"))
    assert run_cli(["import", str(tmp_path / "hf"), "--output", str(tmp_path / "imported")]) == 0
    overrides = [*TRAIN, "trainer.devices=1", "trainer.max_steps=1", "model.micro_batch_size=2"]
    hparams = str(tmp_path / "imported" / "hparams.yaml")
    cfg = load_training_config(config_file=hparams, overrides=[*overrides, "model.rotary_base=500"])
    with pytest.raises(ArchitectureChangedError, match=r"model\.rotary_base 10000(\.0)? -> 500"):
        loop.train(cfg)
