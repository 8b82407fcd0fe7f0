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
