"""A tiny CPU training run for the reliability tests (seconds, mock data)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from gloo_ranks import free_port

TINY = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.devices=1",
    "trainer.max_time=null",
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=100",
    "trainer.limit_val_batches=0",
    "trainer.limit_test_batches=0",
    "model.num_layers=1",
    "model.hidden_size=16",
    "model.num_attention_heads=2",
    "model.encoder_seq_length=8",
    "model.micro_batch_size=1",
    "model.global_batch_size=2",
    "model.data.num_workers=0",
    "model.data.data_impl=mock",
    "model.data.mock_vocab_size=64",
    "model.data.data_prefix=null",
    "model.optim.sched.warmup_steps=1",
    "model.optim.sched.constant_steps=0",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
]


def train_args(log_dir: Path, *overrides: str) -> list[str]:
    """`gptrain train` arguments of a tiny run writing into `log_dir`."""
    return ["train", "gpt3/126m", *TINY, f"exp_manager.explicit_log_dir={log_dir}", *overrides]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(name, None)
    return {**env, **extra}


PYTHON_GPTRAIN = [sys.executable, "-m", "gptrain"]


def start_ranks(
    log_dir: Path, overrides: list[str], program: list[str] = PYTHON_GPTRAIN, **env: str
) -> list[subprocess.Popen]:
    """Two gloo ranks of a tiny `gptrain train` (RANK/WORLD_SIZE as torchrun would set them);
    `program` is what takes the gptrain arguments."""
    return start_program([*program, *train_args(log_dir, "trainer.devices=2", *overrides)], **env)


def start_program(args: list[str], **env: str) -> list[subprocess.Popen]:
    """`args` as two gloo ranks (RANK/WORLD_SIZE as torchrun would set them)."""
    port, processes = free_port(), []
    for rank in range(2):
        rank_env = subprocess_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        rank_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env)
        processes.append(
            subprocess.Popen(args, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return processes


def finish_ranks(processes: list[subprocess.Popen], timeout: float = 120.0) -> list[tuple[str, str]]:
    """(stdout, stderr) of each rank once all have ended; any still running at the timeout is killed
    (a test about hangs must not hang the suite)."""
    try:
        return [process.communicate(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            process.kill()


def finish_or_end_together(processes: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """`finish_ranks` of ranks that each run several runs in turn (little output between them): once
    one has failed, the others are killed, since they would wait for it at the next run's rendezvous."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        if any(p.poll() not in (None, 0) for p in processes):
            break
        time.sleep(0.1)
    for process in processes:
        if process.poll() is None:
            process.kill()
    return [process.communicate() for process in processes]


@contextlib.contextmanager
def files_cannot_grow():
    """Every write of this process fails as on a full disk (EFBIG from a zero file-size limit, with no
    file name in the error, as ENOSPC from a close), while files can still be created and opened."""
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
