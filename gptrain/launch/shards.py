"""data_preparation.shards read and checked: each shard's URL, checksums and the file names it takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptrain.errors import ConfigError
from gptrain.launch.extraction import strip_compression

TEXT_SUFFIXES = (".jsonl", ".json", ".txt")


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
