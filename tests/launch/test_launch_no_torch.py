"""The launcher runs on login nodes: composing, rendering and job control never import torch."""

import subprocess
import sys

CODE = """
import contextlib, io, sys
from gptrain.cli import main
args = {args!r}
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(args)
print(code, ','.join(m for m in ('torch', 'numpy') if m in sys.modules))
"""


def run_cli(args, cwd):
    out = subprocess.run(
        [sys.executable, "-c", CODE.format(args=args)], capture_output=True, text=True, cwd=cwd
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_launch_dry_run_and_job_control_import_no_torch(tmp_path):
    launch = ["launch", "--dry-run", "cluster_type=slurm", "training.trainer.num_nodes=1"]
    launch += ["training.model.data.data_impl=mock", "training.trainer.accelerator=cpu"]
    launch += ["cluster.gpus_per_node=null", "cluster.gres=null", "training.trainer.devices=1"]
    assert run_cli(launch, tmp_path) == ["0"]
    assert (tmp_path / "results/gpt3_126m/dry-run/gptrain-gpt3_126m_submission.sh").is_file()
    (tmp_path / "results/gpt3_126m/launcher.log").write_text(
        '{"event": "submitted", "stage": "training", "executor": "local", "job_id": "local-4000000", "pid": 4000000,'
        ' "log": "none"}\n{"event": "finished", "job_id": "local-4000000", "exit_code": 0}\n'
    )
    logs = (["logs", "gpt3_126m"], ["logs", "gpt3_126m", "--all"], ["logs", "gpt3_126m", "--launch", "1"])
    for command in (["status"], ["status", "gpt3_126m"], *logs, ["cancel", "gpt3_126m"]):
        assert run_cli(command, tmp_path) == ["0"], command


def test_a_per_split_data_prefix_is_checked_without_numpy(tmp_path):
    """config/validate.py checked the per-split keys by importing gptrain.data.builder (numpy, numba)."""
    launch = ["launch", "--dry-run", "cluster_type=slurm", "training.trainer.num_nodes=1"]
    launch += ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]
    launch += ["training.model.data.data_prefix={train:[1.0,/data/a],validation:[1.0,/data/b]}"]
    assert run_cli(launch, tmp_path) == ["0"]


def test_a_sentencepiece_training_launches_without_importing_sentencepiece(tmp_path, sp_model):
    """The preflight checks the tokenizer.model is there; reading it is the job's."""
    code = CODE.replace("('torch', 'numpy')", "('torch', 'numpy', 'sentencepiece')")
    launch = ["launch", "--dry-run", "cluster_type=slurm", "training.trainer.num_nodes=1"]
    launch += ["training.model.data.data_impl=mock", "training.trainer.accelerator=cpu"]
    launch += ["cluster.gpus_per_node=null", "cluster.gres=null", "training.trainer.devices=1"]
    launch += ["training.model.tokenizer.library=sentencepiece", f"training.model.tokenizer.model={sp_model}"]
    out = subprocess.run(
        [sys.executable, "-c", code.format(args=launch)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]
    script = (tmp_path / "results/gpt3_126m/dry-run/gpt3_126m_hydra.yaml").read_text()
    assert "library: sentencepiece" in script and sp_model in script


def test_a_megatron_tiktoken_vocabulary_is_checked_without_numpy(tmp_path):
    """The preflight reads Megatron's tiktoken vocabulary file (its size against vocab_size) with the
    standard library: the tokenizer module, which imports numpy, is the job's."""
    import base64
    import json

    entries = [
        {"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": ""} for b in range(256)
    ]
    (tmp_path / "tokenizer.json").write_text(json.dumps(entries))
    launch = ["launch", "--dry-run", "cluster_type=slurm", "training.trainer.num_nodes=1"]
    launch += ["training.model.data.data_impl=mock", "training.trainer.accelerator=cpu"]
    launch += ["cluster.gpus_per_node=null", "cluster.gres=null", "training.trainer.devices=1"]
    launch += [
        "training.model.tokenizer.type=TikTokenizer",
        f"training.model.tokenizer.model={tmp_path}/tokenizer.json",
    ]
    launch += ["training.model.tokenizer.vocab_file=null", "training.model.tokenizer.merge_file=null"]
    code = CODE.replace("('torch', 'numpy')", "('torch', 'numpy', 'gptrain.data.tiktoken_file')")
    out = subprocess.run(
        [sys.executable, "-c", code.format(args=launch)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "gptrain.data.tiktoken_file"]  # read, and nothing heavy imported


def test_megatron_dry_run_imports_neither_torch_nor_numpy(tmp_path):
    """Its --split (here Megatron's default) was normalised with numpy, imported for that alone."""
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "64"]
    flags += ["--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "1"]
    flags += ["--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "100", "--split", "98,2,0"]
    assert run_cli(["megatron", "--dry-run", *flags], tmp_path) == ["0"]
