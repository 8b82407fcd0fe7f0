"""The Tokenizer protocol and its tiktoken, HF tokenizers and SentencePiece classes (loaders apart)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from gptrain.errors import DataError
from gptrain.utils.tokenizer_types import NO_PAD

# End-of-document candidates for a bare tokenizer.json without tokenizer_config.json.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "<|eot_id|>")


class Tokenizer(Protocol):
    vocab_size: int  # unpadded: decides the token dtype (Megatron's rule)

    @property
    def eod(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids back to back, and each text's token count (the fast path of prepare)."""
        ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


def vocabulary_entries(tokenizer: Tokenizer) -> int:
    """How many tokens the vocabulary holds (Megatron's len(tokenizer), which picks the .bin's
    dtype): fewer than vocab_size where the ids have gaps."""
    return getattr(tokenizer, "entries", tokenizer.vocab_size)


def flat_ids(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's ids back to back, and each text's count: encode_flat from per-text id lists."""
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    return tokens, lengths


class TiktokenTokenizer:
    """A tiktoken encoding; `decode_table` covers vocab entries tiktoken cannot hold; `bos_id` a
    beginning-of-sequence token distinct from EOD (Megatron's TikTokenizer's <s>), else None."""

    def __init__(
        self,
        encoding: Any,
        eod: int,
        vocab_size: int,
        allowed_special: frozenset[str],
        decode_table: dict[int, bytes] | None = None,
        bos_id: int | None = None,
        entries: int | None = None,
    ) -> None:
        self.encoding = encoding
        self._eod = eod
        self.vocab_size = vocab_size
        self.entries = vocab_size if entries is None else entries  # fewer where ids have gaps
        self._special = allowed_special
        self._decode_table = decode_table
        self.bos_id = bos_id

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special=self._special, disallowed_special=())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_batch(texts, allowed_special=self._special, disallowed_special=())

    def _encode_array(self, text: str) -> np.ndarray:
        try:
            return self.encoding.encode_to_numpy(text, allowed_special=self._special, disallowed_special=())
        except UnicodeEncodeError:  # lone surrogates: tiktoken's list path repairs them
            return np.asarray(self.encode(text), dtype=np.uint32)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        arrays = [self._encode_array(text) for text in texts]
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        tokens = np.concatenate(arrays) if arrays else np.empty(0, np.uint32)
        return tokens, lengths

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = [int(i) for i in ids]
        try:
            if self._decode_table is None:
                return self.encoding.decode(ids)
            return b"".join(self._decode_table[i] for i in ids).decode("utf-8", errors="replace")
        except (KeyError, ValueError, OverflowError):
            bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
            raise DataError(
                f"token id {bad} is not in this tokenizer's vocabulary (wrong tokenizer?)"
            ) from None


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer, special tokens added as `AutoTokenizer` does."""

    def __init__(
        self, tokenizer: Any, eod: int | None, source: str, no_eod: str | None = None, pad: int = NO_PAD
    ) -> None:
        self.tokenizer = tokenizer
        self._eod = eod
        self.pad = pad  # the pad_token (special_token), whose labels leave the loss; -1: none
        self.source = source
        self._no_eod = no_eod  # why there is no end-of-document id, where the default line is wrong
        # the highest id + 1, not the count: a tokenizer.json may leave ids unassigned (a vocab
        # numbered with gaps), and every id it emits needs an embedding row
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self.entries = len(vocab)  # Megatron's len(tokenizer), which picks the token dtype

    @property
    def eod(self) -> int:
        if self._eod is None and self._no_eod is not None:
            raise DataError(self._no_eod)
        if self._eod is None:
            raise DataError(
                f"{self.source}: no end-of-document token found (none of {', '.join(EOS_CANDIDATES)}); "
                "put a tokenizer_config.json with eos_token next to tokenizer.json"
            )
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat_ids(self.encode_batch(list(texts)))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


class SentencePieceTokenizer:
    """A SentencePiece model encoded as one of Megatron's three wrappers of it encodes.

    GPTSentencePieceTokenizer: the model's ids alone, EOD its eos. Llama2Tokenizer: its bos first,
    EOD its eos. SentencePieceTokenizer: Megatron's added special tokens (`specials`, some past the
    model's pieces, so in vocab_size), a literal one in the text becoming its id, EOD `<EOD>`.
    """

    def __init__(
        self,
        processor: Any,
        source: str,
        eod: int | None,
        vocab_size: int,
        bos: int | None = None,
        specials: dict[str, int] | None = None,
    ) -> None:
        self.processor = processor
        self.source = source
        self._eod = eod
        self.vocab_size = vocab_size
        self._bos = bos
        self._specials = specials or {}
        self._names = {token_id: token for token, token_id in self._specials.items()}
        # leftmost special first and, at one position, the first added: Megatron's search order
        self._split = re.compile("|".join(map(re.escape, self._specials))) if self._specials else None

    @property
    def specials(self) -> dict[str, int]:
        """Megatron SentencePieceTokenizer's added special tokens and their ids (empty for the others)."""
        return dict(self._specials)

    @property
    def bos_id(self) -> int | None:
        """The model's bos piece (Megatron's added <BOS> for SentencePieceTokenizer), None if none."""
        if "<BOS>" in self._specials or self.processor.bos_id() < 0:
            return self._specials.get("<BOS>")
        return self.processor.bos_id()

    @property
    def eod(self) -> int:
        if self._eod is None:
            raise DataError(
                f"{self.source}: the SentencePiece model has no end-of-sentence piece (eos_id=-1) to "
                "end documents; train it with an eos piece, or use SentencePieceTokenizer (adds <EOD>)"
            )
        return self._eod

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            ids = self.processor.encode(text)
        else:
            ids, start = [], 0
            for match in self._split.finditer(text):
                ids += self.processor.encode(text[start : match.start()])
                ids.append(self._specials[match.group()])
                start = match.end()
            ids += self.processor.encode(text[start:])
        return ids if self._bos is None else [self._bos, *ids]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat_ids(self.encode_batch(list(texts)))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """As Megatron's detokenize: a special token stands apart, a space either side of it."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise DataError(f"token id {bad} is not in this tokenizer's vocabulary (wrong tokenizer?)")
        text, start = "", 0
        for position, token_id in enumerate(ids):
            if token_id in self._names:
                text += f"{self.processor.decode(ids[start:position])} {self._names[token_id]} "
                start = position + 1
        return text + self.processor.decode(ids[start:])
