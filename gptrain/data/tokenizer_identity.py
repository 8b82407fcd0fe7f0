"""Which tokenizer a checkpoint was trained with, recorded beside it and checked when it is loaded.

A model's embedding row i means the token its tokenizer gives id i. A run resumed (or a model
evaluated) under another tokenizer whose padded vocabulary happens to be the same size loads
without complaint, and every id then means something else. The record holds:

  type, source   what the config named (for the message only: a copied file is the same tokenizer)
  vocab_size     the unpadded vocabulary
  eod            the end-of-document id (loss masks and attention resets depend on it)
  tokens         sha256 of the id -> token table, each token spelled as GPT-2's byte-level string
                 of its bytes (HF's own spelling for other tokenizers; NullTokenizer's are the ids
                 written out), so that GPT-2 given as
                 vocab.json + merges.txt, as its tokenizer.json or as tiktoken's encoding is one
                 tokenizer
  encodes        sha256 of the ids of a fixed text: merges, pre-tokenizer and normalizer (None where
                 they differ from call to call, BPE dropout: then not compared)
  encodes_compat the same of a second text (COMPAT_PROBE), of characters only a compatibility
                 normalizer (NFKC, NFKD) changes; compared where both records have it (written from
                 2026-11-30 on), so a record written before compares as it did
  pad            NullTokenizer's padding id (-1: none), whose labels leave the loss: another one
                 loads, said in one line
  split_special_tokens
                 (HuggingFaceTokenizer) whether tokenizer_config.json's split_special_tokens made a
                 literal special token's text stay text. gptrain read that key only from f34b196 on,
                 so a record without it was written reading such text as its token: it is compared as
                 that, and taken with a note where only the key differs (the ids mean the same tokens)

A tokenizer whose first `vocab_size` tokens and end-of-document id are the recorded ones is an
extension (tokens added at the end, as for a new domain's vocabulary): the trained rows keep their
meaning, so it loads, said in one line.

A run on mock data has no tokenizer: its record is {"type": "mock", "vocab_size": N}
(model.data.mock_vocab_size). Mock data against a real tokenizer, either way, is refused as another
tokenizer is (a mock run would cut a trained vocabulary to its own rows); a larger mock vocabulary
is an extension, a smaller one refused (it drops trained rows).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from typing import Any

from gptrain.data.gpt2_bpe import bytes_to_unicode
from gptrain.data.null_tokenizer import NullTokenizer
from gptrain.data.tokenizer_wrappers import HFTokenizer, SentencePieceTokenizer, TiktokenTokenizer
from gptrain.errors import GptrainError
from gptrain.utils.tokenizer_types import NO_PAD

PROBE = (
    "Hello, World! It's 2026: naïve café, Ünïcödé, 日本語のテキスト, Ελληνικά, emoji 🙂👍.\n\n"
    "  two spaces\ttab\r\nx = [1, 22, 333, 4444];  # code\n<|endoftext|>after the end"
)
"""Text whose ids show how a tokenizer encodes: mixed case, digits, accents, CJK, emoji, runs of
whitespace, code and the end-of-text token."""

COMPAT_PROBE = "ﬁ ²³ Ａｂｃ ①② ㎏ ½ ℌ ｶﾞ ǆ ™ Ⅻ … ſ\u00a0ﬂ"
"""Characters NFKC and NFKD change and NFC leaves alone (a ligature, superscripts, fullwidth and
halfwidth forms, circled digits, a squared unit, a fraction, letterlike and roman-numeral symbols,
an ellipsis, a long s, a no-break space): PROBE has none, so a compatibility normalizer added or
removed left its ids the same. A probe of its own, recorded under a key of its own, so that records
written before it still compare."""


@dataclass(frozen=True)
class Verdict:
    """How a tokenizer relates to a recorded one."""

    kind: str
    """'same', 'extension' or 'different'."""
    detail: str = ""
    """What differs (for 'different') or what was added (for 'extension')."""
    changes: str = "ids"
    """What a difference changes: 'ids' (their tokens), 'eod' or 'encoding' (the ids keep their tokens)."""


EFFECTS = {  # (refused, loaded anyway)
    "ids": ("its ids would mean other tokens than the trained embeddings", "its ids now mean other tokens"),
    "eod": (
        "its documents would end in another id than the one it was trained to end them with (loss mask)",
        "its documents now end in another id",
    ),
    "encoding": ("it would encode text otherwise than it was trained on", "it now encodes text otherwise"),
}


MOCK_EFFECTS = (
    "its trained vocabulary rows would be taken for other tokens (and cut off where this run has fewer)",
    "its trained vocabulary rows are taken for other tokens",
)
"""EFFECTS' pair for a change between mock data and a tokenizer (or a smaller mock vocabulary)."""


_TABLES: weakref.WeakKeyDictionary[Any, tuple[int, list[str | None]]] = weakref.WeakKeyDictionary()


def token_table(tokenizer: Any) -> list[str | None]:
    """Each id's token (None for an id the vocabulary skips). Kept per tokenizer while its size holds:
    a run start asks for it thrice (the checkpoint's record, its check, the data's fingerprint), each
    a quarter second for a 128k vocabulary. The list is shared: read it, do not change it."""
    size = getattr(tokenizer, "vocab_size", None)
    try:
        kept = _TABLES.get(tokenizer)
    except TypeError:  # a stand-in neither hashable nor weakly referable: not kept
        return _table_of(tokenizer)
    if kept is not None and kept[0] == size:
        return kept[1]
    table = _table_of(tokenizer)
    _TABLES[tokenizer] = (size, table)
    return table


def _table_of(tokenizer: Any) -> list[str | None]:
    if isinstance(tokenizer, HFTokenizer):
        return [tokenizer.tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    if isinstance(tokenizer, TiktokenTokenizer):
        alphabet = bytes_to_unicode()
        return [_spelled(_token_bytes(tokenizer, i), alphabet) for i in range(tokenizer.vocab_size)]
    if isinstance(tokenizer, SentencePieceTokenizer):
        return [_piece(tokenizer, i) for i in range(tokenizer.vocab_size)]
    if isinstance(tokenizer, NullTokenizer):  # each id is its own token, as its text is
        return [str(i) for i in range(tokenizer.vocab_size)]
    raise TypeError(f"no token table for {type(tokenizer).__name__}")


def _piece(tokenizer: SentencePieceTokenizer, index: int) -> str | None:
    """The model's piece, or the special token Megatron's SentencePieceTokenizer added at that id."""
    if index in tokenizer._names:
        return tokenizer._names[index]
    return tokenizer.processor.id_to_piece(index) if index < tokenizer.processor.get_piece_size() else None


def _token_bytes(tokenizer: TiktokenTokenizer, index: int) -> bytes | None:
    table = tokenizer._decode_table
    if table is not None:
        return table.get(index)
    try:
        return tokenizer.encoding.decode_single_token_bytes(index)
    except KeyError:  # cl100k_base leaves ids between its ranks and its special tokens unused
        return None


def _spelled(token: bytes | None, alphabet: dict[int, str]) -> str | None:
    return None if token is None else "".join(alphabet[b] for b in token)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=True).encode("ascii")).hexdigest()


def record(tokenizer: Any, kind: str, source: str) -> dict[str, Any]:
    """The record of `tokenizer` (of config type `kind`, read from `source`) to keep with a checkpoint."""
    table = token_table(tokenizer)
    split = splits_special_tokens(tokenizer)
    return {
        "type": kind,
        "source": source,
        "vocab_size": len(table),
        "eod": eod_id(tokenizer),
        "tokens": _digest(table),
        "encodes": _encodes(tokenizer),
        "encodes_compat": _encodes(tokenizer, COMPAT_PROBE),
        **({"pad": tokenizer.pad} if _has_pad(tokenizer, kind) else {}),
        **({} if split is None else {"split_special_tokens": split}),
    }


def _has_pad(tokenizer: Any, kind: str) -> bool:
    """Whether the tokenizer has a padding id to record: NullTokenizer's null_pad_id, a
    HuggingFaceTokenizer's pad_token (GPT-2's files read by `tokenizers` have none: one record)."""
    return isinstance(tokenizer, NullTokenizer) or (
        isinstance(tokenizer, HFTokenizer) and kind == "HuggingFaceTokenizer"
    )


def splits_special_tokens(tokenizer: Any) -> bool | None:
    """Whether a `tokenizers` tokenizer keeps a literal special token's text as text
    (tokenizer_config.json's split_special_tokens); None for other kinds."""
    if not isinstance(tokenizer, HFTokenizer):
        return None
    return bool(tokenizer.tokenizer.encode_special_tokens)


def _unsplit_encodes(tokenizer: Any) -> str | None:
    """The probe's digest as gptrain before f34b196 encoded it (special tokens' text as their ids),
    for a tokenizer that splits them now; None otherwise."""
    if splits_special_tokens(tokenizer) is not True:
        return None
    tokenizer.tokenizer.encode_special_tokens = False
    try:
        return _encodes(tokenizer)
    finally:
        tokenizer.tokenizer.encode_special_tokens = True


def _encodes(tokenizer: Any, probe: str = PROBE) -> str | None:
    """The digest of the `probe`'s ids; None where the model samples them (BPE dropout) or they
    differ from one call to the next: such a tokenizer's encoding is not compared, or its own run
    would be refused it.
    NullTokenizer's text is ids (its encoding is always the same): the digest of no ids."""
    if isinstance(tokenizer, NullTokenizer):
        return _digest([])
    if samples_encoding(tokenizer):
        return None
    ids, again = ([int(i) for i in tokenizer.encode(probe)] for _ in range(2))
    return _digest(ids) if ids == again else None


def samples_encoding(tokenizer: Any) -> bool:
    """Whether a `tokenizers` tokenizer's model has BPE dropout set (the wrapper's `.tokenizer`): read
    from the model, as encoding twice finds a small dropout only by chance."""
    model = getattr(getattr(tokenizer, "tokenizer", None), "model", None)
    dropout = getattr(model, "dropout", None)
    return isinstance(dropout, float) and dropout > 0


def eod_id(tokenizer: Any) -> int | None:
    """The end-of-document id; None for a tokenizer.json without one (a run that needs it says so)."""
    try:
        return int(tokenizer.eod)
    except GptrainError:
        return None


def compare(saved: dict[str, Any], live: dict[str, Any], live_table: list[str | None]) -> Verdict:
    """`live` (with its token table, for the extension check) against the `saved` record."""
    same_tokens, same_eod = saved.get("tokens") == live["tokens"], saved.get("eod") == live["eod"]
    same_encoding = all(
        None in pair or pair[0] == pair[1]
        for pair in ((saved.get(key), live.get(key)) for key in ("encodes", "encodes_compat"))
    )
    split = (saved.get("split_special_tokens"), live.get("split_special_tokens"))
    if same_tokens and same_eod and None not in split and split[0] != split[1]:
        return Verdict(
            "different",
            f"tokenizer_config.json's split_special_tokens is {str(split[1]).lower()}, not "
            f"{str(split[0]).lower()}: a literal special token's text is encoded otherwise",
            "encoding",
        )
    if same_tokens and same_eod and same_encoding:
        return Verdict("same")
    size, extends = saved.get("vocab_size"), not same_tokens and _extends(saved, live_table)
    if (same_tokens or extends) and not same_eod:  # the ids keep their tokens: the eod is what differs
        return Verdict("different", f"end-of-document id {live['eod']}, not {saved.get('eod')}", "eod")
    if same_tokens:
        return Verdict(
            "different",
            "the same tokens, but it encodes text otherwise: other merges, pre-tokenizer or a bos put first",
            "encoding",
        )
    if extends:
        return Verdict("extension", f"ids {size}-{live['vocab_size'] - 1} added")
    if size != live["vocab_size"]:
        return Verdict("different", f"{live['vocab_size']} tokens, not {size}")
    return Verdict("different", "the same size, other tokens")


def _extends(saved: dict[str, Any], live_table: list[str | None]) -> bool:
    """Whether the live tokens start with the saved ones and go on past them."""
    size = saved.get("vocab_size")
    return (
        isinstance(size, int)
        and 0 < size < len(live_table)
        and _digest(live_table[:size]) == saved.get("tokens")
    )


MOCK = "mock"
"""The record type of a run on mock data (no tokenizer)."""


def mock_record(vocab_size: int) -> dict[str, Any]:
    """The record of a run on mock data of `vocab_size` tokens."""
    return {"type": MOCK, "vocab_size": int(vocab_size)}


def _compare_mock(saved: dict[str, Any], live: dict[str, Any]) -> Verdict:
    """`live` against `saved` where one of them is mock data: the same mock vocabulary, a larger one
    (an extension: the trained rows are kept), or different."""
    if saved.get("type") != live.get("type"):
        return Verdict("different", "mock data and a tokenizer")
    size, now = saved.get("vocab_size"), live["vocab_size"]
    if size == now:
        return Verdict("same")
    if isinstance(size, int) and size < now:
        return Verdict("extension", f"ids {size}-{now - 1} added")
    return Verdict("different", f"{now} tokens, not {size}")


def describe(entry: dict[str, Any]) -> str:
    """'HuggingFaceTokenizer /data/tokenizer.json (61 tokens, sha256 1a2b3c4d)'; 'mock data
    (model.data.mock_vocab_size 512)'."""
    if entry.get("type") == MOCK:
        return f"mock data (model.data.mock_vocab_size {entry.get('vocab_size')})"
    return (
        f"{entry.get('type')} {entry.get('source')} "
        f"({entry.get('vocab_size')} tokens, sha256 {str(entry.get('tokens'))[:8]})"
    )


@dataclass(frozen=True)
class TokenizerCheck:
    """A live tokenizer's record, held to check checkpoints against and to record with new ones."""

    record: dict[str, Any]
    table: list[str | None]
    allow_change: bool = False
    """exp_manager.allow_tokenizer_change: a different tokenizer is a warning, not an error."""
    unsplit_encodes: str | None = None
    """The probe's digest with special tokens' text read as their ids, for a tokenizer that splits
    it: what a record written before gptrain read split_special_tokens holds."""

    @classmethod
    def of(cls, tokenizer: Any, kind: str, source: str, allow_change: bool = False) -> TokenizerCheck:
        table = token_table(tokenizer)
        return cls(record(tokenizer, kind, source), table, allow_change, _unsplit_encodes(tokenizer))

    @classmethod
    def mock(cls, vocab_size: int, allow_change: bool = False) -> TokenizerCheck:
        """The check of a run on mock data of `vocab_size` tokens."""
        return cls(mock_record(vocab_size), [], allow_change)

    def check(
        self,
        saved: dict[str, Any] | None,
        checkpoint: str,
        whose: str,
        fix: str,
        allow: str = "set exp_manager.allow_tokenizer_change=true",
    ) -> tuple[str | None, str | None]:
        """(an error, a note to log) for loading `checkpoint`, whose record is `saved`, under this
        tokenizer (`whose`: 'this run's model.tokenizer'); `fix`: what to do instead; `allow`: how
        this command is told to load it anyway (a command without overrides: a key in a file)."""
        if saved is None:
            return (
                None,
                f"{checkpoint} records no tokenizer (saved by an earlier gptrain, or without one): {whose} is not checked against it",
            )
        mock = MOCK in (saved.get("type"), self.record["type"])
        if not mock and (note := self._split_only_since(saved, checkpoint, whose)) is not None:
            return None, note
        verdict = _compare_mock(saved, self.record) if mock else compare(saved, self.record, self.table)
        if verdict.kind == "same":
            return None, _padding_change(saved, self.record, checkpoint, whose)
        live, trained = describe(self.record), describe(saved)
        if verdict.kind == "extension":
            return None, (
                f"{whose} {live} extends the tokenizer {checkpoint} was trained with ({trained}): "
                f"{verdict.detail}, whose rows start as the checkpoint's padding rows"
            )
        text = f"{checkpoint} was trained with tokenizer {trained}, {whose} is {live} ({verdict.detail})"
        refused, loaded = MOCK_EFFECTS if mock else EFFECTS[verdict.changes]
        if mock:  # most often two runs sharing one results directory, not a tokenizer mistyped
            fix = f"{fix}, or start this run in its own directory (another run.name or exp_manager.explicit_log_dir)"
        if self.allow_change:
            return None, f"{text}; loaded anyway (exp_manager.allow_tokenizer_change=true): {loaded}"
        return f"{text}: {refused}; {fix}, or {allow} to go on with this one", None

    def _split_only_since(self, saved: dict[str, Any], checkpoint: str, whose: str) -> str | None:
        """A note where `saved` predates the split_special_tokens key (so was trained reading a literal
        special token's text as its token) and is this tokenizer read that way: the ids mean the same
        tokens, and only such text in generate/eval/new data is encoded as text now, as AutoTokenizer
        (and Megatron's HuggingFaceTokenizer) encode it. None otherwise (compared as usual)."""
        if "split_special_tokens" in saved or self.unsplit_encodes is None:
            return None
        if compare(saved, self.record | {"encodes": self.unsplit_encodes}, self.table).kind != "same":
            return None
        return (
            f"{checkpoint} was trained by a gptrain that ignored tokenizer_config.json's "
            f"split_special_tokens: true, reading a literal special token's text (such as "
            f"<|endoftext|>) as its id; {whose} {describe(self.record)} now keeps such text as text, as "
            "AutoTokenizer does (same ids and tokens; data prepared before keeps its ids)"
        )


def _padding_change(saved: dict[str, Any], live: dict[str, Any], checkpoint: str, whose: str) -> str | None:
    """A note where the padding id (NullTokenizer's model.tokenizer.null_pad_id, a HuggingFaceTokenizer's
    pad_token) differs from the one `checkpoint` was trained with: the ids keep their meaning, so it
    loads, but the loss masks other labels. A NullTokenizer record from before it was kept has none:
    nothing to say; a HuggingFaceTokenizer one was trained before gptrain masked its pad_token."""
    if "pad" not in live:
        return None
    hf = live.get("type") != "NullTokenizer"
    if "pad" not in saved and not (hf and live["pad"] >= 0):
        return None
    trained = saved.get("pad", NO_PAD)
    if trained == live["pad"]:
        return None

    def named(pad: int) -> str:
        return str(pad) if pad >= 0 else "none"

    what = "its pad_token's id" if hf else "NullTokenizer's padding id"
    where = "" if hf else " (model.tokenizer.null_pad_id)"
    if "pad" not in saved:  # an HF record from before gptrain recorded (or masked) the pad_token
        return (
            f"{checkpoint} records no padding id (saved by a gptrain before it recorded one; one before it "
            f"masked a pad_token masked none); {whose} masks {what} {live['pad']} as Megatron's GPT dataset "
            "does: where the checkpoint's run masked none, the loss leaves out other labels as padding than it did"
        )
    # not which labels: model.data.allow_ambiguous_pad_tokens decides for a padding id that is the eod
    return (
        f"{checkpoint} was trained with {what} {named(trained)}{where}, {whose} has {named(live['pad'])}: "
        "the loss leaves out other labels as padding than the checkpoint's run did"
    )
