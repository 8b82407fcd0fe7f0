"""One process of a distributed layout test: train a tiny GPT a few steps, record the losses.

Run by tests/distributed/parallel_harness.py with RANK/WORLD_SIZE/MASTER_* in the environment and a
JSON job as argv[1] ({"runs": [spec, ...], "out": path}); rank 0 writes one
{"losses": [...], "grad_norms": [...]} per run to job["out"] (for a spec with "probe": "dropout",
every rank's dropout outputs instead: `dropout_probe`; "embedding_grads": `embedding_grads_probe`).
The same script with WORLD_SIZE=1 is the single-process reference. Each run seeds the global
streams as the training loop does (per rank), so the layouts also show that weights and data
do not depend on them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError
from gptrain.models.config import GPTConfig
from gptrain.models.gpt import GPT
from gptrain.parallel.float8 import is_float8_gathered, refresh_scales_after_step
from gptrain.parallel.grad_norm import clip_grads, scale_grads
from gptrain.parallel.mesh import init_distributed, shutdown, world_from_env
from gptrain.parallel.parallelize import parallelize
from gptrain.parallel.rng import model_parallel_ranks
from gptrain.parallel.runtime import ParallelGPT, forward_backward, to_plain
from gptrain.parallel.state_dict import (
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
)
from gptrain.parallel.training import eval_loss_sum
from gptrain.train.builders import dropout_seed, seed_everything
from gptrain.train.state import rng_state, set_rng_state

VOCAB, SEQ = 96, 16


def make_config(spec: dict[str, Any]) -> TrainingConfig:
    cfg = TrainingConfig()
    cfg.trainer.devices = spec.get("devices", int(os.environ.get("WORLD_SIZE", "1")))
    cfg.trainer.precision = spec.get("precision", "32")
    m = cfg.model
    m.micro_batch_size, m.global_batch_size = spec.get("mbs", 4), spec.get("gbs", 8)
    m.num_layers, m.hidden_size, m.num_attention_heads = spec.get("layers", 4), 32, spec.get("heads", 4)
    m.encoder_seq_length = SEQ
    m.seed = 1234
    for key, value in spec.get("model", {}).items():
        setattr(m, key, value)
    if spec.get("fp8"):  # torchao's emulated float8 matmuls run on the CPU; casts and scales as on a GPU
        m.fp8, m.fp8_recipe, m.fp8_emulate = True, spec["fp8"], True
    return cfg


def make_model(cfg: TrainingConfig, spec: dict[str, Any]) -> GPT:
    m = cfg.model
    config = GPTConfig(
        vocab_size=VOCAB,
        seq_length=SEQ,
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=spec.get("ffn", 64),
        num_query_groups=spec.get("query_groups"),
        position_embedding_type=spec.get("positions", "learned_absolute"),
        activation=spec.get("activation", "gelu"),
        share_embeddings_and_output_weights=spec.get("tied", True),
        hidden_dropout=spec.get("hidden_dropout", 0.0),
        attention_dropout=spec.get("attention_dropout", 0.0),
    )
    with torch.device("meta"):
        return GPT(config)


def global_batch(step: int, gbs: int) -> torch.Tensor:
    """The same tokens for every layout: seeded by the step number."""
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (gbs, SEQ + 1), generator=generator)


def local_microbatches(
    samples: torch.Tensor, mbs: int, dp_rank: int, dp: int
) -> list[dict[str, torch.Tensor]]:
    """Megatron's order: each micro-step takes mbs x dp samples, rank r the r-th slice."""
    microbatches = []
    for start in range(0, samples.shape[0], mbs * dp):
        rows = samples[start + dp_rank * mbs : start + (dp_rank + 1) * mbs]
        mask = torch.ones(rows.shape[0], SEQ)
        # A masked prefix of 2 to 12 positions, set by the sample's first token: micro-batches and
        # data-parallel ranks hold different numbers of loss tokens, so the per-token mean over the
        # global batch differs from a mean of per-micro-batch means, and a rank's own token count
        # times DP (in place of the all-reduced count) moves the losses (test_parallel_layouts' RTOL).
        for i, first in enumerate(rows[:, 0].tolist()):
            mask[i, : 2 + first % 11] = 0.0
        microbatches.append({"tokens": rows[:, :-1], "labels": rows[:, 1:], "loss_mask": mask})
    return microbatches


def checkpoint_state(model: ParallelGPT, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model_state_dict(model), "optim": optimizer_state_dict(model, optimizer)}


def load_checkpoint(model: ParallelGPT, optimizer: torch.optim.Optimizer, path: str) -> None:
    import torch.distributed.checkpoint as dcp

    state = checkpoint_state(model, optimizer)
    dcp.load(state, checkpoint_id=path)
    load_model_state_dict(model, state["model"])
    load_optimizer_state_dict(model, optimizer, state["optim"])


def train(spec: dict[str, Any]) -> dict[str, list[float]]:
    """Train in spec["dtype"] (float64 unless given): layouts only reorder sums, so in float64 they
    agree with the single process to ~1e-13, and any real difference stands out."""
    previous, streams = torch.get_default_dtype(), rng_state()  # the reference runs in pytest's process
    torch.set_default_dtype(getattr(torch, spec.get("dtype", "float64")))
    try:
        probes = {
            "dropout": dropout_probe,
            "collectives": collectives_probe,
            "embedding_grads": embedding_grads_probe,
        }
        probe = probes.get(spec.get("probe", ""))
        if spec.get("expect_refusal"):
            return refusal(probe or _train, spec)
        return (probe or _train)(spec)
    finally:
        torch.set_default_dtype(previous)
        set_rng_state(streams)


def refusal(run: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """A spec meant to be refused, in a launch shared with other runs: every rank's error line
    ({"errors": [...]} by rank; None where a rank was not refused), its steps as far as they came."""
    try:
        result, error = run(spec), None
    except ConfigError as refused:
        result, error = None, f"ConfigError: {refused}"
    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return {"errors": errors, "trained": result}


def setup(spec: dict[str, Any]) -> tuple[TrainingConfig, ParallelGPT]:
    """The process group, this rank's streams seeded as gptrain.train.loop seeds them, the model."""
    world = world_from_env()
    if world.world_size > 1:
        init_distributed(world, "cpu", timeout_minutes=2.0)
    cfg = make_config(spec)
    seed_everything(dropout_seed(cfg, world))
    return cfg, parallelize(make_model(cfg, spec), cfg, world)


def _train(spec: dict[str, Any]) -> dict[str, list[float]]:
    import torch.distributed.checkpoint as dcp

    cfg, model = setup(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    if not spec.get("stale_fp8_scales"):  # gptrain's optimizer (train.builders) refreshes them too
        refresh_scales_after_step(optimizer, model)
    ctx = model.ctx
    first = spec.get("start", 0)
    if spec.get("load"):
        load_checkpoint(model, optimizer, spec["load"])
    losses, norms = [], []
    scale = spec.get("loss_scale", 1.0)  # fp16's: train_step divides it out of the gradients
    for step in range(first, spec["steps"]):
        micro = local_microbatches(
            global_batch(step, cfg.model.global_batch_size),
            cfg.model.micro_batch_size,
            ctx.dp_rank,
            ctx.dims.dp,
        )
        loss, _ = forward_backward(model, micro, scale=scale, precision=cfg.trainer.precision)
        params = [p for p in model.parameters() if p.grad is not None]
        if scale != 1.0:
            scale_grads([p.grad for p in params], 1.0 / scale)
        norm = model.grad_norm([p.grad for p in params])
        clip_grads(params, 0.5, norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
        norms.append(float(norm))
        if spec.get("save_at") == step + 1:
            dcp.save(checkpoint_state(model, optimizer), checkpoint_id=spec["save"])
    if spec.get("final"):  # the state after the last step: weights, moments, step counts
        dcp.save(checkpoint_state(model, optimizer), checkpoint_id=spec["final"])
    model.eval()
    held_out = local_microbatches(
        global_batch(10_000, cfg.model.global_batch_size),
        cfg.model.micro_batch_size,
        ctx.dp_rank,
        ctx.dims.dp,
    )
    loss_sum, tokens = eval_loss_sum(model, held_out, "32")
    fp8_linears = sum(type(m).__name__ == "Float8Linear" for part in model.parts for m in part.modules())
    return {
        "stage_layers": every_ranks_layers(model),
        "losses": losses,
        "grad_norms": norms,
        "eval_loss": [float(loss_sum / tokens)],
        "fp8_linears": fp8_linears,
        "float8_gathered": sum(is_float8_gathered(p) for p in model.parameters()),
    }


def every_ranks_layers(model: ParallelGPT) -> list[list[list[int]]]:
    """The global layer indices each rank's pipeline chunks hold, by rank (the split the run used)."""
    mine = [[int(name) for name in part.layers] for part in model.parts]
    if not dist.is_initialized():
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def in_pipeline_metadata_inference() -> bool:
    """Whether torch's PipelineStage is running its shape-inference forward (torch >= 2.12).

    It runs once before the first step, under `fork_rng` (so it draws the masks the first real
    micro-batch then draws again), on `torch.empty` placeholders after the first stage: zeros
    and NaNs in that memory would read as dropped or kept places, so the probe skips it.
    """
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name in ("_forward_metadata_inference", "_shape_inference"):
            return True
        frame = frame.f_back
    return False


def dropout_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """One training forward/backward with dropout on; every rank's record, gathered on rank 0.

    A rank's record: its seed, its (pipeline, tensor) rank by arithmetic and by the mesh, the
    output of each dropout module's first call, in call order (mask: output != 0), the
    modules whose input was a DTensor, and the dropout modules still training after model.eval().
    """
    cfg, model = setup(spec)
    outputs: dict[str, torch.Tensor] = {}
    on_dtensor: list[str] = []

    def record(name: str):
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            if in_pipeline_metadata_inference():
                return
            if isinstance(inputs[0], DTensor):
                on_dtensor.append(name)
            outputs.setdefault(name, to_plain(output).detach().clone())

        return hook

    handles = [
        module.register_forward_hook(record(name))
        for part in model.parts
        for name, module in part.named_modules()
        if isinstance(module, nn.Dropout)
    ]
    ctx = model.ctx
    m = cfg.model
    micro = local_microbatches(
        global_batch(0, m.global_batch_size), m.micro_batch_size, ctx.dp_rank, ctx.dims.dp
    )
    forward_backward(model, micro, scale=1.0, precision=cfg.trainer.precision)
    for handle in handles:
        handle.remove()
    model.eval()  # reaches the embedding's dropout, which is no child of ParallelGPT, only of a part
    training_in_eval = [
        name
        for part in model.parts
        for name, module in part.named_modules()
        if isinstance(module, nn.Dropout) and module.training
    ]
    model.train()
    mine = {
        "seed": torch.initial_seed(),
        "ranks": list(model_parallel_ranks(ctx.dims, world_from_env().rank)),
        "mesh_ranks": [ctx.pp_rank, ctx.tp_rank],
        "outputs": {name: out.flatten().tolist() for name, out in outputs.items()},
        "on_dtensor": on_dtensor,
        "training_in_eval": training_in_eval,
    }
    every = [None] * ctx.dims.world_size
    dist.all_gather_object(every, mine)
    return {"ranks": every}


class ReductionRecorder(TorchDispatchMode):
    """Records each reduction (all-reduce, reduce-scatter) DTensor or FSDP runs: (kind, numel).

    DTensor's and FSDP's reduce-scatters pass through the dispatcher; `dist.all_reduce` (FSDP's
    all-reduce across replicas, the loss and token sums) calls the process group directly, so it is
    wrapped while recording (ops dispatched inside it are not counted twice).
    """

    def __init__(self) -> None:
        super().__init__()
        self.reductions: list[tuple[str, int]] = []
        self.gathers = 0  # all-gathers (FSDP's of the weights; DTensor's under TP)
        self.host_reads = 0  # tensor -> Python number (float(t), t.item()): a device wait on a GPU
        self._in_all_reduce = False

    @contextlib.contextmanager
    def recording(self):  # noqa: ANN201
        original = dist.all_reduce

        def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.reductions.append(("all_reduce", tensor.numel()))
            self._in_all_reduce = True
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._in_all_reduce = False

        dist.all_reduce = all_reduce
        try:
            with self:
                yield self
        finally:
            dist.all_reduce = original

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
        name = str(func)
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if tensor is not None and "wait" not in name and not self._in_all_reduce:
            name = name.replace("allreduce", "all_reduce")  # c10d's name; the functional one has "_"
            kind = next((k for k in ("all_reduce", "reduce_scatter") if k in name), None)
            if kind is not None:
                self.reductions.append((kind, tensor.numel()))
            elif "allgather" in name or "all_gather" in name:
                self.gathers += 1
        return func(*args, **(kwargs or {}))


def collectives_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """One forward/backward after a first one; the reductions and host reads this rank ran (the whole activation's size, micro batch
    x seq x hidden, tells TP's apart), and the micro-batch and layer counts."""
    cfg, model = setup(spec)
    ctx, m = model.ctx, cfg.model
    micro = local_microbatches(
        global_batch(0, m.global_batch_size), m.micro_batch_size, ctx.dp_rank, ctx.dims.dp
    )
    forward_backward(model, micro, scale=1.0, precision=cfg.trainer.precision)  # a schedule's first
    model.zero_grad(set_to_none=True)  # step also exchanges shapes, and reads them on the host
    recorder = ReductionRecorder()
    with recorder.recording():
        forward_backward(model, micro, scale=1.0, precision=cfg.trainer.precision)
    return {
        "reductions": recorder.reductions,
        "gathers": recorder.gathers,
        "host_reads": recorder.host_reads,
        "activation_numel": m.micro_batch_size * SEQ * m.hidden_size,
        "microbatches": len(micro),
        "layers": m.num_layers,
    }


def embedding_grads_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """One forward/backward: each embedding weight's and gradient's placements and local shape, the
    whole gradient, and the numbers the data-parallel all-reduce of the gradients (GradAllReduce,
    run once more under the recorder) carries against this rank's parameter shards."""
    cfg, model = setup(spec)
    ctx, m = model.ctx, cfg.model
    micro = local_microbatches(
        global_batch(0, m.global_batch_size), m.micro_batch_size, ctx.dp_rank, ctx.dims.dp
    )
    forward_backward(model, micro, scale=1.0, precision=cfg.trainer.precision)
    modules = {name: getattr(model, name, None) for name in ("tok_embeddings", "output")}
    embeddings = {
        name: {
            "weight": placements(module.weight),
            "weight_local": list(local(module.weight).shape),
            "grad": placements(module.weight.grad),
            "grad_local": list(local(module.weight.grad).shape),
            "grad_full": whole(module.weight.grad).flatten().tolist(),
        }
        for name, module in modules.items()
        if module is not None
    }
    mine: dict[str, Any] = {"embeddings": embeddings, "dp_all_reduce": None}
    mine["shards"] = sum(local(p).numel() for p in {id(p): p for p in model.parameters()}.values())
    if ctx.grad_sync is not None:
        recorder = ReductionRecorder()
        with recorder.recording():
            ctx.grad_sync()
        mine["dp_all_reduce"] = sum(numel for kind, numel in recorder.reductions if kind == "all_reduce")
    if not dist.is_initialized():
        return {"ranks": [mine]}
    every: list[Any] = [None] * ctx.dims.world_size
    dist.all_gather_object(every, mine)
    return {"ranks": every}


def placements(tensor: torch.Tensor) -> list[str]:
    return [repr(p) for p in tensor.placements] if isinstance(tensor, DTensor) else []


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def main() -> int:
    """Run every spec of {"runs": [...], "out": path} in turn in one process group (one start-up)."""
    job = json.loads(sys.argv[1])
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    results = [train(spec) for spec in job["runs"]]
    if int(os.environ.get("RANK", "0")) == 0:
        with open(job["out"], "w") as handle:
            json.dump(results, handle)
    return 0


def exit_after(main) -> None:
    """Run `main` (its return value, or 0, is the exit code), then leave the process group and
    os._exit, so that an abort at interpreter exit cannot turn a correct run into a failure."""
    code = 1
    try:
        code = main() or 0
    except BaseException:
        traceback.print_exc()  # os._exit below would otherwise swallow it
    finally:
        shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    exit_after(main)
