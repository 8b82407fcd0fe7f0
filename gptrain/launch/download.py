"""Data preparation stage: download shards, extract, tokenize, write the blend.

Downloads go to `<name>.part` and are renamed only when complete and verified, so a
killed job never leaves a file that looks finished; a retry continues a partial file with
an HTTP Range request, guarded by If-Range with the validator (ETag or Last-Modified) its first
bytes came with, kept in `<name>.part.validator`. Every step is skipped when its output exists, so a rerun or a
requeued array task only does what is missing.

The blend (`blend.file`) lists `data_prefix: [w1, prefix1, w2, prefix2, ...]`; with
`weights: tokens` each weight is the shard's token count (Megatron normalises weights, so
every token is sampled equally often); with `weights: equal` every shard weighs 1.0.

Standard library only (urllib, lzma, gzip) plus zstandard: no torch, no numpy.
"""

from __future__ import annotations

import argparse
import array
import bz2
import contextlib
import fcntl
import gzip
import hashlib
import lzma
import os
import shutil
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import IO, Any

import yaml

from gptrain.data.jsonl import zstd_blocks
from gptrain.errors import ConfigError, DataError, GptrainError, os_error_text
from gptrain.utils.atomic import atomic_write_text, hold, remove_stale_temporaries, temporary_sibling
from gptrain.utils.signals import terminate_as_exception

CHUNK = 1 << 20
STALE_TEMPORARY_S = 3600.0  # an older unheld temporary is a dead writer's (as data prepare's)
EXTRACTORS: dict[str, Callable[[IO[bytes]], IO[bytes]]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw),
    ".xz": lzma.LZMAFile,
    ".bz2": bz2.BZ2File,  # pbzip2's multi-stream files too
}
TEXT_SUFFIXES = (".jsonl", ".json", ".txt")
IDX_MAGIC = b"MMIDIDX\x00\x00"


@dataclass
class Shard:
    url: str
    sha256: str | None = None
    md5: str | None = None

    @property
    def filename(self) -> str:
        name = self.url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
        if not name:
            raise ConfigError(f"shard URL '{self.url}' has no file name")
        return name

    @property
    def stem(self) -> str:
        name = strip_compression(self.filename)
        for suffix in TEXT_SUFFIXES:
            name = name.removesuffix(suffix)
        return name


def strip_compression(name: str) -> str:
    for suffix in (".zst", *EXTRACTORS):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def parse_shards(entries: list[Any]) -> list[Shard]:
    shards = []
    for i, entry in enumerate(entries or []):
        if isinstance(entry, str):
            shard = Shard(entry)
        elif isinstance(entry, dict) and "url" in entry:
            refuse_unknown_shard_keys(i, entry)
            shard = Shard(str(entry["url"]), checksum(i, entry, "sha256"), checksum(i, entry, "md5"))
        else:
            raise ConfigError(f"data_preparation.shards[{i}]: expected a URL or a mapping with 'url'")
        if not shard.url.startswith(("http://", "https://", "file://")):
            raise ConfigError(
                f"data_preparation.shards[{i}]: '{shard.url}' is not an http(s):// or file:// URL"
            )
        shards.append(shard)
    stems = [s.stem for s in shards]
    for stem in stems:
        if stems.count(stem) > 1:
            raise ConfigError(f"data_preparation.shards: two shards would both write '{stem}'; rename one")
    return shards


SHARD_KEYS = ("url", "sha256", "md5")


def refuse_unknown_shard_keys(i: int, entry: dict[str, Any]) -> None:
    """A checksum under another key (`sha1`, `checksum`, `sha-256`) was ignored: the shard was
    downloaded unchecked while the config looked checked."""
    unknown = [str(key) for key in entry if key not in SHARD_KEYS]
    if unknown:
        raise ConfigError(
            f"data_preparation.shards[{i}]: unknown key(s) {', '.join(map(repr, unknown))}; a shard takes "
            f"{', '.join(SHARD_KEYS)} (the checksum as sha256 or md5)"
        )


DIGEST_HEX_DIGITS = {"sha256": 64, "md5": 32}


def checksum(i: int, entry: dict[str, Any], algorithm: str) -> str | None:
    """A shard's checksum in lower case; one that cannot be a digest (a typo, a truncated copy) is
    refused before the download, which it would otherwise have deleted as a mismatch."""
    value = entry.get(algorithm)
    if value is None:
        return None
    text, digits = str(value).strip().lower(), DIGEST_HEX_DIGITS[algorithm]
    if len(text) != digits or any(c not in "0123456789abcdef" for c in text):
        raise ConfigError(
            f"data_preparation.shards[{i}].{algorithm}: '{value}' is not a {algorithm} ({digits} hex digits);"
            " copy the whole checksum, or leave the key out"
        )
    return text


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
        written = 0
        with open(part, mode) as out:
            if mode == "wb":  # the old bytes cut first: none ever lies under the new file's validator
                record_validator(part, response_validator(response.headers))
            while chunk := response.read(CHUNK):
                out.write(chunk)
                written += len(chunk)
        if expected is not None and written != int(expected):
            raise ConnectionError(f"short read: {written} of {expected} bytes")


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
    """Download a shard to `dest` (via `dest.part`, or `part`), retrying with exponential backoff."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part or dest.with_name(dest.name + ".part")
    with writing_alone(part):
        if shard.url.startswith("file://"):
            source = urllib.request.url2pathname(shard.url[len("file://") :])
            try:
                shutil.copyfile(source, part)
            except OSError as error:
                raise DataError(f"{shard.url}: cannot copy: {error.strerror}; check the path") from None
        else:
            fetch_with_retries(shard.url, part, retries, backoff, timeout)
        verify(part, shard)
        part.rename(dest)
        validator_file(part).unlink(missing_ok=True)
    return dest


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


def decompressed_blocks(path: Path) -> Iterator[bytes]:
    """The archive's content block by block; an archive cut short raises EOFError at its end
    (zstandard's stream reader just stopped there, so a cut-off .zst extracted as a short file)."""
    with open(path, "rb") as raw:
        if path.suffix == ".zst":
            yield from zstd_blocks(raw, CHUNK)
            return
        with EXTRACTORS[path.suffix](raw) as source:
            while block := source.read(CHUNK):
                yield block


def extract(path: Path, keep: bool = False) -> Path:
    """Decompress .zst/.xz/.gz/.bz2 next to the archive (atomically); other files are returned as is.
    The archive is removed (unless `keep`) only once it has decompressed whole."""
    target = path.with_name(strip_compression(path.name))
    if target == path:
        return path
    if not target.exists():
        remove_stale_extractions(target)
        tmp = temporary_sibling(target)
        try:
            with terminate_as_exception(), open(tmp, "wb") as out:  # a time limit's SIGTERM: cleaned up
                hold(out)
                for block in decompressed_blocks(path):
                    out.write(block)
            tmp.replace(target)
        except EOFError:
            raise DataError(
                f"{path}: the archive ends too soon (cut short: an interrupted download or copy);"
                " nothing was extracted and the archive is kept: delete it to download it again"
            ) from None
        except Exception as error:
            raise DataError(f"{path}: cannot decompress: {error}; the archive is kept") from None
        finally:
            tmp.unlink(missing_ok=True)
    if not keep:
        path.unlink(missing_ok=True)
    return target


def remove_stale_extractions(target: Path) -> None:
    """An extraction killed by SIGKILL (an OOM kill, KillWait past a time limit) left its temporary
    file, as large as the shard, and every relaunch that was killed another."""
    removed, _ = remove_stale_temporaries(target, STALE_TEMPORARY_S)
    if removed:
        size = sum(bytes_ for _, bytes_ in removed) / 1e9
        print(
            f"gptrain: removed {len(removed)} unfinished extraction(s) of {target} ({size:.1f} GB)",
            file=sys.stderr,
        )


def tokenize_command(cfg: dict[str, Any], source: Path, prefix: Path, python: str) -> list[str]:
    tokenizer = cfg.get("tokenizer") or {}
    command = [
        python,
        "-m",
        "gptrain",
        "data",
        "prepare",
        "--input",
        str(source),
        "--output-prefix",
        str(prefix),
    ]
    command += ["--tokenizer-type", str(tokenizer.get("type", "GPT2BPETokenizer"))]
    for key, flag in (
        ("vocab_file", "--vocab-file"),
        ("merge_file", "--merge-file"),
        ("model", "--tokenizer-model"),
    ):
        if tokenizer.get(key):
            command += [flag, str(tokenizer[key])]
    command += tiktoken_flags(tokenizer)
    command += ["--json-keys", json_key(cfg)]
    if cfg.get("append_eod", True):
        command.append("--append-eod")
    return command + ["--workers", str(worker_count(cfg.get("workers")))]


def tiktoken_flags(tokenizer: dict[str, Any]) -> list[str]:
    """The TikTokenizer settings of a Megatron tiktoken vocabulary file, as data prepare's flags."""
    flags = []
    for key, flag in (
        ("vocab_size", "--vocab-size"),
        ("tiktoken_pattern", "--tiktoken-pattern"),
        ("tiktoken_num_special_tokens", "--tiktoken-num-special-tokens"),
    ):
        if tokenizer.get(key) is not None:
            flags.append(f"{flag}={tokenizer[key]}")
    if tokenizer.get("special_tokens"):
        flags += ["--tokenizer-special-tokens", *(str(token) for token in tokenizer["special_tokens"])]
    return flags


def worker_count(value: Any) -> int:
    """data_preparation.workers on the node that tokenizes: `auto` is every CPU this task may use."""
    if str(value).strip().lower() == "auto":
        return max(
            1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )
    return int(value or 1)


def json_key(cfg: dict[str, Any]) -> str:
    return str(cfg.get("json_key") or "text")


def tokenize_prefix(cfg: dict[str, Any], shard: Shard) -> Path:
    """`gptrain data prepare`'s --output-prefix for a shard (it appends _<json key>_document)."""
    name_prefix = str(cfg.get("output_name_prefix") or "")  # NeMo's Pile: my-gpt3_00
    return Path(cfg["output_dir"]) / f"{name_prefix}{shard.stem}"


TOKENIZER_URLS = {"vocab_file": "vocab_url", "merge_file": "merge_url"}


def tokenizer_downloads(cfg: dict[str, Any]) -> dict[str, str]:
    """{tokenizer file path: URL} of the stage's tokenizer files that have a URL to fetch them from."""
    tokenizer = cfg.get("tokenizer") or {}
    return {
        str(tokenizer[key]): str(tokenizer[url])
        for key, url in TOKENIZER_URLS.items()
        if tokenizer.get(key) and tokenizer.get(url)
    }


def fetch_tokenizer_files(cfg: dict[str, Any]) -> None:
    """Fetch the tokenizer files that are missing and have a URL (NeMo's download_vocab_url and
    download_merges_url). Every array task may do it at once: each writes its own part file and
    renames it into place, so a reader sees a whole file or none. The part's name is made by
    O_EXCL creation: a process id (the name before) repeats across nodes, and two tasks of one
    id on one shared folder wrote the same part, one resuming the other's bytes."""
    for path, url in tokenizer_downloads(cfg).items():
        dest = Path(path)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = temporary_sibling(dest)
            try:
                download(Shard(url), dest, *retry_settings(cfg), part=part)
            finally:
                remove_part(part)  # a failed attempt's: not resumed, since no other run finds it


def retry_settings(cfg: dict[str, Any]) -> tuple[int, float, float]:
    """(retries, backoff_seconds, timeout_seconds), checked at launch (gptrain.launch.sections);
    null, which the launch lets through, is the default, as the stage's config file's comments say."""
    values = [cfg.get(key) for key in ("retries", "backoff_seconds", "timeout_seconds")]
    retries, backoff, timeout = (d if v is None else v for v, d in zip(values, (5, 2.0, 60.0), strict=True))
    return int(retries), float(backoff), float(timeout)


def output_prefix(cfg: dict[str, Any], shard: Shard) -> Path:
    """The Megatron data prefix a shard becomes (what training's data_prefix lists)."""
    return Path(f"{tokenize_prefix(cfg, shard)}_{json_key(cfg)}_document")


def prepare_shard(cfg: dict[str, Any], index: int, python: str = sys.executable) -> Path:
    """Download, extract and tokenize shard `index`; return its data prefix."""
    shards = parse_shards(cfg.get("shards") or [])
    if not 0 <= index < len(shards):
        raise ConfigError(f"shard index {index} out of range: data_preparation.shards has {len(shards)}")
    shard = shards[index]
    prefix = output_prefix(cfg, shard)
    if Path(f"{prefix}.bin").exists() and Path(f"{prefix}.idx").exists():
        print(f"gptrain: {prefix}.bin/.idx exist; shard {index} already prepared", file=sys.stderr)
        return prefix
    raw_name = shard.filename
    raw = Path(cfg["download_dir"]) / raw_name
    plain = raw.with_name(strip_compression(raw_name))
    if not plain.exists() or plain == raw:
        raw = download(shard, raw, *retry_settings(cfg))
        plain = extract(raw, keep=bool(cfg.get("keep_compressed"))) if cfg.get("extract", True) else raw
    prefix.parent.mkdir(parents=True, exist_ok=True)
    command = tokenize_command(cfg, plain, tokenize_prefix(cfg, shard), python)
    print("gptrain: " + " ".join(command), file=sys.stderr, flush=True)
    if subprocess.run(command).returncode != 0:
        raise DataError(f"tokenizing {plain} failed (see the messages above)")
    return prefix


def count_tokens(prefix: Path) -> int:
    """Tokens in a Megatron indexed dataset: the sum of its sequence lengths (from the .idx)."""
    path = Path(f"{prefix}.idx")
    with open(path, "rb") as handle:
        if handle.read(9) != IDX_MAGIC:
            raise DataError(f"{path}: not a Megatron .idx file (bad magic)")
        try:
            _version, _dtype, count = struct.unpack("<QBQ", handle.read(17))
            handle.read(8)  # document count
            lengths = array.array("i")
            lengths.fromfile(handle, count)
        except (struct.error, EOFError):
            raise DataError(
                f"{path}: ends before its sequence lengths do (a copy cut short?); remove {prefix}.bin/.idx "
                "and run the stage again to prepare that shard anew"
            ) from None
    if sys.byteorder != "little":
        lengths.byteswap()
    return sum(lengths)


def blend_prefixes(cfg: dict[str, Any]) -> list[float | str]:
    """[w1, prefix1, ...] over all shards; every shard must be prepared."""
    mode = (cfg.get("blend") or {}).get("weights", "tokens")
    if mode not in ("tokens", "equal"):
        raise ConfigError(f"data_preparation.blend.weights must be 'tokens' or 'equal', got '{mode}'")
    result: list[float | str] = []
    empty: list[Path] = []
    for shard in parse_shards(cfg.get("shards") or []):
        prefix = output_prefix(cfg, shard)
        if not Path(f"{prefix}.idx").exists():
            raise DataError(f"{prefix}.idx missing: shard {shard.url} is not prepared yet")
        tokens = count_tokens(prefix)
        if not tokens:
            empty.append(prefix)
            continue
        result += [float(tokens) if mode == "tokens" else 1.0, str(prefix)]
    leave_out_empty_shards(empty, any_left=bool(result), json_key=json_key(cfg))
    return result


def leave_out_empty_shards(empty: list[Path], any_left: bool, json_key: str) -> None:
    """A shard of no tokens (an empty file, every text empty) went into the blend with weight 0
    (`weights: tokens`), which training refuses as it starts, or 1 (`equal`), a dataset it cannot
    draw one sample from. Such a shard is left out, and named; a blend of nothing is an error."""
    if empty and not any_left:
        raise DataError(
            f"every shard holds no tokens ({empty[0]}.idx and the others); check that the shards' "
            f"records hold their text under data_preparation.json_key ({json_key!r})"
        )
    for prefix in empty:
        print(f"gptrain: warning: {prefix}: holds no tokens; left out of the blend", file=sys.stderr)


def write_blend(cfg: dict[str, Any]) -> Path:
    path = Path(cfg["blend"]["file"])
    atomic_write_text(path, yaml.safe_dump({"data_prefix": blend_prefixes(cfg)}, sort_keys=False))
    return path


def apply_blend(blend_file: Path, config_file: Path) -> None:
    """Point a resolved training config's model.data.data_prefix at the blend (atomically)."""
    try:
        prefixes = yaml.safe_load(blend_file.read_text())["data_prefix"]
    except (OSError, KeyError, TypeError) as error:
        raise DataError(
            f"{blend_file}: cannot read the blend ({error}); did data preparation finish?"
        ) from None
    training = yaml.safe_load(config_file.read_text())
    training.setdefault("model", {}).setdefault("data", {})["data_prefix"] = prefixes
    atomic_write_text(config_file, yaml.safe_dump(training, sort_keys=False))


def load_stage_config(path: str) -> dict[str, Any]:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the stage's jobs: `shard` (one array task), `all` (local), `apply-blend`."""
    parser = argparse.ArgumentParser(prog="python -m gptrain.launch.download")
    parser.add_argument("action", choices=("shard", "all", "blend", "apply-blend"))
    parser.add_argument("--config", required=True, help="resolved stage config (data prep or training)")
    parser.add_argument("--index", type=int, default=None, help="shard index (array task id)")
    parser.add_argument(
        "--stride",
        type=int,
        default=None,
        help="array tasks: this one prepares shards index, index + stride, ...",
    )
    parser.add_argument("--blend", default=None, help="blend file for apply-blend")
    args = parser.parse_args(argv)
    try:
        if args.action == "apply-blend":
            apply_blend(Path(args.blend), Path(args.config))
            return 0
        cfg = load_stage_config(args.config)
        indices = task_shards(cfg, args.index, args.stride) if args.action == "shard" else []
        if args.action == "all":
            indices = list(range(len(cfg.get("shards") or [])))
        if indices:
            fetch_tokenizer_files(cfg)
        prepare_shards(cfg, indices)
        if args.action != "shard" or all_prepared(cfg):
            print(f"gptrain: blend written to {write_blend(cfg)}", file=sys.stderr)
    except GptrainError as error:
        print(f"gptrain: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # a tokenizer folder or the blend's that cannot be made or written
        print(f"gptrain: error: {os_error_text(error, args.config)}", file=sys.stderr)
        return 1
    return 0


def prepare_shards(cfg: dict[str, Any], indices: list[int]) -> None:
    """Prepare each shard; a stage of several (an array task past MaxArraySize, the local stage) goes
    on past one that fails, as array tasks of one shard each do, and fails at the end naming them."""
    failed = []
    for index in indices:
        try:
            prepare_shard_or_say_why(cfg, index)
        except (ConfigError, DataError) as error:
            if len(indices) == 1:
                raise
            print(f"gptrain: error: shard {index}: {error}", file=sys.stderr)
            failed.append(str(index))
    if failed:
        raise DataError(
            f"shard(s) {', '.join(failed)} of this task's {len(indices)} failed (see above); the others are"
            " prepared, and a relaunch prepares only what is missing"
        )


def prepare_shard_or_say_why(cfg: dict[str, Any], index: int) -> Path:
    """`prepare_shard`, a folder it cannot make or write (permissions, a file in the way, a full
    disk) said in one line naming it, where it was a traceback on every array task."""
    try:
        return prepare_shard(cfg, index)
    except OSError as error:
        raise DataError(f"shard {index}: {os_error_text(error, cfg.get('download_dir'))}") from None


def task_shards(cfg: dict[str, Any], index: int | None, stride: int | None) -> list[int]:
    """The shards of one array task: its index, or with a stride (more shards than the cluster's
    MaxArraySize allows tasks) every stride-th shard from it."""
    if index is None:
        raise ConfigError("shard: give --index (the array task id)")
    if stride is None:
        return [index]
    return list(range(index, max(len(cfg.get("shards") or []), index + 1), stride))


def all_prepared(cfg: dict[str, Any]) -> bool:
    return all(Path(f"{output_prefix(cfg, s)}.idx").exists() for s in parse_shards(cfg.get("shards") or []))


if __name__ == "__main__":
    raise SystemExit(main())
