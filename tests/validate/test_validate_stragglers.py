"""The straggler line of `gptrain status`: per-rank busy times against the median."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from validate_helpers import REPO

from gptrain.launch.stragglers import straggler_line


def line(rank, node, step_ms, wait_ms, step=40):
    return {"step": step, "rank": rank, "node": node, "step_ms": step_ms, "wait_ms": wait_ms}


def test_the_rank_the_others_wait_for_is_named_with_its_node():
    lines = [line(0, "n1", 500, 100), line(1, "n1", 500, 100), line(2, "n2", 500, 0), line(3, "n2", 500, 100)]
    assert straggler_line(lines) == "stragglers at step 40: rank 2 (n2) +25% busy vs the median 400 ms/step"


def test_even_ranks_give_a_none_line_and_one_rank_gives_no_line():
    lines = [line(r, "n1", 500, 10 + r) for r in range(4)]
    assert straggler_line(lines).startswith("stragglers at step 40: none (4 ranks within 10%")
    assert straggler_line(lines[:1]) is None


TINY = [
    "training.trainer.accelerator=cpu",
    "training.trainer.devices=2",
    "training.trainer.num_nodes=1",
    "training.trainer.precision=32",
    "training.trainer.max_steps=4",
    "training.trainer.log_every_n_steps=1",
    "training.trainer.val_check_interval=1000",
    "training.trainer.limit_val_batches=0",
    "training.trainer.limit_test_batches=0",
    "training.model.data.data_impl=mock",
    "training.model.data.mock_vocab_size=512",
    "training.model.data.num_workers=0",
    "training.model.num_layers=1",
    "training.model.hidden_size=32",
    "training.model.num_attention_heads=2",
    "training.model.encoder_seq_length=16",
    "training.model.micro_batch_size=1",
    "training.model.global_batch_size=2",
    "training.model.optim.sched.warmup_steps=1",
    "training.model.optim.sched.constant_steps=0",
    "cluster.gpus_per_node=null",
    "cluster.gres=null",
]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_rank_training_writes_step_times_and_status_prints_the_line(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "gptrain", *a],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    out = run("launch", "--quiet", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    times = tmp_path / "results/gpt3_126m/results/step_times"
    rows = [json.loads(x) for x in (times / "rank-1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(
        r["rank"] == 1 and r["step_ms"] > 0 for r in rows
    )
    assert sorted(p.name for p in times.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    status = run("status", "gpt3_126m").stdout
    assert "  stragglers at step 4: " in status, status


def test_the_log_dir_comes_from_the_config_the_record_names(tmp_path: Path) -> None:
    """Records name the job's config (`<name>_hydra.yaml`, no job-name prefix); a record written
    before they did is read as then: the config next to the script, named like it."""
    from gptrain.launch.stragglers import log_dir_of

    (tmp_path / "run_hydra.yaml").write_text("exp_manager: {explicit_log_dir: /new}\n")
    (tmp_path / "p-run_hydra.yaml").write_text("exp_manager: {explicit_log_dir: /old}\n")
    script = str(tmp_path / "p-run_submission.sh")
    assert log_dir_of({"script": script, "config": str(tmp_path / "run_hydra.yaml")}) == Path("/new")
    assert log_dir_of({"script": script}) == Path("/old")
    assert log_dir_of({"script": "elsewhere.sh"}) is None
