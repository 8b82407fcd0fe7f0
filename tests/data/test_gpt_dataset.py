"""GPTDataset indices: hand-checked cases, a slow token walk, Megatron-LM's own output, the cache."""

from __future__ import annotations

import hashlib
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
from gpt_data_helpers import InMemorySequences, fixture_token, load_fixture, slow_sample_index, write_dataset

from gptrain.data import gpt_dataset
from gptrain.data.gpt_dataset import (
    GPTDataset,
    as_documents,
    build_gpt_indices,
    build_sample_index,
    build_shuffle_index,
    documents_digest,
    num_epochs_for,
    separate_final_epoch,
)
from gptrain.data.index_cache import describe
from gptrain.data.splits import split_indices
from gptrain.errors import DataError

HAND_DOCS = [[10, 11, 12, 13, 14], [20, 21, 22], [30, 31, 32, 33]]  # lengths 5, 3, 4


def test_sample_index_of_three_documents_by_hand():
    # Flat tokens 10 11 12 13 14 | 20 21 22 | 30 31 32 33 with seq 4 (+1 shared token):
    # sample 0 = 10..14 ends on doc 0's last token -> next starts there (0, 4);
    # sample 1 = 14 20 21 22 30 ends at doc 2 offset 0 -> row (2, 0); 12 tokens give (12-1)//4 = 2.
    rows = build_sample_index(np.array([5, 3, 4], np.int32), np.array([0, 1, 2], np.int32), 4, 1, 1)
    assert rows.tolist() == [[0, 0], [0, 4], [2, 0]]
    assert rows.dtype == np.int32
    # Two epochs in the order 2 0 1 1 2 0: flat 30..33 10..14 20..22 20..22 30..33 10..14 (24 tokens).
    rows = build_sample_index(np.array([5, 3, 4], np.int32), np.array([2, 0, 1, 1, 2, 0], np.int32), 4, 2, 1)
    assert rows.tolist() == [[0, 0], [1, 0], [1, 4], [3, 0], [4, 1], [5, 1]]
    # Without the extra token, a sample ending exactly at a document's end keeps offset == length.
    rows = build_sample_index(np.array([4, 4], np.int32), np.array([0, 1], np.int32), 4, 1, 0)
    assert rows.tolist() == [[0, 0], [0, 4], [1, 4]]


def test_items_of_three_documents_by_hand():
    source = InMemorySequences(HAND_DOCS)
    ds = GPTDataset(source, np.arange(3), 5, 4, seed=1234, split="train", use_cache=False)
    assert num_epochs_for(12, 5, 4, 1) == 2 and len(ds) == 5  # (2*12 - 1) // 4
    flat = [t for d in ds.document_index for t in HAND_DOCS[d]]
    for i in range(len(ds)):
        j = int(ds.shuffle_index[i])
        item = ds[i]
        assert item.dtype == np.int64 and item.tolist() == flat[4 * j : 4 * j + 5]
    assert sorted(ds.shuffle_index.tolist()) == [0, 1, 2, 3, 4]
    assert sorted(ds.document_index.tolist()) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("chunk", [1 << 18, 3])  # documents per step of the build
@pytest.mark.parametrize("row_chunk", [1 << 18, 2])  # sample rows per step within them
@pytest.mark.parametrize("extra", [1, 0])
def test_sample_index_equals_slow_walk(extra, chunk, row_chunk, monkeypatch):
    monkeypatch.setattr(gpt_dataset, "_INDEX_CHUNK", chunk)
    monkeypatch.setattr(gpt_dataset, "_ROW_CHUNK", row_chunk)
    rng = np.random.default_rng(3)
    for trial in range(60):
        lengths = rng.integers(
            0 if trial % 2 else 1, int(rng.choice([3, 9, 40])), size=int(rng.integers(1, 40))
        )
        if lengths.sum() < 3:
            continue
        epochs = int(rng.integers(1, 4))
        document_index = np.tile(np.arange(len(lengths), dtype=np.int32), epochs)
        rng.shuffle(document_index)
        seq = int(rng.choice([2, 3, 5, 8]))
        if epochs * lengths.sum() - extra < seq:
            continue
        got = build_sample_index(lengths.astype(np.int32), document_index, seq, epochs, extra)
        assert got.tolist() == slow_sample_index(lengths.tolist(), document_index.tolist(), seq, extra)


def test_index_build_needs_little_beyond_its_output(monkeypatch):
    """Peak numpy memory of a separated-final-epoch build: the three outputs plus bounded
    per-chunk temporaries (a full-length cumsum, repeat and gather took ~3x the output)."""
    import tracemalloc

    monkeypatch.setattr(gpt_dataset, "_INDEX_CHUNK", 1 << 12, raising=False)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2000, 100_000).astype(np.int32)
    documents = np.arange(len(lengths), dtype=np.int32)
    tracemalloc.start()
    try:
        arrays = build_gpt_indices(lengths, documents, 250_000, 2048, seed=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    output = sum(a.nbytes for a in arrays)
    assert len(arrays[0]) == 6 * len(documents) and peak < 1.2 * output, (peak, output)


def test_sample_index_of_long_documents_needs_little_beyond_its_output():
    """Book-length documents put millions of rows in one chunk of documents: counting them out
    with a repeat over the chunk held three int64 temporaries per row (about 4x the output)."""
    import tracemalloc

    lengths = np.full(2000, 500_000, dtype=np.int32)
    tracemalloc.start()
    try:
        rows = build_sample_index(lengths, np.arange(2000, dtype=np.int32), 256, 1, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    count = (2000 * 500_000 - 1) // 256
    assert len(rows) == count + 1 and rows[-1].tolist() == [1999, count * 256 - 1999 * 500_000]
    # row j's document holds flat token j * 256: 1953 * 256 = 499,968 is document 0's, 500,224 not
    assert rows[1953].tolist() == [0, 1953 * 256] and rows[1954].tolist() == [1, 1954 * 256 - 500_000]
    assert peak < 1.4 * rows.nbytes, (peak, rows.nbytes)


def test_epochs_and_final_epoch_separation_by_hand():
    # 1000 tokens per epoch, seq 10: 99 samples per epoch ((1000-1)//10), threshold int(0.8*99) = 79.
    assert num_epochs_for(1000, 99, 10, 1) == 1 and num_epochs_for(1000, 100, 10, 1) == 2
    assert num_epochs_for(1000, None, 10, 1) == 1
    # 230 samples need 2301 tokens -> 3 epochs; 199 before the last, 31 from it < 79 -> separate.
    assert separate_final_epoch(1000, 3, 230, 10, 1) == (True, 199)
    # 290 samples -> 91 from the final epoch >= 79 -> shuffled together with the others.
    assert separate_final_epoch(1000, 3, 290, 10, 1) == (False, 199)
    assert separate_final_epoch(1000, 1, 50, 10, 1) == (False, 0)


def test_separated_final_epoch_keeps_epochs_apart():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=40).astype(np.int32)
    tokens = int(lengths.sum())
    per_epoch = (tokens - 1) // 8
    num_samples = 2 * per_epoch + 3  # a final epoch barely used
    doc, rows, shuffle = build_gpt_indices(lengths, np.arange(40, dtype=np.int32), num_samples, 8, seed=7)
    assert len(doc) == 3 * 40 and doc.dtype == np.int32
    assert sorted(doc[80:].tolist()) == list(range(40))  # the last epoch shuffled on its own
    before = (2 * tokens - 1) // 8
    assert sorted(shuffle[:before].tolist()) == list(range(before))
    assert sorted(shuffle[before:].tolist()) == list(range(before, len(rows) - 1))
    assert shuffle.dtype == np.uint32


def test_shuffle_index_draws_after_the_document_shuffle():
    # One RandomState: the document shuffle consumes draws first, so the sample permutation
    # differs from a fresh generator's.
    # 10 documents of 4 tokens, seq 2: one epoch, (40 - 1) // 2 = 19 samples.
    rng = np.random.RandomState(5)
    rng.shuffle(np.arange(10, dtype=np.int32))
    after = build_shuffle_index(19, 19, rng)
    fresh = build_shuffle_index(19, 19, np.random.RandomState(5))
    _, _, shuffle = build_gpt_indices(np.full(10, 4, np.int32), np.arange(10, dtype=np.int32), 13, 2, seed=5)
    assert shuffle.tolist() == after.tolist() != fresh.tolist()


@pytest.mark.parametrize(
    "case", ["separated_final_epoch", "joint_final_epoch", "no_extra_token", "one_epoch_none_requested"]
)
def test_matches_megatron_lm(tmp_path, case):
    spec = load_fixture()[case]
    prefix = write_dataset(tmp_path / "d0", spec["lengths"][0])
    for split, indices in zip(
        ("train", "valid", "test"), split_indices(spec["split"], len(spec["lengths"][0])), strict=True
    ):
        expected = spec["splits"][split]
        if expected is None:
            assert indices is None
            continue
        num_samples = spec["num_samples"][["train", "valid", "test"].index(split)]
        ds = GPTDataset(
            prefix, indices, num_samples, spec["seq_length"], spec["seed"], split,
            cache_dir=str(tmp_path / "cache"), add_extra_token_to_sequence=spec["add_extra_token_to_sequence"],
        )  # fmt: skip
        assert [int(indices[0]), int(indices[-1]) + 1] == expected["indices_range"]
        assert len(ds) == expected["len"]
        assert ds.document_index.tolist() == expected["document_index"]
        assert ds.sample_index.tolist() == expected["sample_index"]
        assert ds.shuffle_index.tolist() == expected["shuffle_index"]
        assert str(ds.sample_index.dtype) == expected["sample_index_dtype"]
        assert str(ds.shuffle_index.dtype) == expected["shuffle_index_dtype"]
        for i, tokens in expected["samples"].items():  # tokens + last label (a pad without the extra token)
            assert ds[int(i)].tolist() == (tokens if ds.extra else tokens[:-1])


def test_sample_content_is_the_concatenated_shuffled_documents(tmp_path):
    lengths = [7, 1, 12, 3, 30, 2, 9, 5]
    prefix = write_dataset(tmp_path / "d", lengths)
    ds = GPTDataset(prefix, np.arange(8, dtype=np.int32), 40, 6, 99, "train", cache_dir=str(tmp_path / "c"))
    flat = [fixture_token(int(d), j) for d in ds.document_index for j in range(lengths[d])]
    for i in range(len(ds)):
        j = int(ds.shuffle_index[i])
        assert ds[i].tolist() == flat[6 * j : 6 * j + 7]
    assert len(ds) == (len(flat) - 1) // 6 >= 40


def _digest(ds: GPTDataset) -> str:
    arrays = (ds.document_index, ds.sample_index, ds.shuffle_index)
    return hashlib.md5(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


def test_cache_is_reused_and_keyed_by_seed(tmp_path):
    prefix = write_dataset(tmp_path / "d", [5, 8, 13, 21, 34])
    args = (prefix, np.arange(5, dtype=np.int32), 10, 4)
    first = GPTDataset(*args, seed=1, split="train")
    cache_dir = tmp_path / "cache" / "GPTDataset_indices"  # default: next to the data
    files = sorted(p.name for p in cache_dir.iterdir())
    assert not first.cache_hit and not any(name.startswith(".") for name in files)
    assert len(files) == 5 and files[-1].startswith("idx-")  # 3 arrays, description, the .idx's digest
    again = GPTDataset(*args, seed=1, split="train")
    assert again.cache_hit and _digest(again) == _digest(first)
    assert isinstance(again.shuffle_index, np.memmap)
    other = GPTDataset(*args, seed=2, split="train")
    assert not other.cache_hit and _digest(other) != _digest(first)
    assert len(list(cache_dir.iterdir())) == 9


def test_cache_without_description_is_rebuilt(tmp_path):
    prefix = write_dataset(tmp_path / "d", [5, 8, 13])
    ds = GPTDataset(prefix, np.arange(3, dtype=np.int32), 4, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    # A builder that died before its last rename leaves arrays but no description: not a hit.
    (tmp_path / "c" / f"{ds.digest}-GPTDataset-train-description.txt").unlink()
    (tmp_path / "c" / f"{ds.digest}-GPTDataset-train-shuffle_index.npy").write_bytes(b"garbage")
    again = GPTDataset(prefix, np.arange(3, dtype=np.int32), 4, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert not again.cache_hit and _digest(again) == _digest(ds)


@pytest.mark.parametrize("name", gpt_dataset.INDEX_NAMES)
@pytest.mark.parametrize("keep", [0, 40, -1])  # nothing, part of the header, all but the last byte
def test_truncated_cache_array_is_rebuilt(tmp_path, caplog, name, keep):
    """A cache array cut short (a copy of the cache directory that ran out of space, a file system
    that lost the end of it) beside its description: an empty one was numpy's EOFError as a traceback."""
    prefix = write_dataset(tmp_path / "d", [5, 8, 13, 21, 34])
    ds = GPTDataset(prefix, np.arange(5, dtype=np.int32), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    array = tmp_path / "c" / f"{ds.digest}-GPTDataset-train-{name}.npy"
    array.write_bytes(array.read_bytes()[:keep])
    again = GPTDataset(prefix, np.arange(5, dtype=np.int32), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert not again.cache_hit and _digest(again) == _digest(ds)
    assert "ignoring unreadable index cache" in caplog.text
    assert GPTDataset(prefix, np.arange(5), 10, 4, 1, "train", cache_dir=str(tmp_path / "c")).cache_hit


def _arrays_copied(name: str) -> list[str]:
    return {"sample and shuffle index": ["sample_index", "shuffle_index"]}.get(name, [name])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("sample_index", "shuffle_index has shape"),
        ("shuffle_index", "shuffle_index has shape"),
        ("document_index", "document_index has shape (6,), expected epochs x 5 entries"),
        ("sample and shuffle index", "sample_index ends at document_index position"),
        ("flat sample_index", "sample_index has shape (8,), expected (samples + 1, 2)"),
    ],
)
def test_cache_arrays_that_do_not_fit_together_are_rebuilt(tmp_path, caplog, name, message):
    """A half-copied cache directory holds well-formed .npy files of another build: they are
    a cache miss with a warning (they used to be a hit, then an IndexError when read)."""
    prefix = write_dataset(tmp_path / "d", [5, 8, 13, 21, 34])
    ds = GPTDataset(prefix, np.arange(5, dtype=np.int32), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    cached = tmp_path / "c" / f"{ds.digest}-GPTDataset-train"
    if name == "flat sample_index":
        np.save(f"{cached}-sample_index.npy", np.arange(8, dtype=np.int32))
    else:  # the same arrays of another build: more samples, or a split of 3 sequences
        indices, samples = (np.arange(3), 10) if name == "document_index" else (np.arange(5), 100)
        other = GPTDataset(prefix, indices, samples, 4, 1, "train", cache_dir=str(tmp_path / "o"))
        for array in _arrays_copied(name):
            source = tmp_path / "o" / f"{other.digest}-GPTDataset-train-{array}.npy"
            Path(f"{cached}-{array}.npy").write_bytes(source.read_bytes())
    again = GPTDataset(prefix, np.arange(5, dtype=np.int32), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert not again.cache_hit and _digest(again) == _digest(ds)
    assert [again[i].tolist() for i in range(len(again))] == [ds[i].tolist() for i in range(len(ds))]
    assert "ignoring unreadable index cache" in caplog.text and message in caplog.text


def test_unwritable_cache_dir_is_a_data_error(tmp_path):
    prefix = write_dataset(tmp_path / "d", [5, 8, 13])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DataError, match="cache"):
        GPTDataset(prefix, np.arange(3, dtype=np.int32), 4, 4, 1, "train", cache_dir=str(blocker / "sub"))


def test_building_indices_verifies_the_index(tmp_path):
    prefix = write_dataset(tmp_path / "d", [5, 8, 13])
    with open(prefix + ".idx", "r+b") as handle:
        handle.seek(34 + 4)  # length of sequence 1: 8 -> -8 (the last pointer still fits the .bin)
        handle.write(np.int32(-8).tobytes())
    with pytest.raises(DataError, match=r"d\.idx: sequence 1 has length -8"):
        GPTDataset(prefix, np.arange(3, dtype=np.int32), 4, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert not list((tmp_path / "c").glob("*GPTDataset*"))  # no indices saved (the .idx's digest may be)


def test_empty_split_is_a_data_error():
    with pytest.raises(DataError, match="split"):
        build_gpt_indices(np.array([4, 4], np.int32), np.array([], np.int32), 3, 2, seed=1)


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_outside_randomstate_range_is_a_data_error(seed):
    sequences = InMemorySequences(HAND_DOCS)
    with pytest.raises(DataError, match=rf"seed: {seed} is outside 0 to 4294967295"):
        GPTDataset(sequences, np.arange(3, dtype=np.int32), 2, 4, seed, "train", use_cache=False)
    assert len(GPTDataset(sequences, np.arange(3), 2, 4, 2**32 - 1, "train", use_cache=False)) >= 2


def _race(args: tuple[str, str, int]) -> tuple[str, bool]:
    prefix, cache_dir, seed = args
    ds = GPTDataset(prefix, np.arange(300, dtype=np.int32), 3000, 16, seed, "train", cache_dir=cache_dir)
    return _digest(ds), ds.cache_hit


def test_concurrent_builders_do_not_corrupt_the_cache(tmp_path):
    prefix = write_dataset(tmp_path / "d", list(np.random.default_rng(1).integers(1, 300, size=300)))
    expected = {
        seed: _digest(
            GPTDataset(prefix, np.arange(300, dtype=np.int32), 3000, 16, seed, "train", use_cache=False)
        )
        for seed in range(3)
    }
    jobs = [(prefix, str(tmp_path / "cache"), seed) for seed in range(3) for _ in range(4)]
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.map(_race, jobs, chunksize=1)
    assert [digest for digest, _ in results] == [expected[seed] for *_, seed in jobs]
    for seed in range(3):  # every cache entry left behind is complete and correct
        ds = GPTDataset(
            prefix, np.arange(300, dtype=np.int32), 3000, 16, seed, "train", cache_dir=str(tmp_path / "cache")
        )
        assert ds.cache_hit and _digest(ds) == expected[seed]
    assert not [p for p in Path(tmp_path / "cache").iterdir() if p.name.startswith(".")]


def _whole_array_md5(ids) -> str:
    """The cache key's "indices" digest as the first release computed it: one int64 copy of every id."""
    return hashlib.md5(np.ascontiguousarray(np.asarray(ids), dtype=np.int64).tobytes()).hexdigest()


def _expected_digest(ds: GPTDataset) -> str:
    """The cache name of `ds`: its identity() written out again here, ids hashed in one piece."""
    ids = np.asarray(list(ds.indices), dtype=np.int64)
    idx_bytes = Path(ds.dataset.path_prefix + ".idx").read_bytes()
    fields = {
        "class": "GPTDataset",
        "idx_blake2b": hashlib.blake2b(idx_bytes, digest_size=16).hexdigest(),
        "num_sequences": len(ds.dataset.sequence_lengths),
        "index_split": ds.split,
        "indices": [int(ids[0]) if len(ids) else 0, len(ids), _whole_array_md5(ids)],
        "num_samples": ds.num_samples,
        "sequence_length": ds.seq_length,
        "random_seed": ds.seed,
        "add_extra_token_to_sequence": bool(ds.extra),
    }
    return describe(fields)[1]


@pytest.mark.parametrize("chunk", [1 << 20, 3])  # ids hashed per step
def test_documents_digest_is_the_whole_int64_array_md5(chunk, monkeypatch):
    monkeypatch.setattr(gpt_dataset, "_HASH_CHUNK", chunk)
    assert documents_digest(range(3, 11)) == "5ef68cf512574d9e1acb938f302a4866"  # md5 of int64 3..10
    assert documents_digest(range(0)) == "d41d8cd98f00b204e9800998ecf8427e"  # md5 of nothing
    cases = [range(0, 1), range(5, 6), range(0, 7), range(1000, 1013), range(2, 20, 3)]
    arrays = [
        np.array([4, 0, 2], np.int32),
        np.array([7, 8, 9, 11, 12], np.uint16),
        np.arange(13, dtype=np.int64),
    ]
    for ids in cases + arrays:
        assert documents_digest(ids) == _whole_array_md5(ids), ids


def test_consecutive_ids_are_kept_as_a_range():
    assert as_documents(np.arange(5, 12, dtype=np.int32)) == range(5, 12)
    assert as_documents(range(3, 9)) == range(3, 9) and as_documents(np.arange(0)) == range(0)
    for ids in ([4, 0, 2], [0, 1, 3], [1, 0], [0, 2, 1, 3]):
        kept = as_documents(np.array(ids, np.int32))
        assert isinstance(kept, np.ndarray) and kept.tolist() == ids


@pytest.mark.parametrize("ids", [np.arange(6, dtype=np.int32), np.array([4, 0, 2, 5])])
def test_cache_names_do_not_depend_on_how_the_ids_are_hashed(tmp_path, monkeypatch, ids):
    """The ids' digest is that of the whole int64 array, hashed in chunks or read from its memo."""
    monkeypatch.setattr(gpt_dataset, "_HASH_CHUNK", 2)  # several chunks, and the memo in use
    prefix = write_dataset(tmp_path / "d", [5, 8, 13, 21, 34, 3])
    first = GPTDataset(prefix, ids, 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert first.digest == _expected_digest(first)
    names = {p.name for p in (tmp_path / "c").iterdir()}
    assert f"{first.digest}-GPTDataset-train-description.txt" in names
    again = GPTDataset(prefix, ids, 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))  # from the memo
    assert again.cache_hit and again.digest == first.digest and _digest(again) == _digest(first)
    reference = build_gpt_indices(np.array([5, 8, 13, 21, 34, 3], np.int32), ids, 10, 4, 1)
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(first), reference, strict=True))


def _arrays(ds: GPTDataset) -> tuple[np.ndarray, ...]:
    return ds.document_index, ds.sample_index, ds.shuffle_index


class _CountingHashlib:
    """hashlib for gpt_dataset that counts the bytes its md5s are fed."""

    def __init__(self) -> None:
        self.hashed = 0

    def md5(self, *args, **kwargs):
        outer, inner = self, hashlib.md5(*args, **kwargs)
        outer.hashed += memoryview(args[0]).nbytes if args else 0

        class Counted:
            def update(self, data) -> None:
                outer.hashed += memoryview(data).nbytes
                inner.update(data)

            def hexdigest(self) -> str:
                return inner.hexdigest()

        return Counted()


def test_cache_hit_of_a_range_hashes_no_ids(tmp_path, monkeypatch):
    """A start that finds its cache does not hash the split's ids again (10^9 of them took ~15 s)."""
    monkeypatch.setattr(gpt_dataset, "_HASH_CHUNK", 2)
    prefix = write_dataset(tmp_path / "d", [5, 8, 13, 21, 34])
    first = GPTDataset(prefix, range(5), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    counting = _CountingHashlib()
    monkeypatch.setattr(gpt_dataset, "hashlib", counting)
    again = GPTDataset(prefix, np.arange(5, dtype=np.int32), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert again.cache_hit and again.digest == first.digest and counting.hashed == 0
    (memo,) = (tmp_path / "c").glob("range-*")
    assert memo.read_text().strip() == _whole_array_md5(range(5))
    memo.write_text("not a digest\n")  # damaged: computed again, rewritten, same name
    third = GPTDataset(prefix, range(5), 10, 4, 1, "train", cache_dir=str(tmp_path / "c"))
    assert third.cache_hit and third.digest == first.digest and counting.hashed == 5 * 8
    assert memo.read_text().strip() == _whole_array_md5(range(5))


def test_cache_key_of_many_documents_needs_little_memory():
    """20M ids (160 MB as int64) are hashed a chunk at a time, for a range and for an array."""
    import tracemalloc

    ds = GPTDataset(
        InMemorySequences(HAND_DOCS), np.arange(3), 5, 4, seed=1234, split="train", use_cache=False
    )
    many = 20_000_000
    reversed_ids = np.arange(many, dtype=np.int32)[::-1].copy()
    for ids, expected in (
        (range(many), _whole_array_md5(np.arange(many))),
        (reversed_ids, _whole_array_md5(reversed_ids)),
    ):
        ds.indices = ids
        tracemalloc.start()
        try:
            indices = ds.identity()["indices"]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 32 * 2**20, (type(ids), peak)  # the whole int64 copy alone is 160 MB
        assert indices == [int(ids[0]), many, expected]


def test_a_cache_dir_in_a_directory_that_may_not_be_searched_is_the_cache_refused(tmp_path, refuse_search):
    """Looking for a cached description asked pathlib, which raised PermissionError: a bare
    '<cache>/...-description.txt: Permission denied' from the command line. Now the line of any
    cache directory this job cannot write, naming the keys to change. Root may search any directory:
    the refusal is stood in for."""
    import os

    prefix = write_dataset(tmp_path / "d", [5, 8, 13])
    locked = tmp_path / "locked"
    locked.mkdir()
    refuse_search(locked, also=[(os, "mkdir")])
    with pytest.raises(
        DataError, match=r"cannot write dataset index cache in .*locked/cache \(.*Permission denied\)"
    ):
        GPTDataset(prefix, range(3), 4, 4, 1, "train", cache_dir=str(locked / "cache"))
