"""One gloo rank of gptrain's TP model under CPU 16-bit autocast: what its first block keeps for the backward.

For each spec in argv[2] (a JSON list of tests/distributed/parallel_worker specs; "cuda_norms":
its norms in fp32 as CUDA's autocast runs them), one
forward/backward as gptrain runs it (gptrain.parallel.runtime.forward_backward), with two views of
block 0's saved bytes:
- "hooked": the unique storages autograd saves during block 0's forward (saved-tensor hooks; a
  checkpointed block's are hidden from them);
- "live": every storage an op makes during block 0's forward and still alive when the final norm
  runs, less the block's output (the next block's input) and what is made of weights only
  (autocast's cached 16-bit copies), plus the block's input (its first norm keeps it); this sees
  what a checkpointed block keeps too.
Rank 0 writes [{"hooked": bytes, "live": bytes, "tokens": n}, ...] to argv[1].
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

import parallel_worker as pw  # noqa: E402
import torch  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from gptrain.parallel.mesh import shutdown  # noqa: E402
from gptrain.parallel.runtime import forward_backward  # noqa: E402


def local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def key(t: torch.Tensor) -> int:
    return local(t).untyped_storage()._cdata


def pinned(tensors: Any) -> dict[int, StorageWeakRef]:
    """Storages by address, each held by a weak reference: torch frees a storage's data when its
    last tensor goes, but keeps the storage object (so its address) while a weak reference lives.
    A bare address set would later match whatever the allocator put there next."""
    return {key(t): StorageWeakRef(local(t).untyped_storage()) for t in tensors}


class Track(TorchDispatchMode):
    """Storages made by ops while `on`; those made of weights only are marked as copies."""

    def __init__(self, weights: dict[int, StorageWeakRef]) -> None:
        super().__init__()
        self.on = False
        self.weights = weights
        self.before: set[int] = set()
        self.made: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        inputs = [key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        copy = bool(inputs) and all(k in self.weights for k in inputs)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            if copy:
                self.weights |= pinned([t])
            elif self.on and key(t) not in self.weights.keys() | self.before and key(t) not in self.made:
                storage = local(t).untyped_storage()
                self.made[key(t)] = (StorageWeakRef(storage), storage.nbytes())
        return out


def run_norms_in_fp32(model: torch.nn.Module) -> None:
    """As CUDA's autocast runs layer_norm (AT_FORALL_FP32 in ATen's autocast_mode.h): a 16-bit
    input cast up, and that fp32 copy normalised and saved. CPU's autocast leaves it alone."""
    import torch.nn.functional as F

    def fp32_forward(norm: torch.nn.LayerNorm):  # noqa: ANN202
        def forward(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", enabled=False):
                bias = None if norm.bias is None else norm.bias.float()
                return F.layer_norm(x.float(), norm.normalized_shape, norm.weight.float(), bias, norm.eps)

        return forward

    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.forward = fp32_forward(module)


def measure(spec: dict[str, Any]) -> dict[str, float]:
    cfg, model = pw.setup(spec)
    if spec.get("cuda_norms"):
        run_norms_in_fp32(model)
    m = cfg.model
    ctx = model.ctx
    micro = pw.local_microbatches(
        pw.global_batch(0, m.global_batch_size), m.micro_batch_size, ctx.dp_rank, ctx.dims.dp
    )
    assert len(micro) == 1, "one micro batch a rank: the saved tensors of one forward"
    part = model.parts[0]
    block = part.layers["0"]
    track = Track(pinned(model.parameters()))
    hooked: dict[int, int] = {}
    ends: dict[str, Any] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if track.on:
            hooked[key(t)] = local(t).untyped_storage().nbytes()
        return t

    def start(_module, args) -> None:  # noqa: ANN001
        ends["input"] = local(args[0]).untyped_storage().nbytes()
        track.before.add(key(args[0]))  # made before the block: counted once, as its input
        track.weights |= pinned(block.parameters())  # FSDP's gathered ones by now
        track.on = True

    def stop(_module, _args, output) -> None:  # noqa: ANN001
        track.on = False
        ends["output"] = key(output)

    def snapshot(_module, _args) -> None:  # noqa: ANN001
        alive = sum(n for k, (ref, n) in track.made.items() if not ref.expired() and k != ends["output"])
        ends["live"] = alive + ends["input"]

    block.register_forward_pre_hook(start)
    block.register_forward_hook(stop)
    part.norm.register_forward_pre_hook(snapshot)
    with track, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_backward(model, micro, scale=1.0, precision=cfg.trainer.precision)
    tokens = m.micro_batch_size * pw.SEQ
    kept = sum(n for k, n in hooked.items() if k not in track.weights)  # no parameter, no 16-bit copy
    return {"hooked": kept, "live": ends["live"], "tokens": tokens}


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    results = [measure(spec) for spec in json.loads(sys.argv[2])]
    if int(os.environ["RANK"]) == 0:
        Path(sys.argv[1]).write_text(json.dumps(results))
    shutdown()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
