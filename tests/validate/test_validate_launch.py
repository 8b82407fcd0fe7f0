"""The `validation` stage of `gptrain launch`: rendered job, thresholds, exclude file, local runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from validate_helpers import REPO

CPU = ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]
CPU += [
    "training.model.data.data_impl=mock",
    "training.model.data.mock_vocab_size=64",
    "training.trainer.num_nodes=1",
]
QUICK = ["validation.max_bytes=4K", "validation.iters=2", "validation.warmup=1", "validation.pair_bytes=16K"]


def launch(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }
    return subprocess.run(
        [sys.executable, "-m", "gptrain", "launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_slurm_render_runs_validation_before_training_with_the_cluster_thresholds(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results/exclude_nodes.txt").write_text("n[3,7]\n")
    args = ["--dry-run", "stages=[validation,training]", "cluster_type=slurm", "cluster=aws_p5"]
    args += [
        "training.trainer.num_nodes=2",
        "cluster.validation.copy_GBps=1234",
        "cluster.exclude=n9",
        *QUICK,
    ]
    out = launch(args, tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "results/gpt3_126m"
    dry = run / "dry-run"  # a dry run writes its files there; the scripts name the run's own paths
    script = (dry / "gptrain-gpt3_126m_validation_submission.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=8" in script
    assert "#SBATCH --exclude='n9,n[3,7]'" in script  # the file's nodes join the configured ones
    assert "#SBATCH --exclude='n9,n[3,7]'" in (dry / "gptrain-gpt3_126m_submission.sh").read_text()
    srun = next(line for line in script.splitlines() if line.startswith("srun"))
    assert (
        f"-m gptrain validate all --output-dir {run}/validation --profile {run}/gpt3_126m_validation_hydra.yaml"
        in srun
    )
    assert "--max-bytes 4K" in srun and "--exclude-file" not in srun
    assert srun.rstrip().endswith("--expect-gpus") or " --expect-gpus " in srun  # a GPU job: no GPU fails
    config = yaml.safe_load((dry / "gpt3_126m_validation_hydra.yaml").read_text())
    assert config["thresholds"]["copy_GBps"] == 1234 and config["thresholds"]["inter_node_busbw_GBps"] == 240
    assert out.stdout.index("validation:") < out.stdout.index("training:")

    from gptrain.validate.thresholds import load_thresholds

    limits = load_thresholds(str(dry / "gpt3_126m_validation_hydra.yaml"))
    assert limits.copy_GBps == 1234 and limits.busbw_threshold(True) == 240


def test_bad_check_name_is_one_line(tmp_path):
    out = launch(["--dry-run", "stages=[validation]", "validation.checks=links", *CPU], tmp_path)
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith("validation.checks='links': choose one of collectives, pairwise, gpus, all")
    )


@pytest.mark.distributed
def test_local_validation_failure_stops_the_training_and_keeps_reports_in_the_run(tmp_path):
    args = ["stages=[validation,training]", *CPU, "training.trainer.devices=2", *QUICK]
    out = launch([*args, "validation.checks=collectives", "validation.min_busbw_GBps=1e6"], tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "validation failed with exit code 1; later stages not run" in out.stderr
    run = tmp_path / "results/gpt3_126m"
    records = [json.loads(line) for line in (run / "launcher.log").read_text().splitlines()]
    assert [r["stage"] for r in records if r["event"] == "submitted"] == ["validation"]
    rows = json.loads((run / "validation/collectives.json").read_text())
    assert {r["world_size"] for r in rows} == {2}
    status = subprocess.run(
        [sys.executable, "-m", "gptrain", "status", "gpt3_126m"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "validation  job local-" in status.stdout and "FAILED" in status.stdout
