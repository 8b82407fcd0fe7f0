"""Megatron's blending order as one compiled loop (numba), when numba is installed.

The greedy rule is sequential: sample k goes to the dataset with the largest
`w_i * max(k, 1) - count_i` (the first index wins ties). A compiled loop over
samples x datasets does it at Megatron's C++ speed whatever the number of
datasets; gptrain.data.blended falls back to its exact numpy path without numba.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None


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
    if _compiled is None:
        return None
    return _compiled(np.ascontiguousarray(weights, dtype=np.float64), int(size))
