"""A hung rank under a real Slurm: the job ends with 76, requeues itself and resumes to the end.

Needs `bash scripts/slurm-local.sh up`; skipped (with the reason) without it, like tests/slurm.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")
TINY = [
    "cluster_type=slurm",
    "cluster.gpus_per_node=null",
    "cluster.gres=null",
    "cluster.exclusive=false",
    "cluster.mem=null",
    "cluster.job_name_prefix=t-",
    "training.run.time_limit=00:10:00",
    "training.trainer.accelerator=cpu",
    "training.trainer.devices=2",
    "training.trainer.num_nodes=1",
    "training.trainer.precision=32",
    "training.trainer.max_steps=8",
    "training.trainer.log_every_n_steps=1",
    "training.trainer.limit_val_batches=0",
    "training.trainer.limit_test_batches=0",
    "training.model.data.data_impl=mock",
    "training.model.data.mock_vocab_size=128",
    "training.model.data.num_workers=0",
    "training.model.num_layers=1",
    "training.model.hidden_size=32",
    "training.model.num_attention_heads=4",
    "training.model.encoder_seq_length=16",
    "training.model.micro_batch_size=1",
    "training.model.global_batch_size=2",
    "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
]


def slurm_missing() -> str | None:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"sinfo: {error}"
    return None if out.returncode == 0 and out.stdout.strip() else "sinfo lists no usable nodes"


def job_state(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    return dict(w.partition("=")[::2] for w in out.stdout.split() if "=" in w)


def test_a_hung_rank_requeues_the_job_which_resumes_to_the_end(tmp_path):
    reason = slurm_missing()
    if reason:
        pytest.skip(f"no Slurm: {reason}")
    hang = ["training.trainer.hang_timeout_minutes=0.05", "+env_vars.GPTRAIN_TEST_STOP_RANK=1:4"]
    args = [sys.executable, "-m", "gptrain", "launch", *TINY, *hang, "training.run.name=hung"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "results" / "hung"
    [job_id] = [json.loads(x)["job_id"] for x in (run / "launcher.log").read_text().splitlines()]
    try:
        deadline = time.monotonic() + 600  # 143 s seen with the other worker's jobs on the two nodes
        while (fields := job_state(job_id)).get("JobState") != "COMPLETED":
            assert time.monotonic() < deadline and fields.get("JobState") not in ("FAILED", "CANCELLED")
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    assert fields["Restarts"] == "1"
    text = (run / f"log-t-hung_{job_id}.out").read_text()
    assert "hang: stuck rank 1 on host" in text and "never started iteration 4" in text
    assert "a rank hung (see the line above); requeueing (restart 1 of" in text
    steps = [int(m[1]) for m in ITERATION.finditer(text)]
    assert steps[:3] == [1, 2, 3] and steps[-6:] == [3, 4, 5, 6, 7, 8]  # resumed from step_2
