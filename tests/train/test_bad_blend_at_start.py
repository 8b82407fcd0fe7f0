"""`gptrain train` reads the data_prefix before it starts anything: a blend the datasets' builder
refuses, or a prefix without its .bin/.idx, was found only after the process group, the run
directory, the tokenizer, the model and its optimizer were set up (minutes on a large model)."""

import pytest
from train_e2e_helpers import tiny_config

from gptrain.errors import DataError
from gptrain.train import loop, tokenizer_setup

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("[-1,{d}/a,1,{d}/a]", r"^model\.data\.data_prefix: data prefix entry 1: weight -1 of .*/a must be"),
        ("[1,{d}/a,nan,{d}/a]", r"^model\.data\.data_prefix: data prefix entry 3: weight nan"),
        ("[0,{d}/a,1,{d}/a]", r"^model\.data\.data_prefix: data prefix entry 1: weight 0 of .*/a must be positive: Megatron-core"),
        ("[1,{d}/a,2]", r"^model\.data\.data_prefix: data prefix list .* unweighted form"),
        ("[1,{d}/a,x,{d}/a]", r"^model\.data\.data_prefix: data prefix entry 3 \('x'\) is not a weight"),
        ("[1,{d}/a,1,{d}/gone]", r"^model\.data\.data_prefix: .*/gone\.bin/\.idx not found"),
        ("{{train: {d}/a, validation: [-2,{d}/a]}}", r"^model\.data\.data_prefix\.validation: data prefix entry 1"),
        ("{{train: {d}/a, test: {d}/gone}}", r"^model\.data\.data_prefix\.test: .*/gone\.bin/\.idx not found"),
    ],
)  # fmt: skip
def test_a_bad_blend_is_refused_before_the_run_starts_anything(tmp_path, monkeypatch, prefix, message):
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a{suffix}").write_bytes(b"")

    def too_early(*args, **kwargs):
        raise AssertionError("the tokenizer was built before the data_prefix was read")

    monkeypatch.setattr(tokenizer_setup, "build_tokenizer", too_early)
    log_dir = tmp_path / "run"
    cfg = tiny_config(
        log_dir,
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix.format(d=tmp_path)}",
    )
    with pytest.raises(DataError, match=message):
        loop.train(cfg)
    assert not log_dir.exists()  # no run directory claimed, no log of a run that never started


class Started(Exception):
    """Raised where the run builds its tokenizer: the data_prefix check before it let the run start."""


@pytest.mark.parametrize(
    ("limits", "prefix", "message"),
    [
        ("trainer.limit_test_batches=0", "{{train: {d}/a, validation: {d}/a, test: {d}/gone}}", None),
        ("trainer.limit_val_batches=0", "{{train: {d}/a, validation: {d}/gone}}", None),
        ("trainer.limit_test_batches=1", "{{train: {d}/a, test: {d}/gone}}", r"^model\.data\.data_prefix\.test: .*/gone\.bin"),
        ("trainer.limit_test_batches=0", "{{train: {d}/a, test: [1,{d}/gone,0,{d}/gone]}}", r"\.test: data prefix entry 3"),
    ],
)  # fmt: skip
def test_a_split_asked_for_no_samples_needs_no_files(tmp_path, monkeypatch, limits, prefix, message):
    """Training builds no split asked for 0 samples (limit_test_batches=0), so a per-split prefix of
    it need not exist, as before the check at start (0e5f920) refused it; its weights are still read."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a{suffix}").write_bytes(b"")

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(tokenizer_setup, "build_tokenizer", started)
    cfg = tiny_config(
        tmp_path / "run",
        "model.data.data_impl=mmap",
        limits,
        f"model.data.data_prefix={prefix.format(d=tmp_path)}",
    )
    with pytest.raises(Started if message is None else DataError, match=message):
        loop.train(cfg)
