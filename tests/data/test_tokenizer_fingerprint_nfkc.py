"""The vocabulary fingerprint (data) and the checkpoint's tokenizer record see a compatibility
normalizer (NFKC): their probe had no character that NFKC changes and NFC leaves alone, so a
tokenizer.json with an NFKC normalizer added or removed was taken as the same tokenizer. A second
probe of such characters is recorded under a key of its own; records written before, which lack it,
compare as before."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from gptrain.data.gpt2_bpe import gpt2_tokenizer_json
from gptrain.data.tokenizer_fingerprint import difference, fingerprint
from gptrain.data.tokenizer_identity import COMPAT_PROBE, TokenizerCheck
from gptrain.data.tokenizers import build_tokenizer


def test_every_character_of_the_second_probe_is_one_nfkc_changes_and_nfc_keeps():
    characters = set(COMPAT_PROBE) - {" "}
    assert len(characters) >= 8
    for char in characters:
        assert unicodedata.normalize("NFC", char) == char, repr(char)
        assert unicodedata.normalize("NFKC", char) != char, repr(char)


@pytest.fixture
def plain_and_nfkc(tmp_path: Path, gpt2_files: tuple[str, str]):
    """GPT-2's tokenizer.json as it is, and the same file with an NFKC normalizer."""
    data = json.loads(gpt2_tokenizer_json(*gpt2_files))
    tokenizers = []
    for name, normalizer in (("plain", None), ("nfkc", {"type": "NFKC"})):
        path = tmp_path / name / "tokenizer.json"
        path.parent.mkdir()
        path.write_text(json.dumps(data | {"normalizer": normalizer}), encoding="utf-8")
        tokenizers.append((build_tokenizer("HuggingFaceTokenizer", model=str(path)), str(path)))
    plain, nfkc = tokenizers
    assert plain[0].encode(COMPAT_PROBE) != nfkc[0].encode(COMPAT_PROBE)
    return plain, nfkc


def test_the_data_fingerprint_tells_an_nfkc_normalizer_apart(plain_and_nfkc):
    (plain, plain_file), (nfkc, nfkc_file) = plain_and_nfkc
    recorded, _ = fingerprint(plain, [plain_file])
    live, table = fingerprint(nfkc, [nfkc_file])
    assert difference(recorded, live, table) == (
        "the same tokens, but text is encoded otherwise (other merges, pre-tokenizer or normalizer, or a bos put "
        "first): "
        "generate, eval and export would encode text otherwise than the data"
    )
    assert difference(recorded, fingerprint(plain, [nfkc_file])[0], table) is None
    older = {key: value for key, value in recorded.items() if key != "encodes_compat"}
    assert difference(older, live, table) is None  # a record written before compares as before
    assert difference(recorded, {k: v for k, v in live.items() if k != "encodes_compat"}, table) is None


def test_the_checkpoint_check_tells_an_nfkc_normalizer_apart(plain_and_nfkc):
    (plain, plain_file), (nfkc, nfkc_file) = plain_and_nfkc
    saved = TokenizerCheck.of(plain, "HuggingFaceTokenizer", plain_file).record
    error, note = TokenizerCheck.of(nfkc, "HuggingFaceTokenizer", nfkc_file).check(
        saved, "ckpt", "this run's model.tokenizer", "use the checkpoint's tokenizer"
    )
    assert note is None and error is not None
    assert "(the same tokens, but it encodes text otherwise" in error
    assert "it would encode text otherwise than it was trained on" in error
    check = TokenizerCheck.of(plain, "HuggingFaceTokenizer", nfkc_file)
    assert check.check(saved, "ckpt", "this run's model.tokenizer", "x") == (None, None)
    older = {key: value for key, value in saved.items() if key != "encodes_compat"}
    nfkc_check = TokenizerCheck.of(nfkc, "HuggingFaceTokenizer", nfkc_file)
    assert nfkc_check.check(older, "ckpt", "this run's model.tokenizer", "x") == (None, None)
