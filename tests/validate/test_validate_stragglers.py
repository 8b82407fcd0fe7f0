"""The straggler line of `gptrain status`: per-rank busy times against the median."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from validate_helpers import REPO

from gptrain.launch.stragglers import last_line, newest_lines, straggler_line


def line(rank, node, step_ms, wait_ms, step=40):
    return {"step": step, "rank": rank, "node": node, "step_ms": step_ms, "wait_ms": wait_ms}


def test_the_rank_the_others_wait_for_is_named_with_its_node():
    lines = [line(0, "n1", 500, 100), line(1, "n1", 500, 100), line(2, "n2", 500, 0), line(3, "n2", 500, 100)]
    assert straggler_line(lines) == "stragglers at step 40: rank 2 (n2) +25% busy vs the median 400 ms/step"


def test_even_ranks_give_a_none_line_and_one_rank_gives_no_line():
    lines = [line(r, "n1", 500, 10 + r) for r in range(4)]
    assert straggler_line(lines).startswith("stragglers at step 40: none (4 ranks within 10%")
    assert straggler_line(lines[:1]) is None


def write_rank_files(directory: Path, rows: list[tuple[dict, float]]) -> None:
    """One `rank-<r>.jsonl` per row, the row's line last, modified at the row's time."""
    directory.mkdir(parents=True, exist_ok=True)
    for row, mtime in rows:
        path = directory / f"rank-{row['rank']}.jsonl"
        earlier = dict(row, step=row["step"] - 2, step_ms=1.0)
        path.write_text(json.dumps(earlier) + "\n" + json.dumps(row) + "\n")
        os.utime(path, (mtime, mtime))


def test_only_the_end_of_a_rank_file_is_read(tmp_path: Path) -> None:
    """A file that grew for weeks is read from its end: bytes before the last lines (here not even
    UTF-8, so reading the whole file fails) are never read; a last line longer than the block read
    first, a file of one line and a file cut mid-line give what they hold."""
    path = tmp_path / "rank-0.jsonl"
    path.write_bytes(b"\xff" * 1_000_000 + b"\n" + b'{"step": 1}\n{"step": 2}\n')
    assert last_line(path) == '{"step": 2}'
    long = json.dumps({"step": 3, "node": "n" * 10_000})
    path.write_text('{"step": 1}\n' + long + "\n")
    assert last_line(path, block=64) == long
    path.write_text('{"step": 1}')
    assert last_line(path) == '{"step": 1}'
    path.write_text('{"step": 1}\n{"step": 2, "ra')
    assert newest_lines(tmp_path) == []  # a line being written: that rank is skipped this time


def test_ranks_of_an_earlier_larger_job_are_not_compared(tmp_path: Path) -> None:
    """4 ranks to step 4, resumed on 2 ranks to step 8: ranks 2 and 3 (slow at step 4) are not
    in the step-8 job and are neither named nor counted."""
    old = [(dict(line(r, "n1", 900, 0, step=4), world=4), 1000.0) for r in (2, 3)]
    new = [(dict(line(r, "n1", 500, 10, step=8), world=2), 2000.0) for r in (0, 1)]
    write_rank_files(tmp_path, old + new)
    got = straggler_line(newest_lines(tmp_path))
    assert got.startswith("stragglers at step 8: none (2 ranks within 10%"), got


def test_a_job_resumed_from_an_earlier_checkpoint_is_compared_at_its_own_step(tmp_path: Path) -> None:
    """The old 4-rank job reached step 10; the 2-rank job resumed at 4 and is at 6 now: the files
    written last decide, and lines of another world size at the same step are left out too."""
    rows = [(dict(line(r, "n1", 900, 0, step=10), world=4), 1000.0) for r in (2, 3)]
    rows += [(dict(line(0, "n1", 500, 100, step=6), world=2), 2001.0)]
    rows += [(dict(line(1, "n2", 500, 0, step=6), world=2), 2000.0)]
    rows += [(dict(line(5, "n3", 5000, 0, step=6), world=8), 500.0)]
    write_rank_files(tmp_path, rows)
    got = straggler_line(newest_lines(tmp_path))
    assert got == "stragglers at step 6: rank 1 (n2) +11% busy vs the median 450 ms/step", got


def test_the_reviewers_resume_from_four_to_two_ranks(tmp_path: Path) -> None:
    """Files as a 4-rank run to step 4 then a 2-rank resume to step 8 left them (no `world`)."""
    rows = [(line(r, "vm", 107 + r, 11 + r, step=4), 1000.0) for r in (2, 3)]
    rows += [(line(r, "vm", 76, 2 + r, step=8), 2000.0) for r in (0, 1)]
    write_rank_files(tmp_path, rows)
    got = straggler_line(newest_lines(tmp_path))
    assert got.startswith("stragglers at step 8: none (2 ranks"), got


TINY = [
    "training.trainer.accelerator=cpu",
    "training.trainer.devices=2",
    "training.trainer.num_nodes=1",
    "training.trainer.precision=32",
    "training.trainer.max_steps=4",
    "training.trainer.log_every_n_steps=1",
    "training.trainer.val_check_interval=1000",
    "training.trainer.limit_val_batches=0",
    "training.trainer.limit_test_batches=0",
    "training.model.data.data_impl=mock",
    "training.model.data.mock_vocab_size=512",
    "training.model.data.num_workers=0",
    "training.model.num_layers=1",
    "training.model.hidden_size=32",
    "training.model.num_attention_heads=2",
    "training.model.encoder_seq_length=16",
    "training.model.micro_batch_size=1",
    "training.model.global_batch_size=2",
    "training.model.optim.sched.warmup_steps=1",
    "training.model.optim.sched.constant_steps=0",
    "cluster.gpus_per_node=null",
    "cluster.gres=null",
]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_rank_training_writes_step_times_and_status_prints_the_line(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "gptrain", *a],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    out = run("launch", "--quiet", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    times = tmp_path / "results/gpt3_126m/results/step_times"
    rows = [json.loads(x) for x in (times / "rank-1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 3, 4] and all(  # 1: the process's first, its start-up
        r["rank"] == 1 and r["world"] == 2 and r["step_ms"] > 0 for r in rows
    )
    assert sorted(p.name for p in times.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    status = run("status", "gpt3_126m").stdout
    assert "  stragglers at step 4: " in status, status


def test_the_log_dir_comes_from_the_config_the_record_names(tmp_path: Path) -> None:
    """Records name the job's config (`<name>_hydra.yaml`, no job-name prefix); a record written
    before they did is read as then: the config next to the script, named like it."""
    from gptrain.launch.stragglers import log_dir_of

    (tmp_path / "run_hydra.yaml").write_text("exp_manager: {explicit_log_dir: /new}\n")
    (tmp_path / "p-run_hydra.yaml").write_text("exp_manager: {explicit_log_dir: /old}\n")
    script = str(tmp_path / "p-run_submission.sh")
    assert log_dir_of({"script": script, "config": str(tmp_path / "run_hydra.yaml")}) == Path("/new")
    assert log_dir_of({"script": script}) == Path("/old")
    assert log_dir_of({"script": "elsewhere.sh"}) is None


def test_a_rank_file_is_bounded_and_its_newest_line_stays_readable(tmp_path: Path) -> None:
    """A line per logged step for weeks used to grow every rank's file without bound (MBs per rank,
    GBs across a thousand ranks); past rotate_bytes it is moved aside just before the next line."""
    from gptrain.train.step_times import StepTimes

    times = StepTimes.open(tmp_path, rank=3, world_size=2)
    times.rotate_bytes = 1000
    times.timed_sync(0, True, lambda: None)  # the process's first logged step: no line
    for step in range(1, 101):
        times.timed_sync(step, True, lambda: None)
        current, previous = times.path, times.path.with_name("rank-3.jsonl.1")
        assert current.stat().st_size < 1000 + 200
        assert json.loads(last_line(current))["step"] == step
    assert previous.stat().st_size >= 1000
    steps = [
        json.loads(text)["step"] for path in (previous, current) for text in path.read_text().splitlines()
    ]
    assert steps == list(range(steps[0], 101)) and steps[0] > 1  # the newest, in order, none lost between
    assert [row["step"] for row in newest_lines(tmp_path / "step_times")] == [100]


class SteppedClock:
    """time as StepTimes reads it, moved on by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def waiting(self, seconds: float):
        def sync() -> None:
            self.now += seconds

        return sync


def test_a_processs_first_logged_step_is_no_step_times_line(tmp_path: Path, monkeypatch) -> None:
    """A process's first logged step holds its start-up: its file opens before the start-up agreement
    (where ranks that finished start-up early wait for the last), and its first step compiles. Its
    line charged that wait as busy time to the rank that waited, and a resumed run's first straggler
    line named that rank, against a median of the warm-up; the next logged step's line is the first."""
    from gptrain.train import step_times

    clock = SteppedClock()
    monkeypatch.setattr(step_times, "time", clock)
    times = step_times.StepTimes.open(tmp_path, rank=0, world_size=2)
    clock.now += 4.0  # waiting for rank 1 at the start-up agreement
    clock.now += 10.0  # the first step's compilation
    times.timed_sync(1001, True, clock.waiting(0.5))
    assert not (tmp_path / "step_times").exists()
    for step in range(1002, 1011):
        clock.now += 0.75  # busy
        times.timed_sync(step, step == 1010, clock.waiting(0.25))
    rows = [json.loads(text) for text in (tmp_path / "step_times" / "rank-0.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 1010, "rank": 0, "world": 2, "node": times.node, "step_ms": 1000.0, "wait_ms": 250.0}
    ]
