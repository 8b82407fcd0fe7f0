"""Damaged checkpoints: named by the manifest, skipped at resume (loudly), checked by `checkpoint verify`."""

import json
import pickle
import re
import sys
import zlib
from pathlib import Path

import pytest
import torch

from gptrain.checkpoint.directory import CheckpointLoadError
from gptrain.checkpoint.integrity import complete_steps, manifest_bytes, verify
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def save(manager: CheckpointManager, step: int) -> Path:
    return manager.save(step, {"model": {"w": torch.full((64, 64), float(step))}}, {})


def truncate_shard(step_dir: Path) -> Path:
    shard = next(step_dir.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    return shard


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_complete_marker_lists_every_file_with_size_and_write_time_crc(tmp_path):
    path = save(CheckpointManager(tmp_path, keep_last=2), 3)
    record = json.loads((path / "COMPLETE").read_text())
    assert record["step"] == 3
    files = record["files"]
    assert {name: entry["bytes"] for name, entry in files.items()} == {
        p.name: p.stat().st_size for p in path.iterdir() if p.name != "COMPLETE"
    }
    written_by_dcp = [name for name in files if name.endswith(".distcp") or name == ".metadata"]
    assert len(written_by_dcp) == 2
    for name in written_by_dcp:  # the streaming CRC equals an independent read of the file
        assert files[name]["crc32"] == f"{zlib.crc32((path / name).read_bytes()):08x}"
    assert verify(path) is None and verify(path, checksums=True) is None


def test_truncated_or_missing_shard_is_named(tmp_path):
    path = save(CheckpointManager(tmp_path, keep_last=2), 1)
    shard = truncate_shard(path)
    size = json.loads((path / "COMPLETE").read_text())["files"][shard.name]["bytes"]
    assert verify(path) == f"{shard} is 100 bytes, its manifest says {size} (truncated or replaced)"
    shard.unlink()
    assert verify(path) == f"{shard} is missing"


@pytest.mark.parametrize(
    "files", [[1], {"a": "big"}, {"a": {"crc32": "00"}}, {"a": {"bytes": 1, "crc32": 7}}]
)
def test_a_marker_whose_manifest_is_not_one_is_damage_named_in_one_line(tmp_path, files):
    """A COMPLETE that is JSON but no manifest (`{"files": [1]}`) was an AttributeError traceback in
    `checkpoint verify` and at resume, where it must be damage: the checkpoint before loads."""
    manager = CheckpointManager(tmp_path, keep_last=2)
    save(manager, 1)
    path = save(manager, 2)
    (path / "COMPLETE").write_text(json.dumps({"step": 2, "files": files}))
    assert (
        verify(path)
        == f"{path / 'COMPLETE'} holds no valid manifest of the step's files (edited or overwritten)"
    )
    assert manifest_bytes(path) is None
    warnings = []
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    loaded, _ = manager.load_newest_good(template, lambda state: None, warnings.append)
    assert loaded == tmp_path / "step_1" and warnings[0].startswith("checkpoint step_2 is damaged")


@pytest.mark.parametrize(
    "record",
    [{"step": 2, "slurm_job_id": None, "filez": {}}, [2], "step_2", {}, {"step": "2"}],
    ids=["manifest-key-changed", "a-list", "a-string", "emptied", "step-not-a-number"],
)
def test_a_marker_that_lost_its_manifest_is_damage_not_a_checkpoint_from_before_manifests(
    tmp_path, capsys, record
):
    """Such a marker was taken for one from before manifests: `checkpoint verify` said "ok" and a
    resume loaded it with nothing checked (one changed letter of "files" in COMPLETE was enough)."""
    manager = CheckpointManager(tmp_path, keep_last=2)
    save(manager, 1)
    path = save(manager, 2)
    flip_a_byte(next(path.glob("*.distcp")))
    (path / "COMPLETE").write_text(json.dumps(record))
    problem = f"{path / 'COMPLETE'} holds no valid manifest of the step's files (edited or overwritten)"
    assert verify(path, checksums=True) == problem
    assert main(["checkpoint", "verify", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == f"step_2: DAMAGED: {problem}"
    warnings = []
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    loaded, _ = manager.load_newest_good(template, lambda state: None, warnings.append)
    assert loaded.name.startswith("step_1") and warnings[0].startswith("checkpoint step_2 is damaged")


def test_a_checkpoint_from_before_manifests_loads_and_verify_says_it_is_unchecked(tmp_path, capsys):
    """Its marker is `{"step": N}` (before 2026-11-23): nothing to compare, so verify no longer says
    "ok (0.0 MB read ...)" as if it had read it; a resume still loads it."""
    manager = CheckpointManager(tmp_path, keep_last=2)
    path = save(manager, 2)
    (path / "COMPLETE").write_text(json.dumps({"step": 2}) + "\n")
    assert verify(path, checksums=True) is None
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step_2: not checked (its COMPLETE marker is from before gptrain recorded each file's size and "
        "CRC-32: nothing to compare; a resume loads it unchecked)"
    ]
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    loaded, _ = manager.load_newest_good(template, lambda state: None, [].append)
    assert loaded == path


def test_a_changed_byte_is_found_by_the_checksum(tmp_path):
    path = save(CheckpointManager(tmp_path, keep_last=2), 1)
    shard = next(path.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify(path) is None  # same size
    assert verify(path, checksums=True).startswith(f"{shard} has CRC-32 ")


def test_load_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        save(manager, step)
    truncate_shard(tmp_path / "step_3")
    (tmp_path / "step_2" / "__0_0.distcp").unlink()
    warnings, applied = [], []
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    path, _ = manager.load_newest_good(template, applied.append, warnings.append)
    assert path == tmp_path / "step_1" and torch.equal(applied[0]["model"]["w"], torch.full((64, 64), 1.0))
    assert [w.split(":")[0] for w in warnings[:2]] == [
        "checkpoint step_3 is damaged",
        "checkpoint step_2 is damaged",
    ]
    truncate_shard(tmp_path / "step_1")
    with pytest.raises(CheckpointLoadError, match="no checkpoint under .* loads") as error:
        manager.load_newest_good(template, applied.append, warnings.append)
    assert "\n" not in str(error.value)


def test_a_shard_the_disk_will_not_read_is_damage_and_the_one_before_loads(tmp_path, monkeypatch):
    """EIO from a bad sector (or EACCES, ESTALE) while its CRC is read: skipped like a flipped byte,
    not an OSError that ends the resume (or, on many ranks, leaves the others in the gather)."""
    import errno

    from gptrain.checkpoint import integrity

    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2):
        save(manager, step)
    real_crc = integrity.file_crc32

    def failing_disk(path, **kwargs):
        if path.parent.name == "step_2":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_crc(path, **kwargs)

    monkeypatch.setattr(integrity, "file_crc32", failing_disk)
    warnings, applied = [], []
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    path, _ = manager.load_newest_good(template, applied.append, warnings.append)
    manager.close()
    assert path == tmp_path / "step_1" and torch.equal(applied[0]["model"]["w"], torch.full((64, 64), 1.0))
    assert (
        warnings[0].startswith("checkpoint step_2 is damaged")
        and "is unreadable (Input/output error)" in warnings[0]
    )


def test_a_permission_or_mount_error_stops_the_resume_instead_of_passing_a_good_checkpoint_over(
    tmp_path, monkeypatch
):
    """EACCES, ESTALE: about the reader or the mount, not the checkpoint. Passing over it would set
    a good checkpoint aside and resume from an older one; the resume stops in one line instead."""
    import errno

    from gptrain.checkpoint import integrity

    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2):
        save(manager, step)

    def denied(path, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(integrity, "file_crc32", denied)
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    with pytest.raises(
        CheckpointLoadError, match="could not be read on some rank .*Permission denied.*not damage"
    ):
        manager.load_newest_good(template, lambda state: None, pytest.fail)
    manager.close()
    assert (tmp_path / "step_2" / "COMPLETE").is_file() and complete_steps(tmp_path) == [1, 2]


@pytest.mark.parametrize("code", ["EACCES", "ESTALE"])
def test_a_complete_marker_the_reader_may_not_read_is_not_damage(tmp_path, monkeypatch, capsys, code):
    """The COMPLETE marker read with EACCES (a run directory's permissions) or ESTALE (an NFS handle after
    a requeue on another node) was called unreadable damage: the resume passed over the newest good
    checkpoint, renamed it step_2.damaged-* and resumed from step_1, and verify called it DAMAGED. As for
    a shard, the resume now stops in one line and nothing moves; verify says UNREADABLE."""
    import errno
    import os

    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2):
        save(manager, step)
    manager.close()
    marker, read_text = tmp_path / "step_2" / "COMPLETE", Path.read_text

    def refused(path, *args, **kwargs):
        if path == marker:
            number = getattr(errno, code)
            raise OSError(number, os.strerror(number), str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refused)
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    with pytest.raises(CheckpointLoadError, match="could not be read on some rank .*not damage") as error:
        CheckpointManager(tmp_path, keep_last=3).load_newest_good(template, lambda state: None, pytest.fail)
    assert str(marker) in str(error.value) and "\n" not in str(error.value)
    assert complete_steps(tmp_path) == [1, 2] and not list(tmp_path.glob("*.damaged-*"))
    assert main(["checkpoint", "verify", str(tmp_path)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"step_2: UNREADABLE: {marker}: ") and "DAMAGED" not in first


def test_resume_past_a_damaged_checkpoint_moves_it_aside_so_retention_keeps_the_good_ones(tmp_path, capsys):
    """Left as step_4, the damaged checkpoint counted as the newest for save_top_k: the next save and
    the one resumed from were deleted, and the requeue after found nothing that loads."""
    save(CheckpointManager(tmp_path, keep_last=2), 2)
    save(CheckpointManager(tmp_path, keep_last=2), 4)
    truncate_shard(tmp_path / "step_4")
    requeued = CheckpointManager(tmp_path, keep_last=1)  # save_top_k=1
    warnings = []
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    path, _ = requeued.load_newest_good(template, lambda s: None, warnings.append)
    [aside] = tmp_path.glob("step_4.damaged-*")
    assert path == tmp_path / "step_2" and len(warnings) == 2
    assert warnings[1] == f"moved the damaged checkpoint step_4 aside to {aside} (kept for inspection)"
    assert ".distcp is 100 bytes" in verify(aside)  # kept as it was found
    assert (tmp_path / "latest").read_text() == "step_2\n"
    save(requeued, 3)
    assert complete_steps(tmp_path) == [3] and aside.is_dir()
    warnings.clear()
    path, _ = CheckpointManager(tmp_path, keep_last=1).load_newest_good(
        template, lambda s: None, warnings.append
    )
    assert path == tmp_path / "step_3" and warnings == []
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{aside.name}: set aside by a resume as damaged (never loaded or pruned; delete it when done)"
    )


def test_a_changed_byte_in_a_rank_file_is_found_by_the_checksum(tmp_path, capsys):
    """A rank file (RNG streams) gets its CRC-32 when written, as the DCP files do: a same-size change
    is found by verify and by resume before loading, not by one rank's torch.load alone."""
    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=2)
    path = manager.save(1, {"model": {"w": torch.zeros(4)}}, {"rng": torch.arange(100)})
    rank_file = path / "rank_0.pt"
    files = json.loads((path / "COMPLETE").read_text())["files"]
    assert files["rank_0.pt"]["crc32"] == f"{zlib.crc32(rank_file.read_bytes()):08x}"
    flip_a_byte(rank_file)
    assert verify(path) is None  # same size
    assert verify(path, checksums=True).startswith(f"{rank_file} has CRC-32 ")
    assert main(["checkpoint", "verify", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(f"step_1: DAMAGED: {rank_file} has CRC-32 ")


def test_resume_skips_a_truncated_latest_checkpoint_loudly(tmp_path, monkeypatch):
    """The issue's case: truncate one .distcp of the latest checkpoint and resume."""
    config = tiny_config(tmp_path, *MOCK, "exp_manager.resume_if_exists=true")
    code, _ = run_recording(monkeypatch, config)
    assert code == 0
    truncate_shard(tmp_path / "checkpoints" / "step_6")
    longer = tiny_config(tmp_path, *MOCK, "exp_manager.resume_if_exists=true", "trainer.max_steps=7")
    code, losses = run_recording(monkeypatch, longer)
    assert code == 0 and sorted(losses) == [5, 6, 7]  # resumed from step_4
    lines = log_lines(tmp_path)
    assert any(line.startswith("WARNING: checkpoint step_6 is damaged: ") and ".distcp is 100 bytes" in line
               for line in lines)  # fmt: skip
    assert any(line.startswith("resuming from ") and "step_4 at iteration 4" in line for line in lines)


def test_checkpoint_verify_command(tmp_path, capsys):
    manager = CheckpointManager(tmp_path / "results" / "checkpoints", keep_last=3)
    save(manager, 1)
    save(manager, 2)
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    size = manifest_bytes(tmp_path / "results" / "checkpoints" / "step_2")
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in out] == ["step_2: ok", "step_1: ok"]
    assert out[0].startswith(f"step_2: ok ({size / 1e6:.1f} MB read in ") and out[0].endswith(" MB/s)")
    shard = next((tmp_path / "results" / "checkpoints" / "step_2").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # same size, other content: only the checksum sees it
    shard.write_bytes(bytes(data))
    assert main(["checkpoint", "verify", "--sizes-only", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"step_2: ok ({size / 1e6:.1f} MB, sizes only)\n")
    assert main(["checkpoint", "verify", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step_2: DAMAGED: ") and "CRC-32" in out[0] and out[1].startswith("step_1: ok (")


def test_checkpoint_verify_takes_one_step_directory(tmp_path, capsys):
    """As generate, eval and export do; it said "no step_<N> checkpoint directories found here"."""
    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=3)
    save(manager, 1)
    save(manager, 2)
    flip_a_byte(next((tmp_path / "checkpoints" / "step_2").glob("*.distcp")))
    assert main(["checkpoint", "verify", str(tmp_path / "checkpoints" / "step_1")]) == 0
    assert [line.split(" (")[0] for line in capsys.readouterr().out.splitlines()] == ["step_1: ok"]
    assert main(["checkpoint", "verify", str(tmp_path / "checkpoints" / "step_2")]) == 1
    assert capsys.readouterr().out.startswith("step_2: DAMAGED: ")


def test_a_run_without_checkpoints_is_one_line_naming_every_directory_searched(tmp_path, capsys):
    """A run dir whose results/checkpoints holds no step yet (a run stopped before its first save) was
    told "no step_<N> checkpoint directories found here or in checkpoints/", leaving out
    results/checkpoints, which was searched too (and is where a run's checkpoints are)."""
    (tmp_path / "results" / "checkpoints").mkdir(parents=True)
    for command in (["verify"], ["rewind", "--to", "1"]):
        assert main(["checkpoint", command[0], str(tmp_path), *command[1:]]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        for searched in (tmp_path / "checkpoints", tmp_path / "results" / "checkpoints"):
            assert f"{searched}," in err or f"{searched} " in err


def test_checkpoint_verify_of_a_live_run_does_not_call_a_checkpoint_its_retention_removed_damaged(
    tmp_path, capsys, monkeypatch
):
    """Verifying a run that is still saving (minutes of CRC reads per large checkpoint): its retention
    removed the oldest checkpoint while verify read it, which verify called DAMAGED (a file missing)."""
    from gptrain.checkpoint import integrity

    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=2)
    save(manager, 1)
    save(manager, 2)
    real_crc32 = integrity.file_crc32

    def crc32_while_the_run_saves(path, *args, **kwargs):
        if path.parent.name == "step_1" and not (tmp_path / "checkpoints" / "step_3").exists():
            save(manager, 3)  # keeps step_2 and step_3: step_1 loses its marker, then its files
            manager.close()
        return real_crc32(path, *args, **kwargs)

    monkeypatch.setattr(integrity, "file_crc32", crc32_while_the_run_saves)
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step_2: ok (")
    assert out[1] == (
        "step_1: removed while it was read (its COMPLETE marker is gone: a run still saving removes its "
        "older checkpoints, keeping exp_manager.checkpoint_callback_params.save_top_k); not damage"
    )
    assert len(out) == 2


def test_checkpoint_verify_names_a_missing_directory(tmp_path, capsys):
    assert main(["checkpoint", "verify", str(tmp_path / "nothere")]) == 2
    assert "nothere: no such directory; pass a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["verify", "rewind"])
def test_checkpoint_commands_under_a_directory_that_may_not_be_searched_are_one_line(
    unsearchable_dir, capsys, command
):
    """Path.is_dir raised PermissionError (Python 3.11): a bare '<path>: Permission denied'. Root may
    search any directory, so the refusal is stood in for."""
    locked = unsearchable_dir
    argv = ["checkpoint", command, str(locked / "run" / "step_2")] + (
        ["--to", "1"] if command == "rewind" else []
    )
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: {locked}/run/step_2: cannot be looked up (Permission denied); check the"
        f" permissions of {locked} and the directories above it\n"
    )


def test_resume_checks_the_crc_of_this_ranks_share(tmp_path):
    """A changed byte of the same size is found before loading: the fallback takes the older one."""
    from gptrain.checkpoint.integrity import verify_share

    manager = CheckpointManager(tmp_path, keep_last=3)
    save(manager, 1)
    path = save(manager, 2)
    shard = next(path.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    names = sorted(json.loads((path / "COMPLETE").read_text())["files"])
    owner = names.index(shard.name) % 2  # with two ranks, one of them reads this file
    assert verify_share(path, owner, 2).startswith(f"{shard} has CRC-32 ")
    assert verify_share(path, 1 - owner, 2) is None
    warnings = []
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    loaded, _ = manager.load_newest_good(template, lambda s: None, warnings.append)
    assert loaded == tmp_path / "step_1" and "CRC-32" in warnings[0]


@pytest.mark.parametrize("direct_io", [False, True])
@pytest.mark.parametrize("async_save", [False, True])
def test_tensors_written_in_pieces_checksum_and_load_exactly(tmp_path, monkeypatch, async_save, direct_io):
    """Large tensors go to disk in cache-sized pieces without torch's per-record zip CRC, through the
    page cache or around it from a buffer smaller than a tensor: the streaming CRC still equals an
    independent read, the values load back bit for bit, and the process-wide torch.save option is as
    it was afterwards."""
    from torch.serialization import get_crc32_options

    from gptrain.checkpoint import checksum_writer
    from gptrain.checkpoint import direct_io as direct_io_module

    monkeypatch.setattr(checksum_writer, "WRITE_PIECE_BYTES", 1000)  # 8-byte values: pieces end mid-value
    monkeypatch.setattr(direct_io_module, "BUFFER_BYTES", 2 * direct_io_module.ALIGNMENT)
    weights = torch.randn(123, 45, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    manager = CheckpointManager(tmp_path, keep_last=1, async_save=async_save, direct_io=direct_io)
    assert manager.direct_io is direct_io
    path = manager.save(1, {"model": {"w": weights.clone(), "b": torch.arange(7)}}, {})
    manager.close()
    assert get_crc32_options() is True
    files = json.loads((path / "COMPLETE").read_text())["files"]
    assert {name for name in files if files[name]["crc32"]} == {"__0_0.distcp", ".metadata", "rank_0.pt"}
    for name in ["__0_0.distcp", ".metadata", "rank_0.pt"]:
        assert files[name]["crc32"] == f"{zlib.crc32((path / name).read_bytes()):08x}"
    target = {
        "model": {"w": torch.zeros(123, 45, dtype=torch.float64), "b": torch.zeros(7, dtype=torch.int64)}
    }
    manager.load(path, target, lambda state: None)
    assert torch.equal(target["model"]["w"], weights) and torch.equal(target["model"]["b"], torch.arange(7))


def test_a_file_renamed_while_a_directory_is_sized_is_not_counted(tmp_path, monkeypatch):
    """Rank 0's COMPLETE temporary is renamed while the logging rank sizes the step directory after
    a background save: the size leaves it out instead of raising in the training thread."""
    from gptrain.checkpoint.directory import directory_bytes

    (tmp_path / "a.distcp").write_bytes(b"x" * 10)
    (tmp_path / ".COMPLETE.1.tmp").write_bytes(b"y" * 5)
    real_stat = Path.stat

    def vanishing(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            vanishing.calls += 1
            if vanishing.calls > 1:  # is_file() saw it; it is gone by the stat that sizes it
                raise FileNotFoundError(self)
        return real_stat(self, *args, **kwargs)

    vanishing.calls = 0
    monkeypatch.setattr(Path, "stat", vanishing)
    assert directory_bytes(tmp_path) == 10


def test_reading_every_crc_shows_its_progress(tmp_path):
    """Minutes for a large checkpoint (gptrain export reads them first): files, MB/s and an ETA."""
    import io

    from gptrain.utils.progress import Progress

    path = save(CheckpointManager(tmp_path, keep_last=1), 1)
    stream = io.StringIO()
    progress = Progress(
        "checking", unit="files", total_bytes=manifest_bytes(path), interval=0.0, stream=stream
    )
    assert verify(path, checksums=True, progress=progress) is None
    files = json.loads((path / "COMPLETE").read_text())["files"]
    last = stream.getvalue().splitlines()[-1]
    assert last.startswith(f"checking: {len(files)} files |") and "MB/s" in last and "ETA" in last
    assert progress.bytes == sum(entry["bytes"] for entry in files.values() if entry["crc32"])  # those read


def test_a_resume_points_latest_at_the_checkpoint_it_loaded(tmp_path, monkeypatch):
    """Killed between step_6's COMPLETE and its `latest`: the same command again has nothing to do,
    and left `latest` at step_4 for ever (eval, export and retention read it)."""
    config = tiny_config(tmp_path, *MOCK, "exp_manager.resume_if_exists=true")
    code, _ = run_recording(monkeypatch, config)
    assert code == 0
    latest = tmp_path / "checkpoints" / "latest"
    latest.write_text("step_4\n")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and losses == {}
    assert latest.read_text() == "step_6\n"


def test_a_resume_killed_while_moving_damaged_checkpoints_aside_leaves_latest_naming_a_complete_one(
    tmp_path, monkeypatch
):
    """`latest` was pointed at the resumed checkpoint after the damaged ones were renamed: a kill among
    the renames left it naming step_4, a directory no longer there (a Megatron user's script reading
    it as the tracker file found nothing). Now `latest` moves first."""
    from gptrain.checkpoint import reader as reader_module

    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (2, 4):
        save(manager, step)
    truncate_shard(tmp_path / "step_4")
    real_rename_aside = reader_module.rename_aside

    def rename_then_killed(path, why):
        real_rename_aside(path, why)
        raise KeyboardInterrupt  # as SIGKILL would end it: nothing after the rename runs

    monkeypatch.setattr(reader_module, "rename_aside", rename_then_killed)
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        manager.load_newest_good(template, lambda state: None, [].append)
    latest = (tmp_path / "latest").read_text().strip()
    assert latest == "step_2" and (tmp_path / latest / "COMPLETE").is_file()


def test_resume_from_checkpoint_takes_a_run_directory(tmp_path):
    """`exp_manager.resume_from_checkpoint=results/<run.name>`, the run directory eval and export take."""
    from gptrain.checkpoint.directory import find_checkpoint

    manager = CheckpointManager(tmp_path / "results" / "checkpoints", keep_last=3)
    save(manager, 1)
    save(manager, 2)
    assert find_checkpoint(tmp_path) == tmp_path / "results" / "checkpoints" / "step_2"


def test_resume_from_a_checkpoint_under_a_directory_that_may_not_be_searched_is_one_line(
    unsearchable_dir,
):
    """exp_manager.resume_from_checkpoint there: Path.is_dir raised PermissionError (Python 3.11), a
    bare '<path>: Permission denied' naming nothing to check."""
    from gptrain.checkpoint.directory import find_checkpoint

    locked = unsearchable_dir
    with pytest.raises(CheckpointLoadError) as error:
        find_checkpoint(locked / "run")
    assert str(error.value) == (
        f"{locked}/run: cannot be looked up (Permission denied); check the permissions of {locked} and the"
        " directories above it"
    )


def test_resume_past_a_damaged_checkpoint_on_a_full_disk_still_resumes(tmp_path, monkeypatch):
    """Rank 0 rewrote `latest` after moving a damaged checkpoint aside without the guard its other
    write of `latest` has: on a full disk (ENOSPC) the resume died with an OSError on rank 0 alone,
    after loading step_2, while the other ranks went on to their first collective. `latest` is
    informational (resume reads the COMPLETE markers): the resume now goes on."""
    import errno

    from gptrain.checkpoint import reader

    save(CheckpointManager(tmp_path, keep_last=2), 2)
    save(CheckpointManager(tmp_path, keep_last=2), 4)
    truncate_shard(tmp_path / "step_4")
    written = reader.atomic_write_text

    def full_disk(path, text):
        if path.name == "latest":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written(path, text)

    monkeypatch.setattr(reader, "atomic_write_text", full_disk)
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    warnings = []
    path, _ = CheckpointManager(tmp_path, keep_last=1).load_newest_good(
        template, lambda s: None, warnings.append
    )
    assert path == tmp_path / "step_2" and len(list(tmp_path.glob("step_4.damaged-*"))) == 1
    assert (tmp_path / "latest").read_text() == "step_4\n"  # left as it was


def test_a_step_directory_named_for_another_iteration_is_a_mismatch_and_never_resumed(tmp_path, capsys):
    """A hand copy: step_6 holds step 4's checkpoint. Every file matches its manifest, so it verified as
    ok and resumed as iteration 4 under the name step_6; verify now says the mismatch and a resume
    refuses it in one line, renaming nothing (it is not damage to pass over)."""
    import shutil

    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep_last=3)
    save(manager, 2)
    save(manager, 4)
    shutil.copytree(root / "step_4", root / "step_6")
    assert main(["checkpoint", "verify", str(tmp_path)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("step_6: MISMATCH: step_6 holds the checkpoint of iteration 4 ")
    assert "rename it to step_4" in first
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    warnings, applied = [], []
    with pytest.raises(CheckpointLoadError, match="step_6 is not loaded: step_6 holds the checkpoint of iteration 4") as error:  # fmt: skip
        manager.load_newest_good(template, applied.append, warnings.append)
    assert "\n" not in str(error.value) and applied == [] and warnings == []
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_2", "step_4", "step_6"]


def test_a_checkpoint_from_a_newer_gptrain_or_torch_is_refused_in_one_line_not_set_aside(tmp_path, capsys):
    """COMPLETE records the checkpoint format and the torch that saved it. A newer format (a manifest this
    gptrain does not know), or a .metadata this torch cannot unpickle while its CRC-32 matches, was called
    damaged: set aside as step_4.damaged-*, and the run went back to step_2. Both are now one line naming
    the step and the versions, nothing renamed; a marker from before the record is judged as before."""
    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep_last=3)
    save(manager, 2)
    save(manager, 4)
    marker = root / "step_4" / "COMPLETE"
    record = json.loads(marker.read_text())
    assert (record["format"], record["torch"]) == (1, torch.__version__)
    template = lambda sections: {"model": {"w": torch.zeros(64, 64)}}  # noqa: E731
    warnings, applied = [], []
    names = ["latest", "step_2", "step_4"]

    marker.write_text(json.dumps({**record, "format": 2, "files": [{"name": ".metadata"}]}))
    assert main(["checkpoint", "verify", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(
        "step_4: NEWER FORMAT: step_4 was saved in checkpoint format 2 "
    )
    with pytest.raises(CheckpointLoadError, match="step_4 was saved in checkpoint format 2 .*reads format 1 and older: load it with a gptrain at least as new") as error:  # fmt: skip
        manager.load_newest_good(template, applied.append, warnings.append)
    assert "\n" not in str(error.value) and (applied, warnings) == ([], [])
    assert sorted(p.name for p in root.iterdir()) == names

    # a pickle of a class this torch does not have, as a newer torch's .metadata may hold
    future = b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadataFromTheFuture\nq\x00)\x81q\x01."
    (root / "step_4" / ".metadata").write_bytes(future)
    record["files"][".metadata"] = {"bytes": len(future), "crc32": f"{zlib.crc32(future):08x}"}
    marker.write_text(json.dumps({**record, "torch": "9.9.0"}))
    with pytest.raises(CheckpointLoadError, match=rf"step_4: its \.metadata does not load with torch {re.escape(torch.__version__)} \(AttributeError: .*saved with torch 9\.9\.0; load it with torch 9\.9\.0 or newer") as error:  # fmt: skip
        manager.load_newest_good(template, applied.append, warnings.append)
    assert "\n" not in str(error.value) and (applied, warnings) == ([], [])
    assert sorted(p.name for p in root.iterdir()) == names

    # saved by this very torch (or an older one): no newer torch to ask for, so what it was before,
    # damage (a read that went wrong on the way, on one rank): passed over, as a marker before the record
    release = torch.__version__.split("+")[0]
    for saved_with in (torch.__version__, "2.0.0", f"{release}+cu128", f"{release}+zzz"):  # other builds
        marker.write_text(json.dumps({**record, "torch": saved_with}))
        path, _ = manager.load_newest_good(template, applied.append, warnings.append)
        assert path.name == "step_2" and warnings[0].startswith("checkpoint step_4 is damaged: ")
        warnings.clear()
        for aside in root.glob("step_4.damaged-*"):
            aside.rename(root / "step_4")
        (root / "latest").write_text("step_4\n")

    del record["format"], record["torch"], record["gptrain"]  # as saved before the record: damage
    marker.write_text(json.dumps(record))
    path, _ = manager.load_newest_good(template, applied.append, warnings.append)
    assert path.name == "step_2" and warnings[0].startswith("checkpoint step_4 is damaged: ")


def test_eval_export_and_rewind_refuse_a_misnamed_or_newer_format_checkpoint_too(tmp_path, capsys):
    """Eval, generate and export (gptrain.trained.load) and rewind check a checkpoint by its manifest
    alone: a hand copy step_8 holding step 2 was taken as the run's newest, and a rewind went back to a
    checkpoint of a newer format. Both are the resume's one-line refusal now, nothing moved."""
    import shutil

    from gptrain.trained.load import resolve_checkpoint

    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep_last=None)
    for step in (2, 4, 6):
        save(manager, step)
    shutil.copytree(root / "step_2", root / "step_8")
    for given in (tmp_path, root / "step_8"):
        with pytest.raises(CheckpointLoadError, match=r"step_8 is not loaded: step_8 holds the checkpoint of iteration 2 "):  # fmt: skip
            resolve_checkpoint(given)
    shutil.rmtree(root / "step_8")
    marker = root / "step_4" / "COMPLETE"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": 2}))
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 2
    err = capsys.readouterr().err
    assert (
        "step_4 is not rewound to: step_4 was saved in checkpoint format 2 " in err
        and len(err.splitlines()) == 1
    )
    assert complete_steps(root) == [2, 4, 6] and (root / "latest").read_text() == "step_6\n"


def drop_from_manifest(step_dir: Path, name: str) -> None:
    """As a save to a node-local root wrote COMPLETE before such saves were refused: the manifest
    listed the files rank 0's node could see, not another node's shard."""
    record = json.loads((step_dir / "COMPLETE").read_text())
    del record["files"][name]
    (step_dir / "COMPLETE").write_text(json.dumps(record, indent=1) + "\n")


def test_a_shard_the_metadata_names_but_the_manifest_does_not_list_is_checked(tmp_path, capsys):
    """A half-saved checkpoint whose manifest left another node's shard out verified ok: only the
    manifest's files were checked. The shards DCP's .metadata names are checked too."""
    path = save(CheckpointManager(tmp_path, keep_last=2), 1)
    shard = next(path.glob("*.distcp"))
    size = shard.stat().st_size
    drop_from_manifest(path, shard.name)
    for checksums in (False, True):  # present and whole: sound
        assert verify(path, checksums, named_shards=True) is None
    shard.write_bytes(shard.read_bytes()[:100])
    problem = f"{shard} is 100 bytes, its .metadata places {size} in it (truncated)"
    assert verify(path, named_shards=True) == problem
    shard.unlink()
    problem = f"{shard} is missing: its .metadata names it, its manifest does not"
    assert verify(path, named_shards=True).startswith(problem)
    assert verify(path) is None  # a resume's check: loading finds it (test_checkpoint_ranks)
    assert main(["checkpoint", "verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"step_1: DAMAGED: {shard} is missing" in out and len(out.strip().splitlines()) == 1


def test_a_metadata_this_cannot_read_checks_nothing_more_and_runs_nothing(tmp_path):
    """A .metadata that is no pickle of DCP's Metadata (another format): the manifest's checks
    alone. One whose pickle names a function to call is never run."""
    path = save(CheckpointManager(tmp_path, keep_last=2), 1)
    marker = tmp_path / "ran"
    for text in (b"not a pickle", pickle.dumps(RunsOnLoad(marker))):
        (path / ".metadata").write_bytes(text)
        record = json.loads((path / "COMPLETE").read_text())
        record["files"][".metadata"] = {"bytes": len(text), "crc32": None}
        (path / "COMPLETE").write_text(json.dumps(record))
        assert verify(path, checksums=True, named_shards=True) is None
    assert not marker.exists()


class RunsOnLoad:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_resume_does_not_parse_the_metadata_for_named_shards_and_verify_does(tmp_path, monkeypatch, capsys):
    """Rank 0 parsed `.metadata` a second time at every resume (about 50 us an entry, a minute at 70B
    on 512 ranks) before the first verdict gather, though loading finds a missing shard anyway. Only
    `gptrain checkpoint verify` looks for the shards the manifest does not list."""
    from gptrain.checkpoint import integrity

    manager = CheckpointManager(tmp_path, keep_last=2)
    save(manager, 1)
    parsed = []
    real = integrity.shard_extents
    monkeypatch.setattr(integrity, "shard_extents", lambda path: parsed.append(path.name) or real(path))
    state = {"model": {"w": torch.zeros(64, 64)}}
    assert manager.load_newest_good(lambda saved: state, lambda extra: None, lambda line: None) is not None
    assert torch.equal(state["model"]["w"], torch.full((64, 64), 1.0)) and parsed == []
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0 and parsed == [".metadata"]
    assert main(["checkpoint", "verify", "--sizes-only", str(tmp_path)]) == 0
    assert parsed == [".metadata"] * 2
    metadata = tmp_path / "step_1" / ".metadata"
    flip_a_byte(metadata)  # named as the change it is, before anything is read from it
    assert main(["checkpoint", "verify", "--sizes-only", str(tmp_path)]) == 1 and len(parsed) == 2
    assert f"step_1: DAMAGED: {metadata} has CRC-32 " in capsys.readouterr().out
    flip_a_byte(metadata)
    save(manager, 2)  # its shard missing, the manifest not listing it: loading finds it
    shard = next((tmp_path / "step_2").glob("*.distcp"))
    drop_from_manifest(tmp_path / "step_2", shard.name)
    shard.unlink()
    warnings = []
    loaded, _ = manager.load_newest_good(lambda saved: state, lambda extra: None, warnings.append)
    assert loaded.name == "step_1" and warnings[0].startswith("checkpoint step_2 is damaged: ")
    assert parsed == [".metadata"] * 2


def rewrite_metadata(step_dir: Path, data: bytes) -> None:
    """`.metadata` replaced by `data`, the manifest recording its size and CRC-32: a .metadata that
    passes its own checks, as one DCP wrote wrong would."""
    (step_dir / ".metadata").write_bytes(data)
    record = json.loads((step_dir / "COMPLETE").read_text())
    record["files"][".metadata"] = {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    (step_dir / "COMPLETE").write_text(json.dumps(record))


class Shaped:
    """Pickles as a class with the state given: a stand-in for DCP's dataclasses, well or ill formed."""

    def __init__(self, state):
        self.shaped = state

    def __reduce__(self):
        return (Shaped, (None,), self.shaped)


def test_a_metadata_with_bad_names_or_shapes_is_not_understood_never_a_traceback(tmp_path, capsys):
    """A .metadata with a NUL byte in a shard name (stat raised ValueError), a name too long for a file
    (OSError, read as UNREADABLE) or states of the wrong shape (TypeError) gave a traceback: each is
    not understood, and `verify` says one line."""
    from gptrain.checkpoint.dcp_metadata import shard_extents

    path = save(CheckpointManager(tmp_path, keep_last=2), 1)
    shard = next(path.glob("*.distcp")).name
    drop_from_manifest(path, shard)

    def metadata(name: object, offset: object = 0, state: object = None) -> bytes:
        info = Shaped(state if state is not None else {"relative_path": name, "offset": offset, "length": 1})
        return pickle.dumps(Shaped({"storage_data": {"key": info}}))

    rewrite_metadata(path, metadata(shard))
    assert shard_extents(path / ".metadata") == {shard: 1}  # well formed: read
    for bad in (
        metadata(shard[:-1] + "\x00"),
        metadata("a" * 256),
        metadata("é" * 128),  # 256 bytes
        metadata("sub/" + shard),
        metadata(shard, state=(["not", "a", "dict"], None)),
        metadata(shard, state=(None, 7)),
        pickle.dumps(Shaped((1, 2))),
        pickle.dumps(Shaped({"storage_data": {"key": Shaped(([("relative_path", shard)], None))}})),
    ):
        rewrite_metadata(path, bad)
        assert shard_extents(path / ".metadata") is None
        assert main(["checkpoint", "verify", str(path)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("step_1: ok (") and len(out.splitlines()) == 1


def test_a_metadata_whose_pickle_claims_more_memory_than_its_size_is_refused_before_allocating(tmp_path):
    """The unpickler sized its memo by the index a PUT names: 12 bytes holding LONG_BINPUT 0x4000000
    took 1 GB (random bit flips of a real .metadata: 22 GB, killed). A memo index past the entries
    stored, or a length past the end of the file, is not understood before anything is allocated."""
    import struct
    import tracemalloc

    from gptrain.checkpoint.dcp_metadata import shard_extents

    entries = b"\x80\x02}q\x00"  # PROTO 2, EMPTY_DICT, BINPUT 0: a pickler's first memo entry
    cases = {
        "memo": b"\x80\x02N" + b"r" + struct.pack("<I", 0x4000000) + b"\x85N0.",  # LONG_BINPUT
        "memo past the entries stored": entries + b"r" + struct.pack("<I", 2) + b".",
        "bytes past the end": b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"\x00.",  # BINBYTES8
        "frame past the end": b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N.",
    }
    assert len(cases["memo"]) == 12
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        tracemalloc.start()
        try:
            assert shard_extents(tmp_path / name) is None, name
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, (name, peak)  # the file is bytes; 1 MB holds the scan many times over
    (tmp_path / "ok").write_bytes(entries + b"h\x00.")  # BINGET 0 of the entry stored: a pickler's
    assert shard_extents(tmp_path / "ok") is None  # read, and not a DCP Metadata


def test_eval_on_a_run_whose_retention_removes_the_newest_while_it_is_checked_takes_the_new_newest(
    tmp_path, monkeypatch, capsys
):
    """eval, generate and export on a run still training: its next save (step_8) removed step_6, the
    newest, while its files were checked. step_6 was called damaged and step_4 taken, with a warning
    naming step_6 as damaged; the run's newest (step_8) is taken now, and nothing is called damaged."""
    import shutil

    from gptrain.trained import load

    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep_last=None)
    for step in (2, 4, 6):
        save(manager, step)
    checked, real_verify = [], load.verify

    def retention_meanwhile(step_dir, *args, **kwargs):
        checked.append(step_dir.name)
        if step_dir.name == "step_6":  # the run saves step_8, then its retention removes step_6
            save(manager, 8)
            (step_dir / "COMPLETE").unlink()
            shutil.rmtree(step_dir)
        return real_verify(step_dir, *args, **kwargs)

    monkeypatch.setattr(load, "verify", retention_meanwhile)
    assert load.resolve_checkpoint(tmp_path) == root / "step_8"
    assert checked == ["step_6", "step_8"] and "damaged" not in capsys.readouterr().err
