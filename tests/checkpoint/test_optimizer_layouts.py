"""Optimizer hyperparameters are saved as one item per parameter; checkpoints with one item per
hyperparameter (saved before 2026-11-26) still load, exactly."""

import pytest
import torch

from gptrain.checkpoint.compat import read_metadata
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.models.config import GPTConfig
from gptrain.parallel.state_dict import (
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
    pack_param_groups,
    unpack_param_groups,
)
from gptrain.train.builders import build_model
from gptrain.train.optim import build_optimizer

CONFIG = GPTConfig(vocab_size=64, seq_length=8, num_layers=2, hidden_size=16, num_attention_heads=2)


def _trained(seed: int, lr: float):
    """A model and AdamW two steps in (moments, step counts), its learning rate set as a schedule would."""
    model = build_model(CONFIG, torch.device("cpu"), seed=seed)
    optimizer = build_optimizer(model, "adamw", 1e-3, 0.1, (0.9, 0.95), 1e-8, "cpu")
    generator = torch.Generator().manual_seed(seed)
    for _ in range(2):
        for parameter in model.parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        optimizer.step()
    for group in optimizer.param_groups:
        group["lr"] = lr
    return model, optimizer


def _assert_same_optimizer(loaded: torch.optim.Optimizer, saved: torch.optim.Optimizer) -> None:
    ours, theirs = loaded.state_dict(), saved.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]  # lr, betas, weight decay per group
    assert ours["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)


@pytest.mark.parametrize("packed", [True, False])
def test_either_layout_loads_every_hyperparameter_and_moment_exactly(tmp_path, packed) -> None:
    model, optimizer = _trained(seed=1, lr=1.234e-4)
    manager = CheckpointManager(tmp_path, keep_last=1)
    optim = optimizer_state_dict(model, optimizer)
    if not packed:  # as saved before 2026-11-26
        optim = unpack_param_groups(optim)
    path = manager.save(2, {"model": model_state_dict(model), "optim": optim}, {})

    keys = set(read_metadata(path).state_dict_metadata)
    groups = [key for key in keys if key.startswith("optim.param_groups.")]
    parameters = [name for name, _ in model.named_parameters()]
    if packed:  # one item per parameter, holding all its hyperparameters
        assert sorted(groups) == sorted(f"optim.param_groups.{name}" for name in parameters)
    else:  # one item per hyperparameter
        assert f"optim.param_groups.{parameters[0]}.lr" in groups and len(groups) > 5 * len(parameters)

    fresh_model, fresh_optimizer = _trained(seed=2, lr=1e-3)

    def state_to_load(saved):
        optim_keys = [key.removeprefix("optim.") for key in saved if key.startswith("optim.")]
        return {
            "model": model_state_dict(fresh_model),
            "optim": optimizer_state_dict(fresh_model, fresh_optimizer, optim_keys),
        }

    def apply(loaded):
        load_model_state_dict(fresh_model, loaded["model"])
        load_optimizer_state_dict(fresh_model, fresh_optimizer, loaded["optim"])

    loaded, _ = manager.load_newest_good(state_to_load, apply, pytest.fail)
    manager.close()
    assert loaded == path
    _assert_same_optimizer(fresh_optimizer, optimizer)
    for (name, ours), theirs in zip(fresh_model.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(ours, theirs), name


def test_a_tensor_hyperparameter_is_kept_as_an_item_of_its_own() -> None:
    """So it is still saved (and resharded) as a tensor, not pickled inside a tuple; the state to
    load into follows a checkpoint's keys parameter by parameter."""
    flat = {
        "state.w.step": torch.tensor(3.0),
        "param_groups.w.lr": torch.tensor(0.5),
        "param_groups.w.betas": (0.9, 0.95),
        "param_groups.b.lr": 0.5,
        "param_groups.b.betas": (0.9, 0.95),
    }
    packed = pack_param_groups(flat)
    assert packed["param_groups.b"] == (("betas", (0.9, 0.95)), ("lr", 0.5))
    assert packed["param_groups.w.lr"] is flat["param_groups.w.lr"] and "param_groups.w" not in packed
    assert unpack_param_groups(packed) == flat
    as_saved = pack_param_groups(flat, packed_in={"param_groups.w", "state.w.step"})  # b saved apart
    assert "param_groups.b" not in as_saved and as_saved["param_groups.b.lr"] == 0.5
    assert "param_groups.w.lr" in as_saved  # a tensor stays apart whatever the keys


def test_a_packed_parameter_without_a_hyperparameter_the_optimizer_has_is_a_config_mismatch() -> None:
    """Saved under a torch whose AdamW had fewer flags: refused naming them, not taken for damage."""
    from gptrain.checkpoint.compat import CheckpointMismatchError

    packed = {"param_groups.h.0.weight": (("betas", (0.9, 0.95)), ("lr", 0.5))}
    with pytest.raises(CheckpointMismatchError, match="no eps, weight_decay for h.0.weight"):
        unpack_param_groups(packed, expected={"lr", "betas", "eps", "weight_decay"})
    assert unpack_param_groups(packed, expected={"lr"})["param_groups.h.0.weight.lr"] == 0.5
