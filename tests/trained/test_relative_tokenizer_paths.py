"""A run's hparams.yaml records model.tokenizer's files as given, relative to the directory the run
was started in: generate, export and eval from any other directory said "model.tokenizer.vocab_file=
bpe/vocab.json not found; run from the directory the training ran in". Where the run's relative
explicit_log_dir tells that directory, they are read from there, as eval reads a relative data_prefix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("transformers")

from hf_helpers import gpt2_files, run_cli, saved_run  # noqa: E402

from gptrain.errors import DataError  # noqa: E402
from gptrain.trained.load import open_run  # noqa: E402

EVAL_SHAPE = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.devices=1",
    "model.micro_batch_size=1",
    "model.global_batch_size=2",
    "model.data.data_impl=mock",
    "model.data.mock_vocab_size=null",  # the tokenizer's vocabulary: its files are read
    "model.data.data_prefix=null",
    "model.data.num_workers=0",
]
RELATIVE_FILES = {"vocab_file": "bpe/vocab.json", "merge_file": "bpe/merges.txt"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run started in `project`, as `gptrain train` there records it: its GPT-2 files and its
    run directory named relative to `project`."""
    project = tmp_path_factory.mktemp("tokpaths") / "project"
    (project / "bpe").mkdir(parents=True)
    for source, name in zip(gpt2_files(), ("vocab.json", "merges.txt"), strict=True):
        shutil.copyfile(source, project / "bpe" / name)
    absolute = [f"model.tokenizer.{key}={project / value}" for key, value in RELATIVE_FILES.items()]
    run, _ = saved_run(project / "results" / "run", "gpt2", *EVAL_SHAPE, *absolute)
    record(run, "results/run")
    return project


def record(run: Path, log_dir: str) -> None:
    """hparams.yaml with the relative tokenizer files, and `log_dir` as its explicit_log_dir."""
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    hparams["model"]["tokenizer"] |= RELATIVE_FILES
    hparams["exp_manager"]["explicit_log_dir"] = log_dir
    (run / "hparams.yaml").write_text(yaml.safe_dump(hparams))


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch) -> Path:
    """Another working directory, with no bpe/ in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def generated(run: Path, capsys) -> str:
    argv = ["generate", str(run), "--prompt", "The meaning of", "--max-new-tokens", "4", "--greedy"]
    assert run_cli(argv) == 0
    return capsys.readouterr().out


def evaluated(run: Path, directory: Path) -> dict:
    out = directory / "eval.json"
    assert run_cli(["eval", str(run), "--batches", "1", "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_generate_reads_the_runs_relative_tokenizer_files_from_where_it_was_started(
    project: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(project)
    expected = generated(project / "results" / "run", capsys)
    assert expected.startswith("The meaning of")
    monkeypatch.chdir(tmp_path)
    assert generated(project / "results" / "run", capsys) == expected


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_export_reads_the_runs_relative_tokenizer_files_from_where_it_was_started(
    project: Path, elsewhere: Path
) -> None:
    assert run_cli(["export", str(project / "results" / "run"), "--to", "hf", str(elsewhere / "out")]) == 0
    assert (elsewhere / "out" / "vocab.json").read_bytes() == (project / "bpe" / "vocab.json").read_bytes()
    assert (elsewhere / "out" / "merges.txt").read_bytes() == (project / "bpe" / "merges.txt").read_bytes()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_eval_reads_the_runs_relative_tokenizer_files_from_where_it_was_started(
    project: Path, tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(project)
    expected = evaluated(project / "results" / "run", tmp_path / "a")
    monkeypatch.chdir(tmp_path / "b")
    assert evaluated(project / "results" / "run", tmp_path / "b") == expected
    assert torch.isfinite(torch.tensor(expected["loss"]))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_where_the_start_is_not_recorded_the_line_says_where_to_run_from(
    project: Path, tmp_path: Path, elsewhere: Path
) -> None:
    """An absolute explicit_log_dir does not tell where the run was started (a moved run neither)."""
    run = tmp_path / "copy"
    shutil.copytree(project / "results" / "run", run)
    record(run, str(run))
    for command in (["generate", str(run), "--prompt", "a"], ["export", str(run), "--to", "hf", "out"]):
        with pytest.raises(DataError) as error:
            run_cli(command)
        assert str(error.value) == (
            f"{run / 'hparams.yaml'}: model.tokenizer.vocab_file=bpe/vocab.json not found; "
            "run from the directory the training ran in, or restore the file"
        )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_run_copied_under_the_same_path_ending_reads_its_files_from_where_the_training_ran(
    project: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A run copied to <backup>/results/run seems started at <backup> (its explicit_log_dir is
    results/run), which holds no bpe/: generate, export and eval from the project directory, which
    does, failed with 'not found' (they read from here before the start was known). A file missing
    where the run seems started and present here is read from here, as eval's data prefixes are."""
    copy = tmp_path / "backup" / "results" / "run"
    shutil.copytree(project / "results" / "run", copy)
    monkeypatch.chdir(project)
    tok = open_run(copy).cfg.model.tokenizer
    assert (tok.vocab_file, tok.merge_file) == ("bpe/vocab.json", "bpe/merges.txt")
    assert generated(copy, capsys) == generated(project / "results" / "run", capsys)


def test_a_file_given_as_an_override_is_read_from_here_and_a_missing_one_named(
    project: Path, elsewhere: Path
) -> None:
    run = project / "results" / "run"
    with pytest.raises(DataError) as error:
        open_run(run, ["model.tokenizer.vocab_file=bpe/vocab.json"])
    assert str(error.value) == (
        f"{run / 'hparams.yaml'}: model.tokenizer.vocab_file=bpe/vocab.json not found; "
        "run from the directory the training ran in, or restore the file"
    )
    (elsewhere / "bpe").mkdir()
    shutil.copyfile(project / "bpe" / "vocab.json", elsewhere / "bpe" / "vocab.json")
    opened = open_run(run, ["model.tokenizer.vocab_file=bpe/vocab.json"])
    assert opened.cfg.model.tokenizer.vocab_file == "bpe/vocab.json"  # from here, as given
    assert opened.cfg.model.tokenizer.merge_file == str(project / "bpe" / "merges.txt")
    (project / "bpe" / "merges.txt").rename(project / "merges.kept")
    try:
        with pytest.raises(DataError) as error:
            open_run(run)
    finally:
        (project / "merges.kept").rename(project / "bpe" / "merges.txt")
    assert str(error.value) == (
        f"{run / 'hparams.yaml'}: model.tokenizer.merge_file=bpe/merges.txt not found in the directory the "
        f"run was started in ({project / 'bpe' / 'merges.txt'}); restore the file"
    )


def test_a_tiktoken_encoding_name_is_not_a_path(tmp_path: Path) -> None:
    from gptrain.config import load_training_config
    from gptrain.trained.run_config import tokenizer_files_from_start

    overrides = ["model.tokenizer.type=TikTokenizer", "model.tokenizer.model=cl100k_base"]
    overrides += ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    cfg = load_training_config("gpt3/126m", [*overrides, "exp_manager.explicit_log_dir=results/run"])
    (tmp_path / "results" / "run").mkdir(parents=True)
    assert tokenizer_files_from_start(cfg, tmp_path / "results" / "run" / "hparams.yaml", []) == {}
    assert cfg.model.tokenizer.model == "cl100k_base"


def test_a_run_recorded_before_bias_activation_fusion_keeps_the_gelu_it_trained(tmp_path):
    """An hparams.yaml written before gptrain honoured model.bias_activation_fusion records the GELU
    that ran in openai_gelu alone (false: erf); read today, the absent key's default (the fused tanh
    GELU) would have rebuilt another function for generate, export and eval. Asking for the fused (tanh)
    GELU on purpose is accepted as model.openai_gelu=true is (the checkpoint records erf, as training's do)."""
    fusion_off = ("model.bias=true", "model.bias_activation_fusion=false")
    run, _ = saved_run(tmp_path / "run", "gpt2", *fusion_off, recorded=True)
    hparams = run / "hparams.yaml"
    text = hparams.read_text()
    assert "  bias_activation_fusion: false\n" in text and "  openai_gelu: false\n" in text
    hparams.write_text(text.replace("  bias_activation_fusion: false\n", ""))
    assert open_run(run).cfg.model.openai_gelu is False
    assert open_run(run, ["model.bias_activation_fusion=true"]).cfg.model.openai_gelu is True
    assert open_run(run, ["model.openai_gelu=true"]).cfg.model.openai_gelu is True
    # before 2026-11-23 neither key was written: erf was gptrain's only GELU (review E26)
    hparams.write_text(
        text.replace("  bias_activation_fusion: false\n", "").replace("  openai_gelu: false\n", "")
    )
    assert open_run(run).cfg.model.openai_gelu is False
