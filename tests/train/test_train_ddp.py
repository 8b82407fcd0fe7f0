"""The default data-parallel seams: 2 gloo processes train like one process on the same global batch.

The mock data is NullTokenizer's 20 ids with eod_mask_loss (id 19, the end of document, is about
one token in 20): the ranks' and micro-batches' loss-token counts differ, so a token count that is
not the all-reduced one (a rank's own count x DP) moves the losses; with all-ones masks it did not.
"""

import json
import re
from pathlib import Path

import pytest
from gloo_ranks import free_port, run_ranks
from train_e2e_helpers import MOCK, TINY, tiny_config

from gptrain.train import step_loop
from gptrain.train.loop import train

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
NO_DROPOUT = [
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "trainer.max_steps=3",
    "model.global_batch_size=8",
]
UNEVEN_TOKENS = [
    *MOCK,
    "model.data.mock_vocab_size=null",
    "model.tokenizer.type=NullTokenizer",
    "model.tokenizer.vocab_size=20",
    "model.tokenizer.vocab_file=null",
    "model.tokenizer.merge_file=null",
    "model.data.eod_mask_loss=true",
]
FULL_STEP_TOKENS = 8 * 16  # global batch x sequence length


def losses(log_dir):
    last_rank = sorted(log_dir.glob("nemo_log_globalrank-*_localrank-*.txt"))[-1]  # the logging rank
    text = last_rank.read_text()
    return [float(x) for x in re.findall(r"\| lm loss: ([0-9.E+-]+) \|", text)]


SHARDINGS = {  # how the log says each is held
    "shard_grad_op": (
        [],
        "AdamW state and gradients sharded, weights gathered once per step (shard_grad_op)",
    ),
    "ddp": (["model.data_parallel_sharding=ddp"], "replicated (DDP)"),
}
CLI_RUNS = Path(__file__).parent.parent / "cli_runs_worker.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process run ("one") and each sharding's two-process run, these in one launch of two
    ranks (one start-up): the comparisons below share them."""
    root = tmp_path_factory.mktemp("ddp")
    tokens = []
    real_record = step_loop.record

    def record(session, result, *args):
        real_record(session, result, *args)
        tokens.append(result.tokens)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_loop, "record", record)
        assert train(tiny_config(root / "one", *UNEVEN_TOKENS, *NO_DROPOUT, "trainer.devices=1")) == 0
    # the end-of-document masks are really there, and differ from step to step
    assert len(tokens) == 3 and max(tokens) < FULL_STEP_TOKENS and len(set(tokens)) > 1, tokens
    two_process = []
    for name, (sharding, _) in SHARDINGS.items():
        argv = ["train", "gpt3/126m", *TINY, *UNEVEN_TOKENS, *NO_DROPOUT, *sharding, "trainer.devices=2"]
        two_process.append(
            {"port": free_port(), "argv": [*argv, f"exp_manager.explicit_log_dir={root / name}"]}
        )
    run_ranks(CLI_RUNS, json.dumps(two_process), timeout_s=300)
    return root


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("sharding", list(SHARDINGS))
def test_two_process_data_parallel_matches_one_process(runs, sharding):
    """The preset's distributed_fused_adam shards AdamW's state (shard_grad_op), as NeMo does; an
    explicit ddp replicates it. Both train as one process does, and the log says which it is."""
    one, two = losses(runs / "one"), losses(runs / sharding)
    assert len(one) == len(two) == 3
    assert two == pytest.approx(one, rel=2e-6)
    log = (runs / sharding / "nemo_log_globalrank-1_localrank-1.txt").read_text()
    assert f" > data parallel over 2 ranks: {SHARDINGS[sharding][1]}" in log
    assert (runs / sharding / "nemo_log_globalrank-1_localrank-1.txt").is_file()
    step_dir = runs / sharding / "checkpoints" / "step_3"
    assert {p.name for p in step_dir.iterdir()} >= {"COMPLETE", "rank_0.pt", "rank_1.pt", ".metadata"}
