"""Megatron's blending order as one compiled loop (numba), when numba is installed.

The greedy rule is sequential: sample k goes to the dataset with the largest
`w_i * max(k, 1) - count_i` (the first index wins ties). A compiled loop over
samples x datasets does it at Megatron's C++ speed whatever the number of
datasets; gptrain.data.blended falls back to its exact numpy path without numba.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from typing import Any

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

logger = logging.getLogger(__name__)


def _blend(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    counts = np.zeros(weights.shape[0], dtype=np.int64)
    for k in range(size):
        step = float(max(k, 1))
        best = 0
        best_error = weights[0] * step - counts[0]
        for i in range(1, weights.shape[0]):
            error = weights[i] * step - counts[i]
            if error > best_error:
                best, best_error = i, error
        dataset_index[k] = best
        sample_index[k] = counts[best]
        counts[best] += 1
    return dataset_index, sample_index


def _compile(function):
    """numba's njit, with its on-disk cache where it can find a writable place for one: it refuses
    `cache=True` at decoration when neither the package's directory nor ~/.cache is writable (a
    read-only image, a user without a home); the loop then compiles at each process's first blend."""
    if numba is None:
        return None
    try:
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:
        return numba.njit(nogil=True)(function)


_compiled = _compile(_blend)


def compiled_blending_indices(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The blending indices from the compiled loop, or None when numba is not available."""
    global _compiled
    if _compiled is None:
        return None
    args = (np.ascontiguousarray(weights, dtype=np.float64), int(size))
    try:
        return _compiled(*args)
    except Exception as error:  # whatever unpickling a damaged cache file raises
        if not _raised_reading_the_cache(error):
            raise
        _compiled = _drop_damaged_cache(_compiled, error)
    return _compiled(*args)


def _raised_reading_the_cache(error: BaseException) -> bool:
    """Whether `error` comes from numba's on-disk cache (numba.core.caching), not from the loop."""
    suffix = os.path.join("numba", "core", "caching.py")
    return any(
        frame.f_code.co_filename.endswith(suffix) for frame, _ in traceback.walk_tb(error.__traceback__)
    )


def _drop_damaged_cache(dispatcher: Any, error: Exception) -> Any:
    """numba raises (EOFError, UnpicklingError) on a cache file cut short, by a node that crashed
    after compiling or a full disk, at every later start; it does not recompile (nor go on when
    saving to a full disk fails). The cache is emptied (numba writes it again on the next compile)
    and this process compiles without it."""
    cache = dispatcher._cache
    logger.warning(
        "numba's cache of the blending loop in %s cannot be used (%s: %s); compiling it again",
        cache.cache_path,
        type(error).__name__,
        error,
    )
    with contextlib.suppress(Exception):  # a read-only cache stays as it is; this run compiles
        cache.flush()
    return numba.njit(nogil=True)(_blend)
