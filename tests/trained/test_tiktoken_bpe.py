"""tiktoken ranks -> GPT-2's vocab.json + merges.txt: taken only where they encode exactly."""

from __future__ import annotations

import tiktoken

from gptrain.data.gpt2_bpe import GPT2_PATTERN
from gptrain.data.tokenizer_wrappers import TiktokenTokenizer
from gptrain.trained.hf.tiktoken_bpe import _merges, gpt2_bpe_of, write_gpt2_bpe

BYTES = {bytes([b]): b for b in range(256)}


def tokenizer(ranks: dict[bytes, int], pattern: str = GPT2_PATTERN) -> TiktokenTokenizer:
    eot = max(ranks.values()) + 1
    encoding = tiktoken.Encoding(
        name="t", pat_str=pattern, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eot}
    )
    return TiktokenTokenizer(encoding, eot, eot + 1, frozenset({"<|endoftext|>"}))


def test_each_token_is_merged_from_the_pair_bpe_over_lower_ranks_leaves():
    ranks = BYTES | {b"ab": 256, b"abc": 257, b"bc": 258, b"xabc": 259}
    assert _merges(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c"), (b"x", b"abc")]


def test_a_token_no_merge_of_lower_ranks_reaches_has_no_merges():
    """abc ranked before both ab and bc: BPE never makes it, so no merges.txt encodes as tiktoken."""
    assert _merges(BYTES | {b"abc": 256, b"ab": 257, b"bc": 258}) is None
    assert _merges({b"a": 0}) is None  # bytes without a token of their own


def test_the_files_are_written_only_when_they_read_back_as_the_same_ranks(tmp_path):
    good = tokenizer(BYTES | {b"ab": 256, b" a": 257})
    assert write_gpt2_bpe(good, tmp_path)
    assert (tmp_path / "merges.txt").read_text(encoding="utf-8") == "#version: 0.2\na b\nĠ a\n"
    assert gpt2_bpe_of(tokenizer(BYTES | {b"ab": 256}, pattern=r"\S+|\s+")) is None  # not GPT-2's split
