"""The `validation` stage of `gptrain launch`: rendered job, thresholds, exclude file, local runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from validate_helpers import REPO

from gptrain.errors import ConfigError

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
        "validation.xid_since=2h",
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
    assert "--max-bytes 4K" in srun and "--exclude-file" not in srun and " --xid-since 2h " in srun
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


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["validation.iters=0"], "validation.iters=0: must be >= 1, got 0"),
        (["validation.warmup=-1"], "validation.warmup=-1: must be >= 0, got -1"),
        (
            ["validation.dcgm_level=9"],
            "validation.dcgm_level=9: must be 0 (skip) to 4 (dcgmi diag -r), got 9",
        ),
        (
            ["validation.xid_since=2w"],
            "validation.xid_since='2w': must be a duration like 30m, 2h or 1d (or boot), got '2w'",
        ),
        (
            ["validation.max_bytes=lots"],
            "validation.max_bytes='lots': not a size: 'lots' (e.g. 8, 64K, 1M, 8G)",
        ),
        (
            ["validation.min_busbw_GBps=-1"],
            "validation.min_busbw_GBps=-1: must be a number of GB/s >= 0, got -1",
        ),
        (
            ["validation.min_bytes=2M", "validation.max_bytes=1M"],
            "validation.min_bytes='2M' is above validation.max_bytes='1M'; lower min_bytes or raise max_bytes",
        ),
        (["cluster.validation.slow_pct=abc"], "cluster.validation.slow_pct must be a number, got 'abc'"),
        (
            ["cluster.validation.matmul_tflops=true"],
            "cluster.validation.matmul_tflops must be a number, got True",
        ),
        (
            ["+cluster.validation.slowpct=5"],
            "unknown key cluster.validation.slowpct; known: copy_GBps, inter_node_busbw_GBps, "
            "intra_node_busbw_GBps, large_message_bytes, matmul_tflops, slow_pct",
        ),
        (
            ["validation.exclude_failed=true", "validation.exclude_file=null"],
            "validation.exclude_failed=true needs validation.exclude_file: the file the blamed nodes go to"
            " (e.g. ${base_results_dir}/exclude_nodes.txt)",
        ),
    ],
)
def test_a_value_the_validation_job_would_refuse_stops_the_launch(
    overrides, message, tmp_path, capsys, monkeypatch
):
    """These reached the script and failed in the job, after its queue wait, with the training
    waiting on it (a dcgmi level it rejects would even blame a healthy node)."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["launch", "--dry-run", "stages=[validation,training]", *CPU, *overrides]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"gptrain: error: {message}"
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda path: path.write_text("node[1-\n"),
            ":1: cannot parse host list item 'node[1-' (Slurm's form: n[1-3,7],gpu-[01-04]); fix the file or delete it",
        ),
        (  # the comment reached the jobs as a node name: #SBATCH --exclude='n5,# n5 has a bad NIC'
            lambda path: path.write_text("n5\n# n5 has a bad NIC\n"),
            ":2: '# n5 has a bad NIC' is not a host name (one Slurm host list a line, n[1-3,7],gpu07;"
            " no comments, no spaces); fix the file or delete it",
        ),
        (
            lambda path: path.mkdir(),
            ": is a directory; give a file name (the nodes a failed validation blames go there, one Slurm host list)",
        ),
    ],
)
def test_an_exclude_file_that_does_not_parse_is_named(make, message, tmp_path, capsys, monkeypatch):
    """A bad line was reported as `cluster.exclude: ...` (a key the user never set); a directory
    was read as no file, and the job failed writing to it at its end."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    make(tmp_path / "ex")
    args = [
        "launch",
        "--dry-run",
        "stages=[validation,training]",
        *CPU,
        f"validation.exclude_file={tmp_path}/ex",
    ]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: validation.exclude_file {tmp_path}/ex{message}"
    )


def test_an_exclude_file_under_a_directory_that_may_not_be_searched_is_one_line(
    tmp_path, capsys, monkeypatch, unsearchable_dir
):
    """Path.exists raised PermissionError (Python 3.11): a bare '<path>: Permission denied' from
    `gptrain launch`, no key named. Root may search any directory, so the refusal is stood in for."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    locked = unsearchable_dir
    args = ["launch", "--dry-run", "stages=[validation,training]", *CPU]
    assert main([*args, f"validation.exclude_file={locked}/ex"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: validation.exclude_file {locked}/ex: cannot be looked up (Permission denied);"
        f" check the permissions of {locked} and the directories above it"
    )


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ([], True),  # the default 30 minutes: Slurm killed the job inside dcgmi; the training never started
        (["validation.run.time_limit=02:00:00"], False),
        (["validation.checks=collectives"], False),  # dcgmi runs in the gpus check only
    ],
)
def test_a_gpu_validation_job_must_have_time_for_its_dcgmi_level(overrides, refused):
    from gptrain.launch.validation_stage import validation_job

    section = {"dcgm_level": 4, "run": {"time_limit": "00:30:00"}}
    for override in overrides:
        key, value = override.removeprefix("validation.").split("=")
        if key == "run.time_limit":
            section["run"] = {"time_limit": value}
        else:
            section[key] = value
    training = {"trainer": {"devices": 8, "num_nodes": 2, "accelerator": "gpu"}}
    make = lambda: validation_job(section, training, {}, "python", False, ("r", Path("/tmp/r")))  # noqa: E731
    if not refused:
        assert make().gpus
        return
    with pytest.raises(ConfigError) as raised:
        make()
    assert str(raised.value) == (
        "validation.dcgm_level=4 may take 60 minutes or more, and validation.run.time_limit=00:30:00 ends"
        " the job by then (the training waiting on it would never start): give a longer time limit or a"
        " lower dcgm_level"
    )
