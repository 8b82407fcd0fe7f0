"""A chunk's jsonl lines as values per json key (strings or sentence arrays), and why a bad line is bad."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from gptrain.data.jsonl import Chunk
from gptrain.data.prepare_tokens import WorkerState
from gptrain.errors import GptrainError, excerpt


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _line_problem(line: bytes, keys: tuple[str, ...], error: Exception | None, record: object) -> str:
    if error is not None:
        if not line.strip():
            return "empty line, expected a JSON object"
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as bad:
            return f"not valid UTF-8 (byte {bad.start})"
        return f"not valid JSON ({error})"
    if not isinstance(record, dict):
        return f"expected a JSON object, got {_json_type(record)}"
    for key in keys:
        if key not in record:
            return f"no key {key!r} (choose the text field with --json-keys)"
        value = record[key]
        if isinstance(value, list):
            if (problem := _sentence_problem(key, value)) is not None:
                return problem
        elif not isinstance(value, str):
            return f"value of {key!r} is {_json_type(value)}, expected a string or an array of strings"
        elif (surrogate := _lone_surrogate(value)) is not None:
            return f"value of {key!r} holds a lone surrogate {surrogate} (not valid Unicode)"
    return "bad line"


def _sentence_problem(key: str, sentences: list) -> str | None:
    """What is wrong with an array value, if anything: Megatron's tokenizer would fail on it."""
    for position, sentence in enumerate(sentences):
        where = f"item {position} (from 0) of the array of {key!r}"
        if not isinstance(sentence, str):
            return f"{where} is {_json_type(sentence)}, expected a string (one per sentence)"
        if (surrogate := _lone_surrogate(sentence)) is not None:
            return f"{where} holds a lone surrogate {surrogate} (not valid Unicode)"
    return None


def _lone_surrogate(text: str | np.ndarray) -> str | None:
    """The first lone surrogate of `text` as a JSON escape (`\\ud800`), or None if it is valid Unicode.

    JSON may escape half of a surrogate pair on its own; `json.loads` then returns a str that
    no tokenizer can encode (HF's raises a TypeError, Megatron's GPT-2 BPE a UnicodeEncodeError).
    """
    if type(text) is not str:  # NullTokenizer's array of ids
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as bad:
        return f"\\u{ord(text[bad.start]):04x}"
    return None


def _python_json(line: bytes, orjson_error: Exception) -> tuple[object, Exception | None]:
    """(record, None) when Python's json reads the line, else (None, orjson's error).

    Megatron's preprocess_data.py parses with `json.loads`, which also takes NaN, Infinity
    and out-of-range numbers such as 1e400 (written by `json.dumps` by default); orjson
    refuses them. Only lines orjson refuses come here, so the fast path stays fast.
    """
    try:
        return json.loads(line.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, orjson_error


Value = str | list[str] | np.ndarray  # one document's text: a string, its sentences, or its ids
ONE_TEXT = (str, np.ndarray)  # a value tokenized whole: a string, or (NullTokenizer) an array of ids


@dataclass
class ParsedChunk:
    values: list[list[Value]]  # per key, one per document
    has_lists: bool  # some value is a list of sentences
    bad_lines: int
    error: str | None = None


def parse_chunk(chunk: Chunk, state: WorkerState, check_ids: bool = False) -> ParsedChunk:
    """Values per key; bad lines are counted (skip) or reported as `file:line: problem`.
    `check_ids`: NullTokenizer's ids read line by line, to name (or skip) the line of one it
    refused; the whole chunk's ids are checked at once when it tokenizes them."""
    import orjson

    texts: list[list[Value]] = [[] for _ in state.keys]
    lines = chunk.data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    bad, has_lists = 0, False
    for offset, line in enumerate(lines):
        error, record, fallback, problem = None, None, False, None
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as caught:
            (record, error), fallback = _python_json(line, caught), True
        if type(record) is dict:
            values = [record.get(key) for key in state.keys]
            strings = all(type(value) is str for value in values)
            # orjson refuses lone surrogates, so only lines it refused can hold one.
            if not strings and state.reads_ids:
                values = [_ids_of(value) for value in values]
                strings = all(type(value) in ONE_TEXT for value in values)
            if strings:
                usable = not (fallback and any(map(_lone_surrogate, values)))
            else:
                usable = _all_sentences(values, fallback)
            if usable and check_ids:
                problem = _ids_problem(state, values)
                usable = problem is None
            if usable:
                for bucket, value in zip(texts, values, strict=True):
                    bucket.append(value)
                has_lists |= not strings
                continue
        if not state.skip_bad_lines:
            problem = problem or (state.reads_ids and _id_array_problem(line, state)) or None
            problem = problem or _line_problem(line, state.keys, error, record)
            if state.reads_ids and "array" in problem:
                problem += (
                    "; NullTokenizer takes a document's token ids as whole numbers: a JSON array of them, "
                    'or a string of them separated by spaces ("17 4 2051")'
                )
            return ParsedChunk(texts, has_lists, bad, f"{chunk.path}:{chunk.first_line + offset}: {problem}")
        bad += 1
    return ParsedChunk(texts, has_lists, bad)


def _ids_of(value: object) -> object:
    """A JSON array of token ids as an int64 array (one document), which NullTokenizer takes as it
    is; any other value as it is, and one past int64 as text, which it refuses in its words."""
    if type(value) is not list or not set(map(type, value)) <= {int}:
        return value
    try:
        return np.array(value, dtype=np.int64)
    except OverflowError:
        return _ids_as_text(value)


def _ids_as_text(value: object) -> object:
    """A JSON array of token ids as NullTokenizer's text of them (one document); any other value
    as it is."""
    if type(value) is list and set(map(type, value)) <= {int}:
        return " ".join(map(str, value))
    return value


def _texts_of(value: Value) -> list[str]:
    """A value's texts as NullTokenizer reads them word by word: an array of ids as its text."""
    if type(value) is np.ndarray:
        return [" ".join(map(str, value.tolist()))]
    return [value] if type(value) is str else value  # type: ignore[list-item, return-value]


def _ids_problem(state: WorkerState, values: list, keys: tuple[str, ...] | None = None) -> str | None:
    """Why NullTokenizer cannot read a line's ids (a word that is no number, an id past
    --vocab-size), checked per line so that the error names the line and --skip-bad-lines skips it."""
    size = state.tokenizer.vocab_size
    for key, value in zip(keys or state.keys, values, strict=True):
        for text in _texts_of(value):
            try:
                ids = list(map(int, text.split()))
            except ValueError:
                ids = None
            if ids is None or (ids and (min(ids) < 0 or max(ids) >= size)):
                try:
                    state.tokenizer.encode(text)  # its own words for what is wrong
                except GptrainError as error:
                    return f"value of {key!r}: {error}"
    return None


def _id_array_problem(line: bytes, state: WorkerState) -> str | None:
    """What is wrong with a NullTokenizer line's array of ids: the first item that is not a whole
    number, or an id it cannot read. Read again by Python's json, which keeps an integer past 64
    bits exact (orjson makes it a float)."""
    record, error = _python_json(line, ValueError())
    if error is not None or type(record) is not dict:
        return None
    for key in state.keys:
        value = record.get(key)
        if type(value) is not list or not value or type(value[0]) is str:
            continue  # not an array of ids: a string, or sentences (as any tokenizer reads them)
        for position, item in enumerate(value):
            if type(item) is not int:
                shown = excerpt(json.dumps(item, ensure_ascii=False), quote=False)
                return f"item {position} (from 0) of the array of {key!r} is {shown}, not a whole number"
        if (problem := _ids_problem(state, [_ids_as_text(value)], (key,))) is not None:
            return problem
    return None


def _all_sentences(values: list[object], fallback: bool) -> bool:
    """Every value a string or a list of strings (none with a lone surrogate, which only a line
    orjson refused can hold): the slow check, for lines that are not all strings."""
    for value in values:
        if type(value) is np.ndarray:
            continue  # NullTokenizer's ids
        sentences = [value] if type(value) is str else value
        if type(sentences) is not list or not all(type(s) is str for s in sentences):
            return False
        if fallback and any(map(_lone_surrogate, sentences)):
            return False
    return True


def texts_and_sentences(values: list[Value]) -> tuple[list[str | np.ndarray], np.ndarray]:
    """Every text to tokenize, a string value (or an array of ids) being one sentence, and the
    sentences per document."""
    texts: list[str | np.ndarray] = []
    counts = np.empty(len(values), dtype=np.int64)
    for n, value in enumerate(values):
        if type(value) in ONE_TEXT:
            texts.append(value)
            counts[n] = 1
        else:
            texts.extend(value)
            counts[n] = len(value)
    return texts, counts
