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

from gptrain.parallel.float8 import is_float8_gathered, refresh_float8_scales

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
    """The model's weights as plain tensors (DTensors under FSDP/TP), sharing the live storage: DCP
    loads into them in place."""
    state = get_model_state_dict(model, options=OPTIONS)
    return {key: _unwrapped(value) if is_float8_gathered(value) else value for key, value in state.items()}


def _unwrapped(weight: torch.Tensor) -> torch.Tensor:
    """A weight FSDP gathers as float8 over torchao's wrapper's own values: the wrapper's storage is a
    placeholder that a copy storage by storage (the CPU background save's stager) took for the values,
    and saving it pickles torchao's class into the checkpoint (DCP's weights-only tools refuse it)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(weight, DTensor):
        return weight._tensor
    return DTensor.from_local(
        weight._local_tensor._tensor,
        weight.device_mesh,
        weight.placements,
        run_check=False,
        shape=weight.shape,
        stride=weight.stride(),
    )


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
    untouched = not optimizer.state
    state = get_optimizer_state_dict(model, optimizer, options=OPTIONS)
    if untouched:
        _undo_the_state_filling_step(optimizer)
        state = get_optimizer_state_dict(model, optimizer, options=OPTIONS)
    if _output_is_copy(model):
        state = _rename(state, OUTPUT, EMBEDDING)
    return pack_param_groups(state, None if saved is None else set(saved))


def _undo_the_state_filling_step(optimizer: torch.optim.Optimizer) -> None:
    """torch fills an optimizer without state (no update yet: a save before the first step, or
    after fp16's first skipped ones) by a step with zero gradients at lr 0, which leaves each
    parameter's step count at 1. The first real update would then be bias-corrected as a second.
    Zero moments at step 0 are what a fresh optimizer holds: the counts go back to 0."""
    for parameter_state in optimizer.state.values():
        step = parameter_state.get("step")
        if isinstance(step, torch.Tensor):
            step.zero_()
        elif step is not None:
            parameter_state["step"] = 0


def load_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> list[str]:
    """`state` in either layout, or in both (one per parameter): its moments and step counts. The
    settings stay this optimizer's, built from the run's config (a run resumed with another weight
    decay, betas or eps trains with them, as its hparams.yaml says; the learning rate is the
    schedule's). Returns a note for each setting that did not come from the checkpoint or differs
    from it, for the log."""
    filled: list[str] = []
    configured = [
        {name: value for name, value in group.items() if name != "params"} for group in optimizer.param_groups
    ]
    state = unpack_param_groups(state, live_hyperparameters(optimizer), filled)
    if _output_is_copy(model):
        state = _rename(state, EMBEDDING, OUTPUT)
    set_optimizer_state_dict(model, optimizer, state, options=OPTIONS)
    changed = _restore_settings(optimizer, configured)
    return [f"{name} (not in the checkpoint)" for name in filled] + changed


# Set by the LR schedule at every step from its own state (loaded with the checkpoint's schedule).
SCHEDULED = frozenset({"lr", "initial_lr"})


def _restore_settings(optimizer: torch.optim.Optimizer, configured: list[dict[str, Any]]) -> list[str]:
    """Put the configured settings back into the loaded groups (in the same order: the same
    optimizer); 'weight_decay 0.1 -> 0.5' once for each setting whose loaded value differed."""
    changed: list[str] = []
    for group, settings in zip(optimizer.param_groups, configured, strict=True):
        for name, value in settings.items():
            if name in SCHEDULED:
                continue
            if name in group and not _equal(group[name], value):
                note = f"{name} {group[name]!r} -> {value!r}"
                if note not in changed:
                    changed.append(note)
            group[name] = value
    return changed


def _equal(a: Any, b: Any) -> bool:
    """The same setting: betas as a list or a tuple, 0 or 0.0; True is not 1."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def pack_param_groups(state: dict[str, Any], packed_in: set[str] | None = None) -> dict[str, Any]:
    """`param_groups.<fqn>.<name>` entries gathered into one `param_groups.<fqn>` tuple of (name, value)
    pairs per parameter (a tuple is one DCP item). Left apart: a parameter with a tensor among them
    (that tensor is still saved and resharded as one), and, where `packed_in` is given (a checkpoint's
    keys), a parameter whose packed key it lacks; of such a parameter's settings, only those the
    checkpoint holds (`unpack_param_groups` fills in the others)."""
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
        if packed_in is not None and parameter not in packed_in:
            packed |= {
                f"{parameter}.{name}": value
                for name, value in pairs
                if isinstance(value, torch.Tensor) or f"{parameter}.{name}" in packed_in
            }
        elif tensor:
            packed |= {f"{parameter}.{name}": value for name, value in pairs}
        else:
            packed[parameter] = tuple(sorted(pairs))
    return packed


def unpack_param_groups(
    state: dict[str, Any], live: dict[str, Any] | None = None, filled: list[str] | None = None
) -> dict[str, Any]:
    """The flattened layout `set_optimizer_state_dict` takes, from either layout.

    `live`: the optimizer's hyperparameters (`live_hyperparameters`). A setting a parameter lacks in
    the checkpoint (saved by another torch version's optimizer, whose AdamW had fewer flags) is taken
    from the optimizer, as torch's own `Optimizer.load_state_dict` does, and its name appended to
    `filled`; one whose value differs between the optimizer's groups (lr, weight decay) cannot be
    taken so, and is refused naming it, rather than failing inside torch."""
    unpacked: dict[str, Any] = {}
    names: dict[str, set[str]] = {}  # parameter -> the settings the checkpoint gave it
    for key, value in state.items():
        if key.startswith(GROUPS) and isinstance(value, tuple) and _is_packed(value):
            unpacked |= {f"{key}.{name}": item for name, item in value}
            names.setdefault(key, set()).update(name for name, _ in value)
        else:
            unpacked[key] = value
            if key.startswith(GROUPS):
                parameter, _, name = key.rpartition(".")
                names.setdefault(parameter, set()).add(name)
    for parameter, present in names.items():
        missing = sorted(set(live or {}) - present)
        varying = [name for name in missing if live[name] is VARIES]
        if varying:
            from gptrain.checkpoint.compat import CheckpointMismatchError

            raise CheckpointMismatchError(
                f"the checkpoint's optimizer state has no {', '.join(varying)} for "
                f"{parameter.removeprefix(GROUPS)}: resume with the torch version and config that saved it, "
                "or start a new run from it without its optimizer "
                "(exp_manager.resume_from_checkpoint=<it> exp_manager.load_optimizer=false)"
            )
        unpacked |= {f"{parameter}.{name}": live[name] for name in missing}
        if filled is not None:
            filled.extend(name for name in missing if name not in filled)
    return unpacked


def _is_packed(value: tuple) -> bool:
    return bool(value) and all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in value
    )


class _Varies:
    def __repr__(self) -> str:
        return "VARIES"


VARIES = _Varies()  # a hyperparameter whose value differs between the optimizer's groups


def live_hyperparameters(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Each setting torch's flattened state holds for every parameter (all but a group's `params`),
    with its value where every group has the same one (torch's flags), else `VARIES`."""
    values: dict[str, Any] = {}
    for group in optimizer.param_groups:
        for name, value in group.items():
            if name == "params":
                continue
            if name not in values:
                values[name] = value
            elif values[name] is not VARIES and not _same(values[name], value):
                values[name] = VARIES
    present_everywhere = set.intersection(*(set(group) for group in optimizer.param_groups))
    return {name: value if name in present_everywhere else VARIES for name, value in values.items()}


def _same(a: Any, b: Any) -> bool:
    """Equal non-tensor values (a tensor setting is per group state: never filled in)."""
    return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and _equal(a, b)
