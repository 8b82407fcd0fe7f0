"""Blending: Megatron's greedy order (slow reference, Megatron's output), sizes, errors, cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpt_data_helpers import slow_blend
from hypothesis import given, settings
from hypothesis import strategies as st

from gptrain.data.blend_loop import compiled_blending_indices
from gptrain.data.blended import BlendedDataset, blending_indices, normalize, numpy_blending_indices
from gptrain.data.builder import samples_per_dataset
from gptrain.errors import DataError


class Numbered:
    """A child dataset whose sample j is [tag, j]."""

    def __init__(self, tag: int, length: int) -> None:
        self.tag, self.length = tag, length
        self.description = json.dumps({"class": "Numbered", "tag": tag, "length": length})

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> np.ndarray:
        assert 0 <= idx < self.length
        return np.array([self.tag, idx], dtype=np.int64)


def test_megatron_example_30_70():
    weights = normalize([30, 70])
    assert samples_per_dataset(weights, [8000, 0, 0], 0.005) == [[2412, 0, 0], [5628, 0, 0]]
    assert samples_per_dataset(weights, [8000, 0, 0]) == [[2400, 0, 0], [5600, 0, 0]]
    dataset_index, sample_index = blending_indices(normalize(weights), 8000)
    assert dataset_index[:10].tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1, 1]
    assert sample_index[:10].tolist() == [0, 0, 1, 2, 1, 3, 4, 2, 5, 6]
    assert np.bincount(dataset_index).tolist() == [2400, 5600]
    assert dataset_index.dtype == np.int16 and sample_index.dtype == np.int64


def test_hand_computed_head_of_three():
    # Errors w*max(k,1) - count: k=0 [.2,.5,.3] -> 1; k=1 [.2,-.5,.3] -> 2; k=2 [.4,0,-.4] -> 0;
    # k=3 [-.4,.5,-.1] -> 1; k=4 [-.2,0,.2] -> 2.
    assert blending_indices([0.2, 0.5, 0.3], 5)[0].tolist() == [1, 2, 0, 1, 2]


@pytest.mark.parametrize(
    ("weights", "size"),
    [
        ([0.3, 0.7], 70_000),  # more than one chunk
        ([1, 1, 1], 3_000),  # exact ties: the first dataset wins
        ([0.2, 0.5, 0.3], 20_000),
        ([1e-3, 1.0], 5_000),
        (list(np.random.default_rng(0).random(7)), 70_000),
        (list(np.random.default_rng(1).random(40) ** 3), 4_000),
        ([5.0], 100),
    ],
)
@pytest.mark.parametrize("implementation", [blending_indices, numpy_blending_indices])
def test_fast_blend_equals_slow_reference(weights, size, implementation):
    w = normalize(weights)
    dataset_index, sample_index = implementation(w, size)
    chosen, within = slow_blend(w, size)
    assert dataset_index.dtype == np.int16 and sample_index.dtype == np.int64
    assert dataset_index.tolist() == chosen
    assert sample_index.tolist() == within


def test_compiled_loop_is_used_when_numba_is_installed():
    pytest.importorskip("numba")
    weights = np.asarray(normalize(list(np.random.default_rng(2).random(30))))
    compiled = compiled_blending_indices(weights, 50_000)
    assert compiled is not None
    expected = numpy_blending_indices(weights.tolist(), 50_000)
    assert np.array_equal(compiled[0], expected[0]) and np.array_equal(compiled[1], expected[1])


def test_the_loop_compiles_where_numba_finds_no_place_for_its_cache():
    """numba refuses cache=True at decoration when it can find no writable cache place (a read-only
    image, a user without a home): the loop then compiles uncached instead of failing the import. A
    function with no source file on disk is refused the same way."""
    numba = pytest.importorskip("numba")
    from gptrain.data import blend_loop

    namespace: dict = {}
    exec("def double(x):\n    return 2 * x\n", namespace)  # no file: numba has no locator for it
    with pytest.raises(RuntimeError, match="cannot cache"):
        numba.njit(cache=True)(namespace["double"])
    assert blend_loop._compile(namespace["double"])(21) == 42


@pytest.mark.parametrize("damaged", ["nbi", "nbc"])  # numba's index, or its compiled code
def test_a_damaged_numba_cache_is_compiled_again(tmp_path, monkeypatch, caplog, damaged):
    """A numba cache file cut short (a node that crashed after compiling, a full disk) made every
    later blend stop with numba's EOFError as a traceback: numba does not recompile on it."""
    numba = pytest.importorskip("numba")
    from gptrain.data import blend_loop

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    weights = np.asarray(normalize([0.2, 0.5, 0.3]))
    expected = [np.asarray(column) for column in slow_blend(weights.tolist(), 500)]
    numba.njit(cache=True)(blend_loop._blend)(weights, 500)  # writes the cache under tmp_path
    for path in tmp_path.rglob(f"*.{damaged}"):
        path.write_bytes(b"")
    monkeypatch.setattr(blend_loop, "_compiled", numba.njit(cache=True)(blend_loop._blend))
    for _ in range(2):  # the second call uses the loop compiled the first time
        got = compiled_blending_indices(weights, 500)
        assert got is not None and all(map(np.array_equal, got, expected))
    assert caplog.text.count("cache of the blending loop") == 1 and str(tmp_path) in caplog.text
    fresh = numba.njit(cache=True)(blend_loop._blend)  # the next process: the cache is written again
    assert all(map(np.array_equal, fresh(weights, 500), expected))
    assert all(path.stat().st_size for path in tmp_path.rglob("*.nb*"))


def test_a_numba_cache_that_cannot_be_saved_is_compiled_without_it(tmp_path, monkeypatch, caplog):
    """Saving the compiled loop to a full disk was numba's OSError as a traceback at every blend."""
    numba = pytest.importorskip("numba")
    from numba.core import caching

    from gptrain.data import blend_loop

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(caching.IndexDataCacheFile, "save", full_disk)
    monkeypatch.setattr(blend_loop, "_compiled", numba.njit(cache=True)(blend_loop._blend))
    weights = np.asarray(normalize([0.3, 0.7]))
    got = compiled_blending_indices(weights, 300)
    assert got is not None and [column.tolist() for column in got] == list(slow_blend(weights.tolist(), 300))
    assert "cannot be used (OSError: [Errno 28] No space left on device)" in caplog.text


def test_blended_items_and_locate(tmp_path):
    children = [Numbered(0, 10), Numbered(1, 10)]
    blend = BlendedDataset(children, [1, 3], 8, "train", cache_dir=str(tmp_path))
    assert blend.weights == [0.25, 0.75] and len(blend) == 8
    chosen, within = slow_blend([0.25, 0.75], 8)
    for i in range(8):
        assert blend.locate(i) == (chosen[i], within[i])
        assert blend[i].tolist() == [chosen[i], within[i]]


def test_oversampled_child_is_a_data_error(tmp_path):
    children = [Numbered(0, 2), Numbered(1, 100)]
    with pytest.raises(DataError, match=r"takes 5 samples from small \(train split\) which has only 2"):
        BlendedDataset(children, [0.5, 0.5], 10, "train", str(tmp_path), names=["small (train split)", "big"])


def test_a_child_asked_for_one_sample_past_its_end_is_refused_and_its_whole_length_builds(tmp_path):
    """The check's boundary: a blend of 10 at [0.5, 0.5] takes 5 samples from each child. One of 4
    is refused (read on, its sample 4 would be an IndexError mid-training); one of 5 gives each of
    its samples exactly once."""
    names = ["small (train split)", "big"]
    with pytest.raises(DataError, match=r"takes 5 samples from small \(train split\) which has only 4"):
        BlendedDataset(
            [Numbered(0, 4), Numbered(1, 100)], [0.5, 0.5], 10, "train", str(tmp_path), names=names
        )
    blend = BlendedDataset(
        [Numbered(0, 5), Numbered(1, 100)], [0.5, 0.5], 10, "train", str(tmp_path), names=names
    )
    taken = sorted(int(blend[i][1]) for i in range(len(blend)) if blend[i][0] == 0)
    assert taken == [0, 1, 2, 3, 4]


def test_bad_weights_are_data_errors(tmp_path):
    for weights in ([1, -1], [0, 0], [1, 0], [1, float("nan")]):  # Megatron-core asserts each > 0
        with pytest.raises(DataError, match=r"blend weights must be positive"):
            BlendedDataset([Numbered(0, 5), Numbered(1, 5)], weights, 4, "train", str(tmp_path))
    with pytest.raises(DataError, match="one weight each"):
        BlendedDataset([Numbered(0, 5)], [1, 2], 4, "train", str(tmp_path))


def test_blend_cache_is_reused_and_keyed(tmp_path):
    children = [Numbered(0, 50), Numbered(1, 50)]
    first = BlendedDataset(children, [1, 2], 60, "train", str(tmp_path))
    again = BlendedDataset(children, [1, 2], 60, "train", str(tmp_path))
    assert not first.cache_hit and again.cache_hit
    assert again.dataset_index.tolist() == first.dataset_index.tolist()
    other = BlendedDataset(children, [2, 1], 60, "train", str(tmp_path))
    assert not other.cache_hit and other.dataset_index.tolist() != first.dataset_index.tolist()
    assert len(list(tmp_path.iterdir())) == 6


@pytest.mark.parametrize("name", ["dataset_index", "dataset_sample_index"])
def test_blend_cache_of_the_wrong_length_is_rebuilt(tmp_path, caplog, name):
    """A half-copied cache directory: well-formed .npy files of another blend are a miss, not an
    IndexError later."""
    children = [Numbered(0, 50), Numbered(1, 50)]
    first = BlendedDataset(children, [1, 2], 60, "train", str(tmp_path))
    shorter = BlendedDataset(children, [1, 2], 30, "train", str(tmp_path / "other"))
    (tmp_path / f"{first.digest}-BlendedDataset-train-{name}.npy").write_bytes(
        (tmp_path / "other" / f"{shorter.digest}-BlendedDataset-train-{name}.npy").read_bytes()
    )
    again = BlendedDataset(children, [1, 2], 60, "train", str(tmp_path))
    assert not again.cache_hit and len(again) == 60
    assert [again[i].tolist() for i in range(60)] == [first[i].tolist() for i in range(60)]
    assert f"{name} has shape (30,), expected (60,)" in caplog.text
    assert BlendedDataset(children, [1, 2], 60, "train", str(tmp_path)).cache_hit  # rewritten


def test_the_blend_is_counted_per_dataset_without_widening_the_whole_index():
    """np.bincount widens its input to int64 (8 bytes a sample); at 1.5e8 samples that was 1.2 GB
    on every rank at every start, for a check of a memory-mapped cache."""
    import tracemalloc

    from gptrain.data.blended import count_by_dataset

    rng = np.random.default_rng(0)
    index = rng.integers(0, 5, size=(1 << 22) + 123, dtype=np.int16)
    index[-1] = 6  # the last chunk is short and holds the highest dataset
    tracemalloc.start()
    counted = count_by_dataset(index, 7, chunk=1 << 16)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(counted, np.bincount(index, minlength=7))
    assert peak < len(index)  # well under a byte a sample; bincount alone takes 8


_WEIGHTS = st.one_of(
    st.integers(1, 10).map(float), st.floats(1e-6, 1e3), st.sampled_from([1e-9, 0.1, 1.0, 3.0])
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_WEIGHTS, min_size=1, max_size=12), st.integers(0, 3000))
def test_blend_order_is_the_greedy_rule_for_drawn_weights(weights, size):
    """Ties (equal or integer weights), weights a billion times apart, and every size up to a few
    thousand: both implementations give the rule's order, step by step."""
    w = normalize(weights)
    chosen, within = slow_blend(w, size)
    for implementation in (blending_indices, numpy_blending_indices):
        dataset_index, sample_index = implementation(w, size)
        assert dataset_index.tolist() == chosen and sample_index.tolist() == within
