"""Where a blend's datasets were prepared otherwise than each other, or than the run reads them, as
their tokenizer records say (gptrain.data.tokenizer_record; no torch).

Two settings leave the ids valid but change what they mean: --append-eod (documents that end with
an end-of-document id, or run on into the next without one) and a HuggingFaceTokenizer's
tokenizer_config.json split_special_tokens (a literal special token's text kept as text, or read as
its id). A blend mixing them trains; one line says so, at train start (and `data merge` for
--append-eod: a merge already refuses inputs of both split_special_tokens). A record without the
key (Megatron's data, gptrain's before it recorded --append-eod) says nothing; documents whose
tokenizer ends each text with the end-of-document id (recorded as tokenizer_appends_eod) end with it
without --append-eod.
"""

from __future__ import annotations

from typing import Any

from gptrain.data.blend_spec import strip_suffix
from gptrain.data.tokenizer_record import (
    SUFFIX,
    TOKENIZER_APPENDS_EOD,
    read_tokenizer_record,
    record_path,
    recorded_split,
)


def mixed_preparation_lines(prefixes: list[str], where: str, eod_mask_loss: bool = False) -> list[str]:
    """The warnings (one line each) for `prefixes` (named by `where`: a config key or a flag): the
    data's --append-eod against each other or against model.data.eod_mask_loss, and their
    split_special_tokens against each other."""
    records = _records(prefixes)
    lines = [_eod_line(records, where, eod_mask_loss), _split_line(records, where)]
    return [f"gptrain: warning: {line}" for line in lines if line is not None]


def _records(prefixes: list[str]) -> dict[str, dict[str, Any]]:
    """Each distinct prefix's record, those without one left out."""
    records = {}
    for prefix in dict.fromkeys(map(strip_suffix, prefixes)):
        if (record := read_tokenizer_record(prefix)) is not None:
            records[prefix] = record
    return records


def _first_of_each(values: dict[str, bool]) -> tuple[str | None, str | None]:
    """(the first prefix whose value is true, the first whose value is false)."""
    true = next((prefix for prefix, value in values.items() if value), None)
    false = next((prefix for prefix, value in values.items() if not value), None)
    return true, false


def _eod_line(records: dict[str, dict[str, Any]], where: str, eod_mask_loss: bool) -> str | None:
    recorded = {
        p: r["append_eod"] or r.get(TOKENIZER_APPENDS_EOD) is True
        for p, r in records.items()
        if isinstance(r.get("append_eod"), bool)
    }
    with_eod, without = _first_of_each(recorded)
    if without is None:
        return None
    if eod_mask_loss:
        return (
            f"{where}: {without} was prepared without --append-eod ({record_path(without)}), and "
            "model.data.eod_mask_loss=true masks the end-of-document id: unless its text held that id "
            "(ids given to NullTokenizer), its documents end with none, so nothing is masked there and they "
            "run on into each other; prepare it with --append-eod"
        )
    if with_eod is None:
        return None
    return (
        f"{where}: {with_eod} was prepared with --append-eod, {without} without (their {SUFFIX} "
        f"records): unless its text held that id (ids given to NullTokenizer), {without}'s documents run "
        "on into each other with no end-of-document id between them; prepare both alike"
    )


def _split_line(records: dict[str, dict[str, Any]], where: str) -> str | None:
    recorded = {p: split for p, r in records.items() if (split := recorded_split(r)) is not None}
    split, kept = _first_of_each(recorded)
    if split is None or kept is None:
        return None
    return (
        f"{where}: {split} was prepared with tokenizer_config.json's split_special_tokens true, {kept} "
        f"with false (their {SUFFIX} records): a literal special token's text is text in {split}'s ids, "
        f"the special token's id in {kept}'s; prepare both alike"
    )
