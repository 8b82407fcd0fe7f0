"""AdamW with Megatron's weight-decay rule: biases and norm weights (1-D tensors) get none."""

from __future__ import annotations

import torch
from torch import nn

from gptrain.errors import ConfigError

OPTIMIZER_NAMES = ("adamw", "adam", "fused_adam", "distributed_fused_adam")


def is_no_decay(name: str, param: torch.Tensor) -> bool:
    """Biases and the gains of LayerNorm/RMSNorm are 1-D; decaying them only hurts."""
    return param.ndim < 2 or name.endswith(".bias")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed matrices/embeddings and undecayed 1-D parameters (trainable only)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if is_no_decay(name, param) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] | list[float],
    eps: float,
    device_type: str,
) -> torch.optim.AdamW:
    """AdamW; NeMo's fused/distributed Adam names map to it. Fused kernels on CUDA."""
    if name not in OPTIMIZER_NAMES:
        raise ConfigError(f"model.optim.name={name!r} is not supported; use 'adamw'")
    if len(betas) != 2:
        raise ConfigError(f"model.optim.betas={list(betas)} must have two values, e.g. [0.9, 0.95]")
    return torch.optim.AdamW(
        param_groups(model, weight_decay),
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=eps,
        fused=device_type == "cuda",
    )
