"""One gloo rank of the FSDP2 + emulated FP8 runs of tests/train/test_fp8_fsdp_checkpoint.py.

Arguments: OUT ROOT PORT. Trains ROOT/full for 4 steps with background saves (steps 2 and 4), then,
meeting on PORT (a port of its own: a rank done early could otherwise reach the store the other rank
has yet to close), ROOT/resumed from full's step_2, saving step 4 in place (async_save=false). Each run writes
OUT/<run>_rank_<r>.json: the exit code and each step's loss.
"""

import json
import os
import sys
from pathlib import Path

from train_e2e_helpers import MOCK, tiny_config

from gptrain.train import loop, step_loop

FP8_FSDP_ASYNC = [
    *MOCK,
    "trainer.devices=2",
    "trainer.max_steps=4",
    "trainer.val_check_interval=4",
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "model.data_parallel_sharding=full_shard",
    "model.fp8=true",
    "model.fp8_emulate=true",
    "exp_manager.checkpoint_callback_params.async_save=true",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
]


def main() -> None:
    out, root, port = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    rank = int(os.environ["RANK"])
    losses: dict[int, float] = {}
    real_record = step_loop.record

    def recording(session, result, *args):
        real_record(session, result, *args)
        losses[session.state.step] = result.loss

    step_loop.record = recording
    resume = [
        f"exp_manager.resume_from_checkpoint={root / 'full' / 'checkpoints' / 'step_2'}",
        "exp_manager.checkpoint_callback_params.async_save=false",
    ]
    out.mkdir(parents=True, exist_ok=True)
    for name, extra in (("full", []), ("resumed", resume)):
        if name == "resumed":
            os.environ["MASTER_PORT"] = port
        losses.clear()
        code = loop.train(tiny_config(root / name, *FP8_FSDP_ASYNC, *extra), process_exits=True)
        (out / f"{name}_rank_{rank}.json").write_text(json.dumps({"code": code, "losses": losses}))


if __name__ == "__main__":
    main()
