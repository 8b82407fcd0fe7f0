"""The default data-parallel seams: 2 gloo processes train like one process on the same global batch."""

import os
import re
import subprocess

import pytest
from train_e2e_helpers import MOCK, TINY, tiny_config

from gptrain.train.loop import train

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
NO_DROPOUT = [
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "trainer.max_steps=3",
    "model.global_batch_size=8",
]


def losses(log_dir):
    last_rank = sorted(log_dir.glob("nemo_log_globalrank-*_localrank-*.txt"))[-1]  # the logging rank
    text = last_rank.read_text()
    return [float(x) for x in re.findall(r"\| lm loss: ([0-9.E+-]+) \|", text)]


def launch(prefix: list[str], log_dir, devices: int, *extra: str) -> None:
    args = [*prefix, "-m", "gptrain", "train", "gpt3/126m", *TINY, *MOCK, *NO_DROPOUT, *extra]
    args += [f"trainer.devices={devices}", f"exp_manager.explicit_log_dir={log_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    ("sharding", "said"),
    [
        ([], "AdamW state and gradients sharded, weights gathered once per step (shard_grad_op)"),
        (["model.data_parallel_sharding=ddp"], "replicated (DDP)"),
    ],
)
def test_two_process_data_parallel_matches_one_process(tmp_path, torchrun, sharding, said):
    """The preset's distributed_fused_adam shards AdamW's state (shard_grad_op), as NeMo does; an
    explicit ddp replicates it. Both train as one process does, and the log says which it is."""
    one_process = tiny_config(tmp_path / "one", *MOCK, *NO_DROPOUT, "trainer.devices=1")
    assert train(one_process) == 0
    launch(torchrun(2), tmp_path / "two", 2, *sharding)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(one) == len(two) == 3
    assert two == pytest.approx(one, rel=2e-6)
    log = (tmp_path / "two" / "nemo_log_globalrank-1_localrank-1.txt").read_text()
    assert f" > data parallel over 2 ranks: {said}" in log
    assert (tmp_path / "two" / "nemo_log_globalrank-1_localrank-1.txt").is_file()
    step_dir = tmp_path / "two" / "checkpoints" / "step_3"
    assert {p.name for p in step_dir.iterdir()} >= {"COMPLETE", "rank_0.pt", "rank_1.pt", ".metadata"}
