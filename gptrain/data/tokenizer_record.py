"""The tokenizer settings a prepared dataset was encoded with, kept beside its .bin/.idx (no torch).

`<prefix>.tokenizer` (JSON) holds the type and Megatron's --legacy-tokenizer: with it GPT-2 BPE kept
a literal <|endoftext|> in the text as text, which neither the .bin nor the .idx shows. A run
whose model.tokenizer.legacy differs trains on the same ids, but encodes text (generate, eval, the
export's tokenizer) otherwise than its data was: training checks it, as it checks a checkpoint's
tokenizer (refused, or a warning with exp_manager.allow_tokenizer_change). Megatron reads no such
file, but its tools/merge_datasets.py takes every file in its --input directory as `<stem><ext>` and
stops unless `<stem>.bin`/`.idx` exist: the record's stem is the prefix itself for that (the first
name, `<prefix>.tokenizer.json`, stopped it; still read). `gptrain data merge` carries the record
its inputs share. A dataset without one (Megatron's, gptrain's before it, a merge of inputs without
one common record) is not checked.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gptrain.data.blend_spec import strip_suffix
from gptrain.data.finalize import Companion
from gptrain.data.tokenizer_args import canonical_type
from gptrain.errors import ConfigError, DataError
from gptrain.utils.atomic import atomic_write_text
from gptrain.utils.tokenizer_types import megatron_tokenizer_type

SUFFIX = ".tokenizer"
TOKENIZER_APPENDS_EOD = "tokenizer_appends_eod"
# The name of the first such records: read, and replaced when the dataset is written again.
OLD_SUFFIX = ".tokenizer.json"


def write_tokenizer_record(
    prefix: str,
    kind: str,
    legacy: bool,
    vocabulary: dict[str, Any] | None = None,
    append_eod: bool | None = None,
    tokenizer_appends_eod: bool = False,
) -> None:
    """Record beside `prefix` the tokenizer settings `new_record` takes, on their own (data prepare
    and merge finish the record with the data: `record_companion`). A file of the user's with the
    record's name is kept, with a warning (data prepare and merge refuse one before writing: this
    guards other writers), and the data then has no record, as Megatron's has none."""
    if (foreign := foreign_record_file(prefix)) is not None:
        _warn_foreign(foreign)
    else:
        record = new_record(kind, legacy, vocabulary, append_eod, tokenizer_appends_eod)
        atomic_write_text(prefix + SUFFIX, _text(record))
    if _read(prefix + OLD_SUFFIX) is not None:  # an older record of the data just replaced
        Path(prefix + OLD_SUFFIX).unlink(missing_ok=True)


def new_record(
    kind: str,
    legacy: bool,
    vocabulary: dict[str, Any] | None = None,
    append_eod: bool | None = None,
    tokenizer_appends_eod: bool = False,
) -> dict[str, Any]:
    """The record of the tokenizer type (Megatron's name for any spelling, so records of one type
    compare equal), whether it encoded as Megatron's legacy one, the fingerprint of its vocabulary
    (gptrain.data.tokenizer_fingerprint) and whether documents end with the end-of-document id
    (--append-eod; gptrain.data.record_mix compares it); None: not recorded. `tokenizer_appends_eod`:
    the tokenizer's post-processor ends every text with it (recorded only then), so documents do
    without --append-eod."""
    record: dict[str, Any] = {"type": megatron_tokenizer_type(kind) or kind, "legacy": legacy}
    if vocabulary is not None:
        record["vocabulary"] = vocabulary
    if append_eod is not None:
        record["append_eod"] = append_eod
    if tokenizer_appends_eod:
        record[TOKENIZER_APPENDS_EOD] = True
    return record


def record_companion(prefix: str, record: dict[str, Any] | None) -> Companion:
    """`record` (None: none) to finish with the dataset written at `prefix` (gptrain.data.finalize):
    every record there now (either name) goes with the old `.idx`, and the new one goes in before
    the new `.idx`. A file of the user's with the record's name is kept, as `write_tokenizer_record`
    keeps it."""
    stale = tuple(
        Path(prefix + suffix) for suffix in (SUFFIX, OLD_SUFFIX) if _read(prefix + suffix) is not None
    )
    if record is not None and (foreign := foreign_record_file(prefix)) is not None:
        _warn_foreign(foreign)
        record = None
    return Companion(Path(prefix + SUFFIX), None if record is None else _text(record), stale)


def _text(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=2) + "\n"


def _warn_foreign(foreign: str) -> None:
    print(
        f"gptrain: warning: {foreign} is not a tokenizer record (a file of yours?): kept, and the data's "
        "tokenizer settings (--legacy-tokenizer) are not recorded, so training cannot check them; "
        "move it and write the data again to record them",
        file=sys.stderr,
    )


def foreign_record_file(prefix: str) -> str | None:
    """`<prefix>.tokenizer` where something that is no record has that name (a file of the user's, a
    directory), else None: writing the record would replace it."""
    path = prefix + SUFFIX
    if not os.path.lexists(path) or _read(path) is not None:
        return None
    return path


def refuse_foreign_record_file(prefix: str, flag: str, then: str) -> None:
    """A DataError naming `flag` where `foreign_record_file` finds one: said before any data is written."""
    if (foreign := foreign_record_file(prefix)) is not None:
        raise DataError(
            f"{flag} {prefix}: {foreign} is not a tokenizer record (a file of yours?), where the {then} "
            "writes the data's tokenizer record: move it, then " + then
        )


def merged_record(prefixes: list[str]) -> dict[str, Any] | None:
    """The record a merge of `prefixes` carries: theirs where every input has the same one (the
    first's files named), its vocabulary dropped where one has none, and its append_eod where they
    differ (said by gptrain.data.record_mix); None where one has no record (Megatron's data:
    unknown) or the types differ. Inputs prepared with and without --legacy-tokenizer, or with other
    vocabularies, are a DataError: merged, the data has no one tokenizer to check."""
    records = {prefix: read_tokenizer_record(prefix) for prefix in prefixes}
    known = {prefix: record for prefix, record in records.items() if record is not None}
    _refuse_mixed_legacy(known)
    _refuse_mixed_vocabularies(known)
    settings = {json.dumps(_settings(record), sort_keys=True) for record in known.values()}
    if len(known) < len(records) or len(settings) != 1:
        return None
    merged = _settings(next(iter(known.values())))
    if all(isinstance(record.get("vocabulary"), dict) for record in known.values()):
        merged["vocabulary"] = next(iter(known.values()))["vocabulary"]
    if len({json.dumps(record.get("append_eod")) for record in known.values()}) == 1:
        merged |= {k: v for k, v in next(iter(known.values())).items() if k == "append_eod"}
    return merged


def _settings(record: dict[str, Any]) -> dict[str, Any]:
    """What every input of a merge must share: all but the vocabulary (compared on its own) and
    --append-eod (the merge says where it differs)."""
    return {key: value for key, value in record.items() if key not in ("vocabulary", "append_eod")}


def _refuse_mixed_legacy(known: dict[str, dict[str, Any]]) -> None:
    by_legacy = {
        record["legacy"]: prefix for prefix, record in known.items() if _is_gpt2_bpe(record.get("type"))
    }
    if len(by_legacy) > 1:
        with_, without = by_legacy[True], by_legacy[False]
        raise DataError(
            f"--input {with_} was prepared with --legacy-tokenizer ({record_path(with_)}), {without} "
            f"without ({record_path(without)}): a literal <|endoftext|> is encoded otherwise in each; "
            "prepare them with the same setting, then merge"
        )


def _refuse_mixed_vocabularies(known: dict[str, dict[str, Any]]) -> None:
    """Inputs whose recorded vocabularies differ (tokens, end of document or encoding): merged, the data
    has no one tokenizer."""
    from gptrain.data.tokenizer_fingerprint import FOR_A_MERGE, describe, difference

    fingerprinted = [(prefix, r) for prefix, r in known.items() if isinstance(r.get("vocabulary"), dict)]
    for prefix, record in fingerprinted[1:]:
        first, first_record = fingerprinted[0]
        why = difference(_with_split(first_record), _with_split(record), None, FOR_A_MERGE)
        if why is not None:
            raise DataError(
                f"--input {prefix} was tokenized with {describe(record['type'], record['vocabulary'])}, "
                f"{first} with {describe(first_record['type'], first_record['vocabulary'])} (their "
                f"{SUFFIX} records): {why}; re-tokenize one with the other's tokenizer files "
                "(gptrain data prepare), then merge"
            )


def _with_split(record: dict[str, Any]) -> dict[str, Any]:
    """A record's vocabulary, a HuggingFaceTokenizer's without split_special_tokens read as false."""
    vocabulary = record["vocabulary"]
    if (split := recorded_split(record)) is None:
        return vocabulary
    return vocabulary | {"split_special_tokens": split}


def recorded_split(record: dict[str, Any]) -> bool | None:
    """A HuggingFaceTokenizer record's tokenizer_config.json split_special_tokens: false where its
    vocabulary lacks the key (gptrain wrote it before it read the key, taking a special token's text
    as its id); None for another type, or a record without a vocabulary."""
    vocabulary = record.get("vocabulary")
    if _kind(record.get("type")) != "huggingface" or not isinstance(vocabulary, dict):
        return None
    return vocabulary.get("split_special_tokens") is True


def read_tokenizer_record(prefix: str) -> dict[str, Any] | None:
    """The record beside `prefix`, its type as Megatron names it (records written before kept the
    user's spelling), or None where there is none (or it does not parse: unchecked)."""
    path = record_path(prefix)
    record = None if path is None else _read(path)
    if record is not None:
        record["type"] = megatron_tokenizer_type(record.get("type")) or record.get("type")
    return record


def record_path(prefix: str) -> str | None:
    """The record's file beside `prefix` (its first name where the new one is none, or no record:
    a file of the user's), or None."""
    for suffix in (SUFFIX, OLD_SUFFIX):
        if _read(prefix + suffix) is not None:
            return prefix + suffix
    return None


def _read(path: str) -> dict[str, Any] | None:
    """A record file's JSON object, or None where it cannot be read or parsed or is no record (a
    file of the user's that happens to have the name)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("legacy"), bool) else None


def legacy_mismatch(prefixes: list[str], legacy: bool, tokenizer_type: str) -> str | None:
    """The first prefix whose data was encoded with another --legacy-tokenizer setting than the run
    encodes with, said as the reason (for the message), or None. Compared where the data is GPT-2
    BPE, the one type the setting changes: a run of another type encodes as not legacy whatever
    model.tokenizer.legacy says (a HuggingFaceTokenizer on GPT-2's tokenizer.json keeps a literal
    <|endoftext|> as its special token), and data of another type is recorded false whatever the flag
    was (so a HuggingFaceTokenizer run with the flag in both steps takes its own data). A
    NullTokenizer run encodes no text at all: nothing to differ."""
    if _kind(tokenizer_type) == "null":
        return None
    encodes_legacy = legacy and _is_gpt2_bpe(tokenizer_type)
    for prefix in map(strip_suffix, prefixes):  # data_prefix may name X.bin or X.idx for X
        record = read_tokenizer_record(prefix)
        if record is not None and _is_gpt2_bpe(record.get("type")) and record["legacy"] != encodes_legacy:
            how = "with" if record.get("legacy") else "without"
            return f"{prefix} was prepared {how} --legacy-tokenizer ({record_path(prefix)})"
    return None


def _is_gpt2_bpe(tokenizer_type: object) -> bool:
    """Whether a type (any spelling the config takes) is GPT-2 BPE; an unknown one is not."""
    return _kind(tokenizer_type) == "gpt2"


def _kind(tokenizer_type: object) -> str | None:
    """gptrain's kind of a type by any spelling the config takes; None for an unknown one."""
    try:
        return canonical_type(tokenizer_type) if isinstance(tokenizer_type, str) else None
    except ConfigError:
        return None


def legacy_conflict(
    prefixes: list[str], legacy: bool, tokenizer_type: str, under: str = "", where: str | None = None
) -> tuple[str, str] | None:
    """(what differs, what to do) where the data's recorded --legacy-tokenizer is not the run's
    model.tokenizer.legacy, else None: the words of training and of the launcher's preflight, whose
    keys are `under` training; `where` names the prefixes otherwise than model.data.data_prefix
    (eval's --data-prefix)."""
    why = legacy_mismatch(prefixes, legacy, tokenizer_type)
    if why is None:
        return None
    where = where or f"{under}model.data.data_prefix"
    if not _is_gpt2_bpe(tokenizer_type):  # only legacy GPT-2 BPE data differs from such a run
        text = (
            f"{where}: {why}, and {under}model.tokenizer.type is {tokenizer_type}, which "
            f"has no legacy encoding: {_ENCODED_OTHERWISE}"
        )
        advice = (
            f"set {under}model.tokenizer.type=GPT2BPETokenizer and {under}model.tokenizer.legacy=true to match "
            f"the data, or {under}exp_manager.allow_tokenizer_change=true to go on with this one"
        )
        return text, advice
    text = f"{where}: {why}, and {under}model.tokenizer.legacy is {str(legacy).lower()}: {_ENCODED_OTHERWISE}"
    advice = (
        f"set {under}model.tokenizer.legacy={str(not legacy).lower()} to match the data, or "
        f"{under}exp_manager.allow_tokenizer_change=true to go on with this one"
    )
    return text, advice


_ENCODED_OTHERWISE = "a literal <|endoftext|> in text is encoded otherwise than in the data (generate, eval and export encode text)"
