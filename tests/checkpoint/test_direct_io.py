"""A checkpoint file written around the page cache holds exactly the bytes written, in order."""

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptrain.checkpoint import direct_io
from gptrain.checkpoint.direct_io import ALIGNMENT, DirectFile, SyncedFile

SMALL_BUFFER = 2 * ALIGNMENT  # small enough that a few writes cross several buffer boundaries


def _write_pieces(path, pieces: list[bytes]) -> tuple[DirectFile, list[int]]:
    file = DirectFile(path)
    positions = []
    for piece in pieces:
        assert file.write(piece) == len(piece)
        positions.append(file.tell())
    file.close()
    return file, positions


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3 * SMALL_BUFFER + 5), max_size=8), st.integers(0, 255))
def test_any_pieces_give_the_file_their_concatenation(tmp_path_factory, sizes, seed) -> None:
    """Pieces shorter and longer than the buffer, ending on and off the alignment: the file is their
    bytes, exactly as long (the tail's padding cut off), and tell() counts every byte written."""
    path = tmp_path_factory.mktemp("direct") / "shard.distcp"
    pieces = [bytes((seed + i + n) % 256 for i in range(n)) for n in sizes]
    original = direct_io.BUFFER_BYTES
    direct_io.BUFFER_BYTES = SMALL_BUFFER
    try:
        _, positions = _write_pieces(path, pieces)
    finally:
        direct_io.BUFFER_BYTES = original
    expected = b"".join(pieces)
    assert path.read_bytes() == expected
    assert positions == [sum(sizes[: i + 1]) for i in range(len(sizes))]


def test_it_writes_direct_where_the_file_system_allows(tmp_path) -> None:
    """On Linux file systems with O_DIRECT (ext4, xfs; /tmp on CI), the descriptor carries it."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    import fcntl

    file = DirectFile(tmp_path / "probe")
    try:
        if not file.direct:
            pytest.skip(f"{tmp_path} does not take O_DIRECT")
        assert fcntl.fcntl(file.fileno(), fcntl.F_GETFL) & os.O_DIRECT
        file.write(b"x" * (ALIGNMENT + 1))
    finally:
        file.close()
    assert (tmp_path / "probe").read_bytes() == b"x" * (ALIGNMENT + 1)


def test_a_file_system_that_refuses_o_direct_at_open_gets_a_buffered_file(tmp_path, monkeypatch) -> None:
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_open = os.open

    def refuse_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse_direct)
    data = os.urandom(3 * ALIGNMENT + 7)
    file, _ = _write_pieces(tmp_path / "shard", [data])
    assert not file.direct
    assert (tmp_path / "shard").read_bytes() == data


def test_a_direct_write_refused_midway_goes_on_through_the_page_cache(tmp_path, monkeypatch) -> None:
    """Some file systems accept O_DIRECT at open and refuse the write: the file drops the flag and
    writes the same bytes at the same offset."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    import fcntl

    real_write = os.write
    refused = []

    def refuse_direct_writes(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", refuse_direct_writes)
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", SMALL_BUFFER)
    data = os.urandom(5 * ALIGNMENT + 3)
    file = DirectFile(tmp_path / "shard")
    if not file.direct:
        file.discard()
        pytest.skip(f"{tmp_path} does not take O_DIRECT")
    file.write(data)
    file.close()
    assert refused == [SMALL_BUFFER] and not file.direct
    assert (tmp_path / "shard").read_bytes() == data


def test_other_write_errors_reach_the_writer_and_leave_nothing_open(tmp_path, monkeypatch) -> None:
    """A failed write (disk full) is raised, by write() or close(), and again by any later call:
    the file is never finished with a gap; the descriptor, the buffers and the helper are released."""

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io, "BUFFER_BYTES", SMALL_BUFFER)
    file = DirectFile(tmp_path / "shard")
    fd = file.fileno()
    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):  # from the helper thread: by write() or close()
        file.write(b"\0" * 3 * SMALL_BUFFER)
        file.close()
    with pytest.raises(OSError, match="earlier write to this file failed"):
        file.write(b"\0")
    with pytest.raises(OSError, match="earlier write to this file failed"):
        file.close()
    file.discard()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert all(buffer.closed for buffer in file._maps)
    assert file._helper._shutdown


def test_a_plain_file_writes_all_of_a_short_write(tmp_path, monkeypatch) -> None:
    """A raw write may write less than it was given; torch.save's zip writer would not notice."""
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:1000]))
    data = os.urandom(10 * 1000 + 7)
    file = SyncedFile(tmp_path / "shard")
    assert file.write(data) == len(data)
    file.close()
    assert (tmp_path / "shard").read_bytes() == data


@pytest.mark.parametrize("direct", [False, True])
def test_every_file_of_a_save_is_fsynced_and_so_is_its_directory(tmp_path, monkeypatch, direct) -> None:
    """DCP's own fsync is off: each shard and .metadata (written as .metadata.tmp) is fsynced by the
    file itself, and the step directory before COMPLETE is written."""
    import torch

    from gptrain.checkpoint.integrity import COMPLETE
    from gptrain.checkpoint.manager import CheckpointManager

    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name what is fsynced")
    monkeypatch.setattr(os, "fsync", recording_fsync)
    manager = CheckpointManager(tmp_path, keep_last=1, direct_io=direct)
    path = manager.save(1, {"model": {"w": torch.arange(5000.0)}}, {})
    manager.close()
    shards = [p.name for p in path.iterdir() if p.suffix == ".distcp"]
    assert shards and all(name in synced for name in shards)
    metadata = synced.index(".metadata.tmp")
    complete = next(i for i, name in enumerate(synced) if name.startswith(f".{COMPLETE}."))
    assert all(synced.index(name) < metadata for name in shards)
    assert "step_1" in synced[metadata + 1 : complete]  # the directory, after .metadata's rename


def _mounts(tmp_path, lines: list[str]):
    table = tmp_path / "mounts"
    table.write_text("".join(f"dev{i} {line} rw 0 0\n" for i, line in enumerate(lines)))
    return table


def test_direct_io_is_the_default_on_local_disks_only(tmp_path) -> None:
    """The innermost mount holding the directory decides, wherever its line is; a directory not
    made yet is judged by its nearest existing parent; /proc/mounts writes a space as \\040."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    from gptrain.checkpoint.direct_io import takes_direct_io

    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "my disk").mkdir()
    spaced = str(tmp_path / "shared" / "my disk").replace(" ", "\\040")
    table = _mounts(tmp_path, [f"{spaced} ext4", f"{tmp_path}/shared nfs4", "/proc proc", "/ xfs"])
    assert takes_direct_io(tmp_path / "run" / "checkpoints", mounts=table)
    assert not takes_direct_io(tmp_path / "shared" / "run" / "checkpoints", mounts=table)
    assert takes_direct_io(tmp_path / "shared" / "my disk" / "checkpoints", mounts=table)
    assert not takes_direct_io(tmp_path, mounts=_mounts(tmp_path, ["/ lustre"]))
    assert not takes_direct_io(tmp_path, mounts=tmp_path / "no-such-table")


def test_the_config_key_reaches_the_checkpoint_manager(tmp_path) -> None:
    from gptrain.config.loader import load_training_config
    from gptrain.parallel.mesh import World
    from gptrain.train.builders import build_checkpoint_manager

    world = World(rank=0, world_size=1, local_rank=0, master_addr="localhost", master_port=29500)
    for value, expected in (("false", False), ("true", True)):
        cfg = load_training_config(
            "quickstart/cpu",
            [
                f"exp_manager.explicit_log_dir={tmp_path / value}",
                f"exp_manager.checkpoint_callback_params.direct_io={value}",
            ],
        )
        assert build_checkpoint_manager(cfg, world, vocab_size=100).direct_io is expected
