"""Model and optimizer state dicts that load under any other parallel layout.

Keys are the single-process FQNs (the DCP helpers strip DDP/FSDP/checkpoint/compile
wrapper names; `ParallelGPT` registers chunks under the whole model's names). The
optimizer state is flattened per parameter (`state.<fqn>.<key>`,
`param_groups.<fqn>.<key>`): unflattened, the one `param_groups` list would be written
by a single rank and be wrong for every other pipeline stage.

A tied embedding is one parameter in a single-process model, but two under pipeline
parallelism (`output.weight` on the last stage is a synchronised copy). The copy's
optimizer state is saved and loaded under the embedding's name, so checkpoints look
the same in both cases and load into either.
"""

from __future__ import annotations

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


def optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    state = get_optimizer_state_dict(model, optimizer, options=OPTIONS)
    return _rename(state, OUTPUT, EMBEDDING) if _output_is_copy(model) else state


def load_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    if _output_is_copy(model):
        state = _rename(state, EMBEDDING, OUTPUT)
    set_optimizer_state_dict(model, optimizer, state, options=OPTIONS)
