"""Work per rank that must not grow with the world: `.metadata` read once per resume, each file of a
step directory stat'ed once between the ranks, no listing for a size no one logs, old checkpoints
removed off the training's path, and no socket to every peer for background saves."""

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from gptrain.checkpoint import manager as manager_module
from gptrain.checkpoint import reader as reader_module
from gptrain.checkpoint.integrity import COMPLETE, complete_record, complete_steps
from gptrain.checkpoint.manager import CheckpointManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from gloo_ranks import free_port
from train_e2e_helpers import MOCK, run_recording, tiny_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state_for(value: float) -> dict:
    return {"model": {"w": torch.full((3, 2), value)}, "train": {"step": int(value)}}


def count_metadata_reads(monkeypatch) -> Counter:
    """Reads (and unpickles) of a `.metadata` file, by DCP or by gptrain."""
    reads: Counter = Counter()
    real = FileSystemReader.read_metadata

    def counted(self, *args, **kwargs):
        reads[Path(str(self.path)).name] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemReader, "read_metadata", counted)
    return reads


def test_a_resume_reads_the_checkpoint_metadata_once(tmp_path, monkeypatch):
    """It was 5 times on every rank (saved keys, fit check, sections, dcp.load, the loop's log
    line): ~50 s each for a 20B model on 1024 ranks."""
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "exp_manager.resume_if_exists=true"))
    assert code == 0
    reads = count_metadata_reads(monkeypatch)
    longer = tiny_config(tmp_path, *MOCK, "exp_manager.resume_if_exists=true", "trainer.max_steps=7")
    code, losses = run_recording(monkeypatch, longer)
    assert code == 0 and sorted(losses) == [7]
    assert reads == {"step_6": 1}


def test_loading_weights_reads_the_checkpoint_metadata_once(tmp_path, monkeypatch):
    """generate, eval and export load weights: the fit check and DCP's load each read it before."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from gptrain.trained.load import load_weights

    saved = torch.nn.Linear(3, 2)
    path = CheckpointManager(tmp_path, keep_last=1).save(1, {"model": get_model_state_dict(saved)}, {})
    model = torch.nn.Linear(3, 2)
    reads = count_metadata_reads(monkeypatch)
    load_weights(model, path)
    assert reads == {"step_1": 1}
    assert torch.equal(model.weight, saved.weight) and torch.equal(model.bias, saved.bias)


def fake_step_dir(path: Path, ranks: int) -> list[str]:
    """A step directory of `ranks` ranks' files (3 each, .metadata) with its COMPLETE manifest."""
    path.mkdir(parents=True)
    (path / ".metadata").write_text("m")
    for rank in range(ranks):
        for name in (f"__{rank}_0.distcp", f"rank_{rank}.pt", f".checksums.rank{rank}.json"):
            (path / name).write_text(name)
    (path / COMPLETE).write_text(complete_record(1, path))
    return sorted(p.name for p in path.iterdir() if p.name != COMPLETE)


def stats_by_name(monkeypatch, directory: Path) -> Counter:
    """os.stat calls (Path.stat, is_file, exists...) on files of `directory`, by file name."""
    import os

    seen: Counter = Counter()
    real = os.stat

    def counted(path, *args, **kwargs):
        if Path(path).parent == directory:
            seen[Path(path).name] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counted)
    return seen


def test_resume_stats_each_file_once_between_the_ranks(tmp_path, monkeypatch):
    """Every rank stat'ed every file (3 x world + 2 of them): world^2 stats, 3 million at 1024 ranks.
    Now each rank takes its share, and the verdicts are agreed."""
    world = 4
    path = tmp_path / "step_1"
    names = fake_step_dir(path, world)
    monkeypatch.setattr(reader_module, "world_size", lambda: world)
    stats = stats_by_name(monkeypatch, path)
    for rank in range(world):
        verdict = CheckpointManager(tmp_path, keep_last=1, rank=rank)._verify_and_load(
            path, lambda saved: {}, lambda state: None
        )
        assert isinstance(verdict, str)  # the fake has no loadable data; its files all verified
        assert "does not load" in verdict
    checked = Counter({name: count for name, count in stats.items() if name in names})
    rank_files = Counter(f"rank_{rank}.pt" for rank in range(world))  # read_rank_state's own look
    assert checked - rank_files == Counter(names)


def test_verify_checks_only_its_share_and_the_cli_checks_all(tmp_path):
    from gptrain.checkpoint.integrity import verify, verify_share

    path = tmp_path / "step_1"
    names = fake_step_dir(path, 3)
    (path / names[4]).write_text("longer than it was")
    owner = 4 % 2
    assert verify_share(path, owner, 2).startswith(f"{path / names[4]} is ")
    assert verify_share(path, 1 - owner, 2) is None
    assert verify(path).startswith(f"{path / names[4]} is ")  # `gptrain checkpoint verify`: every file


def listings_of(monkeypatch, directory: Path) -> list[str]:
    import os

    listed: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def scandir(path=".", *args):
        if Path(path).parent == directory.parent and Path(path).name.startswith("step_"):
            listed.append(Path(path).name)
        return real_scandir(path, *args)

    def listdir(path=".", *args):
        if Path(path).parent == directory.parent and Path(path).name.startswith("step_"):
            listed.append(Path(path).name)
        return real_listdir(path, *args)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    return listed


def test_a_rank_that_does_not_log_the_size_never_lists_the_step_directory(tmp_path, monkeypatch):
    """Every rank listed and stat'ed the new step directory after every save for the size in one
    log line: 6 million stats per save at 1024 ranks. Rank 0 takes it from the manifest it wrote."""
    lines: list[str] = []
    other = CheckpointManager(
        tmp_path / "a", keep_last=1, rank=1, on_saved=lambda r: lines.append(r.describe(False))
    )
    listed = listings_of(monkeypatch, tmp_path / "a" / "step_1")
    other.save(1, state_for(1.0), {})
    assert listed == [] and lines == [
        "saved checkpoint step_1: training stalled " + lines[0].split("stalled ")[1]
    ]
    reports = []
    first = CheckpointManager(tmp_path / "b", keep_last=1, rank=0, on_saved=reports.append)
    listed = listings_of(monkeypatch, tmp_path / "b" / "step_1")
    first.save(1, state_for(1.0), {})
    step_dir = tmp_path / "b" / "step_1"
    listed_for_the_manifest = len(listed)
    assert reports[0].bytes == sum(f.stat().st_size for f in step_dir.iterdir())
    assert len(listed) == listed_for_the_manifest + 1  # the test's own listing: none for the size


def test_old_checkpoints_are_removed_off_the_training_path(tmp_path, monkeypatch):
    """Rank 0 removed old step directories (~3,000 files each at 1024 ranks) while every rank waited.
    The save returns at once; a doomed one is no longer complete; close() waits for the removal."""
    release = threading.Event()
    real_rmtree = manager_module.shutil.rmtree

    def slow_rmtree(path, *args, **kwargs):
        release.wait(20)
        real_rmtree(path, *args, **kwargs)

    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, state_for(1.0), {})
    monkeypatch.setattr(manager_module.shutil, "rmtree", slow_rmtree)
    started = time.perf_counter()
    manager.save(2, state_for(2.0), {})
    assert time.perf_counter() - started < 10
    assert complete_steps(tmp_path) == [2] and (tmp_path / "step_1").exists()
    release.set()
    manager.close()
    assert not (tmp_path / "step_1").exists()


@pytest.mark.distributed
def test_background_saves_do_not_connect_every_rank_to_every_other(tmp_path):
    """A full-mesh gloo group holds world + 3 descriptors in every process (EMFILE at ~1,000 ranks
    under nofile=1024). Lazily connected, only the coordinator (rank 0) reaches every rank."""
    port = free_port()
    worker = Path(__file__).with_name("gloo_fds_worker.py")
    done = subprocess.run(
        [sys.executable, str(worker), str(port)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    for created, saved, eager, lazy_left_set in counts:
        assert eager == 4 + 3  # world + 3, as measured: a socket to every peer at creation
        assert created < eager  # none yet: peers connect on first use
        assert saved <= eager  # at 4 ranks the coordinator and the ring reach everyone anyway
        assert not lazy_left_set  # lazy for this group only


@pytest.mark.parametrize("async_save", [False, True])
def test_later_saves_reuse_the_first_saves_plan_and_still_load(tmp_path, monkeypatch, async_save):
    """Rank 0 deduplicated every rank's ~1,000 items at every save (1 s at 256 ranks). A state with
    the same items is planned once per manager; each later save still writes and loads its own values,
    and a second manager in the same process plans its own state."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import SavePlanner

    planned: list[int] = []
    real = DefaultSavePlanner._create_global_plan

    def counted(self, all_plans):
        planned.append(len(all_plans[0].items))
        return real(self, all_plans)

    monkeypatch.setattr(DefaultSavePlanner, "_create_global_plan", counted)
    manager = CheckpointManager(tmp_path / "a", keep_last=None, async_save=async_save)
    for step in (1, 2, 3):
        manager.save(step, state_for(float(step)), {"rank": 0})
    manager.close()
    assert len(planned) == 1
    other = CheckpointManager(tmp_path / "b", keep_last=None)
    other.save(1, {"model": {"w": torch.zeros(5), "b": torch.ones(2)}, "train": {"step": 1}}, {})
    other.close()
    assert len(planned) == 2 and planned[1] != planned[0]
    for key in (manager._plan_key, other._plan_key):  # closed: dropped
        assert key not in SavePlanner._cached_metadata and key not in SavePlanner._cached_save_plan
    for step in (1, 3):
        loaded = {"model": {"w": torch.zeros(3, 2)}, "train": {"step": 0}}
        manager.load(tmp_path / "a" / f"step_{step}", loaded, lambda _: None)
        assert torch.equal(loaded["model"]["w"], torch.full((3, 2), float(step)))
        assert loaded["train"]["step"] == step
