"""One gloo rank of an FSDP2 (DTensor parameters) float64 TinyLM trained by gptrain's train_step with
fused AdamW, which clips and steps on the device, for tests/train/test_train_step.py. The grad norm
is gptrain's over the mesh (what ParallelGPT gives the step).

Arguments: OUT CLIP [FP8_OUT]. Every rank trains on the same batches, so the averaged gradients are
one process's. Rank 0 writes OUT: each step's grad norm and the whole parameters after the last step.
With FP8_OUT, then, in the same launch (one start-up for both tests): a model whose linears FSDP
gathers as float8 (torchao); FP8_OUT gets whether its optimizer would take the on-device update.
"""

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_tiny_lm import TinyLM, random_batch

from gptrain.parallel.grad_norm import global_grad_norm
from gptrain.parallel.mesh import shutdown
from gptrain.train.loss_scale import ConstantLossScaler
from gptrain.train.step import StepOptions, takes_device_skip, train_step

SEEDS = (11, 12, 13)


def float8_gathered(out: str) -> None:
    """torchao's float8-gathered weights (DTensor shards that are tensor subclasses)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=True)
    convert_to_float8_training(model, config=config)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    shards = sorted({type(p.to_local()).__name__ for p in model.parameters()})
    if dist.get_rank() == 0:
        with open(out, "w") as handle:
            json.dump(
                {"device": takes_device_skip(optimizer, list(model.parameters())), "shards": shards}, handle
            )


def main() -> None:
    dist.init_process_group("gloo")
    fused_adamw_steps(sys.argv[1], float(sys.argv[2]))
    if len(sys.argv) > 3:
        float8_gathered(sys.argv[3])


def fused_adamw_steps(out: str, clip: float) -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, eps=1.0, weight_decay=0.1, fused=True)
    assert takes_device_skip(optimizer, list(model.parameters()))
    norms = []
    for seed in SEEDS:
        result = train_step(
            model, optimizer, [random_batch(4, 5, seed=seed)], ConstantLossScaler(),
            torch.device("cpu"), StepOptions(clip_grad=clip, grad_norm_fn=global_grad_norm),
        )  # fmt: skip
        assert result.updated
        norms.append(result.grad_norm)
    weights = {name: p.full_tensor().tolist() for name, p in model.named_parameters()}
    if dist.get_rank() == 0:
        with open(out, "w") as handle:
            json.dump({"norms": norms, "weights": weights}, handle)


if __name__ == "__main__":
    # FSDP2 processes can abort at interpreter exit after a correct run ("terminate called without
    # an active exception", 1 in 5 on 2 cores): barrier, destroy, flush, then os._exit, as
    # tests/distributed/parallel_worker.py ends
    code = 1
    try:
        main()
        code = 0
    except BaseException:
        traceback.print_exc()  # os._exit below would otherwise swallow it
    finally:
        shutdown(wait_for_peers=code == 0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
