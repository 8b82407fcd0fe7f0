"""Optimizer hyperparameters are saved as one item per parameter; checkpoints with one item per
hyperparameter (saved before 2026-11-26) still load, exactly."""

import pytest
import torch

from gptrain.checkpoint.compat import read_metadata
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.models.config import GPTConfig
from gptrain.parallel.state_dict import (
    VARIES,
    live_hyperparameters,
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
    # b saved one item per setting, and without betas (as an older torch's optimizer would have)
    as_saved = pack_param_groups(flat, packed_in={"param_groups.w", "state.w.step", "param_groups.b.lr"})
    assert "param_groups.b" not in as_saved and as_saved["param_groups.b.lr"] == 0.5
    assert "param_groups.b.betas" not in as_saved  # not asked of the checkpoint: filled in at load
    assert "param_groups.w.lr" in as_saved  # a tensor stays apart whatever the keys


def test_a_setting_the_checkpoint_lacks_is_taken_from_the_optimizer_when_every_group_agrees() -> None:
    """Saved under a torch whose AdamW had fewer flags: filled in as torch's own load_state_dict does,
    and named; a setting that differs between groups cannot be, and is refused naming it."""
    from gptrain.checkpoint.compat import CheckpointMismatchError

    live = {"lr": VARIES, "betas": (0.9, 0.95), "foreach": None, "fused": True}
    packed = {"param_groups.h.0.weight": (("betas", (0.9, 0.95)), ("lr", 0.5))}
    per_name = {"param_groups.h.0.bias.betas": (0.8, 0.9), "param_groups.h.0.bias.lr": 0.25}
    filled: list[str] = []
    unpacked = unpack_param_groups(packed | per_name, live, filled)
    assert unpacked == {
        "param_groups.h.0.weight.betas": (0.9, 0.95),
        "param_groups.h.0.weight.lr": 0.5,
        "param_groups.h.0.weight.foreach": None,
        "param_groups.h.0.weight.fused": True,
        "param_groups.h.0.bias.betas": (0.8, 0.9),  # the checkpoint's value wins where it has one
        "param_groups.h.0.bias.lr": 0.25,
        "param_groups.h.0.bias.foreach": None,
        "param_groups.h.0.bias.fused": True,
    }
    assert sorted(filled) == ["foreach", "fused"]
    with pytest.raises(CheckpointMismatchError, match="no lr for h.0.weight"):
        unpack_param_groups({"param_groups.h.0.weight": (("betas", (0.9, 0.95)),)}, live)


def test_live_hyperparameters_marks_the_settings_that_differ_between_groups() -> None:
    model, optimizer = _trained(seed=1, lr=1e-3)
    optimizer.param_groups[0]["weight_decay"] = 0.3  # as a no-decay group differs from the others
    live = live_hyperparameters(optimizer)
    assert live["weight_decay"] is VARIES and live["lr"] == 1e-3 and live["betas"] == (0.9, 0.95)
    assert live["fused"] == optimizer.param_groups[0]["fused"]


@pytest.mark.parametrize("packed", [True, False])
def test_a_checkpoint_saved_without_a_flag_this_torch_has_resumes_with_it_filled_in(tmp_path, packed) -> None:
    """As an older torch's AdamW, without `decoupled_weight_decay`, would have saved it."""
    model, optimizer = _trained(seed=1, lr=1.234e-4)
    manager = CheckpointManager(tmp_path, keep_last=1)
    optim = unpack_param_groups(optimizer_state_dict(model, optimizer))
    optim = {key: value for key, value in optim.items() if not key.endswith(".decoupled_weight_decay")}
    if packed:
        optim = pack_param_groups(optim)
    manager.save(2, {"model": model_state_dict(model), "optim": optim}, {})

    fresh_model, fresh_optimizer = _trained(seed=2, lr=1e-3)
    logged: list[str] = []

    def state_to_load(saved):
        optim_keys = [key.removeprefix("optim.") for key in saved if key.startswith("optim.")]
        return {"optim": optimizer_state_dict(fresh_model, fresh_optimizer, optim_keys)}

    def apply(loaded):
        notes = load_optimizer_state_dict(fresh_model, fresh_optimizer, loaded["optim"])
        logged.append(", ".join(notes))

    manager.load_newest_good(state_to_load, apply, pytest.fail)
    manager.close()
    assert logged == ["decoupled_weight_decay (not in the checkpoint)"]
    _assert_same_optimizer(fresh_optimizer, optimizer)  # the flag as this torch has it, the rest as saved


def test_a_run_resumed_with_other_settings_trains_with_them_and_says_so(tmp_path) -> None:
    """The config's weight decay, betas and eps apply after a resume (hparams.yaml records them);
    the moments and step counts are the checkpoint's; the learning rate stays the schedule's."""
    model, optimizer = _trained(seed=1, lr=1.234e-4)
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(2, {"model": model_state_dict(model), "optim": optimizer_state_dict(model, optimizer)}, {})
    fresh_model = build_model(CONFIG, torch.device("cpu"), seed=2)
    fresh = build_optimizer(fresh_model, "adamw", 1e-3, 0.5, (0.8, 0.9), 1e-5, "cpu")
    notes: list[str] = []

    def state_to_load(saved):
        keys = [key.removeprefix("optim.") for key in saved if key.startswith("optim.")]
        return {"optim": optimizer_state_dict(fresh_model, fresh, keys)}

    manager.load_newest_good(
        state_to_load,
        lambda loaded: notes.extend(load_optimizer_state_dict(fresh_model, fresh, loaded["optim"])),
        pytest.fail,
    )
    manager.close()
    assert sorted(notes) == [
        "betas (0.9, 0.95) -> (0.8, 0.9)",
        "eps 1e-08 -> 1e-05",
        "weight_decay 0.1 -> 0.5",
    ]
    ours, saved = fresh.state_dict(), optimizer.state_dict()
    decays = sorted({group["weight_decay"] for group in ours["param_groups"]})
    assert decays == [0.0, 0.5]  # the no-decay group keeps none
    assert all(g["betas"] == (0.8, 0.9) and g["eps"] == 1e-5 for g in ours["param_groups"])
    assert all(g["lr"] == 1.234e-4 for g in ours["param_groups"])  # the schedule's, as saved
    for index, state in saved["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)


def test_a_state_dict_taken_before_the_first_update_leaves_the_optimizer_as_fresh() -> None:
    """A save before any update (or after fp16's first skipped steps) must not count a step: the
    first real update is then bias-corrected as the first, bit for bit as without the save."""
    updated = []
    for save_first in (False, True):
        model = build_model(CONFIG, torch.device("cpu"), seed=3)
        optimizer = build_optimizer(model, "adamw", 1e-3, 0.1, (0.9, 0.95), 1e-8, "cpu")
        if save_first:
            saved = unpack_param_groups(optimizer_state_dict(model, optimizer))
            assert all(value == 0 for key, value in saved.items() if key.endswith(".step"))
        generator = torch.Generator().manual_seed(3)
        for parameter in model.parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        optimizer.step()
        updated.append([parameter.detach().clone() for parameter in model.parameters()])
    for plain, after_save in zip(*updated, strict=True):
        assert torch.equal(plain, after_save)
