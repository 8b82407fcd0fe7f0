"""The launch preflight names the tokenizer key the user set: under NeMo's library huggingface the
tokenizer's path is in `type` (validation moves it to `model`), as gptrain train names it."""

import pytest

from gptrain.config.loader import load_training_config
from gptrain.errors import LaunchError
from gptrain.launch.preflight import check_training_files

HF_PATH = "training.model.tokenizer.type (library huggingface's tokenizer path)"


def huggingface_config(path: str):
    given = [
        "model.data.data_prefix=[1.0,a]",
        "model.tokenizer.library=huggingface",
        f"model.tokenizer.type={path}",
    ]
    return load_training_config("gpt3/126m", given, report_ignored=False)


def test_a_missing_huggingface_tokenizer_given_in_type_names_type(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LaunchError) as error:
        check_training_files(huggingface_config("data/nothere"), prepared_by_stage=True)
    assert str(error.value).startswith(f"{HF_PATH}: data/nothere is not a local file or directory; ")


def test_a_present_huggingface_tokenizer_given_in_type_is_said_present_as_type(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    lines = check_training_files(huggingface_config(str(tmp_path / "tok")), prepared_by_stage=True)
    assert "ok  training.model.tokenizer: type present" in lines, lines
