"""`gptrain export --to hf`: a run's newest complete checkpoint as a transformers model directory.

Weights stream from the DCP checkpoint one layer at a time (whatever layout saved it) into
safetensors shards, so memory holds one layer plus one unwritten shard, never the model twice.
Everything is written into a temporary sibling of OUTPUT_DIR, verified against the gptrain
model, and renamed into place only then: OUTPUT_DIR either holds a verified model or nothing.
config.json is the last file written, so a staging directory left by a SIGKILL never loads.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import torch

from gptrain.checkpoint.compat import saved_metadata
from gptrain.checkpoint.fit import check_fits
from gptrain.data.tokenizers import SENTENCEPIECE_KINDS, canonical_type
from gptrain.errors import ConfigError, DataError
from gptrain.models.config import GPTConfig
from gptrain.trained.hf.architectures import CLASS_NAMES, choose_architecture, hf_config_kwargs
from gptrain.trained.hf.record import (
    GENERATION_CONFIG,
    GENERATION_KEY,
    check_generation_config,
    find_run_record,
    generation_defaults,
    null_pad_exported,
    special_token_ids,
)
from gptrain.trained.hf.sentencepiece_json import sentencepiece_problem, unigram_rounding_note
from gptrain.trained.hf.storage import CheckpointTensors, ShardWriter, plan_shards
from gptrain.trained.hf.tensors import globals_to_hf, hf_global_names, layer_to_hf
from gptrain.trained.hf.tiktoken_bpe import gpt2_bpe_of
from gptrain.trained.hf.tokenizer_files import (
    add_source_chat_templates,
    export_tokenizer,
    tokenizer_directory,
)
from gptrain.trained.hf.transformers_api import config_class, require_transformers
from gptrain.trained.hf.verify import Verification
from gptrain.trained.load import checkpoints_dir, is_step_dir, not_finite_text
from gptrain.utils.atomic import atomic_directory, refuse_working_directory, remove_unfinished_directories
from gptrain.utils.paths import directory_blocker
from gptrain.utils.progress import Progress

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' "5GB"
PROMPT = "The meaning of life is"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CONFIG = "config.json"
HELD_CONFIG = "config.json.unverified"  # a name transformers never reads


@dataclass
class RunSource:
    """What export needs from a run: its checkpoint, config, tokenizer and model shape."""

    step_dir: Path
    cfg: Any
    tokenizer: Any | None
    vocab: int
    """Real (unpadded) vocabulary: the tokens verification compares."""
    model_config: GPTConfig
    rows: int
    """Embedding rows exported (config.json's vocab_size): `vocab`, or an imported model's own count."""
    token_ids: dict[str, int | None]
    """bos_token_id, eos_token_id (and pad_token_id when known) for the configs."""
    imported_from: str | None = None
    """The transformers directory hf_import.json names (a run imported, or started from an import)."""
    imported_dtype: str | None = None
    """The dtype that directory stores its weights in (hf_import.json), which export keeps by default."""
    generation: dict[str, Any] = field(default_factory=dict)
    """The imported model's generation_config.json (hf_import.json), written back over the ids."""


@dataclass
class ExportReport:
    output: Path
    class_name: str
    checkpoint: Path
    """The step directory exported (the newest complete one of a run: a save killed unfinished is not)."""
    files: list[str]
    tensor_bytes: int
    seconds: float
    verification: Verification | None


def open_run(path: str | Path, checksums: bool = False) -> RunSource:
    """The newest complete checkpoint under `path` (that passes its CRC-32s too, with `checksums`)
    and the model shape its hparams.yaml gives."""
    from gptrain.train.builders import build_model_config
    from gptrain.trained.load import open_run as open_checkpoint

    run = open_checkpoint(path, checksums=checksums)
    record_file, record = find_run_record(run.hparams.parent)
    generation = recorded_generation(record_file, record)
    rows = max(run.vocab, min(int(record.get("vocab_size") or 0), run.saved_rows))
    if int(record.get("vocab_size") or 0) > run.saved_rows:
        print(
            f"gptrain: warning: {run.step_dir} has {run.saved_rows} embedding rows, fewer than the "
            f"{record['vocab_size']} of the imported model; exporting vocab_size {rows}",
            file=sys.stderr,
        )
    return RunSource(
        run.step_dir,
        run.cfg,
        run.tokenizer,
        run.vocab,
        build_model_config(run.cfg, run.saved_rows),
        rows,
        special_token_ids(run.cfg, run.tokenizer, record),
        record.get("source"),
        _recorded_dtype(record),
        generation,
    )


def recorded_generation(record_file: Path | None, record: dict[str, Any]) -> dict[str, Any]:
    """The imported model's generation config as its record holds it, checked as import checks it
    since 2026-11-29 (an older record may hold one transformers refuses). Refused, not dropped for
    the BOS/EOS-only file with a note: it holds the model's sampling defaults and often its only
    list of end tokens, which a release should lose only when asked to."""
    generation = generation_defaults(record)
    if generation and record_file is not None:
        check_generation_config(
            generation,
            f"{record_file}: its {GENERATION_KEY} (from {record.get('source')}/{GENERATION_CONFIG})",
            f'correct it there, or set "{GENERATION_KEY}" to null to export the BOS/EOS ids only',
        )
    return generation


def export_hf(
    path: str | Path,
    output: str | Path,
    verify: bool = True,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    stream: TextIO | None = None,
    dtype: str | None = None,
) -> ExportReport:
    """Write the transformers directory `output` with weights in `dtype` (float32, bfloat16 or
    float16; the checkpoint's float32 weights rounded to nearest; None: see `default_dtype`);
    verified unless `verify` is False."""
    if dtype is not None and dtype not in DTYPES:
        raise DataError(f"export dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    require_transformers()
    started = time.perf_counter()
    stream = stream or sys.stderr
    output = Path(output).resolve()  # "out/." names no sibling to stage in
    _refuse_inside_checkpoints(Path(path), output)
    remove_unfinished_directories(output, stream)
    _check_output(output)  # before the CRC-32 pass over the whole checkpoint
    # the CRC-32s too: the logit check compares two readings of the same weights, and would pass
    # a checkpoint changed on disk since it was written
    source = open_run(path, checksums=True)
    dtype = dtype or default_dtype(source, stream)
    arch = choose_architecture(source.model_config)
    _check_tokenizer_exportable(source, verify, stream)
    try:
        with atomic_directory(output) as staging:
            _write_configs(staging, source, arch, dtype)
            # a run on mock data has no tokenizer: the preset's tokenizer paths point at nothing
            if source.tokenizer is not None:
                export_tokenizer(
                    source.cfg, staging, source.model_config.max_positions, source.token_ids, source.tokenizer
                )
                _add_imported_chat_templates(source, staging, stream)
            tensor_bytes = write_weights(staging, source, arch, max_shard_bytes, stream, DTYPES[dtype])
            verification = verify_export(source, staging, DTYPES[dtype]) if verify else None
            release_config(staging)
    except Exception as error:  # a full disk, a quota, a read error: said in one line (nothing left behind)
        if not isinstance(error, OSError) and type(error).__name__ != "SafetensorError":
            raise
        reason = (
            error.strerror if isinstance(error, OSError) and error.strerror else " ".join(str(error).split())
        )
        raise DataError(
            f"export to {output} failed ({reason}); nothing was left there: free space or fix "
            "permissions (or the file system the checkpoint is read from) and export again"
        ) from None
    files = sorted(p.name for p in output.iterdir())
    elapsed = time.perf_counter() - started
    return ExportReport(
        output, CLASS_NAMES[arch], source.step_dir, files, tensor_bytes, elapsed, verification
    )


def _recorded_dtype(record: dict[str, Any]) -> str | None:
    """The dtype hf_import.json gives the imported weights, when export can write it."""
    dtype = record.get("dtype")
    return dtype if isinstance(dtype, str) and dtype in DTYPES else None


def default_dtype(source: RunSource, stream: TextIO) -> str:
    """The dtype an imported model stored its weights in (a run started from an import too): a
    bfloat16 model exported again in float32 was twice its size; float32, as trained, otherwise."""
    if source.imported_dtype is None or source.imported_dtype == "float32":
        return "float32"
    print(
        f"gptrain: note: writing {source.imported_dtype} weights, as {source.imported_from} stores them "
        "(--dtype float32 writes the checkpoint's float32 weights unrounded)",
        file=stream,
    )
    return source.imported_dtype


def _add_imported_chat_templates(source: RunSource, staging: Path, stream: TextIO) -> None:
    """A run imported before import copied chat templates: those of the directory it came from."""
    directory = tokenizer_directory(source.cfg)
    if not source.imported_from or directory is None:
        return
    if add_source_chat_templates(staging, directory, Path(source.imported_from)):
        print(
            f"gptrain: note: the chat template comes from {source.imported_from}, the directory the "
            "run was imported from (its tokenizer files are the run's)",
            file=stream,
        )


def _check_tokenizer_exportable(source: RunSource, verify: bool, stream: TextIO) -> None:
    """A tiktoken encoding (or Megatron's tiktoken vocabulary) has no transformers tokenizer files to
    copy, and a SentencePiece model with a property no tokenizer.json reproduces (sentencepiece_json)
    none to write: both refused before anything is written (verification would only fail at the
    end), or exported without one under --no-verify. A mock-data run has no tokenizer at all:
    exported without one, said so (AutoTokenizer would fail)."""
    tok = source.cfg.model.tokenizer
    if source.tokenizer is None:
        data = source.cfg.model.data
        print(
            f"gptrain: warning: model.data.data_impl={data.data_impl} (model.data.mock_vocab_size="
            f"{data.mock_vocab_size}): the run has no tokenizer, so the export has no tokenizer files",
            file=stream,
        )
        return
    kind = canonical_type(tok.type)
    if kind == "null":
        print(
            f"gptrain: note: model.tokenizer.type=NullTokenizer (token ids alone, model.tokenizer.vocab_size="
            f"{tok.vocab_size}): the export has no tokenizer files; give its model token ids (the tokenizer "
            "the data was made with encodes text for it)",
            file=stream,
        )
        if source.tokenizer.pad >= 0 and not null_pad_exported(source.tokenizer):
            print(
                f"gptrain: note: model.tokenizer.null_pad_id={source.tokenizer.pad} is not one of the "
                f"{tok.vocab_size} exported ids: config.json has no pad_token_id (transformers builds a "
                "padding row at that id and refuses one past them)",
                file=stream,
            )
        return
    if kind == "tiktoken" and gpt2_bpe_of(source.tokenizer) is not None:
        return  # GPT-2's split: exported as GPT-2's vocab.json + merges.txt
    if kind in SENTENCEPIECE_KINDS:
        problem = sentencepiece_problem(source.tokenizer)
        if problem is None:
            if (note := unigram_rounding_note(source.tokenizer)) is not None:
                print(f"gptrain: note: {note}", file=stream)
            return
        why = f"a SentencePiece model with {problem}, which no tokenizer.json encodes as sentencepiece does"
    elif kind == "tiktoken":
        why = (
            "a tiktoken encoding without GPT-2's split (gpt2, r50k_base and p50k_base export as GPT-2's "
            "vocab.json + merges.txt) or Megatron's tiktoken vocabulary"
        )
    else:
        return
    what = f"model.tokenizer.type={tok.type} (model.tokenizer.model={tok.model})"
    if verify:
        raise ConfigError(
            f"{what}: export writes no transformers tokenizer for {why}; pass --no-verify "
            "to export the weights without tokenizer files, or train with GPT2BPETokenizer "
            "(vocab.json + merges.txt) or HuggingFaceTokenizer (tokenizer.json)"
        )
    print(f"gptrain: warning: {what}: the export has no tokenizer files", file=stream)


def _check_output(output: Path) -> None:
    """Refuse a non-empty OUTPUT_DIR; its missing parents are made by atomic_directory, which
    removes them again when the export fails."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise DataError(
            f"{output}: already exists and is not an empty directory; remove it or choose another"
        )
    refuse_working_directory(output)  # as atomic_directory does, but before the CRC-32 pass
    blocker = directory_blocker(output.parent, must_write=True)  # the directory is renamed into it
    if blocker is not None:
        raise DataError(f"{output}: {blocker}; choose an OUTPUT_DIR that can be written")


def _refuse_inside_checkpoints(path: Path, output: Path) -> None:
    """An OUTPUT_DIR in the run's checkpoint root (run/checkpoints/step_N/hf) goes when retention
    removes step_N, and a directory there is none of the checkpoint tools' business."""
    root = path.parent if is_step_dir(path) else checkpoints_dir(path)
    if root is None or not output.is_relative_to(root.resolve()):
        return
    raise DataError(
        f"{output}: inside the run's checkpoint directory {root}, whose step directories are removed as "
        "newer checkpoints replace them (and the export with them); choose an OUTPUT_DIR outside it, "
        f"e.g. {root.parent / 'hf'}"
    )


def _write_configs(directory: Path, source: RunSource, arch: str, dtype: str) -> None:
    """config.json (with the dtype the weights are written in), held as HELD_CONFIG until
    `release_config`, and generation_config.json."""
    from transformers import GenerationConfig

    kwargs = hf_config_kwargs(source.model_config, arch, source.rows, source.token_ids)
    config = config_class(arch)(**kwargs)
    config.architectures = [CLASS_NAMES[arch]]
    config.dtype = dtype
    config.save_pretrained(str(directory))
    (directory / CONFIG).rename(directory / HELD_CONFIG)
    _add_legacy_keys(directory / HELD_CONFIG)
    GenerationConfig(**source.token_ids).save_pretrained(str(directory))
    if source.generation:
        _add_generation_defaults(directory / GENERATION_CONFIG, source.generation)


def _add_generation_defaults(path: Path, generation: dict[str, Any]) -> None:
    """The imported model's generation config over the ids written (its own eos list: a chat
    model's end-of-turn token is often there only) and its sampling defaults, as it had them.
    The directory is still the export's temporary one, so a plain write is safe."""
    written = json.loads(path.read_text())
    path.write_text(json.dumps({**written, **generation}, indent=2, sort_keys=True) + "\n")


def release_config(directory: Path) -> None:
    """config.json under its own name, the export's last step before the directory's rename: the
    staging directory an export killed outright (SIGKILL, the OOM killer, a node lost) leaves
    behind holds no config.json, so transformers loads nothing unverified or half-written from it."""
    (directory / HELD_CONFIG).rename(directory / CONFIG)


def _add_legacy_keys(path: Path) -> None:
    """transformers 5 writes the rope settings only inside rope_parameters, and the weights' dtype
    only as `dtype`; transformers 4 and serving stacks (vLLM, llama.cpp's converter) read the
    top-level rope keys and `torch_dtype`, and would fall back to their defaults (theta 10000,
    StableLM's rotary fraction 0.25, float32 taken as "pick a 16-bit type") without a word. The
    directory is still the export's temporary one, so a plain write is safe."""
    config = json.loads(path.read_text())
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    rope = config.get("rope_parameters")
    for key in ("rope_theta", "partial_rotary_factor"):
        if isinstance(rope, dict) and key in rope:
            config.setdefault(key, rope[key])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_weights(
    directory: Path,
    source: RunSource,
    arch: str,
    max_shard_bytes: int,
    stream: TextIO,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Stream the checkpoint into safetensors shards a layer at a time, in `dtype`; the bytes written."""
    reader = CheckpointTensors(source.step_dir)
    config = source.model_config
    check_fits(
        source.step_dir, {"model": meta_state(config)}, saved_metadata(source.step_dir, reader.metadata)
    )
    tied = config.share_embeddings_and_output_weights
    global_keys = [key for key in hf_global_names(arch) if key in reader.meta]

    def convert_globals(device: str) -> dict[str, torch.Tensor]:
        tensors = (
            {k: reader.empty(k, "meta") for k in global_keys}
            if device == "meta"
            else reader.read(global_keys)
        )
        return _in_dtype(globals_to_hf(arch, tensors, source.rows, tied), dtype, source.step_dir)

    def convert_layer(index: int, device: str) -> dict[str, torch.Tensor]:
        prefix = f"layers.{index}."
        keys = reader.keys(prefix)
        if not keys:
            raise DataError(f"{source.step_dir}: checkpoint has no tensors of layer {index}")
        tensors = {k: reader.empty(k, "meta") for k in keys} if device == "meta" else reader.read(keys)
        hf = layer_to_hf(arch, index, {k.removeprefix(prefix): v for k, v in tensors.items()})
        return _in_dtype(hf, dtype, source.step_dir)

    plan = [convert_globals("meta")] + [convert_layer(i, "meta") for i in range(config.num_layers)]
    sizes = [(name, t.numel() * t.element_size()) for part in plan for name, t in part.items()]
    writer = ShardWriter(directory, plan_shards(sizes, max_shard_bytes))
    progress = Progress(
        "export", unit="layers", total=config.num_layers, total_bytes=sum(s for _, s in sizes), stream=stream
    )
    writer.add(convert_globals("cpu"))
    for index in range(config.num_layers):
        layer = convert_layer(index, "cpu")
        writer.add(layer)
        progress.update(1, sum(t.numel() * t.element_size() for t in layer.values()))
    writer.finish()
    return writer.total_size


def meta_state(config: GPTConfig) -> dict[str, torch.Tensor]:
    """The model state `config` describes, shapes only. The checkpoint must fit it before a tensor
    is written: under --no-verify an hparams.yaml of another width wrote a config.json transformers
    refuses to load beside the weights, and one of fewer layers left the others out, exit 0."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from gptrain.models.gpt import GPT

    with torch.device("meta"):
        return get_model_state_dict(GPT(config))


def _in_dtype(
    tensors: dict[str, torch.Tensor], dtype: torch.dtype, step_dir: Path
) -> dict[str, torch.Tensor]:
    """The tensors rounded to `dtype`; a finite weight that rounds to inf (float16: |x| >= 65520) is
    refused, naming the largest |x|; up to that it rounds to float16's largest, 65504.
    NaN or inf weights (a run that diverged before its checkpoint) are refused in any dtype: the
    check would call them a wrong conversion, and --no-verify wrote them without a word."""
    for name, tensor in tensors.items():
        if tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
            raise DataError(
                f"{step_dir}: {name} holds {not_finite_text(tensor)} weights (the run diverged before this "
                "checkpoint?); export an earlier one (pass its step_<N> directory)"
            )
    rounded = {name: tensor.to(dtype) for name, tensor in tensors.items()}
    for name, tensor in rounded.items():
        if tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
            largest = float(tensors[name].abs().max())
            name_of = str(dtype).removeprefix("torch.")
            wider = "bfloat16 or float32" if dtype == torch.float16 else "float32"
            raise DataError(
                f"{step_dir}: {name} has values up to |x| = {largest:.7g}, which {name_of} rounds to inf "
                f"(its largest finite value is {torch.finfo(dtype).max:.7g}); export with --dtype {wider}"
            )
    return rounded


def verify_export(source: RunSource, directory: Path, dtype: torch.dtype = torch.float32) -> Verification:
    """The written directory, loaded by transformers, against gptrain's model of the checkpoint,
    over the model's context (the run's samples may be shorter: `gptrain import --seq-length`).

    For a bfloat16/float16 export gptrain's weights are rounded the same way first, so the check
    is as strict as for float32 (it tests the mapping, not the rounding); what the rounding
    itself does to the logits is reported beside it."""
    from gptrain.train.builders import build_model
    from gptrain.trained.hf.transformers_api import load_model
    from gptrain.trained.hf.verify import rounding_effect, verify_models, verify_tokenizer
    from gptrain.trained.load import load_weights

    config = replace(source.model_config, seq_length=source.model_config.max_positions)
    ours = build_model(config, torch.device("cpu"), seed=0)
    load_weights(ours, source.step_dir)
    rounding = rounding_effect(ours, dtype, source.vocab, config.seq_length)
    theirs = load_model(directory, directory / HELD_CONFIG)
    text = _text_tokenizer(source)
    prompt = list(text.encode(PROMPT)) if text is not None else [0, 1, 2]
    result = verify_models(
        ours, theirs, source.vocab, config.seq_length, prompt, f"export of {source.step_dir}"
    )
    result.rounding = rounding
    if text is not None:
        what = f"the run's {source.cfg.model.tokenizer.type}"
        verify_tokenizer(
            directory, source.tokenizer, what, lambda: "nothing written; --no-verify skips the check"
        )
        check_added_tokens(source, directory)
    return result


def _text_tokenizer(source: RunSource) -> Any | None:
    """The run's tokenizer where it encodes text (and the export has its files): not NullTokenizer's
    ids, nor a mock run's none."""
    if source.tokenizer is None or canonical_type(source.cfg.model.tokenizer.type) == "null":
        return None
    return source.tokenizer


def check_added_tokens(source: RunSource, directory: Path) -> None:
    """The exported AutoTokenizer has no tokens past the run's: a tokenizer_config.json copied with
    the run's tokenizer.json may add some (added_tokens_decoder), which gptrain never read, so the
    run trained on their text as pieces and the model has no row (or an untrained one) for them."""
    from gptrain.trained.hf.verify import VerificationError, tokens_beyond

    extra = tokens_beyond(directory, source.tokenizer.vocab_size)
    if not extra:
        return
    first_id, first = extra[0]
    where = tokenizer_directory(source.cfg)
    raise VerificationError(
        f"{where}: transformers' tokenizer has {len(extra)} token(s) past the {source.tokenizer.vocab_size} "
        f"the run encoded with ({first!r}, id {first_id}), added by {where}/tokenizer_config.json (or "
        "special_tokens_map.json), which gptrain does not read: the model trained on them as plain text; "
        "remove them there and export again (nothing written; --no-verify skips the check)"
    )
