"""Megatron's TikTokenizer vocabulary file: ids derived by hand from a small byte-level vocabulary.

The vocabulary is the 256 single bytes (rank = byte) and seven merges; Megatron puts the special
tokens first, so a token of rank r has id r + num_special_tokens, and </s> (special id 2) ends a
document. BPE merges the pair of lowest rank first: "hello" is h e l l o -> he (256), ll (257),
hell (258), hello (259).
"""

from __future__ import annotations

import base64
import json
import shlex

import numpy as np
import pytest

from gptrain.data.tiktoken_file import TiktokenFileOptions
from gptrain.data.tokenizers import build_tokenizer
from gptrain.errors import ConfigError, DataError

MERGES = [b"he", b"ll", b"hell", b"hello", "é".encode(), b"oW", b"20"]  # ranks 256..262
TOKENS = [bytes([b]) for b in range(256)] + MERGES
HE, LL, HELL, HELLO, E_ACUTE, O_W = 256, 257, 258, 259, 260, 261


def entry(rank: int, token: bytes) -> dict:
    return {
        "rank": rank,
        "token_bytes": base64.b64encode(token).decode(),
        "token_str": token.decode("latin-1"),
    }


def write_vocabulary(path, entries) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.fixture
def vocabulary(tmp_path) -> str:
    return write_vocabulary(tmp_path / "tokenizer.json", [entry(r, t) for r, t in enumerate(TOKENS)])


def megatron(path: str, **options) -> object:
    return build_tokenizer("TikTokenizer", model=path, tiktoken=TiktokenFileOptions(**options))


def ranks(text: str) -> list[int]:
    """The ranks of single bytes (what no merge applies to)."""
    return list(text.encode())


@pytest.mark.parametrize("specials", [1000, 10])
def test_ids_are_the_ranks_after_the_special_tokens(vocabulary, specials):
    tokenizer = megatron(vocabulary, vocab_size=specials + len(TOKENS), num_special_tokens=specials)
    shifted = lambda ids: [i + specials for i in ids]  # noqa: E731
    assert tokenizer.vocab_size == specials + 263 and tokenizer.eod == 2
    assert tokenizer.encode("hello hello") == shifted([HELLO, ord(" "), HELLO])
    # v2 splits digits one by one (the "20" merge never applies) and keeps é's two bytes in one piece
    assert tokenizer.encode("café 2026") == shifted([*ranks("caf"), E_ACUTE, *ranks(" 2026")])
    # a literal special token (a filler too) is its id, as Megatron encodes with allowed_special="all"
    assert tokenizer.encode("a</s>b<SPECIAL_7>") == [97 + specials, 2, 98 + specials, 7]


def test_pattern_v2_splits_camel_case_and_v1_does_not(vocabulary):
    """v2 splits "HelloWorld" before the capital, so the oW merge applies under v1 only."""
    v1, v2 = (megatron(vocabulary, vocab_size=1263, pattern=p) for p in ("v1", "v2"))
    assert v2.encode("HelloWorld") == [i + 1000 for i in [*ranks("He"), LL, *ranks("oWorld")]]
    assert v1.encode("HelloWorld") == [i + 1000 for i in [*ranks("He"), LL, O_W, *ranks("orld")]]
    assert megatron(vocabulary, vocab_size=1263).encode("HelloWorld") == v2.encode("HelloWorld")  # default


def test_vocab_size_keeps_the_files_first_ranks(vocabulary):
    """Megatron keeps vocab_size - num_special_tokens ranks: without rank 259, hello is hell + o."""
    tokenizer = megatron(vocabulary, vocab_size=1000 + HELLO)
    assert tokenizer.vocab_size == 1259 and tokenizer.encode("hello") == [1000 + HELL, 1000 + ord("o")]


def test_given_special_tokens_come_first_then_fillers(vocabulary):
    specials = ("</s>", "<unk>", "<s>", "<mask>", "<pad>", "<cls>", "<sep>", "<|im_start|>")
    tokenizer = megatron(vocabulary, vocab_size=273, num_special_tokens=10, special_tokens=specials)
    assert tokenizer.eod == 0
    assert tokenizer.encode("<|im_start|>he<SPECIAL_8><SPECIAL_9>") == [7, HE + 10, 8, 9]
    assert tokenizer.decode([7, HE + 10, 0]) == "<|im_start|>he</s>"


def test_decode_inverts_encode_on_unicode_text(vocabulary):
    tokenizer = megatron(vocabulary, vocab_size=1263)
    for text in [
        "Ünïcödé façade naïve — “quotes” € 日本語のテキスト 한국어 العربية",
        "Emoji 🤖🚀👩‍👩‍👧 and combining e\u0301 and zero\u200bwidth\r\n\n  \t x",
        "hello</s>HelloWorld 2026<unk>",
        "",
    ]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_prepare_writes_megatrons_ids(vocabulary, tmp_path):
    """`gptrain data prepare` with preprocess_data.py's flags: the ids, </s> after each document."""
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDataset

    (tmp_path / "in.jsonl").write_text(
        json.dumps({"text": "hello café"}) + "\n" + json.dumps({"text": "HelloWorld</s>"}) + "\n"
    )
    flags = f"--tokenizer-type TikTokenizer --tokenizer-model {vocabulary} --vocab-size 273"
    flags += " --tiktoken-num-special-tokens 10 --tiktoken-pattern v1 --append-eod --workers 1"
    argv = ["data", "prepare", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o")]
    assert main([*argv, *shlex.split(flags)]) == 0
    data = IndexedDataset(str(tmp_path / "o_text_document"))
    first = [HELLO, ord(" "), *ranks("caf"), E_ACUTE]
    second = [*ranks("He"), LL, O_W, *ranks("orld")]
    assert list(data[0]) == [i + 10 for i in first] + [2]
    assert list(data[1]) == [i + 10 for i in second] + [2, 2]
    assert data[0].dtype == np.uint16  # Megatron's optimal_dtype: under 65500 ids


@pytest.mark.parametrize(("vocab_size", "dtype"), [(65499, np.uint16), (65500, np.int32)])
def test_the_vocabulary_size_decides_the_token_dtype_as_megatrons(tmp_path, vocab_size, dtype):
    """Megatron's optimal_dtype: uint16 under 65500 ids, int32 from there (its default 131072 too)."""
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDataset

    tokens = TOKENS + [i.to_bytes(3, "big") for i in range(len(TOKENS), 64500)]  # none reachable by merges
    path = write_vocabulary(tmp_path / "tokenizer.json", [entry(r, t) for r, t in enumerate(tokens)])
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    argv = ["data", "prepare", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o")]
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", path, "--vocab-size", str(vocab_size)]
    assert main([*argv, *flags, "--append-eod", "--workers", "1"]) == 0
    data = IndexedDataset(str(tmp_path / "o_text_document"))
    assert data[0].dtype == dtype and list(data[0]) == [1000 + HELLO, 2]


def test_megatron_flags_and_the_config_build_the_same_tokenizer(vocabulary):
    """pretrain_gpt.py's TikTokenizer flags become model.tokenizer keys that train reads."""
    from gptrain.config import load_training_config
    from gptrain.megatron.translate import translate
    from gptrain.train.tokenizer_setup import build_tokenizer as from_config
    from gptrain.train.tokenizer_setup import padded_vocab_size

    base = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    base += f" --train-iters 4 --mock-data --tokenizer-type TikTokenizer --tokenizer-model {vocabulary}"
    base += " --vocab-size 273 --tiktoken-pattern v1 --tiktoken-num-special-tokens 10"
    base += " --tokenizer-special-tokens </s> <unk> <s> <mask> <pad> <cls> <sep>"
    t = translate(shlex.split(base), {})
    cfg = load_training_config(None, t.overrides, report_ignored=False)
    tok = cfg.model.tokenizer
    assert (tok.vocab_size, tok.tiktoken_pattern, tok.tiktoken_num_special_tokens) == (273, "v1", 10)
    assert cfg.model.data.mock_vocab_size is None  # the tokenizer's vocabulary, as Megatron's
    tokenizer = from_config(cfg)
    assert tokenizer.eod == 0 and tokenizer.encode("HelloWorld") == [72 + 10, 101 + 10, LL + 10, O_W + 10, *(
        i + 10 for i in ranks("orld"))]  # fmt: skip
    assert padded_vocab_size(cfg, tokenizer) == (273, 384)


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"pattern": "v3"}, ConfigError, "model.tokenizer.tiktoken_pattern (--tiktoken-pattern) 'v3': use v1 or v2"),
        ({"special_tokens": ("<unk>", "<s>", "</s>")}, ConfigError,
         "model.tokenizer.special_tokens (--tokenizer-special-tokens): <mask> <pad> <cls> <sep> missing"),
        ({"special_tokens": ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>", "<s>")}, ConfigError,
         "'<s>' is given twice"),
        ({"special_tokens": ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>", "")}, ConfigError,
         "(--tokenizer-special-tokens): an empty token"),
        ({"num_special_tokens": 6}, ConfigError, "(--tiktoken-num-special-tokens) 6: needs at least the 7"),
        ({"num_special_tokens": 2000}, ConfigError, "fewer than model.tokenizer.vocab_size (--vocab-size) 1263"),
        ({"special_tokens": ("<SPECIAL_9>", "<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")},
         ConfigError, "'<SPECIAL_9>' is also the name of a filler"),
        ({"vocab_size": 1200}, DataError, "keeps 200 of its tokens, fewer than the 256 single bytes"),
        ({"vocab_size": 1264}, DataError,
         "holds 263 tokens, but vocabulary size 1264 less 1000 special tokens needs 264; set "
         "model.tokenizer.vocab_size (--vocab-size) to 1263 or fewer"),
        ({"vocab_size": None}, DataError, "needs 130072"),  # Megatron's default 2**17
    ],
)  # fmt: skip
def test_settings_megatron_asserts_are_one_line(vocabulary, options, error, said):
    with pytest.raises(error) as info:
        megatron(vocabulary, **{"vocab_size": 1263, **options})
    assert said in str(info.value) and "\n" not in str(info.value)


def bad(entries_or_text):
    """A file's text: the 263 good entries changed by `entries_or_text` (a function of them) or raw text."""
    if isinstance(entries_or_text, str):
        return entries_or_text
    entries = [entry(r, t) for r, t in enumerate(TOKENS)]
    entries_or_text(entries)
    return json.dumps(entries, indent=0)


def _set(index, **fields):
    return lambda entries: entries[index].update(fields)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[{"rank": 0,', ":1: not JSON (Expecting property name enclosed in double quotes, column 13)"),
        ('{"a": 1}', ": a JSON dict, not a list of rank, token_bytes, token_str entries"),
        (lambda e: e[3].pop("token_str"), ": entry 3: expected keys rank, token_bytes, token_str, got ['rank', 'token_bytes']"),
        (lambda e: e.__setitem__(4, "x"), ": entry 4: expected keys rank, token_bytes, token_str, got str"),
        (_set(5, rank=6), ": entry 5: rank 6, not 5; ranks must count up from 0 in order"),
        (_set(5, rank="5"), ": entry 5: rank '5', not 5"),
        (_set(260, token_bytes="w6k!"), ": entry 260: token_bytes 'w6k!' is not base64"),
        (_set(260, token_bytes="w6"), ": entry 260: token_bytes 'w6' is not base64"),
        (_set(260, token_bytes=7), ": entry 260: token_bytes 7 is not base64"),
        (_set(260, token_bytes=""), ": entry 260: token_bytes is empty"),
        (_set(65, token_bytes="Qg=="), ": entry 65: token_bytes b'B', not b'A'; the first 256 are the single bytes"),
        (_set(262, token_bytes="aGU="), ": entry 262: token_bytes 'aGU=' repeats entry 256"),
    ],
)  # fmt: skip
def test_a_bad_vocabulary_file_is_one_line_naming_the_file_and_entry(tmp_path, text, said):
    path = tmp_path / "tokenizer.json"
    path.write_text(bad(text))
    with pytest.raises(DataError) as info:
        megatron(str(path), vocab_size=1263)
    assert str(info.value).startswith(f"{path}{said}")
    assert "\n" not in str(info.value)


def test_ranks_past_the_kept_ones_are_not_read(tmp_path):
    """Megatron checks only the entries it keeps: a damaged one past vocab_size is never read."""
    path = tmp_path / "tokenizer.json"
    path.write_text(bad(_set(262, token_bytes="!")))
    assert megatron(str(path), vocab_size=1262).vocab_size == 1262


def test_a_file_that_is_no_json_vocabulary_is_said_to_be_one(tmp_path):
    """Megatron reads only a .json vocabulary (it asserts the name); a .tiktoken file is refused."""
    path = tmp_path / "cl100k_base.tiktoken"
    path.write_text("IQ== 0\n")
    with pytest.raises(DataError) as info:
        megatron(str(path))
    assert str(info.value) == (
        f"{path}: Megatron's TikTokenizer reads a .json vocabulary (a JSON list of rank, token_bytes, "
        "token_str); for one of tiktoken's encodings give its name, e.g. cl100k_base"
    )
    with pytest.raises(DataError, match="tiktoken vocabulary .*missing.json not found"):
        megatron(str(tmp_path / "missing.json"))


def test_a_changed_file_is_read_again(vocabulary, tmp_path):
    """The cache is keyed by the file's stamp, as the other tokenizers' are."""
    assert megatron(vocabulary, vocab_size=1263).encode("hello") == [1000 + HELLO]
    changed = [*TOKENS[:HELLO], b"xyz", *TOKENS[HELLO + 1 :]]
    write_vocabulary(tmp_path / "tokenizer.json", [entry(r, t) for r, t in enumerate(changed)])
    assert megatron(vocabulary, vocab_size=1263).encode("hello") == [1000 + HELL, 1000 + ord("o")]


def test_export_ids_and_the_checkpoint_record_are_megatrons(vocabulary):
    """config.json's bos/eos are <s> and </s>; a resume with other special tokens is another tokenizer."""
    from types import SimpleNamespace

    from gptrain.data.tokenizer_identity import compare, record, token_table
    from gptrain.trained.hf.record import special_token_ids

    cfg = SimpleNamespace(model=SimpleNamespace(tokenizer=SimpleNamespace(type="TikTokenizer")))
    specials = ("<sep>", "<cls>", "</s>", "<pad>", "<mask>", "<s>", "<unk>")
    for options, ids in (({}, (1, 2)), ({"special_tokens": specials}, (5, 2))):
        tokenizer = megatron(vocabulary, vocab_size=1263, **options)
        assert special_token_ids(cfg, tokenizer, {}) == {"bos_token_id": ids[0], "eos_token_id": ids[1]}
    ours, fewer = (
        megatron(vocabulary, vocab_size=1263),
        megatron(vocabulary, vocab_size=273, num_special_tokens=10),
    )
    saved = record(ours, "TikTokenizer", vocabulary)
    assert saved["vocab_size"] == 1263 and saved["eod"] == 2
    assert compare(saved, record(ours, "TikTokenizer", vocabulary), token_table(ours)).kind == "same"
    assert compare(saved, record(fewer, "TikTokenizer", vocabulary), token_table(fewer)).kind == "different"


def test_settings_beside_a_tiktoken_encoding_name_are_refused():
    """A named encoding has its own split and vocabulary: Megatron's settings there would change nothing."""
    with pytest.raises(ConfigError) as info:
        build_tokenizer(
            "TikTokenizer", model="cl100k_base", tiktoken=TiktokenFileOptions("v2", num_special_tokens=1000)
        )
    assert str(info.value) == (
        "model.tokenizer.tiktoken_pattern (--tiktoken-pattern): read only with Megatron's tiktoken vocabulary "
        "file; the tiktoken encoding 'cl100k_base' has its own split, vocabulary and special tokens: drop the setting"
    )


NOT_READ = {
    "model.tokenizer.vocab_size=1000": "model.tokenizer.vocab_size (--vocab-size)",
    "model.tokenizer.tiktoken_pattern=v1": "model.tokenizer.tiktoken_pattern (--tiktoken-pattern)",
    "model.tokenizer.tiktoken_num_special_tokens=10": (
        "model.tokenizer.tiktoken_num_special_tokens (--tiktoken-num-special-tokens)"
    ),
    "model.tokenizer.special_tokens=[<unk>]": "model.tokenizer.special_tokens (--tokenizer-special-tokens)",
}
READERS = {
    "GPT2BPETokenizer": [],
    "HuggingFaceTokenizer": ["model.tokenizer.model=/models/tokenizer.json"],
    "GPTSentencePieceTokenizer": ["model.tokenizer.model=/models/tokenizer.model"],
    "TikTokenizer": ["model.tokenizer.model=cl100k_base"],
}


@pytest.mark.parametrize("kind", sorted(READERS))
@pytest.mark.parametrize("setting", sorted(NOT_READ))
def test_settings_no_tokenizer_reads_are_refused_at_load_naming_the_key(kind, setting):
    """Beside GPT-2 BPE, Hugging Face or SentencePiece they were taken silently (nothing reads them),
    and beside an encoding name refused only when the job started building its tokenizer."""
    from gptrain.config import load_training_config

    overrides = [f"model.tokenizer.type={kind}", *READERS[kind], setting]
    with pytest.raises(ConfigError) as info:
        load_training_config("gpt3/126m", overrides, report_ignored=False)
    said = str(info.value)
    reader = "the tiktoken encoding 'cl100k_base'" if kind == "TikTokenizer" else kind
    assert said.startswith(
        f"{NOT_READ[setting]}: read only by TikTokenizer with Megatron's tiktoken vocabulary file, not by {reader}"
    )
    assert said.endswith("; drop it") and "\n" not in said


def test_megatrons_vocabulary_without_the_type_says_which_type_reads_it(vocabulary, tmp_path, capsys):
    """Without --tokenizer-type an existing --tokenizer-model is a Hugging Face tokenizer.json, which
    said only that the list was no tokenizer.json; it now names the type that reads it."""
    from gptrain.cli import main

    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    argv = ["data", "prepare", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o")]
    assert main([*argv, "--tokenizer-model", vocabulary]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptrain: error: {vocabulary}: not a Hugging Face tokenizer.json (")
    assert err.endswith(
        "; a JSON list is Megatron's tiktoken vocabulary: pass --tokenizer-type TikTokenizer\n"
    )
    assert err.count("\n") == 1
