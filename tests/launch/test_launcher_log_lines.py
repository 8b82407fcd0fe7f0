"""launcher.log keeps one record per line though a line was cut (a full disk mid-write, the launcher
killed, a node lost): the next record starts on its own line, and readers take every whole one."""

from __future__ import annotations

import json

from gptrain.launch.records import LAUNCHER_LOG, append_record, read_records

SLURM = {"stage": "training", "executor": "slurm", "job_name": "j"}
CUT = '{"time": "2026-11-30T10:00:00", "event": "submi'


def test_a_record_after_a_cut_line_starts_its_own_line(tmp_path):
    """The next append was glued onto the cut line, and that line was skipped whole: job 202, live,
    was unseen by `gptrain status` and left running by `gptrain cancel`."""
    append_record(tmp_path, "submitted", job_id="101", **SLURM)
    with open(tmp_path / LAUNCHER_LOG, "a") as handle:
        handle.write(CUT)
    append_record(tmp_path, "submitted", job_id="202", **SLURM)
    append_record(tmp_path, "submitted", job_id="303", **SLURM)
    assert [record["job_id"] for record in read_records(tmp_path)] == ["101", "202", "303"]
    lines = (tmp_path / LAUNCHER_LOG).read_text().splitlines()
    assert lines[1] == CUT and [json.loads(line)["job_id"] for line in lines[2:]] == ["202", "303"]


def test_a_record_glued_onto_a_cut_line_by_an_earlier_launch_is_read(tmp_path):
    """A log an earlier gptrain wrote already holds the glued line: its record is read from where it
    starts; the cut part and a cut line alone are still skipped."""
    glued = json.dumps({"time": "2026-11-30T10:00:01", "event": "submitted", "job_id": "202", **SLURM})
    (tmp_path / LAUNCHER_LOG).write_text(f"{CUT}{glued}\n{CUT}\n")
    assert [record["job_id"] for record in read_records(tmp_path)] == ["202"]


def test_the_first_record_of_a_new_log_is_its_first_line(tmp_path):
    append_record(tmp_path, "submitted", job_id="101", **SLURM)
    text = (tmp_path / LAUNCHER_LOG).read_text()
    assert text.startswith("{") and text.count("\n") == 1 and text.endswith("\n")
