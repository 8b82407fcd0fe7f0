"""A tiktoken encoding with GPT-2's split (gpt2, r50k_base, p50k_base) as GPT-2's vocab.json +
merges.txt, so that an export of a run trained with it ships a tokenizer transformers loads (no torch).

tiktoken keeps only each token's rank; byte-level BPE merges the lowest-ranked adjacent pair
first, so the pair a token was merged from is what BPE over the lower ranks leaves of its bytes.
The files are taken only when reading them back gives the encoding's very ranks, split and
end-of-text id: then they encode every text as the encoding does.
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from gptrain.data.gpt2_bpe import ENDOFTEXT, GPT2_PATTERN, bytes_to_unicode, load_gpt2_bpe
from gptrain.data.tokenizer_wrappers import TiktokenTokenizer
from gptrain.errors import GptrainError

# tiktoken's spellings of GPT-2's split: the possessive one of tiktoken 0.8 on, and the one before
GPT2_PATTERNS = (
    GPT2_PATTERN,
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
)


@functools.lru_cache(maxsize=2)  # export asks before writing, then writes: seconds for 50k tokens
def gpt2_bpe_of(tokenizer: Any) -> tuple[str, str] | None:
    """(vocab.json, merges.txt) texts of a tiktoken encoding with GPT-2's split and <|endoftext|> as
    its only special token, when read back they give its very ranks and end-of-text id; else None."""
    if not isinstance(tokenizer, TiktokenTokenizer) or tokenizer._decode_table is not None:
        return None
    encoding = tokenizer.encoding
    if encoding._pat_str not in GPT2_PATTERNS or set(encoding._special_tokens) != {ENDOFTEXT}:
        return None
    ranks: dict[bytes, int] = encoding._mergeable_ranks
    merges = _merges(ranks)
    if merges is None:
        return None
    alphabet = bytes_to_unicode()

    def spelled(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {spelled(token): rank for token, rank in ranks.items()}
    vocab[ENDOFTEXT] = encoding._special_tokens[ENDOFTEXT]
    files = (
        json.dumps(vocab, ensure_ascii=False),
        "#version: 0.2\n" + "".join(f"{spelled(left)} {spelled(right)}\n" for left, right in merges),
    )
    return files if _reads_back(files, tokenizer) else None


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]] | None:
    """Each multi-byte token's pair, in rank order; None when a token is not reached by merging
    lower-ranked pairs (or a byte has no token of its own): no merges.txt encodes as it does."""
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            lowest, at = min((ranks.get(parts[i] + parts[i + 1], math.inf), i) for i in range(len(parts) - 1))
            if lowest >= rank:
                return None
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        merges.append((parts[0], parts[1]))
    return merges


def _reads_back(files: tuple[str, str], tokenizer: TiktokenTokenizer) -> bool:
    """Whether gptrain's GPT-2 BPE of the files has the encoding's ranks and end-of-text id."""
    with tempfile.TemporaryDirectory() as directory:
        vocab_file, merge_file = Path(directory) / "vocab.json", Path(directory) / "merges.txt"
        vocab_file.write_text(files[0], encoding="utf-8")
        merge_file.write_text(files[1], encoding="utf-8")
        try:
            again = load_gpt2_bpe(str(vocab_file), str(merge_file), backend="tiktoken")
        except GptrainError:
            return False
    return (
        isinstance(again, TiktokenTokenizer)
        and again.encoding._mergeable_ranks == tokenizer.encoding._mergeable_ranks
        and again.eod == tokenizer.eod
    )


def write_gpt2_bpe(tokenizer: Any, directory: Path) -> bool:
    """Write vocab.json + merges.txt of `tokenizer` into `directory` when they encode exactly as it
    does; whether they were written."""
    files = gpt2_bpe_of(tokenizer)
    if files is None:
        return False
    (directory / "vocab.json").write_text(files[0], encoding="utf-8")
    (directory / "merges.txt").write_text(files[1], encoding="utf-8")
    return True
