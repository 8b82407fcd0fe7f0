"""`gptrain plan --measure`: a few steps of each top candidate, re-ranked by what they measure.

Each trial is `gptrain train` on mock data with the candidate's overrides, written as a full
training YAML in the trial's directory, and run by `gptrain.plan.trial` on every rank: under
torchrun on this machine (`--cluster-type local`, one node: one process per GPU, or CPU
processes with --gpu cpu), or as a Slurm job rendered, submitted and tracked by the launcher's
code (`--cluster-type slurm`, gptrain.plan.slurm_trials). Every rank writes `rank-<r>.json`;
the step time is the median of the logging rank's iteration times after the first (which pays
for start-up and compilation), the peak memory the largest over ranks (`max allocated` on GPUs,
peak RSS on CPU, which includes the Python runtime). The fastest trial that ran becomes a full
training YAML for `gptrain train --config-file FILE`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptrain.errors import ConfigError
from gptrain.launch.sbatch import rank_command
from gptrain.plan.rank import Candidate
from gptrain.plan.report import Plan
from gptrain.utils.atomic import atomic_write_text


def trial_overrides(plan: Plan, candidate: Candidate, steps: int, log_dir: Path) -> list[str]:
    """The plan's config plus the candidate's layout, shortened to `steps` steps of mock data."""
    from gptrain.plan.build import cluster_overrides

    return [
        *cluster_overrides(plan.cluster),
        *candidate.layout.overrides(),
        f"trainer.max_steps={steps}",
        "model.rampup_batch_size=null",  # timed at the full global batch, as the run trains most steps
        "trainer.max_time=null",
        "exp_manager.max_time_per_run=null",  # NeMo's, which would set trainer.max_time again
        "trainer.log_every_n_steps=1",
        f"trainer.val_check_interval={steps}",
        "trainer.limit_val_batches=0",
        "trainer.limit_test_batches=0",
        "model.data.data_impl=mock",
        "model.data.data_prefix=null",
        f"model.data.mock_vocab_size={plan.work.vocab_size}",
        "model.data.num_workers=0",
        "exp_manager.resume_if_exists=false",
        "exp_manager.create_tensorboard_logger=false",
        f"exp_manager.checkpoint_callback_params.every_n_train_steps={steps * 10}",
        f"exp_manager.explicit_log_dir={log_dir}",
        "exp_manager.checkpoint_callback_params.dirpath=null",  # saves in the trial's directory, not the
        "exp_manager.checkpoint_callback_params.filepath=null",  # run's, which a later trial would refuse
    ]


def trial_dir_name(candidate: Candidate, row: int) -> str:
    """`02-tp1_pp2_dp1_mbs1`: the row number keeps two trials apart even where labels meet."""
    return f"{row:02d}-" + candidate.layout.label().replace(" ", "_").replace("=", "-")


def write_trial_config(plan: Plan, args: argparse.Namespace, candidate: Candidate, trial_dir: Path) -> Path:
    """The trial as a full training YAML (the user's config, the cluster, the layout, short run)."""
    from gptrain.plan.build import load_config

    overrides = trial_overrides(plan, candidate, args.steps, trial_dir / "results")
    cfg, _, _ = load_config(args, overrides)
    path = trial_dir / "trial.yaml"
    trial_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, cfg.to_yaml())
    return path


def trial_args(trial_dir: Path, config: Path) -> list[str]:
    """Arguments of `python -m gptrain.plan.trial` (the same on every rank)."""
    return ["-m", "gptrain.plan.trial", str(trial_dir / "measured"), "--config-file", str(config)]


def trial_env() -> dict[str, str]:
    """One OpenMP thread per rank unless the user set it (CPU trials share the cores)."""
    return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def read_results(trial_dir: Path, world_size: int, candidate: Candidate, fallback: str) -> None:
    """Fill the candidate from the ranks' JSON files; `fallback` explains a trial without them."""
    results = []
    for path in sorted((trial_dir / "measured").glob("rank-*.json")):
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    steps = [r["step_s"] for r in results if r.get("step_s") is not None]
    failed = [r for r in results if r.get("exit_code") != 0]
    candidate.measured_peak_gib = max((r["peak_gib"] for r in results), default=None)
    candidate.measured_step_s = steps[0] if steps and not failed and len(results) == world_size else None
    if candidate.measured_step_s is not None:
        return
    if failed:
        first = failed[0]
        candidate.error = f"rank {first['rank']} exit {first['exit_code']}: {first.get('error') or fallback}"
    elif len(results) < world_size:
        candidate.error = f"{len(results)} of {world_size} ranks reported: {fallback}"
    else:
        candidate.error = f"no iteration line: {fallback}"


def run_local_trial(plan: Plan, args: argparse.Namespace, candidate: Candidate, trial_dir: Path) -> None:
    config = write_trial_config(plan, args, candidate, trial_dir)
    nproc = plan.cluster.gpus_per_node
    command = rank_command(sys.executable, trial_args(trial_dir, config), nproc, local=True)
    env = {**os.environ, **trial_env()}
    try:
        done = run_trial_command(command, env, args.trial_timeout)
    except subprocess.TimeoutExpired:
        candidate.error = f"timed out after {args.trial_timeout:.0f} s (--trial-timeout)"
        return
    read_results(trial_dir, nproc, candidate, trial_failure(done.stderr, done.returncode))


def run_trial_command(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run a local trial's torchrun; past `timeout` (TimeoutExpired), on Ctrl-C or on SIGTERM to
    the planner, end it with every rank (`end_trial`) before the error goes on."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            end_trial(process)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def end_trial(process: subprocess.Popen) -> None:
    """Kill torchrun and its ranks. torch starts each rank in a session of its own, so killing
    torchrun alone (as subprocess.run does) left the ranks running: on the cores or GPUs the next
    trial measured, after the planner had exited. torchrun is stopped first, so it starts no rank
    between the listing and the kill, and killed last: while it lives, a rank that already ended
    stays its unreaped child, so the rank's pid cannot be another process's by the time it is
    signalled. A torchrun already reaped (its pid free for reuse) is not signalled at all."""
    from gptrain.parallel.torchrun import worker_pids

    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGSTOP)
    for rank in worker_pids(process.pid):
        kill_rank(rank)
    process.kill()
    process.wait()


def kill_rank(rank: int) -> None:
    """SIGKILL to the rank and, where it leads its own group, to what it started (DataLoader workers)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(rank) == rank:
            os.killpg(rank, signal.SIGKILL)
        else:
            os.kill(rank, signal.SIGKILL)


ERROR_PREFIX = "gptrain: error: "


def trial_failure(stderr: str, returncode: int) -> str:
    """What a failed trial says: the first rank's `gptrain: error:` line (a config training
    refuses), else the last line of torchrun's output; the last line alone was torchrun's own
    log ('E1128 ... failed (exitcode: 2) local_rank: 1 (p'), which hid the reason."""
    lines = stderr.strip().splitlines()
    errors = [line.removeprefix(ERROR_PREFIX) for line in lines if line.startswith(ERROR_PREFIX)]
    return (errors or lines or [f"exit {returncode}"])[0 if errors else -1][:200]


def trials_root(args: argparse.Namespace) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """--trials-dir, or for local trials a temporary directory (Slurm needs a shared path)."""
    if args.trials_dir:
        return Path(args.trials_dir).absolute() / time.strftime("%Y%m%d-%H%M%S"), None
    if args.cluster_type == "slurm":
        return Path("plan-trials").absolute() / time.strftime("%Y%m%d-%H%M%S"), None
    tmp = tempfile.TemporaryDirectory(prefix="gptrain-plan-")
    return Path(tmp.name), tmp


def check_local_gpus(plan: Plan) -> None:
    """Local trials need the planned GPUs here: on a machine with fewer, every trial stopped at the
    training's start, one after another, and the plan measured nothing."""
    if plan.cluster.gpu.name == "cpu":
        return
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < plan.cluster.gpus_per_node:
        raise ConfigError(
            f"--measure runs its trials here on {plan.cluster.gpus_per_node} {plan.cluster.gpu.name} GPUs"
            f" and this machine has {found} CUDA GPU(s): use --gpu cpu (CPU processes), a smaller"
            " --gpus-per-node, or --cluster-type slurm"
        )


def measure_plan(plan: Plan, args: argparse.Namespace) -> Path | None:
    """Measure the shown candidates, re-rank them, write the winner's config: its path, or None when
    no trial ran to the end (an earlier winner at that path is then renamed aside)."""
    slurm = args.cluster_type == "slurm"
    if plan.cluster.nodes > 1 and not slurm:
        raise ConfigError(
            f"--measure runs its trials on this machine: use --nodes 1 (got {plan.cluster.nodes}), "
            "or --cluster-type slurm to run them as Slurm jobs"
        )
    if not slurm:
        check_local_gpus(plan)
    written = None
    try:
        written = measure_and_write_winner(plan, args)
    finally:  # no winner (every trial failed, Ctrl-C, SIGTERM): an older output is not this plan's
        if written is None:
            set_aside_earlier_output(Path(args.output or "plan-best.yaml"))
    return written


def measure_and_write_winner(plan: Plan, args: argparse.Namespace) -> Path | None:
    """Run the trials of the shown candidates, re-rank them, write the fastest that ran; None if none ran."""
    slurm = args.cluster_type == "slurm"
    shown = plan.shown()
    root, tmp = trials_root(args)
    try:
        for row, candidate in enumerate(shown, 1):
            where = "as a Slurm job" if slurm else "here"
            label = candidate.layout.label()
            print(f"plan: measuring {label} ({args.steps} steps) {where} ...", file=sys.stderr, flush=True)
            trial_dir = root / trial_dir_name(candidate, row)
            if slurm:
                from gptrain.plan.slurm_trials import run_slurm_trial

                run_slurm_trial(plan, args, candidate, trial_dir)
            else:
                run_local_trial(plan, args, candidate, trial_dir)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if not tmp:
        plan.notes.append(f"--measure: trials in {root}")
    shown.sort(key=Candidate.sort_key)
    plan.ranked[: len(shown)] = shown
    winner = next((c for c in shown if c.measured_step_s is not None), None)
    if winner is None:
        plan.notes.append("--measure: no trial ran to the end; nothing written")
        return None
    return write_winner(plan, args, winner)


WINNER_HEADER = "# gptrain plan --measure: winner "


def set_aside_earlier_output(path: Path) -> None:
    """Rename the winner an earlier `plan --measure` wrote to `<name>.stale-<time>`: left in place,
    `gptrain train --config-file plan-best.yaml` after a plan that measured nothing trained it. A
    file without write_winner's header is not a winner (the user's config, another run's output):
    it stays."""
    if not is_a_written_winner(path):
        return
    aside = path.with_name(f"{path.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        path.rename(aside)
    except OSError as error:
        print(f"plan: {path} is not this plan's winner and could not be renamed ({error.strerror}): delete it",
              file=sys.stderr)  # fmt: skip
        return
    print(f"plan: {path} is not this plan's winner: renamed to {aside}", file=sys.stderr)


def is_a_written_winner(path: Path) -> bool:
    """Whether `path` is a file that starts with the header write_winner writes."""
    try:
        with path.open("rb") as file:
            return file.read(len(WINNER_HEADER)) == WINNER_HEADER.encode()
    except OSError:  # missing, a directory, unreadable: nothing of an earlier plan to set aside
        return False


def write_winner(plan: Plan, args: argparse.Namespace, winner: Candidate) -> Path:
    """The winner as a full training YAML (the user's config, the cluster and the layout)."""
    from gptrain.plan.build import cluster_overrides, load_config

    keys = [*cluster_overrides(plan.cluster), *winner.layout.overrides()]  # the planned world too
    cfg, _, _ = load_config(args, keys)
    path = Path(args.output or "plan-best.yaml")
    header = f"{WINNER_HEADER}{winner.layout.label()} at {winner.measured_step_s:.3f} s/step\n"
    atomic_write_text(path, header + cfg.to_yaml())
    plan.notes.append(
        f"winner {winner.layout.label()} written to {path}: gptrain train --config-file {shlex.quote(str(path))}"
    )
    plan.notes.append("  or as overrides: " + shlex.join(keys))
    plan.notes.append("  or with gptrain launch: " + shlex.join(f"training.{key}" for key in keys))
    return path
