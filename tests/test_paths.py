"""What a user's path names, and a path the file system refuses to look up told in one wording."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from gptrain.utils.paths import directory_blocker, look_up


def refuse_under(monkeypatch, directory: Path, code: int = errno.EACCES) -> None:
    """Stat fails with `code` for every path below `directory`, as where the user may not search
    it (root may search any directory, so the refusal is stood in for)."""
    real_stat = os.stat

    def stat_(path, *args, **kwargs):
        if os.fspath(path).startswith(str(directory) + os.sep):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_)


def test_a_file_a_directory_and_a_pipe_are_told_apart(tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "pipe")
    assert look_up(tmp_path / "f").kind == "file"
    assert look_up(str(tmp_path)).kind == "directory"
    pipe = look_up(tmp_path / "pipe")
    assert pipe.kind == "other" and stat.S_ISFIFO(pipe.mode)


@pytest.mark.parametrize("name", ["absent", "f/below_a_file", "nul\0in_it"])
def test_what_is_not_there_is_missing(tmp_path, name) -> None:
    """Under a file (ENOTDIR) and with a NUL in it (ValueError) too, as Path.is_file says False."""
    (tmp_path / "f").write_text("x")
    assert look_up(f"{tmp_path}/{name}").kind == "missing"


def test_a_path_under_an_unsearchable_directory_names_that_directory(tmp_path, monkeypatch) -> None:
    locked = tmp_path / "locked"
    (locked / "a" / "b").mkdir(parents=True)
    refuse_under(monkeypatch, locked)
    for path in (locked / "f", locked / "a" / "b" / "f"):
        found = look_up(path)
        assert found.kind == "unreachable"
        assert found.why == (
            f"cannot be looked up (Permission denied); check the permissions of {locked} and the"
            " directories above it"
        )


def test_a_symbolic_link_loop_says_to_check_the_links(tmp_path) -> None:
    os.symlink("loop", tmp_path / "loop")
    found = look_up(tmp_path / "loop" / "f")
    assert found.kind == "unreachable"
    assert found.why.startswith(f"cannot be looked up ({os.strerror(errno.ELOOP)}); check the symbolic links")


def test_another_refusal_says_to_check_the_file_system(tmp_path, monkeypatch) -> None:
    refuse_under(monkeypatch, tmp_path, errno.EIO)
    found = look_up(tmp_path / "f")
    assert (found.kind, found.why) == (
        "unreachable",
        f"cannot be looked up ({os.strerror(errno.EIO)}); check the file system",
    )


def test_a_directory_under_one_that_may_not_be_searched_is_a_blocker_not_an_error(
    tmp_path, monkeypatch
) -> None:
    """Path.exists raised PermissionError there (Python 3.11): launch's run directories, validate's
    --output-dir and export's output were a bare '<path>: Permission denied', --dry-run too."""
    locked = tmp_path / "locked"
    locked.mkdir()
    refuse_under(monkeypatch, locked)
    assert directory_blocker(locked / "runs" / "r1", must_write=True) == (
        f"{locked}/runs/r1 cannot be looked up (Permission denied); check the permissions of {locked}"
        " and the directories above it"
    )
