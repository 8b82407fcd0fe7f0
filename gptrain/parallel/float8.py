"""FP8 training of the block matmuls through torchao's float8 (tensorwise or rowwise scaling).

Applied per model chunk after TP and before activation checkpointing, compile and FSDP2, as
torchao and torchtitan order it. The output projection (vocabulary logits) stays in the training
precision: its error goes straight into the loss, and its shape is rarely a multiple of 16
under every layout. A device without FP8 tensor cores is a one-line error, not a slow fallback.
"""

from __future__ import annotations

import torch
from torch import nn

from gptrain.errors import ConfigError

FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper have FP8 tensor cores


def check_fp8_device(device: torch.device) -> None:
    """Raise ConfigError unless `device` can run FP8 matmuls."""
    if device.type != "cuda":
        raise ConfigError(
            f"model.fp8=true needs a CUDA GPU with FP8 tensor cores (Hopper or Ada); this run is on "
            f"{device.type}: set model.fp8=false"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            f"model.fp8=true needs FP8 tensor cores (compute capability >= 8.9, Hopper or Ada); "
            f"{name} has {capability[0]}.{capability[1]}: set model.fp8=false"
        )


def fp8_linear_filter(module: nn.Module, fqn: str) -> bool:
    """Linear layers of the blocks whose both dimensions are multiples of 16 (FP8 GEMM tiles)."""
    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] == "output":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_fp8(model: nn.Module, recipe: str = "tensorwise") -> nn.Module:
    """Swap the block Linears of `model` for torchao Float8Linear in place (names unchanged)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as error:
        raise ConfigError(
            "model.fp8=true needs torchao: pip install 'gptrain[fp8]' (or torchao>=0.12)"
        ) from error
    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=fp8_linear_filter)
    return model
