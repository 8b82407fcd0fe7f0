"""`gptrain plan --measure --cluster-type slurm` against a real Slurm: trials as launcher jobs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from slurm_helpers import gptrain, job_fields, job_ids

from gptrain.config import load_training_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))
from plan_helpers import TINY  # noqa: E402

# A cluster profile for the local Slurm: CPU tasks, no GPU or memory requests.
PROFILE = {
    "partition": None,
    "account": None,
    "exclusive": False,
    "gpus_per_node": None,
    "gres": None,
    "mem": None,
    "job_name_prefix": "t-",
    "srun_args": [],
    "stderr_to_stdout": True,
    "plan": {"gpu": "cpu"},
}


def test_measure_runs_each_trial_as_a_slurm_job_on_two_nodes(workdir: Path) -> None:
    profile = workdir / "local_cpu.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    out, js, trials = workdir / "best.yaml", workdir / "plan.json", workdir / "trials"
    args = [
        "plan",
        "gpt3/126m",
        *TINY,
        "--cluster",
        str(profile),
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
    ]
    args += ["--top", "2", "--measure", "--cluster-type", "slurm", "--steps", "3", "--trial-timeout", "100"]
    args += ["--trials-dir", str(trials), "--output", str(out), "--json", str(js)]
    done = gptrain(args, workdir, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(js.read_text())
    measured = [c for c in plan["candidates"] if c["measured_step_s"] is not None]
    assert len(measured) == 2, plan["candidates"]
    steps = [c["measured_step_s"] for c in plan["candidates"]]
    assert steps == sorted(steps)  # re-ranked by measurement
    ids = job_ids(trials)
    assert len(ids) == 2  # one job per trial, recorded where `gptrain status DIR` finds it
    for job_id in ids:
        fields = job_fields(job_id)
        assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "2", fields
    results = sorted(p.name for p in trials.glob("*/*/measured/rank-*.json"))
    assert results == ["rank-0.json", "rank-0.json", "rank-1.json", "rank-1.json"]
    for path in trials.glob("*/*/measured/rank-*.json"):
        rank = json.loads(path.read_text())
        assert rank["exit_code"] == 0 and rank["peak_gib"] > 0 and rank["memory"] == "peak RSS"
    cfg = load_training_config(None, [], config_file=str(out))
    assert (cfg.trainer.num_nodes, cfg.trainer.devices, cfg.trainer.accelerator) == (2, 1, "cpu")
    assert f"model.micro_batch_size={cfg.model.micro_batch_size}" in plan["candidates"][0]["overrides"]


def test_trials_keep_off_the_nodes_a_failed_validation_blamed(workdir: Path) -> None:
    """The exclude file `gptrain validate` writes (and `gptrain launch` honours) keeps trials off
    those nodes too: a trial on a bad node measures the node, not the layout."""
    profile = workdir / "local_cpu.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    exclude = workdir / "exclude_nodes.txt"
    exclude.write_text("n1\n")  # scripts/slurm-local.sh's nodes are n1 and n2
    trials = workdir / "trials"
    args = ["plan", "gpt3/126m", *TINY, "--cluster", str(profile), "--nodes", "1", "--gpus-per-node", "1"]
    args += ["--top", "1", "--measure", "--cluster-type", "slurm", "--steps", "3", "--trial-timeout", "100"]
    args += ["--trials-dir", str(trials), "--exclude-file", str(exclude)]
    done = gptrain(args, workdir, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    [job_id] = job_ids(trials)
    fields = job_fields(job_id)
    assert fields["JobState"] == "COMPLETED" and fields["NodeList"] == "n2", fields
