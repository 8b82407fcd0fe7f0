"""Parser for `gptrain data sample` (light: no torch or numpy at module level)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gptrain.data.tokenizer_args import add_tokenizer_args, tokenizer_from_args, warn_other_vocabulary

SPLITS = ("train", "valid", "test")


def add_sample_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `data sample`: print one training sample exactly as training (and Megatron) sees it."""
    parser = subparsers.add_parser(
        "sample",
        help="print sample I of a split as JSON (tokens, provenance, text)",
        description="Build (or load from cache) the GPT sample indices of a prefix or a weighted blend "
        "exactly as Megatron-LM does, and print sample I of a split as JSON: its seq_length+1 token "
        "ids, where they come from, and the decoded text when a tokenizer is given.",
    )
    parser.add_argument(
        "--data-prefix",
        nargs="+",
        action="extend",  # `--data-prefix 1 A --data-prefix 2 B` is the blend, not B alone
        metavar="PREFIX",
        help="one prefix, or pairs 'W1 P1 W2 P2 ...' for a blend; may be repeated",
    )
    parser.add_argument(
        "--seq-length", type=int, required=True, help="tokens per sample (the sample has one more)"
    )
    parser.add_argument("--seed", type=int, default=1234, help="shuffle seed (Megatron --seed, default 1234)")
    parser.add_argument(
        "--splits-string", default=None, help="train,valid,test weights (default '969, 30, 1')"
    )
    parser.add_argument(
        "--num-samples",
        default="0,0,0",
        metavar="TRAIN,VALID,TEST",
        help="samples requested per split, as training requests them (0: one epoch of one prefix; mock data and "
        "blends need a count; default 0,0,0)",
    )
    parser.add_argument(
        "--mid-level-dataset-surplus",
        type=float,
        default=0.005,
        metavar="FRACTION",
        help="samples each dataset of a blend builds beyond its share, as training's "
        "model.data.mid_level_dataset_surplus (Megatron's flag; default 0.005)",
    )
    parser.add_argument("--split", choices=SPLITS, default="train", help="which split (default train)")
    parser.add_argument("--index", type=int, default=0, help="sample number in the split (default 0)")
    parser.add_argument("--cache-dir", help="index cache directory (default <prefix dir>/cache/...)")
    parser.add_argument("--mock", action="store_true", help="random tokens instead of data files")
    parser.add_argument("--vocab-size", type=int, help="vocabulary of the mock tokens")
    add_tokenizer_args(parser, "tokenizer (optional: adds the decoded text)", vocab_size=False)
    parser.set_defaults(func=run_sample)


def parse_num_samples(text: str) -> tuple[int, int, int]:
    from gptrain.errors import ConfigError

    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--num-samples {text!r}: give three non-negative counts like 1000,10,10")
    return int(parts[0]), int(parts[1]), int(parts[2])


def without_padding(tokens: list[int]) -> list[int]:
    """The sample's ids less the padding after its last document (PAD_TOKEN_ID, only ever at the
    end): any other negative id is the data's, and is named, not dropped from the text."""
    from gptrain.data.gpt_dataset import PAD_TOKEN_ID

    end = len(tokens)
    while end and tokens[end - 1] == PAD_TOKEN_ID:
        end -= 1
    return tokens[:end]


def documents_of_sequences(document_indices: Any, sequences: list[int]) -> list[int]:
    """The .idx document each sequence belongs to (the numbers `data inspect --document` takes):
    a document of several sentences holds several sequences, an empty one none."""
    import numpy as np

    found = np.searchsorted(document_indices, np.asarray(sequences, dtype=np.int64), side="right") - 1
    return [int(d) for d in found]


def _provenance(dataset: Any, index: int) -> dict[str, Any]:
    """Where sample `index` comes from, down to documents and offsets."""
    from gptrain.data.blended import BlendedDataset
    from gptrain.data.gpt_dataset import GPTDataset

    if isinstance(dataset, BlendedDataset):
        child, sample = dataset.locate(index)
        return {
            "blend_dataset": child,
            "blend_weight": dataset.weights[child],
            "dataset_sample": sample,
            **_provenance(dataset.datasets[child], sample),
        }
    if isinstance(dataset, GPTDataset):
        where = dataset.locate(index)
        sequences = where.documents  # Megatron's "document index" holds sequence ids
        return {
            "prefix": dataset.dataset.path_prefix,
            "unshuffled_sample": where.sample,
            "sequences": sequences,
            "documents": documents_of_sequences(dataset.dataset.document_indices, sequences),
            "first_sequence_offset": where.first_offset,
            "last_sequence_tokens": where.last_length,
        }
    return {"mock": True, "seed": dataset.seed}


def _verify_sources(dataset: Any) -> None:
    """Check the whole .idx of every dataset behind the sample (free when indices were just built)."""
    from gptrain.data.blended import BlendedDataset
    from gptrain.data.gpt_dataset import GPTDataset

    if isinstance(dataset, BlendedDataset):
        for child in dataset.datasets:
            _verify_sources(child)
    elif isinstance(dataset, GPTDataset):
        dataset.dataset.verify()


def _tokenizer_flags(args: argparse.Namespace) -> argparse.Namespace:
    """The tokenizer's flags: --vocab-size is the mock tokens' vocabulary, which a TikTokenizer
    vocabulary file reads as its own (Megatron's --vocab-size); any other tokenizer has its own
    vocabulary, and a tiktoken encoding name refuses a size (it would refuse the mock's).
    NullTokenizer is --vocab-size ids, as Megatron's."""
    from gptrain.utils.tokenizer_types import NULL_TYPE, megatron_tokenizer_type
    from gptrain.utils.tokenizer_types import is_tiktoken_vocabulary_file as is_vocabulary_file

    if args.tokenizer_model and is_vocabulary_file(args.tokenizer_model):
        return args
    if megatron_tokenizer_type(args.tokenizer_type) == NULL_TYPE:
        return args
    return argparse.Namespace(**{**vars(args), "vocab_size": None})


def run_sample(args: argparse.Namespace) -> int:
    import numpy as np

    from gptrain.data.blend_spec import parse_blend
    from gptrain.data.builder import build_gpt_datasets
    from gptrain.data.gpt_dataset import seed_problem
    from gptrain.data.summary import check_ids_in_vocabulary
    from gptrain.errors import ConfigError, DataError

    counts = parse_num_samples(args.num_samples)
    if (problem := seed_problem(args.seed)) is not None:
        raise ConfigError(f"--seed {problem}")
    if args.seq_length < 2:
        raise ConfigError(f"--seq-length {args.seq_length}: a sample needs at least 2 tokens; give 2 or more")
    if not 0 <= args.mid_level_dataset_surplus < float("inf"):
        raise ConfigError(
            f"--mid-level-dataset-surplus {args.mid_level_dataset_surplus}: give a finite fraction of 0 or more"
        )
    if args.vocab_size is not None and args.vocab_size < 1:
        raise ConfigError(f"--vocab-size {args.vocab_size}: the mock tokens' vocabulary needs 1 id or more")
    if not args.mock and not args.data_prefix:
        raise ConfigError("give --data-prefix PREFIX (or 'W1 P1 W2 P2 ...'), or --mock --vocab-size V")
    split = SPLITS.index(args.split)
    if (args.mock or (args.data_prefix and len(args.data_prefix) > 1)) and counts[split] == 0:
        raise ConfigError(
            f"--num-samples gives the {args.split} split 0 samples; mock data and blends need a count"
        )
    prefix = args.data_prefix[0] if args.data_prefix and len(args.data_prefix) == 1 else args.data_prefix
    if prefix is not None:
        try:  # a bad weight named by the flag, as train and megatron name theirs, before any index is built
            parse_blend(prefix)
        except DataError as error:
            raise DataError(f"--data-prefix: {error}") from None
    tokenizer = tokenizer_from_args(_tokenizer_flags(args))
    if tokenizer is not None and prefix is not None:
        warn_other_vocabulary(parse_blend(prefix)[0], tokenizer, args, "--data-prefix")
    datasets = build_gpt_datasets(
        prefix,
        args.splits_string,
        args.seq_length,
        args.seed,
        counts,
        args.cache_dir,
        args.mock,
        args.vocab_size,
        only_split=args.split,  # an empty test split must not stop a look at the train split
        asked_by=("--num-samples",) * 3,
        surplus=args.mid_level_dataset_surplus,
        surplus_named="--mid-level-dataset-surplus",
    )
    dataset = datasets[split]
    if dataset is None:
        raise DataError(f"the split string {args.splits_string!r} leaves the {args.split} split empty")
    if not 0 <= args.index < len(dataset):
        raise DataError(
            f"--index {args.index} out of range: the {args.split} split has {len(dataset)} samples"
        )
    _verify_sources(dataset)
    tokens = [int(t) for t in dataset[args.index]]
    result: dict[str, Any] = {
        "split": args.split,
        "index": args.index,
        "num_samples": len(dataset),
        "seq_length": args.seq_length,
        **_provenance(dataset, args.index),
        "tokens": tokens,
    }
    if tokenizer is not None:
        ids = np.array(without_padding(tokens), dtype=np.int64)
        where = f"{result.get('prefix', '--mock')}: sample {args.index} of the {args.split} split"
        check_ids_in_vocabulary(where, ids, int(tokenizer.vocab_size), "sample")
        result["text"] = tokenizer.decode(ids.tolist())
    json.dump(result, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
