"""What a user's path names, and a path the file system refuses to look up told in one wording."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys

import pytest

from gptrain.utils.paths import Lookup, directory_blocker, look_up


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


def test_a_path_under_an_unsearchable_directory_names_that_directory(unsearchable_dir) -> None:
    locked = unsearchable_dir
    (locked / "a" / "b").mkdir(parents=True)
    for path in (locked / "f", locked / "a" / "b" / "f"):
        found = look_up(path)
        assert found.kind == "unreachable"
        assert found.why == (
            f"cannot be looked up (Permission denied); check the permissions of {locked} and the"
            " directories above it"
        )


def test_a_path_through_a_link_names_the_directory_that_refused_where_it_points(
    tmp_path, monkeypatch
) -> None:
    """`pub/link` -> `secret/dir`, `secret` not searchable: a stat through the link refuses at the
    link, and the walk with stat named its parent `pub`, which the user may search."""
    secret, pub = tmp_path / "secret", tmp_path / "pub"
    (secret / "dir").mkdir(parents=True)
    pub.mkdir()
    os.symlink(secret / "dir", pub / "link")
    real_stat = os.stat

    def stat_(path, *args, follow_symlinks=True, **kwargs):
        name = os.fspath(path)
        through_link = follow_symlinks and (name == str(pub / "link") or name.startswith(f"{pub}/link/"))
        if name.startswith(f"{secret}/") or through_link:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        return real_stat(path, *args, follow_symlinks=follow_symlinks, **kwargs)

    monkeypatch.setattr(os, "stat", stat_)
    expected = (
        f"cannot be looked up (Permission denied); check the permissions of {secret} (reached through"
        f" the link {pub}/link) and the directories above it"
    )
    assert look_up(pub / "link" / "cfg.yaml") == look_up(pub / "link") == Lookup("unreachable", why=expected)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to drop its override"
)
def test_a_link_into_a_directory_another_user_owns_names_that_directory(tmp_path) -> None:
    """The same with real permissions: root without CAP_DAC_OVERRIDE/READ_SEARCH may not search
    `secret`, nobody's and 0700."""
    secret, pub = tmp_path / "secret", tmp_path / "pub"
    (secret / "dir").mkdir(parents=True)
    pub.mkdir()
    os.chown(secret, 65534, 65534)
    secret.chmod(0o700)
    os.symlink(secret / "dir", pub / "link")
    code = "import sys; from gptrain.utils.paths import look_up; print(look_up(sys.argv[1]).why)"

    def shown(path: str) -> str:
        drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
        run = subprocess.run(
            [*drop, sys.executable, "-c", code, path], cwd=pub, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    expected = (
        "cannot be looked up (Permission denied); check the permissions of {} (reached through the link {})"
        " and the directories above it"
    )
    assert shown(f"{pub}/link/cfg.yaml") == expected.format(secret, f"{pub}/link")
    assert shown("../pub/./link/cfg.yaml") == expected.format(secret, "../pub/link")  # relative: as given


def test_a_symbolic_link_loop_says_to_check_the_links(tmp_path) -> None:
    os.symlink("loop", tmp_path / "loop")
    found = look_up(tmp_path / "loop" / "f")
    assert found.kind == "unreachable"
    assert found.why.startswith(f"cannot be looked up ({os.strerror(errno.ELOOP)}); check the symbolic links")


def test_another_refusal_says_to_check_the_file_system(tmp_path, refuse_search) -> None:
    refuse_search(tmp_path, errno.EIO)
    found = look_up(tmp_path / "f")
    assert (found.kind, found.why) == (
        "unreachable",
        f"cannot be looked up ({os.strerror(errno.EIO)}); check the file system",
    )


def test_a_directory_under_one_that_may_not_be_searched_is_a_blocker_not_an_error(unsearchable_dir) -> None:
    """Path.exists raised PermissionError there (Python 3.11): launch's run directories, validate's
    --output-dir and export's output were a bare '<path>: Permission denied', --dry-run too."""
    locked = unsearchable_dir
    assert directory_blocker(locked / "runs" / "r1", must_write=True) == (
        f"{locked}/runs/r1 cannot be looked up (Permission denied); check the permissions of {locked}"
        " and the directories above it"
    )
