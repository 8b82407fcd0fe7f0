"""A corpus of real English text that every fresh machine already has offline.

The quickstart must train on real language without downloading a data set, so it
harvests the prose that ships with Python itself: the language reference topics
behind `help()` (`pydoc_data.topics`), then the docstrings of the standard library
and of a few packages gptrain installs anyway (numpy, torch, matplotlib, ...).
Docstrings are read with `ast` (nothing is imported or executed), cleaned, filtered
for English prose and de-duplicated. The result is deterministic for a given Python
and package set: sources are walked in sorted order and the documents are shuffled
with a fixed seed (so a contiguous "98,2,0" split gives same-distribution train and
validation sets) before they are written as jsonl (`{"text": ..., "source": ...}`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from gptrain.utils.atomic import atomic_write

# Packages (beyond the standard library) whose docstrings are harvested, in this order;
# all are gptrain dependencies or theirs, so they exist wherever gptrain is installed.
DEFAULT_PACKAGES = ("numpy", "torch", "matplotlib", "tensorboard", "rich", "omegaconf", "yaml")
# Directories that hold test code, vendored third-party trees or other interpreters' packages.
SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "testing", "idle_test", "__pycache__", "_vendor"}
)
_STOPWORDS = "the a an of to is and in this that for be it are with as or if by on not from can which"
STOPWORDS = frozenset(_STOPWORDS.split())
MIN_CHARS = 200
SHUFFLE_SEED = 1234


@dataclass(frozen=True)
class Document:
    text: str
    source: str


@dataclass
class CorpusStats:
    documents: int
    bytes: int
    sources: int
    path: Path


def clean_text(text: str) -> str:
    """Docstring markup to plain text: lines without indentation, single spaces, one blank line.

    Interactive-session lines (`>>>`, `...`) and reST underlines are code and markup, not prose;
    indentation runs would otherwise teach a small model mostly whitespace tokens.
    """
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "... ")) or (stripped and not any(ch.isalnum() for ch in stripped)):
            continue
        if stripped or (lines and lines[-1]):
            lines.append(" ".join(stripped.split()))
    return "\n".join(lines).strip()


def looks_like_english(text: str) -> bool:
    """Prose, not code or tables: long enough, mostly letters, with common function words."""
    if len(text) < MIN_CHARS:
        return False
    letters = sum(ch.isalpha() or ch.isspace() for ch in text)
    if letters < 0.8 * len(text):
        return False
    words = text.lower().split()
    common = sum(word.strip(".,;:()") in STOPWORDS for word in words)
    return len(words) >= 30 and common >= 0.12 * len(words)


def docstrings_of(source: bytes) -> list[str]:
    """Module, class and function docstrings of one Python file, in source order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = [ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, kinds)]
    return [text for text in found if text]


def python_files(root: Path) -> Iterator[Path]:
    """Every .py file under `root` in a sorted, machine-independent order."""
    if root.is_file():
        yield root
        return
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(name for name in dirs if name not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory, name)


def package_root(name: str) -> Path | None:
    """Where an installed package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin else None


def pydoc_topics() -> Iterator[Document]:
    """The language reference sections that `help('TOPIC')` prints."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return
    for name in sorted(topics):
        yield Document(clean_text(topics[name]), f"pydoc:{name}")


def docstring_documents(label: str, root: Path) -> Iterator[Document]:
    for path in python_files(root):
        relative = path.relative_to(root.parent if root.is_file() else root).as_posix()
        for text in docstrings_of(path.read_bytes()):
            yield Document(clean_text(text), f"{label}:{relative}")


def default_sources(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> list[tuple[str, Path]]:
    """(label, root) of the standard library and of each installed package in `packages`."""
    sources = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    for name in packages:
        root = package_root(name)
        if root is not None:
            sources.append((name, root))
    return sources


def iter_documents(sources: list[tuple[str, Path]], max_bytes: int) -> Iterator[Document]:
    """English, de-duplicated documents from pydoc topics then `sources`, until `max_bytes`."""
    seen: set[bytes] = set()
    total = 0
    streams: list[Iterator[Document]] = [pydoc_topics()]
    streams += [docstring_documents(label, root) for label, root in sources]
    for stream in streams:
        for document in stream:
            if not looks_like_english(document.text):
                continue
            digest = hashlib.sha1(document.text.encode()).digest()
            if digest in seen:
                continue
            seen.add(digest)
            total += len(document.text.encode())
            yield document
            if total >= max_bytes:
                return


def build_corpus(
    output: str | os.PathLike[str],
    max_bytes: int = 8 * 2**20,
    sources: list[tuple[str, Path]] | None = None,
    seed: int = SHUFFLE_SEED,
) -> CorpusStats:
    """Write the corpus as jsonl (atomically) and say how much was written."""
    chosen = default_sources() if sources is None else sources
    documents = list(iter_documents(chosen, max_bytes))
    random.Random(seed).shuffle(documents)
    path = Path(output)
    with atomic_write(path, "wb") as handle:
        for document in documents:
            handle.write(orjson.dumps({"text": document.text, "source": document.source}) + b"\n")
    labels = {document.source.split(":", 1)[0] for document in documents}
    return CorpusStats(len(documents), sum(len(d.text.encode()) for d in documents), len(labels), path)


def mebibytes(text: str) -> float:
    """--max-mb: a positive number (nan was a traceback, 0 or below a corpus of one document)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and int(value * 2**20) >= 1):  # 1e-9 MiB is 0 bytes: one document
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of MiB, e.g. 8")
    return value


def main(argv: list[str] | None = None) -> int:
    """`python -m gptrain.quickstart.corpus OUTPUT.jsonl [--max-mb N]`."""
    import argparse
    import sys

    from gptrain.errors import os_error_text

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("output", help="jsonl file to write")
    parser.add_argument("--max-mb", type=mebibytes, default=8.0, help="stop after this many MiB of text")
    args = parser.parse_args(argv)
    try:
        stats = build_corpus(args.output, max_bytes=int(args.max_mb * 2**20))
    except OSError as error:  # an output that is a directory, a full or read-only disk: one line
        print(f"corpus: error: {os_error_text(error, args.output)}", file=sys.stderr)
        return 2
    print(
        f"corpus: {stats.documents:,} documents, {stats.bytes / 2**20:.1f} MiB from {stats.sources} sources"
    )
    print(f"corpus: wrote {stats.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
