"""Every parallel layout reproduces the single-process loss curve (float64, CPU, gloo).

The reference runs in this process; the layouts run as real processes, all layouts of
one world size in one launch (start-up dominates on CPU), which other modules' runs
join (parallel_harness.share_launch). A tiny GPT (4 layers, hidden
32, tied embeddings, learned positions, a masked prefix of 2 to 12 positions by sample, so
micro-batches and ranks hold different numbers of loss tokens) trains 10 AdamW steps with
gradient clipping at 0.5 (active: the norms are above 1), so a wrong gradient, grad norm,
loss normalisation, loss-token count or data slice shows up in the losses.
Checkpoints saved under one layout are resumed under others, without conversion, and
the continued losses must match the uninterrupted reference.

The two-process launch also runs three dropout probes (one forward/backward with dropout on,
every rank's dropout outputs gathered): each rank draws from the stream of its pipeline stage
and, under sequence parallelism, of its tensor rank; without it the tensor ranks' replicated
activations stay identical (gptrain.parallel.rng).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from parallel_harness import SharedLaunches, share_launch, shared_dir

STEPS, SAVE_AT = 10, 5
# The runs are float64 (parallel_worker), where a layout only reorders sums: unit roundoff 1.1e-16,
# amplified over 10 Adam steps by the ~2^10 seen in float32 runs (up to 8e-5 at 6e-8 roundoff on
# a 16-core machine), stays below 2e-13. 1e-9 keeps four orders of margin either way: a wrong
# slice, normalisation or gradient moves these losses by more than 1e-4 (a rank's own token count
# x DP for the all-reduced one: 0.24 in ddp_dp2's losses, 0.32 in its evaluation loss).
RTOL = 1e-9

pytestmark = pytest.mark.distributed

TP2_SP = {"tensor_model_parallel_size": 2, "sequence_parallel": True}
PP2 = {"pipeline_model_parallel_size": 2}
TWO_PROCESSES: dict[str, dict[str, Any]] = {
    "ddp_dp2": {},
    "fsdp_dp2": {"data_parallel_sharding": "full_shard"},
    # two micro-batches per rank: the weights stay gathered between them
    "shard_grad_op_dp2": {"data_parallel_sharding": "shard_grad_op", "micro_batch_size": 2},
    "tp2_sp": TP2_SP,
    # selective recompute keeps the GEMMs' and the reductions' outputs, gathers again, recomputes the rest
    "tp2_sp_selective": {**TP2_SP, "activations_checkpoint_granularity": "selective"},
    "pp2_1f1b": PP2,
    "pp2_interleaved": {**PP2, "virtual_pipeline_model_parallel_size": 2},
}
FOUR_PROCESSES: dict[str, dict[str, Any]] = {
    "dp2_tp2_ddp": TP2_SP,
    "dp2_tp2_fsdp": {**TP2_SP, "data_parallel_sharding": "full_shard"},
    "tp2_pp2": {**TP2_SP, **PP2},
    "hybrid_dp4": {"data_parallel_sharding": "hybrid_shard", "micro_batch_size": 2},
    # two micro-batches per rank: the all-reduce across replicas waits for the last one
    "hybrid_dp4_accumulate": {"data_parallel_sharding": "hybrid_shard", "micro_batch_size": 1},
    "llama_like_tp2_pp2": {**TP2_SP, **PP2},
    "pp2_interleaved_dp2_fsdp": {
        **PP2,
        "virtual_pipeline_model_parallel_size": 2,
        "data_parallel_sharding": "full_shard",
        "micro_batch_size": 2,
    },
}
# Rotary positions, grouped-query attention, SwiGLU, untied output: its own reference.
ARCHITECTURE = {
    "llama_like_tp2_pp2": {"positions": "rope", "query_groups": 2, "activation": "swiglu", "tied": False}
}
DEVICES = {
    "hybrid_dp4": 2,
    "hybrid_dp4_accumulate": 2,
}  # two "nodes" of two: FSDP shards inside a node, replicates across
SAVING = ("tp2_sp", "pp2_1f1b")
SEED = 1234  # parallel_worker's model.seed
DROPOUT = {"probe": "dropout", "hidden_dropout": 0.1, "attention_dropout": 0.1}
DROPOUT_PROBES: dict[str, dict[str, Any]] = {
    "tp2_sp_dropout": {**DROPOUT, "model": TP2_SP},
    "tp2_dropout": {**DROPOUT, "model": {"tensor_model_parallel_size": 2}},
    # no attention dropout: each stage's first draw is then a hidden-dropout mask of the same shape
    "pp2_dropout": {**DROPOUT, "attention_dropout": 0.0, "model": PP2},
}
# fp16's static loss scale (a power of two: exact in float64), divided out of the gradients before
# the norm as train_step does: the local path (DDP, FSDP's sharded gradients), the pipeline's loss
# weight and TP + SP's Partial norm gradients each carry it. The reference is unscaled.
LOSS_SCALE, SCALED_STEPS = 65536.0, 3
LOSS_SCALED = {
    f"{name}_loss_scale": {"steps": SCALED_STEPS, "loss_scale": LOSS_SCALE, "model": TWO_PROCESSES[name]}
    for name in ("ddp_dp2", "fsdp_dp2", "tp2_sp", "pp2_interleaved")
}
# One forward/backward under TP2 with and without SP, counting the reductions of whole activations.
COLLECTIVES = {"probe": "collectives"}
COLLECTIVE_PROBES: dict[str, dict[str, Any]] = {
    "tp2_sp_collectives": {**COLLECTIVES, "model": TP2_SP},
    "tp2_collectives": {**COLLECTIVES, "model": {"tensor_model_parallel_size": 2}},
}
# FSDP's traffic over two micro-batches per rank, shard_grad_op against full_shard.
FSDP_COLLECTIVES = {
    f"{mode}_collectives": {**COLLECTIVES, "mbs": 2, "model": {"data_parallel_sharding": mode}}
    for mode in ("shard_grad_op", "full_shard")
}
# The same step under PP2 (its host reads; the stages' traffic is point to point).
PIPELINE_COLLECTIVES = {"pp2_collectives": {**COLLECTIVES, "model": PP2}}
# HSDP on two "nodes" of two, two micro-batches per rank (micro batch 1 of 2 samples per rank).
HYBRID_COLLECTIVES = {
    **COLLECTIVES,
    "devices": 2,
    "mbs": 1,
    "model": {"data_parallel_sharding": "hybrid_shard"},
}
# FP8 under TP (torchao's float8 emulated on the CPU, float32): tensorwise with torchao's float8
# styles (without sequence parallelism: gloo cannot all-gather float8), rowwise with the plain styles.
# "partial": only wq and wo are float8 (wk, wv: 8 columns; ffn 40), so the attention mixes float8 and
# plain styles and the MLP takes the plain ones; torchao's styles failed on the plain linears.
FP8_STEPS = 4
# Tensorwise under TP2 + SP on the CPU: refused (its test), in the two-process launch.
FP8_SP_REFUSED = {"fp8": "tensorwise", "model": TP2_SP}
FP8_RUNS: dict[str, dict[str, Any]] = {
    "tp2_fp8_tensorwise": {"fp8": "tensorwise", "model": {"tensor_model_parallel_size": 2}},
    "tp2_sp_fp8_rowwise": {"fp8": "rowwise", "model": TP2_SP},
    "tp2_fp8_tensorwise_partial": {
        "fp8": "tensorwise",
        "model": {"tensor_model_parallel_size": 2},
        "architecture": {"heads": 8, "query_groups": 2, "ffn": 40},
        "fp8_linears": 8,  # 4 blocks x wq, wo
    },
}
# FP8 tensorwise under FSDP (emulated, float32): the weights are all-gathered as float8 with scales
# refreshed after every optimizer step and checkpoint load, against the same run gathering float32
# and casting after; the gathered run saves at SAVE_AT and a third run resumes from it.
FSDP = {"data_parallel_sharding": "full_shard"}
FP8_FSDP_RUNS: dict[str, dict[str, Any]] = {
    "fsdp_dp2_fp8_gather": {"model": FSDP},
    "fsdp_dp2_fp8_plain_gather": {"model": {**FSDP, "fp8_fsdp_all_gather": False}},
    "fsdp_dp2_fp8_gather_resumed": {"model": FSDP, "start": SAVE_AT},
    # the path GPU runs take: each block compiled inside its FSDP unit, the loss compiled on its own
    "fsdp_dp2_fp8_gather_compiled": {"model": {**FSDP, "compile": True}, "steps": FP8_STEPS},
}
# ... and on four processes, where the scales' amax is reduced over a 2-D mesh: FSDP x TP, and
# hybrid sharding (two "nodes" of two), each gathered as float8 and in the training precision.
FP8_FSDP_4: dict[str, dict[str, Any]] = {
    "dp2_tp2_fsdp": {"data_parallel_sharding": "full_shard", "tensor_model_parallel_size": 2},
    "hybrid_dp4": {"data_parallel_sharding": "hybrid_shard", "micro_batch_size": 2},
}
# Pipeline schedules over micro-batch counts of their own, in the launches above (one start-up each):
# PP2 x 2 virtual stages over 3 micro-batches; PP4 over 2; FSDP's traffic under PP2 x DP2.
PIPELINE_BATCHES = {
    "pp2_interleaved_3_microbatches": {
        "steps": 4,
        "mbs": 1,
        "gbs": 3,
        "model": {**PP2, "virtual_pipeline_model_parallel_size": 2},
    },
}
PIPELINE_BATCHES_4 = {
    "pp4_2_microbatches": {"steps": 3, "mbs": 1, "gbs": 2, "model": {"pipeline_model_parallel_size": 4}},
    "pp2_dp2_fsdp_collectives": {**COLLECTIVES, "mbs": 1, "gbs": 8, "model": {**PP2, **FSDP}},
}
RESUMES = {  # name: (checkpoint of, world size, layout)
    "tp2_to_single": ("tp2_sp", 1, {}),
    "pp2_to_single": ("pp2_1f1b", 1, {}),
    "tp2_to_fsdp_dp4": ("tp2_sp", 4, {"data_parallel_sharding": "full_shard", "micro_batch_size": 2}),
    # two micro-batches per rank under shard_grad_op
    "tp2_to_shard_grad_op_dp4": (
        "tp2_sp",
        4,
        {"data_parallel_sharding": "shard_grad_op", "micro_batch_size": 1},
    ),
    "pp2_to_dp2_tp2": ("pp2_1f1b", 4, TP2_SP),
}


def run_in_process(spec: dict[str, Any]) -> dict[str, list[float]]:
    """World size 1 in the test process itself (no process group): saves a start-up."""
    import parallel_worker

    assert "WORLD_SIZE" not in os.environ, "the single-process reference must not see a distributed env"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": intended, loading in one process
        return parallel_worker.train(spec)


def assert_close(actual: list[float], expected: list[float], what: str) -> None:
    assert len(actual) == len(expected), what
    for step, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert abs(a - e) <= RTOL * abs(e), f"{what}: step {step}: {a!r} vs reference {e!r}"


def layout_spec(name: str, model: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    spec: dict[str, Any] = {"steps": STEPS, "model": model, **ARCHITECTURE.get(name, {})}
    if name in DEVICES:
        spec["devices"] = DEVICES[name]
    if name in SAVING:
        spec.update(save_at=SAVE_AT, save=str(ckpt / name))
    return spec


def resume_spec(name: str, ckpt: Path) -> dict[str, Any]:
    source, _, model = RESUMES[name]
    return {"steps": STEPS, "start": SAVE_AT, "load": str(ckpt / source), "model": model}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[float]]:
    result = run_in_process({"steps": STEPS})
    # The curve must actually move, or matching it would prove little.
    assert result["losses"][0] - result["losses"][-1] > 0.01
    assert min(result["grad_norms"]) > 0.5
    return result


@pytest.fixture(scope="module")
def ckpt(shared_root: Path) -> Path:
    return shared_dir(shared_root, __name__)


def two_process_runs(ckpt: Path) -> list[tuple[str, dict[str, Any]]]:
    runs = [layout_spec(name, model, ckpt) for name, model in TWO_PROCESSES.items()]
    runs += [
        *DROPOUT_PROBES.values(),
        *COLLECTIVE_PROBES.values(),
        *PIPELINE_COLLECTIVES.values(),
        *FSDP_COLLECTIVES.values(),
        *(fp8_spec(run) for run in FP8_RUNS.values()),
        *(fp8_fsdp_spec(name, ckpt) for name in FP8_FSDP_RUNS),
        *PIPELINE_BATCHES.values(),
        fp8_spec(FP8_SP_REFUSED) | {"expect_refusal": True},
        *LOSS_SCALED.values(),
    ]
    names = [*TWO_PROCESSES, *DROPOUT_PROBES, *COLLECTIVE_PROBES, *PIPELINE_COLLECTIVES, *FSDP_COLLECTIVES]
    names += list(FP8_RUNS)
    names += list(FP8_FSDP_RUNS)
    names += list(PIPELINE_BATCHES)
    names.append("tp2_sp_fp8_tensorwise_refused")
    names += list(LOSS_SCALED)
    return list(zip(names, runs, strict=True))


@pytest.fixture(scope="module")
def two_process_results(shared_launches: SharedLaunches) -> dict[str, dict]:
    """In the shared launch of two ranks (conftest.py), beside other modules' runs."""
    return shared_launches.get(2, __name__)


def fp8_spec(run: dict[str, Any], layout: bool = True) -> dict[str, Any]:
    return {
        "steps": FP8_STEPS,
        "dtype": "float32",
        "fp8": run["fp8"],
        "model": run["model"] if layout else {},
        **run.get("architecture", {}),
    }


def fp8_fsdp_spec(name: str, ckpt: Path) -> dict[str, Any]:
    run = FP8_FSDP_RUNS[name]
    spec = {"steps": STEPS, "dtype": "float32", "fp8": "tensorwise", **run}
    saved = ckpt / "fsdp_dp2_fp8_gather"
    if name == "fsdp_dp2_fp8_gather":
        spec.update(save_at=SAVE_AT, save=str(saved))
    elif "start" in run:
        spec["load"] = str(saved)
    return spec


def four_process_runs(ckpt: Path) -> list[tuple[str, dict[str, Any]]]:
    names = list(FOUR_PROCESSES) + [name for name, (_, world, _) in RESUMES.items() if world == 4]
    runs = [
        layout_spec(n, FOUR_PROCESSES[n], ckpt) if n in FOUR_PROCESSES else resume_spec(n, ckpt)
        for n in names
    ]
    runs.append(HYBRID_COLLECTIVES)
    names.append("hybrid_dp4_collectives")
    for name, model in FP8_FSDP_4.items():
        devices = {"devices": DEVICES[name]} if name in DEVICES else {}
        for gather in (True, False):
            runs.append(
                {**devices, "steps": FP8_STEPS, "dtype": "float32", "fp8": "tensorwise"}
                | {"model": {**model, "fp8_fsdp_all_gather": gather}}
            )
            names.append(f"{name}_fp8_{'gather' if gather else 'plain_gather'}")
    runs += PIPELINE_BATCHES_4.values()
    names += PIPELINE_BATCHES_4
    return list(zip(names, runs, strict=True))


@pytest.fixture(scope="module")
def four_process_results(shared_launches: SharedLaunches, two_process_results: dict) -> dict[str, dict]:
    """Runs after the two-process launch, whose checkpoints it resumes."""
    return shared_launches.get(4, __name__)


share_launch(2, __name__, two_process_runs)
share_launch(4, __name__, four_process_runs)


def check_layout_result(result: dict, reference: dict, name: str) -> None:
    assert_close(result["losses"], reference["losses"], f"{name} loss")
    assert_close(result["grad_norms"], reference["grad_norms"], f"{name} grad norm")
    assert_close(result["eval_loss"], reference["eval_loss"], f"{name} evaluation loss after training")


@pytest.mark.parametrize("name", list(TWO_PROCESSES))
def test_two_process_layout_matches_single_process(
    name: str, reference: dict, two_process_results: dict
) -> None:
    check_layout_result(two_process_results[name], reference, name)


@pytest.mark.parametrize("name", list(FOUR_PROCESSES))
def test_four_process_layout_matches_single_process(
    name: str, reference: dict, four_process_results: dict
) -> None:
    if name in ARCHITECTURE:
        reference = run_in_process({"steps": STEPS, **ARCHITECTURE[name]})
    check_layout_result(four_process_results[name], reference, name)


@pytest.mark.parametrize("name", list(RESUMES))
def test_resume_under_another_layout(
    name: str, reference: dict, ckpt: Path, request: pytest.FixtureRequest
) -> None:
    """Saved with TP=2 or PP=2, resumed with neither, with DP=4 or with TP x DP: no conversion."""
    source, world, _ = RESUMES[name]
    request.getfixturevalue("two_process_results")  # writes the checkpoints
    if world == 1:
        result = run_in_process(resume_spec(name, ckpt))
    else:
        result = request.getfixturevalue("four_process_results")[name]
    assert_close(result["losses"], reference["losses"][SAVE_AT:], f"{source} checkpoint resumed as {name}")
    assert_close(
        result["eval_loss"], reference["eval_loss"], f"{source} checkpoint resumed as {name}, evaluation"
    )


@pytest.mark.parametrize("name", list(LOSS_SCALED))
def test_an_fp16_loss_scale_divides_out_under_every_layout(
    name: str, reference: dict, two_process_results: dict
) -> None:
    """The scaled losses and unscaled gradients are the unscaled single process's: a scale left in
    the gradients, or in the pipeline's returned loss, moves them by orders of magnitude."""
    result = two_process_results[name]
    assert_close(result["losses"], reference["losses"][:SCALED_STEPS], f"{name} loss")
    assert_close(result["grad_norms"], reference["grad_norms"][:SCALED_STEPS], f"{name} grad norm")


def probe_ranks(results: dict, name: str) -> list[dict]:
    """The probe's per-rank records, after the checks every probe shares: the (stage, tensor) rank
    the seed comes from is the mesh's, no dropout ran on a DTensor (DTensor's RNG tracker,
    which broadcasts rank 0's CUDA state, is never involved), and model.eval() turned every dropout
    of the chunks off (the embedding's is no child of ParallelGPT: ParallelGPT.train reaches it)."""
    ranks = results[name]["ranks"]
    for record in ranks:
        assert record["ranks"] == record["mesh_ranks"], name
        assert record["on_dtensor"] == [], name
        assert record["training_in_eval"] == [], name
        for mask in masks(record).values():  # dropout really ran
            assert 0.05 < mask.count(False) / len(mask) < 0.15, name
    return ranks


def masks(record: dict) -> dict[str, list[bool]]:
    """Each dropout module's mask (kept: True) in the order of first call."""
    return {name: [value != 0.0 for value in out] for name, out in record["outputs"].items()}


def agreement(a: list[bool], b: list[bool]) -> float:
    assert len(a) == len(b)
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def test_sequence_parallel_tensor_ranks_draw_their_own_dropout_masks(two_process_results: dict) -> None:
    """TP2 + SP: every dropout acts on this rank's slice of the sequence (or its heads); with one
    stream token t and token t + S/2 got the same mask. Independent masks agree on ~82% of places."""
    first, second = probe_ranks(two_process_results, "tp2_sp_dropout")
    assert [first["seed"], second["seed"]] == [SEED + 2718, SEED + 2718 + 1]
    assert list(first["outputs"]) == list(second["outputs"])
    for name, mask in masks(first).items():
        assert agreement(mask, masks(second)[name]) < 0.9, f"{name}: the tensor ranks share a mask"


def test_without_sequence_parallel_tensor_ranks_keep_identical_activations(two_process_results: dict) -> None:
    """TP2 without SP: hidden dropout acts on activations both ranks hold whole; different masks
    would make the copies drift apart, so the outputs must be equal to the bit (attention dropout,
    on each rank's heads, draws from the same stream and keeps it in step)."""
    first, second = probe_ranks(two_process_results, "tp2_dropout")
    assert first["seed"] == second["seed"] == SEED
    assert len(first["outputs"]) == 9  # embedding + 4 blocks x (attention, MLP)
    assert first["outputs"] == second["outputs"]


def test_pipeline_stages_draw_their_own_dropout_masks(two_process_results: dict) -> None:
    """PP2: each stage's k-th mask (stage 0: embedding, layers 0-1; stage 1: layers 2-3) came from
    the same draw of one shared stream; with seed + 100 x stage they are independent."""
    first, second = probe_ranks(two_process_results, "pp2_dropout")
    assert [first["seed"], second["seed"]] == [SEED, SEED + 100]
    assert not set(first["outputs"]) & set(second["outputs"])
    pairs = list(zip(masks(first).values(), masks(second).values(), strict=False))
    assert len(pairs) == 4
    for k, (a, b) in enumerate(pairs):
        assert agreement(a, b) < 0.9, f"mask {k} of both stages is the same"


@pytest.mark.parametrize("name", list(COLLECTIVE_PROBES))
def test_tensor_parallel_reduces_each_sublayer_once(two_process_results: dict, name: str) -> None:
    """Megatron's TP traffic: per layer and micro-batch, one reduction after each row-parallel linear
    (forward) and one of the gathered input's gradient before each sublayer (backward), plus one each
    for the embedding (forward) and the output projection's input (backward): 4 x layers + 2. Under SP
    they are reduce-scatters, without it all-reduces. Each column linear reducing its own input
    gradient (wq, wk, wv; w1) made it 4 + 2 more per layer and micro-batch."""
    result = two_process_results[name]
    kind = "reduce_scatter" if "sp" in name.split("_") else "all_reduce"
    whole = [k for k, numel in result["reductions"] if numel == result["activation_numel"]]
    assert whole == [kind] * (result["microbatches"] * (4 * result["layers"] + 2)), result


@pytest.mark.parametrize("name", [*COLLECTIVE_PROBES, *PIPELINE_COLLECTIVES])
def test_forward_backward_reads_only_the_host_masks(two_process_results: dict, name: str) -> None:
    """The TP/PP step's forward/backward turns no device value into a Python number (each is a wait
    for the device on a GPU): the token count is summed from the loader's masks, on the host, one
    read per micro-batch, and the loss and count come back as device scalars for train_step's one
    read. It read the reduced token count twice and the loss twice more."""
    result = two_process_results[name]
    assert result["host_reads"] == result["microbatches"], result


def test_hybrid_sharding_reduces_across_replicas_once_per_step(four_process_results: dict) -> None:
    """HSDP (shards in a node, replicas across): every micro-batch reduce-scatters inside the node,
    but the all-reduce across replicas (the inter-node traffic) runs once per step, for each of the
    5 FSDP units (4 blocks and the root); it ran after every micro-batch. The other all-reduces
    are scalars (token count, loss)."""
    result = four_process_results["hybrid_dp4_collectives"]
    assert result["microbatches"] == 2
    gradients = [k for k, numel in result["reductions"] if numel > 1]
    units = result["layers"] + 1
    assert gradients.count("reduce_scatter") == result["microbatches"] * units, result
    assert gradients.count("all_reduce") == units, result


def test_shard_grad_op_gathers_and_reduces_once_per_step(two_process_results: dict) -> None:
    """shard_grad_op (NeMo's distributed_fused_adam): over two micro-batches, each of the 5 FSDP units
    (4 blocks and the root) is all-gathered once per step; full_shard gathers the blocks for every
    forward and again for every backward. Both reduce-scatter each micro-batch (sharded gradients)."""
    grad_op, full = (two_process_results[f"{m}_collectives"] for m in ("shard_grad_op", "full_shard"))
    units, blocks = grad_op["layers"] + 1, grad_op["layers"]
    assert grad_op["microbatches"] == full["microbatches"] == 2

    def reduce_scatters(result: dict) -> int:
        return [kind for kind, numel in result["reductions"] if numel > 1].count("reduce_scatter")

    assert (grad_op["gathers"], reduce_scatters(grad_op)) == (units, 2 * units), grad_op
    assert (full["gathers"], reduce_scatters(full)) == (2 * (units + blocks), 2 * units), full


def test_fsdp_under_a_pipeline_gathers_and_reduce_scatters_once_per_step(four_process_results: dict) -> None:
    """PP2 x DP2 full_shard, 4 micro batches per rank: torch's PipelineStage turns FSDP's gradient
    sync and its reshard after backward off until the step's end, so each FSDP unit of the first
    stage (2 blocks and the root) is gathered once and reduce-scattered once per step: the stage's
    weights stay gathered and its gradients accumulate whole. The planner counts this memory
    (gptrain.plan.memory.unsharded_gradients)."""
    result = four_process_results["pp2_dp2_fsdp_collectives"]
    units = result["layers"] // 2 + 1
    reduce_scatters = [kind for kind, numel in result["reductions"] if numel > 1].count("reduce_scatter")
    assert result["microbatches"] == 4
    assert (result["gathers"], reduce_scatters) == (units, units), result


def test_interleaved_pipeline_with_microbatches_that_pp_does_not_divide(two_process_results: dict) -> None:
    """PP2 x 2 virtual stages over 3 micro-batches a step (one round of 3 through each chunk in
    torch's ScheduleInterleaved1F1B): refused as no multiple of PP before; it trains as one process
    does, evaluation (3 micro-batches through the same stages) included."""
    name = "pp2_interleaved_3_microbatches"
    reference = run_in_process({key: PIPELINE_BATCHES[name][key] for key in ("steps", "mbs", "gbs")})
    check_layout_result(two_process_results[name], reference, name)


def test_pipeline_over_fewer_microbatches_than_stages(four_process_results: dict) -> None:
    """PP4 over two micro-batches a step, as Megatron's 1F1B runs it (torch's 1F1B refuses it, so
    GPipe runs): refused before; it trains as one process does. Two micro-batches, not one, so that
    a gradient divided by their count (the schedule's scale_grads) moves the grad norm 2x."""
    name = "pp4_2_microbatches"
    reference = run_in_process({key: PIPELINE_BATCHES_4[name][key] for key in ("steps", "mbs", "gbs")})
    check_layout_result(four_process_results[name], reference, name)


@pytest.mark.parametrize("name", list(FP8_RUNS))
def test_fp8_under_tensor_parallelism_matches_one_process(two_process_results: dict, name: str) -> None:
    """The first forward sees the same float8 values as one process (tensorwise scales are taken
    over the whole tensor, rowwise scales per row of the unsplit dimension), so its loss differs by
    float32 summation order only: rel 1e-6. The backward casts gradients with per-shard scales, so
    later steps differ at float8 resolution (e5m2's 2^-3 per element, averaging out over a tensor):
    grad norms within 2e-2, losses within 2e-3 (measured: 4e-3 and 2e-4)."""
    reference = run_in_process(fp8_spec(FP8_RUNS[name], layout=False))
    result = two_process_results[name]
    fp8_linears = FP8_RUNS[name].get("fp8_linears", 24)  # 4 blocks x wq, wk, wv, wo, w1, w2
    assert reference["fp8_linears"] == result["fp8_linears"] == fp8_linears
    assert abs(result["losses"][0] - reference["losses"][0]) <= 1e-6 * reference["losses"][0]
    assert result["losses"] == pytest.approx(reference["losses"], rel=2e-3)
    assert result["grad_norms"] == pytest.approx(reference["grad_norms"], rel=2e-2)


def test_fp8_tensorwise_under_sequence_parallelism_on_the_cpu_is_refused(two_process_results: dict) -> None:
    """Tensorwise FP8 under sequence parallelism all-gathers float8 tensors, which gloo (the CPU's
    backend, model.fp8_emulate) has no type for: every rank stopped at the first step with torch's
    'Invalid scalar type' traceback. It is a one-line config error on every rank, before any step
    (run in the shared launch: parallel_worker's expect_refusal records each rank's error)."""
    result = two_process_results["tp2_sp_fp8_tensorwise_refused"]
    expected = "ConfigError: model.fp8_recipe=tensorwise with model.tensor_model_parallel_size=2 and"
    assert result["trained"] is None, result
    for error in result["errors"]:
        assert error is not None and error.startswith(expected) and "\n" not in error, result["errors"]
    assert len(result["errors"]) == 2


# Both FSDP runs quantize each weight with one scale from its whole-tensor amax (a max: exact) and sum
# the same two micro-batch gradients, so they differ by float32 roundoff at most; a scale left from
# before the last optimizer step or load moved the losses by 1.7e-5 and 1e-5 (measured).
FP8_GATHER_RTOL = 1e-6


def test_fsdp_gathers_float8_weights_with_the_numbers_of_a_full_precision_gather(
    two_process_results: dict,
) -> None:
    gathered = two_process_results["fsdp_dp2_fp8_gather"]
    plain = two_process_results["fsdp_dp2_fp8_plain_gather"]
    assert gathered["fp8_linears"] == plain["fp8_linears"] == 24
    assert gathered["float8_gathered"] == 24  # every float8 weight is gathered as float8
    assert plain["float8_gathered"] == 0  # model.fp8_fsdp_all_gather=false
    assert gathered["losses"] == pytest.approx(plain["losses"], rel=FP8_GATHER_RTOL, abs=0)
    assert gathered["grad_norms"] == pytest.approx(plain["grad_norms"], rel=FP8_GATHER_RTOL, abs=0)
    # and one process (no FSDP): the same float8 values in the first forward
    reference = run_in_process(fp8_spec({"fp8": "tensorwise", "model": {}}, layout=False) | {"steps": 2})
    assert gathered["losses"][0] == pytest.approx(reference["losses"][0], rel=FP8_GATHER_RTOL, abs=0)


def test_fsdp_float8_gather_resumes_with_the_scales_of_the_loaded_weights(two_process_results: dict) -> None:
    uninterrupted = two_process_results["fsdp_dp2_fp8_gather"]["losses"][SAVE_AT:]
    resumed = two_process_results["fsdp_dp2_fp8_gather_resumed"]["losses"]
    assert resumed == pytest.approx(uninterrupted, rel=FP8_GATHER_RTOL, abs=0)


def test_fsdp_float8_gather_checkpoint_loads_into_one_plain_process(
    ckpt: Path, two_process_results: dict
) -> None:
    """The gathered weights are saved as plain tensors: one process without FP8 resumes from them."""
    assert "fsdp_dp2_fp8_gather" in two_process_results  # wrote the checkpoint
    spec = {"steps": STEPS, "dtype": "float32", "start": SAVE_AT, "load": str(ckpt / "fsdp_dp2_fp8_gather")}
    result = run_in_process(spec)
    assert result["fp8_linears"] == 0 and len(result["losses"]) == STEPS - SAVE_AT
    # float32 matmuls instead of float8 ones: near the float8 run's curve, not on it (measured 6e-5)
    expected = two_process_results["fsdp_dp2_fp8_gather"]["losses"][SAVE_AT:]
    assert result["losses"] == pytest.approx(expected, rel=3e-4)


def test_fsdp_float8_gather_compiles(two_process_results: dict) -> None:
    """Compiled, the first forward sees the same float8 values (rel 1e-6: fused float32 sums); later
    steps may round a weight to a neighbouring float8 value (the TP FP8 tests' bounds)."""
    compiled = two_process_results["fsdp_dp2_fp8_gather_compiled"]
    eager = two_process_results["fsdp_dp2_fp8_gather"]
    assert compiled["float8_gathered"] == 24
    assert compiled["losses"][0] == pytest.approx(eager["losses"][0], rel=FP8_GATHER_RTOL, abs=0)
    assert compiled["losses"] == pytest.approx(eager["losses"][:FP8_STEPS], rel=2e-3)


@pytest.mark.parametrize("name", list(FP8_FSDP_4))
def test_float8_gather_on_a_two_dimensional_mesh(four_process_results: dict, name: str) -> None:
    gathered = four_process_results[f"{name}_fp8_gather"]
    plain = four_process_results[f"{name}_fp8_plain_gather"]
    assert gathered["float8_gathered"] == 24 and plain["float8_gathered"] == 0
    assert gathered["losses"] == pytest.approx(plain["losses"], rel=FP8_GATHER_RTOL, abs=0)
    assert gathered["grad_norms"] == pytest.approx(plain["grad_norms"], rel=FP8_GATHER_RTOL, abs=0)
