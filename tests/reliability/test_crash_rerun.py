"""A run killed with SIGKILL (no handler runs) is rerun with the same command and just continues.

What must hold: `latest` names a complete checkpoint, the lock the dead run left is taken over
(its pid is gone), and the rerun resumes from the newest complete checkpoint to the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from reliability_helpers import PYTHON_GPTRAIN, subprocess_env, train_args

from gptrain.cli import main
from gptrain.train.run_lock import LOCK_NAME

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.mark.slow
def test_kill_9_then_the_same_command_resumes_and_finishes(tmp_path, capsys):
    log_dir = tmp_path / "run"
    args = train_args(
        log_dir, "trainer.max_steps=30", "exp_manager.checkpoint_callback_params.every_n_train_steps=1"
    )
    process = subprocess.Popen([*PYTHON_GPTRAIN, *args], env=subprocess_env(), stdout=subprocess.DEVNULL)
    latest = log_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not (latest.exists() and int(latest.read_text().strip().removeprefix("step_")) >= 3):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # saving every step: most likely in the middle of one
    process.wait()
    dead = json.loads((log_dir / LOCK_NAME).read_text())
    assert dead["pid"] == process.pid  # the dead run's lock is still there
    newest = latest.read_text().strip()
    assert (log_dir / "checkpoints" / newest / "COMPLETE").exists()

    assert main(args) == 0
    log = (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert f"took over the lock {log_dir / LOCK_NAME} of pid {process.pid}" in log
    assert "no longer runs" in log
    resumed = int(log.split("resuming from ")[1].split("at iteration ")[1].split(",")[0])
    assert resumed >= int(newest.removeprefix("step_"))
    assert latest.read_text().strip() == "step_30" and not (log_dir / LOCK_NAME).exists()
