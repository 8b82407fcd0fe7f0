"""The vocabulary's fingerprint in the tokenizer record beside prepared data
(gptrain.data.tokenizer_fingerprint): data tokenized with one vocabulary of a type and trained,
evaluated or launched with another of the same type was taken silently; now refused in one line
naming both tokenizers' files, while a copy of the files, the same vocabulary in another format and
a record written before (no fingerprint) are accepted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.data.indexed import IndexedDatasetWriter
from gptrain.data.tokenizer_record import read_tokenizer_record
from gptrain.errors import ConfigError, DataError, LaunchError


def _prepare(tmp_path: Path, name: str, vocab: str, merges: str) -> str:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "Hello world, the data."}) + "\n")
    prefix = tmp_path / name
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(prefix), "--workers", "1"]
    assert main([*argv, "--vocab-file", vocab, "--merge-file", merges, "--append-eod"]) == 0
    return f"{prefix}_text_document"


def _other_vocab(tmp_path: Path, vocab: str) -> str:
    """GPT-2's vocab.json with the ids of 'a' and 'b' swapped: the same type, size and merges file,
    another vocabulary (the merges still load: single bytes have no merge order)."""
    table = json.loads(Path(vocab).read_text(encoding="utf-8"))
    table["a"], table["b"] = table["b"], table["a"]
    other = tmp_path / "other" / "vocab.json"
    other.parent.mkdir()
    other.write_text(json.dumps(table), encoding="utf-8")
    return str(other)


def _copy(tmp_path: Path, *files: str) -> list[str]:
    directory = tmp_path / "copy"
    directory.mkdir()
    return [str(shutil.copy(file, directory / f"copied-{Path(file).name}")) for file in files]


def _cfg(prefix: str, vocab: str, merges: str, *more: str):
    overrides = [
        f"model.data.data_prefix=[1.0,{prefix}]",
        f"model.tokenizer.vocab_file={vocab}",
        f"model.tokenizer.merge_file={merges}",
    ]
    return load_training_config("gpt3/126m", overrides=[*overrides, *more], report_ignored=False)


def _refusal(prefix: str, data_files: list[str], run_files: list[str], where: str, under: str = "") -> str:
    return (
        f"{where}: {prefix} was tokenized with GPT2BPETokenizer {' + '.join(data_files)} ({prefix}.tokenizer), "
        f"{under}model.tokenizer is GPT2BPETokenizer {' + '.join(run_files)}: the same size, other tokens at "
        "the same ids: another vocabulary, so the data's ids would mean other tokens; re-tokenize the data "
        f"with {under}model.tokenizer's files (gptrain data prepare), or point {under}model.tokenizer.vocab_file "
        f"and {under}model.tokenizer.merge_file at the files the data was tokenized with, or "
        f"{under}exp_manager.allow_tokenizer_change=true to go on with this one"
    )


def test_training_under_another_vocabulary_of_the_same_type_is_refused_as_it_starts(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    from gptrain.train.builders import _build_datasets
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    vocab, merges = gpt2_files
    prefix = _prepare(tmp_path, "ds", vocab, merges)
    other = _other_vocab(tmp_path, vocab)
    cfg = _cfg(prefix, other, merges)
    with pytest.raises(ConfigError) as error:
        _build_datasets(cfg, 50257, build_tokenizer(cfg))
    assert str(error.value) == _refusal(prefix, [vocab, merges], [other, merges], "model.data.data_prefix")
    allowed = _cfg(prefix, other, merges, "exp_manager.allow_tokenizer_change=true")
    check_data_tokenizer(allowed, tokenizer=build_tokenizer(allowed))
    assert capsys.readouterr().err.startswith(
        f"gptrain: warning: model.data.data_prefix: {prefix} was tokenized"
    )
    for files in (_copy(tmp_path, vocab, merges), [vocab, merges]):  # the same vocabulary elsewhere
        same = _cfg(prefix, *files)
        check_data_tokenizer(same, tokenizer=build_tokenizer(same))
    assert capsys.readouterr().err == ""


def test_the_same_vocabulary_in_another_format_is_accepted_and_other_merges_refused(
    tmp_path: Path, gpt2_files: tuple[str, str]
) -> None:
    """The fingerprint is of what the ids mean: GPT-2's tokenizer.json (HuggingFaceTokenizer) is the
    vocab.json + merges.txt the data was tokenized with; the same tokens lowercased first are not."""
    from gptrain.data.gpt2_bpe import gpt2_tokenizer_json
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    vocab, merges = gpt2_files
    prefix = _prepare(tmp_path, "ds", vocab, merges)
    tokenizer_json = tmp_path / "tokenizer.json"
    tokenizer_json.write_text(gpt2_tokenizer_json(vocab, merges), encoding="utf-8")
    hf = [
        "model.tokenizer.type=HuggingFaceTokenizer",
        "model.tokenizer.library=huggingface",
        f"model.tokenizer.model={tokenizer_json}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    cfg = load_training_config("gpt3/126m", [f"model.data.data_prefix={prefix}", *hf], report_ignored=False)
    check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
    lowered = json.loads(tokenizer_json.read_text(encoding="utf-8")) | {"normalizer": {"type": "Lowercase"}}
    tokenizer_json.write_text(json.dumps(lowered), encoding="utf-8")  # the same tokens, other ids for text
    with pytest.raises(ConfigError, match="the same tokens, but text is encoded otherwise"):
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))


def test_eval_data_prefix_under_another_vocabulary_is_refused(
    tmp_path: Path, gpt2_files: tuple[str, str]
) -> None:
    from gptrain.train.tokenizer_setup import build_tokenizer
    from gptrain.trained.evaluate import EvalRequest, eval_data

    vocab, merges = gpt2_files
    prepared = _prepare(tmp_path, "ds", vocab, merges)
    prefix = str(tmp_path / "one")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document([7])  # one token: refused after the check, before any model is needed
    shutil.copy(f"{prepared}.tokenizer", f"{prefix}.tokenizer")
    other = _other_vocab(tmp_path, vocab)

    def run(*files: str) -> Exception:
        cfg = _cfg(prefix, *files)
        with pytest.raises((ConfigError, DataError)) as error:
            eval_data(cfg, EvalRequest("run", data_prefix=[prefix]), 50257, build_tokenizer(cfg))
        return error.value

    assert str(run(other, merges)) == _refusal(prefix, [vocab, merges], [other, merges], "--data-prefix")
    assert "holds 1 token(s)" in str(run(*_copy(tmp_path, vocab, merges)))


def test_launch_preflight_refuses_another_vocabulary_from_the_files_alone(
    tmp_path: Path, gpt2_files: tuple[str, str]
) -> None:
    """The preflight reads vocab.json with json alone (no tokenizer library on a login node): another
    vocabulary is said before the queue wait, in the job's words under training; a copy is taken."""
    from gptrain.launch.preflight import check_training_files

    vocab, merges = gpt2_files
    prefix = _prepare(tmp_path, "ds", vocab, merges)
    other = _other_vocab(tmp_path, vocab)
    with pytest.raises(LaunchError) as error:
        check_training_files(_cfg(prefix, other, merges), prepared_by_stage=False)
    expected = _refusal(
        prefix, [vocab, merges], [other, merges], "training.model.data.data_prefix", "training."
    )
    assert str(error.value) == expected
    check_training_files(_cfg(prefix, *_copy(tmp_path, vocab, merges)), prepared_by_stage=False)
    check_training_files(_cfg(prefix, other, merges, "exp_manager.allow_tokenizer_change=true"), False)


def test_a_record_without_a_fingerprint_is_accepted_as_before(
    tmp_path: Path, gpt2_files: tuple[str, str]
) -> None:
    from gptrain.launch.preflight import check_training_files
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    vocab, merges = gpt2_files
    prefix = _prepare(tmp_path, "ds", vocab, merges)
    record = json.loads(Path(f"{prefix}.tokenizer").read_text())
    assert set(record) == {"type", "legacy", "vocabulary", "append_eod"}
    Path(f"{prefix}.tokenizer").write_text(json.dumps({"type": "GPT2BPETokenizer", "legacy": False}))
    cfg = _cfg(prefix, _other_vocab(tmp_path, vocab), merges)
    check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
    check_training_files(cfg, prepared_by_stage=False)


def test_data_merge_of_inputs_tokenized_with_other_vocabularies_is_refused(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    vocab, merges = gpt2_files
    a = _prepare(tmp_path, "a", vocab, merges)
    other = _other_vocab(tmp_path, vocab)
    b = _prepare(tmp_path, "b", other, merges)
    c = _prepare(tmp_path, "c", *_copy(tmp_path, vocab, merges))
    capsys.readouterr()
    assert main(["data", "merge", "--input", a, b, "--output-prefix", str(tmp_path / "mixed")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --input {b} was tokenized with GPT2BPETokenizer {other} + {merges}, {a} with "
        f"GPT2BPETokenizer {vocab} + {merges} (their .tokenizer records): the same size, other tokens at the "
        "same ids: another vocabulary, so the same id "
        "means other tokens in each; re-tokenize one with the other's tokenizer files (gptrain data prepare), "
        "then merge"
    )
    assert not list(tmp_path.glob("mixed*"))
    merged = str(tmp_path / "merged")
    assert main(["data", "merge", "--input", a, c, "--output-prefix", merged]) == 0
    assert read_tokenizer_record(merged) == read_tokenizer_record(a)  # a copy is the same vocabulary
    Path(f"{c}.tokenizer").write_text(json.dumps({"type": "GPT2BPETokenizer", "legacy": False}))  # as before
    assert main(["data", "merge", "--input", b, c, "--output-prefix", merged]) == 0
    assert read_tokenizer_record(merged) == {
        "type": "GPT2BPETokenizer",
        "legacy": False,
    }  # unknown: unchecked


def test_the_preflight_table_is_the_loaded_tokenizers(tmp_path: Path, gpt2_files: tuple[str, str]) -> None:
    """The preflight's table from the files alone must be the one the job computes from the loaded
    tokenizer, or it would refuse what the job takes: GPT-2's vocab.json, its tokenizer.json, and a
    tokenizer.json whose added tokens' ids `tokenizers` does not read, and a Unigram model."""
    from tokenizers import AddedToken, Tokenizer, models

    from gptrain.data.gpt2_bpe import bytes_to_unicode, gpt2_tokenizer_json
    from gptrain.data.tokenizer_fingerprint import _is_byte_level, table_from_files
    from gptrain.data.tokenizer_identity import token_table
    from gptrain.data.tokenizers import build_tokenizer

    assert all(map(_is_byte_level, bytes_to_unicode().values())) and not _is_byte_level("Ā" + chr(256 + 68))
    vocab, merges = gpt2_files
    assert table_from_files("gpt2", vocab, None) == token_table(build_tokenizer("gpt2", vocab, merges))
    gpt2_json = tmp_path / "gpt2.json"
    gpt2_json.write_text(gpt2_tokenizer_json(vocab, merges), encoding="utf-8")
    word = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    word.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    word.add_tokens(["<extra>"])
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁a", -1.0), ("b", -2.0)], unk_id=0))
    unigram.add_special_tokens(["</s>"])
    for name, tokenizer in (("word.json", word), ("unigram.json", unigram)):
        tokenizer.save(str(tmp_path / name))
    data = json.loads((tmp_path / "word.json").read_text(encoding="utf-8"))
    data["added_tokens"][-1]["id"] = 9  # not read: `tokenizers` gives it 4
    data["added_tokens"].append(data["added_tokens"][-1] | {"content": "a", "id": 7})  # a's id stays 1
    data["model"]["vocab"]["b"] = 6  # a gap in the vocabulary: the added ones still start at its length
    (tmp_path / "word.json").write_text(json.dumps(data), encoding="utf-8")
    for name in ("gpt2.json", "word.json", "unigram.json"):
        path = str(tmp_path / name)
        loaded = token_table(build_tokenizer("HuggingFaceTokenizer", model=path))
        assert table_from_files("huggingface", None, path) == loaded, name


def test_the_preflights_vocabulary_check_loads_no_tokenizer_library(
    tmp_path: Path, gpt2_files: tuple[str, str]
) -> None:
    """The launch runs on login nodes, where torch and the tokenizer libraries cost seconds (or are
    not installed): the preflight's check reads the files with json alone."""
    import subprocess
    import sys

    vocab, merges = gpt2_files
    prefix = _prepare(tmp_path, "ds", vocab, merges)
    other = _other_vocab(tmp_path, vocab)
    code = (
        "import sys\n"
        "from gptrain.config import load_training_config\n"
        "from gptrain.launch.preflight import check_training_files\n"
        f"overrides = ['model.data.data_prefix=[1.0,{prefix}]', 'model.tokenizer.vocab_file={other}',"
        f" 'model.tokenizer.merge_file={merges}']\n"
        "cfg = load_training_config('gpt3/126m', overrides=overrides, report_ignored=False)\n"
        "try:\n    check_training_files(cfg, prepared_by_stage=False)\nexcept Exception as error:\n"
        "    print(type(error).__name__)\n"
        "heavy = ('torch', 'numpy', 'tiktoken', 'tokenizers', 'sentencepiece')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["LaunchError", ""]


def test_tokens_a_user_adds_after_the_data_extend_it_and_tokens_removed_do_not(tmp_path: Path) -> None:
    """Tokens added to a tokenizer.json after its data was prepared (a new domain's, a chat template's)
    take the ids after the recorded ones: the data's ids keep their meaning, so the run is accepted;
    data prepared with the added tokens is refused to a run without them (its ids past the end)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    def save(name: str, *added: str) -> str:
        tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True), *added])
        tokenizer.save(str(tmp_path / name))
        return str(tmp_path / name)

    plain, extended = save("plain.json"), save("extended.json", "<|im_start|>", "<|im_end|>")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a b a"}) + "\n")
    prefixes = {}
    for name, model in (("plain", plain), ("extended", extended)):
        argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / name)]
        assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", model]) == 0
        prefixes[name] = str(tmp_path / f"{name}_text_document")

    def check(prefix: str, model: str) -> None:
        hf = ["model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.library=huggingface"]
        files = [
            f"model.tokenizer.model={model}",
            "model.tokenizer.vocab_file=null",
            "model.tokenizer.merge_file=null",
        ]
        cfg = load_training_config(
            "gpt3/126m", [f"model.data.data_prefix={prefix}", *hf, *files], report_ignored=False
        )
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))

    check(prefixes["plain"], extended)
    with pytest.raises(
        ConfigError, match=r"was tokenized with HuggingFaceTokenizer .*: 4 tokens, not 6: another"
    ):
        check(prefixes["extended"], plain)


def test_another_end_of_document_id_than_the_datas_is_refused(tmp_path: Path) -> None:
    """--append-eod wrote the tokenizer's eod after every document, and training masks the loss and
    resets attention at the run tokenizer's eod: the same tokenizer.json with a tokenizer_config.json
    naming another eos_token (edited after the data was prepared) trains on documents never ended."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    tokenizer = Tokenizer(
        models.WordLevel({"<unk>": 0, "</s>": 1, "<|im_end|>": 2, "a": 3}, unk_token="<unk>")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": "</s>"}))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a a"}) + "\n")
    argv = [
        "data",
        "prepare",
        "--input",
        str(source),
        "--output-prefix",
        str(tmp_path / "ds"),
        "--append-eod",
    ]
    assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path)]) == 0
    prefix = str(tmp_path / "ds_text_document")
    config.write_text(json.dumps({"eos_token": "<|im_end|>"}))
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.library=huggingface"]
    files = [
        f"model.tokenizer.model={tmp_path}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    cfg = load_training_config(
        "gpt3/126m", [f"model.data.data_prefix={prefix}", *hf, *files], report_ignored=False
    )
    with pytest.raises(
        ConfigError,
        match=r": end-of-document id 2, not 1: the data's documents end in an id this run does not take as their end",
    ):
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))


def test_a_tokenizer_with_bpe_dropout_is_its_own_data_s(tmp_path: Path, gpt2_files: tuple[str, str]) -> None:
    """A tokenizer.json with BPE dropout splits text at random on every encode, so the fixed text's
    ids differed between data prepare and training: its own data was refused ("encoded otherwise").
    Such a tokenizer's encoding is not compared (its tokens and end-of-document id still are)."""
    from gptrain.data.gpt2_bpe import gpt2_tokenizer_json
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    vocab, merges = gpt2_files
    data = json.loads(gpt2_tokenizer_json(vocab, merges))
    data["model"]["dropout"] = 0.5
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "Hello world"}) + "\n")
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "ds")]
    assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(path)]) == 0
    prefix = str(tmp_path / "ds_text_document")
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.library=huggingface"]
    files = [
        f"model.tokenizer.model={path}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    cfg = load_training_config(
        "gpt3/126m", [f"model.data.data_prefix={prefix}", *hf, *files], report_ignored=False
    )
    for _ in range(3):
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))


def test_data_prepared_with_one_bpe_dropout_tokenizer_merges_and_its_record_does_not_depend_on_chance(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    """With a small dropout, two encodings of the fixed text were mostly alike: the record's `encodes`
    was a digest or None by chance, and `data merge` refused two inputs prepared with the same
    tokenizer.json when one drew None ("another vocabulary"). A tokenizer.json whose model has dropout
    now records None every time, and None on either side is not compared."""
    from gptrain.data.gpt2_bpe import gpt2_tokenizer_json

    vocab, merges = gpt2_files
    data = json.loads(gpt2_tokenizer_json(vocab, merges))
    data["model"]["dropout"] = 1e-6  # the probe's two encodings differ about once in 10**4 tries
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "Hello world"}) + "\n")
    prefixes = []
    for name in ("a", "b"):
        argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / name)]
        assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(path)]) == 0
        prefixes.append(f"{tmp_path / name}_text_document")
        assert read_tokenizer_record(prefixes[-1])["vocabulary"]["encodes"] is None
    record = json.loads(Path(f"{prefixes[1]}.tokenizer").read_text())
    record["vocabulary"]["encodes"] = "0" * 64  # as such a record was written before, by chance
    Path(f"{prefixes[1]}.tokenizer").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["data", "merge", "--input", *prefixes, "--output-prefix", str(tmp_path / "merged")]) == 0, (
        capsys.readouterr().err
    )


def test_a_vocabulary_extending_the_datas_with_another_end_of_document_is_told_so(tmp_path: Path) -> None:
    """Tokens added past the data's keep its ids' meaning; the eod moved to one of them was refused as
    '4 tokens, not 3: another vocabulary, so the data's ids would mean other tokens', which is false:
    the refusal is for the end of document."""
    from gptrain.data.tokenizer_fingerprint import FOR_A_MERGE, difference, digest

    table = ["a", "b", "<|endoftext|>"]
    recorded = {"size": 3, "tokens": digest(table), "encodes": "1" * 64, "eod": 2}
    extended = [*table, "<|im_end|>"]
    live = {"size": 4, "tokens": digest(extended), "encodes": "2" * 64, "eod": 3}
    assert difference(recorded, live, extended) == (
        "end-of-document id 3, not 2: the data's documents end in an id this run does not take as their "
        "end (loss mask, attention reset)"
    )
    assert difference(recorded, live | {"eod": 2}, extended) is None
    assert difference(recorded, live, None, FOR_A_MERGE) == (
        "4 tokens, not 3: another vocabulary, so the same id means other tokens in each"
    )


def test_data_merge_says_what_differs_between_its_inputs(tmp_path: Path, gpt2_files: tuple[str, str], capsys):
    """The refusal always said 'another vocabulary, so the same id means other tokens in each', also
    for inputs with the same tokens encoded otherwise (or ended otherwise): now what differs."""
    from gptrain.data.gpt2_bpe import gpt2_tokenizer_json

    vocab, merges = gpt2_files
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "Hello world"}) + "\n")
    plain = json.loads(gpt2_tokenizer_json(vocab, merges))

    def prepare(name: str, tokenizer: dict) -> str:
        path = tmp_path / name / "tokenizer.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(tokenizer), encoding="utf-8")
        argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / name)]
        assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(path)]) == 0
        return f"{tmp_path / name}_text_document"

    a = prepare("a", plain)
    lowered = prepare("lowered", plain | {"normalizer": {"type": "Lowercase"}})
    capsys.readouterr()
    assert main(["data", "merge", "--input", a, lowered, "--output-prefix", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --input {lowered} was tokenized with HuggingFaceTokenizer {tmp_path}/lowered/tokenizer.json, "
        f"{a} with HuggingFaceTokenizer {tmp_path}/a/tokenizer.json (their .tokenizer records): the same tokens, "
        "but text is encoded otherwise (other merges, pre-tokenizer or normalizer, or a bos put first): the merged "
        "data would hold "
        "text encoded two ways; re-tokenize one with the other's tokenizer files (gptrain data prepare), then merge"
    )
    (tmp_path / "ended").mkdir()
    (tmp_path / "ended" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "!"}))
    ended = prepare("ended", plain)
    assert main(["data", "merge", "--input", a, ended, "--output-prefix", str(tmp_path / "m")]) == 2
    assert (
        "(their .tokenizer records): end-of-document id 0, not 50256: the merged documents would end in "
        in (capsys.readouterr().err)
    )
    assert not list(tmp_path.glob("m*"))


def test_train_start_builds_the_token_table_once(tmp_path: Path, gpt2_files: tuple[str, str]) -> None:
    """The checkpoint's tokenizer record and the data's fingerprint each built the id -> token table
    (three times in all, ~0.25 s each for a 128k vocabulary): now once per tokenizer."""
    from gptrain.data.gpt2_bpe import gpt2_tokenizer_json
    from gptrain.data.tokenizer_wrappers import HFTokenizer
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer, tokenizer_check

    path = tmp_path / "tokenizer.json"
    path.write_text(gpt2_tokenizer_json(*gpt2_files), encoding="utf-8")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "Hello world"}) + "\n")
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "ds")]
    assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(path)]) == 0
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", "model.tokenizer.library=huggingface"]
    files = [
        f"model.tokenizer.model={path}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    cfg = load_training_config(
        "gpt3/126m",
        [f"model.data.data_prefix={tmp_path}/ds_text_document", *hf, *files],
        report_ignored=False,
    )
    tokenizer = build_tokenizer(cfg)
    assert isinstance(tokenizer, HFTokenizer)
    looked_up = []

    class Counting:
        def __init__(self, real):
            self.real = real

        def id_to_token(self, index):
            looked_up.append(index)
            return self.real.id_to_token(index)

        def __getattr__(self, name):
            return getattr(self.real, name)

    tokenizer.tokenizer = Counting(tokenizer.tokenizer)
    tokenizer_check(cfg, tokenizer)
    check_data_tokenizer(cfg, tokenizer=tokenizer)
    assert len(looked_up) == tokenizer.vocab_size == 50257
