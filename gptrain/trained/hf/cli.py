"""`gptrain export --to hf` and `gptrain import` parsers (light: torch and transformers load when they run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gptrain.utils.signals import terminate_as_exception


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a trained checkpoint to Hugging Face transformers",
        description=(
            "Write the newest complete checkpoint of a run (RUN_OR_CHECKPOINT: the run directory, its "
            "results/ or checkpoints/ directory, or a step dir; saved under any parallel layout) as a transformers model directory: "
            "config.json, safetensors weights, generation_config.json and the tokenizer files. The "
            "result is loaded with transformers and must give the same logits and greedy continuation "
            "as gptrain's model, or nothing is written. Needs: pip install 'gptrain[hf]'."
        ),
    )
    parser.add_argument(
        "checkpoint",
        metavar="RUN_OR_CHECKPOINT",
        help="a run directory (results/<run.name>), its results/ or checkpoints/ directory, or a step_<N> directory",
    )
    parser.add_argument(
        "--to", choices=["hf"], required=True, help="target format (hf: Hugging Face transformers)"
    )
    parser.add_argument("output", metavar="OUTPUT_DIR", help="new (or empty) directory to write")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the checks of logits, greedy continuation and tokenizer",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16", "fp32", "bf16", "fp16"],
        default=None,
        help=(
            "dtype of the written weights (default: float32, as trained; for a model imported from "
            "Hugging Face, or a run started from one, the dtype it was stored in); bfloat16 halves the size"
        ),
    )
    parser.add_argument(
        "--max-shard-size-gb", type=float, default=5.0, help="largest safetensors file in GB (default 5)"
    )
    parser.set_defaults(func=removing_partial_output_on_sigterm(run_export))


def add_import_parser(subparsers: argparse._SubParsersAction) -> None:
    from gptrain.trained.hf.architectures import DEFAULT_SEQ_LENGTH_CAP  # no torch

    parser = subparsers.add_parser(
        "import",
        help="import a Hugging Face model as a gptrain run",
        description=(
            "Turn a local transformers GPT2LMHeadModel, StableLmForCausalLM or LlamaForCausalLM directory "
            "into a run directory: a gptrain checkpoint (weights only) and hparams.yaml, which "
            "`gptrain generate RUN_DIR` uses as it is and `gptrain train --config-file RUN_DIR/hparams.yaml` "
            "continues pretraining from (with a fresh optimizer, under any layout). Verified like export. "
            "Needs: pip install 'gptrain[hf]'."
        ),
    )
    parser.add_argument(
        "hf_dir", metavar="HF_DIR", help="transformers model directory (config.json, safetensors)"
    )
    parser.add_argument("--output", required=True, metavar="RUN_DIR", help="new (or empty) run directory")
    parser.add_argument(
        "--seq-length",
        type=int,
        default=None,
        metavar="N",
        help=(
            "tokens per training and eval sample of the run (model.encoder_seq_length and "
            "model.data.seq_length), at most the model's context, which is kept as "
            f"model.max_position_embeddings (default: that context, at most {DEFAULT_SEQ_LENGTH_CAP})"
        ),
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the checks of logits, greedy continuation and tokenizer (a tokenizer that fills "
        "under half of the model's embedding rows is then a warning)",
    )
    parser.set_defaults(func=removing_partial_output_on_sigterm(run_import))


def removing_partial_output_on_sigterm(
    run: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """SIGTERM (a Slurm time limit, `timeout`) unwinds like Ctrl-C: the model-sized staging
    directory is removed, where the signal's default action left it behind."""

    def guarded(args: argparse.Namespace) -> int:
        with terminate_as_exception():
            return run(args)

    return guarded


def run_export(args: argparse.Namespace) -> int:
    import math

    from gptrain.errors import ConfigError
    from gptrain.trained.hf.export import export_hf

    if not (args.max_shard_size_gb > 0 and math.isfinite(args.max_shard_size_gb)):  # inf has no byte count
        raise ConfigError(
            f"--max-shard-size-gb={args.max_shard_size_gb} must be a finite number > 0 "
            "(a size above the model's writes one file)"
        )
    if not args.no_verify:  # transformers loads the written directory back
        require_utf8_path(args.output, "OUTPUT_DIR")
    report = export_hf(
        args.checkpoint,
        args.output,
        verify=not args.no_verify,
        max_shard_bytes=int(args.max_shard_size_gb * 1e9),
        dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(args.dtype, args.dtype),
    )
    check = report.verification.describe() if report.verification else "not verified (--no-verify)"
    print(
        f"gptrain: exported {report.class_name} from {report.checkpoint} "
        f"({report.tensor_bytes / 1e6:.1f} MB of weights) to "
        f"{report.output} in {report.seconds:.1f} s; {check}"
    )
    return 0


def run_import(args: argparse.Namespace) -> int:
    from gptrain.trained.hf.import_ import import_hf

    require_utf8_path(args.hf_dir, "HF_DIR")
    require_utf8_path(args.output, "--output")

    report = import_hf(
        args.hf_dir, args.output, verify=not args.no_verify, stream=sys.stderr, seq_length=args.seq_length
    )
    check = report.verification.describe() if report.verification else "not verified (--no-verify)"
    print(
        f"gptrain: imported {report.class_name} into {report.output} ({report.checkpoint.name}, "
        f"{report.output / 'hparams.yaml'}) in {report.seconds:.1f} s; {check}"
    )
    return 0


def require_utf8_path(path: str, option: str) -> None:
    """A path that is not UTF-8 (a Latin-1 directory name) reaches Python with its bytes as
    surrogates, which safetensors, tokenizers and the run's hparams.yaml cannot take: import failed
    with a misleading "not a Hugging Face tokenizer.json" or named an override the user never gave."""
    from gptrain.errors import ConfigError, non_utf8, printable

    if (bad := non_utf8(path)) is not None:
        raise ConfigError(
            f"{option} {printable(path)}: {bad[1]} is not UTF-8, and safetensors, "
            "tokenizers and the run's config take UTF-8 paths only; rename it (or link it from a UTF-8 path)"
        )
