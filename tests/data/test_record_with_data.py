"""A dataset's tokenizer record (gptrain.data.tokenizer_record) finished with its .bin/.idx: a failure or a
kill anywhere in the write leaves the old data with its old record, or the new with the new one (or
none), never new tokens beside the record of the data they replaced (training trusts the record)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from gptrain.cli import main
from gptrain.data import finalize
from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter

NULL = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--workers", "1"]


def prepare(tmp_path: Path, *flags: str, keys: tuple[str, ...] = ("text",)) -> int:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(dict.fromkeys(keys, ids)) + "\n" for ids in ("1 2 3", "4 5")))
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out"), *NULL]
    return main([*argv, "--json-keys", *keys, *flags])


def state(prefix: str) -> tuple[list[list[int]], bool | None]:
    """The dataset's documents and its record's append_eod (None: no record)."""
    record = Path(prefix + ".tokenizer")
    recorded = json.loads(record.read_text())["append_eod"] if record.exists() else None
    return [s.tolist() for s in IndexedDataset(prefix)[:]], recorded


def killed_after_the_renames(monkeypatch) -> None:
    """The process ends (SIGKILL, a second Ctrl-C) the moment the new .bin/.idx are in place."""
    move_all = finalize._move_all_into_place

    def then_killed(*args, **kwargs):
        move_all(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(finalize, "_move_all_into_place", then_killed)


def test_a_kill_once_the_new_data_is_in_place_leaves_its_own_record_beside_it(tmp_path, monkeypatch):
    """The record was written after finalize_together's renames: killed between them, a re-prepare
    with --append-eod left the new tokens (ending in the EOD) beside a record saying no EOD, for
    every json key."""
    keys = ("text", "title")
    assert prepare(tmp_path, keys=keys) == 0
    prefixes = [str(tmp_path / f"out_{key}_document") for key in keys]
    assert [state(prefix) for prefix in prefixes] == [([[1, 2, 3], [4, 5]], False)] * 2
    killed_after_the_renames(monkeypatch)
    with contextlib.suppress(KeyboardInterrupt):
        prepare(tmp_path, "--append-eod", keys=keys)
    assert [state(prefix) for prefix in prefixes] == [([[1, 2, 3, 99], [4, 5, 99]], True)] * 2


def test_a_record_that_cannot_be_written_leaves_the_old_data_and_record(tmp_path, monkeypatch, capsys):
    """ENOSPC on the record's write came after the new data was in place: the error said 'cannot
    write', the data was the new one and its record the old one. The record is written before any
    rename now: the old dataset stays whole, with its record, and no temporary is left."""
    assert prepare(tmp_path) == 0
    prefix = str(tmp_path / "out_text_document")
    fsync = os.fsync

    def full_for_the_record(fd: int) -> None:
        if ".tokenizer." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_the_record)
    assert prepare(tmp_path, "--append-eod") == 2
    assert "--output-prefix " + str(tmp_path / "out") + ": cannot write" in capsys.readouterr().err
    assert state(prefix) == ([[1, 2, 3], [4, 5]], False)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["in.jsonl"] + [f"out_text_document.{s}" for s in ("bin", "idx", "tokenizer")]


def test_a_merge_of_unrecorded_inputs_killed_after_its_renames_leaves_no_old_record(tmp_path, monkeypatch):
    """A merge whose inputs share no record removes the output's old one, after the renames: killed
    between, the new merged tokens kept the record of the data they replaced."""
    assert prepare(tmp_path) == 0
    merged = str(tmp_path / "merged")
    assert (
        main(["data", "merge", "--input", str(tmp_path / "out_text_document"), "--output-prefix", merged])
        == 0
    )
    assert state(merged) == ([[1, 2, 3], [4, 5]], False)
    with IndexedDatasetWriter(str(tmp_path / "bare"), np.uint8) as writer:  # Megatron's: no record
        writer.add_document(np.array([7, 8]))
    killed_after_the_renames(monkeypatch)
    with contextlib.suppress(KeyboardInterrupt):
        main(["data", "merge", "--input", str(tmp_path / "bare"), "--output-prefix", merged])
    assert state(merged) == ([[7, 8]], None)


def refuse_steps(monkeypatch, fails):
    """finalize's steps named in `fails` refused with EACCES; the others taken as usual."""
    take_step = finalize._take_step

    def refused(output, step):
        if step in fails:
            raise PermissionError(errno.EACCES, "Permission denied")
        take_step(output, step)

    monkeypatch.setattr(finalize, "_take_step", refused)


@pytest.mark.parametrize(
    ("fails", "left"),
    [
        ({"stale"}, ([[1, 2, 3, 99], [4, 5, 99]], True)),  # the new record replaced the old one
        ({"companion"}, ([[1, 2, 3, 99], [4, 5, 99]], None)),  # the old one went, the new did not come
        ({"stale", "companion"}, None),  # the old one stays: the new .idx is kept out
    ],
)
def test_past_the_first_step_the_new_index_goes_in_only_where_the_old_record_is_gone(
    tmp_path, monkeypatch, fails, left
):
    """Past the first step the moves finish where they can: the new .idx goes in beside the new
    record or none, but where the old record could be neither removed nor replaced the new tokens
    are left without an index (prepared again), never beside it. No temporary is left."""
    assert prepare(tmp_path) == 0
    prefix = str(tmp_path / "out_text_document")
    refuse_steps(monkeypatch, fails)
    assert prepare(tmp_path, "--append-eod") == 2
    monkeypatch.undo()
    if left is None:
        assert not Path(prefix + ".idx").exists()
        assert json.loads(Path(prefix + ".tokenizer").read_text())["append_eod"] is False
    else:
        assert state(prefix) == left
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("fails", "said"),
    [
        ({"companion"}, "out_text_document: the new dataset, without its tokenizer record"),
        ({"stale", "companion"}, "out_text_document: its new tokens without an index"),
        ({"unlink"}, "cannot write"),  # the first step: the old dataset is as it was
    ],
)
def test_a_failure_during_the_renames_says_what_each_output_now_is(
    tmp_path, monkeypatch, capsys, fails, said
):
    """Past the first rename the new dataset may be in place: 'cannot write' read as nothing written."""
    assert prepare(tmp_path) == 0
    refuse_steps(monkeypatch, fails)
    capsys.readouterr()
    assert prepare(tmp_path, "--append-eod") == 2
    err = capsys.readouterr().err
    assert said in err
    assert ("cannot write" in err) == (fails == {"unlink"})
    assert len(err.strip().splitlines()) == 1


def test_a_merge_failing_during_the_renames_says_what_its_output_now_is(tmp_path, monkeypatch, capsys):
    assert prepare(tmp_path) == 0
    take_step = finalize._take_step

    def refused(output, step):
        if step == "companion":
            raise PermissionError(errno.EACCES, "Permission denied")
        take_step(output, step)

    monkeypatch.setattr(finalize, "_take_step", refused)
    capsys.readouterr()
    merged = str(tmp_path / "merged")
    assert (
        main(["data", "merge", "--input", str(tmp_path / "out_text_document"), "--output-prefix", merged])
        == 2
    )
    err = capsys.readouterr().err
    assert "merged: the new dataset, without its tokenizer record" in err
    assert "cannot write" not in err


def test_a_killed_writers_record_temporary_is_removed_by_the_next_write_of_that_output(tmp_path, capsys):
    """A kill between staging the tokenizer record and its rename left `.<prefix>.tokenizer.XXXXXXXX.tmp`:
    the sweep of a killed writer's temporaries took only the `.bin`'s."""
    old = time.time() - 2 * 3600
    dead = tmp_path / ".out_text_document.tokenizer.dead1abc.tmp"  # mkstemp's 8 characters
    dead.write_text("{}")
    os.utime(dead, (old, old))
    other = tmp_path / ".other_text_document.tokenizer.deadbeef.tmp"  # another output's
    other.write_text("{}")
    os.utime(other, (old, old))
    assert prepare(tmp_path) == 0
    assert not dead.exists() and other.exists()
    assert "removed 1 temporary file" in capsys.readouterr().err
