"""One gloo rank of gptrain's TP2 model under CPU bf16 autocast: what its collectives carry.

For each layout in argv[2] (a JSON list of parallel_worker specs), the model is built twice from
the same seed: as gptrain builds it, and with gptrain.parallel.tensor_parallel's input cast made a
no-op (the fp32-reduce version it replaced). Each runs one forward/backward after a first one and
records every collective it runs (op, dtype, numel), its loss and its gradients (whole tensors).
Rank 0 writes [{"cast": record, "uncast": record}, ...] to argv[1].
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any

import parallel_worker as pw
import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from gptrain.parallel import tensor_parallel
from gptrain.parallel.runtime import forward_backward

COLLECTIVES = ("all_reduce", "allreduce", "reduce_scatter", "all_gather", "allgather")


class DtypeRecorder(TorchDispatchMode):
    """Every collective dispatched (DTensor's functional ones, c10d's): (op, dtype, numel)."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        first = args[0] if args else None
        if isinstance(first, (list, tuple)) and first:
            first = first[0]
        if isinstance(first, torch.Tensor) and "wait" not in name and any(c in name for c in COLLECTIVES):
            self.collectives.append((name, str(first.dtype).removeprefix("torch."), first.numel()))
        return func(*args, **(kwargs or {}))


def record(spec: dict[str, Any]) -> dict[str, Any]:
    cfg, model = pw.setup(spec)
    m, ctx = cfg.model, model.ctx
    micro = pw.local_microbatches(pw.global_batch(0, m.global_batch_size), m.micro_batch_size, 0, 1)
    forward_backward(model, micro, scale=1.0, precision="bf16")  # the first step's extra exchanges
    model.zero_grad(set_to_none=True)
    recorder = DtypeRecorder()
    with recorder:
        loss, _ = forward_backward(model, micro, scale=1.0, precision="bf16")
    grads = {
        name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).double().flatten().tolist()
        for name, p in model.named_parameters()
    }
    return {
        "collectives": recorder.collectives,
        "loss": float(loss),
        "grads": grads,
        "activation_numel": m.micro_batch_size * pw.SEQ * m.hidden_size // ctx.dims.tp,
    }


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    results = []
    for spec in json.loads(sys.argv[2]):
        cast = record(spec)
        keep = getattr(tensor_parallel, "cast_to_autocast_dtype", None)
        tensor_parallel.cast_to_autocast_dtype = lambda module, args: None  # before gptrain cast
        try:
            uncast = record(spec)
        finally:
            tensor_parallel.cast_to_autocast_dtype = keep
        results.append({"cast": cast, "uncast": uncast})
    if int(os.environ["RANK"]) == 0:
        with open(sys.argv[1], "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    pw.exit_after(main)
