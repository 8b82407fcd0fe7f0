"""`gptrain data prepare`: Megatron's bytes, any worker count, compressed inputs, bad input."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

from gptrain.cli import main
from gptrain.data.prepare import PrepareConfig, prepare
from gptrain.data.tokenizers import TokenizerSpec
from gptrain.errors import DataError


def outputs(prefix: Path, key: str = "text") -> tuple[bytes, bytes]:
    base = f"{prefix}_{key}_document"
    return Path(base + ".idx").read_bytes(), Path(base + ".bin").read_bytes()


def gpt2_flags(gpt2_files) -> list[str]:
    return [
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        gpt2_files[0],
        "--merge-file",
        gpt2_files[1],
    ]


@pytest.mark.parametrize(("workers", "append_eod"), [(1, True), (1, False), (2, True)])
def test_matches_megatron_reference(
    tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, workers, append_eod
):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t, "id": n} for n, t in enumerate(corpus)])
    config = PrepareConfig(
        inputs=[str(source)],
        output_prefix=str(tmp_path / "out"),
        tokenizer=TokenizerSpec("GPT2BPETokenizer", *gpt2_files),
        append_eod=append_eod,
        workers=workers,
        chunk_bytes=64,  # many chunks, so order across workers is exercised
    )
    stats = prepare(config, stream=open(tmp_path / "log", "w"))  # noqa: SIM115
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, append_eod)
    assert stats.documents == len(corpus) and stats.bad_lines == 0
    assert stats.empty_documents == {"text": 2} and stats.tokens == len(outputs(tmp_path / "out")[1]) // 2


def test_cli_keys_files_and_globs(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, capsys):
    records = [{"text": t, "title": t[::-1]} for t in corpus]
    write_jsonl(tmp_path / "a.jsonl", records[:5])
    (tmp_path / "parts").mkdir()
    write_jsonl(tmp_path / "parts" / "b1.jsonl", records[5:7])
    write_jsonl(tmp_path / "parts" / "b0.jsonl", records[7:])
    argv = ["data", "prepare", "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "parts" / "b*.jsonl")]
    argv += ["--output-prefix", str(tmp_path / "out"), "--json-keys", "text", "title", "--append-eod"]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "2", "--log-interval", "5"]) == 0
    order = records[:5] + records[7:] + records[5:7]  # files in the order given, globs sorted
    assert outputs(tmp_path / "out", "text") == megatron_dataset([r["text"] for r in order], True)
    assert outputs(tmp_path / "out", "title") == megatron_dataset([r["title"] for r in order], True)
    out = capsys.readouterr()
    assert f"prepared {len(corpus)} documents (2 empty text, 2 empty title, 0 bad lines skipped)" in out.out
    assert "docs/s" in out.err and "MB/s" in out.err and "ETA" in out.err


def test_more_workers_than_cpus_are_cut_to_the_cpus(
    tmp_path, gpt2_files, corpus, write_jsonl, monkeypatch, capsys
):
    """`--workers 100000` (a typo) forked that many processes at once and hung the machine; the
    count is now the CPUs this process may run on, with a note."""
    import gptrain.data.cli as data_cli
    import gptrain.data.prepare as data_prepare

    real_prepare, asked = data_prepare.prepare, []

    def prepare_with_few_workers(config):
        asked.append(config.workers)
        assert config.workers <= 2, "would fork every one of them"
        return real_prepare(config)

    monkeypatch.setattr(data_cli, "_default_workers", lambda: 2)
    monkeypatch.setattr(data_prepare, "prepare", prepare_with_few_workers)
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in corpus])
    argv = ["data", "prepare", "--input", str(tmp_path / "a.jsonl"), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "100000"]) == 0
    assert asked == [2]
    note = "note: --workers 100000 is more than the 2 CPUs this process may run on; using 2\n"
    assert capsys.readouterr().err.startswith(note)


def test_repeated_input_flags_add_up(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset):
    """`--input A --input B` tokenizes both files in that order; argparse kept only B (A's
    documents were dropped without a word)."""
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in corpus[:5]])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in corpus[5:]])
    argv = ["data", "prepare", "--input", str(a), "--input", str(b), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, False)


def test_a_file_named_twice_or_an_output_among_the_inputs_is_refused(tmp_path, gpt2_files, capsys):
    """A file named twice (by a glob and a path, or through a link) was tokenized twice, its
    documents twice in the dataset; an output matched by an input glob was read as jsonl."""
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "a.jsonl")
    prefix = tmp_path / "out"
    (tmp_path / "out_text_document.bin").write_bytes(b"")
    a, pattern = str(tmp_path / "a.jsonl"), str(tmp_path / "*.jsonl")
    cases = [
        ([a, a], f"--input {a}: given twice; each file is tokenized as often as it is named"),
        ([a, pattern], f"--input {a}: given twice"),
        ([a, str(tmp_path / "link.jsonl")], f"link.jsonl: the same file as {a}"),
        (
            [a.replace("a.jsonl", "*.bin")],
            f"is the output {tmp_path / 'out_text_document.bin'} of this --output-prefix",
        ),
    ]
    for inputs, message in cases:
        argv = ["data", "prepare", "--input", *inputs, "--output-prefix", str(prefix), "--workers", "1"]
        assert main([*argv, *gpt2_flags(gpt2_files)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (inputs, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "link.jsonl", "out_text_document.bin"]


def test_a_file_whose_name_holds_glob_characters_is_that_file(tmp_path, gpt2_files, megatron_dataset):
    """`--input 'shard[1].jsonl'` (or the shell's expansion of `shard*`) was read as a pattern
    matching 'shard1.jsonl': 'no file matches this pattern' for a file that is there."""
    source = tmp_path / "shard[1].jsonl"
    source.write_text('{"text": "Hello world"}\n')
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(["Hello world"], False)


def test_megatron_command_line_runs_unchanged(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset):
    """preprocess_data.py's runtime flags (and its --vocab abbreviation, as in older scripts) are
    accepted; the output is still Megatron's bytes in the input's order."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus])
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    argv += ["--vocab", gpt2_files[0], "--merge-file", gpt2_files[1], "--tokenizer-type", "GPT2BPETokenizer"]
    argv += ["--dataset-impl", "mmap", "--chunk-size", "25", "--partitions", "2", "--keep-sequential-samples"]
    assert main([*argv, "--append-eod", "--workers", "1"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, True)


@pytest.mark.parametrize(
    "flags", [["--keep-newlines"], ["--lang", "english"], ["--keep-newlines", "--lang", "de"]]
)
def test_sentence_splitting_options_without_split_sentences_change_nothing(
    tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, capsys, flags
):
    """--keep-newlines and --lang tune how --split-sentences splits; preprocess_data.py reads
    neither without it (its IdentitySplitter), so such a command line writes Megatron's documents.
    gptrain refused them, saying they split documents into sentences."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus])
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, *gpt2_flags(gpt2_files), *flags, "--append-eod", "--workers", "1"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, True)
    assert main([*argv, *gpt2_flags(gpt2_files), *flags, "--split-sentences", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "--split-sentences splits documents into sentences" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "flags",
    [
        ["--find-optimal-num-workers", "--workers-to-check", "8", "16"],
        ["--max-documents", "1000"],
        ["--workers-to-check", "4"],
    ],
)
def test_megatrons_worker_benchmark_flags_are_refused_with_the_reason(tmp_path, gpt2_files, capsys, flags):
    """preprocess_data.py's --find-optimal-num-workers (with --workers-to-check and --max-documents)
    prepares the data once per worker count to time them; argparse answered 'unrecognized arguments',
    which did not say that gptrain has no such run or what to do instead. The line named a
    --performance-dir, which preprocess_data.py has not."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "one"}\n')
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, *gpt2_flags(gpt2_files), *flags, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"gptrain: error: {flags[0]}: Megatron's timing of worker counts")
        and err.count("\n") == 1
    )
    assert "--workers" in err and "--performance-dir" not in err and not list(tmp_path.glob("out*"))


@pytest.mark.parametrize("keep_sequential", [False, True])
def test_partitions_say_how_megatrons_document_order_would_differ(
    tmp_path, gpt2_files, corpus, write_jsonl, capsys, keep_sequential
):
    """Megatron deals the lines to --partitions round robin, so its documents come in another
    order; with --keep-sequential-samples each partition is a run of ceil(lines / N) consecutive
    lines, merged in order: the input's order, as gptrain writes it. That case said Megatron's
    order differed past 1,000,000 lines, which no preprocess_data.py does."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus])
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    argv += [*gpt2_flags(gpt2_files), "--partitions", "4", "--workers", "1"]
    assert main(argv + ["--keep-sequential-samples"] * keep_sequential) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: --partitions 4")]
    if keep_sequential:
        assert notes == []
    else:
        assert len(notes) == 1 and "line by line" in notes[0] and "in another order" in notes[0]


@pytest.mark.parametrize(("compress", "chunk_bytes"), [(None, 1), (None, 1 << 20), (gzip.compress, 64)])
def test_a_byte_order_mark_starting_a_file_is_no_part_of_its_first_document(
    tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, compress, chunk_bytes
):
    """A UTF-8 BOM (as Windows tools write) made line 1 'not valid JSON', and --skip-bad-lines
    dropped that document; it is now read past, however the file's first blocks fall."""
    records = [{"text": t} for t in corpus]
    data = b"\xef\xbb\xbf" + write_jsonl(tmp_path / "plain.jsonl", records).read_bytes()
    source = tmp_path / "bom.jsonl"
    source.write_bytes(compress(data) if compress else data)
    spec = TokenizerSpec("GPT2BPETokenizer", *gpt2_files)
    config = PrepareConfig([str(source)], str(tmp_path / "out"), spec, chunk_bytes=chunk_bytes)
    stats = prepare(config, stream=sys.stdout)
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, False)
    assert stats.documents == len(corpus) and stats.bad_lines == 0


def _python_text_mode_documents(data: bytes) -> list[str]:
    """The documents preprocess_data.py reads: its input in text mode (universal newlines)."""
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines]


@pytest.mark.parametrize(
    ("compress", "chunk_bytes", "workers"), [(None, 1, 1), (None, 7, 2), (gzip.compress, 64, 2)]
)
def test_cr_and_crlf_end_lines_as_in_megatron(
    tmp_path, gpt2_files, corpus, megatron_dataset, compress, chunk_bytes, workers
):
    """A file of old-Mac CR line ends was one line here (not valid JSON, or with --skip-bad-lines
    every document dropped), while Megatron's text-mode read splits it; CRLF split across blocks
    must stay one line end. A CR inside a text is escaped by JSON, so texts keep theirs."""
    ends = [b"\r", b"\r\n", b"\n"]
    data = b"".join(json.dumps({"text": t}).encode() + ends[n % 3] for n, t in enumerate(corpus))
    data = data[:-1]  # the last line without its end
    source = tmp_path / "mac.jsonl"
    source.write_bytes(compress(data) if compress else data)
    spec = TokenizerSpec("GPT2BPETokenizer", *gpt2_files)
    config = PrepareConfig(
        [str(source)], str(tmp_path / "out"), spec, workers=workers, chunk_bytes=chunk_bytes
    )
    stats = prepare(config, stream=sys.stdout)
    assert _python_text_mode_documents(data) == corpus
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, False)
    assert stats.documents == len(corpus) and stats.bad_lines == 0


def test_a_bad_line_after_cr_line_ends_is_named_by_its_line_number(tmp_path, gpt2_files):
    source = tmp_path / "mac.jsonl"
    source.write_bytes(b'{"text": "a"}\r{"text": "b"}\r\n\r{bad\r{"text": "c"}\r')
    config = PrepareConfig([str(source)], str(tmp_path / "o"), TokenizerSpec("GPT2BPETokenizer", *gpt2_files))
    with pytest.raises(DataError, match=f"^{source}:3: "):  # the empty line 3, as an editor counts
        prepare(config, stream=sys.stdout)


def _two_bzip2_streams(data: bytes) -> bytes:
    """What pbzip2 writes: the input in parts, each its own bzip2 stream, one after the other."""
    return bz2.compress(data[:100]) + bz2.compress(data[100:])


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_text_is_refused_whole(tmp_path, gpt2_files, capsys, encoding):
    """UTF-16 jsonl (PowerShell 5's `>` writes it): every line was 'not valid JSON', and with
    --skip-bad-lines the run succeeded with every document of the file dropped."""
    source = tmp_path / "ps.jsonl"
    text = '{"text": "one"}\n{"text": "two"}\n'
    source.write_bytes(text.encode(encoding) if encoding == "utf-16" else b"\xfe\xff" + text.encode(encoding))
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out" / "o")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1", "--skip-bad-lines"]) == 2
    err = capsys.readouterr().err
    assert f"{source}: UTF-16 text" in err and "iconv -f UTF-16 -t UTF-8" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".zst", ".bz2", ".pbz2"])
def test_compressed_inputs(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, suffix):
    """A .bz2 input (older dumps, Pushshift's) was read as text: 'not valid UTF-8 (byte 0)' at line 1."""
    plain = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus]).read_bytes()
    compress = {
        ".gz": gzip.compress,
        ".xz": lzma.compress,
        ".zst": zstandard.ZstdCompressor().compress,
        ".bz2": bz2.compress,
        ".pbz2": _two_bzip2_streams,
    }[suffix]
    (tmp_path / f"in.jsonl{suffix}").write_bytes(compress(plain))
    argv = ["data", "prepare", "--input", str(tmp_path / f"in.jsonl{suffix}"), "--output-prefix"]
    assert main([*argv, str(tmp_path / "out"), *gpt2_flags(gpt2_files), "--workers", "1"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, False)


def _skippable_frame(payload: bytes, magic: int = 0x184D2A50) -> bytes:
    """A zstd skippable frame (RFC 8878 section 3.1.2): magic, payload size, payload."""
    return struct.pack("<II", magic, len(payload)) + payload


@pytest.mark.parametrize("layout", ["pzstd", "seek table"])
def test_zstd_with_skippable_frames(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, layout):
    """pzstd puts a skippable frame (the next frame's size) before every frame, so its files do not
    start with the zstd magic: they were read as text, 'not valid UTF-8' at line 1 (and --skip-bad-lines
    dropped every document). A seekable file ends with one (its seek table)."""
    plain = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus]).read_bytes()
    frames = [zstandard.ZstdCompressor().compress(part) for part in (plain[:100], plain[100:])]
    if layout == "pzstd":
        data = b"".join(_skippable_frame(struct.pack("<I", len(frame))) + frame for frame in frames)
    else:
        data = b"".join(frames) + _skippable_frame(b"\x00" * 9, 0x184D2A5E)
    (tmp_path / "in.jsonl.zst").write_bytes(data)
    argv = ["data", "prepare", "--input", str(tmp_path / "in.jsonl.zst"), "--output-prefix"]
    assert main([*argv, str(tmp_path / "out"), *gpt2_flags(gpt2_files), "--workers", "1"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, False)


def test_pipes_are_inputs(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, capsys):
    """`--input <(zstdcat a.zst)` or a named pipe, plain or compressed, beside a file: each was
    'no such file' (and sniffing the compression by reopening would have lost a pipe's first bytes)."""
    records = [{"text": t} for t in corpus]
    plain = write_jsonl(tmp_path / "plain.jsonl", records[:4]).read_bytes()
    write_jsonl(tmp_path / "file.jsonl", records[4:6])
    parts = [plain, zstandard.ZstdCompressor().compress(plain), gzip.compress(plain), lzma.compress(plain)]
    writers, fifos = [], []
    for n, data in enumerate(parts):
        (tmp_path / f"data{n}").write_bytes(data)
        os.mkfifo(tmp_path / f"pipe{n}")
        fifos.append(str(tmp_path / f"pipe{n}"))
        writers.append(subprocess.Popen(["sh", "-c", f"cat data{n} > pipe{n}"], cwd=tmp_path))
    inputs = [fifos[0], str(tmp_path / "file.jsonl"), *fifos[1:]]
    argv = ["data", "prepare", "--input", *inputs, "--output-prefix", str(tmp_path / "out"), "--workers", "2"]
    try:
        assert main([*argv, *gpt2_flags(gpt2_files), "--log-interval", "1"]) == 0
        assert [writer.wait(timeout=30) for writer in writers] == [0] * len(parts)
    finally:
        for writer in writers:  # a writer whose pipe was never opened waits for a reader forever
            writer.kill()
    assert outputs(tmp_path / "out") == megatron_dataset(corpus[:6] + corpus[:4] * 3, False)
    assert "ETA" not in capsys.readouterr().err  # a pipe's size is unknown


def test_huggingface_tokenizer_json(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset):
    """The HF path (type implied by --tokenizer-model) gives the same bytes on the GPT-2 vocab."""
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    load_gpt2_bpe(*gpt2_files, backend="hf").tokenizer.save(str(tmp_path / "tokenizer.json"))
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus])
    argv = [
        "data",
        "prepare",
        "--input",
        str(source),
        "--output-prefix",
        str(tmp_path / "out"),
        "--append-eod",
    ]
    assert main([*argv, "--tokenizer-model", str(tmp_path / "tokenizer.json"), "--workers", "2"]) == 0
    assert outputs(tmp_path / "out") == megatron_dataset(corpus, True)


BAD_LINES = [
    (b'{"text": "ok"', "not valid JSON"),
    (b'{"body": "no text key"}', "no key 'text'"),
    (b'{"text": {"a": "b"}}', "value of 'text' is an object, expected a string or an array of strings"),
    (b'{"text": 42}', "value of 'text' is a number"),
    (b'{"text": ["a", 1]}', "item 1 (from 0) of the array of 'text' is a number, expected a string"),
    (b'{"text": [["nested"]]}', "item 0 (from 0) of the array of 'text' is an array, expected a string"),
    (b'{"text": "caf\xe9"}', "not valid UTF-8"),
    (b"[1, 2]", "expected a JSON object, got an array"),
    (b"", "empty line"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_line_stops_and_leaves_nothing(tmp_path, gpt2_files, capsys, line, message):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "one"}\n{"text": "two"}\n' + line + b'\n{"text": "four"}\n')
    out_dir = tmp_path / "out"
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(out_dir / "ds")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"gptrain: error: {source}:3: {message}")
    assert not out_dir.exists()  # no .bin/.idx, no temporary files, no directory made for them


def test_a_failed_run_removes_the_directories_it_made_and_keeps_the_users(tmp_path, gpt2_files, capsys):
    """--output-prefix in directories that did not exist: they were made, and left empty after a bad
    line stopped the run (one for each typo of the path). Those it made go; one that was there stays."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "one"}\n{"text": 2}\n')
    flags = [*gpt2_flags(gpt2_files), "--workers", "1", "--json-keys", "text", "title"]
    made = tmp_path / "new" / "deeper"
    assert main(["data", "prepare", "--input", str(source), "--output-prefix", str(made / "ds"), *flags]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    assert (
        main(["data", "prepare", "--input", str(source), "--output-prefix", str(mine / "x" / "ds"), *flags])
        == 2
    )
    assert sorted(p.name for p in mine.iterdir()) == ["notes"]
    capsys.readouterr()


def test_a_failed_run_removes_what_it_made_through_dot_dot_and_keeps_what_was_there(
    tmp_path, gpt2_files, capsys
):
    """--output-prefix notyet/../prepared/ds: 'missing' was decided by Path.exists on the path as written,
    where an existing prepared/ looks missing until notyet/ is made; a failed run then removed the
    user's prepared/ and left notyet/ behind. What os.mkdir made goes, and only that."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "one"}\n{"text": 2}\n')
    (tmp_path / "prepared").mkdir()
    flags = [*gpt2_flags(gpt2_files), "--workers", "1"]
    output = f"{tmp_path}/notyet/../prepared/ds/x"
    assert main(["data", "prepare", "--input", str(source), "--output-prefix", output, *flags]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "prepared"]
    assert list((tmp_path / "prepared").iterdir()) == []
    capsys.readouterr()


def test_an_output_that_cannot_be_made_removes_the_directories_made_for_it(tmp_path, gpt2_files, capsys):
    """--output-prefix notyet/../notes.txt/ds with notes.txt a file: notyet/ was made on the way and left
    behind when the next level failed, before any writer existed to clean up."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "one"}\n')
    (tmp_path / "notes.txt").write_text("mine\n")
    output = f"{tmp_path}/notyet/../notes.txt/ds"
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", output]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: {output}_text_document.bin: cannot create the output ({tmp_path}/notyet/../notes.txt: "
        "is a file, where a directory is needed)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "notes.txt"]


def test_an_output_directory_that_may_not_be_made_is_named_with_the_reason(
    tmp_path, gpt2_files, capsys, write_jsonl, refuse_search
):
    """An --output-prefix two levels into a directory this user may not search: asking whether the first
    level existed raised PermissionError (Python 3.11's Path.exists), the generic 'Permission denied'
    line; the writer's own line names the output and the directory it could not make."""
    locked = tmp_path / "locked"
    locked.mkdir()
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    refuse_search(locked, also=[(os, "open"), (os, "mkdir")])
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(locked / "sub" / "o")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: {locked}/sub/o_text_document.bin: cannot create the output ({locked}/sub: "
        "Permission denied)\n"
    )


def test_bad_line_late_in_parallel_run_leaves_nothing(tmp_path, gpt2_files, write_jsonl):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"document {n}"} for n in range(200)])
    with open(source, "ab") as handle:
        handle.write(b"not json\n")
    config = PrepareConfig([str(source)], str(tmp_path / "out" / "ds"), TokenizerSpec("gpt2bpe", *gpt2_files))
    with pytest.raises(DataError, match=r"in.jsonl:201: not valid JSON"):
        prepare(PrepareConfig(**{**config.__dict__, "workers": 2, "chunk_bytes": 100}), stream=sys.stdout)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("failing_key", ["text", "title"])
def test_failure_finishing_any_key_leaves_every_old_output(
    tmp_path, gpt2_files, write_jsonl, monkeypatch, failing_key
):
    """Several --json-keys are finished as one: a failure writing any .idx (a full disk) leaves
    all the old outputs, never some old and some new."""
    from gptrain.data.indexed import IndexedDatasetWriter

    old = write_jsonl(tmp_path / "old.jsonl", [{"text": "old text", "title": "old title"}])
    new = write_jsonl(tmp_path / "new.jsonl", [{"text": "new text", "title": "new title"}] * 3)
    spec = TokenizerSpec("gpt2bpe", *gpt2_files)
    config = PrepareConfig([str(old)], str(tmp_path / "out" / "o"), spec, json_keys=("text", "title"))
    prepare(config, stream=sys.stdout)
    before = {key: outputs(tmp_path / "out" / "o", key) for key in config.json_keys}
    write_index = IndexedDatasetWriter._write_index

    def full_disk(self, path):
        if self.path_prefix.endswith(f"_{failing_key}_document"):
            raise OSError(28, "No space left on device")
        write_index(self, path)

    monkeypatch.setattr(IndexedDatasetWriter, "_write_index", full_disk)
    with pytest.raises(DataError, match=r"cannot write .*No space left on device"):
        prepare(PrepareConfig(**{**config.__dict__, "inputs": [str(new)]}), stream=sys.stdout)
    assert {key: outputs(tmp_path / "out" / "o", key) for key in config.json_keys} == before
    assert (
        len(list((tmp_path / "out").iterdir())) == 6
    )  # no temporary files (each pair and its tokenizer record)


def _die(chunk):
    os._exit(3)  # a worker killed mid-run (OOM killer, kill -9)


def test_progress_counts_a_chunk_when_its_result_is_written(tmp_path, gpt2_files, write_jsonl, monkeypatch):
    """With workers, 2 x workers chunks are read ahead of the writer; the percentage and ETA must
    follow the chunks written, not the chunks read."""
    from gptrain.data import prepare as prepare_module

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"document number {n}"} for n in range(200)])
    seen: list[tuple[int, float]] = []
    update = prepare_module._InputProgress.update

    def record(self, done=0, nbytes=0):
        update(self, done, nbytes)
        seen.append((self.raw_done, self.bytes))

    monkeypatch.setattr(prepare_module._InputProgress, "update", record)
    spec = TokenizerSpec("gpt2bpe", *gpt2_files)
    config = PrepareConfig([str(source)], str(tmp_path / "o"), spec, workers=2, chunk_bytes=256)
    prepare(config, stream=open(tmp_path / "log", "w"))  # noqa: SIM115
    assert len(seen) > 8
    # Plain text: the position read is the bytes written plus the part line after the last chunk.
    assert all(written <= position < written + 256 for position, written in seen), seen
    assert seen[-1] == (source.stat().st_size, source.stat().st_size)


def test_dead_worker_is_an_error_not_a_hang(tmp_path, gpt2_files, write_jsonl, monkeypatch):
    from gptrain.data import prepare as prepare_module

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"document {n}"} for n in range(50)])
    monkeypatch.setattr(prepare_module, "encode_chunk", _die)
    config = PrepareConfig(
        [str(source)], str(tmp_path / "out" / "ds"), TokenizerSpec("gpt2bpe", *gpt2_files), workers=2
    )
    with pytest.raises(DataError, match="worker process died"):
        prepare(config, stream=sys.stdout)
    assert not (tmp_path / "out").exists()


def test_skip_bad_lines(tmp_path, gpt2_files, capsys, megatron_dataset):
    source = tmp_path / "in.jsonl"
    good = ["one", "", "three"]
    lines = [json.dumps({"text": good[0]}).encode(), b"{bad", json.dumps({"text": good[1]}).encode()]
    lines += [b'{"text": null}', json.dumps({"text": good[2]}).encode()]
    source.write_bytes(b"\n".join(lines))  # no newline after the last line
    argv = [
        "data",
        "prepare",
        "--input",
        str(source),
        "--output-prefix",
        str(tmp_path / "o"),
        "--skip-bad-lines",
    ]
    assert main([*argv, *gpt2_flags(gpt2_files), "--append-eod", "--workers", "1"]) == 0
    assert "prepared 3 documents (1 empty, 2 bad lines skipped)" in capsys.readouterr().out
    assert outputs(tmp_path / "o") == megatron_dataset(good, True)


def test_lines_only_python_json_reads_are_documents(tmp_path, gpt2_files, capsys, megatron_dataset):
    """NaN, Infinity and 1e400 (json.dumps writes the first two) are JSON to Megatron's json.loads."""
    source = tmp_path / "in.jsonl"
    extras = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"[NaN, 1]"]
    lines = [b'{"text": "doc %d", "score": %s}' % (n, value) for n, value in enumerate(extras)]
    source.write_bytes(b"\n".join([*lines, b'{"text": "last"}', b""]))
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "o")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--append-eod", "--workers", "1"]) == 0
    assert "0 bad lines skipped" in capsys.readouterr().out
    texts = [f"doc {n}" for n in range(len(extras))] + ["last"]
    assert outputs(tmp_path / "o") == megatron_dataset(texts, True)


@pytest.fixture
def hf_tokenizer_json(tmp_path, gpt2_files) -> str:
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    path = tmp_path / "tokenizer.json"
    load_gpt2_bpe(*gpt2_files, backend="hf").tokenizer.save(str(path))
    return str(path)


@pytest.mark.parametrize("tokenizer", ["hf", "gpt2"])
def test_lone_surrogate_is_a_bad_line(
    tmp_path, gpt2_files, hf_tokenizer_json, capsys, megatron_dataset, tokenizer
):
    """JSON may escape half a surrogate pair; json.loads reads it, no tokenizer can encode it
    (HF's raised a TypeError). Outside the --json-keys it does no harm."""
    source = tmp_path / "in.jsonl"
    lines = [b'{"text": "ok"}', b'{"text": "bad \\ud800 surrogate"}', b'{"text": "fine", "meta": "\\udfff"}']
    source.write_bytes(b"\n".join([*lines, b'{"text": "pair \\ud83d\\ude00 ok"}', b""]))
    flags = ["--tokenizer-model", hf_tokenizer_json] if tokenizer == "hf" else gpt2_flags(gpt2_files)
    argv = ["data", "prepare", "--input", str(source), *flags, "--workers", "1", "--output-prefix"]
    assert main([*argv, str(tmp_path / "out" / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{source}:2: value of 'text' holds a lone surrogate \\ud800 (not valid Unicode)" in err
    assert not (tmp_path / "out").exists()
    assert main([*argv, str(tmp_path / "o"), "--skip-bad-lines"]) == 0
    assert "prepared 3 documents (0 empty, 1 bad line skipped)" in capsys.readouterr().out
    assert outputs(tmp_path / "o") == megatron_dataset(["ok", "fine", "pair \U0001f600 ok"], False)


def _failing_encode(self, texts):
    raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")


def _gapped_tokenizer(tmp_path: Path) -> TokenizerSpec:
    """4 tokens, one of id 70,000: a tokenizer.json whose ids run past its count."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1, "<|endoftext|>": 2, "b": 70000}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "gap.json"))
    return TokenizerSpec("HuggingFaceTokenizer", model=str(tmp_path / "gap.json"))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_vocabulary_numbered_with_gaps_gets_a_dtype_that_holds_its_highest_id(
    tmp_path, write_jsonl, workers
):
    """Its size is the highest id + 1 (70,001): int32 tokens, 70,000 written as itself (by the count
    of its tokens, 4, Megatron's rule picked uint16 and 70,000 became 4,464, silently another token)."""
    from gptrain.data.indexed import IndexedDataset

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a a"}, {"text": "a b a"}])
    config = PrepareConfig(
        [str(source)], str(tmp_path / "out" / "o"), _gapped_tokenizer(tmp_path), workers=workers
    )
    prepare(config, stream=sys.stdout)
    dataset = IndexedDataset(str(tmp_path / "out" / "o_text_document"))
    assert dataset.dtype == np.int32 and [list(dataset[i]) for i in range(2)] == [[0, 0], [0, 70000, 0]]


@pytest.mark.parametrize("workers", [1, 2])
def test_an_id_past_the_token_dtype_is_refused(tmp_path, write_jsonl, monkeypatch, workers):
    """The backstop where a tokenizer's ids still run past the dtype its size chose: refused naming
    the lines, never written wrapped. With workers the refusal comes from a worker process, after
    earlier chunks were written: nothing is left, and an older output of the prefix stays whole."""
    import gptrain.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "optimal_dtype", lambda vocab_size, entries=None: np.dtype(np.uint16))
    spec = _gapped_tokenizer(tmp_path)
    old = write_jsonl(tmp_path / "old.jsonl", [{"text": "a"}])
    prepare(PrepareConfig([str(old)], str(tmp_path / "out" / "o"), spec, workers=1), stream=sys.stdout)
    before = outputs(tmp_path / "out" / "o")
    records = [{"text": "a a"}] * 60 + [{"text": "a b a"}] + [{"text": "a"}] * 20
    source = write_jsonl(tmp_path / "in.jsonl", records)
    config = PrepareConfig([str(source)], str(tmp_path / "out" / "o"), spec, workers=workers, chunk_bytes=64)
    message = r"in\.jsonl:(\d+)-(\d+): the tokenizer gives id 70,000 .* past the uint16"
    with pytest.raises(DataError, match=message) as caught:
        prepare(config, stream=sys.stdout)
    first, last = map(int, re.search(message, str(caught.value)).groups())
    assert first <= 61 <= last < 81, "the lines named hold the line of id 70,000"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "o_text_document.bin",
        "o_text_document.idx",
        "o_text_document.tokenizer",
    ]
    assert outputs(tmp_path / "out" / "o") == before


def test_tokenizer_failure_is_a_data_error(tmp_path, hf_tokenizer_json, write_jsonl, monkeypatch):
    """A backstop: whatever a tokenizer raises on parsed text names the file and lines, no traceback."""
    from gptrain.data.tokenizer_wrappers import HFTokenizer

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"document {n}"} for n in range(40)])
    monkeypatch.setattr(HFTokenizer, "encode_flat", _failing_encode)
    spec = TokenizerSpec("HuggingFaceTokenizer", model=hf_tokenizer_json)
    config = PrepareConfig([str(source)], str(tmp_path / "out" / "o"), spec, chunk_bytes=200)
    message = r"in.jsonl:1-\d+: the tokenizer cannot encode the 'text' value of a line here \(TypeError: "
    for workers in (1, 2):
        with pytest.raises(DataError, match=message):
            prepare(PrepareConfig(**{**config.__dict__, "workers": workers}), stream=sys.stdout)
        assert not (tmp_path / "out").exists()


def test_input_and_tokenizer_errors(tmp_path, gpt2_files, capsys, write_jsonl):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    (tmp_path / "broken.jsonl.gz").write_bytes(gzip.compress(source.read_bytes() * 50)[:30])
    data = zstandard.ZstdCompressor().compress(source.read_bytes() * 50)
    (tmp_path / "cut.jsonl.zst").write_bytes(data[: len(data) // 2])
    data = bz2.compress(source.read_bytes() * 50)
    (tmp_path / "cut.jsonl.bz2").write_bytes(data[: len(data) // 2])
    cases = [
        (["--input", str(tmp_path / "nope.jsonl"), *gpt2_flags(gpt2_files)], "nope.jsonl: no such file"),
        (  # a directory was 'no such file' too
            ["--input", str(tmp_path), *gpt2_flags(gpt2_files)],
            f"--input {tmp_path}: is a directory; pass its files (e.g. --input '{tmp_path}/*.jsonl', quoted)",
        ),
        (["--input", str(tmp_path / "*.parquet"), *gpt2_flags(gpt2_files)], "no file matches"),
        (
            ["--input", str(source), "--vocab-file", "v.json", "--merge-file", gpt2_files[1]],
            "vocab file v.json not found",
        ),
        (
            ["--input", str(source), "--vocab-file", gpt2_files[0], "--merge-file", str(source)],
            """in.jsonl:1: '{"text":' is not in the vocab file; the merges do not belong""",
        ),
        (
            ["--input", str(tmp_path / "broken.jsonl.gz"), *gpt2_flags(gpt2_files)],
            "cannot decompress gzip input",
        ),
        (
            ["--input", str(tmp_path / "cut.jsonl.zst"), *gpt2_flags(gpt2_files)],
            "cannot decompress zstd input",
        ),
        (
            ["--input", str(tmp_path / "cut.jsonl.bz2"), *gpt2_flags(gpt2_files)],
            "cut.jsonl.bz2: cannot decompress bzip2 input",
        ),
        (["--input", str(source), "--tokenizer-type", "HuggingFaceTokenizer"], "needs --tokenizer-model"),
        (["--input", str(source)], "give a tokenizer: --vocab-file/--merge-file"),
        (
            ["--input", str(source), "--json-keys", "text", "text", *gpt2_flags(gpt2_files)],
            "--json-keys text text: 'text' given more than once; name each key once",
        ),
        (
            ["--input", str(source), "--dataset-impl", "lazy", *gpt2_flags(gpt2_files)],
            "--dataset-impl lazy: gptrain writes Megatron's mmap format only",
        ),
        (
            ["--input", str(source), "--split-sentences", *gpt2_flags(gpt2_files)],
            "GPT pretraining reads whole documents: drop it",
        ),
        (
            ["--input", str(source), "--partitions", "0", *gpt2_flags(gpt2_files)],
            "--partitions must be at least 1",
        ),
    ]
    for flags, message in cases:
        code = main(
            ["data", "prepare", *flags, "--output-prefix", str(tmp_path / "out" / "o"), "--workers", "1"]
        )
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, (flags, err)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# `gptrain ...` with every chunk taking a minute to encode and every merged input a minute
# to add, so a SIGTERM surely lands mid-run, with the temporary files in place.
SLOW_GPTRAIN = """
import sys, time
from gptrain.cli import main
from gptrain.data import indexed, prepare

encode, add_index = prepare.encode_chunk, indexed.IndexedDatasetWriter.add_index


def slow_encode(chunk):  # a module-level function: forked workers unpickle it by name
    time.sleep(60)
    return encode(chunk)


def slow_add_index(self, prefix, **kwargs):
    add_index(self, prefix, **kwargs)
    time.sleep(60)


prepare.encode_chunk = slow_encode
indexed.IndexedDatasetWriter.add_index = slow_add_index
sys.exit(main(sys.argv[1:]))
"""


def _terminate_mid_run(argv: list[str], out_dir: Path, whole_group: bool) -> subprocess.CompletedProcess:
    """Run SLOW_GPTRAIN, wait for its temporary files, SIGTERM it (or its process group, as
    `timeout` and Slurm do), and return how it ended."""
    import signal
    import time

    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_GPTRAIN, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".tmp") for p in out_dir.glob(".*")) and process.poll() is None:
        assert time.monotonic() < deadline, "no temporary files appeared"
        time.sleep(0.01)
    time.sleep(0.3)  # let a worker pool start
    assert process.poll() is None, process.communicate()
    if whole_group:
        os.killpg(process.pid, signal.SIGTERM)
    else:
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize(("workers", "whole_group"), [(1, False), (2, True)])
def test_sigterm_leaves_no_temporary_files(tmp_path, gpt2_files, write_jsonl, workers, whole_group):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"document {n}"} for n in range(50)])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(out_dir / "ds")]
    ended = _terminate_mid_run(
        [*argv, *gpt2_flags(gpt2_files), "--workers", str(workers)], out_dir, whole_group
    )
    assert list(out_dir.iterdir()) == [] and "Traceback" not in ended.stderr, ended.stderr
    if whole_group:  # the workers die too; the main process may see that first
        assert ended.returncode in (2, 128 + 15) and ended.stderr.count("gptrain: ") == 1
    else:
        assert ended.returncode == 128 + 15 and ended.stderr.endswith("gptrain: terminated by SIGTERM\n")


def test_sigterm_during_merge_leaves_no_temporary_files(tmp_path):
    from gpt_data_helpers import write_dataset

    parts = [write_dataset(tmp_path / f"part{n}", [5, 6, 7]) for n in range(2)]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ended = _terminate_mid_run(
        ["data", "merge", "--input", *parts, "--output-prefix", str(out_dir / "m")], out_dir, False
    )
    assert ended.returncode == 128 + 15 and "gptrain: terminated by SIGTERM" in ended.stderr
    assert list(out_dir.iterdir()) == []


def test_terminate_as_exception_restores_the_handler():
    import signal
    import time

    from gptrain.utils.signals import Terminated, terminate_as_exception

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as raised, terminate_as_exception():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this at the latest
    assert raised.value.status == 143 and str(raised.value) == "terminated by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with terminate_as_exception():  # an ignored signal stays ignored
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_help_imports_nothing_heavy():
    code = (
        "import sys, contextlib, io\n"
        "from gptrain.cli import main\n"
        "for argv in (['data', '--help'], ['data', 'prepare', '--help'], ['data', 'inspect', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n            main(argv)\n        except SystemExit:\n            pass\n"
        "heavy = ('torch', 'numpy', 'tiktoken', 'tokenizers', 'orjson', 'zstandard')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_an_input_that_cannot_be_opened_is_named_as_the_input(tmp_path, gpt2_files, monkeypatch):
    """An unreadable --input was reported as `--output-prefix ...: cannot write (... the input ...)`."""
    import gptrain.data.prepare as prepare_module

    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "one"}\n')

    def refused(paths, *args):
        raise PermissionError(13, "Permission denied", str(paths[0]))
        yield  # a generator, as the real one

    monkeypatch.setattr(prepare_module, "_tracked_chunks", refused)
    config = PrepareConfig([str(source)], str(tmp_path / "out" / "ds"), TokenizerSpec("gpt2bpe", *gpt2_files))
    with pytest.raises(DataError) as error:
        prepare(config, stream=sys.stdout)
    assert str(error.value) == f"--input {source}: cannot read (Permission denied)"


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_bad_lines_refuses_an_input_of_only_bad_lines(tmp_path, gpt2_files, capsys, workers):
    """Every line bad (here: the wrong --json-keys) exited 0 with an empty dataset."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(json.dumps({"content": f"doc {n}"}).encode() + b"\n" for n in range(5)))
    out = tmp_path / "out"
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(out / "o"), "--skip-bad-lines"]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", str(workers)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"--input {source}: all 5 lines were bad" in err and "--json-keys (text)" in err
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_bad_lines_refuses_one_input_of_only_bad_lines_among_good_ones(
    tmp_path, gpt2_files, capsys, write_jsonl, workers
):
    """With several inputs, a file whose every line was bad (another corpus's field name) exited 0:
    the dataset silently lacked all of that file's documents."""
    good = write_jsonl(tmp_path / "a.jsonl", [{"text": f"doc {n}"} for n in range(3)])
    wrong_key = write_jsonl(tmp_path / "b.jsonl", [{"content": f"doc {n}"} for n in range(4)])
    mixed = tmp_path / "c.jsonl"  # some bad lines, some documents: skipped as asked
    mixed.write_bytes(b'{"text": "kept"}\n{bad\n')
    out = tmp_path / "out"
    inputs = ["--input", str(good), str(wrong_key), str(mixed), "--output-prefix", str(out / "o")]
    argv = ["data", "prepare", *inputs, "--skip-bad-lines", *gpt2_flags(gpt2_files)]
    assert main([*argv, "--workers", str(workers)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"--input {wrong_key}: all 4 lines were bad;" in err and "--json-keys (text)" in err
    assert not out.exists() or list(out.iterdir()) == []
    argv.remove(str(wrong_key))
    assert main([*argv, "--workers", str(workers)]) == 0
    assert "prepared 4 documents (0 empty, 1 bad line skipped)" in capsys.readouterr().out


@pytest.mark.parametrize("holder", [".", "sub"], ids=["in it", "deeper under it"])
def test_an_input_under_a_directory_that_may_not_be_searched_names_that_directory(
    tmp_path, gpt2_files, capsys, write_jsonl, refuse_search, holder
):
    """Was 'gptrain: error: <file>: Permission denied (GPTRAIN_DEBUG=1 shows where)': no --input, no
    advice; then, deeper under it, named the directory holding the file, which may be searched as far
    as anyone knows, not the one that refused the lookup. Root may search any directory, so the
    refusal of a shared file system is stood in for."""
    locked = tmp_path / "locked"
    (locked / holder).mkdir(parents=True, exist_ok=True)
    source = write_jsonl(locked / holder / "in.jsonl", [{"text": "x"}])
    refuse_search(locked)
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out" / "o")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: --input {source}: cannot be looked up (Permission denied); check the permissions "
        f"of {locked} and the directories above it\n"
    )
    assert not (tmp_path / "out").exists()


def test_an_output_prefix_in_a_directory_that_may_not_be_searched_is_the_output_refused(
    tmp_path, gpt2_files, capsys, write_jsonl, monkeypatch, refuse_search
):
    """The check that no output is also an input asked pathlib whether the output exists, which
    raised: 'gptrain: error: <out>.bin: Permission denied (GPTRAIN_DEBUG=1 shows where)'. Now the
    writer's line, naming the output. Root may search any directory: the refusal is stood in for."""
    locked = tmp_path / "locked"
    locked.mkdir()
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    refuse_search(locked, also=[(os, "open")])
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(locked / "o")]
    assert main([*argv, *gpt2_flags(gpt2_files), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptrain: error: {locked}/o_text_document.bin: cannot create the output (")
    assert err.endswith(": Permission denied)\n") and err.count("\n") == 1
    monkeypatch.undo()
    assert list(locked.iterdir()) == []


def test_rates_below_ten_a_second_keep_two_digits():
    """Two documents of millions of characters took 32 s: the summary said '0 docs/s'."""
    import io

    from gptrain.data.prepare import PrepareStats
    from gptrain.utils.progress import Progress

    stats = PrepareStats(
        documents=2, tokens=7_000_001, input_bytes=2**25, seconds=32.0, outputs=["long_text_document"]
    )
    assert "in 32.0 s (0.062 docs/s, 1.00 MB/s)" in stats.summary()
    assert "(12,500 docs/s," in PrepareStats(documents=400_000, seconds=32.0).summary()
    progress = Progress("prepare", unit="docs", stream=io.StringIO())
    progress.start -= 4.0
    progress.done = 6
    assert progress.line(progress.start + 4.0) == "prepare: 6 docs | 1.5 docs/s"
