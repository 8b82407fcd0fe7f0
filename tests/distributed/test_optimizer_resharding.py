"""Optimizer state reshards across every layout change (Megatron's --dist-ckpt-optim-fully-reshardable).

A tiny GPT (6 layers, tied embeddings, float64, AdamW with clipping) saves at SAVE_AT under one
layout (DDP, FSDP2, HSDP, TP with and without SP, FSDP x TP, PP with an uneven split and virtual
stages) and resumes under another, or in one process, to STEPS; every run writes its final state.
That state (weights, Adam's two moments, each parameter's step count), read back by torch's own
DCP-to-torch converter (not gptrain's loading), must match the uninterrupted single-process run's,
moments and weights to float64 round-off (RTOL: test_parallel_layouts), step counts exactly. The
losses after the resume must match too. test_parallel_layouts and test_pipeline_uneven resume from
TP + SP and plain PP checkpoints and compare losses only; this adds the other sources and targets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from parallel_harness import SharedLaunches, share_launch, shared_dir
from test_parallel_layouts import RTOL, assert_close, run_in_process

pytestmark = pytest.mark.distributed

LAYERS, STEPS, SAVE_AT = 6, 10, 5
TP2 = {"tensor_model_parallel_size": 2}
TP2_SP = {**TP2, "sequence_parallel": True}
FSDP = {"data_parallel_sharding": "full_shard"}
# [[0], [3]] on rank 0 and [[1, 2], [4, 5]] on rank 1 (test_pipeline_uneven's SPLITS)
PP2_V2_UNEVEN = {
    "pipeline_model_parallel_size": 2,
    "num_layers_in_first_pipeline_stage": 2,
    "num_layers_in_last_pipeline_stage": 4,
    "virtual_pipeline_model_parallel_size": 2,
}
HSDP = {"data_parallel_sharding": "hybrid_shard"}
LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {  # name: (world size, layout)
    "single": (1, {}),
    "ddp_dp2": (2, {}),
    "fsdp_dp2": (2, FSDP),
    "shard_grad_op_dp2": (2, {"data_parallel_sharding": "shard_grad_op"}),
    "tp2": (2, TP2),
    "tp2_sp": (2, TP2_SP),
    "pp2_v2_uneven": (2, PP2_V2_UNEVEN),
    "pp2_first2": (2, {"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 2}),
    "hsdp_dp4": (4, HSDP),  # two "nodes" of two (DEVICES)
    "dp2_tp2_fsdp": (4, {**TP2_SP, **FSDP}),
    "tp2_sp_pp2": (4, {**TP2_SP, "pipeline_model_parallel_size": 2}),
    "pp2_v2_dp2_fsdp": (4, {**PP2_V2_UNEVEN, **FSDP}),
}
DEVICES = {"hsdp_dp4": 2}
SAVED = ("ddp_dp2", "fsdp_dp2", "tp2", "pp2_v2_uneven", "hsdp_dp4", "dp2_tp2_fsdp")
RESUMES = [  # (saved under, resumed under): every saved layout into one process and into another
    *((source, "single") for source in SAVED),
    ("fsdp_dp2", "pp2_v2_uneven"),
    ("pp2_v2_uneven", "tp2_sp"),
    ("tp2", "fsdp_dp2"),
    ("ddp_dp2", "shard_grad_op_dp2"),
    ("ddp_dp2", "pp2_first2"),
    ("dp2_tp2_fsdp", "pp2_v2_dp2_fsdp"),
    ("hsdp_dp4", "tp2_sp_pp2"),
    ("pp2_v2_uneven", "hsdp_dp4"),
    ("tp2", "pp2_v2_dp2_fsdp"),
    ("fsdp_dp2", "dp2_tp2_fsdp"),
]


def spec(name: str, ckpt: Path, **more: Any) -> dict[str, Any]:
    """mbs 2: four micro-batches a step on one rank, so the plain pipelines run 1F1B."""
    run = {"steps": STEPS, "layers": LAYERS, "mbs": 2, "model": LAYOUTS[name][1], **more}
    if name in DEVICES:
        run["devices"] = DEVICES[name]
    return run


def saving_spec(name: str, ckpt: Path) -> dict[str, Any]:
    return spec(name, ckpt, save_at=SAVE_AT, save=str(ckpt / name), final=str(ckpt / f"{name}.final"))


def resume_name(source: str, target: str) -> str:
    return f"{source}_to_{target}"


def resume_spec(source: str, target: str, ckpt: Path) -> dict[str, Any]:
    final = str(ckpt / f"{resume_name(source, target)}.final")
    return spec(target, ckpt, start=SAVE_AT, load=str(ckpt / source), final=final)


def runs_of(world: int, ckpt: Path) -> list[tuple[str, dict[str, Any]]]:
    """The saves of `world` ranks first, then the resumes (of checkpoints a launch before or this one:
    the two-rank launch runs first)."""
    runs = [(name, saving_spec(name, ckpt)) for name in SAVED if LAYOUTS[name][0] == world]
    runs += [
        (resume_name(source, target), resume_spec(source, target, ckpt))
        for source, target in RESUMES
        if LAYOUTS[target][0] == world
    ]
    return runs


share_launch(2, __name__, lambda ckpt: runs_of(2, ckpt))
share_launch(4, __name__, lambda ckpt: runs_of(4, ckpt))


@pytest.fixture(scope="module")
def ckpt(shared_root: Path) -> Path:
    return shared_dir(shared_root, __name__)


@pytest.fixture(scope="module")
def reference(ckpt: Path) -> dict[str, Any]:
    result = run_in_process(
        {"steps": STEPS, "layers": LAYERS, "mbs": 2, "final": str(ckpt / "reference.final")}
    )
    assert result["losses"][0] - result["losses"][-1] > 0.01  # the curve moves
    return result


@pytest.fixture(scope="module")
def results(shared_launches: SharedLaunches, ckpt: Path) -> dict[str, dict]:
    """The two-rank launch (its saves), the four-rank one, then the resumes in this process."""
    found = dict(shared_launches.get(2, __name__))
    found |= shared_launches.get(4, __name__)
    for source, target in RESUMES:
        if LAYOUTS[target][0] == 1:
            found[resume_name(source, target)] = run_in_process(resume_spec(source, target, ckpt))
    return found


def final_state(path: Path, whole: Path | None = None) -> dict[str, Any]:
    """A checkpoint's model and optimizer items ("model.<fqn>", "optim.state.<fqn>.exp_avg", ...), whole,
    as torch's converter assembles them from every rank's shards (into `whole`, beside it by default)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = whole or path.with_suffix(".pt")
    if not whole.exists():
        dcp_to_torch_save(path, whole)
    flat: dict[str, Any] = {}

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                flatten(f"{prefix}{key}.", item)
        elif prefix.startswith(("model.", "optim.")):
            flat[prefix[:-1]] = value

    flatten("", torch.load(whole, weights_only=False))
    return flat


def assert_same_state(
    actual: dict[str, Any], expected: dict[str, Any], what: str, rtol: float = RTOL
) -> None:
    """Weights and moments to `rtol` of each tensor's largest value; step counts and each parameter's
    hyperparameters exactly. The key biases' gradients are zero in exact arithmetic (q . b_k is the
    same for every key a query sees, which softmax ignores): their weights and moments are round-off
    (weights ~1e-15 of weights ~1), held to `rtol` of the largest value of their kind instead."""
    assert any(key.endswith(".exp_avg_sq") for key in expected), what
    missing = sorted(set(expected) - set(actual))
    assert not missing, f"{what}: not saved: {missing}"
    largest: dict[str, float] = {}
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            kind = key.rsplit(".", 1)[-1] if key.startswith("optim.") else "model"
            largest[kind] = max(largest.get(kind, 0.0), value.abs().max().item())
    for key, theirs in expected.items():
        ours = actual[key]
        if not isinstance(theirs, torch.Tensor):  # a parameter's hyperparameters
            assert ours == theirs, f"{what}: {key}: {ours} vs reference {theirs}"
            continue
        if key.endswith(".step"):
            assert torch.equal(ours, theirs), f"{what}: {key}: {ours} vs reference {theirs}"
            continue
        assert ours.shape == theirs.shape, f"{what}: {key}: shape {ours.shape} vs {theirs.shape}"
        kind = key.rsplit(".", 1)[-1] if key.startswith("optim.") else "model"
        scale = largest[kind] if ".wk.bias" in key else theirs.abs().max().item()
        error = (ours - theirs).abs().max().item()
        assert error <= rtol * scale, f"{what}: {key}: off by {error:.3g} of {scale:.3g}"


@pytest.mark.parametrize(("source", "target"), RESUMES, ids=[resume_name(*pair) for pair in RESUMES])
def test_optimizer_state_reshards_into_another_layout(
    source: str, target: str, results: dict, reference: dict, ckpt: Path
) -> None:
    name = resume_name(source, target)
    what = f"saved under {source}, resumed under {target}"
    assert_close(results[name]["losses"], reference["losses"][SAVE_AT:], f"{what}: losses")
    expected = final_state(ckpt / "reference.final")
    assert_same_state(final_state(ckpt / f"{name}.final"), expected, what)


@pytest.mark.parametrize("name", SAVED)
def test_each_saving_layout_ends_in_the_reference_state(
    name: str, results: dict, reference: dict, ckpt: Path
) -> None:
    """Without a layout change: the comparison above holds for the layouts themselves."""
    assert_close(results[name]["losses"], reference["losses"], f"{name}: losses")
    assert_same_state(final_state(ckpt / f"{name}.final"), final_state(ckpt / "reference.final"), name)
