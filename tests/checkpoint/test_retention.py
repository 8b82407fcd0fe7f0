"""Retention as Lightning's ModelCheckpoint: the save_top_k best by the monitored metric, plus the newest."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptrain.checkpoint.integrity import COMPLETE, complete_steps, verify
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.checkpoint.retention import MODES, Ranked, recorded_metric, removals

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def expected_kept(checkpoints: list[Ranked], top_k: int, mode: str) -> set[int]:
    """The reference: newest first, then a stable sort by value (so a tie keeps the newer first);
    numbers, then no metric, then NaN; the top_k of that order and the newest."""
    by_recency = sorted(checkpoints, key=lambda c: c.step, reverse=True)
    numbers = [c for c in by_recency if c.metric is not None and not math.isnan(c.metric)]
    numbers = sorted(numbers, key=lambda c: c.metric, reverse=mode == "max")
    missing = [c for c in by_recency if c.metric is None]
    nans = [c for c in by_recency if c.metric is not None and math.isnan(c.metric)]
    order = numbers + missing + nans
    return {c.step for c in order[:top_k]} | {by_recency[0].step}


metrics = st.one_of(
    st.none(), st.just(math.nan), st.sampled_from([2.5, 3.0, 3.12]), st.floats(-10, 10), st.just(math.inf)
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(metrics, min_size=1, max_size=12),
    top_k=st.integers(0, 6),
    mode=st.sampled_from(["min", "max"]),
)
def test_removals_keep_the_top_k_best_and_the_newest(values, top_k, mode):
    checkpoints = [Ranked(100 * (i + 1), value) for i, value in enumerate(values)]
    removed = removals(checkpoints, top_k, mode, "val_loss")
    kept = {c.step for c in checkpoints} - {r.step for r in removed}
    assert kept == expected_kept(checkpoints, top_k, mode)
    assert [r.step for r in removed] == sorted(r.step for r in removed)


def test_minus_one_keeps_every_checkpoint_and_no_monitor_keeps_the_newest():
    checkpoints = [Ranked(step, float(step)) for step in (1, 2, 3, 4)]
    assert removals(checkpoints, -1, "min", "val_loss") == []
    assert [r.step for r in removals(checkpoints, 2, "min", None)] == [1, 2]
    assert removals(checkpoints, 2, "min", None)[0].reason == "not among the 2 newest"


def test_each_removal_says_why():
    checkpoints = [
        Ranked(400, 3.12),
        Ranked(500, None),
        Ranked(600, math.nan),
        Ranked(700, 2.0),
        Ranked(800, 9.0),
    ]
    reasons = {r.step: r.reason for r in removals(checkpoints, 1, "min", "val_loss")}
    assert reasons == {
        400: "val_loss 3.12, not among the 1 best",
        500: "no val_loss recorded, not among the 1 best",
        600: "val_loss nan, not among the 1 best",
    }
    only_newest = removals(checkpoints, 0, "min", "val_loss")
    assert [r.step for r in only_newest] == [400, 500, 600, 700]
    assert only_newest[0].reason == "val_loss 3.12, save_top_k=0 keeps only the newest"


def test_top_k_zero_without_a_monitor_keeps_only_the_newest_saying_so():
    removed = removals([Ranked(step, None) for step in (1, 2, 3)], 0, "min", None)
    assert [(r.step, r.reason) for r in removed] == [
        (1, "save_top_k=0 keeps only the newest"),
        (2, "save_top_k=0 keeps only the newest"),
    ]


@pytest.fixture
def recorded_losses():
    """Each save's val_loss, which `save` hands to the manager for its COMPLETE marker."""
    return {}


def save(manager, step, losses=None):
    """A save recording `losses[step]` as its val_loss (none where `losses` has no entry for it)."""
    metrics = {"val_loss": losses[step]} if losses and step in losses else None
    manager.save(
        step, {"model": {"w": torch.full((2,), float(step))}}, {"rng": torch.tensor([step])}, metrics=metrics
    )


def test_a_run_keeps_its_best_checkpoints_by_val_loss_and_its_newest(tmp_path, recorded_losses):
    recorded_losses.update({1: 3.0, 2: 2.5, 3: 2.8, 4: math.nan, 5: 2.6, 6: 2.9})
    lines = []
    manager = CheckpointManager(
        tmp_path, keep_last=2, monitor="val_loss", mode="min", on_saved=lambda r: lines.append(r.describe())
    )
    for step in range(1, 7):
        save(manager, step, recorded_losses)
    manager.close()
    checkpoints = [Ranked(step, loss) for step, loss in recorded_losses.items()]
    assert set(complete_steps(tmp_path)) == expected_kept(checkpoints, 2, "min") == {2, 5, 6}
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_2", "step_5", "step_6"]
    assert recorded_metric(tmp_path / "step_2", "val_loss") == 2.5
    assert lines[2].endswith("; removed step_1 (val_loss 3, not among the 2 best)")
    assert lines[4].endswith(
        "; removed step_3 (val_loss 2.8, not among the 2 best); removed step_4 (val_loss nan, not among the 2 best)"
    )
    assert "removed" not in lines[3] + lines[5]


def test_mode_max_keeps_the_highest(tmp_path, recorded_losses):
    recorded_losses.update({1: 0.9, 2: 0.1, 3: 0.5})
    manager = CheckpointManager(tmp_path, keep_last=1, monitor="val_loss", mode="max")
    for step in (1, 2, 3):
        save(manager, step, recorded_losses)
    manager.close()
    assert complete_steps(tmp_path) == [1, 3]


def test_a_resumed_run_ranks_the_checkpoints_saved_before_it(tmp_path, recorded_losses):
    """Checkpoints of an earlier attempt count by their recorded metric; one from before metrics were
    recorded ranks after every one with a metric; moved-aside directories never count or go."""
    save(CheckpointManager(tmp_path, keep_last=-1), 1, recorded_losses)  # no metric: as saved before today
    recorded_losses.update({2: 1.0, 3: 1.5})
    first = CheckpointManager(tmp_path, keep_last=-1, monitor="val_loss")
    for step in (2, 3):
        save(first, step, recorded_losses)
    first.close()
    aside = tmp_path / "step_2.damaged-20261129T010000"
    (tmp_path / "step_2").rename(aside)
    rewound = tmp_path / "step_9.rewound-20261129T010000"
    rewound.mkdir()
    (rewound / COMPLETE).write_text(json.dumps({"step": 9, "metrics": {"val_loss": 0.1}}))

    recorded_losses.update({4: 3.0, 5: 5.0})
    resumed = CheckpointManager(tmp_path, keep_last=1, monitor="val_loss")
    save(resumed, 4, recorded_losses)
    save(resumed, 5, recorded_losses)
    resumed.close()
    assert complete_steps(tmp_path) == [3, 5]  # 3 the best (1.5; 1 has none, 2 moved aside), 5 the newest
    assert aside.is_dir() and rewound.is_dir()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_records_its_metrics_and_a_nan_reads_back_as_nan(tmp_path, async_save):
    """COMPLETE keeps what the save was given (json writes NaN as NaN, and reads it back); a save
    given none records none, as one from before metrics were recorded."""
    manager = CheckpointManager(tmp_path, keep_last=-1, async_save=async_save, pinned_staging=False)
    save(manager, 1, {1: 2.75})
    save(manager, 2, {2: math.nan})
    save(manager, 3)
    manager.close()
    assert json.loads((tmp_path / "step_1" / COMPLETE).read_text())["metrics"] == {"val_loss": 2.75}
    assert recorded_metric(tmp_path / "step_1", "val_loss") == 2.75
    assert math.isnan(recorded_metric(tmp_path / "step_2", "val_loss"))
    assert "metrics" not in json.loads((tmp_path / "step_3" / COMPLETE).read_text())


@pytest.mark.parametrize("monitor", [None, "val_loss"])
def test_save_top_k_zero_keeps_only_the_newest_checkpoint_and_a_resume_finds_it(
    tmp_path, recorded_losses, monitor
):
    """NeMo's save_top_k=0 (Lightning: no best checkpoint, only last.ckpt): the manager took 0 as 'keep
    every one'. Each save now removes the ones before it, however good their loss, an earlier attempt's
    too, and the run resumes from the one it keeps."""
    recorded_losses.update({1: 1.0, 2: 5.0, 3: 9.0})
    save(CheckpointManager(tmp_path, keep_last=-1), 1, recorded_losses)  # an attempt that kept every one
    lines = []
    manager = CheckpointManager(
        tmp_path, keep_last=0, monitor=monitor, on_saved=lambda r: lines.append(r.describe())
    )
    save(manager, 2, recorded_losses)
    assert complete_steps(tmp_path) == [2]
    save(manager, 3, recorded_losses)
    manager.close()
    assert complete_steps(tmp_path) == [3]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_3"]
    kept = "save_top_k=0 keeps only the newest"
    assert lines[1].endswith(f"; removed step_2 ({'val_loss 5, ' if monitor else ''}{kept})")
    assert resume(tmp_path).resumed == tmp_path / "step_3"


def test_space_warning_under_save_top_k_zero_counts_the_newest_and_the_next(tmp_path, monkeypatch):
    """Keeping only the newest, the next save is written beside it before it goes: two checkpoints."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100e9, 50e9, 25e9))
    assert CheckpointManager(tmp_path, keep_last=0, monitor="val_loss").space_warning(10_000_000_000) is None
    warning = CheckpointManager(tmp_path, keep_last=0).space_warning(15_000_000_000)
    assert warning.endswith(
        "2 checkpoints of about 15.0 GB (the newest and the next; save_top_k=0 keeps only the newest) need "
        "30.0 GB: a save will fail when the disk fills; free space"
    )


def resume(root, rank=0):
    """A manager that resumed the newest checkpoint under `root`, as a run's resume does."""
    manager = CheckpointManager(root, keep_last=-1, rank=rank)
    manager.load_newest_good(lambda saved: {"model": {"w": torch.zeros(2)}}, lambda state: None, print)
    return manager


def test_the_loss_a_stop_left_due_goes_only_into_the_resumed_checkpoint_without_one(tmp_path):
    """The resumed run records the validation of its first iteration in the COMPLETE of the checkpoint
    it resumed from, if that is the same iteration's and records none; every other marker, and a marker
    not as gptrain wrote it, stays as it was, and only rank 0 writes."""
    save(CheckpointManager(tmp_path, keep_last=-1), 1, {1: 2.0})
    save(CheckpointManager(tmp_path, keep_last=-1), 2)  # a stop's save, before its validation
    markers = {step: (tmp_path / f"step_{step}" / COMPLETE).read_text() for step in (1, 2)}
    loss = {"val_loss": 0.5}

    started = CheckpointManager(tmp_path, keep_last=-1)  # resumed nothing (a start, or from another run)
    assert started.record_metrics_of_resumed(2, loss) is None
    assert resume(tmp_path, rank=1).record_metrics_of_resumed(2, loss) is None
    assert resume(tmp_path).record_metrics_of_resumed(3, loss) is None  # another iteration's validation
    assert {step: (tmp_path / f"step_{step}" / COMPLETE).read_text() for step in (1, 2)} == markers

    edited = json.dumps(json.loads(markers[2]), indent=2)  # reformatted by hand: left alone
    (tmp_path / "step_2" / COMPLETE).write_text(edited)
    assert resume(tmp_path).record_metrics_of_resumed(2, loss) is None
    assert (tmp_path / "step_2" / COMPLETE).read_text() == edited
    (tmp_path / "step_2" / COMPLETE).write_text(markers[2])

    assert resume(tmp_path).record_metrics_of_resumed(2, loss) == tmp_path / "step_2"
    assert (
        recorded_metric(tmp_path / "step_2", "val_loss") == 0.5
        and verify(tmp_path / "step_2", checksums=True) is None
    )
    assert resume(tmp_path).record_metrics_of_resumed(2, {"val_loss": 0.1}) is None  # recorded already
    assert recorded_metric(tmp_path / "step_2", "val_loss") == 0.5
    assert not list(tmp_path.glob("step_2/*.tmp"))

    (tmp_path / "step_2" / COMPLETE).unlink()  # step_1, with a loss of its own, is resumed now
    assert resume(tmp_path).record_metrics_of_resumed(1, loss) is None
    assert (tmp_path / "step_1" / COMPLETE).read_text() == markers[1]


@pytest.mark.parametrize(
    "text", ["not json", '{"step": 1}', '{"metrics": {"val_loss": "2.5"}}', '{"metrics": {"val_loss": true}}']
)
def test_a_marker_without_a_readable_number_has_no_metric(tmp_path, text):
    (tmp_path / COMPLETE).write_text(text)
    assert recorded_metric(tmp_path, "val_loss") is None


def test_space_warning_counts_the_newest_beside_the_best_when_ranking_by_a_metric(tmp_path, monkeypatch):
    """Ranked by val_loss the newest may be none of the 2 best: with the next save, 4 on disk."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100e9, 50e9, 35e9))
    assert CheckpointManager(tmp_path, keep_last=2).space_warning(10_000_000_000) is None
    warning = CheckpointManager(tmp_path, keep_last=2, monitor="val_loss").space_warning(10_000_000_000)
    assert "4 checkpoints of about 10.0 GB (save_top_k + 2) need 40.0 GB" in warning


@pytest.mark.parametrize(("mode", "kept"), [("max", [4, 5]), ("min", [1, 2, 5])])
def test_monitor_step_ranks_by_the_iteration_as_lightning_does(tmp_path, mode, kept):
    """Lightning's ModelCheckpoint offers `step` to every save (its global step): `monitor: step`
    with `mode: max` is a NeMo file's way to keep the newest N. It was refused at load."""
    from gptrain.config import load_training_config

    callback = "exp_manager.checkpoint_callback_params"
    cfg = load_training_config("gpt3/126m", [f"{callback}.monitor=step", f"{callback}.mode={mode}"])
    assert cfg.exp_manager.checkpoint_callback_params.monitor == "step"
    manager = CheckpointManager(tmp_path, keep_last=2, monitor="step", mode=mode)
    for step in range(1, 6):
        save(manager, step)  # no val_loss recorded: the step ranks them
    manager.close()
    assert recorded_metric(tmp_path / "step_5", "step") == 5.0
    assert complete_steps(tmp_path) == kept  # min: Lightning's 2 lowest (never replaced), and the newest


def test_a_removal_by_step_names_the_step_as_an_integer():
    """`monitor: step` said `step 1.2e+05, not among the 2 best` (the metric's 4 significant digits)."""
    steps = [Ranked(step, float(step)) for step in (120000, 122000, 124000, 126000)]
    reasons = [r.reason for r in removals(steps, 2, "max", "step")]
    assert reasons == ["step 120000, not among the 2 best", "step 122000, not among the 2 best"]
    reasons = [r.reason for r in removals(steps, 0, "min", "step")]
    assert reasons[0] == "step 120000, save_top_k=0 keeps only the newest"


def test_space_warning_by_step_max_counts_the_newest_among_the_best(tmp_path, monkeypatch):
    """`monitor: step, mode: max` keeps the newest save_top_k, the newest among them: it counted
    save_top_k + 2 checkpoints (as a metric whose best may all be older), a warning 10 GB too early."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    free = {"bytes": 35e9}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100e9, 50e9, free["bytes"]))
    by_step = {mode: CheckpointManager(tmp_path, keep_last=2, monitor="step", mode=mode) for mode in MODES}
    assert by_step["max"].space_warning(10_000_000_000) is None  # 3 x 10 GB fit in 35 GB
    warning = by_step["min"].space_warning(10_000_000_000)  # the oldest are the best: the newest is extra
    assert "4 checkpoints of about 10.0 GB (save_top_k + 2) need 40.0 GB" in warning
    free["bytes"] = 25e9
    warning = by_step["max"].space_warning(10_000_000_000)
    assert "3 checkpoints of about 10.0 GB (save_top_k + 1) need 30.0 GB" in warning
