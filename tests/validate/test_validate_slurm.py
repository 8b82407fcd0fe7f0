"""Validation through a real Slurm across the two emulated nodes of scripts/slurm-local.sh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SLURM_TESTS = Path(__file__).resolve().parents[1] / "slurm"
sys.path.insert(0, str(SLURM_TESTS))
from slurm_helpers import TINY, gptrain, job_ids, slurm_missing, wait_for  # noqa: E402

pytestmark = pytest.mark.slurm
QUICK = ["validation.max_bytes=4K", "validation.iters=2", "validation.warmup=1", "validation.pair_bytes=16K"]


@pytest.fixture(autouse=True)
def require_slurm():
    reason = slurm_missing()
    if reason is not None:
        import os

        if os.environ.get("GPTRAIN_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPTRAIN_REQUIRE_SLURM=1 but Slurm is not usable: {reason}")
        pytest.skip(f"no Slurm: {reason}")


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    ids = job_ids(tmp_path)
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


def submitted(run: Path) -> dict[str, str]:
    records = [json.loads(line) for line in (run / "launcher.log").read_text().splitlines()]
    return {r["stage"]: str(r["job_id"]) for r in records if r["event"] == "submitted"}


def test_validation_job_gates_training_across_two_nodes(workdir):
    args = ["launch", "stages=[validation,training]", *TINY, "training.trainer.num_nodes=2", *QUICK]
    out = gptrain([*args, "training.run.name=gated"], workdir)
    assert out.returncode == 0, out.stderr
    run = workdir / "results/gated"
    jobs = submitted(run)
    wait_for(jobs["validation"], ("COMPLETED",), timeout=120)
    wait_for(jobs["training"], ("COMPLETED",), timeout=180)
    rows = json.loads((run / "validation/collectives.json").read_text())
    assert {(r["world_size"], r["nodes"], r["backend"]) for r in rows} == {(2, 2, "gloo")}
    pairs = json.loads((run / "validation/pairwise.json").read_text())
    assert [(p["a"], p["b"]) for p in pairs["node"]["pairs"]] == [("n1", "n2")]
    status = gptrain(["status", "gated"], workdir)
    assert "validation  job" in status.stdout and "training  job" in status.stdout


def test_failed_validation_holds_training_and_excludes_its_nodes_next_time(workdir):
    # node-pair bandwidth under an impossible threshold: both nodes of the only pair are blamed
    args = ["launch", "stages=[validation,training]", *TINY, "training.trainer.num_nodes=2", *QUICK]
    args += ["validation.checks=pairwise", "validation.min_busbw_GBps=1e6", "validation.exclude_failed=true"]
    out = gptrain([*args, "training.run.name=held"], workdir)
    assert out.returncode == 0, out.stderr
    jobs = submitted(workdir / "results/held")
    wait_for(jobs["validation"], ("FAILED",), timeout=120)
    wait_for(jobs["training"], ("PENDING",), timeout=30, reason="DependencyNeverSatisfied")
    log = next((workdir / "results/held").glob(f"log-*validation_{jobs['validation']}.out")).read_text()
    assert "--exclude='n[1-2]'" in log and "validation FAILED" in log
    assert (workdir / "results/exclude_nodes.txt").read_text() == "n[1-2]\n"
    again = gptrain(["launch", "--dry-run", *TINY, "training.run.name=next"], workdir)
    script = (workdir / "results/next/dry-run/t-next_submission.sh").read_text()
    assert "#SBATCH --exclude='n[1-2]'" in script, again.stderr
