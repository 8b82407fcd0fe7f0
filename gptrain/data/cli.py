"""`gptrain data ...` parsers (light: numpy, orjson and tokenizer libraries load in the handlers)."""

from __future__ import annotations

import argparse
import os
import sys

from gptrain.data.tokenizer_args import (
    add_tokenizer_args,
    megatron_tokenizer_notes,
    null_options,
    tiktoken_options,
    tokenizer_from_args,
    tokenizer_type,
    warn_other_vocabulary,
)
from gptrain.utils.signals import terminate_as_exception


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def usable_workers(asked: int) -> int:
    """--workers, at most the CPUs this process may run on: tokenizing is CPU-bound, so more only
    take memory, and the pool forks them all at once (a typo's --workers 99999 hung the machine)."""
    cpus = _default_workers()
    if asked <= cpus:
        return asked
    print(f"note: --workers {asked} is more than the {cpus} CPUs this process may run on; using {cpus}",
          file=sys.stderr)  # fmt: skip
    return cpus


def _add_prepare(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="tokenize jsonl into Megatron .bin/.idx (like tools/preprocess_data.py)",
        description="Tokenize jsonl documents into <prefix>_<key>_document.bin/.idx, byte-identical to "
        "Megatron-LM's tools/preprocess_data.py, with many workers and bounded memory.",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        action="extend",  # `--input A --input B` is both files, not only B
        required=True,
        help="jsonl files or globs (.jsonl, .jsonl.gz, .jsonl.xz, .jsonl.zst, .jsonl.bz2); may be repeated",
    )
    parser.add_argument("--output-prefix", required=True, help="outputs are <prefix>_<key>_document.bin/.idx")
    parser.add_argument(
        "--json-keys",
        nargs="+",
        action="extend",  # `--json-keys text --json-keys title` is both keys, not only title
        help="keys to tokenize (default: text; may be repeated); a value is a string, or an array of strings "
        "(sentences, one sequence each, as Megatron takes it)",
    )
    add_tokenizer_args(parser)
    parser.add_argument("--append-eod", action="store_true", help="end every non-empty document with EOD")
    parser.add_argument(
        "--workers",
        type=int,
        default=_default_workers(),
        help="tokenizing processes (default and most: every CPU this process may run on, here %(default)s)",
    )
    parser.add_argument(
        "--log-interval",
        type=int,
        default=10000,
        help="documents between progress lines (default 10000; at most 1/s, at least every 30 s)",
    )
    parser.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip and count bad lines instead of stopping (an input file with no good line at all still fails)",
    )
    _add_megatron_runtime_flags(parser)
    parser.set_defaults(func=_run_prepare)


def _add_megatron_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """preprocess_data.py flags that only tune Megatron's own run, so its command lines work unchanged."""
    group = parser.add_argument_group("accepted from Megatron's preprocess_data.py (no effect here)")
    group.add_argument(
        "--dataset-impl",
        default="mmap",
        help="older Megatron's output format: only mmap (what gptrain writes) is accepted",
    )
    group.add_argument("--chunk-size", type=int, help="documents per worker task; gptrain batches by bytes")
    group.add_argument(
        "--partitions", type=int, help="input partitions; gptrain's workers share one ordered stream"
    )
    group.add_argument(
        "--keep-sequential-samples",
        action="store_true",
        help="keep the input order across partitions; gptrain always does",
    )
    group.add_argument("--split-sentences", action="store_true", help=argparse.SUPPRESS)
    # how --split-sentences splits (NLTK's punkt): Megatron reads neither without it
    group.add_argument("--keep-newlines", action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--lang", help=argparse.SUPPRESS)
    # Megatron's timing of worker counts: refused with the reason (_check_megatron_runtime_flags)
    group.add_argument("--find-optimal-num-workers", action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--workers-to-check", nargs="+", help=argparse.SUPPRESS)
    group.add_argument("--max-documents", help=argparse.SUPPRESS)


def _worker_timing_flags(args: argparse.Namespace) -> list[str]:
    """The flags given of preprocess_data.py's run that times worker counts (Megatron, 2025)."""
    given = {
        "--find-optimal-num-workers": args.find_optimal_num_workers,
        "--workers-to-check": args.workers_to_check,
        "--max-documents": args.max_documents,
    }
    return [flag for flag, value in given.items() if value]


def _check_megatron_runtime_flags(args: argparse.Namespace) -> None:
    from gptrain.errors import ConfigError

    if args.dataset_impl != "mmap":
        raise ConfigError(
            f"--dataset-impl {args.dataset_impl}: gptrain writes Megatron's mmap format only "
            "(lazy and cached are gone from Megatron too); drop the flag or give mmap"
        )
    for flag, value in (("--chunk-size", args.chunk_size), ("--partitions", args.partitions)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1")
    if benchmark := _worker_timing_flags(args):
        raise ConfigError(
            f"{benchmark[0]}: Megatron's timing of worker counts (--find-optimal-num-workers with "
            "--workers-to-check and --max-documents) prepares the data once per count; "
            "gptrain has no such run: drop these flags and give --workers (default: every CPU here)"
        )
    if args.split_sentences:
        raise ConfigError(
            "--split-sentences splits documents into sentences (BERT's <prefix>_<key>_sentence files); "
            "GPT pretraining reads whole documents: drop it (and --keep-newlines/--lang, which tune it)"
        )


def partition_order_notice(partitions: int) -> str:
    """What --partitions N>1 changes against Megatron: the order of the documents, which the GPT
    dataset's shuffle and so every sample follow (the documents themselves are the same bytes).
    Not with --keep-sequential-samples: Megatron then cuts the input into N runs of consecutive
    lines (ceil(lines / N) each) and merges them in order, the input's order, as gptrain writes."""
    return (
        f"note: --partitions {partitions}: gptrain writes the documents in input order; Megatron's "
        f"preprocess_data.py deals the input's lines to the {partitions} partitions line by line and merges "
        "them partition after partition: the same documents in another order (and the samples follow the "
        "order; --keep-sequential-samples keeps the input's)"
    )


def sentencepiece_version_notice(kind: str) -> str | None:
    """Megatron-LM's tokenizer system of core 0.15 on (the default there, the only one from 0.17)
    encodes all three SentencePiece types as GPTSentencePieceTokenizer; gptrain keeps each type's
    own encoding (Megatron up to core 0.14, --legacy-tokenizer, Megatron-DeepSpeed): said once."""
    from gptrain.data.tokenizers import canonical_type

    what = {
        "llama2": "puts the model's bos before every text",
        "sentencepiece": "adds <CLS> <SEP> <EOD> <MASK> (and <PAD>/<BOS>/<EOS> where the model lacks them), "
        "ends documents with <EOD>",
    }.get(canonical_type(kind))
    if what is None:
        return None
    return (
        f"note: --tokenizer-type {kind} {what}, as Megatron-LM up to core 0.14 (and with "
        "--legacy-tokenizer); Megatron-LM core 0.15 on encodes it as GPTSentencePieceTokenizer: pass "
        "that type for the same ids"
    )


def _run_prepare(args: argparse.Namespace) -> int:
    from gptrain.data.gpt2_bpe import legacy_merges_note
    from gptrain.data.prepare import PrepareConfig, prepare
    from gptrain.data.tokenizer_fingerprint import renumbered_added_tokens_note
    from gptrain.data.tokenizer_loaders import class_setting_note
    from gptrain.data.tokenizers import TokenizerSpec, canonical_type
    from gptrain.errors import ConfigError

    if args.workers < 1 or args.log_interval < 1:
        raise ConfigError("--workers and --log-interval must be at least 1")
    _check_megatron_runtime_flags(args)
    if args.partitions is not None and args.partitions > 1 and not args.keep_sequential_samples:
        print(partition_order_notice(args.partitions), file=sys.stderr)
    kind = tokenizer_type(args)
    if kind is None:
        raise ConfigError("give a tokenizer: --vocab-file/--merge-file (GPT-2 BPE) or --tokenizer-model")
    for note in megatron_tokenizer_notes(args, kind):
        print(note, file=sys.stderr)
    if not args.legacy_tokenizer and (notice := sentencepiece_version_notice(kind)) is not None:
        print(notice, file=sys.stderr)
    options = tiktoken_options(args)
    null = null_options(args) if canonical_type(kind) == "null" else None
    spec = TokenizerSpec(
        kind, args.vocab_file, args.merge_file, args.tokenizer_model, options, args.legacy_tokenizer, null
    )
    if canonical_type(kind) == "huggingface" and (note := renumbered_added_tokens_note(spec.model)):
        print(note, file=sys.stderr)
    if canonical_type(kind) == "huggingface" and (note := class_setting_note(spec.model or "")):
        print(note, file=sys.stderr)
    files = spec.files() if canonical_type(kind) == "gpt2" and args.legacy_tokenizer else []
    if len(files) == 2 and (note := legacy_merges_note(files[1])) is not None:
        print(note, file=sys.stderr)
    config = PrepareConfig(
        inputs=args.input,
        output_prefix=args.output_prefix,
        tokenizer=spec,
        json_keys=tuple(args.json_keys or ["text"]),
        append_eod=args.append_eod,
        workers=usable_workers(args.workers),
        log_interval=args.log_interval,
        skip_bad_lines=args.skip_bad_lines,
    )
    with terminate_as_exception():  # a Slurm time limit or `timeout`: remove the partial output
        stats = prepare(config)
    print(stats.summary())
    return 0


def non_negative(text: str) -> int:
    """argparse type: a whole number of 0 or more (argparse then names the option that is wrong)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _add_inspect(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="counts, length percentiles and decoded tokens of a .bin/.idx dataset",
        description="Show documents, sequences, tokens, dtype, document-length percentiles and the first "
        "tokens of one document (decoded when a tokenizer is given).",
    )
    parser.add_argument("prefix", help="dataset prefix (without .bin/.idx)")
    add_tokenizer_args(parser)
    parser.add_argument("--document", type=int, default=0, help="document to show (0-based, default 0)")
    parser.add_argument(
        "--num-tokens", type=non_negative, default=32, help="tokens of it to show (default 32)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from gptrain.data.summary import format_summary, summarize

    tokenizer = tokenizer_from_args(args)
    if tokenizer is not None:
        warn_other_vocabulary([args.prefix], tokenizer, args)
    info = summarize(args.prefix, tokenizer, args.document, args.num_tokens)
    print(format_summary(info, as_json=args.json))
    return 0


def _add_merge(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="concatenate datasets (like tools/merge_datasets.py)",
        description="Concatenate .bin/.idx datasets in the order given; token dtypes must agree.",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        action="extend",  # `--input A --input B` is both datasets, not only B
        required=True,
        help="dataset prefixes in order, or directories of datasets; may be repeated",
    )
    parser.add_argument("--output-prefix", required=True, help="the merged dataset's prefix")
    parser.set_defaults(func=_run_merge)


def _run_merge(args: argparse.Namespace) -> int:
    from gptrain.data.merge import merge_datasets
    from gptrain.utils.progress import counted

    with terminate_as_exception():  # a Slurm time limit or `timeout`: remove the partial output
        merged = merge_datasets(args.input, args.output_prefix)
    counts = f"{counted(merged.datasets, 'dataset')}: {counted(merged.documents, 'document')}, "
    print(f"merged {counts}{counted(merged.tokens, 'token')} -> {merged.path_prefix}.bin/.idx")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `gptrain data` with prepare, inspect, merge and sample."""
    from gptrain.data.sample_cli import add_sample_parser

    parser = subparsers.add_parser("data", help="prepare, inspect, merge and sample tokenized datasets")
    data_subparsers = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    _add_prepare(data_subparsers)
    _add_inspect(data_subparsers)
    _add_merge(data_subparsers)
    add_sample_parser(data_subparsers)
