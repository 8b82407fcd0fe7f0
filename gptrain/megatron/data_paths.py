"""Megatron's data flags -> `model.data.data_prefix`: `--data-path` (one blend that `--split` divides),
`--train/valid/test-data-path` (NeMo's per-split form), and the same read from a file.

Big blends (hundreds of shards) pass the command line's limits, so Megatron (since November 2024)
reads them from a file instead (`--data-args-path`: a text file of the words `--data-path` would
take; `--per-split-data-args-path`: a JSON object of the three per-split lists), as here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gptrain.data.blend_spec import is_number, parse_blend, unweighted_list_error
from gptrain.errors import ConfigError, DataError

DATA_ARGS = "--data-args-path"
PER_SPLIT_DATA_ARGS = "--per-split-data-args-path"
# The JSON keys of a per-split file, in split order (Megatron's; `valid`, not NeMo's `validation`).
PER_SPLIT_FILE_KEYS = ("train", "valid", "test")


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ConfigError(f"{flag} {path}: cannot be read ({why})") from None


def read_data_args(path: str) -> list[str]:
    """The words of a --data-args-path file: what --data-path takes (`W1 P1 W2 P2 ...` or `P`)."""
    words = _read(path, DATA_ARGS).split()
    if not words:
        raise ConfigError(f"{DATA_ARGS} {path}: the file is empty; write 'WEIGHT PREFIX ...' in it")
    return words


def read_per_split_data_args(path: str) -> dict[str, list[str] | None]:
    """{train, valid, test: words or None} of a --per-split-data-args-path JSON file.

    As in Megatron, each value is a string of words (split at whitespace), a list of them, or null
    (no dataset for that split), and all three keys must be there."""
    flag = f"{PER_SPLIT_DATA_ARGS} {path}"
    try:
        data = json.loads(_read(path, PER_SPLIT_DATA_ARGS))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{flag}: not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: expected a JSON object with the keys {', '.join(PER_SPLIT_FILE_KEYS)}")
    missing = [key for key in PER_SPLIT_FILE_KEYS if key not in data]
    if missing:
        raise ConfigError(
            f"{flag}: no key {', '.join(missing)}; Megatron needs all of {', '.join(PER_SPLIT_FILE_KEYS)} "
            "(null for a split without data)"
        )
    return {key: _words(data[key], f"{flag}: {key}") for key in PER_SPLIT_FILE_KEYS}


def _words(value: object, where: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        words = [str(item) for item in value]
    else:
        raise ConfigError(f"{where}: give a string 'WEIGHT PREFIX ...', a list of them, or null")
    if not words:
        raise ConfigError(f"{where}: empty; give a prefix, 'WEIGHT PREFIX ...', or null")
    return words


# --data-path (split by --split), or Megatron's per-split paths -> NeMo's per-split data_prefix keys.
PER_SPLIT_PATHS = {
    "--train-data-path": "train",
    "--valid-data-path": "validation",
    "--test-data-path": "test",
}


def _what_megatron_does_with_mock_data(data_flags: list[str]) -> str:
    """Megatron's assert counts --mock-data, --data-path and the per-split paths, not the args files:
    beside those alone it trains on mock tokens. gptrain refuses that pair too: a run given a blend
    file that trains on random tokens is a mistake found only in its loss."""
    if any(flag not in (DATA_ARGS, PER_SPLIT_DATA_ARGS) for flag in data_flags):
        return "Megatron refuses both: 'A single data source must be provided'"
    return "Megatron takes both but trains on mock tokens, the file's blend unused; drop --mock-data to train on it"


def apply(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """--data-path (one blend that --split divides) or the per-split paths (each split its own);
    either may come from a file (--data-args-path, --per-split-data-args-path)."""
    whole = [flag for flag in ("--data-path", DATA_ARGS) if flag in given]
    split_flags = [flag for flag in (*PER_SPLIT_PATHS, PER_SPLIT_DATA_ARGS) if flag in given]
    if "--mock-data" in given and (whole or split_flags):  # else the files were read, the flag dropped
        raise ConfigError(
            f"--mock-data and {', '.join(whole + split_flags)}: give one data source "
            f"({_what_megatron_does_with_mock_data(whole + split_flags)})"
        )
    if whole and split_flags:
        raise ConfigError(
            f"{' and '.join(whole)} and {', '.join(split_flags)}: give one blend that --split divides, or a "
            "path per split, not both"
        )
    if len(whole) == 2:
        raise ConfigError("--data-path and --data-args-path: give one (Megatron refuses both too)")
    if split_flags:
        v["model.data.data_prefix"] = _per_split_paths(given)
        v["model.data.data_impl"] = "mmap"
    elif "--data-path" in given:
        v["model.data.data_prefix"] = data_prefix(given["--data-path"])
        v["model.data.data_impl"] = "mmap"
    elif whole:
        path = given[DATA_ARGS][0]
        if "--split" not in given:
            raise ConfigError(
                f"{DATA_ARGS} needs --split: Megatron takes its legacy '969, 30, 1' for --data-path "
                "only, and stops without a split here"
            )
        v["model.data.data_prefix"] = data_prefix(read_data_args(path), f"{DATA_ARGS} {path} holds")
        v["model.data.data_impl"] = "mmap"
    elif v.get("model.data.data_impl") != "mock":  # else the config's line would name its own keys
        raise ConfigError(
            "pretrain_gpt.py needs data: --data-path PREFIX (or 'WEIGHT PREFIX ...'), --data-args-path FILE, "
            "--train-data-path (with --valid/test-data-path), or --mock-data for synthetic tokens"
        )


KEY = "model.data.data_prefix"


def prefix_in_flags(message: str, given: dict[str, list[str]]) -> str:
    """`message` of a data_prefix check (`model.data.data_prefix[.split]: ...`, the training's
    check before it starts) with the key named by the flag that set it."""
    if PER_SPLIT_DATA_ARGS in given:
        file = f"{PER_SPLIT_DATA_ARGS} {given[PER_SPLIT_DATA_ARGS][0]}"
        names = {
            key: f"{file}: {name}"
            for name, key in zip(PER_SPLIT_FILE_KEYS, PER_SPLIT_PATHS.values(), strict=True)
        }
    else:
        names = {key: flag for flag, key in PER_SPLIT_PATHS.items()}
    for key, flag in names.items():
        message = message.replace(f"{KEY}.{key}:", f"{flag}:", 1)
    whole = f"{DATA_ARGS} {given[DATA_ARGS][0]}" if DATA_ARGS in given else "--data-path"
    return message.replace(f"{KEY}:", f"{whole}:", 1)


def _per_split_paths(given: dict[str, list[str]]) -> dict[str, Any]:
    """{train, validation, test: prefix or blend} from --train/valid/test-data-path or their file."""
    flag = PER_SPLIT_DATA_ARGS
    if flag not in given:
        if "--train-data-path" not in given:
            raise ConfigError("--valid-data-path/--test-data-path need --train-data-path too")
        return {
            key: data_prefix(given[f], f, one_split=True) for f, key in PER_SPLIT_PATHS.items() if f in given
        }
    if any(f in given for f in PER_SPLIT_PATHS):
        raise ConfigError(f"{flag} and --train/valid/test-data-path: give the paths one way, not both")
    path = given[flag][0]
    from_file = read_per_split_data_args(path)
    if from_file["train"] is None:
        raise ConfigError(f"{flag} {path}: train is null; training needs its data there")
    return {
        key: data_prefix(words, f"{flag} {path}: {name} is", one_split=True)
        for (name, words), key in zip(from_file.items(), PER_SPLIT_PATHS.values(), strict=True)
        if words is not None
    }


def data_prefix(values: list[str], flag: str = "--data-path", one_split: bool = False) -> Any:
    """`--data-path p` or `--data-path w1 p1 w2 p2 ...` -> a prefix or a flat blend list.
    `one_split`: a split's own flag (--valid-data-path), whose lone `W P` is built as P whatever W."""
    if len(values) == 1:
        _refuse_a_quoted_blend(values[0], flag)
        return values[0]
    if (
        len(values) % 2 == 0
        and all(is_number(w) for w in values[1::2])
        and not any(map(is_number, values[0::2]))
    ):
        raise ConfigError(
            f"{flag} {' '.join(values[:4])}: the weights go before the prefixes ('WEIGHT PREFIX ...')"
        )
    if len(values) % 2 or not any(is_number(w) for w in values[0::2]):  # Megatron's unweighted form
        raise ConfigError(f"{flag}: {unweighted_list_error(values)}")
    if not all(is_number(w) for w in values[0::2]):
        shown = " ".join(values[:6]) + (f" ... ({len(values)} words)" if len(values) > 6 else "")
        raise ConfigError(f"{flag} {shown}: give one prefix, or pairs 'WEIGHT PREFIX ...'")
    try:  # the weights as the job reads them: a negative or 0 one fails now, not at its start
        parse_blend(values, one_split=one_split)
    except DataError as error:
        raise ConfigError(f"{flag}: {error}") from None
    return [float(x) if i % 2 == 0 else x for i, x in enumerate(values)]


def _refuse_a_quoted_blend(value: str, flag: str) -> None:
    """A blend in one word (a script's "$DATA_PATH", quoted) would be read as one prefix, as Megatron
    reads it, and fail as a missing file advising `gptrain data prepare`: named here instead."""
    words = value.split()
    if len(words) > 1 and len(words) % 2 == 0 and all(is_number(w) for w in words[0::2]):
        raise ConfigError(
            f"{flag} '{value}': a blend given as one word (quoted, as \"$DATA_PATH\" is) is one prefix to "
            "Megatron and to gptrain; give its weights and prefixes as separate words (unquoted $DATA_PATH)"
        )
