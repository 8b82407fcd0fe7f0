"""Helpers of the Slurm tests: is Slurm usable, run gptrain, read and wait for jobs."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path


@functools.lru_cache(maxsize=1)
def slurm_missing() -> str | None:
    """Why Slurm cannot be used here, or None when `sinfo` answers with an idle-able node."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        return "sinfo not found (bash scripts/slurm-local.sh up)"
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 10 s"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()}"
    if not out.stdout.strip():
        return "sinfo lists no nodes"
    return None


def job_ids(root: Path) -> list[str]:
    ids = []
    for log in root.glob("**/launcher.log"):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "submitted" and record.get("executor") == "slurm":
                ids.append(str(record["job_id"]))
    return ids


def gptrain(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gptrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def job_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    fields: dict[str, str] = {}
    for line in out.stdout.splitlines():
        stripped = line.strip()
        if "JobName=" in stripped:  # the name may contain spaces: keep the rest of the line
            fields["JobName"] = stripped.split("JobName=", 1)[1]
            continue
        for word in stripped.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
    return fields


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")


def wait_for(
    job_id: str, states: tuple[str, ...], timeout: float, reason: str | None = None
) -> dict[str, str]:
    """Poll scontrol until the job is in one of `states` (and has `reason`, if given). The wait is
    3 x `timeout` (set for one test at a time): under the suite's two workers another file's jobs may
    hold the local Slurm's two nodes first."""
    deadline = time.monotonic() + 3 * timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job_fields(job_id)
        if fields.get("JobState") in states and (reason is None or fields.get("Reason") == reason):
            return fields
        if fields.get("JobState") in FINAL and fields.get("JobState") not in states:
            break  # it will never get there
        time.sleep(0.3)
    raise AssertionError(
        f"job {job_id} not in {states} (waited up to {timeout}s): {fields.get('JobState')} {fields.get('Reason')}"
    )


TINY = [
    "cluster_type=slurm",
    "cluster.gpus_per_node=null",
    "cluster.gres=null",
    "cluster.exclusive=false",
    "cluster.mem=null",
    "cluster.job_name_prefix=t-",
    "training.run.time_limit=00:10:00",
    "training.trainer.accelerator=cpu",
    "training.trainer.num_nodes=1",
    "training.trainer.devices=1",
    "training.trainer.precision=32",
    "training.trainer.max_steps=6",
    "training.trainer.log_every_n_steps=1",
    "training.trainer.val_check_interval=1000",
    "training.trainer.limit_val_batches=0",
    "training.trainer.limit_test_batches=0",
    "training.model.data.data_impl=mock",
    "training.model.data.mock_vocab_size=512",
    "training.model.data.num_workers=0",
    "training.model.num_layers=2",
    "training.model.hidden_size=64",
    "training.model.num_attention_heads=4",
    "training.model.encoder_seq_length=32",
    "training.model.micro_batch_size=2",
    "training.model.global_batch_size=4",
    "training.model.optim.sched.warmup_steps=1",
    "training.model.optim.sched.constant_steps=0",
    "training.exp_manager.checkpoint_callback_params.every_n_train_steps=3",
]
