"""Megatron's --mid-level-dataset-surplus: each blended dataset builds ceil(ceil(size * w) * (1 + surplus))
samples. A run that raised it (Megatron's own advice when a blend asks a dataset for more samples than it
holds) gets other child indices, so gptrain takes the same value or it trains on other samples."""

from __future__ import annotations

import math
import shlex

import pytest
from gpt_data_helpers import write_dataset

from gptrain.config import load_training_config
from gptrain.data.blended import BlendedDataset
from gptrain.data.builder import MID_LEVEL_SURPLUS, build_gpt_datasets
from gptrain.errors import ConfigError
from gptrain.megatron.translate import translate

FLAGS = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    " --train-iters 4 --data-path 1 /d/a_text_document 3 /d/b_text_document --eval-iters 2 --split 98,2,0"
)
ENV = {"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}


def megatron_request(size: int, weight: float, surplus: float) -> int:
    """_get_size_per_split_per_dataset of Megatron's builder, restated."""
    return int(math.ceil(math.ceil(size * weight) * (1 + surplus)))


@pytest.mark.parametrize("surplus", [None, 0.0, 0.05, 0.5])
def test_each_blended_dataset_is_built_for_its_share_plus_the_surplus(tmp_path, surplus):
    a = write_dataset(tmp_path / "a", [9, 4, 17, 6, 11, 3] * 4)
    b = write_dataset(tmp_path / "b", [5, 13, 8] * 6)
    kwargs = {} if surplus is None else {"surplus": surplus}
    train, _, _ = build_gpt_datasets([1, a, 3, b], "1", 4, 7, (90, 0, 0), str(tmp_path / "c"), **kwargs)
    assert isinstance(train, BlendedDataset)
    used = MID_LEVEL_SURPLUS if surplus is None else surplus
    assert [child.num_samples for child in train.datasets] == [
        megatron_request(90, 0.25, used),
        megatron_request(90, 0.75, used),
    ]
    assert len(train) == math.ceil(90 * 0.25) + math.ceil(90 * 0.75)  # the blend's size has no surplus


def test_megatrons_flag_sets_the_surplus_and_its_absence_is_megatrons_default():
    def surplus(extra: str) -> float:
        flags = shlex.split(FLAGS + extra)
        cfg = load_training_config(None, translate(flags, ENV).overrides, report_ignored=False)
        return cfg.model.data.mid_level_dataset_surplus

    assert surplus(" --mid-level-dataset-surplus 0.02") == 0.02
    assert surplus("") == MID_LEVEL_SURPLUS == 0.005


@pytest.mark.parametrize(
    ("value", "problem"), [("-0.1", "must be 0 or more, got -0.1"), ("nan", "expects a finite float")]
)
def test_a_surplus_that_cannot_size_a_dataset_is_refused_naming_its_key(value, problem):
    with pytest.raises(ConfigError, match=rf"model\.data\.mid_level_dataset_surplus'?:? {problem}"):
        load_training_config(None, [f"model.data.mid_level_dataset_surplus={value}"], report_ignored=False)


def test_training_builds_its_datasets_with_the_configured_surplus(monkeypatch):
    from gptrain.data import builder
    from gptrain.train import builders

    seen: dict = {}

    class Stop(Exception):
        pass

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(builder, "build_gpt_datasets", fake)
    cfg = load_training_config(
        None,
        [
            "model.data.data_impl=mock",
            "model.data.mock_vocab_size=64",
            "model.data.mid_level_dataset_surplus=0.03",
        ],
        report_ignored=False,
    )
    with pytest.raises(Stop):
        builders._build_datasets(cfg, 64, None)
    assert seen["surplus"] == 0.03


def test_data_sample_takes_the_surplus_training_builds_with(tmp_path, capsys):
    import json

    from gptrain.cli import main

    a = write_dataset(tmp_path / "a", [9, 4, 17, 6, 11, 3] * 4)
    b = write_dataset(tmp_path / "b", [5, 13, 8] * 6)
    cache = str(tmp_path / "c")
    train, _, _ = build_gpt_datasets([1, a, 3, b], "1", 4, 7, (90, 0, 0), cache, surplus=0.5)
    argv = ["data", "sample", "--data-prefix", "1", a, "3", b, "--seq-length", "4", "--seed", "7"]
    argv += ["--splits-string", "1", "--num-samples", "90,0,0", "--cache-dir", cache]
    for index in (0, 37, 89):
        assert main([*argv, "--index", str(index), "--mid-level-dataset-surplus", "0.5"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == train[index].tolist()


def test_a_blend_asking_a_dataset_past_its_samples_names_the_surplus_to_raise(tmp_path):
    """Megatron's error says to raise the surplus; gptrain's named a surplus it had no way to set."""
    from gptrain.errors import DataError

    small = write_dataset(tmp_path / "small", [3, 3])  # 2 samples of 4 tokens in 2 epochs
    big = write_dataset(tmp_path / "big", [50] * 8)
    children = [
        build_gpt_datasets(prefix, "1", 4, 1, (2, 0, 0), str(tmp_path / "c"))[0] for prefix in (small, big)
    ]
    assert len(children[0]) == 2
    with pytest.raises(
        DataError, match=r"raise model\.data\.mid_level_dataset_surplus \(Megatron's --mid-level"
    ):
        BlendedDataset(children, [0.5, 0.5], 10, "train", str(tmp_path / "c"))  # 5 samples of each


@pytest.mark.parametrize("value", ["-0.5", "nan", "inf"])
def test_data_sample_refuses_a_surplus_that_cannot_size_a_dataset(tmp_path, capsys, value):
    from gptrain.cli import main

    a = write_dataset(tmp_path / "a", [9, 4, 17])
    argv = ["data", "sample", "--data-prefix", "1", a, "--seq-length", "4", "--num-samples", "5,0,0"]
    assert main([*argv, "--mid-level-dataset-surplus", value]) == 2
    assert (
        f"--mid-level-dataset-surplus {float(value)}: give a finite fraction of 0 or more"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("value", ["1e308", "1e20"])
def test_data_sample_refuses_a_surplus_past_the_indices_bound_naming_the_surplus(tmp_path, capsys, value):
    """1e308 made ceil(23 * (1 + 1e308)) an OverflowError traceback, 1e20 numpy's ValueError."""
    from gptrain.cli import main

    a = write_dataset(tmp_path / "a", [9, 4, 17, 6, 11, 3] * 4)
    b = write_dataset(tmp_path / "b", [5, 13, 8] * 6)
    argv = ["data", "sample", "--data-prefix", "1", a, "3", b, "--seq-length", "4", "--num-samples", "90,0,0"]
    argv += ["--cache-dir", str(tmp_path / "c")]
    assert main([*argv, "--mid-level-dataset-surplus", value]) == 2
    err = capsys.readouterr().err
    assert f"--mid-level-dataset-surplus {float(value)}: " in err
    assert (
        f"{a} (train split) of 23 samples builds" in err and "past the 288,230,376,151,711,744 (2**58)" in err
    )
    assert "Traceback" not in err and "--num-samples" not in err.split(":")[0]


def test_training_refuses_a_surplus_past_the_indices_bound_naming_its_key(tmp_path):
    a = write_dataset(tmp_path / "a", [9, 4, 17, 6, 11, 3] * 4)
    b = write_dataset(tmp_path / "b", [5, 13, 8] * 6)
    overrides = [f"model.data.data_prefix=[1,{a},3,{b}]", "model.data.mid_level_dataset_surplus=1e308"]
    cfg = load_training_config(None, overrides, report_ignored=False)
    with pytest.raises(
        ConfigError,
        match=r"^model\.data\.mid_level_dataset_surplus 1e\+308: .*a \(train split\) of 23 samples",
    ):
        build_gpt_datasets(
            [1, a, 3, b], "1", 4, 7, (90, 0, 0), str(tmp_path / "c"),
            surplus=cfg.model.data.mid_level_dataset_surplus,
        )  # fmt: skip


def test_a_surplus_the_host_cannot_hold_is_blamed_not_the_sample_count(tmp_path, monkeypatch, capsys):
    """1e9 asks a 23-sample share for 2.3e10 samples (368 GB of indices): the out-of-memory line
    blamed --num-samples, which asked for 90."""
    from gptrain.cli import main
    from gptrain.data import builder

    a = write_dataset(tmp_path / "a", [9, 4, 17, 6, 11, 3] * 4)
    b = write_dataset(tmp_path / "b", [5, 13, 8] * 6)
    real = builder.GPTDataset

    def short_of_memory(indexed, documents, count, *args):
        if count > 10**6:
            raise MemoryError("Unable to allocate 343. GiB for an array with shape (23000000023,)")
        return real(indexed, documents, count, *args)

    monkeypatch.setattr(builder, "GPTDataset", short_of_memory)
    argv = ["data", "sample", "--data-prefix", "1", a, "3", b, "--seq-length", "4", "--num-samples", "90,0,0"]
    argv += ["--cache-dir", str(tmp_path / "c"), "--mid-level-dataset-surplus", "1e9"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "error: --mid-level-dataset-surplus 1000000000.0: out of memory building the sample indices" in err
    assert f"{a} (train split), 23,000,000,023 samples" in err and "its share 23" in err
