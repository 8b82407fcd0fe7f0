"""A tokenizer.json is read as Megatron reads it (transformers' `tokenizer(text).input_ids`): the
truncation and padding a file may carry are switched off, as transformers does for a call that asks
for neither; the tokenizers library alone applies them on every encode."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from gptrain.data.gpt2_bpe import load_gpt2_bpe
from gptrain.data.tokenizers import build_tokenizer

TEXT = "A document much longer than eight tokens, so that a saved max_length would cut it short. " * 3


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(lambda t: t.enable_truncation(max_length=8), id="truncation"),
        pytest.param(lambda t: t.enable_padding(length=256, pad_id=0, pad_token="!"), id="padding"),
    ],
)
def test_a_tokenizer_json_s_truncation_and_padding_do_not_reach_the_ids(gpt2_files, gpt2, tmp_path, setting):
    """Saved with max_length 8, every document was cut to 8 tokens (with padding, pad ids were
    written as data), without a word; the ids are now the tiktoken GPT-2 reference's."""
    saved = Tokenizer.from_str(load_gpt2_bpe(*gpt2_files, backend="hf").tokenizer.to_str())
    setting(saved)
    saved.save(str(tmp_path / "tokenizer.json"))
    tokenizer = build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path / "tokenizer.json"))
    expected = gpt2.encode(TEXT)
    assert 8 < len(expected) < 256
    assert tokenizer.encode(TEXT) == expected
    assert tokenizer.encode_batch([TEXT, "short"]) == [expected, gpt2.encode("short")]


def _byte_level_dir(directory, add_prefix_space, config, bos_template=False):
    """A small ByteLevel BPE tokenizer.json (its pre-tokenizer's add_prefix_space as given, a
    template putting <s> first if asked) with a tokenizer_config.json holding `config`."""
    import json

    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["it's a test of the thing it's hello world"] * 20, trainer)
    if bos_template:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", **config}))
    return str(directory)


@pytest.mark.parametrize(
    ("file_prefix_space", "config", "bos_template"),
    [
        pytest.param(True, {"tokenizer_class": "GPT2Tokenizer"}, False, id="gpt2-class-default-false"),
        pytest.param(
            False, {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True}, True, id="gpt2-config-true"
        ),
        pytest.param(
            False, {"tokenizer_class": "GPT2TokenizerFast", "add_prefix_space": True}, False, id="gpt2-fast"
        ),
        pytest.param(True, {"tokenizer_class": "GPTNeoXTokenizer"}, False, id="neox-class-default-false"),
        pytest.param(
            False,
            {"tokenizer_class": "GPTNeoXTokenizer", "add_prefix_space": True},
            True,
            id="neox-drops-bos",
        ),
        # controls: PreTrainedTokenizerFast (or no class) keeps the tokenizer.json's setting and template
        pytest.param(
            False, {"tokenizer_class": "PreTrainedTokenizerFast", "add_prefix_space": True}, True, id="fast"
        ),
        pytest.param(True, {"add_prefix_space": False}, False, id="no-class"),
    ],
)
def test_tokenizer_config_s_add_prefix_space_and_class_rules_reach_the_ids(
    tmp_path, file_prefix_space, config, bos_template
):
    """A tokenizer_config.json naming GPT2Tokenizer or GPTNeoXTokenizer had its add_prefix_space
    (false when absent) and NeoX's bos rule ignored: the first token of every document differed
    from transformers' (Megatron's HuggingFaceTokenizer); now the ids are AutoTokenizer's."""
    transformers = pytest.importorskip("transformers")
    directory = _byte_level_dir(tmp_path / "tok", file_prefix_space, config, bos_template)
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer = build_tokenizer("HuggingFaceTokenizer", model=directory)
    for text in ("it's a test", "hello world", " it's"):
        assert tokenizer.encode(text) == reference(text).input_ids, text


def test_neox_s_add_bos_token_which_transformers_4_honours_is_noted(tmp_path):
    """GPTNeoXTokenizer with add_bos_token true: transformers 5 adds no bos (gptrain follows it),
    4 adds one; prepare said nothing. Now one line names the file, the key and the difference."""
    from gptrain.data.tokenizer_loaders import class_setting_note

    transformers = pytest.importorskip("transformers")
    config = {"tokenizer_class": "GPTNeoXTokenizer", "add_bos_token": True, "bos_token": "<s>"}
    directory = _byte_level_dir(tmp_path / "neox", False, config, bos_template=True)
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert (
        build_tokenizer("HuggingFaceTokenizer", model=directory).encode("it's") == reference("it's").input_ids
    )
    note = class_setting_note(directory)
    assert note is not None and "\n" not in note
    assert str(tmp_path / "neox" / "tokenizer_config.json") in note and "add_bos_token" in note
    assert "transformers 4" in note
    gpt2 = _byte_level_dir(tmp_path / "gpt2", False, {**config, "tokenizer_class": "GPT2Tokenizer"})
    assert class_setting_note(gpt2) is None


def test_data_prepare_writes_transformers_ids_and_prints_the_note(tmp_path, capsys):
    """`gptrain data prepare` with a GPTNeoXTokenizer directory wrote the template's bos and the
    file's add_prefix_space without a word; now transformers 5's ids, and the note on stderr."""
    import json

    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDataset

    transformers = pytest.importorskip("transformers")
    config = {"tokenizer_class": "GPTNeoXTokenizer", "add_bos_token": True, "add_prefix_space": True}
    directory = _byte_level_dir(tmp_path / "neox", False, {**config, "bos_token": "<s>"}, bos_template=True)
    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "it's a test"}) + "\n")
    prefix = tmp_path / "out" / "ds"
    flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", directory, "--workers", "1"]
    assert main(["data", "prepare", "--input", str(source), "--output-prefix", str(prefix), *flags]) == 0
    assert "add_bos_token true with tokenizer_class GPTNeoXTokenizer" in capsys.readouterr().err
    written = IndexedDataset(str(prefix) + "_text_document")[0].tolist()
    assert written == transformers.AutoTokenizer.from_pretrained(directory)("it's a test").input_ids


@pytest.mark.parametrize(
    ("model_config", "tokenizer_config"),
    [
        pytest.param({"model_type": "gpt2"}, {}, id="gpt2"),
        pytest.param({"model_type": "gpt_neo"}, {}, id="gpt_neo"),
        pytest.param({"model_type": "gptj"}, {}, id="gptj"),
        pytest.param({"model_type": "gpt_neox"}, {}, id="gpt_neox"),
        # model types transformers maps to the same two classes (OPT's Hub files name no class)
        pytest.param({"model_type": "opt"}, {}, id="opt"),
        pytest.param({"model_type": "starcoder2"}, {}, id="starcoder2"),
        pytest.param({"model_type": "mpt"}, {}, id="mpt"),
        pytest.param({"model_type": "olmo"}, {}, id="olmo"),
        pytest.param(
            {"model_type": "gpt2", "tokenizer_class": "GPTNeoXTokenizerFast"}, {}, id="config-class"
        ),
        pytest.param(
            {"model_type": "llama", "tokenizer_class": "GPT2TokenizerFast"}, {}, id="llama-gpt2-class"
        ),
        # control: tokenizer_config.json's class comes first (the tokenizer.json as it is)
        pytest.param(
            {"model_type": "gpt2"},
            {"tokenizer_class": "PreTrainedTokenizerFast"},
            id="tokenizer-config-first",
        ),
    ],
)
def test_a_class_named_only_in_config_json_is_the_class_autotokenizer_builds(
    tmp_path, model_config, tokenizer_config
):
    """The Hub's gpt2 layout: tokenizer_config.json names no class, config.json its model_type.
    AutoTokenizer then builds config.json's tokenizer_class, else its model type's tokenizer class,
    with that class's rules (add_prefix_space false when absent, NeoX's bos dropped); gptrain read
    the class from tokenizer_config.json alone, and the first id of every document differed."""
    import json

    transformers = pytest.importorskip("transformers")
    directory = _byte_level_dir(tmp_path / "tok", True, tokenizer_config, bos_template=True)
    (tmp_path / "tok" / "config.json").write_text(json.dumps(model_config))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer = build_tokenizer("HuggingFaceTokenizer", model=directory)
    for text in ("it's a test", "hello world", " it's"):
        assert tokenizer.encode(text) == reference(text).input_ids, text


def test_the_model_type_table_is_transformers_5_24s_for_the_two_classes():
    """config.json's model_type maps to AutoTokenizer's class (4 of the 23 types transformers 5.24
    maps to GPT2Tokenizer/GPTNeoXTokenizer were known): MODEL_TYPE_CLASSES is 5.24's mapping for the
    two classes gptrain has rules for, checked against the installed transformers where it is 5.24."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    from gptrain.data.tokenizer_loaders import BYTE_LEVEL_CLASSES, MODEL_TYPE_CLASSES

    if transformers.__version__ != "5.24.0":
        pytest.skip(f"the table is 5.24's; transformers {transformers.__version__} is installed")
    installed = {
        model_type: name for model_type, name in TOKENIZER_MAPPING_NAMES.items() if name in BYTE_LEVEL_CLASSES
    }
    assert installed == MODEL_TYPE_CLASSES and len(installed) == 23


def test_reading_a_directory_whose_class_config_json_names_imports_neither_transformers_nor_torch(tmp_path):
    """Looking the model type up in the installed transformers imported it, and torch with it, in
    every data-prepare worker reading such a directory (15 s and +220 MB each, measured on an OPT-like
    one): the table alone is read."""
    import json
    import subprocess
    import sys

    directory = _byte_level_dir(tmp_path / "tok", True, {}, bos_template=True)
    (tmp_path / "tok" / "config.json").write_text(json.dumps({"model_type": "opt"}))
    code = (
        "import sys; from gptrain.data.tokenizers import build_tokenizer;"
        f" build_tokenizer('HuggingFaceTokenizer', model={directory!r}).encode('hello world');"
        " print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"


def test_data_read_before_the_class_fallback_is_refused_saying_gptrains_reading_changed(
    tmp_path, monkeypatch
):
    """Data prepared from an OPT-like directory (config.json's model_type alone names the class) before
    gptrain read that class is refused now, rightly; but the advice was to point the run at "the files
    the data was tokenized with", which are these same files. It says gptrain's reading of them changed,
    and how to keep the earlier one; that way, named in tokenizer_config.json, the data is taken."""
    import json

    from gptrain.data import tokenizer_loaders
    from gptrain.data.tokenizer_fingerprint import fingerprint, vocabulary_conflict
    from gptrain.data.tokenizer_record import write_tokenizer_record

    directory = _byte_level_dir(tmp_path / "tok", True, {}, bos_template=True)
    (tmp_path / "tok" / "config.json").write_text(json.dumps({"model_type": "opt"}))
    files = [f"{directory}/tokenizer.json"]
    with monkeypatch.context() as before:  # gptrain's reading before: no class from config.json
        before.setattr(tokenizer_loaders, "MODEL_TYPE_CLASSES", {})
        recorded, _ = fingerprint(build_tokenizer("HuggingFaceTokenizer", model=directory), files)
    prefix = str(tmp_path / "data_text_document")
    write_tokenizer_record(prefix, "HuggingFaceTokenizer", False, vocabulary=recorded)

    def live():
        entry, table = fingerprint(build_tokenizer("HuggingFaceTokenizer", model=directory), files)
        return entry | {"type": "HuggingFaceTokenizer"}, table

    allow = "exp_manager.allow_tokenizer_change=true"
    args = ("model.tokenizer", "model.tokenizer.model", "model.data.data_prefix", allow)
    why, advice = vocabulary_conflict([prefix], live, *args)
    assert "the same tokens, but text is encoded otherwise" in why
    assert advice.startswith(
        "the data names these same files, read as the same type: where they are unchanged"
    )
    assert "gptrain's reading of them changed" in advice and "point model.tokenizer" not in advice
    assert advice.endswith(
        'naming its class in tokenizer_config.json ("tokenizer_class": "PreTrainedTokenizerFast"), which'
        f" transformers too then reads as it is, or {allow} to go on with this one"
    )
    config = tmp_path / "tok" / "tokenizer_config.json"  # the way it names keeps the earlier ids
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    assert vocabulary_conflict([prefix], live, *args) is None
    other = _byte_level_dir(tmp_path / "other", True, {"tokenizer_class": "GPT2Tokenizer"}, bos_template=True)
    files[0] = f"{other}/tokenizer.json"  # other files, encoded otherwise: pointing at the data's still fits
    directory = other
    assert "point model.tokenizer.model at the files" in vocabulary_conflict([prefix], live, *args)[1]
