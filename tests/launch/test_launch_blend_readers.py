"""A data preparation that rewrites a blend file a live training of another run reads (review L, finding 1)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from gptrain.cli import main
from gptrain.launch import launcher, slurm_queries
from gptrain.launch.executors import slurm
from gptrain.launch.records import append_record


def launch_data_preparation(monkeypatch, base, data_dir, squeue: str) -> tuple[int, list]:
    """`gptrain launch` of a data preparation into data_dir, runs under base, squeue saying `squeue`
    and nothing submitted for real: its exit status and the plans it would submit."""
    monkeypatch.setattr(slurm_queries, "run_command", lambda command, timeout=15.0: subprocess.CompletedProcess(
        command, 0, squeue if command[0] == "squeue" else "", ""))  # fmt: skip
    monkeypatch.setattr(launcher, "preflight", lambda plan, dry_run, training: [])
    submitted: list = []
    monkeypatch.setattr(slurm, "submit", lambda plan: submitted.append(plan))
    args = [
        "cluster_type=slurm",
        "stages=[data_preparation]",
        f"base_results_dir={base}",
        f"data_dir={data_dir}",
    ]
    return main(["launch", *args, "data_preparation.shards=[http://h/b.jsonl]"]), submitted


@pytest.mark.parametrize("started", [False, True])
def test_a_data_preparation_rewriting_a_live_trainings_blend_is_refused_or_noted(
    tmp_path, monkeypatch, capsys, started
):
    """runA's training read ${data_dir}/blend.yaml; preparing another dataset into the same data_dir was
    accepted without a word. A queued runA that has not started would train on the new data: refused.
    One that took its copy at its start keeps its data: a note says so, and the launch goes on."""
    monkeypatch.chdir(tmp_path)
    base, blend = tmp_path / "r", tmp_path / "d" / "blend.yaml"
    run_a = base / "runA"
    run_a.mkdir(parents=True)
    frozen = run_a / "runA_blend.yaml"
    append_record(run_a, "submitted", stage="training", executor="slurm", job_id="125", dependency=None,
                  log=str(run_a / "log-%j.out"), blend=str(blend), frozen_blend=str(frozen))  # fmt: skip
    # a copy of job 99's, a previous launch of runA, is no copy of job 125's
    copied_by = "125" if started else "99"
    frozen.write_text(yaml.safe_dump({"job": copied_by, "data_prefix": [1.0, "/d/a_text_document"]}))
    squeue = "125|RUNNING|None\n" if started else "125|PENDING|Resources\n"
    code, submitted = launch_data_preparation(monkeypatch, base, tmp_path / "d", squeue)
    err = capsys.readouterr().err
    if started:
        assert code == 0 and len(submitted) == 1
        assert (
            f"gptrain: note: training job 125 of {run_a} (RUNNING) reads {blend}, which this data preparation"
            f" rewrites: it keeps the copy it took at its start ({frozen}), and with it its data\n"
        ) in err
    else:
        assert code == 2 and submitted == []
        assert err == (
            f"gptrain: error: data_preparation.blend.file={blend}: training job 125 of {run_a} is PENDING"
            " (Resources) and reads this blend when it starts: rewritten now, that run would train on this"
            f" launch's data; wait until it has started, `gptrain cancel {run_a}`, or prepare into another"
            " data_dir (or data_preparation.blend.file)\n"
        )


def test_a_training_that_reads_a_blend_records_it_and_its_copy(tmp_path, monkeypatch):
    """What the check above finds a live training's blend by: its launcher.log record."""
    from gptrain.launch.compose import compose
    from gptrain.launch.records import read_records
    from gptrain.launch.stages import build_plan

    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "stages=[data_preparation,training]", f"data_dir={tmp_path}/d"]
    plan = build_plan(compose([*args, "data_preparation.shards=[http://h/a.jsonl]"]))
    job = plan.jobs[-1]
    job.run_dir.mkdir(parents=True)
    slurm.record_submission(job, "125", "124")
    [record] = read_records(job.run_dir)
    assert record["blend"] == f"{tmp_path}/d/blend.yaml"
    assert record["frozen_blend"] == str(job.run_dir / f"{job.run_name}_blend.yaml")
    assert f"--frozen {record['frozen_blend']}" in " ".join(job.setup[0])  # the copy its start takes


def test_a_live_training_launched_by_an_older_gptrain_is_a_reader_of_its_blend(tmp_path, monkeypatch, capsys):
    """A training submitted before the blend was frozen per run has no blend in its launcher.log record,
    and its script runs apply-blend without --frozen: it re-reads the live blend at each requeue. It
    was not seen as a reader, and a data preparation into the same data_dir switched it to new data."""
    monkeypatch.chdir(tmp_path)
    base, blend = tmp_path / "r", tmp_path / "d" / "blend.yaml"
    run_a, run_b = base / "runA", base / "runB"
    for run_dir, read in ((run_a, blend), (run_b, tmp_path / "other" / "blend.yaml")):
        run_dir.mkdir(parents=True)
        script = run_dir / "sbatch_training.sh"
        script.write_text(
            "#!/bin/bash\n#SBATCH --job-name=t\n"
            f"python -m gptrain.launch.download apply-blend --blend '{read}' --config {run_dir}/c.yaml || exit 1\n"
        )
        append_record(run_dir, "submitted", stage="training", executor="slurm", job_id="125" if run_dir == run_a
                      else "126", dependency=None, log=str(run_dir / "log-%j.out"), script=str(script))  # fmt: skip
    code, submitted = launch_data_preparation(
        monkeypatch, base, tmp_path / "d", "125|RUNNING|None\n126|RUNNING|None\n"
    )
    assert code == 2 and submitted == []  # runB reads another blend: it is not named
    assert capsys.readouterr().err == (
        f"gptrain: error: data_preparation.blend.file={blend}: training job 125 of {run_a} (RUNNING) re-reads"
        f" this blend at each start (its script {run_a}/sbatch_training.sh, from an older gptrain, runs"
        " apply-blend without --frozen): rewritten now, that run would train on this launch's data from its"
        f" next requeue; wait for it to end, `gptrain cancel {run_a}`, or prepare into another data_dir (or"
        " data_preparation.blend.file)\n"
    )
    from gptrain.launch.live_jobs import script_blend

    frozen = run_a / "sbatch_frozen.sh"  # a script that applies its copy on requeues is no such reader
    frozen.write_text(
        f"python -m gptrain.launch.download apply-blend --blend {blend} --frozen {run_a}/f.yaml\n"
    )
    assert script_blend({"script": str(frozen)}) is None
    assert script_blend({"script": str(run_a / "sbatch_training.sh")}) == str(blend)
    assert script_blend({"script": str(run_a / "sbatch_training.sh"), "executor": "local"}) is None  # once
