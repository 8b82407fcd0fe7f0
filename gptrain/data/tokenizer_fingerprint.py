"""Which vocabulary prepared data was encoded with: the `vocabulary` its tokenizer record keeps.

The type alone let data tokenized with one GPT-2 vocab.json (or tokenizer.json, or SentencePiece
model) train under another of the same type: every id then meant another token. The fingerprint is
of what the ids mean, not of the files' bytes: the id -> token table (tokenizer_identity's, each
token spelled as GPT-2's byte-level string, so that GPT-2's vocab.json + merges.txt and its
tokenizer.json agree), the ids of two fixed texts (merges, pre-tokenizer, normalizer; the second,
`encodes_compat`, of characters only NFKC changes, compared where both records have it), the
end-of-document id and the size. A copy, a reformatted JSON file or the same vocabulary in another
format is the same; other merges of the same tokens are not. `files` only names them in messages.

Data whose run tokenizer extends the recorded one (its first ids are the recorded tokens, same
end-of-document id) is taken: its ids keep their meaning. A record without a fingerprint (written
before) is not checked. Standard library only at import: the launch preflight computes the table
of a vocab.json or tokenizer.json with json alone (tokenizer_identity needs the tokenizer loaded).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple


def digest(value: object) -> str:
    """sha256 of `value` as ASCII JSON: tokenizer_identity's digest, so tables compare across both."""
    return hashlib.sha256(json.dumps(value, ensure_ascii=True).encode("ascii")).hexdigest()


def probe_text() -> str:
    """tokenizer_identity's probe without its <|endoftext|>: how that one literal is encoded is the
    record's `legacy`, checked on its own (so one difference is said once)."""
    from gptrain.data.tokenizer_identity import PROBE

    return PROBE.replace("<|endoftext|>", "")


def compat_probe_text() -> str:
    """tokenizer_identity's COMPAT_PROBE: characters only a compatibility normalizer (NFKC) changes."""
    from gptrain.data.tokenizer_identity import COMPAT_PROBE

    return COMPAT_PROBE


def fingerprint(tokenizer: Any, files: list[str]) -> tuple[dict[str, Any], list[str | None]]:
    """(the fingerprint of a loaded `tokenizer` read from `files`, its token table)."""
    from gptrain.data.tokenizer_identity import eod_id, splits_special_tokens, token_table

    table = token_table(tokenizer)
    split = splits_special_tokens(tokenizer)
    return {
        "files": [_absolute(file) for file in files],
        "size": len(table),
        "tokens": digest(table),
        "encodes": _encodes(tokenizer, probe_text()),
        "encodes_compat": _encodes(tokenizer, compat_probe_text()),
        "eod": eod_id(tokenizer),
        **({} if split is None else {"split_special_tokens": split}),
    }, table


def _encodes(tokenizer: Any, probe: str) -> str | None:
    """The digest of the `probe`'s ids; None where the tokenizer cannot encode it (a word-level
    vocabulary without an unknown token) or samples its encoding (BPE dropout): then not compared.
    Dropout is read from the model, not found by encoding twice: a small one mostly encodes the
    probe alike, so records of one tokenizer.json differed by chance."""
    from gptrain.data.tokenizer_identity import samples_encoding

    if samples_encoding(tokenizer):
        return None
    try:
        ids, again = (tokenizer.encode(probe) for _ in range(2))
    except Exception:  # whatever a tokenizer library raises on text it has no tokens for
        return None
    return digest([int(i) for i in ids]) if list(ids) == list(again) else None


def _absolute(file: str) -> str:
    """A path as absolute (the message names it wherever the command ran); a tiktoken encoding's
    name as given."""
    return os.path.abspath(file) if os.path.exists(file) else file


class Consequences(NamedTuple):
    """What each difference does, said after it: to a run of the data, or to a merge of two."""

    eod: str
    encodes: str
    tokens: str


FOR_A_RUN = Consequences(
    "the data's documents end in an id this run does not take as their end (loss mask, attention reset)",
    "generate, eval and export would encode text otherwise than the data",
    "another vocabulary, so the data's ids would mean other tokens",
)
FOR_A_MERGE = Consequences(
    "the merged documents would end in either id, and a run takes one alone as their end",
    "the merged data would hold text encoded two ways",
    "another vocabulary, so the same id means other tokens in each",
)


def difference(
    recorded: dict[str, Any],
    live: dict[str, Any],
    live_table: list[str | None] | None,
    consequences: Consequences = FOR_A_RUN,
    read_as: tuple[str, str] | None = None,
) -> str | None:
    """What differs between the data's fingerprint and a run's, or another dataset's (None where its
    ids mean the same tokens: the same vocabulary, or one extending it, ending documents alike).
    `live` may lack `encodes` and `eod` (the preflight's, from the files alone), and `encodes` may be
    None (BPE dropout): those are then not compared; `split_special_tokens` (HuggingFaceTokenizer's
    tokenizer_config.json key; the probe holds no special token's text) where both have it.
    `read_as`: (the data's type, the run's) where both read the same files (same_files_other_types)."""
    same_tokens = recorded.get("tokens") == live.get("tokens")
    types = (
        f"the same files, read as {read_as[0]} by the data and as {read_as[1]} by the run" if read_as else ""
    )
    aside = f" ({types})" if types else ""
    if not same_tokens and not _extends(recorded, live_table):
        if recorded.get("size") != live.get("size"):
            return f"{live.get('size')} tokens, not {recorded.get('size')}{aside}: {consequences.tokens}"
        return f"the same size, other tokens at the same ids{aside}: {consequences.tokens}"
    if "eod" in live and recorded.get("eod") != live["eod"]:
        return f"end-of-document id {live['eod']}, not {recorded.get('eod')}{aside}: {consequences.eod}"
    split = (recorded.get("split_special_tokens"), live.get("split_special_tokens"))
    if None not in split and split[0] != split[1]:
        return (
            f"tokenizer_config.json's split_special_tokens {str(split[1]).lower()}, not "
            f"{str(split[0]).lower()} (a literal special token's text is encoded otherwise): {consequences.encodes}"
        )
    encodes = [(recorded.get(key), live.get(key)) for key in ("encodes", "encodes_compat")]
    if same_tokens and any(None not in pair and pair[0] != pair[1] for pair in encodes):
        return (
            f"{ENCODED_OTHERWISE} (other merges, pre-tokenizer or normalizer, or a bos "
            f"put first{'; ' + types if types else ''}): {consequences.encodes}"
        )
    return None


ENCODED_OTHERWISE = "the same tokens, but text is encoded otherwise"

READING_CHANGED = (
    "the data names these same files, read as the same type: where they are unchanged since, gptrain's reading"
    " of them changed (it now takes the tokenizer class named only in config.json, by tokenizer_class or"
    " model_type, and a --legacy-tokenizer merges.txt without its #version header or final newline, as"
    " transformers and Megatron read them), so data prepared before encodes text otherwise than gptrain,"
    " transformers and Megatron now do: re-tokenize it (gptrain data prepare)"
)
KEEP_JSON_AS_IT_IS = (
    ", or keep the earlier reading of a tokenizer.json by naming its class in tokenizer_config.json"
    ' ("tokenizer_class": "PreTrainedTokenizerFast"), which transformers too then reads as it is'
)


def reading_changed_advice(record: dict[str, Any], live: dict[str, Any], why: str, allow: str) -> str | None:
    """The advice where the data names the run's own files as the same type and only their encoding
    differs: pointing at "the files the data was tokenized with" misled, as these are they; what
    changed may be gptrain's reading of them (data prepared before it read config.json's class, or a
    merges.txt without its header, as transformers and Megatron do). None otherwise."""
    from gptrain.utils.tokenizer_types import megatron_tokenizer_type

    recorded = record.get("vocabulary") or {}
    kind = megatron_tokenizer_type(record.get("type")) or record.get("type")
    same = recorded.get("files") and recorded.get("files") == live.get("files")
    if not (same and kind == (megatron_tokenizer_type(live.get("type")) or live.get("type"))):
        return None
    if not why.startswith(ENCODED_OTHERWISE) or recorded.get("tokens") != live.get("tokens"):
        return None
    keep = KEEP_JSON_AS_IT_IS if kind == "HuggingFaceTokenizer" else ""
    return f"{READING_CHANGED}{keep}" + (f", or {allow} to go on with this one" if allow else "")


def same_files_other_types(record: dict[str, Any], live: dict[str, Any]) -> tuple[str, str] | None:
    """(the data's type, the run's) where the run reads the files the data was prepared from as
    another of Megatron's types (Llama2Tokenizer, which puts the model's bos first, against
    GPTSentencePieceTokenizer on one tokenizer.model); None otherwise."""
    from gptrain.utils.tokenizer_types import megatron_tokenizer_type

    recorded = record.get("vocabulary")
    files = recorded.get("files") if isinstance(recorded, dict) else None
    types = [megatron_tokenizer_type(kind) or str(kind) for kind in (record.get("type"), live.get("type"))]
    if not files or files != live.get("files") or types[0] == types[1]:
        return None
    return types[0], types[1]


def _extends(recorded: dict[str, Any], live_table: list[str | None] | None) -> bool:
    """Whether the run's tokens start with the recorded ones and go on past them."""
    size = recorded.get("size")
    return (
        live_table is not None
        and isinstance(size, int)
        and 0 < size < len(live_table)
        and digest(live_table[:size]) == recorded.get("tokens")
    )


def describe(kind: object, entry: dict[str, Any]) -> str:
    """'GPT2BPETokenizer /data/vocab.json + /data/merges.txt'."""
    files = entry.get("files") or ["(files not recorded)"]
    return f"{kind} {' + '.join(map(str, files))}"


def vocabulary_conflict(
    prefixes: list[str],
    live: Callable[[], tuple[dict[str, Any], list[str | None] | None] | None],
    run: str,
    keys: str,
    where: str,
    allow: str,
) -> tuple[str, str] | None:
    """(what differs, what to do) for the first prefix whose recorded vocabulary is not the run's,
    else None. `live()` gives the run's fingerprint and table, asked for only where a record has a
    fingerprint (None: it cannot be told here); `run` names the run's tokenizer ('model.tokenizer'),
    `keys` its file keys for the advice, `allow` the key that goes on anyway, `where` what names the
    prefixes ('' for none)."""
    from gptrain.data.blend_spec import strip_suffix
    from gptrain.data.tokenizer_record import read_tokenizer_record, record_path

    live_once = functools.cache(live)
    for prefix in map(strip_suffix, prefixes):  # data_prefix may name X.bin or X.idx for X
        record = read_tokenizer_record(prefix)
        recorded = record.get("vocabulary") if record is not None else None
        if not isinstance(recorded, dict):
            continue
        if (current := live_once()) is None:
            return None
        read_as = same_files_other_types(record, current[0])
        why = difference(recorded, *current, read_as=read_as)
        if why is None:
            continue
        lead = f"{where}: " if where else ""
        text = (
            f"{lead}{prefix} was tokenized with {describe(record.get('type'), recorded)} "
            f"({record_path(prefix)}), {run} is {describe(current[0].get('type'), current[0])}: {why}"
        )
        point = f"point {keys} at the files the data was tokenized with"
        if read_as is not None:
            point = f"set {run}.type={read_as[0]}, as the data was tokenized"
        advice = reading_changed_advice(record, current[0], why, allow) or (
            f"re-tokenize the data with {run}'s files (gptrain data prepare), or {point}, or {allow} to go on "
            "with this one"
        )
        return text, advice
    return None


def table_from_files(kind: str | None, vocab_file: str | None, model: str | None) -> list[str | None] | None:
    """The token table tokenizer_identity gives the loaded tokenizer, read with json alone from a
    GPT-2 vocab.json (`kind` 'gpt2') or a tokenizer.json ('huggingface'); None where the files do not
    tell it here (another type, a file that does not parse, a vocab.json token outside GPT-2's byte
    alphabet, which the loaders spell otherwise)."""
    if kind == "gpt2":
        vocab = json_or_none(vocab_file)
        if not isinstance(vocab, dict) or not all(map(_is_byte_level, vocab)):
            return None
        return _table(vocab.items())
    if kind == "huggingface" and model:
        path = Path(model)
        data = json_or_none(str(path / "tokenizer.json") if path.is_dir() else model)
        return _tokenizer_json_table(data) if isinstance(data, dict) else None
    return None


def renumbered_added_tokens_note(model: str | None) -> str | None:
    """A note where a tokenizer.json gives an added token another "id" than the library gives it
    (a hand-edited file): the data holds the library's id, not the one its user wrote and expects."""
    path = Path(model or "")
    file = path / "tokenizer.json" if path.is_dir() else path
    data = json_or_none(str(file)) if model else None
    table = _tokenizer_json_table(data) if isinstance(data, dict) else None
    if table is None:
        return None
    given = {token.get("content"): token.get("id") for token in data.get("added_tokens") or []}
    loaded = {token: index for index, token in enumerate(table) if token in given}
    moved = [(token, given[token], loaded[token]) for token in given if loaded.get(token) != given[token]]
    if not moved:
        return None
    token, written, gets = moved[0]
    more = f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""
    return (
        f'note: {file}: its added token {token!r} has "id": {written}{more}, which the tokenizers library '
        f"(so transformers and Megatron too) does not read: it gives the token {gets}, the id the data holds; "
        "write the ids it gives in the file to make it say so"
    )


def _tokenizer_json_table(data: dict[str, Any]) -> list[str | None] | None:
    """A tokenizer.json's id -> token table as `tokenizers` loads it: its model's vocabulary (a
    {token: id} mapping, or Unigram's list of [piece, score], numbered in order), then its added
    tokens, whose "id" the library does not read: one of the vocabulary keeps that id, the others
    take the ids from the vocabulary's length on, in the order listed."""
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        pairs = list(vocab.items())
    elif isinstance(vocab, list) and all(isinstance(entry, list) and entry for entry in vocab):
        pairs = [(entry[0], i) for i, entry in enumerate(vocab)]
    else:
        return None
    ids, next_id = dict(pairs), len(pairs)
    for token in data.get("added_tokens") or []:
        content = token.get("content") if isinstance(token, dict) else None
        if not isinstance(content, str):
            return None
        if content not in ids:
            ids[content], next_id = next_id, next_id + 1
    return _table(ids.items())


def _table(pairs: Any) -> list[str | None] | None:
    """The list indexed by id (None where no token has it), or None for a pair that is not
    (string, id)."""
    by_id: dict[int, str] = {}
    for token, index in pairs:
        if not isinstance(token, str) or not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return None
        by_id[index] = token
    if not by_id:
        return None
    table: list[str | None] = [None] * (max(by_id) + 1)
    for index, token in by_id.items():
        table[index] = token
    return table


_BYTE_ALPHABET: frozenset[str] | None = None


def _is_byte_level(token: str) -> bool:
    """Whether every character of `token` is one of GPT-2's 256 byte characters."""
    global _BYTE_ALPHABET
    if _BYTE_ALPHABET is None:
        printable = [
            *range(ord("!"), ord("~") + 1),
            *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1),
        ]
        _BYTE_ALPHABET = frozenset(map(chr, printable)) | frozenset(
            chr(256 + n) for n in range(256 - len(printable))
        )
    return all(char in _BYTE_ALPHABET for char in token)


def json_or_none(path: str | None) -> Any:
    """A JSON file's content, or None where it is not there or does not parse (the job says why)."""
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
