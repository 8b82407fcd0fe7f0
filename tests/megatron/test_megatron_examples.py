"""The shapes of Megatron-LM's own example scripts (examples/pretrain_gpt*.sh of 2021 to 2024,
examples/gpt3/train_gpt3_175b_distributed.sh of 2026), written out with placeholder paths."""

import shlex

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.megatron.batch_schedule import as_ramp, parse_schedule
from gptrain.megatron.translate import translate
from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule import lr_at, spec_from_config

# The 345M scripts of August 2021 to September 2023: what they share, and what each adds.
GPT_345M = (
    "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024"
    " --max-position-embeddings 1024 --train-iters 500000 --lr-decay-iters 320000 --save /run --load /run"
    " --data-path /data/corpus_text_document --vocab-file /tok/vocab.json --merge-file /tok/merges.txt"
    " --data-impl mmap --split 949,50,1 --lr 0.00015 --min-lr 1.0e-5 --lr-decay-style cosine"
    " --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 --activations-checkpoint-method uniform"
    " --log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --fp16"
)
SHAPES_345M = {
    "pretrain_gpt.sh": ("--micro-batch-size 4 --global-batch-size 8", {"WORLD_SIZE": "1"}, (1, 1, 1)),
    "pretrain_gpt_distributed.sh": (
        "--micro-batch-size 8 --global-batch-size 64 --distributed-backend nccl",
        {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"},
        (1, 1, 8),
    ),
    "pretrain_gpt_distributed_with_mp.sh": (
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel"
        " --micro-batch-size 4 --global-batch-size 16 --distributed-backend nccl",
        {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"},
        (2, 2, 8),
    ),
}
# examples/pretrain_gpt3_175B.sh of the same years: a three-way blend, a ramp, sample schedules
GPT3_175B_SBATCH = (
    "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --num-layers 96 --hidden-size 12288"
    " --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1"
    " --global-batch-size 1536 --rampup-batch-size 16 16 5859375 --train-samples 146484375"
    " --lr-decay-samples 126953125 --lr-warmup-samples 183105 --lr 6.0e-5 --min-lr 6.0e-6"
    " --lr-decay-style cosine --log-interval 10 --eval-iters 40 --eval-interval 1000"
    " --data-path 0.2 /data/a 0.3 /data/b 0.5 /data/c --vocab-file /tok/v.json --merge-file /tok/m.txt"
    " --save-interval 1000 --save /run --load /run --split 98,2,0 --clip-grad 1.0 --weight-decay 0.1"
    " --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --tensorboard-dir /board --fp16"
    " --activations-checkpoint-method uniform"
)
# examples/gpt3/train_gpt3_175b_distributed.sh since April 2026: the schedule replaces the ramp. The
# script expands its arrays unquoted, so the quoted schedule reaches pretrain_gpt.py as six words.
SCHEDULE = "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"
GPT3_175B_2026 = (
    "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048"
    " --max-position-embeddings 2048 --attention-backend auto --micro-batch-size 1 --global-batch-size 1536"
    f" --step-batch-size-schedule {SCHEDULE} --train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9"
    " --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine"
    " --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000 --tensor-model-parallel-size 8"
    " --pipeline-model-parallel-size 16 --data-path /data/corpus_text_document --vocab-file /tok/v.json"
    " --merge-file /tok/m.txt --split 949,50,1 --log-interval 100 --save-interval 10000 --eval-interval 1000"
    " --save /run --load /run --eval-iters 10 --tensorboard-dir /board"
)
SMALL = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"


def megatron_step_batch(schedule, consumed):
    """Megatron's step rule: the batch of the last threshold at or below the consumed samples."""
    return [batch for threshold, batch in schedule if consumed >= threshold][-1]


@pytest.mark.parametrize("script", SHAPES_345M)
def test_megatron_345m_example_scripts_translate(script):
    extra, env, (tp, pp, world) = SHAPES_345M[script]
    t = translate(shlex.split(f"{GPT_345M} {extra}"), env)
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size) == (tp, pp)
    assert m.sequence_parallel is (tp > 1) and cfg.trainer.devices * cfg.trainer.num_nodes == world
    # --activations-checkpoint-method uniform: every layer recomputed whole, as Megatron of 2021-2022
    assert (m.activations_checkpoint_granularity, m.activations_checkpoint_method) == ("full", "uniform")
    assert m.activations_checkpoint_num_layers == 1 and cfg.trainer.precision == "16"
    assert (cfg.trainer.max_steps, m.data.splits_string, m.data.data_prefix) == (
        500000,
        "949,50,1",
        "/data/corpus_text_document",
    )
    spec = spec_from_config(cfg)
    assert (spec.max_steps, spec.warmup_steps) == (320000, pytest.approx(3200))  # .01 of the decay
    assert lr_at(1600, spec) == pytest.approx(0.00015 / 2) and lr_at(320000, spec) == pytest.approx(1e-5)
    assert cfg.exp_manager.resume_if_exists and cfg.exp_manager.explicit_log_dir == "/run"


def test_megatron_175b_sbatch_example_of_2022_translates():
    t = translate(shlex.split(GPT3_175B_SBATCH), {"SLURM_NTASKS": "1024", "SLURM_NTASKS_PER_NODE": "8"})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    m = cfg.model
    assert m.data.data_prefix == [0.2, "/data/a", 0.3, "/data/b", 0.5, "/data/c"]
    assert m.rampup_batch_size == [16, 16, 5859375] and cfg.trainer.train_samples == 146484375
    assert (m.activations_checkpoint_granularity, m.activations_checkpoint_method) == ("full", "uniform")
    assert (cfg.trainer.num_nodes, cfg.trainer.devices) == (128, 8)


@pytest.mark.parametrize("schedule_words", [SCHEDULE.split(), [SCHEDULE]])
def test_megatron_175b_example_of_2026_takes_its_step_schedule_as_the_ramp(schedule_words):
    flags = shlex.split(GPT3_175B_2026)
    at = flags.index("--step-batch-size-schedule") + 1
    flags[at : at + 6] = schedule_words  # as the script passes it, or quoted as one word
    t = translate(flags, {"WORLD_SIZE": "128", "LOCAL_WORLD_SIZE": "8"})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    m = cfg.model
    # 2.4B tokens / 2048 = 1,171,875 samples a step: 16, 320, ..., 1536 after 12B tokens
    assert (m.rampup_batch_size, m.global_batch_size) == ([16, 304, 5859375], 1536)
    assert cfg.trainer.max_steps == 500000 and spec_from_config(cfg).warmup_steps == pytest.approx(430)
    assert (
        "--global-batch-size (the last batch of --step-batch-size-schedule; Megatron refuses the pair)"
        in (t.notes)
    )


def test_an_equal_step_schedule_gives_megatrons_batch_at_every_sample_count():
    schedule = parse_schedule(SCHEDULE, 2048)
    ramp = BatchRamp.from_config(as_ramp(schedule, SCHEDULE), 1536, 16)
    for k in range(7):
        for consumed in (k * 1171875 - 1, k * 1171875, k * 1171875 + 1, k * 1171875 + 600000):
            if consumed >= 0:
                assert ramp.at(consumed) == megatron_step_batch(schedule, consumed), consumed


@pytest.mark.parametrize("seq_length", [4096, 8192])
def test_equal_token_steps_floored_to_uneven_samples_are_the_ramp_within_one_sample(seq_length):
    """The 175B example's schedule at 4096 or 8192 tokens a sample: Megatron floors 2.4B / 4096 to
    585,937 but 4.8B / 4096 is 1,171,875, so the steps are a fraction of a sample apart from even.
    gptrain takes the ramp and says so; the batch is Megatron's at every consumed count but the
    one-sample windows before a floored threshold."""
    flags = f"{SMALL} --seq-length {seq_length} --max-position-embeddings {seq_length}".split()
    t = translate([*flags, "--step-batch-size-schedule", SCHEDULE, "--train-iters", "10", "--mock-data"], {})
    assert any("each batch step comes at most one sample after Megatron's" in note for note in t.notes)
    schedule = parse_schedule(SCHEDULE, seq_length)
    ramp = BatchRamp.from_config(as_ramp(schedule, SCHEDULE), 1536, 16)
    for k, (threshold, _) in enumerate(schedule):
        for consumed in (threshold - 1, threshold + 1, threshold + 5000):
            if consumed >= 0:
                assert ramp.at(consumed) == megatron_step_batch(schedule, consumed), (k, consumed)


def test_a_schedule_with_train_samples_counts_iterations_as_megatron_does():
    """Megatron steps until the consumed samples reach --train-samples, a last partial batch included
    (--rampup-batch-size's count drops it); 992 tokens of 16 are 62 samples."""
    flags = f"{SMALL} --step-batch-size-schedule 0:4,992:8,1984:12 --train-samples 1001 --mock-data --vocab-size 64"
    cfg = load_training_config(None, translate(shlex.split(flags), {}).overrides, report_ignored=False)
    schedule = [(0, 4), (62, 8), (124, 12)]
    assert parse_schedule("0:4,992:8,1984:12", 16) == schedule
    consumed, batches = 0, []
    while consumed < 1001:
        batches.append(megatron_step_batch(schedule, consumed))
        consumed += batches[-1]
    assert cfg.trainer.max_steps == len(batches) == 97 and cfg.trainer.train_samples == 1001
    ramp = BatchRamp.from_config(cfg.model.rampup_batch_size, cfg.model.global_batch_size, 2)
    assert ramp.iterations_for(1001) == 96  # the ramp's count: the last 5 samples dropped
    done = 0
    for batch in batches:
        assert ramp.at(done) == batch
        done += batch


def test_a_schedule_without_a_global_batch_says_how_iterations_count():
    flags = f"{SMALL} --step-batch-size-schedule '0:4 1K:8' --train-iters 10 --mock-data --vocab-size 64"
    t = translate(shlex.split(flags), {})
    assert t.values["model.global_batch_size"] == 8 and t.values["model.rampup_batch_size"] == [4, 4, 62]
    assert any(
        note.startswith("--step-batch-size-schedule with --train-iters (the --lr-*-iters") for note in t.notes
    )
    one = translate(shlex.split(flags.replace("'0:4 1K:8'", "0:6")), {}).values
    assert one["model.global_batch_size"] == 6 and "model.rampup_batch_size" not in one  # one size: no ramp


@pytest.mark.parametrize(
    ("flags", "granularity", "method", "layers"),
    [
        ("--activations-checkpoint-method uniform", "full", "uniform", 1),
        ("--activations-checkpoint-method block --activations-checkpoint-num-layers 2", "full", "block", 2),
        ("--checkpoint-activations --checkpoint-num-layers 3", "full", "uniform", 3),  # January 2021
        ("--activations-checkpoint-method block --checkpoint-activations", "full", "uniform", 1),
    ],
)
def test_recompute_flags_of_2021_and_2022_keep_their_meaning(flags, granularity, method, layers):
    t = translate(shlex.split(f"{SMALL} --train-iters 4 --mock-data --vocab-size 64 {flags}"), {})
    m = load_training_config(None, t.overrides, report_ignored=False).model
    got = (m.activations_checkpoint_granularity, m.activations_checkpoint_method)
    assert (*got, m.activations_checkpoint_num_layers) == (granularity, method, layers)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--step-batch-size-schedule '0:4 100:8 300:12'",
            "--step-batch-size-schedule '0:4 100:8 300:12' (0:4, 6:8, 18:12 in samples): gptrain ramps the batch",
        ),
        ("--step-batch-size-schedule '0:8 1K:4'", "gptrain ramps the batch by equal increments"),
        (
            "--global-batch-size 16 --step-batch-size-schedule '0:4 1K:8'",
            "--global-batch-size 16 and --step-batch-size-schedule '0:4 1K:8' (last batch 8): drop",
        ),
        (
            "--global-batch-size 8 --rampup-batch-size 4 4 100 --step-batch-size-schedule 0:8",
            "--step-batch-size-schedule and --rampup-batch-size: give one",
        ),
        ("--step-batch-size-schedule 16:4", "the first entry must start at 0"),
        ("--step-batch-size-schedule 0-4", "the entry '0-4' is not THRESHOLD:BATCH"),
        ("--step-batch-size-schedule 0:4x", "'4X' is not a number"),
        ("--step-batch-size-schedule '0:4 8:8'", "give each threshold once (in tokens)"),
        ("--step-batch-size-schedule", "--step-batch-size-schedule: needs at least one value"),
        ("--activations-checkpoint-method full", "--activations-checkpoint-method full: not supported"),
    ],
)
def test_bad_schedules_are_one_line_errors_naming_the_flag(flags, message, capsys):
    base = f"{SMALL} --train-iters 4 --data-path /d/x_text_document --split 98,2,0"
    assert main(["megatron", "--dry-run", *shlex.split(base), *shlex.split(flags)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    with pytest.raises(ConfigError):
        translate(shlex.split(f"{base} {flags}"), {})
