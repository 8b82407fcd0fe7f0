"""One gloo rank of `gptrain eval RUN` for tests/trained/test_eval.py, where rank 1's listing of
the run's checkpoints lacks the newest one (a node's stale view of a run still saving). Each rank
writes the step it loaded to OUT/rank_<r>.txt; the stale listing is undone after. Arguments: RUN OUT
[RUNS]: RUNS, a JSON list of cli_runs_worker's runs, then run in the same launch (one start-up)."""

import json
import os
import sys
import traceback
import warnings
from pathlib import Path

import torch.distributed as dist

from gptrain.trained import evaluate, load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: cli_runs_worker
import cli_runs_worker  # noqa: E402


def main() -> int:
    warnings.filterwarnings("ignore")
    run, out = Path(sys.argv[1]), Path(sys.argv[2])
    steps, loaded = load.complete_steps, evaluate.load_model
    if os.environ["RANK"] == "1":
        load.complete_steps = lambda root: steps(root)[:-1]

    def recording(model, step_dir, world):
        (out / f"rank_{world.rank}.txt").write_text(step_dir.name)
        return loaded(model, step_dir, world)

    evaluate.load_model = recording
    try:
        request = evaluate.EvalRequest(checkpoint=str(run), overrides=["trainer.devices=2"])
        evaluate.evaluate_checkpoint(request)
    finally:
        load.complete_steps, evaluate.load_model = steps, loaded
    return cli_runs_worker.run_all(json.loads(sys.argv[3])) if len(sys.argv) > 3 else 0


if __name__ == "__main__":
    code = 1
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
    finally:  # /work/shared/torch-distributed-cpu.md: gloo may abort at interpreter exit otherwise
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
