"""One gloo rank of data-parallel runs with trainer.run_ahead, for tests/train/test_run_ahead.py.

Fused AdamW on the CPU (the optimizer gptrain builds on a GPU), so that steps are queued ahead.
Arguments: OUT ROOT RUNS [OVERRIDE ...]. RUNS is a comma-separated list of NAME:RUN_AHEAD:STOP_AT,
each after the first with :PORT, trained in turn in this one process (a torch start-up each costs
seconds on a CPU VM): run NAME trains into ROOT/NAME, and rank 1 asks to stop (SIGUSR1) during step
STOP_AT (0: never); a run stopped so must be the last (a rank exits after it). A later run meets on
a port of its own: on the first one's, a rank done early could reach the store the other rank has
yet to close, and wait there for ever. The overrides choose the layout (default: DDP); a run given
as NAME:RUN_AHEAD:STOP_AT[:PORT]|OVERRIDE|OVERRIDE... takes those overrides instead. Each run
writes OUT/NAME/rank_<r>.json: the exit code, each step's loss and the steps after which the next
one was queued ahead, and whether SIGTERM is ignored after train() returned. Then it sends itself
SIGTERM, as `srun --kill-on-bad-exit` does to the ranks still running when one exits 75.
"""

import json
import os
import signal
import sys
from pathlib import Path

from train_e2e_helpers import MOCK, RUN_AHEAD_SHAPE, record_runs_ahead, tiny_config

from gptrain.train import builders, loop, step_loop


def main() -> None:
    out, root, runs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
    layout = sys.argv[4:] or ["model.data_parallel_sharding=ddp"]
    rank = int(os.environ["RANK"])
    real_build, real_record = builders.build_optimizer, step_loop.record
    losses, ahead, stop_at = {}, record_runs_ahead(), [0]

    def recording(session, result, *args):
        real_record(session, result, *args)
        losses[session.state.step] = result.loss
        if rank == 1 and session.state.step == stop_at[0]:
            os.kill(os.getpid(), signal.SIGUSR1)

    builders.build_optimizer = lambda *args: real_build(*args[:-1], "cuda")
    step_loop.record = recording
    for run in runs:
        run, *own_layout = run.split("|")
        name, run_ahead, stop, *port = run.split(":")
        if port:
            os.environ["MASTER_PORT"] = port[0]
        losses.clear()
        ahead.clear()
        stop_at[0] = int(stop)
        recorded = {"losses": losses, "ahead": ahead}
        train(root / name, out / name, rank, run_ahead, own_layout or layout, recorded)


def train(log_dir: Path, out: Path, rank: int, run_ahead: str, layout: list[str], recorded: dict) -> None:
    cfg = tiny_config(
        log_dir,
        *MOCK,
        *RUN_AHEAD_SHAPE,
        "trainer.devices=2",
        f"trainer.run_ahead={run_ahead}",
        *layout,
    )
    code = loop.train(cfg, process_exits=True)  # a rank, as the CLI runs it
    ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    out.mkdir(parents=True, exist_ok=True)
    result = {"code": code, **recorded, "sigterm_ignored": ignored}
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    if ignored:
        os.kill(os.getpid(), signal.SIGTERM)  # survived: the rank exits as it was going to


if __name__ == "__main__":
    main()
