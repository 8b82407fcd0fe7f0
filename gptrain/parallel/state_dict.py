"""Model and optimizer state dicts that load under any other parallel layout.

Keys are the single-process FQNs (the DCP helpers strip DDP/FSDP/checkpoint/compile
wrapper names; `ParallelGPT` registers chunks under the whole model's names). The
optimizer state is flattened per parameter (`state.<fqn>.<key>`, and each parameter's
hyperparameters as one item `param_groups.<fqn>`: a tuple of (name, value) pairs):
unflattened, the one `param_groups` list would be written by a single rank and be wrong for
every other pipeline stage. Checkpoints before 2026-11-26 hold one item per hyperparameter
(`param_groups.<fqn>.<name>`, DCP's own flattening: 11 per parameter, three quarters of a
save's items, each planned, pickled and written on its own); they still load:
`optimizer_state_dict(..., saved=...)` lays each parameter out as the checkpoint has it.

A tied embedding is one parameter in a single-process model, but two under pipeline
parallelism (`output.weight` on the last stage is a synchronised copy). The copy's
optimizer state is saved and loaded under the embedding's name, so checkpoints look
the same in both cases and load into either.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from gptrain.parallel.float8 import refresh_float8_scales

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
GROUPS = "param_groups."
EMBEDDING, OUTPUT = "tok_embeddings.weight", "output.weight"


def _output_is_copy(model: nn.Module) -> bool:
    """True on a pipeline rank holding the untied output copy of a tied embedding."""
    ctx = getattr(model, "ctx", None)
    return (
        getattr(ctx, "embedding_group", None) is not None and getattr(model, "tok_embeddings", None) is None
    )


def _rename(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    renamed = {}
    for key, value in state.items():
        for prefix in ("state.", "param_groups."):
            if key.startswith(prefix + old + "."):
                key = prefix + new + key[len(prefix + old) :]
        renamed[key] = value
    return renamed


def model_state_dict(model: nn.Module) -> dict[str, Any]:
    return get_model_state_dict(model, options=OPTIONS)


def load_model_state_dict(model: nn.Module, state: dict[str, Any]) -> None:
    """Load `state` into `model`; weights FSDP gathers as float8 get scales of the loaded values."""
    set_model_state_dict(model, state, options=OPTIONS)
    refresh_float8_scales(model)


def optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: Collection[str] | None = None
) -> dict[str, Any]:
    """`saved`: the optimizer keys of a checkpoint to load into this state (DCP's, without the
    section's `optim.`): each parameter's hyperparameters are laid out as it holds them, packed or
    one item each (before 2026-11-26). None: packed, as saved now."""
    state = get_optimizer_state_dict(model, optimizer, options=OPTIONS)
    if _output_is_copy(model):
        state = _rename(state, OUTPUT, EMBEDDING)
    return pack_param_groups(state, None if saved is None else set(saved))


def load_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """`state` in either layout, or in both (one per parameter)."""
    state = unpack_param_groups(state, _hyperparameter_names(optimizer))
    if _output_is_copy(model):
        state = _rename(state, EMBEDDING, OUTPUT)
    set_optimizer_state_dict(model, optimizer, state, options=OPTIONS)


def pack_param_groups(state: dict[str, Any], packed_in: set[str] | None = None) -> dict[str, Any]:
    """`param_groups.<fqn>.<name>` entries gathered into one `param_groups.<fqn>` tuple of (name, value)
    pairs per parameter (a tuple is one DCP item). Left apart: a parameter with a tensor among them
    (that tensor is still saved and resharded as one), and, where `packed_in` is given (a checkpoint's
    keys), a parameter whose packed key it lacks."""
    gathered: dict[str, list[tuple[str, Any]]] = {}
    packed = {}
    for key, value in state.items():
        if key.startswith(GROUPS):
            parameter, _, name = key.rpartition(".")
            gathered.setdefault(parameter, []).append((name, value))
        else:
            packed[key] = value
    for parameter, pairs in gathered.items():
        tensor = any(isinstance(value, torch.Tensor) for _, value in pairs)
        if tensor or (packed_in is not None and parameter not in packed_in):
            packed |= {f"{parameter}.{name}": value for name, value in pairs}
        else:
            packed[parameter] = tuple(sorted(pairs))
    return packed


def unpack_param_groups(state: dict[str, Any], expected: set[str] | None = None) -> dict[str, Any]:
    """The flattened layout `set_optimizer_state_dict` takes, from either layout. `expected`: the
    hyperparameter names the optimizer has; a packed parameter without one of them is refused,
    naming it (saved under another torch version's optimizer), rather than failing inside torch."""
    unpacked = {}
    for key, value in state.items():
        if key.startswith(GROUPS) and isinstance(value, tuple) and _is_packed(value):
            missing = sorted((expected or set()) - {name for name, _ in value})
            if missing:
                from gptrain.checkpoint.compat import CheckpointMismatchError

                raise CheckpointMismatchError(
                    f"the checkpoint's optimizer state has no {', '.join(missing)} for "
                    f"{key.removeprefix(GROUPS)} (saved by another torch version's optimizer): resume with "
                    "the torch version that saved it, or start a new run from it without its optimizer "
                    "(exp_manager.resume_from_checkpoint=<it> exp_manager.load_optimizer=false)"
                )
            unpacked |= {f"{key}.{name}": item for name, item in value}
        else:
            unpacked[key] = value
    return unpacked


def _is_packed(value: tuple) -> bool:
    return bool(value) and all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in value
    )


def _hyperparameter_names(optimizer: torch.optim.Optimizer) -> set[str]:
    """What torch's flattened state holds for every parameter (all but the group's `params`)."""
    return {name for group in optimizer.param_groups for name in group if name != "params"}
