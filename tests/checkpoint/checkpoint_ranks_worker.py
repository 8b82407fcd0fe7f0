"""One gloo rank running every scenario of tests/checkpoint/test_checkpoint_ranks.py in turn, in one
process group (a torch start-up per scenario cost seconds each): rank_load_worker's modes and
start_from_worker's and streams_worker's, each with directories of its own. Argument: a JSON list of
{"worker": "rank_load" | "start_from" | "streams", "args": [...]}, each as that worker's command line takes it."""

import datetime
import json
import sys
import warnings
from pathlib import Path

import rank_load_worker
import start_from_worker
import streams_worker
import torch
import torch.distributed as dist
from gloo_worker import run_as_rank

SCENARIOS = {
    "rank_load": rank_load_worker.scenario,
    "start_from": start_from_worker.scenario,
    "streams": streams_worker.scenario,
}


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # a rank waiting in a collective its peer never enters fails here, well within the test's timeout
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    for run in json.loads(sys.argv[1]):
        args = [Path(arg) for arg in run["args"][:-1]] + run["args"][-1:]
        SCENARIOS[run["worker"]](*args)
        dist.barrier()  # each scenario ends on every rank before the next one starts
    return 0


if __name__ == "__main__":
    run_as_rank(main)
