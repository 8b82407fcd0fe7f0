"""Host buffers shaped like a training state, into which async saves copy it.

torch's own allocator for this (`_create_cpu_state_dict(pin_memory=True)`) allocates each tensor
unpinned and then copies it into pinned memory (`.pin_memory()`): one more pass over the whole
state (16 GB at 1.3B) on the thread that competes with training. For a DTensor it first copies
the device shard to the host only to learn its shape, so a sharded state's buffer could not be
prepared in the background. Here each tensor is allocated pinned at once and a DTensor's host
twin takes its spec without reading the device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def host_buffer_like(state: Any, pin_memory: bool) -> Any:
    """A nested state of new host tensors shaped like `state`'s tensors (contents undefined);
    other leaves are kept as they are, as torch's stager expects."""
    if isinstance(state, DTensor):
        return _host_dtensor_like(state, pin_memory)
    if isinstance(state, torch.Tensor):
        return _host_tensor_like(state, pin_memory)
    if isinstance(state, dict):
        return {key: host_buffer_like(value, pin_memory) for key, value in state.items()}
    if isinstance(state, list):
        return [host_buffer_like(value, pin_memory) for value in state]
    if isinstance(state, tuple):  # a namedtuple too: a plain tuple, as torch's allocator gives
        return tuple(host_buffer_like(value, pin_memory) for value in state)
    return state


def _host_tensor_like(tensor: torch.Tensor, pin_memory: bool) -> torch.Tensor:
    if tensor.dim() == 0 or tensor.numel() == 0:
        return torch.zeros(tensor.shape, dtype=tensor.dtype)  # nothing to pin
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin_memory)


def _host_dtensor_like(tensor: DTensor, pin_memory: bool) -> DTensor:
    """A DTensor with `tensor`'s spec (mesh, placements, global shape) over a host local tensor:
    what torch's stager makes with `tensor.to("cpu")`, without the copy."""
    local = _host_tensor_like(tensor._local_tensor, pin_memory)
    return DTensor(local, tensor._spec, requires_grad=False)
