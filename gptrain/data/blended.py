"""Weighted blends of datasets, with Megatron-LM's greedy blending order.

Sample k of the blend comes from the dataset i with the largest error
`w_i * max(k, 1) - count_i` (first index on ties, float64 as Megatron's C++ computes it),
and is that dataset's next unused sample. Reproducing the exact order matters: a blend
resumed from a Megatron checkpoint must continue with the same samples.

The rule is sequential, but its state is predictable: after k samples the counts are
close to `w * k`. `blending_indices` guesses the count vectors of a whole chunk of samples
at once, sharpens the guess with a few vectorised greedy steps, then checks every step
against the rule and replays only the steps where the guess was wrong, in plain Python.
The result is exactly the sequential rule's (tested against a slow reference).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gptrain.data.blend_loop import compiled_blending_indices
from gptrain.data.blend_spec import MAX_BLEND_DATASETS
from gptrain.data.index_cache import IndexCache, describe
from gptrain.errors import DataError

logger = logging.getLogger(__name__)

INDEX_NAMES = ("dataset_index", "dataset_sample_index")
# Greedy steps applied to the guess before replaying its wrong rows: they pay off for a few
# datasets (7: 4 rounds halve the time) but cost more than they save for many (20: none is best).
_GUESS_ROUNDS_FEW, _FEW_DATASETS = 4, 8
_MASK = (1 << 64) - 1


class ChildDataset(Protocol):
    description: str

    def __len__(self) -> int: ...

    def __getitem__(self, idx: int) -> np.ndarray: ...


def normalize(weights: Sequence[float]) -> list[float]:
    """Weights divided by their float64 sum (Megatron's `normalize`)."""
    array = np.array(weights, dtype=np.float64)
    return (array / np.sum(array)).tolist()


def _guess_states(weights: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Likely counts before each step k: floor(w(k-1)) plus one for the S+1 largest remainders."""
    quota = weights[:, None] * np.maximum(steps - 1, 0)[None, :].astype(np.float64)
    floors = np.floor(quota)
    extra_seats = np.maximum(steps - 1, 0) - floors.sum(axis=0).astype(np.int64) + 1
    order = np.argsort(floors - quota, axis=0, kind="stable")  # largest remainder first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(len(weights))[:, None], order.shape), axis=0)
    guess = floors.astype(np.int64) + (rank < extra_seats[None, :])
    guess[:, steps == 0] = 0
    return guess


def _decide(weights: np.ndarray, steps: np.ndarray, states: np.ndarray) -> np.ndarray:
    """The greedy choice at each step from the given counts (argmax keeps the first maximum)."""
    scale = np.maximum(steps, 1).astype(np.float64)
    return np.argmax(weights[:, None] * scale[None, :] - states, axis=0)


def _replay(weights: list[float], first_step: int, guess: _Guess, row: int) -> int:
    """Follow the rule in plain Python from the true state at `row` until it meets the guess.

    Overwrites the choices and sample numbers of the rows it passes; returns the row where
    the guess is right again (or the chunk's end, whose state it then stores).
    """
    counts = guess.states[:, row].tolist()
    signature = int(guess.signatures[row])
    keys = guess.keys
    last = guess.states.shape[1] - 1
    while True:
        scale = float(max(first_step + row, 1))
        errors = [w * scale - c for w, c in zip(weights, counts, strict=True)]
        choice = errors.index(max(errors))
        guess.choices[row] = choice
        guess.within[row] = counts[choice]
        counts[choice] += 1
        signature = (signature + keys[choice]) & _MASK
        row += 1
        if row == last:
            guess.states[:, row] = counts
            return row
        # A cheap signature comparison first: the full one only when it matches.
        if signature == int(guess.signatures[row]) and counts == guess.states[:, row].tolist():
            return row


@dataclass
class _Guess:
    """Guessed counts before each step of a chunk (datasets x steps), with the choices they imply."""

    states: np.ndarray
    choices: np.ndarray
    within: np.ndarray
    signatures: np.ndarray
    keys: list[int]


def _guess_chunk(weights: np.ndarray, steps: np.ndarray, counts: np.ndarray) -> tuple[_Guess, np.ndarray]:
    """The sharpened guess for steps[:-1] and the rows whose successor breaks the rule."""
    states = _guess_states(weights, steps)
    states[:, 0] = counts
    rows = np.arange(len(steps) - 1)
    rounds = _GUESS_ROUNDS_FEW if len(weights) <= _FEW_DATASETS else 0
    for round_ in range(rounds + 1):
        choices = _decide(weights, steps[:-1], states[:, :-1])
        followed = states[:, :-1].copy()
        followed[choices, rows] += 1
        wrong = np.flatnonzero((followed != states[:, 1:]).any(axis=0))
        if len(wrong) == 0 or round_ == rounds:
            break
        states[:, 1:] = followed  # one greedy step from every guessed state sharpens the guess
    keys = np.random.default_rng(0).integers(1, 1 << 62, size=len(weights), dtype=np.int64).astype(np.uint64)
    signatures = keys @ states.astype(np.uint64)  # wraps modulo 2**64, as _MASK does in Python
    within = states[choices, rows]
    return _Guess(states, choices, within, signatures, [int(k) for k in keys]), wrong


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index int16, dataset_sample_index int64) of a blend of `size` samples."""
    compiled = compiled_blending_indices(np.asarray(weights, dtype=np.float64), size)
    return compiled if compiled is not None else numpy_blending_indices(weights, size)


def numpy_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """The same indices without a compiler: guess chunks with numpy, replay wrong steps exactly."""
    weight_array = np.asarray(weights, dtype=np.float64)
    weight_list = weight_array.tolist()
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    counts = np.zeros(len(weight_array), dtype=np.int64)
    chunk = max(1024, min(1 << 16, (1 << 21) // max(1, len(weight_array))))
    for start in range(0, size, chunk):
        stop = min(size, start + chunk)
        guess, wrong = _guess_chunk(weight_array, np.arange(start, stop + 1, dtype=np.int64), counts)
        row = 0
        # The first wrong row's state is right; a replay rewrites rows only up to where it
        # meets the guess again, so the later flags stay valid.
        for bad in wrong.tolist():
            if bad >= row:
                row = _replay(weight_list, start, guess, bad)
        dataset_index[start:stop] = guess.choices
        sample_index[start:stop] = guess.within
        counts = guess.states[:, -1]
    return dataset_index, sample_index


class BlendedDataset:
    """Samples of several datasets interleaved by normalised weights; `size` samples in all."""

    def __init__(
        self,
        datasets: Sequence[ChildDataset],
        weights: Sequence[float],
        size: int,
        split: str,
        cache_dir: str | None = None,
        use_cache: bool = True,
        names: Sequence[str] | None = None,
    ) -> None:
        if len(datasets) != len(weights) or not datasets or len(datasets) > MAX_BLEND_DATASETS:
            raise DataError(
                f"a blend needs 1 to {MAX_BLEND_DATASETS} datasets with one weight each, got {len(datasets)}"
            )
        if any(not w > 0 for w in weights):  # Megatron-core's BlendedDataset asserts the same
            raise DataError(f"blend weights must be positive, got {list(weights)}")
        self.datasets = list(datasets)
        self.names = list(names) if names is not None else [f"dataset {i}" for i in range(len(datasets))]
        self.weights = normalize(weights)
        self.size, self.split = size, split
        self.description, self.digest = describe(self.identity())
        self.cache_hit = False
        self.dataset_index, self.dataset_sample_index = self._load_or_build(cache_dir, use_cache)

    def identity(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "datasets": [json.loads(child.description) for child in self.datasets],
            "split": self.split,
            "weights": self.weights,
            "size": self.size,
        }

    def _load_or_build(self, cache_dir: str | None, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
        cache = None
        if use_cache:
            directory = cache_dir or _default_cache_dir(self.datasets[0])
            cache = IndexCache(directory, self.digest, type(self).__name__, self.split)
            cached = cache.load(INDEX_NAMES, self._cache_problem)
            if cached is not None:
                self.cache_hit = True
                return cached["dataset_index"], cached["dataset_sample_index"]
        begin = time.perf_counter()
        dataset_index, sample_index = blending_indices(self.weights, self.size)
        logger.info("built %s %s blend of %d samples in %.3f s", type(self).__name__, self.split, self.size,
                    time.perf_counter() - begin)  # fmt: skip
        self._check_sizes(dataset_index)
        if cache is not None:
            cache.save(
                {"dataset_index": dataset_index, "dataset_sample_index": sample_index}, self.description
            )
        return dataset_index, sample_index

    def _cache_problem(self, arrays: dict[str, np.ndarray]) -> str | None:
        """Why cached arrays cannot be this blend's indices (both hold `size` entries), or None."""
        for name in INDEX_NAMES:
            if arrays[name].shape != (self.size,):
                return f"{name} has shape {arrays[name].shape}, expected ({self.size},)"
        return None

    def _check_sizes(self, dataset_index: np.ndarray) -> None:
        used = count_by_dataset(dataset_index, len(self.datasets))
        for i, (child, count) in enumerate(zip(self.datasets, used, strict=True)):
            if count > len(child):
                raise DataError(
                    f"the {self.split} blend takes {count} samples from {self.names[i]} which has only "
                    f"{len(child)}, as Megatron stops too; raise model.data.mid_level_dataset_surplus "
                    "(Megatron's --mid-level-dataset-surplus, default 0.005): each dataset builds that much more"
                )

    def __len__(self) -> int:
        return int(self.dataset_index.shape[0])

    def locate(self, idx: int) -> tuple[int, int]:
        """(dataset number, sample number inside it) of blend sample `idx`."""
        return int(self.dataset_index[idx]), int(self.dataset_sample_index[idx])

    def __getitem__(self, idx: int) -> np.ndarray:
        dataset, sample = self.locate(idx)
        return self.datasets[dataset][sample]


def _default_cache_dir(child: Any) -> str:
    prefix = getattr(getattr(child, "dataset", None), "path_prefix", None)
    base = os.path.dirname(os.path.abspath(prefix)) if prefix else os.getcwd()
    return os.path.join(base, "cache", "BlendedDataset_indices")


def count_by_dataset(dataset_index: np.ndarray, datasets: int, chunk: int = 1 << 24) -> np.ndarray:
    """np.bincount of a (memory-mapped) dataset index, a chunk at a time: bincount widens its input
    to int64, 8 bytes a sample (1.2 GB for a blend of 1.5e8 samples, on every rank at each start)."""
    used = np.zeros(datasets, dtype=np.int64)
    for start in range(0, len(dataset_index), chunk):
        used += np.bincount(dataset_index[start : start + chunk], minlength=datasets)
    return used
