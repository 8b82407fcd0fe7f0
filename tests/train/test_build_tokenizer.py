"""The training job names the config key of a missing tokenizer file, not a data-CLI flag."""

import pytest

from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.train.builders import build_tokenizer

MOCK = ["model.data.data_impl=mock", "model.data.data_prefix=[]"]


def training(*overrides):
    return load_training_config("gpt3/126m", overrides=[*MOCK, *overrides], report_ignored=False)


def test_mock_data_without_mock_vocab_size_names_the_missing_file_by_its_key(tmp_path):
    files = [
        f"model.tokenizer.vocab_file={tmp_path}/vocab.json",
        f"model.tokenizer.merge_file={tmp_path}/m.txt",
    ]
    with pytest.raises(ConfigError) as error:
        build_tokenizer(training(*files))
    message = str(error.value)
    assert message.startswith(f"model.tokenizer.vocab_file: {tmp_path}/vocab.json not found")
    assert "--vocab-file" not in message and "model.data.mock_vocab_size" in message
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"^model.tokenizer.merge_file: {tmp_path}/m.txt not found"):
        build_tokenizer(training(*files))
    assert build_tokenizer(training(*files, "model.data.mock_vocab_size=64")) is None  # no files read


def test_a_missing_huggingface_tokenizer_is_named_by_its_key(tmp_path):
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={tmp_path}/tokenizer.json"]
    with pytest.raises(ConfigError, match=r"^model.tokenizer.model: .*/tokenizer.json not found"):
        build_tokenizer(training(*hf))
