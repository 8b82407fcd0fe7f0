"""Local executor: run each stage's script on this machine, streaming its log.

The training script runs torchrun (`--standalone`: a free rendezvous port, one node) with
`trainer.devices` processes. Output goes to the terminal and to
`<run_dir>/log-<job>_<pid>.out`; the pid is recorded so `gptrain status/cancel` work too.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from gptrain.errors import EXIT_REQUEUE, os_error_text
from gptrain.launch.key_types import switch_of
from gptrain.launch.log_endings import early_stop
from gptrain.launch.records import append_record, process_start_time
from gptrain.launch.sbatch import Job
from gptrain.launch.stages import LaunchPlan


def run_job(job: Job, echo: bool = True, after: str | None = None) -> tuple[int, str]:
    """Run one stage (`after`: the job id of the stage before it in this launch); return its exit
    code and job id."""
    process = subprocess.Popen(
        ["bash", str(job.script_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    with forwarding_stop_signals(process):
        return follow_job(job, process, echo, after), f"local-{process.pid}"


@contextlib.contextmanager
def forwarding_stop_signals(process: subprocess.Popen) -> Iterator[None]:
    """SIGTERM or SIGHUP to the launcher (kill, timeout, a closed terminal) goes to the stage, whose
    training checkpoints and exits 75, while its output is still read; before, the launcher died of
    it, and the training with it at its next line of output, with nothing saved."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: object) -> None:
        del signum, frame
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def follow_job(job: Job, process: subprocess.Popen, echo: bool, after: str | None = None) -> int:
    """Stream the stage's output to its log (and the terminal), record its start and exit.

    The record names the job it ran after (`dependency`, as a Slurm record does), which is how
    `gptrain logs --launch N` tells one launch from the next."""
    log = job_log(job, f"local-{process.pid}")
    fields = {"stage": job.stage, "executor": "local", "job_id": f"local-{process.pid}", "pid": process.pid}
    started = process_start_time(process.pid)
    if started is not None:  # status/cancel check it: a reused pid is another process
        fields["start_time"] = started
    fields.update(
        job_name=job.job_name,
        script=str(job.script_path),
        config=str(job.config_path),
        log=str(log),
        dependency=after,
    )
    append_record(job.run_dir, "submitted", **fields)
    code = 130
    try:
        assert process.stdout is not None
        tee(process.stdout, log, echo)
        code = process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            code = process.wait()
        try:
            append_record(job.run_dir, "finished", job_id=fields["job_id"], stage=job.stage, exit_code=code)
        except OSError as error:  # the stage's exit status matters more (75: launch again to resume)
            warn(error, job.run_dir, "its exit is not recorded there")
    return code


def job_log(job: Job, job_id: str) -> Path:
    """The log a local job tees its output into: log-<job name>_<pid>.out."""
    return job.run_dir / f"log-{job.job_name}_{job_id.removeprefix('local-')}.out"


def resume_override(plan: LaunchPlan) -> str:
    """With resume_if_exists=false a relaunch is a fresh start, refused over the run's checkpoints:
    the override that makes it the resume."""
    exp_manager = (plan.configs.get("training") or {}).get("exp_manager") or {}
    return (
        ""
        if switch_of(exp_manager, "resume_if_exists", True, "training.exp_manager")
        else " and training.exp_manager.resume_if_exists=true"
    )


def tee(stream: IO[bytes], log: Path, echo: bool) -> None:
    """Copy the stage's output into `log` (and to the terminal) until it ends. A copy the system
    refuses (a full disk under the log; a terminal or pipe gone) is given up, the log's in one
    line: the stage is never ended for the launcher's copy of its output, and its pipe is drained."""
    out: IO[bytes] | None = open(log, "wb")  # noqa: SIM115 (closed below, or given up)
    try:
        for line in stream:
            if out is not None:
                try:
                    out.write(line)
                    out.flush()
                except OSError as error:
                    _close_quietly(out)
                    out = None
                    warn(error, log, "the rest of the stage's output is not copied there")
            if echo:
                try:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
                except OSError:  # nowhere to say it: stdout is what failed
                    echo = False
    finally:
        if out is not None:
            _close_quietly(out)


def _close_quietly(file: IO[bytes]) -> None:
    with contextlib.suppress(OSError):  # a full disk refuses the buffered rest again
        file.close()


def warn(error: OSError, where: Path, consequence: str) -> None:
    with contextlib.suppress(OSError):
        print(f"gptrain: WARNING: cannot write {os_error_text(error, where)}: {consequence}", file=sys.stderr)


def run(plan: LaunchPlan, echo: bool = True) -> int:
    """Run the stages in order; stop at the first that fails and return its exit code."""
    after: str | None = None
    for job in plan.jobs:
        print(f"gptrain: running {job.stage} locally: {job.script_path}", file=sys.stderr, flush=True)
        code, after = run_job(job, echo, after)
        early = early_stop(job_log(job, after)) if code == EXIT_REQUEUE and job.stage == "training" else None
        if early:  # a stop signal during start-up: nothing saved, maybe no checkpoint at all
            print(
                f"gptrain: {job.stage} stopped (exit {code}), {early.describe()};"
                f" launch again with the same arguments{resume_override(plan) if early.step else ''}"
                f" to {early.then}",
                file=sys.stderr,
            )
            return code
        if code == EXIT_REQUEUE:
            print(
                f"gptrain: {job.stage} saved a checkpoint and stopped (exit {code});"
                f" launch again with the same arguments{resume_override(plan)} to resume",
                file=sys.stderr,
            )
            return code
        if code != 0:
            print(f"gptrain: {job.stage} failed with exit code {code}; later stages not run", file=sys.stderr)
            return code
    return 0
