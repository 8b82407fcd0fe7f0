"""`gptrain import`: a transformers model directory as a gptrain run directory.

The run directory is what training would have left: `hparams.yaml` (a preset with the imported
shape, the copied tokenizer and this directory as `exp_manager.explicit_log_dir`) and
`checkpoints/step_0` written by the CheckpointManager (COMPLETE, `latest`). The checkpoint holds
model weights only: training resumes from it with a fresh optimizer, LR schedule and counters.
Everything is built in a temporary sibling and renamed into place once verified. The model's
context (config.json's max_position_embeddings, GPT-2's n_positions) is kept as
model.max_position_embeddings; the run's samples are --seq-length tokens, by default that context
up to DEFAULT_SEQ_LENGTH_CAP.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from gptrain.errors import ConfigError, DataError
from gptrain.trained.hf.architectures import (
    BASE_PRESETS,
    CLASS_NAMES,
    DEFAULT_SEQ_LENGTH_CAP,
    GPT2,
    architecture_of,
    model_overrides,
)
from gptrain.trained.hf.record import source_generation_config, write_record
from gptrain.trained.hf.storage import SafetensorsTensors
from gptrain.trained.hf.tensors import (
    embedding_name,
    globals_from_hf,
    hf_global_names,
    layer_from_hf,
    output_layer_tied,
)
from gptrain.trained.hf.tokenizer_files import import_tokenizer
from gptrain.trained.hf.transformers_api import load_config, require_transformers
from gptrain.trained.hf.verify import Verification
from gptrain.utils.atomic import atomic_directory, remove_unfinished_directories
from gptrain.utils.progress import Progress

TOKENIZER_DIR = "tokenizer"
CHECKPOINTS = "checkpoints"
# safetensors' names of the dtypes `gptrain export --dtype` writes
STORED_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclass
class ImportReport:
    output: Path
    class_name: str
    checkpoint: Path
    seconds: float
    verification: Verification | None


def import_hf(
    hf_dir: str | Path,
    output: str | Path,
    verify: bool = True,
    stream: TextIO | None = None,
    seq_length: int | None = None,
) -> ImportReport:
    """Write the run directory `output` from `hf_dir`; verified unless `verify` is False; its
    training and eval samples `seq_length` tokens long (None: see `sample_length`)."""
    require_transformers()
    started = time.perf_counter()
    stream = stream or sys.stderr
    hf_dir, output = Path(hf_dir), Path(output).resolve()
    remove_unfinished_directories(output, stream)
    if not hf_dir.is_dir():
        raise DataError(f"{hf_dir}: not a directory; pass a transformers model directory")
    hf_config = load_config(hf_dir)
    arch = architecture_of(hf_config, str(hf_dir / "config.json"))
    overrides = model_overrides(hf_config, arch, str(hf_dir / "config.json"))
    tied = output_layer_tied(SafetensorsTensors(hf_dir), arch, hf_config, stream)
    overrides["share_embeddings_and_output_weights"] = tied
    generation = source_generation_config(hf_dir)
    seq_length = sample_length(seq_length, overrides["max_position_embeddings"], arch, hf_dir, stream)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise DataError(
            f"{output}: already exists and is not an empty directory; remove it or choose another"
        )
    with atomic_directory(output) as staging:  # makes the missing parents, and removes them on failure
        tokenizer = import_tokenizer(hf_dir, staging / TOKENIZER_DIR, output / TOKENIZER_DIR)
        rows = int(hf_config.vocab_size)
        if tokenizer is None:
            print(f"gptrain: warning: {hf_dir} has no tokenizer files; the run uses mock data", file=stream)
        else:
            tokens = int(check_source_tokenizer(hf_dir, tokenizer).vocab_size)
            _check_rows(hf_dir, tokens, rows)
            check_tokenizer_fills_rows(hf_dir, tokens, rows, verify, stream)
        cfg = training_config(arch, overrides, seq_length, tokenizer, rows, output)
        if tokenizer is not None and (multiple := row_keeping_multiple(cfg, tokens, rows, hf_dir, stream)):
            overrides["make_vocab_size_divisible_by"] = multiple
            cfg = training_config(arch, overrides, seq_length, tokenizer, rows, output)
        if verify and tokenizer is not None:  # before the weights: it is the cheap check
            verify_imported_tokenizer(cfg, staging, hf_dir)
        model = build_imported_model(cfg, staging, hf_dir, arch, stream)
        step_dir = save_weights(model, staging / CHECKPOINTS, _tokenizer(cfg, staging), cfg)
        del model
        write_record(staging, hf_config, hf_dir, stored_dtype(hf_dir, arch, tied), generation)
        verification = verify_import(cfg, staging, step_dir, hf_dir) if verify else None
        # last: without it gptrain opens no run, so the staging directory an import killed outright
        # (SIGKILL, the OOM killer) leaves behind is never trained on, evaluated or exported unverified
        (staging / "hparams.yaml").write_text(cfg.to_yaml())
    elapsed = time.perf_counter() - started
    checkpoint = output / CHECKPOINTS / step_dir.name
    return ImportReport(output, CLASS_NAMES[arch], checkpoint, elapsed, verification)


def sample_length(asked: int | None, context: int, arch: str, hf_dir: Path, stream: TextIO) -> int:
    """The run's training and eval sample length: `asked` (--seq-length), at most the model's
    `context`; without it the context, capped at DEFAULT_SEQ_LENGTH_CAP, saying so when it is."""
    key = "n_positions" if arch == GPT2 else "max_position_embeddings"
    if asked is not None:
        if not 1 <= asked <= context:
            raise ConfigError(
                f"--seq-length {asked}: must be from 1 to the model's context, {context} ({key} in "
                f"{hf_dir / 'config.json'})"
            )
        return asked
    if context <= DEFAULT_SEQ_LENGTH_CAP:
        return context
    print(
        f"gptrain: note: the run trains and evaluates on samples of {DEFAULT_SEQ_LENGTH_CAP} tokens, not the "
        f"model's whole context of {context} ({key}, kept as model.max_position_embeddings); "
        "--seq-length N chooses another length",
        file=stream,
    )
    return DEFAULT_SEQ_LENGTH_CAP


def training_config(
    arch: str,
    model: dict[str, Any],
    seq_length: int,
    tokenizer: dict[str, Any] | None,
    hf_vocab: int,
    output: Path,
) -> Any:
    """The base preset with the imported shape and tokenizer, samples of `seq_length` tokens, one
    process, results in `output`."""
    from gptrain.config import load_training_config

    values: dict[str, Any] = {f"model.{key}": value for key, value in model.items()}
    values.update(
        {
            "run.name": output.name,
            "trainer.num_nodes": 1,
            "trainer.devices": 1,
            "model.tensor_model_parallel_size": 1,
            "model.pipeline_model_parallel_size": 1,
            "model.encoder_seq_length": seq_length,
            "model.data.seq_length": seq_length,
            "exp_manager.explicit_log_dir": str(output),
            "exp_manager.resume_if_exists": True,
        }
    )
    if tokenizer is None:
        values.update({"model.data.data_impl": "mock", "model.data.mock_vocab_size": hf_vocab})
    else:
        values.update({f"model.tokenizer.{key}": value for key, value in tokenizer.items()})
    overrides = [f"{key}={_yaml_value(value)}" for key, value in values.items()]
    return load_training_config(BASE_PRESETS[arch], overrides, report_ignored=False)


TP_SIZES_KEPT_COMPACT = (1, 2, 4, 8)
"""Tensor-parallel sizes at which the import's make_vocab_size_divisible_by must not pad far past the
model's rows (training pads to a multiple of it x TP)."""


def row_keeping_multiple(cfg: Any, tokens: int, rows: int, hf_dir: Path, stream: TextIO) -> int | None:
    """A model.make_vocab_size_divisible_by that pads the tokenizer's `tokens` to at least the model's
    `rows` where `cfg`'s pads them to fewer (Phi-2: 51200 rows for 50295 tokens, which 128 pads to
    50304; a run resumed from the import dropped the rest); None where `cfg`'s holds every row.

    Training pads to a multiple of it x TP, which is a multiple of it too, so a value that keeps every
    row at TP 1 keeps them at any TP; but a value fit for TP 1 alone can pad far past the rows under
    TP (Phi-2's 1024 is 57344 rows at TP 8). So among the divisors of `rows` that pad `tokens` to them
    and the multiples of the preset that keep every row, the one padding least at TP 8, then 4, 2, 1,
    within `_padding_bound` at each (Phi-2: 1280, exactly 51200 at each). Where none is within it
    (1000 tokens beside 50257 rows, under --no-verify) the preset stays, saying which rows training
    drops and the value that keeps them."""
    from gptrain.models.flops import pad_vocab_size

    preset = cfg.model.make_vocab_size_divisible_by
    padded = pad_vocab_size(tokens, preset)
    if padded >= rows:
        return None
    fitting = [
        multiple
        for multiple in _row_keeping_candidates(tokens, rows, preset)
        if all(
            pad_vocab_size(tokens, multiple, tp) <= _padding_bound(rows, preset, tp)
            for tp in TP_SIZES_KEPT_COMPACT
        )
    ]
    if not fitting:
        exact = next(d for d in range(rows - tokens + 1, rows + 1) if rows % d == 0)
        print(
            f"gptrain: warning: {hf_dir} has {rows} embedding rows for its tokenizer's {tokens} tokens; the "
            f"preset's model.make_vocab_size_divisible_by={preset} pads to {padded}, so training drops rows "
            f"{padded}-{rows - 1} (no value keeps them without padding over 1/32 past them at TP 8); set "
            f"model.make_vocab_size_divisible_by={exact} to keep them",
            file=stream,
        )
        return None

    def padding_from_the_largest_tp(multiple: int) -> tuple[int, ...]:
        return (*(pad_vocab_size(tokens, multiple, tp) for tp in reversed(TP_SIZES_KEPT_COMPACT)), multiple)

    multiple = min(fitting, key=padding_from_the_largest_tp)
    print(
        f"gptrain: note: {hf_dir} has {rows} embedding rows for its tokenizer's {tokens} tokens; the run "
        f"keeps them all with model.make_vocab_size_divisible_by={multiple} (the preset's {preset} pads "
        f"to {padded} rows: a run with it drops the others)",
        file=stream,
    )
    return multiple


def _row_keeping_candidates(tokens: int, rows: int, preset: int) -> set[int]:
    """Values of make_vocab_size_divisible_by that pad `tokens` to at least `rows`: the divisors of
    `rows` past rows - tokens (which pad to exactly `rows` at TP 1) and the multiples of `preset`
    that do (the preset's alignment); none above an eighth of the bound at TP 8, past which it pads."""
    from gptrain.models.flops import pad_vocab_size

    largest = _padding_bound(rows, preset, max(TP_SIZES_KEPT_COMPACT)) // max(TP_SIZES_KEPT_COMPACT)
    divisors = {d for d in range(rows - tokens + 1, min(rows, largest) + 1) if rows % d == 0}
    multiples = {d for d in range(preset, largest + 1, preset) if pad_vocab_size(tokens, d) >= rows}
    return divisors | multiples


def _padding_bound(rows: int, preset: int, tp: int) -> int:
    """The most rows the import's value may pad to at `tp`: as many as Megatron pads `rows` tokens to
    with the preset, or 1/32 past `rows` where that is more (every vocabulary of 32768 rows or more:
    the preset's padding at TP 8 adds under 1024), so at most 1/32 (3.1%) past a real model's rows."""
    from gptrain.models.flops import pad_vocab_size

    return max(pad_vocab_size(rows, preset, tp), rows + rows // 32)


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _tokenizer(cfg: Any, staging: Path) -> Any | None:
    """The run's tokenizer, read from the staged copy (hparams.yaml names the final place)."""
    from gptrain.data.tokenizers import build_tokenizer
    from gptrain.train.builders import is_mock_data

    tok = cfg.model.tokenizer
    if is_mock_data(cfg) and cfg.model.data.mock_vocab_size:
        return None
    final = Path(cfg.exp_manager.explicit_log_dir)

    def staged(value: str | None) -> str | None:
        return str(staging / Path(value).relative_to(final)) if value else None

    files = (staged(tok.vocab_file), staged(tok.merge_file), staged(tok.model))
    return build_tokenizer(tok.type, *files, legacy=bool(tok.legacy))


def check_source_tokenizer(hf_dir: Path, tokenizer: dict[str, Any]) -> Any:
    """Build the tokenizer `import_tokenizer` chose from `hf_dir`'s own files: a damaged one is then
    named there, where the user can fix it, not in the copy a failed import removes."""
    from gptrain.data.tokenizers import build_tokenizer

    def source(value: str | None, name: str) -> str | None:
        return str(hf_dir / name) if value else None

    return build_tokenizer(
        tokenizer["type"],
        source(tokenizer["vocab_file"], "vocab.json"),
        source(tokenizer["merge_file"], "merges.txt"),
        str(hf_dir) if tokenizer["model"] else None,
        legacy=tokenizer.get("legacy") is True,
    )


def build_imported_model(cfg: Any, staging: Path, hf_dir: Path, arch: str, stream: TextIO) -> nn.Module:
    """A gptrain model (vocabulary padded as training pads it) filled from the transformers weights."""
    from gptrain.models.gpt import GPT
    from gptrain.train.builders import build_model_config
    from gptrain.train.tokenizer_setup import padded_vocab_size

    _, padded = padded_vocab_size(cfg, _tokenizer(cfg, staging))
    # rows the tokenizer never emits (Phi-2, Qwen2 shape theirs so) are kept for export to restore
    config = build_model_config(cfg, max(padded, int(load_config(hf_dir).vocab_size)))
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device="cpu")
    model.tie_weights()
    state = model.state_dict()
    fill_weights(
        state,
        SafetensorsTensors(hf_dir),
        arch,
        config.num_layers,
        config.share_embeddings_and_output_weights,
        stream,
    )
    return model


def _check_rows(hf_dir: Path, vocab: int, rows: int) -> None:
    """Every token of the tokenizer needs an embedding row."""
    if rows < vocab:
        raise DataError(
            f"{hf_dir}: the model has {rows} embedding rows but its tokenizer has {vocab} tokens (ids from "
            f"{rows} on have no row); resize the embeddings in transformers "
            f"(model.resize_token_embeddings({vocab})), save the model and import that"
        )


def check_tokenizer_fills_rows(hf_dir: Path, tokens: int, rows: int, verify: bool, stream: TextIO) -> None:
    """Rows past the tokenizer are padding: a few percent (Phi-2: 51200 for 50295 tokens), or up to
    Megatron's default multiple of 128 for a small vocabulary. A tokenizer that fills under half of
    the rows beyond that (1000 tokens for a 50257-row model) is most likely another model's, which
    the tokenizer checks cannot see (transformers reads the same files): refused, or under
    --no-verify a warning."""
    from gptrain.models.flops import pad_vocab_size

    if rows <= max(2 * tokens, pad_vocab_size(tokens, 128)):
        return
    problem = (
        f"{hf_dir}: the model has {rows} embedding rows but its tokenizer only {tokens} tokens, fewer than "
        "half, which no vocabulary padding explains; the tokenizer files are likely another model's"
    )
    if not verify:
        print(f"gptrain: warning: {problem} (imported anyway: --no-verify)", file=stream)
        return
    raise DataError(
        f"{problem}: put the model's own tokenizer in {hf_dir}, or pass --no-verify to import it anyway"
    )


@torch.no_grad()
def fill_weights(
    state: dict[str, torch.Tensor],
    weights: SafetensorsTensors,
    arch: str,
    layers: int,
    tied: bool,
    stream: TextIO,
) -> None:
    """Copy every tensor, layer by layer, into the live state (which shares storage with the model)."""
    live = {name: state[name] for name in hf_global_names(arch) if name in state}
    embedding = embedding_name(arch, weights.has, tied)
    for name, tensor in globals_from_hf(arch, weights.read, live, tied, embedding).items():
        _check_shape(weights.directory, name, tensor, state[name])
        state[name].copy_(tensor)
    progress = Progress("import", unit="layers", total=layers, stream=stream)
    for index in range(layers):
        prefix = f"layers.{index}."
        names = [key.removeprefix(prefix) for key in state if key.startswith(prefix)]
        for name, tensor in layer_from_hf(arch, index, weights.read, names).items():
            target = state[prefix + name]
            _check_shape(weights.directory, f"layer {index} {name}", tensor, target)
            target.copy_(tensor)
        progress.update(1)


def stored_dtype(hf_dir: Path, arch: str, tied: bool) -> str | None:
    """The dtype of the token embedding as `hf_dir` stores it ("bfloat16"), which export keeps;
    None for one export cannot write (float64, an 8-bit type): export then writes float32."""
    weights = SafetensorsTensors(hf_dir)
    return STORED_DTYPES.get(weights.stored_dtype(embedding_name(arch, weights.has, tied)))


def _check_shape(directory: Path, name: str, tensor: torch.Tensor, target: torch.Tensor) -> None:
    """The weights must have the shapes config.json gives the model (an edited hidden_size, or a
    config.json from another size, was a torch RuntimeError traceback for the embeddings)."""
    if tuple(tensor.shape) != tuple(target.shape):
        raise DataError(
            f"{directory}: {name} has shape {tuple(tensor.shape)}, config.json gives {tuple(target.shape)}; "
            "give the config.json these weights were saved with"
        )


def save_weights(model: nn.Module, root: Path, tokenizer: Any | None = None, cfg: Any | None = None) -> Path:
    """A weights-only checkpoint, step 0, written as training writes checkpoints (COMPLETE, latest),
    recording `tokenizer` (named as `cfg` names it) and the architecture as training does, so a run
    resumed in the import's directory with other heads or activation is refused as any run is."""
    from gptrain.checkpoint import architecture
    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.train.tokenizer_setup import tokenizer_check

    check = tokenizer_check(cfg, tokenizer) if cfg is not None else None
    manager = CheckpointManager(
        root, keep_last=None, tokenizer=check, architecture=architecture.record(model.config)
    )
    return manager.save(0, {"model": model_state_dict(model)}, {})


def verify_imported_tokenizer(cfg: Any, staging: Path, hf_dir: Path) -> None:
    """The tokenizer the run will use encodes as transformers' AutoTokenizer of `hf_dir` does."""
    from gptrain.trained.hf.verify import verify_tokenizer

    tok = cfg.model.tokenizer
    files = "tokenizer.json" if tok.model else "vocab.json + merges.txt"

    def advice() -> str:
        rebuilt = _class_rebuilding_pipeline(hf_dir) if tok.model else None
        if rebuilt is None:
            return "nothing written; --no-verify imports it unchecked"
        return (
            f"transformers' {rebuilt} sets its own pre-tokenizer, not tokenizer.json's: set "
            f'"tokenizer_class": "PreTrainedTokenizerFast" in {hf_dir / "tokenizer_config.json"} to load '
            "tokenizer.json as it is, or pass --no-verify to import unchecked"
        )

    tokenizer = _tokenizer(cfg, staging)
    verify_tokenizer(hf_dir, tokenizer, f"gptrain's {tok.type} from {files}", advice)
    _check_added_tokens(hf_dir, tokenizer, files)


def _check_added_tokens(hf_dir: Path, tokenizer: Any, files: str) -> None:
    """transformers adds the tokens of added_tokens.json (and of tokenizer_config.json's
    added_tokens_decoder) to those of the files gptrain reads: gptrain would encode each as plain
    text (a chat model's <|im_start|> as pieces) where the model was trained on its id. The probe
    text of verify_tokenizer cannot know them (`tokens_beyond`)."""
    from gptrain.trained.hf.verify import VerificationError, tokens_beyond

    extra = tokens_beyond(hf_dir, tokenizer.vocab_size)
    if extra:
        first_id, first = extra[0]
        raise VerificationError(
            f"{hf_dir}: transformers' tokenizer has {len(extra)} token(s) beyond the {tokenizer.vocab_size} of "
            f"{files} ({first!r}, id {first_id}), added from added_tokens.json or tokenizer_config.json, which "
            "gptrain does not read; save the tokenizer with transformers (AutoTokenizer.from_pretrained(HF_DIR)"
            ".save_pretrained(HF_DIR)) so tokenizer.json holds them, and import again"
        )


def _class_rebuilding_pipeline(hf_dir: Path) -> str | None:
    """The name of the tokenizer class AutoTokenizer picks for `hf_dir` when its normalizer or
    pre-tokenizer is not tokenizer.json's (transformers 5's GPT2Tokenizer sets ByteLevel whatever
    tokenizer.json says); None when it keeps them."""
    import json

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        return None
    theirs = json.loads(backend.to_str())
    shipped = json.loads(Tokenizer.from_file(str(hf_dir / "tokenizer.json")).to_str())
    if all(theirs.get(key) == shipped.get(key) for key in ("normalizer", "pre_tokenizer")):
        return None
    return type(loaded).__name__


def verify_import(cfg: Any, staging: Path, step_dir: Path, hf_dir: Path) -> Verification:
    """gptrain's model loaded from the written checkpoint against transformers' model of `hf_dir`,
    over the model's context: the run's samples (--seq-length) may be far shorter."""
    from gptrain.train.builders import build_model, build_model_config
    from gptrain.train.tokenizer_setup import padded_vocab_size
    from gptrain.trained.hf.transformers_api import load_model
    from gptrain.trained.hf.verify import verify_models
    from gptrain.trained.load import load_weights

    tokenizer = _tokenizer(cfg, staging)
    vocab, padded = padded_vocab_size(cfg, tokenizer)
    rows = int(load_config(hf_dir).vocab_size)
    vocab = min(vocab, rows)
    config = build_model_config(cfg, max(padded, rows))
    config = replace(config, seq_length=config.max_positions)
    ours = build_model(config, torch.device("cpu"), seed=0)
    load_weights(ours, step_dir)
    theirs = load_model(hf_dir)
    prompt = list(tokenizer.encode("The meaning of life is")) if tokenizer is not None else [0, 1, 2]
    return verify_models(ours, theirs, vocab, config.seq_length, prompt, f"import of {hf_dir}")
