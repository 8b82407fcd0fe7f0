"""One gloo rank of a data-parallel run with trainer.run_ahead, for tests/train/test_run_ahead.py.

Fused AdamW on the CPU (the optimizer gptrain builds on a GPU), so that steps are queued ahead.
Arguments: OUT LOG_DIR RUN_AHEAD STOP_AT [OVERRIDE ...]: rank 1 asks to stop (SIGUSR1) during step
STOP_AT (0: never); the overrides choose the layout (default: DDP). Writes OUT/rank_<r>.json: the exit code, each step's loss and the steps after which the
next one was queued ahead, and whether SIGTERM is ignored after train() returned. Then it sends
itself SIGTERM, as `srun --kill-on-bad-exit` does to the ranks still running when one exits 75.
"""

import json
import os
import signal
import sys
from pathlib import Path

from train_e2e_helpers import MOCK, RUN_AHEAD_SHAPE, record_runs_ahead, tiny_config

from gptrain.train import builders, loop, step_loop


def main() -> None:
    out, log_dir, run_ahead, stop_at = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    layout = sys.argv[5:] or ["model.data_parallel_sharding=ddp"]
    rank = int(os.environ["RANK"])
    real_build, real_record = builders.build_optimizer, step_loop.record
    losses, ahead = {}, record_runs_ahead()

    def recording(session, result, *args):
        real_record(session, result, *args)
        losses[session.state.step] = result.loss
        if rank == 1 and session.state.step == stop_at:
            os.kill(os.getpid(), signal.SIGUSR1)

    builders.build_optimizer = lambda *args: real_build(*args[:-1], "cuda")
    step_loop.record = recording
    cfg = tiny_config(
        Path(log_dir),
        *MOCK,
        *RUN_AHEAD_SHAPE,
        "trainer.devices=2",
        f"trainer.run_ahead={run_ahead}",
        *layout,
    )
    code = loop.train(cfg, process_exits=True)  # a rank, as the CLI runs it
    ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    out.mkdir(parents=True, exist_ok=True)
    result = {"code": code, "losses": losses, "ahead": ahead, "sigterm_ignored": ignored}
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    if ignored:
        os.kill(os.getpid(), signal.SIGTERM)  # survived: the rank exits as it was going to


if __name__ == "__main__":
    main()
