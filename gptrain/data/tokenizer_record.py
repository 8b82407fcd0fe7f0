"""The tokenizer settings a prepared dataset was encoded with, kept beside its .bin/.idx (no torch).

`<prefix>.tokenizer.json` holds the type and Megatron's --legacy-tokenizer: with it GPT-2 BPE kept
a literal <|endoftext|> in the text as text, which neither the .bin nor the .idx shows. A run
whose model.tokenizer.legacy differs trains on the same ids, but encodes text (generate, eval, the
export's tokenizer) otherwise than its data was: training checks it, as it checks a checkpoint's
tokenizer (refused, or a warning with exp_manager.allow_tokenizer_change). Megatron reads neither
file; a dataset without one (Megatron's, gptrain's before it, a merge) is not checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gptrain.utils.atomic import atomic_write_text

SUFFIX = ".tokenizer.json"


def write_tokenizer_record(prefix: str, kind: str, legacy: bool) -> None:
    """Record beside `prefix` the tokenizer type and whether it encoded as Megatron's legacy one."""
    record = {"type": kind, "legacy": legacy}
    atomic_write_text(prefix + SUFFIX, json.dumps(record, indent=2) + "\n")


def read_tokenizer_record(prefix: str) -> dict[str, Any] | None:
    """The record beside `prefix`, or None where there is none (or it does not parse: unchecked)."""
    try:
        record = json.loads(Path(prefix + SUFFIX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def legacy_mismatch(prefixes: list[str], legacy: bool) -> str | None:
    """The first prefix whose data was encoded with the other --legacy-tokenizer setting, said as the
    reason (for the message), or None."""
    for prefix in prefixes:
        record = read_tokenizer_record(prefix)
        if record is not None and bool(record.get("legacy")) != legacy:
            how = "with" if record.get("legacy") else "without"
            return f"{prefix} was prepared {how} --legacy-tokenizer ({prefix}{SUFFIX})"
    return None
