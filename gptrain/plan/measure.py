"""`gptrain plan --measure`: a few steps of each top candidate, re-ranked by what they measure.

Each trial is `gptrain train` under torchrun on this machine (one process per GPU of one node, or
CPU processes with --gpu cpu) on mock data, with the candidate's overrides. Step time is the
median of the Megatron iteration lines after the first (which pays for start-up and compilation);
peak memory is the largest `max allocated` of the ranks' memory lines on GPUs, or the largest
process's peak RSS on CPU (which includes the Python runtime). The fastest trial that ran
becomes a full training YAML for `gptrain train --config-file FILE`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gptrain.errors import ConfigError
from gptrain.plan.rank import Candidate
from gptrain.plan.report import Plan
from gptrain.utils.atomic import atomic_write_text

ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
MAX_ALLOCATED = re.compile(r"max allocated: ([0-9.]+)")
PEAK_RSS = re.compile(r"^PEAK_RSS_KB (\d+)$", re.MULTILINE)
TRIAL_TIMEOUT_S = 900
# Runs torchrun in a child and reports the largest peak RSS among its descendants (ru_maxrss of
# RUSAGE_CHILDREN is the largest waited-for descendant), so each trial is measured on its own.
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
    "sys.exit(code)\n"
)


def trial_overrides(plan: Plan, candidate: Candidate, steps: int, log_dir: Path) -> list[str]:
    """The plan's config plus the candidate's layout, shortened to `steps` steps of mock data."""
    from gptrain.plan.build import cluster_overrides

    return [
        *cluster_overrides(plan.cluster),
        *candidate.layout.overrides(),
        f"trainer.max_steps={steps}",
        "trainer.max_time=null",
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
    ]


def trial_command(plan: Plan, args: argparse.Namespace, candidate: Candidate, log_dir: Path) -> list[str]:
    nproc = plan.cluster.gpus_per_node
    source = ["--config-file", args.config_file] if args.config_file else [args.preset or "gpt3/126m"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    train = ["-m", "gptrain", "train", *source, *args.overrides]
    return [
        sys.executable,
        "-c",
        RSS_WRAPPER,
        *torchrun,
        *train,
        *trial_overrides(plan, candidate, args.steps, log_dir),
    ]


def parse_trial(output: str, log_dir: Path) -> tuple[float | None, float | None]:
    """(median step seconds after the first, peak GiB) from the logs of a trial."""
    text = output + "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("nemo_log_*.txt")))
    elapsed = [float(x) / 1000.0 for x in ELAPSED.findall(text)]
    # every rank logs its own memory line; the logging rank's lines also reach stdout
    allocated = [float(x) / 1024.0 for x in MAX_ALLOCATED.findall(text)]
    rss = [int(x) / 2**20 for x in PEAK_RSS.findall(output)]
    step = statistics.median(elapsed[1:]) if len(elapsed) > 1 else (elapsed[0] if elapsed else None)
    peak = max(allocated) if allocated else (max(rss) if rss else None)
    return step, peak


def run_trial(plan: Plan, args: argparse.Namespace, candidate: Candidate, root: Path) -> None:
    log_dir = root / candidate.layout.label().replace(" ", "_").replace("=", "-")
    command = trial_command(plan, args, candidate, log_dir)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print(f"plan: measuring {candidate.layout.label()} ({args.steps} steps) ...", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=TRIAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        candidate.error = f"timed out after {TRIAL_TIMEOUT_S} s"
        return
    candidate.measured_step_s, candidate.measured_peak_gib = parse_trial(done.stdout + done.stderr, log_dir)
    if done.returncode != 0 or candidate.measured_step_s is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        candidate.error = f"exit {done.returncode}: {last[:120]}"
        candidate.measured_step_s = None


def measure_plan(plan: Plan, args: argparse.Namespace) -> Path | None:
    """Measure the shown candidates, re-rank them, write the winner's config; its path or None."""
    if plan.cluster.nodes > 1:
        raise ConfigError(
            f"--measure runs its trials on this machine: use --nodes 1 (got {plan.cluster.nodes}), "
            "or measure the winners with `gptrain launch` on the cluster"
        )
    shown = plan.shown()
    with tempfile.TemporaryDirectory(prefix="gptrain-plan-") as tmp:
        for candidate in shown:
            run_trial(plan, args, candidate, Path(tmp))
    shown.sort(key=Candidate.sort_key)
    plan.ranked[: len(shown)] = shown
    winner = next((c for c in shown if c.measured_step_s is not None), None)
    if winner is None:
        plan.notes.append("--measure: no trial ran to the end; nothing written")
        return None
    return write_winner(plan, args, winner)


def write_winner(plan: Plan, args: argparse.Namespace, winner: Candidate) -> Path:
    """The winner as a full training YAML (the user's config, the cluster and the layout)."""
    from gptrain.plan.build import cluster_overrides, load_config

    cfg, _, _ = load_config(args, [*cluster_overrides(plan.cluster), *winner.layout.overrides()])
    path = Path(args.output or "plan-best.yaml")
    header = (
        f"# gptrain plan --measure: winner {winner.layout.label()} at {winner.measured_step_s:.3f} s/step\n"
    )
    atomic_write_text(path, header + cfg.to_yaml())
    plan.notes.append(f"winner {winner.layout.label()} written to {path}: gptrain train --config-file {path}")
    plan.notes.append("  or as overrides: " + " ".join(winner.layout.overrides()))
    return path
