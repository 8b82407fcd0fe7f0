"""Local executor: run each stage's script on this machine, streaming its log.

The training script runs torchrun (`--standalone`: a free rendezvous port, one node) with
`trainer.devices` processes. Output goes to the terminal and to
`<run_dir>/log-<job>_<pid>.out`; the pid is recorded so `gptrain status/cancel` work too.
"""

from __future__ import annotations

import subprocess
import sys

from gptrain.errors import EXIT_REQUEUE
from gptrain.launch.records import append_record, process_start_time
from gptrain.launch.sbatch import Job
from gptrain.launch.stages import LaunchPlan


def run_job(job: Job, echo: bool = True) -> int:
    process = subprocess.Popen(
        ["bash", str(job.script_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    log = job.run_dir / f"log-{job.job_name}_{process.pid}.out"
    fields = {"stage": job.stage, "executor": "local", "job_id": f"local-{process.pid}", "pid": process.pid}
    started = process_start_time(process.pid)
    if started is not None:  # status/cancel check it: a reused pid is another process
        fields["start_time"] = started
    fields.update(
        job_name=job.job_name, script=str(job.script_path), config=str(job.config_path), log=str(log)
    )
    append_record(job.run_dir, "submitted", **fields)
    code = 130
    try:
        with open(log, "wb") as out:
            assert process.stdout is not None
            for line in process.stdout:
                out.write(line)
                out.flush()
                if echo:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
        code = process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            code = process.wait()
        append_record(job.run_dir, "finished", job_id=fields["job_id"], stage=job.stage, exit_code=code)
    return code


def run(plan: LaunchPlan, echo: bool = True) -> int:
    """Run the stages in order; stop at the first that fails and return its exit code."""
    for job in plan.jobs:
        print(f"gptrain: running {job.stage} locally: {job.script_path}", file=sys.stderr, flush=True)
        code = run_job(job, echo)
        if code == EXIT_REQUEUE:
            print(
                f"gptrain: {job.stage} saved a checkpoint and stopped (exit {code});"
                " launch again with the same arguments to resume",
                file=sys.stderr,
            )
            return code
        if code != 0:
            print(f"gptrain: {job.stage} failed with exit code {code}; later stages not run", file=sys.stderr)
            return code
    return 0
