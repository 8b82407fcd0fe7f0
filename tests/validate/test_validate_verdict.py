"""validation.json while a run is under way and after it stopped (no processes: a stubbed group)."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest


@pytest.fixture
def one_rank(monkeypatch):
    """validate() on rank 0 of 2 with the process group stubbed; returns the stubbed CHECKS."""
    import torch.distributed as dist

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    ctx = SimpleNamespace(rank=0, size=2, node="n1", nodes=["n1", "n2"], is_gpu=False)
    monkeypatch.setattr(runtime, "start", lambda timeout_s: ctx)
    monkeypatch.setattr(runtime, "finish", lambda wait_for_peers=True: None)
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: None)
    monkeypatch.delenv("GPTRAIN_DEBUG", raising=False)
    checks = {}
    monkeypatch.setattr(validate_main, "CHECKS", checks)
    return validate_main, checks


def args_for(directory, check="gpus"):
    return argparse.Namespace(
        profile=None,
        min_busbw_GBps=None,
        check=check,
        output_dir=str(directory),
        exclude_file=None,
        timeout=3.0,
    )


def test_a_run_that_stops_leaves_no_passing_verdict_of_the_run_before(one_rank, tmp_path, capsys):
    """A run that stopped (a lost GPU, a hang) left the previous run's validation.json, "passed":
    true, in place: a reader of the verdict read a pass. It is now marked running at the start and
    stopped, with the error line, when rank 0 stops; the old reports are kept under previous/."""
    validate_main, checks = one_rank
    old = {"passed": True, "failures": [], "world_size": 1}
    (tmp_path / "validation.json").write_text(json.dumps(old))
    (tmp_path / "gpus.json").write_text('{"gpus": ["old"]}')
    seen = []

    def lost_gpu(ctx, args, limits, out):
        seen.append(json.loads((tmp_path / "validation.json").read_text()))
        seen.append((tmp_path / "gpus.json").exists())
        raise RuntimeError("CUDA error: unspecified launch failure")

    checks["gpus"] = lost_gpu
    assert validate_main.validate(args_for(tmp_path)) == 1
    during, old_gpus_there = seen
    assert during["passed"] is False and during["state"] == "running" and during["check"] == "gpus"
    assert not old_gpus_there
    after = json.loads((tmp_path / "validation.json").read_text())
    assert after["passed"] is False and after["state"] == "stopped"
    assert "unspecified launch failure" in after["error"] and after["error"] in capsys.readouterr().err
    assert json.loads((tmp_path / "previous" / "validation.json").read_text()) == old
    assert (tmp_path / "previous" / "gpus.json").read_text() == '{"gpus": ["old"]}'


def test_one_check_at_a_time_into_one_directory_keeps_the_other_checks_reports(one_rank, tmp_path):
    """`validate collectives`, then `validate gpus` into one --output-dir: the collectives sweep (the
    costly one) was moved to previous/ and then deleted by the next run; only the verdict and the
    report the check rewrites are moved aside."""
    validate_main, checks = one_rank
    (tmp_path / "validation.json").write_text('{"passed": true, "check": "collectives"}')
    (tmp_path / "collectives.json").write_text("[1]")
    (tmp_path / "collectives.png").write_bytes(b"png")
    (tmp_path / "gpus.json").write_text('{"gpus": ["old"]}')
    checks["gpus"] = lambda ctx, args, limits, out: None
    assert validate_main.validate(args_for(tmp_path)) == 0  # --check gpus
    assert (tmp_path / "collectives.json").read_text() == "[1]"
    assert (tmp_path / "collectives.png").read_bytes() == b"png"
    assert (tmp_path / "previous" / "gpus.json").read_text() == '{"gpus": ["old"]}'
    assert json.loads((tmp_path / "previous" / "validation.json").read_text())["check"] == "collectives"
    assert validate_main.validate(args_for(tmp_path)) == 0  # again: nothing else moves or goes
    assert (tmp_path / "collectives.json").read_text() == "[1]"


def test_a_run_that_finishes_replaces_the_running_mark_with_its_verdict(one_rank, tmp_path):
    validate_main, checks = one_rank
    checks["gpus"] = lambda ctx, args, limits, out: None
    assert validate_main.validate(args_for(tmp_path)) == 0
    summary = json.loads((tmp_path / "validation.json").read_text())
    assert summary["passed"] is True and summary["state"] == "done" and summary["nodes"] == ["n1", "n2"]
    assert not (tmp_path / "previous").exists()  # nothing from before to keep


def test_a_check_that_refuses_marks_the_verdict_stopped(one_rank, tmp_path):
    """A ConfigError inside a check (sizes no GPU memory holds) is raised for the CLI's one line;
    validation.json said "running" for ever after it."""
    from gptrain.errors import ConfigError

    validate_main, checks = one_rank

    def refuses(ctx, args, limits, out):
        raise ConfigError("--max-bytes 1T: no size fits in memory\nsecond line")

    checks["gpus"] = refuses
    with pytest.raises(ConfigError):
        validate_main.validate(args_for(tmp_path))
    summary = json.loads((tmp_path / "validation.json").read_text())
    assert summary["state"] == "stopped" and summary["error"] == "--max-bytes 1T: no size fits in memory"


def test_a_group_that_never_forms_leaves_no_passing_verdict_of_the_run_before(monkeypatch, tmp_path):
    """Review V's run: a passing world of 1, then rank 0 of 2 whose rank 1 never started: the
    process group did not form, and validation.json still said "passed": true. Rank 0 (RANK=0)
    marks it before the group forms, and stopped with its line; rank 1 leaves it alone."""
    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    def no_group(timeout_s):
        raise RuntimeError("Timed out after 6 seconds waiting for clients. 1/2 clients joined.")

    monkeypatch.setattr(runtime, "start", no_group)
    monkeypatch.delenv("GPTRAIN_DEBUG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "validation.json").write_text('{"passed": true, "world_size": 1}')
    monkeypatch.setenv("RANK", "1")
    assert validate_main.validate(args_for(tmp_path)) == 1
    assert json.loads((tmp_path / "validation.json").read_text())["passed"] is True  # rank 0's to say
    monkeypatch.setenv("RANK", "0")
    assert validate_main.validate(args_for(tmp_path)) == 1
    summary = json.loads((tmp_path / "validation.json").read_text())
    assert summary["passed"] is False and summary["state"] == "stopped"
    assert "could not start the process group of 2 ranks" in summary["error"]
