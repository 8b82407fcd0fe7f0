"""The real training loop (`gptrain train`) under TP=2 x PP=2 matches one process, and resumes in one.

One 4-process torchrun run (tensor + sequence parallel, 1F1B pipeline) trains 3 steps of
mock data, validates and checkpoints; its Megatron log lines (printed by the last rank)
must carry the single-process losses. The same single-process run then resumes from that
checkpoint, with no conversion, and continues exactly like an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from gloo_ranks import free_port, run_ranks

from gptrain.checkpoint.integrity import verify
from gptrain.config import load_training_config
from gptrain.train import loop

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

COMMON = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.max_time=null",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=0",
    "model.num_layers=4",
    "model.hidden_size=32",
    "model.num_attention_heads=4",
    "model.encoder_seq_length=16",
    "model.micro_batch_size=2",
    "model.global_batch_size=8",
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "model.data.num_workers=0",
    "model.data.data_impl=mock",
    # NullTokenizer's ids with eod_mask_loss: its end of document (about one token in 100) is not
    # counted, so ranks and micro-batches hold different loss-token counts (all-ones masks hid a
    # wrong token reduction)
    "model.tokenizer.type=NullTokenizer",
    "model.tokenizer.vocab_size=100",
    "model.tokenizer.vocab_file=null",
    "model.tokenizer.merge_file=null",
    "model.data.eod_mask_loss=true",
    # 64 x TP (Megatron's padding) gives 128 rows under TP 1 and 2: the layouts see the same logits.
    "model.make_vocab_size_divisible_by=64",
    "model.data.data_prefix=null",
    "model.optim.sched.warmup_steps=1",
    "model.optim.sched.max_steps=6",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=3",
    "exp_manager.create_tensorboard_logger=false",
]
# The loop runs float32 (the CLI has no float64), and the losses are read back as printed: 7 digits,
# a relative step of 2e-7 to 1e-6. TP2 x PP2 against one process, 3 steps, measured 2.1e-7 (one
# printed digit) with AVX-512, AVX2 and default kernels (ATEN_CPU_CAPABILITY) and 1, 2 and 16 threads
# in the one-process run (2026-11-28; the PP2 ramp-up runs pass under the same kernels); RTOL keeps
# 50x that, and a wrong slice or normalisation moves these losses by far more than 1e-5.
RTOL = 1e-5
LAYOUT = [
    "model.tensor_model_parallel_size=2",
    "model.sequence_parallel=true",
    "model.pipeline_model_parallel_size=2",
]


def log_values(log_dir: Path, pattern: str, rank: int = 0) -> list[float]:
    """Values of `pattern` in the log of `rank` (the logging rank is the last one)."""
    log = log_dir / f"nemo_log_globalrank-{rank}_localrank-{rank}.txt"
    return [float(x) for x in re.findall(pattern, log.read_text())]


def train_in_process(log_dir: Path, steps: int) -> int:
    cfg = load_training_config(
        "gpt3/126m",
        [
            *COMMON,
            "trainer.devices=1",
            f"trainer.max_steps={steps}",
            f"exp_manager.explicit_log_dir={log_dir}",
        ],
    )
    return loop.train(cfg)


def test_tp2_pp2_loop_matches_one_process_and_resumes_in_one(tmp_path: Path, torchrun) -> None:
    parallel = tmp_path / "tp2_pp2"
    args = [*torchrun(4), "-m", "gptrain", "train", "gpt3/126m", *COMMON, *LAYOUT]
    args += ["trainer.devices=4", "trainer.max_steps=3", f"exp_manager.explicit_log_dir={parallel}"]
    done = subprocess.run(
        args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]

    single = tmp_path / "single"
    assert train_in_process(single, 6) == 0
    loss, val = r"\| lm loss: ([0-9.E+-]+) \|", r"lm loss value: ([0-9.E+-]+) \|"
    expected, expected_val = log_values(single, loss), log_values(single, val)
    assert len(expected) == 6 and len(expected_val) == 3  # at 3, at 6, at 6 on validation set
    assert log_values(parallel, loss, rank=3) == pytest.approx(expected[:3], rel=RTOL)
    # at 3 and at 3 on validation set (that run's end): one evaluation, two blocks
    assert log_values(parallel, val, rank=3) == pytest.approx(expected_val[:1] * 2, rel=RTOL)
    assert log_values(parallel, loss, rank=0) == []  # Megatron's print_rank_last
    # the banner counts the whole model on every rank (it counted the logging stage's part under PP)
    params = r"gptrain: ([0-9,]+) parameters \|"
    whole = [
        int(n.replace(",", ""))
        for n in re.findall(params, (single / "nemo_log_globalrank-0_localrank-0.txt").read_text())
    ]
    for rank in (0, 3):
        log = (parallel / f"nemo_log_globalrank-{rank}_localrank-{rank}.txt").read_text()
        assert [int(n.replace(",", "")) for n in re.findall(params, log)] == whole
    # Rank 0's COMPLETE manifest holds every rank's shard with the CRC-32 that rank computed writing it.
    step_3 = parallel / "checkpoints" / "step_3"
    files = json.loads((step_3 / "COMPLETE").read_text())["files"]
    shards = sorted(p.name for p in step_3.glob("*.distcp"))
    assert len(shards) == 4 and all(files[name]["crc32"] for name in shards)
    assert verify(step_3, checksums=True) is None
    # Rank 0 (the first stage) records the validation loss that the last stage computed and printed:
    # printed to 7 significant digits, within 5e-7 of it
    recorded = json.loads((step_3 / "COMPLETE").read_text())["metrics"]["val_loss"]
    assert recorded == pytest.approx(log_values(parallel, val, rank=3)[0], rel=1e-6)

    assert train_in_process(parallel, 6) == 0  # resumes the TP x PP checkpoint of step 3 in one process
    assert "resuming from" in (parallel / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert log_values(parallel, loss) == pytest.approx(expected[3:], rel=RTOL)
    assert log_values(parallel, val) == pytest.approx(expected_val[1:], rel=RTOL)


def run_torchrun(command: list[str], log_dir: Path, layout: list[str], steps: int) -> None:
    args = [*command, "-m", "gptrain", "train", "gpt3/126m", *COMMON, *layout, "trainer.devices=2"]
    args += [f"trainer.max_steps={steps}", f"exp_manager.explicit_log_dir={log_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_an_fsdp_checkpoint_resumes_under_a_virtual_pipeline_with_its_optimizer_state(
    tmp_path: Path, torchrun
) -> None:
    """The loop's own save and load (the checkpoint manager's fit checks, the tied output layer on the
    last stage) across a layout change: saved under FSDP (DP 2) at step 3, resumed under PP 2 x 2
    virtual stages to step 6. The losses are one process's, and step 6's weights, Adam moments (to
    RTOL of each tensor), step counts and hyperparameters (exactly) are the uninterrupted run's."""
    from test_optimizer_resharding import assert_same_state, final_state

    changed = tmp_path / "fsdp_then_pp2_v2"
    run_torchrun(torchrun(2), changed, ["model.data_parallel_sharding=full_shard"], 3)
    pipeline = ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"]
    run_torchrun(torchrun(2), changed, pipeline, 6)
    single = tmp_path / "single"
    assert train_in_process(single, 6) == 0

    loss = r"\| lm loss: ([0-9.E+-]+) \|"
    assert "resuming from" in (changed / "nemo_log_globalrank-1_localrank-1.txt").read_text()
    assert log_values(changed, loss, rank=1) == pytest.approx(log_values(single, loss), rel=RTOL)
    expected = final_state(single / "checkpoints" / "step_6", tmp_path / "single.pt")
    actual = final_state(changed / "checkpoints" / "step_6", tmp_path / "changed.pt")
    assert_same_state(actual, expected, "saved under FSDP, resumed under PP2 x 2 virtual", rtol=RTOL)


RAMPS = {  # schedule: (ramp-up, layout)
    "1f1b": (["model.rampup_batch_size=[4,2,12]"], ["model.pipeline_model_parallel_size=2"]),
    "interleaved": (
        ["model.rampup_batch_size=[4,4,8]"],
        ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"],
    ),
}
CLI_RUNS = Path(__file__).parent.parent / "cli_runs_worker.py"


@pytest.fixture(scope="module")
def ramped_pipelines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each schedule's ramped PP2 run, in one launch of two ranks (one start-up): <root>/<schedule>."""
    root = tmp_path_factory.mktemp("ramped")
    runs = []
    for name, (ramp, layout) in RAMPS.items():
        argv = ["train", "gpt3/126m", *COMMON, *ramp, *layout, "trainer.devices=2", "trainer.max_steps=5"]
        runs.append({"port": free_port(), "argv": [*argv, f"exp_manager.explicit_log_dir={root / name}"]})
    run_ranks(CLI_RUNS, json.dumps(runs), timeout_s=300)
    return root


@pytest.mark.parametrize("schedule", list(RAMPS))
def test_pipeline_with_batch_rampup_matches_one_process(
    tmp_path: Path, schedule: str, ramped_pipelines: Path
) -> None:
    """A ramp-up changes the micro-batches per step (here 2, 2, 3, 4, then 4 of the full batch):
    each count gets its schedule over the same stages, and the losses are one process's."""
    ramp, _ = RAMPS[schedule]
    parallel = ramped_pipelines / schedule

    single = tmp_path / "single"
    cfg = load_training_config(
        "gpt3/126m",
        [
            *COMMON,
            *ramp,
            "trainer.devices=1",
            "trainer.max_steps=5",
            f"exp_manager.explicit_log_dir={single}",
        ],
    )
    assert loop.train(cfg) == 0
    loss, val = r"\| lm loss: ([0-9.E+-]+) \|", r"lm loss value: ([0-9.E+-]+) \|"
    batch = r"global batch size: +(\d+) \|"
    assert log_values(parallel, batch, rank=1) == log_values(single, batch)
    assert len(set(log_values(single, batch))) > 1  # the batch did ramp
    assert log_values(parallel, loss, rank=1) == pytest.approx(log_values(single, loss), rel=RTOL)
    assert log_values(parallel, val, rank=1) == pytest.approx(log_values(single, val), rel=RTOL)
