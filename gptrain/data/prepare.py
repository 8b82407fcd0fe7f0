"""`gptrain data prepare`: jsonl -> Megatron `.bin`/`.idx`, byte-identical to preprocess_data.py.

Design: the main process reads whole-line chunks (~1 MiB, decompressing as needed) and
hands them to worker processes, which parse JSON (orjson) and tokenize; results come
back as numpy arrays and are written in chunk order, so the output does not depend on
the worker count. At most `2 * workers` chunks are in flight and lengths are spilled to
disk by the writer, so memory does not grow with the input.

A value may also be a JSON array of strings, as Megatron's preprocess_data.py takes it (without
--split-sentences): the document's sentences, each tokenized on its own, each non-empty one a
sequence of the document, the EOD of --append-eod on the last one. A plain string is the
one-sentence case; lines of plain strings never take the (slower) path of the lists.

With NullTokenizer a value is token ids: text of ids separated by spaces, as Megatron's
preprocess_data.py reads it, or a JSON array of ids (one document; Megatron's fails on it).

A worker parses a chunk's lines in prepare_lines.py and shapes its tokens in prepare_tokens.py.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from gptrain.data.finalize import Companion, finalize_together, state_after
from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter, optimal_dtype
from gptrain.data.jsonl import Chunk, expand_inputs, file_identity, is_pipe, iter_chunks
from gptrain.data.null_tokenizer import IdsRefused
from gptrain.data.prepare_lines import ParsedChunk, parse_chunk, texts_and_sentences
from gptrain.data.prepare_tokens import (
    ChunkResult,
    WorkerState,
    check_chunk_ids_fit,
    encode_texts,
    last_sentences,
    with_eod,
)
from gptrain.data.tokenizer_record import new_record, record_companion, refuse_foreign_record_file
from gptrain.data.tokenizer_wrappers import Tokenizer, vocabulary_entries
from gptrain.data.tokenizers import TokenizerSpec, canonical_type
from gptrain.errors import ConfigError, DataError
from gptrain.utils.progress import Progress, counted, format_rate


@dataclass(frozen=True)
class PrepareConfig:
    """What `gptrain data prepare` does; field names follow the Megatron flags."""

    inputs: list[str]
    output_prefix: str
    tokenizer: TokenizerSpec
    json_keys: tuple[str, ...] = ("text",)
    append_eod: bool = False
    workers: int = 1
    log_interval: int = 10000  # documents between progress lines
    skip_bad_lines: bool = False
    chunk_bytes: int = 1 << 20


@dataclass
class PrepareStats:
    documents: int = 0
    empty_documents: dict[str, int] = field(default_factory=dict)  # per json key
    sequences: dict[str, int] = field(default_factory=dict)  # per json key: what a split divides
    bad_lines: int = 0
    documents_per_input: dict[str, int] = field(default_factory=dict)  # input file -> documents
    bad_lines_per_input: dict[str, int] = field(default_factory=dict)  # input file -> lines skipped
    tokens: int = 0
    input_bytes: int = 0
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.documents / max(self.seconds, 1e-9)
        mbs = self.input_bytes / max(self.seconds, 1e-9) / 2**20
        empty = self._per_key(self.empty_documents, lambda n: f"{n:,} empty")
        sequences = self._per_key(self.sequences, lambda n: counted(n, "sequence"))
        documents, bad_lines = counted(self.documents, "document"), counted(self.bad_lines, "bad line")
        return (
            f"prepared {documents} ({empty}, {bad_lines} skipped) "
            f"as {sequences}, {counted(self.tokens, 'token')} in {self.seconds:.1f} s "
            f"({format_rate(rate)} docs/s, {mbs:.2f} MB/s) -> {', '.join(p + '.bin/.idx' for p in self.outputs)}"
        )

    @staticmethod
    def _per_key(counts: dict[str, int], what: Callable[[int], str]) -> str:
        """`3 empty`, or `3 empty text, 1 empty title` with several json keys."""
        return ", ".join(what(n) + (f" {key}" if len(counts) > 1 else "") for key, n in counts.items())


# Set in the parent before forking (workers inherit it) or by _init_worker under spawn.
_STATE: WorkerState | None = None


def encode_chunk(chunk: Chunk) -> ChunkResult:
    """Parse and tokenize one chunk (runs in a worker process, or inline with one worker)."""
    state = _STATE
    assert state is not None, "worker state not initialised"
    try:
        parsed = parse_chunk(chunk, state)
        if parsed.error is None or not state.reads_ids:
            return _encoded(chunk, state, parsed)
    except IdsRefused:
        pass
    # NullTokenizer refused an id, or a line is bad: each line's ids read too, so that the first
    # bad line is the one named (an id past --vocab-size before a later line of bad JSON), or skipped
    return _encoded(chunk, state, parse_chunk(chunk, state, check_ids=True))


def _encoded(chunk: Chunk, state: WorkerState, parsed: ParsedChunk) -> ChunkResult:
    if parsed.error is not None:
        return ChunkResult([], [], [], 0, parsed.bad_lines, len(chunk.data), chunk.path, parsed.error)
    all_tokens, all_lengths, all_sentences = [], [], []
    for key, values in zip(state.keys, parsed.values, strict=True):
        texts, sentences = texts_and_sentences(values) if parsed.has_lists else (values, None)
        tokens, lengths = encode_texts(state.tokenizer, texts, chunk, key)  # type: ignore[arg-type]
        if state.eod is not None:
            tokens, lengths = with_eod(tokens, lengths, state.eod, last_sentences(lengths, sentences))
        check_chunk_ids_fit(tokens, state, chunk, key)
        all_tokens.append(tokens.astype(state.dtype, copy=False))
        all_lengths.append(lengths)
        all_sentences.append(sentences)
    documents = len(parsed.values[0])
    return ChunkResult(
        all_tokens, all_lengths, all_sentences, documents, parsed.bad_lines, len(chunk.data), chunk.path
    )


def _init_pool_worker(spec: TokenizerSpec, keys: tuple[str, ...], append_eod: bool, skip: bool) -> None:
    """Ctrl-C is handled by the main process alone (it stops the pool and removes temp files);
    SIGTERM ends a worker at once (the main process's handler, inherited by fork, is reset)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already
    _init_worker(spec, keys, append_eod, skip)


def _init_worker(spec: TokenizerSpec, keys: tuple[str, ...], append_eod: bool, skip: bool) -> None:
    global _STATE
    if _STATE is None:
        tokenizer = spec.build()
        eod = tokenizer.eod if append_eod else None
        _STATE = WorkerState(
            tokenizer, keys, eod, optimal_dtype(tokenizer.vocab_size, vocabulary_entries(tokenizer)), skip
        )


def _results(chunks: Iterable[Chunk], config: PrepareConfig) -> Iterator[ChunkResult]:
    """Encoded chunks in input order; at most `2 * workers` chunks are in flight."""
    if config.workers <= 1:
        yield from map(encode_chunk, chunks)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    initargs = (config.tokenizer, config.json_keys, config.append_eod, config.skip_bad_lines)
    executor = ProcessPoolExecutor(
        config.workers, multiprocessing.get_context(method), _init_pool_worker, initargs
    )
    pending: deque[Future] = deque()
    try:
        for chunk in chunks:
            pending.append(executor.submit(encode_chunk, chunk))
            if len(pending) >= 2 * config.workers:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _result(future: Future) -> ChunkResult:
    try:
        return future.result()
    except BrokenProcessPool:
        raise DataError(
            "a prepare worker process died (killed, or out of memory?); try fewer --workers"
        ) from None


class _InputProgress(Progress):
    """ETA from the position in the (possibly compressed) input files.

    A chunk counts when its result is written, not when it is read: up to `2 * workers`
    chunks are read ahead, so counting them on reading would run ahead of the work.
    """

    def __init__(self, total_raw: int, stream: TextIO) -> None:
        super().__init__("prepare", unit="docs", total_bytes=total_raw, interval=float("inf"), stream=stream)
        self.raw_done = 0
        self._read: deque[int] = deque()  # input positions of the chunks read, not yet written

    def chunk_read(self, raw_position: int) -> None:
        self._read.append(raw_position)

    def chunk_written(self) -> None:
        """Results come back in input order, one per chunk."""
        self.raw_done = self._read.popleft()

    def fraction(self) -> float | None:
        return min(1.0, self.raw_done / self.total_bytes) if self.total_bytes else None


def output_prefixes(output_prefix: str, json_keys: Iterable[str]) -> list[str]:
    """Megatron's names: `<prefix>_<key>_document`."""
    return [f"{output_prefix}_{key}_document" for key in json_keys]


def prepare(config: PrepareConfig, stream: TextIO | None = None) -> PrepareStats:
    """Tokenize the inputs into one dataset per json key; nothing is left behind on error."""
    global _STATE
    stream = stream if stream is not None else sys.stderr
    paths = expand_inputs(config.inputs)
    if not config.json_keys:
        raise DataError("--json-keys: give at least one key")
    repeated = sorted({key for key in config.json_keys if config.json_keys.count(key) > 1})
    if repeated:
        raise ConfigError(
            f"--json-keys {' '.join(config.json_keys)}: {', '.join(map(repr, repeated))} given more than "
            "once; name each key once (each makes its own <prefix>_<key>_document dataset)"
        )
    stats = PrepareStats(outputs=output_prefixes(config.output_prefix, config.json_keys))
    _refuse_outputs_among_inputs(paths, stats.outputs)
    for prefix in stats.outputs:  # before any data is written: the record would replace a user's file
        refuse_foreign_record_file(prefix, "--output-prefix", "prepare")
    _init_worker(config.tokenizer, config.json_keys, config.append_eod, config.skip_bad_lines)
    assert _STATE is not None
    vocabulary = _vocabulary(config.tokenizer, _STATE.tokenizer)
    stats.empty_documents = dict.fromkeys(config.json_keys, 0)
    sizes = [p.stat().st_size for p in paths]
    # A pipe's size is unknown: a percentage would reach 100% before it is read.
    progress = _InputProgress(0 if any(map(is_pipe, paths)) else sum(sizes), stream)
    try:
        with contextlib.ExitStack() as stack:
            writers = [stack.enter_context(IndexedDatasetWriter(p, _STATE.dtype)) for p in stats.outputs]
            chunks = _tracked_chunks(paths, sizes, config.chunk_bytes, progress)
            results = stack.enter_context(contextlib.closing(_results(chunks, config)))
            _consume(results, writers, stats, progress, config.log_interval)
            _refuse_inputs_of_only_bad_lines(stats, config)
            stats.sequences = {key: w.num_sequences for key, w in zip(config.json_keys, writers, strict=True)}
            records = _tokenizer_records(stats.outputs, config, vocabulary)
            finalize_together(writers, records)  # all outputs new, or (on error) all as they were
    except OSError as error:  # reading errors are DataErrors already, but for opening an input
        if (state := state_after(error)) is not None:  # past the first rename: the new data may be in place
            raise DataError(f"--output-prefix {config.output_prefix}: {error}, {state}") from None
        if error.filename is not None and str(error.filename) in {str(path) for path in paths}:
            raise DataError(f"--input {error.filename}: cannot read ({error.strerror or error})") from None
        raise DataError(f"--output-prefix {config.output_prefix}: cannot write ({error})") from None
    finally:
        _STATE = None
    for prefix in stats.outputs:  # reads only the .idx: seconds for billions of tokens
        IndexedDataset(prefix).verify()
    stats.seconds = progress.elapsed
    return stats


def _vocabulary(spec: TokenizerSpec, tokenizer: Tokenizer) -> dict | None:
    """The fingerprint of the tokenizer's vocabulary (gptrain.data.tokenizer_fingerprint), taken
    before any data is written: training under another vocabulary is then refused. None for
    NullTokenizer: its ids come from the user's own tokenizer, which a run may name (not refused)."""
    from gptrain.data.tokenizer_fingerprint import fingerprint

    if canonical_type(spec.tokenizer_type) == "null":
        return None
    return fingerprint(tokenizer, spec.files())[0]


def _tokenizer_records(
    prefixes: list[str], config: PrepareConfig, vocabulary: dict | None
) -> list[Companion]:
    """Each dataset's tokenizer settings, finished with it (gptrain.data.tokenizer_record): --legacy-tokenizer
    changes GPT-2 BPE's ids only, so it is recorded as what it did, with its vocabulary's fingerprint
    and --append-eod."""
    spec = config.tokenizer
    legacy = spec.legacy and canonical_type(spec.tokenizer_type) == "gpt2"
    assert _STATE is not None
    appends = tokenizer_appends_eod(_STATE.tokenizer)
    record = new_record(spec.tokenizer_type, legacy, vocabulary, config.append_eod, appends)
    return [record_companion(prefix, record) for prefix in prefixes]


def tokenizer_appends_eod(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer ends every text it encodes with its end-of-document id (an HF
    post-processor such as TemplateProcessing "$A </s>"): documents then end with it without
    --append-eod, which would double it. NullTokenizer's ids are the user's: not probed."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_identity import PROBE, eod_id

    eod = eod_id(tokenizer)
    if eod is None or isinstance(tokenizer, NullTokenizer):
        return False
    ends = [tokenizer.encode(text)[-1:] for text in ("a", PROBE)]
    return all(end == [eod] for end in ends)


def _refuse_inputs_of_only_bad_lines(stats: PrepareStats, config: PrepareConfig) -> None:
    """An input none of whose lines --skip-bad-lines found usable (the wrong --json-keys, a file that
    is not jsonl) adds no document: beside other inputs, the run exited 0 without that file, and
    nobody noticed. Refused per file; an empty file skips no line, so it is not refused."""
    only_bad = [
        (path, lines)
        for path, lines in stats.bad_lines_per_input.items()
        if lines and not stats.documents_per_input.get(path)
    ]
    if not only_bad:
        return
    path, lines = only_bad[0]
    others = f" (so were those of {len(only_bad) - 1:,} more inputs)" if len(only_bad) > 1 else ""
    raise DataError(
        f"--input {path}: all {lines:,} lines were bad{others}; --skip-bad-lines skipped every one, so "
        f"the file would add no document and nothing was written; check that its records hold the "
        f"--json-keys ({', '.join(config.json_keys)}) as strings, run without --skip-bad-lines to see "
        "the first line's problem, or leave the file out"
    )


def _refuse_outputs_among_inputs(paths: list[Path], prefixes: list[str]) -> None:
    """An output that is also an input (a glob such as 'data/*' on a second run) would be read
    as jsonl, then replaced by the new dataset."""
    inputs = {file_identity(path): path for path in paths}
    for output in (Path(prefix + suffix) for prefix in prefixes for suffix in (".bin", ".idx")):
        if os.path.exists(output) and (path := inputs.get(file_identity(output))) is not None:
            raise DataError(
                f"--input {path} is the output {output} of this --output-prefix; "
                "choose another --output-prefix or leave the file out of --input"
            )


def _tracked_chunks(
    paths: list[Path], sizes: list[int], chunk_bytes: int, progress: _InputProgress
) -> Iterator[Chunk]:
    done_before = 0
    for path, size in zip(paths, sizes, strict=True):
        for chunk in iter_chunks([path], chunk_bytes):
            progress.chunk_read(done_before + chunk.raw_position)
            yield chunk
        done_before += size


def _consume(
    results: Iterator[ChunkResult],
    writers: list[IndexedDatasetWriter],
    stats: PrepareStats,
    progress: _InputProgress,
    log_interval: int,
) -> None:
    next_report, last_line = log_interval, None
    for result in results:
        if result.error is not None:
            raise DataError(f"{result.error} (or pass --skip-bad-lines to skip such lines)")
        for key, writer, tokens, lengths, sentences in zip(
            list(stats.empty_documents), writers, result.tokens, result.lengths, result.sentences, strict=True
        ):
            added = writer.add_documents(tokens, lengths, sentences)
            stats.empty_documents[key] += int(np.count_nonzero(added == 0))
            stats.tokens += len(tokens)
        stats.documents += result.documents
        stats.bad_lines += result.bad_lines
        _count_per_input(stats, result)
        stats.input_bytes += result.nbytes
        progress.chunk_written()
        progress.update(result.documents, result.nbytes)
        now = progress.elapsed
        # Every `log_interval` documents, but at most once a second and at least every 30 s.
        since = now - (last_line or 0.0)
        if (stats.documents >= next_report and (last_line is None or since >= 1.0)) or since >= 30.0:
            print(progress.line(), file=progress.stream, flush=True)
            next_report, last_line = stats.documents + log_interval, now


def _count_per_input(stats: PrepareStats, result: ChunkResult) -> None:
    """Documents and skipped lines per input file, to find a file --skip-bad-lines emptied."""
    for counts, n in (
        (stats.documents_per_input, result.documents),
        (stats.bad_lines_per_input, result.bad_lines),
    ):
        counts[result.path] = counts.get(result.path, 0) + n
