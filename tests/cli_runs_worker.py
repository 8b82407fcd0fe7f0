"""One gloo rank of `gptrain` commands in turn (test_hf_layouts.py, test_eval.py, test_train_ddp.py).

Argument: a JSON list of {"port": PORT, "argv": [...]}: each run is a `gptrain` command as the CLI
runs it, in this one process (a torch start-up per run costs seconds on a CPU VM), meeting the other
ranks on a port of its own (on one port, a rank done early could reach the store of the run before
while another rank has yet to close it). Exits non-zero at the first run that does.
"""

import json
import os
import sys

from gptrain.cli import main


def run_all(runs: list[dict]) -> int:
    for run in runs:
        os.environ["MASTER_PORT"] = str(run["port"])
        code = main(run["argv"])
        if code != 0:
            print(f"run {run['argv']} exited {code}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(run_all(json.loads(sys.argv[1])))
