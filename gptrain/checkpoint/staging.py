"""An async save's staging choices: whether torch's stager serves one save only, a state in host memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from gptrain.checkpoint.staging_buffer import host_buffer_like


def _stager_serves_one_save(version: str) -> bool:
    """torch 2.11 and 2.12's DefaultStager empties its copy table at the end of each stage, so a
    second save through it fails (KeyError: <class 'type'>); 2.13 keeps it, and its host copies,
    for the run. Where it serves one save, each CPU save gets its own (the CPU copies are not
    pinned, so nothing worth keeping is lost)."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) < (2, 13)


STAGER_SERVES_ONE_SAVE = _stager_serves_one_save(torch.__version__)


def _tensors(state: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested state dict."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from _tensors(value)


def in_host_memory(state: Any) -> bool:
    return all(tensor.device.type == "cpu" for tensor in _tensors(state))


def allocate_pinned_staging(state: dict[str, Any]) -> dict[str, Any]:
    """Host tensors shaped like `state`'s, pinned: what BlockingAsyncStager would allocate at its
    first stage and keep (its `state_dict_cache`), in one pass instead of two."""
    return host_buffer_like(state, pin_memory=True)
