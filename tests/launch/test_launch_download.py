import bz2
import contextlib
import fcntl
import gzip
import hashlib
import http.server
import io
import lzma
import os
import random
import struct
import subprocess
import sys
import threading
import time

import pytest
import yaml
import zstandard

from gptrain.errors import ConfigError, DataError
from gptrain.launch.data_blend import apply_blend, blend_prefixes, count_tokens
from gptrain.launch.download import fetch_tokenizer_files, main
from gptrain.launch.extraction import extract
from gptrain.launch.resumable_download import (
    another_version,
    download,
    fetch_once,
    response_validator,
    writing_alone,
)
from gptrain.launch.shards import Shard, parse_shards

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


class Server:
    """Serves `files` on 127.0.0.1 with Range support; `flaky` paths die halfway the first time."""

    def __init__(
        self,
        files: dict[str, bytes],
        flaky: tuple[str, ...] = (),
        from_zero: bool = False,
        replaced: dict[str, bytes] | None = None,
        if_range: bool = True,
        etag_on_206: bool = True,
        throttled: int = 0,
    ):
        self.files, self.flaky, self.requests = files, set(flaky), []
        self.from_zero = from_zero  # a broken server: 206 answers that start at byte 0 whatever was asked
        self.replaced = replaced or {}  # a flaky path's file is replaced by this once it has died
        self.if_range = if_range  # False: If-Range is ignored (the Range is served whatever it says)
        self.if_ranges: list[str | None] = []
        self.etag_on_206 = etag_on_206  # False: a 206 carries Last-Modified, not the ETag of the 200
        self.throttled = throttled  # the first requests answered 429 Too Many Requests (Retry-After: 3)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                data = server.files.get(self.path)
                if server.throttled:
                    server.throttled -= 1
                    self.send_response(429)
                    self.send_header("Retry-After", "3")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if data is None:
                    self.send_error(404)
                    return
                start = (
                    int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
                )
                etag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'
                server.if_ranges.append(self.headers.get("If-Range"))
                if server.if_range and self.headers.get("If-Range") not in (None, etag):
                    start = 0  # another version of the file: the whole of it, as RFC 9110 says
                if start >= len(data) and start:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                ranged, start = bool(start), 0 if server.from_zero else start
                self.send_response(206 if ranged else 200)
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                if server.etag_on_206 or not ranged:
                    self.send_header("ETag", etag)
                self.send_header("Last-Modified", "Tue, 01 Sep 2026 10:00:00 GMT")
                self.end_headers()
                if self.path in server.flaky:
                    server.flaky.discard(self.path)
                    if self.path in server.replaced:
                        server.files[self.path] = server.replaced[self.path]
                    self.wfile.write(data[start : len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_interrupted_download_resumes_with_range(tmp_path):
    with Server({"/a.bin": PAYLOAD}, flaky=("/a.bin",)) as server:
        sha = hashlib.sha256(PAYLOAD).hexdigest()
        dest = download(Shard(server.url + "/a.bin", sha256=sha), tmp_path / "a.bin", retries=3, backoff=0)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/a.bin", None), ("/a.bin", f"bytes={len(PAYLOAD) // 2}-")]
    assert not (tmp_path / "a.bin.part").exists()


def test_a_resume_carries_if_range_with_the_first_responses_etag(tmp_path):
    etag = f'"{hashlib.sha256(PAYLOAD).hexdigest()[:16]}"'
    with Server({"/a.bin": PAYLOAD}, flaky=("/a.bin",)) as server:
        dest = download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=3, backoff=0)
    assert dest.read_bytes() == PAYLOAD and server.if_ranges == [None, etag]
    assert sorted(tmp_path.iterdir()) == [dest]  # no part, no validator left


@pytest.mark.parametrize("if_range", [True, False])
def test_a_file_replaced_upstream_between_attempts_is_not_stitched(tmp_path, if_range):
    """A resume asked for the rest by Range alone: the new version's tail was appended to the old
    version's head, a corrupt shard (undetected without a checksum). If-Range now makes the server
    send the new file whole; a server that ignores If-Range is caught by its 206's ETag."""
    new = bytes(reversed(PAYLOAD))
    files, replaced = {"/a.bin": PAYLOAD}, {"/a.bin": new}
    with Server(files, flaky=("/a.bin",), replaced=replaced, if_range=if_range) as server:
        dest = download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=3, backoff=0)
    assert dest.read_bytes() == new
    assert sorted(tmp_path.iterdir()) == [dest]


@pytest.mark.parametrize(
    "headers, validator",
    [
        ({"ETag": '"abc"', "Last-Modified": "Tue, 01 Sep 2026 10:00:00 GMT"}, ("ETag", '"abc"')),
        (
            {"ETag": 'W/"abc"', "Last-Modified": "Tue, 01 Sep 2026 10:00:00 GMT"},
            ("Last-Modified", "Tue, 01 Sep 2026 10:00:00 GMT"),
        ),
        ({"ETag": 'W/"abc"'}, None),
        ({}, None),
    ],
)
def test_if_range_takes_a_strong_etag_else_last_modified(headers, validator):
    """If-Range must not carry a weak ETag (RFC 9110 13.1.5): a server would never match it."""
    assert response_validator(headers) == validator


def test_a_206_without_the_etag_is_no_change_of_file(tmp_path):
    """The ETag of the 200 was compared with the Last-Modified of a 206 that left the ETag out: every
    resume started over (and failed once the retries were spent)."""
    with Server({"/a.bin": PAYLOAD}, flaky=("/a.bin",), etag_on_206=False) as server:
        dest = download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=2, backoff=0)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/a.bin", None), ("/a.bin", f"bytes={len(PAYLOAD) // 2}-")]


@pytest.mark.parametrize("sent", ['"abc"', "abc", 'W/"abc"'])
def test_a_206_whose_etag_is_weakened_or_unquoted_is_the_same_file(sent):
    """A CDN that weakens or unquotes the ETag it passes on names the same version (weak comparison,
    RFC 9110 8.8.3.2): such a 206 was taken for another file, and every resume started over."""
    assert not another_version(("ETag", '"abc"'), {"ETag": sent})
    assert another_version(("ETag", '"abc"'), {"ETag": 'W/"abd"'})


def test_a_resume_by_a_later_job_checks_the_validator_too(tmp_path):
    """The part of a killed job, resumed by the next one: its validator is kept beside it."""
    new = bytes(reversed(PAYLOAD))
    with Server({"/a.bin": PAYLOAD}, flaky=("/a.bin",)) as server:
        with pytest.raises(DataError, match="failed after 1 attempts"):
            download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1)
        assert (tmp_path / "a.bin.part").stat().st_size == len(PAYLOAD) // 2
        server.files["/a.bin"] = new
        dest = download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1)
    assert dest.read_bytes() == new and server.requests[-1] == ("/a.bin", f"bytes={len(PAYLOAD) // 2}-")


def test_a_complete_part_is_renamed_without_fetching_it_again(tmp_path):
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD)
    with Server({"/a.bin": PAYLOAD}) as server:
        assert download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1).read_bytes() == PAYLOAD
    assert server.requests == [("/a.bin", f"bytes={len(PAYLOAD)}-")]


def test_a_part_larger_than_the_file_is_fetched_again(tmp_path):
    """The server's 416 ('nothing there') was taken for 'complete': a part larger than the file (the
    file changed since, or the part is another's) became the download, unchecked without a checksum."""
    (tmp_path / "a.bin.part").write_bytes(b"x" * (len(PAYLOAD) + 10))
    with Server({"/a.bin": PAYLOAD}) as server:
        assert download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1).read_bytes() == PAYLOAD
    assert server.requests == [("/a.bin", f"bytes={len(PAYLOAD) + 10}-"), ("/a.bin", None)]


def test_a_resume_the_server_answers_from_another_byte_starts_over(tmp_path):
    """A 206 whose Content-Range starts elsewhere than asked was appended to the part: a corrupt file."""
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD[:1000])
    with Server({"/a.bin": PAYLOAD}, from_zero=True) as server:
        dest = download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=2, backoff=0)
    assert dest.read_bytes() == PAYLOAD and not (tmp_path / "a.bin.part").exists()
    assert server.requests == [("/a.bin", "bytes=1000-"), ("/a.bin", None)]


@pytest.mark.parametrize("from_zero", [False, True])
def test_a_part_started_over_stays_locked_against_a_second_task(tmp_path, from_zero):
    """Starting a part over unlinked it while its lock stayed on the old file: a second task on the
    shard then took a lock on the new one and both wrote it. It is cut to nothing in place now."""
    part = tmp_path / "a.bin.part"
    part.write_bytes(b"x" * (len(PAYLOAD) + 10) if not from_zero else PAYLOAD[:1000])
    with Server({"/a.bin": PAYLOAD}, from_zero=from_zero) as server, writing_alone(part):
        with contextlib.suppress(ConnectionError):  # the 206 from byte 0: this attempt gives up
            fetch_once(server.url + "/a.bin", part, timeout=5)
        with pytest.raises(DataError, match="another task is downloading"), writing_alone(part):
            pass


def test_null_retry_settings_are_the_defaults(tmp_path):
    """`retries: null` (the launch lets null through as 'the default') failed in the job: int(None)."""
    (tmp_path / "src.json").write_bytes(PAYLOAD)
    tokenizer = {"vocab_file": str(tmp_path / "vocab.json"), "vocab_url": f"file://{tmp_path}/src.json"}
    cfg = {"retries": None, "backoff_seconds": None, "timeout_seconds": None, "tokenizer": tokenizer}
    fetch_tokenizer_files(cfg)
    assert (tmp_path / "vocab.json").read_bytes() == PAYLOAD


def test_a_tokenizer_file_is_not_resumed_from_another_tasks_part(tmp_path):
    """Array tasks on several nodes fetch the tokenizer files into one shared folder, each under
    `<name>.<pid>.part`: a task with this one's process id on another node was writing there, and
    this one resumed from its bytes (here 'junk'), making a corrupt vocab.json."""
    (tmp_path / f"vocab.json.{os.getpid()}.part").write_bytes(b"junk")
    with Server({"/vocab.json": PAYLOAD}) as server:
        tokenizer = {"vocab_file": str(tmp_path / "vocab.json"), "vocab_url": server.url + "/vocab.json"}
        fetch_tokenizer_files({"tokenizer": tokenizer, "retries": 1})
    assert (tmp_path / "vocab.json").read_bytes() == PAYLOAD


def test_a_failed_tokenizer_download_leaves_no_part(tmp_path):
    with Server({}) as server, pytest.raises(DataError, match="HTTP 404"):
        tokenizer = {"vocab_file": str(tmp_path / "vocab.json"), "vocab_url": server.url + "/vocab.json"}
        fetch_tokenizer_files({"tokenizer": tokenizer, "retries": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_shard_another_task_is_downloading_is_left_to_it(tmp_path):
    """Two launches' tasks on one shard: the second resumed from the bytes the first was still
    writing, both appending to one part, a corrupt download."""
    part = tmp_path / "a.bin.part"
    part.write_bytes(PAYLOAD[:1000])
    with open(part, "ab") as other, Server({"/a.bin": PAYLOAD}) as server:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the running task's hold
        with pytest.raises(DataError, match="another task is downloading this shard"):
            download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1)
    assert server.requests == [] and part.read_bytes() == PAYLOAD[:1000]
    with Server({"/a.bin": PAYLOAD}) as server:  # once it is gone, the part is resumed
        assert download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1).read_bytes() == PAYLOAD


def test_checksum_mismatch_deletes_the_download(tmp_path):
    with Server({"/a.bin": PAYLOAD}) as server, pytest.raises(DataError, match="md5 mismatch"):
        download(Shard(server.url + "/a.bin", md5="0" * 32), tmp_path / "a.bin", retries=1, backoff=0)
    assert list(tmp_path.iterdir()) == []


def test_a_rate_limited_download_waits_as_asked_and_retries(tmp_path, monkeypatch):
    """HTTP 429 (a hub rate-limiting many array tasks) failed the task at once: 'check the URL'."""
    from gptrain.launch import resumable_download as download_module

    waits = []
    monkeypatch.setattr(download_module.time, "sleep", waits.append)
    with Server({"/a.bin": PAYLOAD}, throttled=2) as server:
        dest = download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=3, backoff=0.5)
    assert dest.read_bytes() == PAYLOAD and len(server.requests) == 3
    assert waits == [3.0, 3.0]  # Retry-After, longer than the backoff's 0.5 and 1.0


class TenSecondsAClock:
    """time as gptrain.utils.progress reads it: `step` (10) s later at every reading."""

    def __init__(self, step: float = 10.0) -> None:
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


FOUR_MIB = bytes(range(256)) * 16384  # read in four 1 MiB chunks


def test_a_download_says_its_progress_rate_and_eta(tmp_path, monkeypatch, capsys):
    """A shard of gigabytes downloaded in silence: the task's log said nothing from its start to the
    tokenizer's command, minutes or hours later, nor whether the download moved at all. It prints
    what it has, of what size, its rate and ETA, at most every 30 s in a log (not a terminal), and
    what it took at the end; a resumed download counts the bytes it had, its rate only the new ones."""
    from gptrain.utils import progress

    monkeypatch.setattr(progress, "time", TenSecondsAClock())
    with Server({"/a.bin": FOUR_MIB}) as server:
        download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1, backoff=0)
    assert capsys.readouterr().err.splitlines() == [
        "download a.bin: 3.0 of 4.0 MiB (75.0%) | 0.1 MiB/s | ETA 00:10",  # at 40 s, 30 s after its start
        "download a.bin: done, 4.0 MiB in 00:50 (0.08 MiB/s)",
    ]
    (tmp_path / "b.bin.part").write_bytes(FOUR_MIB[: 1 << 20])  # an earlier job's part
    monkeypatch.setattr(progress, "time", TenSecondsAClock())
    with Server({"/b.bin": FOUR_MIB}) as server:
        download(Shard(server.url + "/b.bin"), tmp_path / "b.bin", retries=1, backoff=0)
    assert (tmp_path / "b.bin").read_bytes() == FOUR_MIB
    assert capsys.readouterr().err.splitlines() == [
        "download b.bin: 4.0 of 4.0 MiB (100.0%) | 0.1 MiB/s | ETA 00:00",
        "download b.bin: done, 4.0 MiB in 00:40 (0.075 MiB/s; resumed at 1.0 MiB)",
    ]


def test_a_download_on_a_terminal_says_its_progress_every_2_s(tmp_path, monkeypatch):
    from gptrain.utils import progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(progress, "time", TenSecondsAClock(step=3.0))
    monkeypatch.setattr(sys, "stderr", Terminal())
    with Server({"/a.bin": FOUR_MIB}) as server:
        download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1, backoff=0)
    lines = sys.stderr.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines[:-1]] == [
        f"download a.bin: {mib}.0 of 4.0 MiB ({25 * mib}.0%)" for mib in (1, 2, 3, 4)
    ]


def test_missing_file_and_retries_give_up(tmp_path):
    with Server({}) as server, pytest.raises(DataError, match="HTTP 404"):
        download(Shard(server.url + "/nope.bin"), tmp_path / "n.bin", retries=3, backoff=0)
    with pytest.raises(DataError, match="after 2 attempts"):
        download(Shard("http://127.0.0.1:9/x.bin"), tmp_path / "x.bin", retries=2, backoff=0, timeout=2)
    with pytest.raises(DataError, match="cannot copy"):
        download(Shard(f"file://{tmp_path}/missing"), tmp_path / "m", retries=1)


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        (".zst", lambda b: zstandard.ZstdCompressor().compress(b)),
        (".xz", lzma.compress),
        (".gz", gzip.compress),
        (".bz2", bz2.compress),  # a shard was named s.jsonl.bz2_text_document, unlike the others
        (".bz2", lambda b: bz2.compress(b[:99]) + bz2.compress(b[99:])),  # pbzip2's streams
    ],
)
def test_extract(tmp_path, suffix, compress):
    archive = tmp_path / f"s.jsonl{suffix}"
    archive.write_bytes(compress(PAYLOAD))
    out = extract(archive)
    assert out == tmp_path / "s.jsonl" and out.read_bytes() == PAYLOAD and not archive.exists()


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        (".zst", lambda b: zstandard.ZstdCompressor().compress(b)),
        (".zst", lambda b: b"".join(zstandard.ZstdCompressor().compress(h) for h in (b[:99], b[99:]))),
        (".xz", lzma.compress),
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
    ],
)
def test_a_cut_off_archive_is_refused_and_kept(tmp_path, suffix, compress):
    """A .zst cut short extracted as a short file with no error, and the archive was deleted."""
    content = random.Random(0).randbytes(3 << 20)  # several reads of the archive
    whole = compress(content)
    archive = tmp_path / f"s.jsonl{suffix}"
    archive.write_bytes(whole[: len(whole) * 3 // 4])
    with pytest.raises(DataError, match="ends too soon.*archive is kept"):
        extract(archive)
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]
    archive.write_bytes(whole)  # and the whole archive of several frames extracts entire
    assert extract(archive).read_bytes() == content and not archive.exists()


def test_an_extraction_says_its_progress_rate_and_eta(tmp_path, monkeypatch, capsys):
    """Extracting a shard (about 28 GB of text from a Pile shard) printed nothing until the tokenizer's
    command, minutes later. It says how much of the archive it has read, at what rate, and its ETA,
    every 30 s in a log, and what it took at the end."""
    import re

    from gptrain.utils import progress

    monkeypatch.setattr(progress, "time", TenSecondsAClock())
    archive = tmp_path / "s.jsonl.gz"
    archive.write_bytes(gzip.compress(random.Random(0).randbytes(4 << 20), compresslevel=1))
    assert extract(archive).stat().st_size == 4 << 20
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert re.fullmatch(
        r"extract s\.jsonl\.gz: 3\.\d of 4\.0 MiB of the archive \(7\d\.\d%\) \| 0\.1 MiB/s \| ETA 00:\d\d",
        lines[0],
    ), lines
    assert lines[1] == "extract s.jsonl.gz: done, 4.0 MiB of the archive in 00:50 (0.08 MiB/s)"


TERMINATED_MIDWAY = """
import os, signal, sys
from pathlib import Path
from gptrain.launch import extraction

def blocks(path, progress=None):
    yield b"a" * 1000
    os.kill(os.getpid(), signal.SIGTERM)  # a time limit, halfway through the extraction
    yield b"b" * 1000

extraction.decompressed_blocks = blocks
extraction.extract(Path(sys.argv[1]))
"""


def test_an_extraction_ended_by_sigterm_leaves_no_temporary(tmp_path):
    """SIGTERM (a Slurm time limit) killed the extraction with its temporary file, as large as the
    shard, left behind; every relaunch cut short so left another."""
    archive = tmp_path / "s.jsonl.gz"
    archive.write_bytes(gzip.compress(PAYLOAD))
    done = subprocess.run(
        [sys.executable, "-c", TERMINATED_MIDWAY, str(archive)], capture_output=True, timeout=60
    )
    assert done.returncode == 143, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]


def test_an_extraction_killed_earlier_is_cleaned_up(tmp_path, capsys):
    """SIGKILL leaves the temporary: the next extraction of that shard removes it once it is an
    hour old (a younger one may be a running extraction's, on another node)."""
    archive = tmp_path / "s.jsonl.gz"
    archive.write_bytes(gzip.compress(PAYLOAD))
    old, young = tmp_path / ".s.jsonl.abcd1234.tmp", tmp_path / ".s.jsonl.efgh5678.tmp"
    old.write_bytes(b"x" * 5000)
    young.write_bytes(b"y")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert extract(archive).read_bytes() == PAYLOAD
    assert sorted(p.name for p in tmp_path.iterdir()) == [young.name, "s.jsonl"]
    assert "removed 1 unfinished extraction(s) of" in capsys.readouterr().err


def test_shard_names_and_validation():
    shard = parse_shards([{"url": "https://h/x/pile_00.jsonl.zst?sig=1", "sha256": "ab" * 32}])[0]
    assert (shard.filename, shard.stem, shard.sha256) == ("pile_00.jsonl.zst", "pile_00", "ab" * 32)
    with pytest.raises(ConfigError, match="not an http"):
        parse_shards(["ftp://h/a.jsonl"])
    with pytest.raises(ConfigError, match="both write 'a'"):
        parse_shards(["http://h/a.jsonl.zst", "http://g/a.jsonl.gz"])


def test_a_checksum_that_is_no_digest_is_refused_before_downloading():
    """A truncated or mistyped checksum (the config's own example, `9f86d081...`) failed only after
    the whole download, which the mismatch then deleted; every retry downloaded it again."""
    good = hashlib.sha256(PAYLOAD).hexdigest()
    assert parse_shards([{"url": "http://h/a.jsonl", "sha256": f" {good.upper()} "}])[0].sha256 == good
    for key, value in (("sha256", "9f86d081..."), ("sha256", good[:-1]), ("md5", "g" * 32), ("md5", good)):
        with pytest.raises(ConfigError, match=f"shards\\[0\\].{key}: '.*' is not a {key}"):
            parse_shards([{"url": "http://h/a.jsonl", key: value}])


def test_a_checksum_under_an_unknown_key_is_refused():
    """`sha1:` or `checksum:` was ignored: the shard was downloaded unchecked."""
    for key in ("sha1", "checksum", "sha-256"):
        with pytest.raises(
            ConfigError, match=f"shards\\[1\\]: unknown key\\(s\\) '{key}'; a shard takes url"
        ):
            parse_shards(["http://h/a.jsonl", {"url": "http://h/b.jsonl", key: "ab" * 16}])


def write_idx(prefix, lengths):
    """A Megatron .idx written by hand from the documented layout (version 1, int32 lengths)."""
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(lengths) + 1)
    body = struct.pack(f"<{len(lengths)}i", *lengths)
    body += struct.pack(f"<{len(lengths)}q", *[4 * sum(lengths[:i]) for i in range(len(lengths))])
    body += struct.pack(f"<{len(lengths) + 1}q", *range(len(lengths) + 1))
    (prefix.parent / (prefix.name + ".idx")).write_bytes(header + body)


def test_blend_weights_from_token_counts(tmp_path):
    write_idx(tmp_path / "a_text_document", [3, 4, 5])
    write_idx(tmp_path / "b_text_document", [100])
    assert count_tokens(tmp_path / "a_text_document") == 12
    cfg = {"shards": ["http://h/a.jsonl", "http://h/b.jsonl.zst"], "output_dir": str(tmp_path)}
    prefixes = [str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")]
    assert blend_prefixes({**cfg, "blend": {"weights": "tokens"}}) == [12.0, prefixes[0], 100.0, prefixes[1]]
    assert blend_prefixes({**cfg, "blend": {"weights": "equal"}}) == [1.0, prefixes[0], 1.0, prefixes[1]]
    with pytest.raises(DataError, match="not prepared"):
        blend_prefixes({**cfg, "shards": ["http://h/c.jsonl"]})


@pytest.mark.parametrize("keep", [20, 34 + 4])  # inside the header; inside the lengths
def test_a_cut_off_index_is_one_line_naming_it(tmp_path, keep):
    """A shard's .idx cut short (a copy into output_dir interrupted) ended the blend step in a traceback."""
    write_idx(tmp_path / "a_text_document", [3, 4, 5])
    idx = tmp_path / "a_text_document.idx"
    idx.write_bytes(idx.read_bytes()[:keep])
    with pytest.raises(DataError, match=f"^{idx}: ends before its sequence lengths do"):
        count_tokens(tmp_path / "a_text_document")


def test_apply_blend_rewrites_data_prefix(tmp_path):
    blend, config = tmp_path / "blend.yaml", tmp_path / "t.yaml"
    blend.write_text(yaml.safe_dump({"data_prefix": [2.0, "/p/a", 1.0, "/p/b"]}))
    config.write_text(yaml.safe_dump({"model": {"data": {"data_prefix": [1.0, "/old"], "seq_length": 8}}}))
    apply_blend(blend, config)
    assert yaml.safe_load(config.read_text())["model"]["data"] == {
        "data_prefix": [2.0, "/p/a", 1.0, "/p/b"],
        "seq_length": 8,
    }


def test_a_task_of_several_shards_prepares_the_others_when_one_fails(tmp_path, monkeypatch, capsys):
    """Past MaxArraySize an array task prepares every n-th shard: a failed one must not leave the
    task's later shards unprepared (array tasks of one shard each are independent)."""
    import yaml

    from gptrain.errors import DataError
    from gptrain.launch import download

    config = tmp_path / "prep.yaml"
    config.write_text(yaml.safe_dump({"shards": [f"file:///s{n}.jsonl" for n in range(6)]}))
    prepared = []

    def prepare(cfg, index):
        if index == 1:
            raise DataError("s1.jsonl: cannot copy")
        prepared.append(index)

    monkeypatch.setattr(download, "prepare_shard", prepare)
    monkeypatch.setattr(download, "fetch_tokenizer_files", lambda cfg: None)
    assert download.main(["shard", "--config", str(config), "--index", "1", "--stride", "2"]) == 1
    err = capsys.readouterr().err
    assert prepared == [3, 5] and "shard 1: s1.jsonl: cannot copy" in err
    assert "shard(s) 1 of this task's 3 failed" in err


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    """A download_dir under a file (or without write permission) was a traceback on every task."""
    (tmp_path / "data").write_text("a file where a folder should be")
    (tmp_path / "src.jsonl").write_text('{"text": "a"}\n')
    stage = {"shards": [f"file://{tmp_path}/src.jsonl"], "download_dir": str(tmp_path / "data" / "raw")}
    stage |= {"output_dir": str(tmp_path / "out"), "blend": {"file": str(tmp_path / "blend.yaml")}}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    assert main(["shard", "--config", str(tmp_path / "stage.yaml"), "--index", "0"]) == 1
    err = capsys.readouterr().err
    assert err == f"gptrain: error: shard 0: {tmp_path / 'data' / 'raw'}: Not a directory\n"


def test_a_tokenizer_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "bpe").write_text("a file where a folder should be")
    tokenizer = {"vocab_file": str(tmp_path / "bpe" / "vocab.json"), "vocab_url": "http://h/vocab.json"}
    stage = {"shards": ["http://h/a.jsonl"], "download_dir": str(tmp_path), "tokenizer": tokenizer}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    assert main(["shard", "--config", str(tmp_path / "stage.yaml"), "--index", "0"]) == 1
    assert (
        capsys.readouterr().err
        == f"gptrain: error: {tmp_path / 'bpe'}: is a file, where a directory is needed\n"
    )


def test_a_shard_of_no_tokens_is_left_out_of_the_blend(tmp_path, capsys):
    """An empty shard got weight 0.0 (tokens) or 1.0 (equal) in the blend: training refused the
    first as it started and could draw no sample from the second."""
    write_idx(tmp_path / "a_text_document", [3, 4, 5])
    write_idx(tmp_path / "b_text_document", [])
    cfg = {"shards": ["http://h/a.jsonl", "http://h/b.jsonl"], "output_dir": str(tmp_path)}
    a, b = str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")
    assert blend_prefixes({**cfg, "blend": {"weights": "tokens"}}) == [12.0, a]
    assert blend_prefixes({**cfg, "blend": {"weights": "equal"}}) == [1.0, a]
    assert (
        capsys.readouterr().err.count(f"gptrain: warning: {b}: holds no tokens; left out of the blend") == 2
    )
    with pytest.raises(DataError, match=r"every shard holds no tokens .*json_key \('text'\)"):
        blend_prefixes({**cfg, "shards": ["http://h/b.jsonl"], "blend": {"weights": "tokens"}})


def test_a_part_never_holds_old_bytes_under_the_new_files_validator(tmp_path, monkeypatch):
    """Starting a part over recorded the new version's validator before the old bytes were cut: a
    job killed in between left old bytes that the next resume's If-Range vouched for as new."""
    from gptrain.launch import resumable_download as download_module

    new = bytes(reversed(PAYLOAD))
    part = tmp_path / "a.bin.part"
    record = download_module.record_validator

    def killed_after_recording(*args):
        record(*args)
        raise KeyboardInterrupt  # SIGKILL/SIGTERM right after the validator is written

    with Server({"/a.bin": PAYLOAD}, flaky=("/a.bin",)) as server:
        with pytest.raises(DataError, match="failed after 1 attempts"):
            download(Shard(server.url + "/a.bin"), tmp_path / "a.bin", retries=1)
        old_validator = download_module.recorded_validator(part)
        server.files["/a.bin"] = new
        monkeypatch.setattr(download_module, "record_validator", killed_after_recording)
        with pytest.raises(KeyboardInterrupt):
            fetch_once(server.url + "/a.bin", part, timeout=5)
    assert part.stat().st_size == 0 or download_module.recorded_validator(part) == old_validator


def test_the_tokenize_step_passes_megatrons_tiktoken_settings(tmp_path):
    """data_preparation.tokenizer's TikTokenizer settings reach `data prepare` as its flags; before,
    they were dropped and the shards tokenized with Megatron's defaults."""
    from pathlib import Path

    from gptrain.cli import build_parser
    from gptrain.data.tiktoken_file import TiktokenFileOptions
    from gptrain.data.tokenizer_args import tiktoken_options
    from gptrain.launch.tokenize_step import tokenize_command

    specials = ["</s>", "<unk>", "<s>", "<mask>", "<pad>", "<cls>", "<sep>"]
    tokenizer = {"type": "TikTokenizer", "model": "/v/tokenizer.json", "vocab_size": 1263}
    tokenizer |= {"tiktoken_pattern": "v1", "tiktoken_num_special_tokens": 10, "special_tokens": specials}
    command = tokenize_command({"tokenizer": tokenizer}, Path("in.jsonl"), Path("out"), "python")
    args = build_parser().parse_args(command[3:])
    assert tiktoken_options(args) == TiktokenFileOptions("v1", 1263, 10, tuple(specials))
    plain = tokenize_command(
        {"tokenizer": {"type": "TikTokenizer", "model": "cl100k_base"}}, Path("i"), Path("o"), "p"
    )
    assert tiktoken_options(build_parser().parse_args(plain[3:])) == TiktokenFileOptions(
        None, None, 1000, None
    )


def test_a_file_url_copy_says_its_progress_as_a_download(tmp_path, monkeypatch, capsys):
    """A file:// shard (a dataset on a shared file system) was copied with shutil.copyfile in silence:
    gigabytes over NFS with no line from the task until the tokenizer's command."""
    from gptrain.utils import progress

    source = tmp_path / "src" / "a.bin"
    source.parent.mkdir()
    source.write_bytes(FOUR_MIB)
    monkeypatch.setattr(progress, "time", TenSecondsAClock())
    download(Shard(f"file://{source}"), tmp_path / "a.bin", retries=1)
    assert (tmp_path / "a.bin").read_bytes() == FOUR_MIB
    assert capsys.readouterr().err.splitlines() == [
        "download a.bin: 3.0 of 4.0 MiB (75.0%) | 0.1 MiB/s | ETA 00:10",
        "download a.bin: done, 4.0 MiB in 00:50 (0.08 MiB/s)",
    ]
