"""FP8 training of the block matmuls through torchao's float8 (tensorwise or rowwise scaling).

Applied per model chunk before TP, activation checkpointing, compile and FSDP2, as torchao and
torchtitan order it; under TP the block plan gives torchao's float8 styles (`fp8_tp_styles`) to
the converted linears and the plain styles to those the filter left out.
The output projection (vocabulary logits) stays in the training precision: its error goes
straight into the loss, and its shape is rarely a multiple of 16 under every layout. A device
without FP8 tensor cores is a one-line error, not a slow fallback.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from gptrain.errors import ConfigError
from gptrain.utils.quiet_imports import import_torchao_quietly

FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper have FP8 tensor cores


def check_fp8_device(device: torch.device) -> None:
    """Raise ConfigError unless `device` can run FP8 matmuls."""
    if device.type != "cuda":
        raise ConfigError(
            f"model.fp8=true needs a CUDA GPU with FP8 tensor cores (Hopper or Ada); this run is on "
            f"{device.type}: set model.fp8=false (model.fp8_emulate=true checks FP8 numerics without FP8 hardware, slowly)"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            f"model.fp8=true needs FP8 tensor cores (compute capability >= 8.9, Hopper or Ada); "
            f"{name} has {capability[0]}.{capability[1]}: set model.fp8=false"
        )


# Block linears split by output columns under TP (their local out_features is out / TP); the
# others (wo, w2) are split by input rows.
COLUMN_SPLIT = ("wq", "wk", "wv", "w1", "w3")


def fp8_linear_filter(module: nn.Module, fqn: str, tp: int = 1) -> bool:
    """Linear layers of the blocks whose local dimensions (this rank's shard under TP) are
    multiples of 16 (FP8 GEMM tiles); never the output projection."""
    name = fqn.split(".")[-1]
    if not isinstance(module, nn.Linear) or name == "output":
        return False
    shards = (1, tp) if name in COLUMN_SPLIT else (tp, 1)  # (in, out) pieces under TP
    sizes = (module.in_features, module.out_features)
    return all(size % (16 * pieces) == 0 for size, pieces in zip(sizes, shards, strict=True))


def is_float8_linear(module: nn.Module) -> bool:
    """Whether `apply_fp8` converted `module` (torchao's float8 TP styles accept nothing else)."""
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def fp8_config(recipe: str, fsdp_all_gather: bool = False, emulate: bool = False) -> Any:
    """torchao's Float8LinearConfig of `recipe` ('tensorwise' or 'rowwise'); `fsdp_all_gather`:
    FSDP gathers the weights as float8 (tensorwise only: one scale per weight fits a gather);
    `emulate`: the float8 casts with higher-precision matmuls (any device, numerics only)."""
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, enable_fsdp_float8_all_gather=fsdp_all_gather, emulate=emulate)


def gathers_float8(recipe: str, fsdp: bool, enabled: bool = True) -> bool:
    """Whether FSDP all-gathers float8 weights: tensorwise scaling under FSDP, unless turned off
    (`model.fp8_fsdp_all_gather`). Rowwise scales differ per row of the weight and of its
    transpose, so its weights are gathered in the training precision."""
    return enabled and fsdp and recipe == "tensorwise"


def apply_fp8(
    model: nn.Module,
    recipe: str = "tensorwise",
    tp: int = 1,
    fsdp_all_gather: bool = False,
    emulate: bool = False,
) -> nn.Module:
    """Swap the block Linears of `model` for torchao Float8Linear in place (names unchanged).

    Before tensor parallelism, as torchao and torchtitan order it: TP then shards the Float8Linear
    weights with the styles of `fp8_tp_styles`. With `fsdp_all_gather` the weights become torchao's
    float8-gathering tensors: call `refresh_float8_scales` whenever their values change."""
    try:
        import_torchao_quietly()
        from torchao.float8 import convert_to_float8_training
    except ImportError as error:
        raise ConfigError(
            "model.fp8=true needs torchao: pip install 'gptrain[fp8]' (or torchao>=0.12)"
        ) from error
    convert_to_float8_training(
        model,
        config=fp8_config(recipe, fsdp_all_gather, emulate),
        module_filter_fn=lambda m, fqn: fp8_linear_filter(m, fqn, tp),
    )
    return model


def has_float8_gathered_weights(module: nn.Module) -> bool:
    """Whether any weight of `module` is gathered by FSDP as float8 (`apply_fp8(fsdp_all_gather=True)`)."""
    return any(is_float8_gathered(param) for param in module.parameters())


def is_float8_gathered(param: torch.Tensor) -> bool:
    local = getattr(param, "_local_tensor", param)  # FSDP's parameters are DTensors
    return type(local).__name__ == "WeightWithDynamicFloat8CastTensor"


def refresh_float8_scales(module: nn.Module) -> None:
    """Recompute the float8 scale of every FSDP-gathered weight of `module` from its current values.

    The scales are used by the next all-gathers, so this runs after every change of the weights: each
    optimizer step (`refresh_scales_after_step`), a checkpoint load, initialisation. One all-reduce
    (max) for all weights of the rank's chunks; without it each gather would all-reduce its own
    weight's amax. A collective: every rank of the data-parallel group calls it together.
    """
    if not has_float8_gathered_weights(module):
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(module)


def refresh_scales_after_step(optimizer: torch.optim.Optimizer, module: nn.Module) -> None:
    """Refresh `module`'s float8 scales after each step of `optimizer` (no-op without gathered float8
    weights). A skipped step (overflow, non-finite loss) leaves the weights and so the scales as they are."""
    if has_float8_gathered_weights(module):
        optimizer.register_step_post_hook(lambda *_: refresh_float8_scales(module))


def fp8_tp_styles(recipe: str | None) -> tuple[Any, Any, Any | None]:
    """(column style, row style, input preparation) of the TP plan for FP8 `recipe` (None: no FP8).

    Tensorwise scaling casts to float8 before the tensor-parallel collectives (torchao's Float8*
    styles: the sequence-parallel all-gather moves float8 bytes); rowwise scales per row inside the
    matmul, so its linears take the plain styles."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if recipe != "tensorwise":
        return ColwiseParallel, RowwiseParallel, None
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
