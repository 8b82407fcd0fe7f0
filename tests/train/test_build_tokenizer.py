"""The training job names the config key of a missing tokenizer file, not a data-CLI flag."""

import os

import pytest

from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.train.tokenizer_setup import build_tokenizer

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


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.model={d}"],
         "model.tokenizer.model: {d} is a directory with no tokenizer.json in it"),
        (["model.tokenizer.vocab_file={d}", "model.tokenizer.merge_file={d}"],
         "model.tokenizer.vocab_file: {d} is a directory, not a file"),
        (["model.tokenizer.type=GPTSentencePieceTokenizer", "model.tokenizer.model={d}"],
         "model.tokenizer.model: {d} is a directory, not a file"),
    ],
)  # fmt: skip
def test_a_directory_given_for_a_tokenizer_file_is_named_by_its_key(tmp_path, overrides, said):
    """A directory passed the existence check, and the loader then said "tokenizer model DIR not
    found (pass --tokenizer-model ...)": a path that is there, and a flag training does not have."""
    with pytest.raises(ConfigError) as error:
        build_tokenizer(training(*(o.format(d=tmp_path) for o in overrides)))
    assert str(error.value).startswith(said.format(d=tmp_path) + " (model.tokenizer.type=")
    assert "--" not in str(error.value)


def _tokenizer_without_end_token(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(
        models.WordLevel({f"w{i}": i for i in range(32)} | {"<unk>": 32}, unk_token="<unk>")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    return str(directory / "tokenizer.json")


def test_a_tokenizer_without_an_end_token_trains_unless_eod_mask_loss_needs_one(tmp_path):
    """An imported tokenizer.json without an end token: generate and export took it, while training
    (even on mock data) stopped with "no end-of-document token found"; only eod_mask_loss reads it."""
    from gptrain.errors import DataError
    from gptrain.train.builders import _build_datasets

    hf = [
        "model.tokenizer.type=huggingface",
        f"model.tokenizer.model={_tokenizer_without_end_token(tmp_path)}",
    ]
    small = ["model.micro_batch_size=1", "model.global_batch_size=1", "trainer.max_steps=2", "model.data.seq_length=8",
             "model.encoder_seq_length=8", "model.max_position_embeddings=8", "trainer.limit_val_batches=0",
             "trainer.limit_test_batches=0"]  # fmt: skip
    cfg = training(*hf, *small)
    tokenizer = build_tokenizer(cfg)
    train, _, _ = _build_datasets(cfg, tokenizer.vocab_size, tokenizer)
    assert train[0]["tokens"].shape == (8,) and bool(train[0]["loss_mask"].all())
    masked = training(*hf, *small, "model.data.eod_mask_loss=true")
    with pytest.raises(
        DataError, match=r"^model.data.eod_mask_loss needs an end-of-document token: .+tokenizer"
    ):
        _build_datasets(masked, tokenizer.vocab_size, tokenizer)


HUB = "gptrain does not download tokenizers from the Hugging Face hub: if '{n}' is a hub name, download it (huggingface-cli download {n} --local-dir DIR) and {how}"  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "key", "how"),
    [
        (["model.tokenizer.library=huggingface", "model.tokenizer.type={n}"],
         "model.tokenizer.type (library huggingface's tokenizer path)", "pass the local directory DIR"),
        (["model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.model={n}"],
         "model.tokenizer.model", "pass the local directory DIR"),
        (["model.tokenizer.type=Llama2Tokenizer", "model.tokenizer.model={n}"],
         "model.tokenizer.model", "pass DIR/tokenizer.model"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("name", ["gpt2-medium", "meta-llama/Llama-2-7b-hf"])
def test_a_hub_name_says_gptrain_does_not_download(tmp_path, monkeypatch, overrides, key, how, name):
    """NeMo's AutoTokenizer downloads a hub name; gptrain said only "gpt2-medium not found ... point
    it at the file" (under model.tokenizer.model, a key the user of library huggingface never set)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        build_tokenizer(training(*(o.format(n=name) for o in overrides)))
    hub = HUB.format(n=name, how=how)
    assert str(error.value) == f"{key}: {name} is not a local file or directory; {hub}"


@pytest.mark.parametrize("kind", ["HuggingFaceTokenizer", "Llama2Tokenizer"])
def test_a_tokenizer_model_left_null_is_not_set_not_the_hub_name_none(tmp_path, monkeypatch, kind):
    """model.tokenizer.model: null (the presets' value) under a type that reads it was told 'None is not
    a local file or directory; ... huggingface-cli download None': the text of None read as a hub
    name; an empty value said 'not set'. Both say 'not set' now."""
    from gptrain.utils.tokenizer_types import hub_name_advice

    monkeypatch.chdir(tmp_path)
    said = (
        f"model.tokenizer.model: not set (model.tokenizer.type={kind}); point it at the file,"
        " or for mock data without tokenizer files set model.data.mock_vocab_size"
    )
    for unset in ("null", ""):
        with pytest.raises(ConfigError) as error:
            build_tokenizer(training(f"model.tokenizer.type={kind}", f"model.tokenizer.model={unset}"))
        assert str(error.value) == said
    assert hub_name_advice(None) is None and hub_name_advice("None") is not None  # a hub name may read so


def test_a_path_that_cannot_be_looked_up_is_not_called_a_hub_name(tmp_path, monkeypatch, capsys):
    """The hub advice came wherever os.path.exists was False, so a local path the file system
    refuses (a link loop; a directory under an unsearchable parent) was called a hub name to
    download: it now says why the path cannot be looked up, and the advice is for missing paths."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    os.symlink("gpt2-medium", "gpt2-medium")  # ELOOP, as EACCES cannot be had as root
    with pytest.raises(ConfigError) as error:
        build_tokenizer(
            training("model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.model=gpt2-medium")
        )
    assert str(error.value).startswith("model.tokenizer.model: gpt2-medium")
    assert "cannot be looked up" in str(error.value) and "hub" not in str(error.value)
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "gpt2-medium"]
    assert main(["data", "prepare", "--input", "in.jsonl", "--output-prefix", "out", *flags]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "gpt2-medium cannot be looked up" in err and "hub" not in err


def test_a_hub_name_as_a_megatron_type_says_gptrain_does_not_download():
    """library megatron hands an unknown type to AutoTokenizer in NeMo (a download)."""
    with pytest.raises(ConfigError) as error:
        training("model.tokenizer.type=gpt2-medium")
    how = "pass model.tokenizer.library=huggingface model.tokenizer.type=DIR"
    assert str(error.value).startswith("model.tokenizer.type: 'gpt2-medium' is not one of GPT2BPETokenizer, ")
    assert str(error.value).endswith(f"; {HUB.format(n='gpt2-medium', how=how)}")


@pytest.mark.parametrize(
    "spelling", ["GPT2BPETokenizer", "gpt2", "gpt2-bpe", "HuggingFaceTokenizer", "llama2"]
)
def test_the_built_in_type_names_stay_types(spelling):
    from gptrain.utils.tokenizer_types import megatron_tokenizer_type

    assert training(f"model.tokenizer.type={spelling}").model.tokenizer.type == megatron_tokenizer_type(
        spelling
    )


@pytest.mark.parametrize(
    ("tokenizer_class", "refused"),
    [("GPT2Tokenizer", None), ("PreTrainedTokenizerFast", None), ("LlamaTokenizerFast", None),
     ("LlamaTokenizer", "LlamaTokenizer"),
     (None, "the model type's slow tokenizer ({d}/tokenizer_config.json names no tokenizer_class)")],
)  # fmt: skip
def test_use_fast_false_on_a_tokenizer_json_follows_its_slow_class(tmp_path, tokenizer_class, refused):
    """`use_fast: false` was an ignored key: a Llama tokenizer trained on tokenizer.json's ids where
    NeMo (transformers 4) encoded with the slow LlamaTokenizer; GPT-2's slow class gives the same ids,
    and a class named ...Fast is loaded as named (transformers 4's AutoTokenizer), so it was refused
    wrongly (LlamaTokenizerFast)."""
    import json

    from gptrain.data.gpt2_bpe import bytes_to_unicode, gpt2_tokenizer_json

    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())} | {
        "he": 256,
        "<|endoftext|>": 257,
    }
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\nh e\n")
    (tmp_path / "tokenizer.json").write_text(
        gpt2_tokenizer_json(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    )
    config = {"eos_token": "<|endoftext|>"} | (
        {"tokenizer_class": tokenizer_class} if tokenizer_class else {}
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf = [
        "model.tokenizer.library=huggingface",
        f"model.tokenizer.type={tmp_path}",
        "model.tokenizer.use_fast=false",
    ]
    if refused is None:
        assert build_tokenizer(training(*hf)).encode("hehe") == [256, 256]
        return
    with pytest.raises(ConfigError) as error:
        build_tokenizer(training(*hf))
    assert str(error.value) == (
        f"model.tokenizer.use_fast: false asks for transformers' slow {refused.format(d=tmp_path)} (as NeMo builds "
        f"it on transformers 4; 5 ignores use_fast), whose ids may differ from those of {tmp_path}'s "
        "tokenizer.json that gptrain encodes with: set model.tokenizer.use_fast=true for those ids"
    )
    assert build_tokenizer(training(*hf[:2], "model.tokenizer.use_fast=true")).encode("hehe") == [256, 256]
