"""One shard's download, resumable and verified, so a killed or requeued task never keeps a bad file.

Downloads go to `<name>.part` and are renamed only when complete and verified, so a
killed job never leaves a file that looks finished; a retry continues a partial file with
an HTTP Range request, guarded by If-Range with the validator (ETag or Last-Modified) its first
bytes came with, kept in `<name>.part.validator`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path
from typing import Any

from gptrain.errors import DataError
from gptrain.launch.extraction import CHUNK
from gptrain.launch.shards import Shard
from gptrain.utils.atomic import atomic_write_text, fsync_directory, replace_as_plain_file
from gptrain.utils.progress import ByteProgress


def fetch_once(url: str, part: Path, timeout: float) -> None:
    """One attempt: continue `part` from its current size (Range) or start it over.

    A resume carries If-Range with the validator the part's first bytes came with, so a file
    replaced upstream since is sent whole (200) instead of its tail being stitched onto the old
    file's head; a 206 whose validator is not the recorded one (a server that ignores If-Range)
    starts the part over."""
    offset = part.stat().st_size if part.exists() else 0
    validator = recorded_validator(part) if offset else None
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    if validator is not None:
        headers["If-Range"] = validator[1]
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:  # nothing left to send: complete, or more than the file has
            if range_start_and_total(error.headers.get("Content-Range"))[1] == offset:
                return
            os.truncate(part, 0)  # larger than the file (it changed), or its size unknown: never trusted
            # (cut in place: the lock writing_alone holds is on this file, an unlinked one frees the name)
            return fetch_once(url, part, timeout)
        raise
    with response:
        status = getattr(response, "status", 200)
        start = range_start_and_total(response.headers.get("Content-Range"))[0] if status == 206 else None
        if start is not None and start != offset:
            os.truncate(part, 0)  # bytes from elsewhere in the file: appended, they would corrupt it
            raise ConnectionError(f"asked for bytes from {offset}, the server sent others; starting over")
        if status == 206 and validator is not None and another_version(validator, response.headers):
            os.truncate(part, 0)  # the tail of another version of the file: appended, a corrupt file
            raise ConnectionError("the file changed on the server since the download began; starting over")
        mode = "ab" if offset and status == 206 else "wb"  # a server without Range support resends all
        expected = response.headers.get("Content-Length")
        had = offset if mode == "ab" else 0
        total = range_start_and_total(response.headers.get("Content-Range"))[1] if status == 206 else None
        if total is None and expected is not None and expected.isdigit():
            total = had + int(expected)
        name = urllib.parse.urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1] or url
        progress = ByteProgress(f"download {name}", total, had)
        written = 0
        with open(part, mode) as out:
            if mode == "wb":  # the old bytes cut first: none ever lies under the new file's validator
                record_validator(part, response_validator(response.headers))
            while chunk := response.read(CHUNK):
                out.write(chunk)
                written += len(chunk)
                progress.update(nbytes=len(chunk))
        if expected is not None and written != int(expected):
            raise ConnectionError(f"short read: {written} of {expected} bytes")
        progress.finished()


Validator = tuple[str, str]  # (header, value): ("ETag", '"5f3a"') or ("Last-Modified", an HTTP date)


VALIDATOR_HEADERS = ("ETag", "Last-Modified")


def response_validator(headers: Any) -> Validator | None:
    """What identifies this version of the file for If-Range: a strong ETag, else Last-Modified
    (If-Range must not carry a weak ETag, RFC 9110 13.1.5); None when the server gives neither."""
    etag = (headers.get("ETag") or "").strip()
    if etag and not etag.startswith("W/"):
        return "ETag", etag
    modified = (headers.get("Last-Modified") or "").strip()
    return ("Last-Modified", modified) if modified else None


def another_version(validator: Validator, headers: Any) -> bool:
    """A 206's own header of the recorded kind names another version. Only that kind is compared: a
    server may leave the ETag out of a 206 (or send an unquoted one), which is no change of file."""
    header, value = validator
    sent = (headers.get(header) or "").strip()
    if header == "ETag":
        return bool(sent) and _opaque_tag(sent) != _opaque_tag(value)
    return bool(sent) and sent != value


def _opaque_tag(etag: str) -> str:
    """The ETag less its weak mark and quotes: a CDN that weakens ("W/") or unquotes the tag it
    passes on still names the same version (RFC 9110's weak comparison)."""
    return etag.removeprefix("W/").strip('"')


def validator_file(part: Path) -> Path:
    """Beside the part, so a resume by a later job (a requeue, a relaunch) checks it too."""
    return part.with_name(part.name + ".validator")


def recorded_validator(part: Path) -> Validator | None:
    """The validator as `record_validator` wrote it (`ETag: "5f3a"`), or None (none, or unreadable)."""
    try:
        header, _, value = validator_file(part).read_text().strip().partition(": ")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return (header, value.strip()) if header in VALIDATOR_HEADERS and value.strip() else None


def record_validator(part: Path, validator: Validator | None) -> None:
    if validator is None:
        validator_file(part).unlink(missing_ok=True)
    else:
        atomic_write_text(validator_file(part), f"{validator[0]}: {validator[1]}\n")


def remove_part(part: Path) -> None:
    part.unlink(missing_ok=True)
    validator_file(part).unlink(missing_ok=True)


def range_start_and_total(content_range: str | None) -> tuple[int | None, int | None]:
    """(first byte, file size) of a Content-Range header (`bytes 100-199/1000`, `bytes */1000`);
    None for what it does not say."""
    unit, _, spec = (content_range or "").strip().partition(" ")
    if unit.lower() != "bytes" or "/" not in spec:
        return None, None
    span, _, total = spec.partition("/")
    first = span.split("-", 1)[0]
    return (int(first) if first.isdigit() else None), (int(total) if total.isdigit() else None)


def file_digest(path: Path, algorithm: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


def verify(path: Path, shard: Shard) -> None:
    for algorithm, expected in (("sha256", shard.sha256), ("md5", shard.md5)):
        if expected:
            actual = file_digest(path, algorithm)
            if actual != str(expected).lower():
                remove_part(path)
                raise DataError(
                    f"{shard.url}: {algorithm} mismatch (expected {expected}, got {actual});"
                    " the download was deleted: check the URL and the checksum in data_preparation.shards"
                )


def download(
    shard: Shard,
    dest: Path,
    retries: int = 5,
    backoff: float = 2.0,
    timeout: float = 60.0,
    part: Path | None = None,
) -> Path:
    """Download a shard to `dest` (via `dest.part`, or `part`), retrying with exponential backoff.
    A `dest` already there is taken once it passes the shard's checksums."""
    if dest.exists():
        check_existing(dest, shard)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part or dest.with_name(dest.name + ".part")
    with writing_alone(part):
        if shard.url.startswith("file://"):
            source = urllib.request.url2pathname(shard.url[len("file://") :])
            try:
                copy_with_progress(Path(source), part)
            except OSError as error:
                raise DataError(f"{shard.url}: cannot copy: {error.strerror}; check the path") from None
        else:
            fetch_with_retries(shard.url, part, retries, backoff, timeout)
        verify(part, shard)
        with open(part, "rb") as written:
            os.fsync(written.fileno())  # the data on disk before its name: a crash kept the name, empty
        replace_as_plain_file(part, dest)  # a tokenizer file's part is a mkstemp, 0600
        fsync_directory(dest.parent)
        validator_file(part).unlink(missing_ok=True)
    return dest


def copy_with_progress(source: Path, part: Path) -> None:
    """A file:// shard (often gigabytes on a shared file system) copied with a download's progress lines."""
    with open(source, "rb") as src, open(part, "wb") as out:
        progress = ByteProgress(f"download {source.name}", os.fstat(src.fileno()).st_size)
        while chunk := src.read(CHUNK):
            out.write(chunk)
            progress.update(nbytes=len(chunk))
    progress.finished()


def check_existing(dest: Path, shard: Shard) -> None:
    """A shard found in place was returned unverified: a file cut by a crash, or another file of its
    name, was extracted and tokenized as the shard. Kept where it fails: it may be the user's."""
    for algorithm, expected in (("sha256", shard.sha256), ("md5", shard.md5)):
        if expected and (actual := file_digest(dest, algorithm)) != str(expected).lower():
            raise DataError(
                f"{dest}: already there, but its {algorithm} is {actual}, not {expected} "
                "(data_preparation.shards); the file is kept: delete it to download it again"
            )


@contextlib.contextmanager
def writing_alone(part: Path) -> Iterator[None]:
    """Hold `part` (flock) while it is written: a second launch's task on the same shard (the first
    launch's still running) resumed from the other's bytes as both wrote, a corrupt download."""
    try:
        lock = open(part, "ab")  # noqa: SIM115 (closed below)
    except OSError as error:
        raise DataError(f"{part}: cannot write ({error.strerror}); check the download folder") from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(
                f"{part}: another task is downloading this shard (an earlier launch's, still running?);"
                " let it finish or cancel it, then launch again"
            ) from None
        except OSError:  # a file system without flock: unguarded, as before
            pass
        yield


# Client errors that mean "later", not "wrong": request timeout, too early, too many requests (a
# hub rate-limiting the array tasks that all download at once). Retried like a server's error.
TRANSIENT_HTTP_CODES = (408, 425, 429)


MAX_RETRY_AFTER_S = 600.0


def fetch_with_retries(url: str, part: Path, retries: int, backoff: float, timeout: float) -> None:
    for attempt in range(1, max(1, retries) + 1):
        try:
            fetch_once(url, part, timeout)
            return
        except (urllib.error.URLError, HTTPException, OSError) as error:
            if isinstance(error, urllib.error.HTTPError) and is_permanent(error.code):
                raise DataError(f"{url}: HTTP {error.code} {error.reason}; check the URL") from None
            if attempt >= retries:
                raise DataError(f"{url}: failed after {attempt} attempts: {error}") from None
            wait = max(backoff * 2 ** (attempt - 1), retry_after(error))
            print(f"gptrain: {url}: {error}; retry {attempt}/{retries - 1} in {wait:.1f}s", file=sys.stderr)
            time.sleep(wait)


def is_permanent(code: int) -> bool:
    """A 4xx other than the transient ones: the same request would fail again."""
    return 400 <= code < 500 and code not in TRANSIENT_HTTP_CODES


def retry_after(error: BaseException) -> float:
    """The seconds a 429's or 503's Retry-After asks for (its delay form; 0 for a date or none),
    at most MAX_RETRY_AFTER_S: retrying sooner only earns another refusal."""
    headers = error.headers if isinstance(error, urllib.error.HTTPError) else None
    value = ((headers.get("Retry-After") if headers is not None else None) or "").strip()
    return min(float(value), MAX_RETRY_AFTER_S) if value.isdigit() else 0.0
