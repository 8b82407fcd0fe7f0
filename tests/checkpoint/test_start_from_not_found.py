"""exp_manager.resume_from_checkpoint naming a place with nothing to start from: the same
distinctions as eval/generate/export (gptrain.trained.load), the note that gptrain reads its own
checkpoints kept for where no gptrain run is near."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptrain.checkpoint.directory import CheckpointLoadError, find_checkpoint

GPTRAIN_HPARAMS = "run:\n  name: r\ntrainer:\n  max_steps: 4\nexp_manager:\n  explicit_log_dir: r\nmodel:\n  num_layers: 2\n"
OWN_ONLY = "gptrain reads its own checkpoints, not Megatron's iter_<N>/ or NeMo's .ckpt/.nemo files"
FILE_GIVEN = "is a file, not a checkpoint; pass a run's results dir, its checkpoints dir or a step_<N> dir"


def start_from_error(path: Path) -> str:
    with pytest.raises(CheckpointLoadError) as error:
        find_checkpoint(path)
    return str(error.value)


def complete(step_dir: Path) -> None:
    step_dir.mkdir(parents=True)
    (step_dir / "COMPLETE").write_text(f'{{"step": {step_dir.name.removeprefix("step_")}}}')


def test_a_gptrain_run_without_a_checkpoint_yet_says_so_not_that_gptrain_reads_its_own(
    tmp_path: Path,
) -> None:
    """Another run still before its first save (its hparams.yaml written at start) was told gptrain
    reads its own checkpoints, not Megatron's or NeMo's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "hparams.yaml").write_text(GPTRAIN_HPARAMS)
    state = f"no checkpoint saved yet in {run / 'checkpoints'}: wait for the run's first save"
    assert start_from_error(run) == f"{run}: {state}"
    (run / "checkpoints").mkdir()
    assert start_from_error(run / "checkpoints") == f"{run / 'checkpoints'}: {state}"
    assert start_from_error(run / "hparams.yaml") == f"{run / 'hparams.yaml'}: {FILE_GIVEN} ({state})"


def test_a_run_whose_only_save_is_unfinished_is_not_told_to_pass_itself(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "hparams.yaml").write_text(GPTRAIN_HPARAMS)
    root = run / "checkpoints"
    unfinished = f"{root}: no complete checkpoint (every step_* lacks its COMPLETE marker)"
    assert start_from_error(run) == unfinished
    assert start_from_error(root) == unfinished
    assert start_from_error(root / "step_2") == (
        f"{root / 'step_2'}: incomplete checkpoint (no COMPLETE marker: its save has not finished, or was "
        f"killed); no checkpoint in {root} is complete yet: wait for the run's first save to finish"
    )
    complete(root / "step_1")
    assert start_from_error(root / "step_2").endswith(f"pass {root} to use the newest complete one (step_1)")


def test_a_checkpoint_set_aside_points_to_the_newest_complete_one(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    complete(root / "step_1")
    aside = root / "step_3.damaged-20261129-120000"
    aside.mkdir()
    assert start_from_error(aside) == (
        f"{aside}: set aside as damaged (a resume found it so and passed over it); pass {root} for the "
        "newest complete one"
    )


def test_megatron_and_nemo_directories_are_still_told_gptrain_reads_its_own(tmp_path: Path) -> None:
    megatron = tmp_path / "megatron"
    (megatron / "iter_0000100").mkdir(parents=True)
    nemo = tmp_path / "nemo_run" / "results"
    (nemo / "checkpoints").mkdir(parents=True)
    (nemo / "hparams.yaml").write_text("cfg:\n  micro_batch_size: 1\n")  # Lightning's, not a run config
    (nemo / "checkpoints" / "megatron_gpt.nemo").write_text("x")
    for path in (megatron, megatron / "iter_0000100", nemo):
        assert start_from_error(path) == (
            f"{path}: no checkpoints found; pass a run's results dir, its checkpoints dir or a step dir ({OWN_ONLY})"
        )
    file = nemo / "checkpoints" / "megatron_gpt.nemo"
    assert start_from_error(file) == f"{file}: {FILE_GIVEN} ({OWN_ONLY})"
