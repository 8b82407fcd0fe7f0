"""Directories written whole: complete or absent, and readable as the umask allows."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptrain.utils import atomic
from gptrain.utils.atomic import atomic_directory, atomic_write_text, current_umask


@pytest.fixture
def umask_027() -> Iterator[None]:
    """A group-readable umask for the test, the previous one restored after it."""
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_umask_is_read_from_proc_and_by_setting_it(umask_027, monkeypatch, tmp_path) -> None:
    assert current_umask() == 0o027
    monkeypatch.setattr(atomic, "PROC_STATUS", tmp_path / "absent")  # not Linux
    assert current_umask() == 0o027
    assert os.umask(0o027) == 0o027  # and left as it was


def test_a_finished_directory_and_its_private_files_follow_the_umask(umask_027, tmp_path) -> None:
    """mkdtemp makes 0700 and safetensors writes 0600: after the rename the group may read them,
    as it may what plain mkdir and open make; files the writer gave a mode keep it."""
    out = tmp_path / "shared" / "model"
    with atomic_directory(out) as staging:
        weights = staging / "model.safetensors"
        weights.write_bytes(b"w")
        weights.chmod(0o600)
        (staging / "sub").mkdir(mode=0o700)
        (staging / "sub" / "x.bin").write_bytes(b"x")
        os.chmod(staging / "sub" / "x.bin", 0o600)
        atomic_write_text(staging / "config.json", "{}")  # 0640 by its writer, as open() under 027
        (staging / "run.sh").write_text("")
        (staging / "run.sh").chmod(0o750)
    assert mode(out) == 0o750
    assert mode(out / "model.safetensors") == 0o640
    assert mode(out / "sub") == 0o750 and mode(out / "sub" / "x.bin") == 0o640
    assert mode(out / "config.json") == 0o640 and mode(out / "run.sh") == 0o750


def test_a_failed_directory_is_removed(umask_027, tmp_path) -> None:
    out = tmp_path / "model"
    with pytest.raises(RuntimeError), atomic_directory(out) as staging:
        (staging / "part").write_text("half")
        raise RuntimeError("writer failed")
    assert list(tmp_path.iterdir()) == []


def test_a_finished_directory_is_on_disk_before_and_after_its_rename(tmp_path, monkeypatch) -> None:
    """Every file and directory under it is fsynced before the rename, the parent after it: a node
    that crashes after an export leaves no complete-looking directory of empty files."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    out = tmp_path / "model"
    with atomic_directory(out) as staging:
        (staging / "sub").mkdir()
        (staging / "sub" / "x.bin").write_bytes(b"x")
        (staging / "config.json").write_text("{}")
    names = [Path(p).name for p in synced]
    assert {"x.bin", "config.json", "sub"} <= set(names)
    assert names.index("x.bin") < names.index("sub")  # a file before its directory
    assert synced[-1] == str(tmp_path)  # the rename made durable last


def test_a_failure_names_the_directory_asked_for_and_leaves_no_parents_it_made(tmp_path) -> None:
    """Before, a failed export said `out/.name.x1y2.tmp: ...` (gone when read) and left `a/b/` behind."""
    from gptrain.errors import DataError

    (tmp_path / "a").mkdir()
    target = tmp_path / "a" / "b" / "c" / "out"
    with pytest.raises(DataError) as error, atomic_directory(target) as staging:
        raise DataError(f"{staging}: transformers' tokenizer encodes otherwise")
    assert str(error.value) == f"{target}: transformers' tokenizer encodes otherwise"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == []  # b/ and c/ removed, a/ was there


def test_sigterm_during_an_export_removes_its_staging_directory(tmp_path) -> None:
    """Ctrl-C cleaned up; SIGTERM (a time limit, `timeout`) left the model-sized `.name.*.tmp`."""
    import signal

    from gptrain.trained.hf.cli import removing_partial_output_on_sigterm
    from gptrain.utils.signals import Terminated

    def export(args) -> int:
        with atomic_directory(tmp_path / "out") as staging:
            (staging / "model.safetensors").write_bytes(b"x" * 1000)
            os.kill(os.getpid(), signal.SIGTERM)
        return 0

    with pytest.raises(Terminated):
        removing_partial_output_on_sigterm(export)(None)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_text_that_is_not_utf8_is_one_line_naming_the_file_and_nothing_is_written(tmp_path) -> None:
    """A non-UTF-8 path (its bytes are surrogates in Python) in a config or script was a
    UnicodeEncodeError traceback from the write, after the temporary file was opened."""
    from gptrain.errors import GptrainError

    target = tmp_path / "config.yaml"
    text = "run:\n  name: x\n  results_dir: /data/caf\udce9/run\n"  # /data/café/run in Latin-1
    with pytest.raises(GptrainError) as error:
        atomic_write_text(target, text)
    assert str(error.value) == (
        f"{target}: cannot be written as UTF-8: it would hold 'results_dir: /data/caf\\xe9/run', which "
        "is not UTF-8 (a path from a non-UTF-8 argument or working directory); use UTF-8 paths"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_directory_the_parent_refuses_is_named_not_its_staging_name(tmp_path, monkeypatch) -> None:
    """`import --output ro/run` into a read-only ro/ said 'ro/.run.bypm7i22.tmp: Permission denied',
    a name the user never gave and that does not exist."""
    import errno
    import tempfile

    def refused(prefix: str, suffix: str, dir: Path) -> str:  # what mkdtemp raises in a read-only dir
        raise PermissionError(errno.EACCES, "Permission denied", str(dir / f"{prefix}x1y2z3{suffix}"))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    with pytest.raises(PermissionError) as error, atomic_directory(tmp_path / "run"):
        pass
    assert error.value.filename == str(tmp_path / "run")


@pytest.mark.parametrize("umask", [0o077, 0o027, 0o002])
def test_a_written_file_and_a_dataset_follow_the_umask_as_a_plain_write_would(tmp_path, umask) -> None:
    """hparams.yaml, configs and a .bin/.idx pair are made private by 077 and group-writable by 002,
    as open() makes them; a fixed 0644 made a private corpus world-readable."""
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter

    previous = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "hparams.yaml", "a: 1\n")
        with IndexedDatasetWriter(str(tmp_path / "corpus"), np.uint16) as writer:
            writer.add_document(np.arange(4, dtype=np.uint16))
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(previous)
    plain = mode(tmp_path / "plain")
    assert plain == 0o666 & ~umask
    assert [mode(tmp_path / name) for name in ("hparams.yaml", "corpus.bin", "corpus.idx")] == [plain] * 3


def test_a_directory_being_filled_is_never_removed_as_a_dead_writers(tmp_path) -> None:
    """atomic_directory holds an flock on its staging directory while it is filled, so the sweep of a
    later export or import leaves it, however old it looks; once the holder is gone it is removed."""
    with atomic_directory(tmp_path / "out") as staging:
        os.utime(staging, (0, 0))
        assert atomic.remove_stale_temporary_directories(tmp_path / "out", 0) == [] and staging.is_dir()
        (staging / "weights").write_bytes(b"x" * 10)
    assert (tmp_path / "out" / "weights").is_file()
    left = tmp_path / ".out.abcdefgh.tmp"
    left.mkdir()
    (left / "weights").write_bytes(b"x" * 10)
    os.utime(left, (0, 0))
    assert atomic.remove_stale_temporary_directories(tmp_path / "out", 3600) == [(left, 10)]
    assert not left.exists()


def test_the_working_directory_is_refused_not_replaced(tmp_path, monkeypatch) -> None:
    """An empty working directory as the output (an import's --output .) was removed and the staging
    directory renamed onto its name: the shell sat in a removed directory. Refused; same inode."""
    from gptrain.errors import DataError

    here = tmp_path / "here"
    here.mkdir()
    before = os.stat(here)
    monkeypatch.chdir(here)
    for given in (here, Path(".")):
        refused = pytest.raises(DataError, match="is the working directory, which the output would replace")
        with refused, atomic_directory(given) as staging:
            (staging / "hparams.yaml").write_text("")
        assert os.stat(here).st_ino == before.st_ino and os.stat(".").st_ino == before.st_ino
        assert os.listdir(tmp_path) == ["here"] and os.listdir(here) == []


def left_by_a_killed_writer(tmp_path: Path, nbytes: int) -> Path:
    """The staging directory of `out` a SIGKILLed atomic_directory left, lock file and all, an hour
    old and more."""
    left = tmp_path / ".out.abcdefgh.tmp"
    left.mkdir()
    (left / atomic.WRITER_LOCK).touch()
    (left / "weights").write_bytes(b"x" * nbytes)
    os.utime(left, (0, 0))
    return left


def test_on_nfs_a_dead_writers_staging_directory_is_removed_and_a_live_ones_kept(
    tmp_path, monkeypatch
) -> None:
    """The writer locked the directory itself, which NFS refuses (EBADF), and the sweep, unable to
    tell, kept every staging directory there: a killed export's stayed, as large as the model."""
    with atomic_directory(tmp_path / "out") as staging:
        os.utime(staging, (0, 0))
        assert atomic.remove_stale_temporary_directories(tmp_path / "out", 0) == [] and staging.is_dir()
        (staging / "weights").write_bytes(b"x" * 10)
    assert sorted(os.listdir(tmp_path / "out")) == ["weights"]  # the lock file is not part of the output
    left = left_by_a_killed_writer(tmp_path, 10)
    assert atomic.remove_stale_temporary_directories(tmp_path / "out", 3600) == [(left, 10)]
    assert not left.exists()


def test_on_nfs_a_dead_writers_temporary_file_is_removed_and_a_live_ones_kept(tmp_path, flock_as_nfs) -> None:
    """The sweep asked for an exclusive lock on a read-only descriptor, which NFS refuses (EBADF): it
    kept every temporary there, a killed run's checkpoints/.latest.*.tmp and a killed prepare's too."""
    target = tmp_path / "corpus.bin"
    live = atomic.temporary_sibling(target)
    with open(live, "wb") as handle:
        atomic.hold(handle)
        handle.write(b"x" * 7)
        handle.flush()
        os.utime(live, (0, 0))
        assert atomic.remove_stale_temporaries(target, 3600) == ([], [(live, 7)])
    assert atomic.remove_stale_temporaries(target, 3600) == ([(live, 7)], [])
    assert not live.exists()


def test_where_no_locks_are_taken_the_age_alone_decides(tmp_path, monkeypatch) -> None:
    """ENOLCK (a file system mounted without locks): a dead writer's old staging directory is removed,
    a live writer's younger one kept; the sweep kept both, forever."""
    import errno
    import fcntl

    def flock(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", flock)
    left = left_by_a_killed_writer(tmp_path, 3)
    with atomic_directory(tmp_path / "out") as staging:
        assert atomic.remove_stale_temporary_directories(tmp_path / "out", 3600) == [(left, 3)]
        assert staging.is_dir()
    assert list((tmp_path / "out").iterdir()) == []
