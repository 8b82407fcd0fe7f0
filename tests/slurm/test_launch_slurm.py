"""`gptrain launch` against a real Slurm: layout, quoting, two nodes, requeue, dependencies."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import yaml
from slurm_helpers import gptrain, job_fields, job_ids, wait_for

NASTY = "a b;touch x"
LAST = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?lm loss: ([\d.E+-]+) \|")


def launch(args: list[str], cwd: Path) -> str:
    out = gptrain(["launch", *args], cwd)
    assert out.returncode == 0, out.stderr
    [job_id] = job_ids(cwd / "results" / run_name(args))
    return job_id


def run_name(args: list[str]) -> str:
    names = [a.split("=", 1)[1] for a in args if a.startswith("training.run.name=")]
    return names[-1] if names else "gpt3_126m"


def iterations(log: Path) -> list[tuple[int, int, str]]:
    return [(int(m[1]), int(m[2]), m[3]) for m in LAST.finditer(log.read_text())]


def test_two_task_job_layout_and_quoting(workdir, tiny):
    args = [*tiny, "training.trainer.devices=2", f"training.run.name={NASTY}", "cluster.job_name_prefix="]
    job_id = launch(args, workdir)
    assert job_fields(job_id)["JobName"] == NASTY  # exactly the name, nothing run from it
    wait_for(job_id, ("COMPLETED",), timeout=120)
    run = workdir / "results" / NASTY
    expected = {f"{NASTY}_hydra.yaml", "launcher_cmd.log", "launcher.log", f"{NASTY}_submission.sh"}
    assert expected | {f"log-{NASTY}_{job_id}.out", "results"} <= {p.name for p in run.iterdir()}
    assert not (workdir / "x").exists() and not (run / "x").exists() and not Path("x").exists()
    lines = iterations(run / f"log-{NASTY}_{job_id}.out")
    assert [step for step, _, _ in lines] == list(range(1, 7)) and lines[-1][1] == 6
    status = gptrain(["status", NASTY], workdir)
    assert "COMPLETED" in status.stdout and "step 6/6" in status.stdout, status.stdout + status.stderr
    logs = gptrain(["logs", NASTY, "-f"], workdir)  # a finished job: prints everything and returns
    assert logs.returncode == 0 and logs.stdout == (run / f"log-{NASTY}_{job_id}.out").read_text()


def test_two_emulated_nodes(workdir, tiny):
    job_id = launch([*tiny, "training.trainer.num_nodes=2", "training.run.name=two_nodes"], workdir)
    wait_for(job_id, ("COMPLETED",), timeout=120)
    fields = job_fields(job_id)
    assert fields["NumNodes"] == "2" and fields["NodeList"] == "n[1-2]"
    log = workdir / f"results/two_nodes/log-t-two_nodes_{job_id}.out"
    assert iterations(log)[-1][:2] == (6, 6)


def test_signal_checkpoints_requeues_and_resumes_to_the_same_loss(workdir, tiny):
    steps = [
        "training.trainer.max_steps=300",
        "training.exp_manager.checkpoint_callback_params.every_n_train_steps=1000",
    ]
    baseline = launch([*tiny, *steps, "training.run.name=baseline"], workdir)
    job_id = launch([*tiny, *steps, "training.run.name=preempted"], workdir)
    log = workdir / f"results/preempted/log-t-preempted_{job_id}.out"
    wait_for(job_id, ("RUNNING",), timeout=60)
    deadline = time.monotonic() + 90
    while not (log.exists() and iterations(log)):
        assert time.monotonic() < deadline, "training never logged an iteration"
        time.sleep(0.1)
    # What Slurm does at --signal=B:USR1@N before the time limit, without waiting for it.
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    fields = wait_for(job_id, ("COMPLETED",), timeout=150)
    assert fields["Restarts"] == "1"
    text = log.read_text()
    assert "requeueing (restart 1 of 5)" in text and "step finished with exit code 0" in text
    resumed = iterations(log)
    # one log (open-mode append): steps 1..k before the signal, k+1..300 after the resume, none twice
    assert [step for step, _, _ in resumed] == list(range(1, 301)) and resumed[-1][1] == 300
    wait_for(baseline, ("COMPLETED",), timeout=150)
    reference = iterations(workdir / f"results/baseline/log-t-baseline_{baseline}.out")
    assert reference[-1] == resumed[-1]


def failing_preparation(workdir: Path, tiny: list[str]) -> list[str]:
    """A launch of a data preparation that fails (its shard does not exist), then training."""
    vocab, merges = workdir / "vocab.json", workdir / "merges.txt"
    vocab.write_text("{}")
    merges.write_text("")
    args = [*tiny, "stages=[data_preparation,training]", "training.run.name=blocked"]
    args += [f"data_preparation.shards=[file://{workdir}/missing.jsonl]", "data_preparation.workers=1"]
    return args + [
        f"data_preparation.tokenizer.vocab_file={vocab}",
        f"data_preparation.tokenizer.merge_file={merges}",
    ]


def test_failed_stage_blocks_the_next(workdir, tiny):
    args = failing_preparation(workdir, tiny)
    out = gptrain(["launch", *args], workdir)
    assert out.returncode == 0, out.stderr
    [prep] = job_ids(workdir / "results/download_shards")
    [train] = job_ids(workdir / "results/blocked")
    assert job_fields(train)["Dependency"].startswith(f"afterok:{prep}")
    wait_for(train, ("PENDING",), timeout=60, reason="DependencyNeverSatisfied")
    assert job_fields(prep)["JobState"] == "FAILED"
    status = gptrain(["status", "blocked"], workdir).stdout
    assert "PENDING (DependencyNeverSatisfied)" in status and f"(job {prep}) failed" in status
    follow = gptrain(["logs", "blocked", "-f"], workdir, timeout=30)  # waited for ever: it never starts
    assert follow.returncode == 0 and f"waits on job {prep}, which failed" in follow.stderr
    prep_log = next(
        (workdir / "results/download_shards").glob(f"log-t-download_shards_{prep}_0.out")
    ).read_text()
    assert "missing.jsonl: cannot copy" in prep_log
    assert gptrain(["cancel", "blocked"], workdir).stdout.strip() == f"cancelled training job {train}"
    wait_for(train, ("CANCELLED",), timeout=30)


def test_no_training_is_left_pending_for_ever_by_a_relaunch_or_a_cancel(workdir, tiny):
    """A training waiting on a failed data preparation never starts. A relaunch left it queued,
    out of sight of `gptrain status/cancel` (they follow the new launch), and `gptrain cancel` of
    the data preparation's run left its training queued."""
    args = failing_preparation(workdir, tiny)
    assert gptrain(["launch", *args], workdir).returncode == 0
    [old] = job_ids(workdir / "results/blocked")
    wait_for(old, ("PENDING",), timeout=60, reason="DependencyNeverSatisfied")
    out = gptrain(["launch", *args], workdir)
    assert out.returncode == 0 and f"cancelled training job {old} of the previous launch" in out.stderr
    wait_for(old, ("CANCELLED",), timeout=30)
    _, new = job_ids(workdir / "results/blocked")
    wait_for(new, ("PENDING",), timeout=60, reason="DependencyNeverSatisfied")
    out = gptrain(["cancel", "download_shards"], workdir)
    assert f"cancelled training job {new} of {workdir / 'results/blocked'}, which waited on it" in out.stdout
    wait_for(new, ("CANCELLED",), timeout=30)


def test_data_preparation_array_then_training_on_the_blend(workdir, tiny):
    import gzip
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))  # share the HTTP server of the unit tests
    from test_launch_download import Server
    from test_launch_local import GPT2_DATA, jsonl

    texts = [
        [f"Document {d} of shard {i} talks about queues and nodes." for d in range(30)] for i in range(2)
    ]
    files = {f"/s{i}.jsonl.gz": gzip.compress(jsonl(texts[i])) for i in range(2)}
    vocab = [f"vocab_file={GPT2_DATA / 'encoder.json'}", f"merge_file={GPT2_DATA / 'vocab.bpe'}"]
    with Server(files) as server:
        args = [
            *tiny,
            "stages=[data_preparation,training]",
            f"data_dir={workdir}/data",
            "training.run.name=on_blend",
        ]
        args += [f"data_preparation.shards=[{server.url}/s0.jsonl.gz,{server.url}/s1.jsonl.gz]"]
        args += ["data_preparation.workers=1", *[f"data_preparation.tokenizer.{v}" for v in vocab]]
        args += ["training.model.data.data_impl=mmap", "training.model.data.splits_string=100,0,0"]
        args += [f"training.model.tokenizer.{v}" for v in vocab]
        out = gptrain(["launch", *args], workdir)
        assert out.returncode == 0, out.stderr
        [prep] = job_ids(workdir / "results/download_shards")
        [train] = job_ids(workdir / "results/on_blend")
        for task in range(2):
            wait_for(f"{prep}_{task}", ("COMPLETED",), timeout=90)
    wait_for(train, ("COMPLETED",), timeout=120)
    prefixes = [str(workdir / f"data/tokenized/s{i}_text_document") for i in range(2)]
    blend = yaml.safe_load((workdir / "data/blend.yaml").read_text())["data_prefix"]
    assert blend[1::2] == prefixes and blend[0] == blend[2] > 30 * 10  # same text lengths: same token counts
    config = yaml.safe_load((workdir / "results/on_blend/on_blend_hydra.yaml").read_text())
    assert config["model"]["data"]["data_prefix"] == blend  # the training job read the blend
    assert iterations(workdir / f"results/on_blend/log-t-on_blend_{train}.out")[-1][:2] == (6, 6)
    logs = gptrain(["logs", "download_shards", "-f"], workdir).stdout  # all array tasks ended: returns
    assert logs.count("-m gptrain data prepare --input") == 2, logs  # one tokenizer run per array task


def test_a_stop_past_max_requeues_tells_status_how_to_resume(workdir, tiny):
    """The signal checkpoints and stops the run; with max_requeues 0 it ends FAILED with exit 75,
    which `gptrain status` showed as a plain failure."""
    args = [*tiny, "training.trainer.max_steps=300", "cluster.max_requeues=0", "training.run.name=stopped"]
    job_id = launch(args, workdir)
    log = workdir / f"results/stopped/log-t-stopped_{job_id}.out"
    deadline = time.monotonic() + 90
    while not (log.exists() and iterations(log)):
        assert time.monotonic() < deadline, "training never logged an iteration"
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    wait_for(job_id, ("FAILED",), timeout=90)
    status = gptrain(["status", "stopped"], workdir).stdout
    assert "FAILED (checkpoint saved but not requeued" in status and "launch again to resume" in status


def test_more_shards_than_max_array_size_make_an_array_slurm_accepts(workdir, tiny):
    """Slurm's default MaxArraySize (1001) refused the `--array=0-1001` of 1002 shards at submission;
    the launch reads it from `scontrol show config` and the controller accepts the script."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    limit = int(re.search(r"^MaxArraySize\s*=\s*(\d+)", config.stdout, re.MULTILINE)[1])
    shards = ",".join(f"file://{workdir}/s{n}.jsonl" for n in range(limit + 1))
    args = [*tiny, "stages=[data_preparation]", f"data_preparation.shards=[{shards}]"]
    args += ["data_preparation.workers=1", "data_preparation.run.node_array_size=2"]
    out = gptrain(["launch", "--dry-run", *args], workdir)
    assert out.returncode == 0, out.stderr
    [script] = (workdir / "results/download_shards/dry-run").glob("*_submission.sh")
    assert f"#SBATCH --array=0-{limit - 1}%2\n" in script.read_text()
    test = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "to start at" in test.stderr, test.stderr


def test_status_of_an_array_shows_a_failed_task_while_another_runs(workdir):
    """squeue lists an array's live tasks only: a data preparation whose task 0 had failed showed
    RUNNING while task 1 ran, though the training waiting on it could never start."""
    from gptrain.launch.records import append_record

    script = workdir / "array.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --array=0-1\n#SBATCH --output={workdir}/log-a_%A_%a.out\n"
        '[ "$SLURM_ARRAY_TASK_ID" = 0 ] && exit 3\n'
        f"while [ ! -e {workdir}/done ]; do sleep 0.2; done\n"
    )
    run = workdir / "results" / "prep"
    run.mkdir(parents=True)
    job_id = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    append_record(run, "submitted", stage="data_preparation", executor="slurm", job_id=job_id, job_name="a")
    try:
        wait_for(f"{job_id}_0", ("FAILED",), timeout=60)
        wait_for(f"{job_id}_1", ("RUNNING",), timeout=60)
        status = gptrain(["status", str(run)], workdir).stdout
        assert "ARRAY[1 RUNNING, 1 FAILED] (NonZeroExitCode) exit 3:0" in status, status
    finally:
        (workdir / "done").touch()
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def test_a_cancelled_training_is_not_requeued(workdir, tiny):
    """`gptrain cancel` (scancel) SIGTERMs the job; its run checkpoints and exits 75, and the batch
    script requeued it: Slurm took the requeue of the CANCELLED job, so the training went on."""
    steps = ["training.trainer.max_steps=100000", "training.run.name=cancelled"]
    job_id = launch([*tiny, *steps], workdir)
    log = workdir / f"results/cancelled/log-t-cancelled_{job_id}.out"
    deadline = time.monotonic() + 90
    while not (log.exists() and iterations(log)):
        assert time.monotonic() < deadline, "training never logged an iteration"
        time.sleep(0.1)
    assert gptrain(["cancel", "cancelled"], workdir).stdout.strip() == f"cancelled training job {job_id}"
    while "step finished with exit code" not in log.read_text():  # the batch script has decided
        assert time.monotonic() < deadline + 60, log.read_text()[-2000:]
        time.sleep(0.1)
    assert "the job was cancelled (scancel): not requeueing" in log.read_text()
    fields = wait_for(job_id, ("CANCELLED",), timeout=60)
    assert fields["Restarts"] == "0"


def test_additional_parameters_reach_sbatch_as_written(workdir, tiny):
    """cluster.additional_parameters: Slurm reads each quoted #SBATCH line back as the value given
    (spaces, quotes, `;`, `$()` included); `hold: true` is a bare flag, so the job waits (cancelled
    at teardown) and nothing of the comment runs."""
    comment = """ablation 3; $(touch x) "q" 'it's'"""
    args = [*tiny, "training.run.name=extras", f"cluster.additional_parameters.comment={comment}"]
    job_id = launch([*args, "cluster.additional_parameters.hold=true"], workdir)
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%k|%r"], capture_output=True, text=True, timeout=30
    )
    assert out.stdout.strip() == f"{comment}|JobHeldUser", out.stdout + out.stderr
    assert not (workdir / "x").exists()


def test_a_cluster_files_per_gpu_options_and_time_min_reach_sbatch_as_it_accepts(workdir, tiny):
    """NeMo's cluster keys cpus_per_gpu and mem_per_gpu on stages that ask for no GPU (the data
    preparation, a CPU training) were refused by sbatch ('Invalid generic resource'); a --time-min
    within every stage's time limit, in D-HH:MM:SS form, is accepted by the controller as rendered."""
    shards = f"file://{workdir}/a.jsonl"
    args = [*tiny, "stages=[data_preparation,training]", f"data_preparation.shards=[{shards}]"]
    args += ["+cluster.cpus_per_gpu=1", "+cluster.mem_per_gpu=1G"]
    args += ["+cluster.additional_parameters.time_min=0-00:09:00"]
    out = gptrain(["launch", "--dry-run", *args], workdir)
    assert out.returncode == 0, out.stderr
    scripts = sorted(workdir.glob("results/*/dry-run/*_submission.sh"))
    assert len(scripts) == 2
    for script in scripts:
        assert "#SBATCH --time-min=0-00:09:00\n" in script.read_text()
        test = subprocess.run(
            ["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60
        )
        assert test.returncode == 0 and "to start at" in test.stderr, (script, test.stderr)
