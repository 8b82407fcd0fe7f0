"""Load a trained run's newest complete checkpoint into a model (generate, eval, export).

The model is rebuilt from the run's `hparams.yaml` with the same builders training uses,
so vocabulary padding and architecture match by construction; the weights are read
with torch.distributed.checkpoint in one process (no process group), which also reads
checkpoints saved by many ranks with any parallel layout.
"""

from __future__ import annotations

import shlex
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from gptrain.checkpoint import compat
from gptrain.checkpoint.directory import (
    HPARAMS,
    CheckpointLoadError,
    checkpoints_dir,
    file_given_text,
    incomplete_step_text,
    is_step_dir,
    is_transformers_model,
    no_checkpoints_text,
    no_complete_text,
    recorded_checkpoints_dir,
    removed_while_read,
    run_dir_of,
    step_dir_name,
    transformers_model_text,
)
from gptrain.checkpoint.errors import root_cause
from gptrain.checkpoint.fit import check_fits
from gptrain.checkpoint.integrity import (
    STEP_DIR,
    checksum_progress,
    complete_steps,
    is_complete,
    refusal,
    verify,
)
from gptrain.errors import DataError
from gptrain.trained.run_config import (
    build_run_tokenizer,
    check_run_architecture,
    check_run_tokenizer,
    load_hparams,
    tokenizer_files_from_start,
)
from gptrain.utils.paths import look_up

EMBEDDING_KEY = "model.tok_embeddings.weight"
POSITIONS_KEY = "model.pos_embeddings.weight"


@dataclass
class LoadedRun:
    model: nn.Module
    tokenizer: Any
    vocab_size: int
    """Unpadded vocabulary of the tokenizer (padding rows are never sampled)."""
    checkpoint: Path
    end_ids: frozenset[int] = frozenset()
    """Ids that end a generation besides the tokenizer's EOD: an imported model's eos_token_id(s)."""


def resolve_checkpoint(path: str | Path, checksums: bool = False) -> Path:
    """The step directory to load: `path` itself if it is one, else the newest complete one that
    verifies (sizes against its manifest, and with `checksums` every file's CRC-32: one more read
    of the checkpoint; an older one is taken, saying so on stderr, when the newest is damaged). A
    one-line error when the step directory given, or every one, is damaged."""
    path = Path(path)
    found = look_up(path)  # Path.exists raised PermissionError where it may not be looked up
    if found.kind == "unreachable":
        raise DataError(f"{path}: {found.why}")
    if found.kind == "missing":
        raise DataError(f"{path}: no such checkpoint or run directory")
    if found.kind == "file":
        raise DataError(file_given_text(path))
    if is_step_dir(path):
        if not is_complete(path):
            raise DataError(incomplete_step_text(path))
        problem = _verify(path, checksums)
        if problem is not None:
            raise CheckpointLoadError(
                f"checkpoint {path} is damaged: {problem}; pass {path.parent} to use the newest one that verifies"
            )
        return path
    root = checkpoints_dir(path)
    if root is None and is_transformers_model(path):
        raise DataError(transformers_model_text(path))
    if root is None:
        raise DataError(no_checkpoints_text(path))
    # newest COMPLETE first, as training resumes: `latest` lags one save behind a run killed between
    # a save's COMPLETE marker and its `latest`
    if not complete_steps(root):
        raise DataError(no_complete_text(root))
    return _newest_that_verifies(root, lambda: _complete_newest_first(root), checksums)


def older_checkpoint(step_dir: Path) -> Path | None:
    """The newest complete checkpoint before `step_dir` whose sizes verify (ones that do not are
    passed over, saying so); None when there is none before it."""
    match = STEP_DIR.match(step_dir.name)
    if match is None:
        return None
    root, step = step_dir.parent, int(match.group(1))

    def older() -> list[Path]:
        return [candidate for candidate in _complete_newest_first(root) if _step_of(candidate) < step]

    return _newest_that_verifies(root, older) if older() else None


def _complete_newest_first(root: Path) -> list[Path]:
    """The complete checkpoints of `root`, newest first, as training resumes (not `latest`: it lags one
    save behind a run killed between a save's COMPLETE marker and its `latest`)."""
    return [root / step_dir_name(step) for step in reversed(complete_steps(root))]


def _step_of(step_dir: Path) -> int:
    return int(step_dir.name.removeprefix("step_"))


RELISTS = 3
"""How often the checkpoints are listed again when the run, still saving, removes the one being checked."""


def _newest_that_verifies(root: Path, listing: Callable[[], list[Path]], checksums: bool = False) -> Path:
    """The first of `listing()` that verifies, saying which ones before it did not. One whose COMPLETE
    went while it was checked was removed by its run, still saving (retention unlinks the marker
    first): not damage, and the run's newer save is the one to take, so the listing is taken again."""
    damaged: dict[Path, str] = {}
    removed: Path | None = None
    for _ in range(RELISTS):
        found, removed = _first_that_verifies(listing(), damaged, checksums)
        if found is not None:
            if damaged:
                names = ", ".join(step.name for step in damaged)
                print(
                    f"gptrain: warning: using {found.name}, the newest checkpoint that verifies; damaged: "
                    f"{names} ({next(iter(damaged.values()))})",
                    file=sys.stderr,
                )
            return found
        if removed is None:
            break
    if removed is not None:  # removed under each listing: the run saves faster than this reads
        raise removed_while_read(removed)
    if not damaged:
        raise CheckpointLoadError(
            f"{root}: no complete checkpoint left (its run removed them while they were read)"
        )
    raise CheckpointLoadError(
        f"{root}: every complete checkpoint is damaged (newest: {next(iter(damaged.values()))}); "
        "`gptrain checkpoint verify` lists them"
    )


def _first_that_verifies(
    candidates: list[Path], damaged: dict[Path, str], checksums: bool
) -> tuple[Path | None, Path | None]:
    """(the first of `candidates` not in `damaged` that verifies, None); (None, one removed while it was
    checked); or (None, None). Each that fails its check goes into `damaged` with what is wrong."""
    for candidate in candidates:
        if candidate in damaged:
            continue
        problem = _verify(candidate, checksums)
        if problem is None:
            return candidate, None
        if not is_complete(candidate):
            return None, candidate
        damaged[candidate] = problem
    return None, None


def _verify(step_dir: Path, checksums: bool) -> str | None:
    """verify(); reading every file's CRC-32 shows its progress (minutes for a large checkpoint). A
    checkpoint that is not to be loaded whatever its files hold (`refusal`: a newer format, a step
    directory named for another iteration) is a one-line CheckpointLoadError, not damage to pass over."""
    refused = refusal(step_dir)
    if refused is not None:
        raise CheckpointLoadError(f"checkpoint {step_dir} is not loaded: {refused}")
    if not checksums:
        return verify(step_dir)
    progress = checksum_progress(step_dir, f"checking the CRC-32s of {step_dir.name}")
    return verify(step_dir, checksums=True, progress=progress)


def find_hparams(step_dir: Path) -> Path:
    """The run's hparams.yaml: next to the checkpoints dir (explicit_log_dir) or above it. The copy in
    a checkpoint_callback_params.dirpath leads to the run directory's own, where that is there: the
    one whose place tells where the run's relative paths start."""
    for directory in list(step_dir.parents)[:3]:
        if (directory / HPARAMS).is_file():
            return _runs_own_hparams(directory) or directory / HPARAMS
    raise DataError(
        f"{step_dir}: no {HPARAMS} in the run directory above it; it is needed to rebuild the model"
    )


def _runs_own_hparams(directory: Path) -> Path | None:
    """The hparams.yaml of the run whose dirpath `directory` is (its copy records both absolute)."""
    if recorded_checkpoints_dir(directory) != directory.absolute():
        return None
    run_dir = run_dir_of(directory)
    own = run_dir / HPARAMS
    return own if run_dir.is_absolute() and run_dir != directory and own.is_file() else None


def checkpoint_shapes(step_dir: Path, *keys: str) -> list[tuple[int, ...] | None]:
    """The saved shapes of some tensors (None: not saved), from one reading of the checkpoint's
    metadata (~50 s to unpickle for a large FSDP checkpoint: not once per tensor)."""
    try:
        metadata = compat.read_metadata(step_dir)
    except (OSError, RuntimeError, ValueError) as error:
        raise DataError(f"{step_dir}: unreadable checkpoint metadata ({error})") from None
    sizes = [getattr(metadata.state_dict_metadata.get(key), "size", None) for key in keys]
    return [tuple(size) if size is not None else None for size in sizes]


@dataclass
class RunCheckpoint:
    """A run's checkpoint as the tools on a trained model need it: where, its config, its vocabulary."""

    step_dir: Path
    hparams: Path
    cfg: Any
    tokenizer: Any | None
    """None for a run on mock data."""
    vocab: int
    """Real (unpadded) vocabulary: rows beyond it are padding."""
    saved_rows: int
    """Embedding rows in the checkpoint: the padding of the layout that wrote it (it grows with TP)."""


def open_run(
    path: str | Path, overrides: Sequence[str] | None = None, checksums: bool = False
) -> RunCheckpoint:
    """The newest complete checkpoint under `path` (or that step dir), with its run's config
    (`checksums`: see resolve_checkpoint). `overrides`: the command's key=value overrides (eval);
    None for a command that takes none (generate, export), whose errors then name hparams.yaml's keys."""
    from gptrain.train.builders import is_mock_data
    from gptrain.train.tokenizer_setup import padded_vocab_size

    step_dir = resolve_checkpoint(path, checksums)
    hparams = find_hparams(step_dir)
    cfg = load_hparams(hparams, overrides or ())
    moved = tokenizer_files_from_start(cfg, hparams, overrides or ())
    mock_vocab = is_mock_data(cfg) and cfg.model.data.mock_vocab_size
    tokenizer = None if mock_vocab else build_run_tokenizer(cfg, hparams, moved)
    check_run_tokenizer(cfg, tokenizer, step_dir, hparams, takes_overrides=overrides is not None)
    vocab, _ = padded_vocab_size(cfg, tokenizer)
    saved, positions = checkpoint_shapes(step_dir, EMBEDDING_KEY, POSITIONS_KEY)
    if saved is None:
        raise DataError(
            f"{step_dir}: no '{EMBEDDING_KEY}' in the checkpoint; is it a gptrain training checkpoint?"
        )
    if saved[0] < vocab:
        raise DataError(
            f"{step_dir}: embedding has {saved[0]} rows but {hparams} and its tokenizer give {vocab} tokens; "
            "the tokenizer files changed since training"
        )
    if positions is not None and positions[0] >= cfg.model.encoder_seq_length:
        # the table as saved: runs before 2026-11-26 had encoder_seq_length rows whatever their
        # hparams.yaml said (its max_position_embeddings was checked, then ignored)
        cfg.model.max_position_embeddings = positions[0]
    check_run_architecture(cfg, step_dir, hparams, overrides or (), saved[0])
    return RunCheckpoint(step_dir, hparams, cfg, tokenizer, vocab, saved[0])


def load_weights(model: nn.Module, step_dir: Path) -> None:
    """Read the model part of a DCP checkpoint into `model` (one process, no process group).
    One-line errors: CheckpointMismatchError when its tensors are not the model's, else
    CheckpointLoadError when reading fails (a damaged file the sizes did not show)."""
    state = {"model": get_model_state_dict(model)}
    try:
        metadata = compat.read_metadata(step_dir)  # once: for the check and for the load
    except (Exception, CheckpointException) as error:
        raise unreadable(step_dir, error) from None
    check_fits(step_dir, state, compat.saved_metadata(step_dir, metadata))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*process group.*")
        try:
            reader = compat.MetadataReader(step_dir, metadata)
            dcp.load(state, checkpoint_id=str(step_dir), storage_reader=reader)
        except (Exception, CheckpointException) as error:  # DCP's is a BaseException
            raise unreadable(step_dir, error) from None
    set_model_state_dict(model, state["model"])


def unreadable(step_dir: Path, error: BaseException) -> CheckpointLoadError:
    """A checkpoint that stopped loading half way: damaged, or (its COMPLETE marker gone, which
    retention unlinks first) removed by its run's retention while it was read."""
    if not is_complete(step_dir):
        return removed_while_read(step_dir)
    return CheckpointLoadError(
        f"checkpoint {step_dir} does not load ({root_cause(error)}); it may be damaged: "
        f"`gptrain checkpoint verify {shlex.quote(str(step_dir.parent))}` checks every file's CRC-32"
    )


def no_tokenizer_text(hparams: Path) -> str:
    """Why a run has no tokenizer to encode a prompt with, and how to give it one."""
    from gptrain.trained.hf.record import read_record

    source = read_record(hparams.parent).get("source")
    if source:
        return (
            f"{hparams}: imported from {source}, which has no tokenizer files, so there is no tokenizer"
            f" to encode the prompt; put the model's tokenizer.json (or vocab.json and merges.txt) in"
            f" {source} and run `gptrain import` again, or name its files in {hparams}:"
            " model.tokenizer.type=HuggingFaceTokenizer with model.tokenizer.model=<tokenizer.json> (or"
            " GPT2BPETokenizer with model.tokenizer.vocab_file and merge_file) and model.data.mock_vocab_size=null"
        )
    return f"{hparams}: the run trained on mock data without a tokenizer; nothing to decode"


def load_run(path: str | Path, device: torch.device | None = None) -> LoadedRun:
    """Model (eval mode, weights loaded) and tokenizer of the newest complete checkpoint under `path`
    that passes its CRC-32s (a changed byte in a shard's weights would load and generate unseen)."""
    from gptrain.train.builders import build_model, build_model_config

    run = open_run(path, checksums=True)
    if run.tokenizer is None:
        raise DataError(no_tokenizer_text(run.hparams))
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = generation_config(build_model_config(run.cfg, run.saved_rows))
    model = build_model(config, device, run.cfg.model.seed)
    load_weights(model, run.step_dir)
    check_finite_weights(model, run.step_dir)
    model.eval()
    return LoadedRun(model, run.tokenizer, run.vocab, run.step_dir, imported_end_ids(run))


def generation_config(config: Any) -> Any:
    """`config` with the longest context generation may use as its seq_length: for rope, the
    model's max_position_embeddings where it is above the training length (an import trains on
    samples shorter than the model's context: `gptrain import --seq-length`); a learned position
    table's rows past the training length may never have been trained, so it keeps that."""
    if config.position_embedding_type != "rope":
        return config
    return replace(config, seq_length=config.max_positions)


def check_finite_weights(model: nn.Module, step_dir: Path) -> None:
    """Refuse weights that are NaN or infinite (a run that diverged before this checkpoint): a
    greedy generation took the argmax of NaN logits and printed id 0's text over and over, and a
    sampled one stopped with torch's "probability tensor contains either inf, nan" traceback."""
    for name, weight in model.named_parameters():
        if not bool(torch.isfinite(weight).all()):
            raise DataError(
                f"{step_dir}: {name} holds {not_finite_text(weight)} weights (the run diverged before this "
                "checkpoint?); use an earlier one (pass its step_<N> directory)"
            )


def not_finite_text(tensor: torch.Tensor) -> str:
    """How many NaN and infinite values `tensor` holds, in words ("3 NaN and 1 infinite")."""
    counts = [(int(torch.isnan(tensor).sum()), "NaN"), (int(torch.isinf(tensor).sum()), "infinite")]
    return " and ".join(f"{count} {what}" for count, what in counts if count)


def imported_end_ids(run: RunCheckpoint) -> frozenset[int]:
    """The eos_token_id(s) hf_import.json keeps of an imported model (or of the import a run
    started from): a chat model's end-of-turn token (Llama 3's <|eot_id|> beside <|end_of_text|>)
    is often not the tokenizer's end-of-document token."""
    from gptrain.trained.hf.record import recorded_end_ids, run_record

    ids = recorded_end_ids(run_record(run.hparams.parent))
    return frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < run.vocab)
