"""Building the three splits: sample counts, blend lists, Megatron's blended output, mock data."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gpt_data_helpers import load_fixture, write_dataset

from gptrain.data.blended import BlendedDataset
from gptrain.data.builder import MAX_SPLIT_TOKENS, build_gpt_datasets, parse_blend, sample_counts
from gptrain.data.gpt_dataset import GPTDataset
from gptrain.data.mock import MockGPTDataset
from gptrain.errors import ConfigError, DataError


def test_sample_counts_formula():
    # 1000 iterations x 8: evaluations at 100, 200, ..., 1000 plus the final one = 11 x 10 batches.
    assert sample_counts(1000, 8, 100, 10) == (8000, 880, 80)
    assert sample_counts(1000, 8, 100, 10, eval_global_batch_size=4) == (8000, 440, 40)
    assert sample_counts(1050, 8, 100, 10) == (8400, 880, 80)
    assert sample_counts(1000, 8, 100, 10, start_eval_at_iter=300) == (8000, 640, 80)
    assert sample_counts(1000, 8, 100, 10, train_samples=5) == (5, 880, 80)
    with pytest.raises(ConfigError, match="eval_interval"):
        sample_counts(1000, 8, 0, 10)


def test_parse_blend():
    assert parse_blend("a/b") == (["a/b"], None)
    assert parse_blend(["a/b"]) == (["a/b"], None)
    assert parse_blend(["30", "a", 70, " b "]) == (["a", "b"], [30.0, 70.0])
    assert parse_blend(["0", "v"], one_split=True) == (["v"], [0.0])  # a split's lone prefix: weight unused


def test_a_weight_of_0_is_refused_as_megatron_core_refuses_it(tmp_path):
    """Megatron-core's BlendedDataset asserts every normalised weight > 0 (since core 0.7, April 2024):
    `--data-path 0 A 1 B` stops there with an AssertionError. gptrain took it, as the legacy
    blendable_dataset.py did, and built A for no samples; it is refused in one line, as are a lone `[0, A]`
    (normalised to NaN in Megatron) and a 0 in a split's blend of two."""
    off, b = write_dataset(tmp_path / "off", [10] * 8), write_dataset(tmp_path / "b", [10] * 40)
    refusal = (
        f"entry 1: weight 0 of {off} must be positive: Megatron-core's BlendedDataset refuses a weight of 0"
    )
    for spec in ([0, off, 1, b], [0, off], {"train": b, "validation": [0, off, 1, b]}):
        with pytest.raises(DataError, match=re.escape(refusal)):
            build_gpt_datasets(spec, "1,0,0", 8, 1, (100, 10, 0), str(tmp_path), skip_unused=True)


def test_a_splits_lone_weighted_prefix_is_built_whatever_its_weight(tmp_path):
    """Megatron builds a per-split blend of one prefix as that dataset (`len(prefixes) == 1`), the weight
    unused: `--valid-data-path 0 V` trains there (normalize's 0/0 is only a warning). It was refused."""
    train, valid = write_dataset(tmp_path / "t", [10] * 40), write_dataset(tmp_path / "v", [10] * 40)
    plain = build_gpt_datasets({"train": train, "validation": valid}, None, 8, 1, (20, 10, 0), str(tmp_path))
    for weight in (0, 0.0, "0", 3):
        built = build_gpt_datasets(
            {"train": train, "validation": [weight, valid]}, None, 8, 1, (20, 10, 0), str(tmp_path)
        )
        assert isinstance(built[1], GPTDataset) and len(built[1]) == len(plain[1])
        assert np.array_equal(built[1].sample_index, plain[1].sample_index)
    with pytest.raises(DataError, match=r"entry 1: weight -1 of .* must be 0 or more \(a split's one prefix"):
        build_gpt_datasets(
            {"train": train, "validation": [-1, valid]}, None, 8, 1, (20, 10, 0), str(tmp_path)
        )


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["30", "a", "heavy", "b"], r"entry 3 \('heavy'\) is not a weight"),  # a mix: a typo
        (["30", "a", "-1", "b"], r"entry 3: weight '-1' of b must be positive$"),
        (
            ["30", "a", "0", "b"],
            r"entry 3: weight '0' of b must be positive: Megatron-core's .* drop the entry",
        ),
        (["0", "a"], r"entry 1: weight '0' of a must be positive: Megatron-core's"),  # 0/0: NaN in Megatron
        (["nan", "a", "1", "b"], r"entry 1: weight 'nan' of a must be positive$"),
        ([], "list is empty"),
    ],
)
def test_bad_blend_lists_name_the_entry(entries, message):
    with pytest.raises(DataError, match=message):
        parse_blend(entries)


@pytest.mark.parametrize(
    ("entries", "example"),
    [
        (["a", "b"], "'1 a 1 b'"),  # even, no weight parses
        (["a", "b", "c"], "'1 a 1 b 1 c'"),  # odd: Megatron reads even '30 a 70' this way
        (["d/a", "d/b", "d/c", "d/d"], "'1 d/a 1 d/b 1 d/c ...'"),
    ],
)
def test_megatrons_unweighted_list_is_refused_with_the_weighted_form(entries, example):
    with pytest.raises(
        DataError, match="Megatron's unweighted form.*does not support.*weight before each"
    ) as info:
        parse_blend(entries)
    assert f"e.g. {example}" in str(info.value)


def test_missing_prefix_is_named(tmp_path):
    real = write_dataset(tmp_path / "real", [5, 6, 7])
    with pytest.raises(DataError, match=r"missing\.bin/\.idx not found"):
        build_gpt_datasets([1, real, 1, str(tmp_path / "missing")], "1,0,0", 4, 1, (10, 0, 0))


@pytest.mark.parametrize("missing", [".bin", ".idx"])
def test_half_of_a_pair_names_the_missing_file(tmp_path, missing):
    """A .bin without its .idx (or the reverse: a copy cut short) said neither was found."""
    prefix = write_dataset(tmp_path / "d", [5, 6, 7])
    Path(prefix + missing).unlink()
    present = ".idx" if missing == ".bin" else ".bin"
    with pytest.raises(DataError, match=rf"d{missing} not found beside .*d\{present} \(a copy not finished"):
        build_gpt_datasets([1, prefix], "1,0,0", 4, 1, (10, 0, 0))


def test_a_blend_past_the_int16_dataset_index_is_refused_before_any_dataset_opens(tmp_path):
    """32,767 shards were each opened and indexed (minutes to hours) before the blend refused them."""
    shards = [str(tmp_path / f"missing{i}") for i in range(32767)]  # never opened: none exists
    blend = [item for shard in shards for item in (1, shard)]
    with pytest.raises(DataError, match="blends 32,767 datasets; a blend holds at most 32,766"):
        build_gpt_datasets(blend, "1,0,0", 4, 1, (10, 0, 0))
    assert parse_blend(blend[:-2])[0] == shards[:-1]


def test_single_prefix_gives_plain_gpt_datasets(tmp_path):
    prefix = write_dataset(tmp_path / "d", list(range(1, 41)))
    train, valid, test = build_gpt_datasets(prefix, "90,10,0", 8, 1234, (100, 5, 0), str(tmp_path / "c"))
    assert isinstance(train, GPTDataset) and isinstance(valid, GPTDataset) and test is None
    # Ranges, not arrays of every id (4 bytes per document per rank for the whole run).
    assert train.indices == range(36) and valid.indices == range(36, 40)
    assert len(train) >= 100 and len(valid) >= 5
    assert train[0].shape == (9,) and train[0].dtype == np.int64


def test_documents_of_several_sequences_are_split_and_sampled_by_sequence(tmp_path):
    """Megatron's GPTDataset indexes sequences (numel_low_level_dataset is the sequence count) and
    never reads the document index: a dataset of multi-sentence documents (prepare on JSON arrays)
    gives the samples of the same sequences written one per document, and "90,10,0" divides them."""
    from gptrain.data.indexed import IndexedDatasetWriter

    rng = np.random.default_rng(0)
    documents = [rng.integers(1, 30, size=int(rng.integers(0, 4))).tolist() for _ in range(15)]  # lengths
    sequences = [length for lengths in documents for length in lengths]
    tokens = rng.integers(0, 50000, size=sum(sequences))
    with (
        IndexedDatasetWriter(str(tmp_path / "grouped"), np.uint16) as grouped,
        IndexedDatasetWriter(str(tmp_path / "flat"), np.uint16) as flat,
    ):
        start = 0
        for lengths in documents:
            grouped.add_document(tokens[start : start + sum(lengths)], lengths)
            start += sum(lengths)
        start = 0
        for length in sequences:
            flat.add_document(tokens[start : start + length])
            start += length
    assert grouped.num_documents == 15 and grouped.num_sequences == len(sequences) != 15
    built = [
        build_gpt_datasets(str(tmp_path / name), "90,10,0", 8, 1234, (50, 5, 0), str(tmp_path / f"c-{name}"))
        for name in ("grouped", "flat")
    ]
    boundary = round(0.9 * len(sequences))
    for split, (mine, reference) in enumerate(zip(*built, strict=True)):
        if split == 2:
            assert mine is None and reference is None
            continue
        assert mine.indices == reference.indices == [range(boundary), range(boundary, len(sequences))][split]
        assert len(mine) == len(reference)
        assert all(mine[i].tolist() == reference[i].tolist() for i in range(len(mine)))


def test_per_split_prefixes_give_each_split_all_of_its_datasets(tmp_path):
    """NeMo's {train, validation, test} form (Megatron's --train/--valid-data-path): every document of
    a split's datasets is in that split, exactly as a 100/0/0 (or 0/100/0) split string gives them."""
    a = write_dataset(tmp_path / "a", list(range(1, 31)))
    b = write_dataset(tmp_path / "b", list(range(5, 25)))
    v = write_dataset(tmp_path / "v", list(range(2, 12)))
    cache = str(tmp_path / "c")
    blend = [0.3, a, 0.7, b]
    train, valid, test = build_gpt_datasets(
        {"train": blend, "validation": v}, None, 8, 1234, (60, 7, 5), cache
    )
    assert test is None
    expected_train = build_gpt_datasets(blend, "100,0,0", 8, 1234, (60, 0, 0), cache)[0]
    expected_valid = build_gpt_datasets(v, "0,100,0", 8, 1234, (0, 7, 0), cache)[1]
    assert isinstance(train, BlendedDataset) and isinstance(valid, GPTDataset)
    assert list(valid.indices) == list(range(10))  # the whole of v
    assert [list(child.indices) for child in train.datasets] == [list(range(30)), list(range(20))]
    for got, want in ((train, expected_train), (valid, expected_valid)):
        assert len(got) == len(want)
        assert all(np.array_equal(got[i], want[i]) for i in range(len(want)))


def test_per_split_single_weighted_prefix_is_that_dataset_alone(tmp_path):
    """`--valid-data-path 1.0 V`: Megatron (core 0.7 on) ignores the weight of a split's only dataset
    and builds it for the split's own count. Here 8 samples are one epoch of V (65 tokens, seq 8); a
    one-dataset blend built 0.5% more, 9, which took a second epoch and shuffled the samples otherwise."""
    v = write_dataset(tmp_path / "v", list(range(2, 12)))
    t = write_dataset(tmp_path / "t", list(range(5, 45)))
    cache = str(tmp_path / "c")
    plain = build_gpt_datasets({"train": t, "validation": v}, None, 8, 1234, (20, 8, 0), cache)[1]
    _, valid, _ = build_gpt_datasets({"train": t, "validation": [1.0, v]}, None, 8, 1234, (20, 8, 0), cache)
    assert isinstance(valid, GPTDataset) and isinstance(plain, GPTDataset)
    assert (len(valid), valid.num_samples) == (len(plain), 8) == (8, 8)
    assert [valid[i].tolist() for i in range(8)] == [plain[i].tolist() for i in range(8)]


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ({"train": "x", "valid": "y"}, r"data prefix keys \['valid'\]: a per-split data prefix has the keys"),
        (
            {"train": {"train": "x"}},
            "data prefix train: give a prefix or \\[weight, prefix, ...\\], not a mapping",
        ),
    ],
)
def test_bad_per_split_prefixes_are_named(tmp_path, prefix, message):
    with pytest.raises((ConfigError, DataError), match=message):
        build_gpt_datasets(prefix, None, 8, 1, (10, 1, 0))


@pytest.mark.parametrize("case", ["blend_30_70", "blend_three"])
def test_blend_matches_megatron_lm(tmp_path, case):
    spec = load_fixture()[case]
    blend: list = []
    for k, (weight, lengths) in enumerate(zip(spec["weights"], spec["lengths"], strict=True)):
        blend += [weight, write_dataset(tmp_path / f"d{k}", lengths)]
    datasets = build_gpt_datasets(
        blend,
        spec["split"],
        spec["seq_length"],
        spec["seed"],
        tuple(spec["num_samples"]),
        str(tmp_path / "c"),
    )
    for name, dataset in zip(("train", "valid", "test"), datasets, strict=True):
        expected = spec["splits"][name]
        if expected is None:
            assert dataset is None
            continue
        assert isinstance(dataset, BlendedDataset) and len(dataset) == expected["len"]
        assert dataset.dataset_index[:40].tolist() == expected["dataset_index_head"]
        assert dataset.dataset_sample_index[:40].tolist() == expected["dataset_sample_index_head"]
        assert np.bincount(dataset.dataset_index, minlength=len(blend) // 2).tolist() == expected["counts"]
        assert [len(child) for child in dataset.datasets] == expected["child_lens"]
        for i, tokens in expected["samples"].items():
            assert dataset[int(i)].tolist() == tokens


def test_mock_is_deterministic_per_index():
    a = MockGPTDataset(1000, 16, 50257, seed=7)
    b = MockGPTDataset(1000, 16, 50257, seed=7)
    assert len(a) == 1000 and a[3].shape == (17,) and a[3].dtype == np.int64
    assert a[3].tolist() == b[3].tolist() == a[-997].tolist()
    assert a[3].tolist() != a[4].tolist()
    assert a[3].tolist() != MockGPTDataset(1000, 16, 50257, seed=8)[3].tolist()
    assert a[3].tolist() != MockGPTDataset(1000, 16, 50257, seed=7, split="valid")[3].tolist()
    with pytest.raises(IndexError):
        a[1000]


def test_mock_tokens_are_uniform_in_the_vocabulary():
    ds = MockGPTDataset(400, 255, 10, seed=1)
    tokens = np.concatenate([ds[i] for i in range(len(ds))])
    counts = np.bincount(tokens, minlength=10)
    assert tokens.min() >= 0 and tokens.max() <= 9 and len(counts) == 10
    # 102,400 draws: each count ~ 10,240 +- 96 (binomial sd); 6 sd is 576.
    assert np.abs(counts - len(tokens) / 10).max() < 600


def test_build_mock_splits():
    train, valid, test = build_gpt_datasets("unused", None, 8, 3, (20, 4, 0), mock=True, vocab_size=100)
    assert isinstance(train, MockGPTDataset) and len(train) == 20 and len(valid) == 4 and test is None
    with pytest.raises(ConfigError, match="vocab_size"):
        build_gpt_datasets("unused", None, 8, 3, (20, 4, 0), mock=True)


def test_a_split_past_what_its_indices_can_address_is_refused_naming_what_asked(tmp_path):
    """trainer.max_steps=2**62 (within int64) was numpy's "Maximum allowed dimension exceeded" for
    a dataset and an OverflowError from len() for mock data, as tracebacks."""
    prefix = write_dataset(tmp_path / "d", list(range(1, 41)))
    asked = ("steps", "validations", "tests")
    with pytest.raises(
        ConfigError, match=r"^steps: the train split asks for 4,611,686,018,427,387,904 samples of 8"
    ):
        build_gpt_datasets(prefix, "90,10,0", 8, 1, (2**62, 5, 0), str(tmp_path / "c"), asked_by=asked)
    with pytest.raises(ConfigError, match=r"^validations: the valid split asks"):
        build_gpt_datasets("unused", None, 8, 3, (20, 2**62, 0), mock=True, vocab_size=100, asked_by=asked)
    tokens = MAX_SPLIT_TOKENS  # the largest request passes the check: 2**55 samples of 8 tokens
    train, _, _ = build_gpt_datasets("unused", None, 8, 3, (tokens // 8, 0, 0), mock=True, vocab_size=100)
    assert len(train) == 2**55
    with pytest.raises(ConfigError, match=r"^num_samples: the train split asks for 36,028,797,018,963,969"):
        build_gpt_datasets("unused", None, 8, 3, (tokens // 8 + 1, 0, 0), mock=True, vocab_size=100)


def test_a_split_too_large_for_memory_names_what_asked_for_it(tmp_path):
    """Under the 2**58 tokens the indices address, 10**15 samples still need petabytes: numpy's
    MemoryError reached the CLI as "out of memory: ask for less", naming no key. A per-split data
    prefix (its own build of each split) names the split's key too."""
    prefix = write_dataset(tmp_path / "d", list(range(1, 41)))
    asked = ("steps", "validations", "tests")
    cache = str(tmp_path / "c")
    expected = (
        r"^steps: out of memory building the sample indices of the train split, 1,000,000,000,000,000 "
        r"samples of 8 tokens \(Unable to allocate .*\); ask for fewer$"
    )
    with pytest.raises(ConfigError, match=expected):
        build_gpt_datasets(prefix, "90,10,0", 8, 1, (10**15, 5, 0), cache, asked_by=asked)
    per_split = {"train": prefix, "validation": prefix}
    with pytest.raises(
        ConfigError, match=r"^validations: out of memory building the sample indices of the valid"
    ):
        build_gpt_datasets(per_split, None, 8, 1, (20, 10**15, 0), cache, asked_by=asked)


def test_builder_does_not_import_torch():
    code = "import sys, gptrain.data.builder; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_built_split_lines_name_each_blended_dataset_and_its_epochs(tmp_path):
    """A blend's line counts its samples; each dataset's line its weight, samples and epochs."""
    from gptrain.data.builder import built_split_lines

    small = write_dataset(tmp_path / "small", [10] * 4)  # 40 tokens an epoch
    large = write_dataset(tmp_path / "large", [10] * 40)  # 400
    train, _, _ = build_gpt_datasets([1, small, 3, large], "1,0,0", 8, 1, (40, 0, 0), skip_unused=True)
    # 10 and 30 samples blended, 11 and 31 asked (Megatron's 0.5% surplus, rounded up): 11 * 8 + 1 tokens
    # take 3 epochs of small, whose 120 tokens hold (120 - 1) // 8 = 14 samples; 31 * 8 + 1 fit in one
    # of large: (400 - 1) // 8 = 49
    assert built_split_lines([train, None, None]) == [
        " > train split: 40 samples blended from 2 datasets",
        f"    weight 0.2500: 14 samples of 8 tokens, 3 epochs of its 4 sequences of {small} "
        f"(indices built in {tmp_path / 'cache' / 'GPTDataset_indices'})",
        f"    weight 0.7500: 49 samples of 8 tokens, 1 epoch of its 40 sequences of {large} "
        f"(indices built in {tmp_path / 'cache' / 'GPTDataset_indices'})",
    ]
    lone, _, _ = build_gpt_datasets([1, large], "1,0,0", 8, 1, (40, 0, 0), skip_unused=True)
    assert built_split_lines([lone, None, None])[0] == " > train split: 40 samples blended from 1 dataset"


@pytest.mark.parametrize("blend", [False, True])
def test_a_split_the_split_string_leaves_without_sequences_names_it(tmp_path, blend):
    """20 sequences at '98,2,0': the valid split's [round(19.6), round(20)) holds none. The index build
    said 'a split of 0 sequences holds 0 tokens' without the split string or the sequences' count."""
    prefix = write_dataset(tmp_path / "small", [30] * 20)
    spec = [1, prefix] if blend else prefix
    with pytest.raises(DataError) as info:
        build_gpt_datasets(spec, "98,2,0", 8, 1, (40, 5, 0), skip_unused=True)
    assert str(info.value) == (
        f"{prefix}: the split string '98,2,0' gives the valid split 0 of the dataset's 20 sequences (its "
        "share, rounded as Megatron rounds it); give that split a larger share, or the dataset more documents"
    )
    train, valid, _ = build_gpt_datasets(spec, "90,10,0", 8, 1, (40, 5, 0), skip_unused=True)
    assert valid is not None and len(valid) >= 5  # [18, 20): two sequences


def test_an_empty_dataset_is_named_as_empty_not_as_a_split_string_to_change(tmp_path):
    prefix = write_dataset(tmp_path / "empty", [])
    with pytest.raises(DataError) as info:
        build_gpt_datasets(prefix, "98,2,0", 8, 1, (40, 5, 0))
    assert str(info.value) == (
        f"{prefix}: the dataset holds no sequences (an empty corpus); prepare it from documents with text"
    )


def test_a_blend_written_as_one_string_says_how_to_write_it(tmp_path):
    """Megatron's DATA_PATH="0.3 a 0.7 b" copied into data_prefix is one prefix (as one word is to
    Megatron): it was refused as a missing .bin/.idx to make with gptrain data prepare."""
    a = write_dataset(tmp_path / "a", [30] * 20)
    b = write_dataset(tmp_path / "b", [30] * 20)
    with pytest.raises(DataError) as info:
        build_gpt_datasets(f"0.3 {a} 0.7 {b}", "1,0,0", 8, 1, (10, 0, 0))
    assert str(info.value).endswith(
        "a blend written as one string is one prefix, as Megatron reads one word; give its weights and "
        f"prefixes as separate entries: [0.3,{a},0.7,{b}] in a config, unquoted words on a command line"
    )
    spaced = write_dataset(tmp_path / "my data", [30] * 20)  # a prefix with a space is still one prefix
    train, _, _ = build_gpt_datasets(spaced, "1,0,0", 8, 1, (10, 0, 0))
    assert len(train) >= 10
    with pytest.raises(DataError, match="not found; check the path"):
        build_gpt_datasets(str(tmp_path / "1 a"), "1,0,0", 8, 1, (10, 0, 0))  # one word, no weight


def test_a_prefix_that_yaml_reads_as_a_number_is_a_prefix(tmp_path, monkeypatch):
    """`data_prefix: 2024` (a dataset named by its year, relative to the working directory) is an int
    after YAML: it failed with a TypeError traceback ('int' object is not iterable)."""
    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "2024", [30] * 20)
    assert parse_blend(2024) == (["2024"], None)
    train, _, _ = build_gpt_datasets(2024, "1,0,0", 8, 1, (10, 0, 0))
    assert train.dataset.path_prefix == "2024" and len(train) >= 10
    with pytest.raises(DataError, match=r"^data prefix 5: 5\.bin/\.idx not found"):
        build_gpt_datasets(5, "1,0,0", 8, 1, (10, 0, 0))


def test_the_prefixes_of_every_data_prefix_shape_numbers_as_their_words():
    """Launch, eval and their checks walked the data_prefix shapes each their own way, and a number
    (`data_prefix: 2024`, `{train: 2024}`) was a TypeError in some. One walker reads them all."""
    from gptrain.data.blend_spec import prefixes_of, with_prefixes

    per_split = {"train": 2024, "validation": [0.5, 7.5, 0.5, "b"], "test": None}
    assert prefixes_of(2024) == ["2024"] and prefixes_of([2024]) == ["2024"]
    assert prefixes_of(per_split) == ["2024", "7.5", "b"]
    assert prefixes_of(per_split, ["train", "test"]) == ["2024"]
    assert prefixes_of([1, "a", 2]) == prefixes_of("") == prefixes_of(None) == []  # left for the builder

    def under_d(prefix: str) -> str:
        return f"/d/{prefix}"

    assert with_prefixes(2024, under_d) == "/d/2024" and with_prefixes([2024], under_d) == ["/d/2024"]
    assert with_prefixes(per_split, under_d) == {
        "train": "/d/2024",
        "validation": [0.5, "/d/7.5", 0.5, "/d/b"],
        "test": None,
    }
    assert with_prefixes([1, "a", 2], under_d) == [1, "a", 2]


def test_a_prefix_yaml_renamed_as_a_number_says_to_quote_it(tmp_path, monkeypatch):
    """YAML reads an unquoted `data_prefix: 007` as 7 (0x10 as 16, 2024_01 as 202401): the line said
    only '7.bin/.idx not found', naming a dataset the user never wrote."""
    monkeypatch.chdir(tmp_path)
    note = (
        "; YAML read this prefix as the number 7 (an unquoted 007 is 7, 0x10 is 16, 2024_01 is 202401, 1e3 "
        'is 1000.0): quote the name as the file has it, e.g. data_prefix: "007"'
    )
    with pytest.raises(DataError) as number:
        build_gpt_datasets(7, "1,0,0", 8, 1, (10, 0, 0))
    assert str(number.value).endswith(f"check the path, or make the pair with gptrain data prepare{note}")
    with pytest.raises(DataError) as blended:
        build_gpt_datasets({"train": [1.0, 7]}, None, 8, 1, (10, 0, 0))
    assert str(blended.value).endswith(note)
    with pytest.raises(DataError) as word:  # a string is the name as written
        build_gpt_datasets("7", "1,0,0", 8, 1, (10, 0, 0))
    assert "YAML" not in str(word.value)


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        (
            ["0.3", "a", "0.7"],
            "entries 1 and 3 (0.3, 0.7) read as prefixes, as Megatron reads an odd list: if they are weights, "
            "a prefix or a weight is missing, e.g. '0.3 a 0.7 PREFIX'",
        ),
        (["30", "a", "70"], "entries 1 and 3 (30, 70) read as prefixes, as Megatron reads an odd list"),
        (["1", "a", "2", "b", "3"], "entries 1, 3 and 5 (1, 2, 3) read as prefixes"),
        (
            [30, "a", "b"],
            "entry 1 (30) read as a prefix, as Megatron reads an odd list: if it is a weight, a prefix or a "
            "weight is missing, e.g. '30 a WEIGHT b'",
        ),
    ],
)
def test_an_odd_list_with_weights_in_it_says_a_weight_or_prefix_may_be_missing(entries, said):
    """`--data-path 0.3 a 0.7` (b forgotten) was told only to write '1 0.3 1 a 1 0.7': 0.7 a prefix."""
    with pytest.raises(DataError, match="Megatron's unweighted form") as info:
        parse_blend(entries)
    assert f"; {said}" in str(info.value)
    assert "1 0.3 1 a" not in str(info.value) and "1 30 1 a" not in str(info.value)


@pytest.mark.parametrize(
    ("entries", "said", "example"),
    [
        (["a", "0.3", "b", "0.7"], "entries 2 and 4 (0.3, 0.7)", "'0.3 a 0.7 b'"),
        (["d/a", 30, "d/b", 70, "d/c", 5], "entries 2, 4 and 6 (30, 70, 5)", "'30 d/a 70 d/b 5 d/c'"),
        (["a", "b", "c", "0.5"], "entry 4 (0.5)", "'WEIGHT a WEIGHT b 0.5 c'"),
    ],
)
def test_an_even_list_with_weights_after_their_prefixes_says_megatron_reads_them_as_prefixes(
    entries, said, example
):
    """Megatron's get_blend_from_list reads `a 0.3 b 0.7` (no weight at entries 1, 3) as four prefixes,
    two of them named 0.3 and 0.7; the line said only to write '1 a 1 0.3 1 b ...'."""
    with pytest.raises(DataError, match="Megatron's unweighted form") as info:
        parse_blend(entries)
    text = str(info.value)
    assert f"; {said} read as" in text
    assert "as Megatron reads an even list with no weight at its odd entries (1, 3, ...)" in text
    assert text.endswith(f"before its prefix, e.g. {example}")


@pytest.mark.parametrize(
    ("entries", "flat"),
    [
        (["0.3 /tmp/d1", "0.7 /tmp/d2"], "[0.3,/tmp/d1,0.7,/tmp/d2]"),
        ([" 1 a", "2\tb ", "3 c"], "[1,a,2,b,3,c]"),  # odd: also Megatron's unweighted shape
    ],
)
def test_a_list_of_weight_prefix_strings_is_shown_as_the_flat_blend(entries, flat):
    """`--data-path 0.3 A 0.7 B` copied one pair per list item was told to write '1 0.3 /tmp/d1 1 0.7
    /tmp/d2': a 1:1 blend of datasets named '0.3 /tmp/d1' and '0.7 /tmp/d2'."""
    with pytest.raises(DataError) as info:
        parse_blend(entries)
    text = str(info.value)
    assert "holds a weight and its prefix in one string" in text
    assert f"give them as separate entries: {flat} in a config" in text
    assert "'1 " not in text and "unweighted form" not in text


def test_an_unweighted_list_without_numbers_says_nothing_of_missing_weights():
    with pytest.raises(DataError) as info:
        parse_blend(["a", "b", "c"])
    assert "missing" not in str(info.value)
