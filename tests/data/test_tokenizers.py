"""Tokenizers: the tiktoken fast path gives exactly the ids of the pure-Python GPT-2 BPE and of HF."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gptrain.data.gpt2_bpe import bytes_to_unicode, gpt2_tokenizer_json, load_gpt2_bpe
from gptrain.data.tokenizer_wrappers import HFTokenizer, TiktokenTokenizer
from gptrain.data.tokenizers import build_tokenizer, canonical_type
from gptrain.errors import ConfigError, DataError

TRICKY = [
    "Hello world",
    "It's, don't, we'll, they're, I'd, you've, I'm -- contractions; 'quoted' and O'Neil's",
    "Numbers 0 12 345 6789 3.14159 1,000,000 -42 2nd 1e-5 0x1F",
    "Whitespace:  two   three    four\t\ttabs\n\nnewlines \n \r\n trailing   ",
    "   leading spaces",
    "Ünïcödé façade naïve — “quotes” € £ ¥ 日本語のテキスト 中文 한국어 العربية עברית",
    "Emoji 🤖🚀👩‍👩‍👧 and combining e\u0301 and zero\u200bwidth",
    "code: def f(x):\n    return x**2  # comment\n\tif a != b: pass",
    "a<|endoftext|>b <|endoftext|> c<|endoftext|>",
    "",
    " ",
    "\n",
]


def test_known_ids(gpt2):
    assert isinstance(gpt2, TiktokenTokenizer)
    assert gpt2.encode("hello world") == [31373, 995]
    assert gpt2.encode("<|endoftext|>") == [50256]
    assert gpt2.vocab_size == 50257 and gpt2.eod == 50256
    assert gpt2.decode(np.array([31373, 995, 50256], dtype=np.uint16)) == "hello world<|endoftext|>"
    with pytest.raises(DataError, match="token id 60000 is not in this tokenizer's vocabulary"):
        gpt2.decode([1, 60000])


@pytest.fixture(scope="module")
def hf_gpt2(gpt2_files):
    """The same vocab on HF tokenizers, as transformers' GPT2TokenizerFast builds it."""
    tokenizer = load_gpt2_bpe(*gpt2_files, backend="hf")
    assert isinstance(tokenizer, HFTokenizer)
    return tokenizer


@pytest.mark.parametrize("index", range(len(TRICKY)))
def test_tricky_text_matches_references(gpt2, hf_gpt2, reference_encode, index):
    text = TRICKY[index]
    hf = hf_gpt2
    expected = reference_encode(text)
    assert gpt2.encode(text) == expected
    assert hf.encode(text) == expected
    assert gpt2.decode(expected) == text


def test_real_text_matches_references(gpt2, reference_encode, real_texts):
    assert sum(len(t) for t in real_texts) > 5000
    expected = [reference_encode(t) for t in real_texts]
    assert gpt2.encode_batch(real_texts) == expected
    tokens, lengths = gpt2.encode_flat(real_texts)
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]


def test_aliases_and_errors(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    assert build_tokenizer("gpt2-bpe", vocab, merges).encode("hi") == [5303]
    assert {canonical_type(n) for n in ("GPT2BPETokenizer", "gpt2bpe", "GPT2")} == {"gpt2"}
    assert {canonical_type(n) for n in ("HuggingFaceTokenizer", "huggingface", "hf")} == {"huggingface"}
    assert {canonical_type(n) for n in ("TikTokenizer", "tiktoken")} == {"tiktoken"}
    with pytest.raises(ConfigError, match="unknown --tokenizer-type 'bert'"):
        build_tokenizer("bert", vocab, merges)
    with pytest.raises(ConfigError, match="--vocab-file"):
        build_tokenizer("GPT2BPETokenizer")
    with pytest.raises(DataError, match="vocab file .*missing.json not found"):
        build_tokenizer("GPT2BPETokenizer", str(tmp_path / "missing.json"), merges)
    bad_merges = tmp_path / "merges.txt"
    bad_merges.write_text("#version: 0.2\nĠ t\nq zz\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"merges.txt:3: 'qzz' is not in the vocab"):
        build_tokenizer("GPT2BPETokenizer", vocab, str(bad_merges))


def small_vocab(ids_follow_merges: bool) -> dict[str, int]:
    """A byte-level vocab with merges 'a b' then 'ab c'; ids optionally out of merge order."""
    vocab = {char: n for n, char in enumerate(bytes_to_unicode().values())}
    vocab["ab"], vocab["abc"] = (256, 257) if ids_follow_merges else (257, 256)
    vocab["<|endoftext|>"] = 258
    return vocab


@pytest.mark.parametrize("ids_follow_merges", [True, False])
def test_small_vocab_backends(tmp_path, ids_follow_merges):
    (tmp_path / "vocab.json").write_text(json.dumps(small_vocab(ids_follow_merges)), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nab c\n", encoding="utf-8")
    tok = build_tokenizer("gpt2bpe", model=str(tmp_path))
    assert isinstance(tok, TiktokenTokenizer if ids_follow_merges else HFTokenizer)
    ab, abc = (256, 257) if ids_follow_merges else (257, 256)
    # Byte b's character has id b here; " ab" is Ġ,a,b -> Ġ + ab; "abc" is a,b,c -> ab,c -> abc.
    assert tok.encode("abc ab<|endoftext|>") == [abc, ord(" "), ab, 258]
    assert tok.encode("abc") == [abc] and tok.encode("xab") == [ord("x"), ab]
    assert tok.vocab_size == 259 and tok.decode(tok.encode("cab abc")) == "cab abc"


@pytest.mark.parametrize("ids_follow_merges", [True, False])
def test_a_vocabulary_numbered_with_gaps_is_sized_by_its_highest_id(tmp_path, ids_follow_merges):
    """<|endoftext|> at 300 after ids 0-257: 259 tokens, but id 300 is emitted. vocab_size counted
    the tokens (259), so the model was built with too few rows for the ids the data holds."""
    from tokenizers import Tokenizer

    vocab = {**small_vocab(ids_follow_merges), "<|endoftext|>": 300}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nab c\n", encoding="utf-8")
    bpe = build_tokenizer("gpt2bpe", model=str(tmp_path))
    assert isinstance(bpe, TiktokenTokenizer if ids_follow_merges else HFTokenizer)
    assert bpe.encode("ab<|endoftext|>") == [256 if ids_follow_merges else 257, 300]
    assert bpe.vocab_size == 301
    Tokenizer.from_str(gpt2_tokenizer_json(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))).save(
        str(tmp_path / "tokenizer.json")
    )
    tokenizer_json = build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path / "tokenizer.json"))
    assert tokenizer_json.encode("ab<|endoftext|>")[-1] == tokenizer_json.eod == 300
    assert tokenizer_json.vocab_size == 301


def test_huggingface_tokenizer_json(hf_gpt2, gpt2, tmp_path):
    hf_gpt2.tokenizer.save(str(tmp_path / "tokenizer.json"))
    tok = build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path / "tokenizer.json"))
    text = TRICKY[1] + TRICKY[5] + TRICKY[8]
    assert tok.encode(text) == gpt2.encode(text)
    assert tok.eod == 50256 and tok.vocab_size == 50257
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "Ġthe"}), encoding="utf-8")
    assert build_tokenizer("huggingface", model=str(tmp_path)).eod == 262
    with pytest.raises(DataError, match="not found"):
        build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="--tokenizer-model"):
        build_tokenizer("HuggingFaceTokenizer")


def test_a_tokenizer_json_under_a_path_that_is_not_utf8_loads(hf_gpt2, gpt2, tmp_path):
    """`data prepare --tokenizer-model /data/caf\xe9/tokenizer.json` (a Latin-1 directory) said the
    file was 'not a Hugging Face tokenizer.json': the tokenizers library takes UTF-8 paths only."""
    import os

    directory = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(directory)
    with open(directory + b"/tokenizer.json", "w", encoding="utf-8") as handle:  # save() takes UTF-8 only
        handle.write(hf_gpt2.tokenizer.to_str())
    tok = build_tokenizer("HuggingFaceTokenizer", model=os.fsdecode(directory))
    assert tok.encode(TRICKY[1]) == gpt2.encode(TRICKY[1]) and tok.eod == 50256


def test_tiktoken_named_encoding_offline(gpt2_files, gpt2, tmp_path, monkeypatch):
    """tiktoken's own "gpt2" (from its cache, filled with the same files) agrees with ours."""
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for url, path in ((base + "encoder.json", gpt2_files[0]), (base + "vocab.bpe", gpt2_files[1])):
        shutil.copy(path, tmp_path / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    tok = build_tokenizer("TikTokenizer", model="gpt2")
    text = "".join(TRICKY)
    assert tok.encode(text) == gpt2.encode(text)
    assert tok.eod == 50256 and tok.vocab_size == 50257
    with pytest.raises(DataError, match="unknown tiktoken encoding 'nope'"):
        build_tokenizer("tiktoken", model="nope")


def test_tiktoken_unreachable_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # fail fast instead of waiting on the network
    with pytest.raises(DataError, match="cannot load tiktoken encoding 'r50k_base'") as info:
        build_tokenizer("TikTokenizer", model="r50k_base")
    assert "\n" not in str(info.value)


def test_encode_flat_empty(gpt2):
    tokens, lengths = gpt2.encode_flat([])
    assert tokens.size == 0 and lengths.size == 0
    tokens, lengths = gpt2.encode_flat(["", "hello world", ""])
    assert lengths.tolist() == [0, 2, 0] and tokens.tolist() == [31373, 995]
    assert tokens.dtype == np.uint32


def test_no_torch_import():
    code = "import sys, gptrain.data.tokenizers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_nemo_tokenizer_library_flags_name_the_same_tokenizers(hf_gpt2, gpt2_files, tmp_path):
    """NeMo's preprocessing command lines pass --tokenizer-library; before, argparse refused it."""
    import argparse

    from gptrain.data.tokenizer_args import add_tokenizer_args, tokenizer_from_args, tokenizer_type

    parser = argparse.ArgumentParser()
    add_tokenizer_args(parser)
    hf_gpt2.tokenizer.save(str(tmp_path / "tokenizer.json"))
    args = parser.parse_args(["--tokenizer-library", "huggingface", "--tokenizer-type", str(tmp_path)])
    assert tokenizer_type(args) == "HuggingFaceTokenizer"
    assert tokenizer_from_args(args).encode("Hello world") == hf_gpt2.tokenizer.encode("Hello world").ids
    vocab, merges = gpt2_files
    megatron = ["--tokenizer-library", "megatron", "--tokenizer-type", "GPT2BPETokenizer"]
    args = parser.parse_args([*megatron, "--vocab-file", str(vocab), "--merge-file", str(merges)])
    assert tokenizer_type(args) == "GPT2BPETokenizer"


@pytest.mark.parametrize("model", ["tokenizer.json", "data/tokenizer.json", "my dir/tok"])
def test_a_missing_tokenizer_model_path_is_named_as_a_path(tmp_path, capsys, monkeypatch, model):
    """`--tokenizer-model data/tokenizer.json` with a typo in the path said "unknown tiktoken
    encoding 'data/tokenizer.json'" (a path that is not there was taken for an encoding's name)."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    argv = ["data", "prepare", "--input", "in.jsonl", "--output-prefix", "out", "--tokenizer-model", model]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: --tokenizer-model {model}: no such file or directory; give an existing "
        "tokenizer.json (or its directory), a SentencePiece tokenizer.model, or a tiktoken encoding "
        "name such as cl100k_base\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert main([*argv[:-1], "cl100k_bse"]) == 2  # a name stays a name
    assert "unknown tiktoken encoding 'cl100k_bse'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--tokenizer-model", "{d}"],
         "tokenizer model {d} is a directory with no tokenizer.json in it (pass --tokenizer-model path/to/tokenizer.json)"),
        (["--vocab-file", "{d}", "--merge-file", "{d}"],
         "vocab file {d} is a directory, not a file (pass --vocab-file path/to/vocab.json)"),
    ],
)  # fmt: skip
def test_a_directory_given_to_the_data_cli_for_a_tokenizer_file_is_said_to_be_one(
    tmp_path, capsys, flags, said
):
    """`data prepare --tokenizer-model DIR` (no tokenizer.json in it) said the directory was not found."""
    from gptrain.cli import main

    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    argv = ["data", "prepare", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o")]
    assert main([*argv, *(f.format(d=tokenizer) for f in flags)]) == 2
    assert capsys.readouterr().err == f"gptrain: error: {said.format(d=tokenizer)}\n"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--vocab-file", "{locked}/vocab.json", "--merge-file", "{merges}"],
            "vocab file {locked}/vocab.json",
        ),
        (
            ["--vocab-file", "{vocab}", "--merge-file", "{locked}/merges.txt"],
            "merge file {locked}/merges.txt",
        ),
        (["--tokenizer-model", "{locked}/tokenizer.json"], "tokenizer model {locked}/tokenizer.json"),
        (["--tokenizer-model", "{locked}"], "tokenizer model {locked}"),
    ],
)
def test_a_tokenizer_file_in_a_directory_that_may_not_be_searched_says_so(
    tmp_path, tmp_path_factory, capsys, refuse_search, gpt2_files, flags, said
):
    """Were a bare '<file>: Permission denied (GPTRAIN_DEBUG=1 shows where)' (pathlib raised) and,
    for --tokenizer-model, 'no such file or directory'. Root may search any directory: the
    refusal of a shared file system's permissions is stood in for."""
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDatasetWriter

    ds = str(tmp_path_factory.mktemp("readable") / "ds")  # outside tmp_path, which refuses
    with IndexedDatasetWriter(ds, np.uint16) as writer:
        writer.add_document(np.array([1, 2]))
    locked = tmp_path / "locked"
    locked.mkdir()
    refuse_search(tmp_path)
    names = {"locked": locked, "vocab": gpt2_files[0], "merges": gpt2_files[1]}
    assert main(["data", "inspect", ds, *(flag.format(**names) for flag in flags)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"gptrain: error: {said.format(**names)} cannot be looked up (Permission denied); check the "
        f"permissions of {tmp_path} and the directories above it (pass --"
    )  # {locked} itself cannot be looked up here: its parent is the directory that refused
    assert err.count("\n") == 1


def test_a_tokenizer_directory_that_may_not_be_searched_is_not_said_to_lack_the_file(
    tmp_path, capsys, unsearchable_dir
):
    """Was '<dir> is a directory with no tokenizer.json in it' where the user may not search <dir>."""
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(str(tmp_path / "ds"), np.uint16) as writer:
        writer.add_document(np.array([1, 2]))
    locked = unsearchable_dir
    assert main(["data", "inspect", str(tmp_path / "ds"), "--tokenizer-model", str(locked)]) == 2
    assert capsys.readouterr().err.startswith(
        f"gptrain: error: tokenizer model {locked}/tokenizer.json cannot be looked up (Permission denied);"
        f" check the permissions of {locked} and the directories above it (pass --"
    )


def test_a_gpt2_tokenizer_directory_that_may_not_be_looked_up_is_one_line(tmp_path, capsys, unsearchable_dir):
    """--tokenizer-type GPT2BPETokenizer --tokenizer-model <dir>: Path.is_dir raised PermissionError,
    said as a bare '<dir>: Permission denied', where a directory above <dir> may not be searched."""
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(str(tmp_path / "ds"), np.uint16) as writer:
        writer.add_document(np.array([1, 2]))
    locked = unsearchable_dir
    (locked / "gpt2").mkdir()
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--tokenizer-model", str(locked / "gpt2")]
    assert main(["data", "inspect", str(tmp_path / "ds"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"gptrain: error: tokenizer model {locked}/gpt2 cannot be looked up (Permission denied); check the"
        f" permissions of {locked} and the directories above it (pass --"
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize("given", ["file", "directory"])
def test_tiktoken_given_a_file_that_is_no_megatron_vocabulary_says_what_it_reads(
    tmp_path, capsys, monkeypatch, given
):
    """Megatron's TikTokenizer reads a .json vocabulary; given a .tiktoken file (or a directory) here it
    said "unknown tiktoken encoding '<path>'", as if the path were a misspelt encoding name."""
    import tiktoken

    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "tokenizer.tiktoken").write_text("IQ== 0\n")
    model = "vocab/tokenizer.tiktoken" if given == "file" else "vocab"
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", model]
    assert main(["data", "prepare", "--input", "in.jsonl", "--output-prefix", "out", *flags]) == 2
    known = ", ".join(tiktoken.list_encoding_names())
    said = {
        "file": f"{model}: Megatron's TikTokenizer reads a .json vocabulary (a JSON list of rank, token_bytes, "
        "token_str); for one of tiktoken's encodings give its name, e.g. cl100k_base",
        "directory": f"tokenizer model {model} is a directory; TikTokenizer takes Megatron's tiktoken "
        f"vocabulary file (path/to/tokenizer.json) or a tiktoken encoding name ({known})",
    }[given]
    assert capsys.readouterr().err == f"gptrain: error: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "vocab"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "gpt2-medium"],
         "--tokenizer-model gpt2-medium is not a local file or directory; "),
        (["--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", "meta-llama/Llama-2-7b-hf"],
         "--tokenizer-model meta-llama/Llama-2-7b-hf is not a local file or directory; "),
        (["--tokenizer-model", "meta-llama/Llama-2-7b-hf"],
         "--tokenizer-model meta-llama/Llama-2-7b-hf: no such file or directory; "),
        (["--tokenizer-model", "gpt2-medium"], "unknown tiktoken encoding 'gpt2-medium' for --tokenizer-model"),
    ],
)  # fmt: skip
def test_a_hub_name_given_to_prepare_says_gptrain_does_not_download(
    tmp_path, capsys, monkeypatch, flags, said
):
    """A hub name (which NeMo's and Megatron's AutoTokenizer download) was only "not found"."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    assert main(["data", "prepare", "--input", "in.jsonl", "--output-prefix", "out", *flags]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"gptrain: error: {said}")
    assert "gptrain does not download tokenizers from the Hugging Face hub" in err
    assert f"huggingface-cli download {flags[-1]} --local-dir DIR" in err


def test_a_merges_file_missing_a_merge_encodes_as_megatrons_bpe(gpt2_files, tmp_path):
    """tiktoken's ranks took a merge whose part no earlier merge makes ("Ġt he" without "Ġ t"): HF's
    BPE (Megatron's GPT2BPETokenizer) never forms such a token, but tiktoken emits a piece found whole
    in its ranks, so " the two" was [262, 734] here and [220, 1169, 220, 11545] in Megatron's data.
    Such a file is now read with HF's BPE."""
    vocab, merges = gpt2_files
    lines = Path(merges).read_text(encoding="utf-8").split("\n")
    assert lines[1] == "Ġ t"
    fewer = tmp_path / "merges.txt"
    fewer.write_text("\n".join(lines[:1] + lines[2:]), encoding="utf-8")
    megatron = load_gpt2_bpe(vocab, str(fewer), backend="hf").encode(" the two")
    assert megatron == [220, 1169, 220, 11545]
    assert build_tokenizer("gpt2bpe", vocab, str(fewer)).encode(" the two") == megatron
    assert isinstance(build_tokenizer("gpt2bpe", vocab, merges), TiktokenTokenizer)  # the whole file: fast


def test_an_eos_token_the_tokenizer_json_lacks_is_said_as_such(tmp_path):
    """tokenizer_config.json naming an eos_token that tokenizer.json does not hold (transformers, and
    so Megatron's HuggingFaceTokenizer, adds it as a new id at load) was "no end-of-document token
    found (none of <|endoftext|>, </s>, ...); put a tokenizer_config.json with eos_token next to
    tokenizer.json": the advice the user had followed. Now the line names the token and the file."""
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1, "a": 2}, unk_token="<unk>")).save(
        str(tmp_path / "tokenizer.json")
    )
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": {"content": "<|im_end|>", "special": True}}))
    tokenizer = build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path))
    with pytest.raises(DataError) as error:
        tokenizer.eod  # noqa: B018
    assert str(error.value) == (
        f"{config}: its eos_token '<|im_end|>' is not a token of {tmp_path / 'tokenizer.json'} (transformers "
        "would add it as a new id; gptrain reads tokenizer.json as it is): add it to tokenizer.json's "
        "added_tokens, or name one of its tokens as eos_token"
    )
    config.write_text(json.dumps({"eos_token": "</s>"}))
    assert build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path)).eod == 1


def test_an_added_token_id_the_library_does_not_read_is_said_by_prepare(tmp_path, capsys):
    """A tokenizer.json edited to place an added token at an id of the user's choosing ("id": 9)
    was taken silently: `tokenizers` (so transformers and Megatron) reads no added token's id and
    gives it the next one after the vocabulary, so the data held 4 where its user expected 9."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from gptrain.cli import main

    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>", "<extra>"])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a <extra> b"}) + "\n")
    argv = ["data", "prepare", "--input", str(source), "--tokenizer-type", "HuggingFaceTokenizer"]

    def prepare(name: str) -> tuple[list[int], str]:
        assert main([*argv, "--tokenizer-model", str(path), "--output-prefix", str(tmp_path / name)]) == 0
        return np.fromfile(
            tmp_path / f"{name}_text_document.bin", np.uint16
        ).tolist(), capsys.readouterr().err

    assert prepare("as_saved") == ([1, 4, 2], "")
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"][-1]["id"] = 9
    path.write_text(json.dumps(data), encoding="utf-8")
    ids, err = prepare("edited")
    assert ids == [1, 4, 2]
    assert err.strip() == (
        f"note: {path}: its added token '<extra>' has \"id\": 9, which the tokenizers library (so transformers "
        "and Megatron too) does not read: it gives the token 4, the id the data holds; write the ids it gives "
        "in the file to make it say so"
    )


@pytest.mark.parametrize("ids_follow_merges", [True, False])
@pytest.mark.parametrize(("eod_id", "dtype"), [(65510, np.uint16), (65535, np.uint16), (65536, np.int32)])
def test_prepare_picks_the_token_dtype_by_the_vocabularys_count_as_megatron(
    tmp_path, ids_follow_merges, eod_id, dtype
):
    """Megatron's preprocess_data picks uint16 by len(tokenizer), the count of entries (259 here);
    the highest id + 1 (right for the model's rows) made a vocabulary numbered with a gap past
    65,499 int32 here, twice the bytes and not Megatron's .bin. An id uint16 cannot hold stays int32
    (Megatron's builder raises OverflowError at it with numpy >= 2, and wraps it, as another token,
    with numpy < 2)."""
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDataset

    vocab = {**small_vocab(ids_follow_merges), "<|endoftext|>": eod_id}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nab c\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text('{"text": "abc ab"}\n', encoding="utf-8")
    argv = [
        "data",
        "prepare",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output-prefix",
        str(tmp_path / "out"),
    ]
    argv += ["--vocab-file", str(tmp_path / "vocab.json"), "--merge-file", str(tmp_path / "merges.txt")]
    assert main([*argv, "--append-eod", "--workers", "1"]) == 0
    data = IndexedDataset(str(tmp_path / "out_text_document"))
    ab, abc = (256, 257) if ids_follow_merges else (257, 256)
    assert data.dtype == np.dtype(dtype) and data.get(0).tolist() == [abc, ord(" "), ab, eod_id]
