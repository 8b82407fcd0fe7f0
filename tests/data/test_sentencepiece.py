"""SentencePiece tokenizer.model: `data prepare` writes Megatron's bytes for each of its three types.

The reference is independent of gptrain's tokenizer: the sentencepiece library's own ids arranged
by Megatron's rules (megatron/training/tokenizer/tokenizer.py up to core 0.14), the special-token
search written as Megatron's loop, and the .bin/.idx bytes packed from the format's layout.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.data.tokenizers import build_tokenizer
from gptrain.errors import ConfigError, DataError

spm = pytest.importorskip("sentencepiece")

SP_TYPES = ("GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer")
DOCUMENTS: list[str | list[str]] = [
    "kato rishu menla quazer.",
    "",
    "Megatron's specials in the text: a<EOD>b <CLS>  <s>x</s> <MASK><SEP><PAD>",
    "  leading and   inner   spaces, digits 12345 and ünï 日本",
    ["first sentence kato.", "", "second <EOD> sentence"],
    " ",
    "<EOD>",
]


class MegatronReference:
    """Megatron's _GPTSentencePieceTokenizer, _Llama2Tokenizer and _SentencePieceTokenizer."""

    def __init__(self, model: str, kind: str) -> None:
        self.sp = spm.SentencePieceProcessor(model_file=model)
        self.kind = kind
        self.vocab = {self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}
        self.specials: dict[str, int] = {}
        if kind == "SentencePieceTokenizer":
            pad = "<PAD>" if self.sp.pad_id() < 0 else self.sp.id_to_piece(self.sp.pad_id())
            for token in ["<CLS>", "<SEP>", "<EOD>", "<MASK>", pad, "<s>", "</s>"]:
                if token not in self.vocab:
                    self.vocab[token] = len(self.vocab)
                self.specials[token] = self.vocab[token]
        self.eod = self.specials["<EOD>"] if self.specials else self.sp.eos_id()
        self.vocab_size = len(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        if self.kind == "Llama2Tokenizer":
            return [self.sp.bos_id(), *self.sp.encode(text)]
        if self.kind == "GPTSentencePieceTokenizer":
            return self.sp.encode_as_ids(text)
        ids, idx = [], 0
        while True:
            indices = {t: text[idx:].index(t) for t in self.specials if t in text[idx:]}
            if not indices:
                break
            token = min(indices, key=indices.get)
            ids += self.sp.encode_as_ids(text[idx : idx + indices[token]])
            ids.append(self.specials[token])
            idx += indices[token] + len(token)
        return ids + self.sp.encode_as_ids(text[idx:])

    def dataset(self, documents: list[str | list[str]], append_eod: bool) -> tuple[bytes, bytes]:
        """preprocess_data.py's Encoder.encode and the mmap .idx/.bin layout (uint16 below 65500)."""
        assert self.vocab_size < 65500
        lengths, doc_indices, tokens = [], [0], []
        for document in documents:
            for sentence in document if isinstance(document, list) else [document]:
                ids = self.tokenize(sentence)
                if ids:
                    lengths.append(len(ids))
                    tokens += ids
            if append_eod and len(lengths) > doc_indices[-1]:
                tokens.append(self.eod)
                lengths[-1] += 1
            doc_indices.append(len(lengths))
        pointers = [2 * sum(lengths[:n]) for n in range(len(lengths))]
        idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(doc_indices))
        idx += struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
        idx += struct.pack(f"<{len(doc_indices)}q", *doc_indices)
        return idx, struct.pack(f"<{len(tokens)}H", *tokens)


def prepare(tmp_path: Path, write_jsonl, flags: list[str], *extra: str) -> tuple[bytes, bytes]:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in DOCUMENTS])
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out"), *flags]
    assert main([*argv, *extra]) == 0
    base = tmp_path / "out_text_document"
    return Path(f"{base}.idx").read_bytes(), Path(f"{base}.bin").read_bytes()


@pytest.mark.parametrize("kind", SP_TYPES)
@pytest.mark.parametrize(("workers", "append_eod"), [(1, True), (2, True), (1, False)])
def test_prepare_writes_megatrons_bytes(tmp_path, sp_model, write_jsonl, kind, workers, append_eod):
    flags = ["--tokenizer-type", kind, "--tokenizer-model", sp_model, "--workers", str(workers)]
    written = prepare(tmp_path, write_jsonl, flags, *["--append-eod"] * append_eod)
    assert written == MegatronReference(sp_model, kind).dataset(DOCUMENTS, append_eod)


def test_nemo_sentencepiece_library_is_gpt_sentencepiece(tmp_path, sp_model, write_jsonl):
    """NeMo's preprocess_data_for_megatron.py: text_to_ids (encode_as_ids), eos appended."""
    flags = ["--tokenizer-library", "sentencepiece", "--tokenizer-model", sp_model, "--append-eod"]
    written = prepare(tmp_path, write_jsonl, flags, "--workers", "1")
    assert written == MegatronReference(sp_model, "GPTSentencePieceTokenizer").dataset(DOCUMENTS, True)
    # a Megatron SentencePiece type named beside it is kept, as the training config keeps it: the
    # data then holds the bos that training's eval and generate put first
    for name in ("llama", "other"):
        (tmp_path / name).mkdir()
    llama = prepare(
        tmp_path / "llama", write_jsonl, [*flags, "--tokenizer-type", "Llama2Tokenizer"], "--workers", "1"
    )
    assert llama == MegatronReference(sp_model, "Llama2Tokenizer").dataset(DOCUMENTS, True)
    other = prepare(
        tmp_path / "other", write_jsonl, [*flags, "--tokenizer-type", "GPT2BPETokenizer"], "--workers", "1"
    )
    assert other == written  # any other type is ignored, as NeMo ignores it


def test_vocabulary_eod_and_decode(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    assert (sp.get_piece_size(), sp.pad_id(), sp.bos_id(), sp.eos_id()) == (250, -1, 1, 2)
    gpt, llama, megatron = (build_tokenizer(kind, model=sp_model) for kind in SP_TYPES)
    assert (gpt.vocab_size, gpt.eod) == (250, 2) and (llama.vocab_size, llama.eod) == (250, 2)
    # <CLS> <SEP> <EOD> <MASK> <PAD> take 250-254; <s> and </s> are the model's own pieces
    assert (megatron.vocab_size, megatron.eod) == (255, 252)
    text = "kato rishu menla"
    assert gpt.decode(gpt.encode(text)) == llama.decode(llama.encode(text)) == text
    ids = megatron.encode("kato<EOD>rishu")
    assert ids == [*sp.encode("kato"), 252, *sp.encode("rishu")]
    assert megatron.decode(ids) == "kato <EOD> rishu"  # Megatron's detokenize spaces a special apart
    with pytest.raises(DataError, match="token id 250 is not in this tokenizer's vocabulary"):
        gpt.decode([5, 250])


def test_a_missing_or_garbled_model_is_one_line_naming_it(tmp_path, sp_model):
    missing = tmp_path / "nowhere.model"
    with pytest.raises(DataError, match=f"tokenizer model {missing} not found"):
        build_tokenizer("Llama2Tokenizer", model=str(missing))
    whole = Path(sp_model).read_bytes()
    cut = whole[: whole.index(b"</s>") + 2]  # ends inside a piece's string (a cut between pieces parses)
    for garbled in (b"not a model at all", cut, b""):
        (tmp_path / "bad.model").write_bytes(garbled)
        with pytest.raises(DataError) as info:
            build_tokenizer("GPTSentencePieceTokenizer", model=str(tmp_path / "bad.model"))
        assert str(info.value).startswith(f"{tmp_path / 'bad.model'}: not a SentencePiece tokenizer.model")
        assert "\n" not in str(info.value)
    with pytest.raises(
        ConfigError, match=r"Llama2Tokenizer needs --tokenizer-model \(path/to/tokenizer.model\)"
    ):
        build_tokenizer("Llama2Tokenizer")


def test_a_model_without_bos_or_eos(tmp_path, train_sentencepiece):
    """Llama2Tokenizer would write -1 before each text; GPTSentencePieceTokenizer has no EOD."""
    model = train_sentencepiece(tmp_path, vocab_size=200, bos_id=-1, eos_id=-1)
    with pytest.raises(DataError, match=r"no beginning-of-sentence piece \(bos_id=-1\)"):
        build_tokenizer("Llama2Tokenizer", model=model)
    with pytest.raises(DataError, match=r"no end-of-sentence piece \(eos_id=-1\)"):
        _ = build_tokenizer("GPTSentencePieceTokenizer", model=model).eod
    megatron = build_tokenizer("SentencePieceTokenizer", model=model)
    # <CLS> <SEP> <EOD> <MASK> <PAD> <BOS> <EOS> all added after the 200 pieces
    assert (megatron.vocab_size, megatron.eod) == (207, 202)


def test_without_the_sentencepiece_package_one_line_says_install_it(sp_model, monkeypatch):
    from gptrain.data import tokenizer_loaders

    tokenizer_loaders._load_sentencepiece.cache_clear()  # a model built earlier in the session is cached
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(
        DataError, match=f"^{sp_model}: .* need the sentencepiece package: pip install sentencepiece$"
    ):
        build_tokenizer("GPTSentencePieceTokenizer", model=sp_model)


def test_flags_name_the_types(sp_model):
    from gptrain.data.tokenizer_args import add_tokenizer_args, tokenizer_type

    parser = argparse.ArgumentParser()
    add_tokenizer_args(parser)
    args = parser.parse_args(["--tokenizer-library", "sentencepiece", "--tokenizer-model", sp_model])
    assert tokenizer_type(args) == "GPTSentencePieceTokenizer"
    for kind in SP_TYPES:
        args = parser.parse_args(["--tokenizer-type", kind, "--tokenizer-model", sp_model])
        assert tokenizer_type(args) == kind
    # no type: read as a tokenizer.json before ("not a Hugging Face tokenizer.json")
    with pytest.raises(
        ConfigError, match=f"^--tokenizer-model {sp_model}: a SentencePiece model .* --tokenizer-type"
    ):
        tokenizer_type(parser.parse_args(["--tokenizer-model", sp_model]))


@pytest.mark.parametrize(("kind", "noted"), [(k, k != "GPTSentencePieceTokenizer") for k in SP_TYPES])
def test_types_megatron_015_encodes_otherwise_are_noted(tmp_path, sp_model, write_jsonl, capsys, kind, noted):
    prepare(
        tmp_path, write_jsonl, ["--tokenizer-type", kind, "--tokenizer-model", sp_model, "--workers", "1"]
    )
    notes = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("note: --tokenizer-type")
    ]
    assert len(notes) == int(noted)
    assert all("Megatron-LM core 0.15 on encodes it as GPTSentencePieceTokenizer" in n for n in notes)
