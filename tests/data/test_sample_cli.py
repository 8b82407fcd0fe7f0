"""`gptrain data sample`: the JSON it prints, checked against Megatron-LM's own samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gpt_data_helpers import load_fixture, write_dataset

from gptrain.cli import main
from gptrain.data.mock import MockGPTDataset


def _sample(capsys, *argv: str) -> dict:
    assert main(["data", "sample", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_single_prefix_sample_is_megatrons(tmp_path, capsys):
    spec = load_fixture()["separated_final_epoch"]
    prefix = write_dataset(tmp_path / "d0", spec["lengths"][0])
    args = ["--data-prefix", prefix, "--seq-length", "16", "--seed", "1234", "--splits-string", "90,8,2"]
    out = _sample(capsys, *args, "--num-samples", "200,20,5", "--split", "train", "--index", "5")
    expected = spec["splits"]["train"]
    assert out["tokens"] == expected["samples"]["5"] and len(out["tokens"]) == 17
    assert out["num_samples"] == expected["len"] and out["prefix"] == prefix
    assert out["unshuffled_sample"] == expected["shuffle_index"][5]
    first_row = expected["sample_index"][out["unshuffled_sample"]]
    assert out["sequences"][0] == expected["document_index"][first_row[0]]
    assert out["first_sequence_offset"] == first_row[1]
    assert "text" not in out
    out = _sample(capsys, *args, "--num-samples", "200,20,5", "--split", "valid", "--index", "17")
    assert out["tokens"] == spec["splits"]["valid"]["samples"]["17"]


def test_blend_sample_is_megatrons(tmp_path, capsys):
    spec = load_fixture()["blend_30_70"]
    blend = []
    for k, (weight, lengths) in enumerate(zip(spec["weights"], spec["lengths"], strict=True)):
        blend += [str(weight), write_dataset(tmp_path / f"d{k}", lengths)]
    out = _sample(capsys, "--data-prefix", *blend, "--seq-length", "8", "--splits-string", "98,2,0",
                  "--num-samples", "120,10,0", "--index", "17", "--cache-dir", str(tmp_path / "c"))  # fmt: skip
    expected = spec["splits"]["train"]
    assert out["tokens"] == expected["samples"]["17"]
    assert out["blend_dataset"] == expected["dataset_index_head"][17]
    assert out["dataset_sample"] == expected["dataset_sample_index_head"][17]
    assert out["blend_weight"] == [0.3, 0.7][out["blend_dataset"]]
    assert sorted((tmp_path / "c").iterdir())  # the cache went where it was told


def test_documents_are_the_idx_documents_and_sequences_megatrons_ids(tmp_path, capsys):
    """A sample's "documents" were the sequence ids of Megatron's document index: with documents of
    several sentences (or an empty one) they named other documents than `data inspect --document`
    shows. Now "sequences" are those ids and "documents" the .idx documents that hold them."""
    from gptrain.data.indexed import IndexedDatasetWriter

    sentences = [[3, 4], [], [5], [2, 2, 6], [7]]  # sequence lengths per document; document 1 empty
    owner, token = [], 0
    with IndexedDatasetWriter(str(tmp_path / "s"), np.uint16) as writer:
        for document, lengths in enumerate(sentences):
            owner += [document] * len(lengths)
            writer.add_document(np.arange(token, token + sum(lengths)), lengths)
            token += sum(lengths)
    argv = ["--data-prefix", str(tmp_path / "s"), "--seq-length", "4", "--splits-string", "1,0,0"]
    spanned = set()
    for index in range(_sample(capsys, *argv)["num_samples"]):
        out = _sample(capsys, *argv, "--index", str(index))
        assert out["documents"] == [owner[s] for s in out["sequences"]]
        spanned.update(zip(out["sequences"], out["documents"], strict=True))
    assert {s for s, d in spanned if s != d}  # the two numberings differ in this data


def test_text_is_decoded_with_the_tokenizer(tmp_path, capsys, gpt2_files, reference_encode):
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter

    text = "Hello world, this is the sampling command speaking."
    ids = reference_encode(text)
    with IndexedDatasetWriter(str(tmp_path / "t"), np.uint16) as writer:
        writer.add_document(np.array(ids))
    vocab, merges = gpt2_files
    out = _sample(capsys, "--data-prefix", str(tmp_path / "t"), "--seq-length", str(len(ids) - 1),
                  "--splits-string", "1,0,0", "--vocab-file", vocab, "--merge-file", merges)  # fmt: skip
    assert out["tokens"] == ids and out["text"] == text


def test_a_tokenizer_that_lacks_the_ids_says_so(tmp_path, corpus_writer, capsys):
    """A Hugging Face tokenizer decoded the foreign id 5000 as nothing: the sample's text looked
    right (data inspect already said so)."""
    overrides = dict(o.split("=", 1) for o in corpus_writer(tmp_path, [np.array([1, 2, 5000, 3, 4])]))
    prefix, tokenizer = overrides["model.data.data_prefix"], overrides["model.tokenizer.model"]
    argv = ["data", "sample", "--data-prefix", prefix, "--seq-length", "3", "--splits-string", "1,0,0"]
    assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer]) == 2
    err = capsys.readouterr().err
    assert f"{prefix}: sample 0 of the train split holds token id 5000, not in the tokenizer's" in err
    assert "sample it with that one, or without a tokenizer" in err and err.count("\n") == 1


def test_a_negative_id_in_a_sample_is_named_not_dropped(tmp_path, corpus_writer, capsys):
    """A .idx whose dtype code says int16 over uint16 tokens: 65534 reads as -2, and the sample's
    text was printed with it dropped (only the padding after the last document is left out)."""
    overrides = dict(o.split("=", 1) for o in corpus_writer(tmp_path, [np.array([1, 2, 65534, 3, 4])]))
    prefix, tokenizer = overrides["model.data.data_prefix"], overrides["model.tokenizer.model"]
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    assert idx[17] == 8  # uint16, after the 9-byte magic and the u64 version
    idx[17] = 3  # int16
    Path(f"{prefix}.idx").write_bytes(bytes(idx))
    argv = ["data", "sample", "--data-prefix", prefix, "--seq-length", "3", "--splits-string", "1,0,0"]
    assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer]) == 2
    err = capsys.readouterr().err
    assert f"{prefix}: sample 0 of the train split holds token id -2, and no token id is negative" in err
    assert err.count("\n") == 1


def test_only_the_requested_split_is_built(tmp_path, capsys):
    """The default split "969, 30, 1" leaves 4 sequences no valid or test data: train still samples."""
    prefix = write_dataset(tmp_path / "d", [5, 6, 7, 8])
    cache = tmp_path / "c"
    out = _sample(capsys, "--data-prefix", prefix, "--seq-length", "4", "--cache-dir", str(cache))
    assert out["split"] == "train" and out["num_samples"] == (5 + 6 + 7 + 8 - 1) // 4
    assert {p.name.split("-")[2] for p in cache.glob("*-GPTDataset-*")} == {"train"}  # nothing else was built


def test_mock_sample(capsys):
    out = _sample(
        capsys,
        "--mock",
        "--vocab-size",
        "100",
        "--seq-length",
        "8",
        "--num-samples",
        "10,0,0",
        "--index",
        "3",
    )
    assert out["tokens"] == MockGPTDataset(10, 8, 100, seed=1234)[3].tolist() and out["mock"] is True


def test_mock_vocabulary_beside_a_tiktoken_encoding_name_is_the_mocks(capsys, monkeypatch):
    """`--mock --vocab-size 100277 --tokenizer-type TikTokenizer --tokenizer-model cl100k_base` was
    refused ('--vocab-size: read only with Megatron's tiktoken vocabulary file'): the mock's size was
    passed to the encoding as its own. The encoding is loaded as it is (stubbed: no network here)."""
    from types import SimpleNamespace

    from gptrain.data import tokenizers

    loaded = []

    def load_tiktoken(name):
        loaded.append(name)
        return SimpleNamespace(vocab_size=100277, decode=lambda ids: " ".join(map(str, ids)))

    monkeypatch.setattr(tokenizers, "load_tiktoken", load_tiktoken)
    argv = ["--mock", "--vocab-size", "100277", "--seq-length", "8", "--num-samples", "4,0,0"]
    out = _sample(capsys, *argv, "--tokenizer-type", "TikTokenizer", "--tokenizer-model", "cl100k_base")
    assert loaded == ["cl100k_base"]
    assert out["tokens"] == MockGPTDataset(4, 8, 100277, seed=1234)[0].tolist()
    assert out["text"] == " ".join(map(str, out["tokens"]))


def test_num_samples_help_says_what_needs_a_count(capsys):
    """The help gave 0 as one epoch without a word on the mock data and blends that refuse it."""
    with pytest.raises(SystemExit):
        main(["data", "sample", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "mock data and blends need a count" in help_text


def test_errors_are_one_line(tmp_path, capsys):
    prefix = write_dataset(tmp_path / "d", [5, 6, 7, 8])
    # The default split "969, 30, 1" leaves 4 sequences no validation data.
    assert main(["data", "sample", "--data-prefix", prefix, "--seq-length", "4", "--split", "valid"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"{prefix}: the split string '969, 30, 1' gives the valid split 0 of the dataset's 4 sequences" in err
    )
    prefix = write_dataset(tmp_path / "d", [5, 6, 7, 8] * 250)
    assert main(["data", "sample", "--data-prefix", prefix, "--seq-length", "4", "--index", "99999"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--index 99999 out of range" in err
    assert main(["data", "sample", "--data-prefix", prefix, "--seq-length", "4", "--splits-string", "1",
                 "--split", "test"]) == 2  # fmt: skip
    assert "leaves the test split empty" in capsys.readouterr().err
    assert main(["data", "sample", "--data-prefix", "1", prefix, "--seq-length", "4"]) == 2
    assert "need a count" in capsys.readouterr().err
    assert main(["data", "sample", "--seq-length", "4", "--num-samples", "1,2"]) == 2
    assert "--num-samples" in capsys.readouterr().err
    # a bad weight is named by the flag, as train and megatron name theirs (review I)
    blend = ["--data-prefix", "0", prefix, "1", prefix, "--seq-length", "4", "--num-samples", "10,0,0"]
    assert main(["data", "sample", *blend]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "gptrain: error: --data-prefix: data prefix entry 1: weight"
    )


def test_a_sample_length_or_mock_vocabulary_out_of_range_names_its_flag(tmp_path, capsys):
    """Were 'seq_length must be at least 2, got 0' and 'mock data needs length >= 0, seq_length >= 1,
    vocab_size >= 1; got 5, 4, -5': no flag named."""
    prefix = write_dataset(tmp_path / "d", [5, 6, 7, 8] * 10)
    argv = ["data", "sample", "--data-prefix", prefix, "--cache-dir", str(tmp_path / "c")]
    for length in ("1", "0", "-3"):
        assert main([*argv, "--seq-length", length]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == f"gptrain: error: --seq-length {length}: a sample needs at least 2 tokens; give 2 or more\n"
        )
    for vocab in ("0", "-5"):
        assert (
            main(
                [
                    "data",
                    "sample",
                    "--mock",
                    "--vocab-size",
                    vocab,
                    "--seq-length",
                    "4",
                    "--num-samples",
                    "5,0,0",
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert (
            err == f"gptrain: error: --vocab-size {vocab}: the mock tokens' vocabulary needs 1 id or more\n"
        )
    assert _sample(capsys, *argv[2:], "--seq-length", "2", "--splits-string", "1,0,0")["seq_length"] == 2


def test_more_samples_than_this_host_can_index_name_the_flag(tmp_path, capsys):
    """10**15 samples of 8 tokens is past any host's memory (its epochs' document order alone takes
    1.42 PiB) yet under what the indices can address: it was "out of memory (...): ask for less",
    which named no flag."""
    prefix = write_dataset(tmp_path / "d", list(range(1, 41)))
    huge = "1000000000000000"
    args = [
        "data",
        "sample",
        "--data-prefix",
        prefix,
        "--seq-length",
        "8",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main([*args, "--num-samples", f"{huge},0,0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "gptrain: error: --num-samples: out of memory building the sample indices of the train split, "
        "1,000,000,000,000,000 samples of 8 tokens (Unable to allocate "
    )
    assert err.endswith("); ask for fewer\n")
    # the split built is the one named, not a larger one left unbuilt
    assert (
        main([*args, "--num-samples", f"0,{huge},1{huge}", "--split", "valid", "--splits-string", "1,1,1"])
        == 2
    )
    assert "sample indices of the valid split, 1,000,000,000,000,000 samples" in capsys.readouterr().err


def test_seed_outside_randomstate_range_is_refused(tmp_path, capsys):
    """numpy's RandomState (Megatron's shuffle) takes 0 to 2**32 - 1: refused, not taken modulo."""
    prefix = write_dataset(tmp_path / "d", [5, 6, 7, 8] * 10)
    argv = ["data", "sample", "--data-prefix", prefix, "--seq-length", "4", "--splits-string", "1,0,0"]
    for seed in ("4294967296", "-1"):
        assert main([*argv, "--seed", seed]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--seed {seed} is outside 0 to 4294967295" in err
    assert main([*argv, "--mock", "--vocab-size", "50", "--num-samples", "4,0,0", "--seed", "-1"]) == 2
    assert "--seed -1 is outside" in capsys.readouterr().err
    assert _sample(capsys, *argv[2:], "--seed", "4294967295")["split"] == "train"


def test_wrong_pointer_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """A pointer to another sequence's tokens would silently mix documents: the whole .idx is
    verified when indices are built, and by `data sample` also when they come from the cache."""
    from gptrain.data import index_cache

    prefix = write_dataset(tmp_path / "d", [5, 6, 7, 8])
    argv = ["data", "sample", "--data-prefix", prefix, "--seq-length", "4", "--splits-string", "1,0,0"]
    cached = [*argv, "--cache-dir", str(tmp_path / "c")]
    assert main(cached) == 0
    capsys.readouterr()
    digest = index_cache.hash_file(prefix + ".idx")
    with open(prefix + ".idx", "r+b") as handle:
        handle.seek(34 + 4 * 4 + 8 * 2)  # pointer of sequence 2: byte 22 -> 10 (sequence 1)
        handle.write(np.int64(10).tobytes())
    monkeypatch.setattr(index_cache, "hash_file", lambda path: digest)  # the cache still matches
    for command in (argv, cached):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "d.idx: sequence 2 starts at byte 10, expected 22" in err


def test_parser_module_is_light():
    code = "import sys, gptrain.data.sample_cli; bad = {'numpy', 'torch'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_tokenizer_of_another_vocabulary_than_the_datas_is_warned(tmp_path, capsys, gpt2_files):
    """`data sample` decoded the data with whatever tokenizer it was given: another vocab.json than
    the data's printed other words, silently, from a command used to see what training sees. The
    data's tokenizer record now tells: a warning naming both tokenizers' files; the text is kept."""
    import shutil

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": " a b a b a b a b a b"}) + "\n")
    vocab, merges = gpt2_files
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "ds")]
    assert main([*argv, "--vocab-file", vocab, "--merge-file", merges]) == 0
    table = json.loads(Path(vocab).read_text(encoding="utf-8"))
    table["Ġa"], table["Ġb"] = table["Ġb"], table["Ġa"]
    other = tmp_path / "vocab.json"
    other.write_text(json.dumps(table), encoding="utf-8")
    prefix = str(tmp_path / "ds_text_document")
    flags = ["data", "sample", "--data-prefix", prefix, "--seq-length", "4", "--splits-string", "1,0,0"]
    flags += ["--merge-file", merges]
    capsys.readouterr()
    copy = str(shutil.copy(vocab, tmp_path / "copied.json"))
    assert main([*flags, "--vocab-file", copy]) == 0
    out, err = capsys.readouterr()
    text = json.loads(out)["text"]
    assert text in " a b a b a b a b a b" and err == ""
    assert main([*flags, "--vocab-file", str(other)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["text"] == text.translate(str.maketrans("ab", "ba"))
    assert err.strip() == (
        f"gptrain: warning: --data-prefix: {prefix} was tokenized with GPT2BPETokenizer {vocab} + {merges} "
        f"({prefix}.tokenizer), the tokenizer given is GPT2BPETokenizer {other} + {merges}: the same size, other "
        "tokens at the same ids: another vocabulary, so the data's ids would mean other tokens; the text is "
        "decoded with the tokenizer given: give the files the data was tokenized with to see its text"
    )
