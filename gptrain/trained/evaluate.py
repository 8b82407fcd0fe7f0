"""Evaluate a checkpoint under any layout: the run's model and batches, the loop's loss function.

The model, its layout and the datasets are built by the same builders as training, and the
loss by `gptrain.train.evaluation`, which the loop's validation also uses: on the run's
validation split with the run's settings the result is the training's validation loss.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gptrain.checkpoint.directory import CheckpointLoadError
from gptrain.checkpoint.errors import CheckpointDamagedError
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError, DataError
from gptrain.parallel.layout import STARTED, check_layout
from gptrain.parallel.mesh import World, init_distributed, shutdown, world_from_env
from gptrain.parallel.state_dict import load_model_state_dict, model_state_dict
from gptrain.train import builders as b
from gptrain.train.evaluation import EvalResult, EvalSetup, evaluate_loss
from gptrain.train.state import TrainState, saved_values
from gptrain.train.target_sizes import built_split_keys
from gptrain.train.tokenizer_setup import padded_vocab_size
from gptrain.trained.coverage import Coverage, coverage
from gptrain.trained.load import RunCheckpoint, is_step_dir, older_checkpoint, open_run
from gptrain.trained.run_config import override_key, run_started_in
from gptrain.utils.atomic import atomic_write_text
from gptrain.utils.rank import is_rank_zero

# One process evaluates with the whole model whatever layout trained it (as generate and export
# do); the user's own layout overrides come after these and win.
ONE_PROCESS = [
    "model.tensor_model_parallel_size=1",
    "model.pipeline_model_parallel_size=1",
    "model.virtual_pipeline_model_parallel_size=null",
    "model.num_layers_in_first_pipeline_stage=null",  # an uneven split needs the stages it splits
    "model.num_layers_in_last_pipeline_stage=null",
    "model.sequence_parallel=false",
]


@dataclass
class EvalRequest:
    checkpoint: str
    split: str = "validation"  # validation | test | train
    data_prefix: list[str] | None = None
    batches: int | None = None
    json_path: str | None = None
    overrides: list[str] = field(default_factory=list)


def evaluate_checkpoint(request: EvalRequest) -> EvalResult:
    """Load, evaluate, print the result line (and write the JSON) on the logging rank."""
    world = world_from_env()
    overrides = request.overrides if world.world_size > 1 else [*ONE_PROCESS, *request.overrides]
    run = open_run(request.checkpoint, overrides)
    cfg = run.cfg
    check_layout(cfg.model, world.world_size, cfg.trainer.devices, STARTED)  # before any rendezvous
    if world.world_size > 1:
        init_distributed(world, cfg.trainer.resolved_accelerator())
    failed = True
    try:
        run = rank_0s_checkpoint(run, overrides, world)
        device = b.select_device(cfg, world)
        run, model, iteration = load_sound_checkpoint(run, request, overrides, world, device)
        cfg, step_dir = run.cfg, run.step_dir
        dp_rank, dp_size = b.data_parallel_rank_size(cfg, world)
        setup = eval_setup(cfg, model, device, dp_rank, dp_size)
        data, batches, source = eval_data(cfg, request, run.vocab, run.tokenizer, run.hparams)
        result = evaluate_loss(setup, data, batches)
        if b.is_logging_rank(cfg, world):
            read = coverage(data.samples, result.batches * cfg.model.global_batch_size)
            report(result, step_dir, iteration, source, request.json_path, cfg, read)
        failed = False
        return result
    finally:
        if world.world_size > 1:
            shutdown(wait_for_peers=not failed)


def load_sound_checkpoint(
    run: RunCheckpoint, request: EvalRequest, overrides: list[str], world: World, device: torch.device
) -> tuple[RunCheckpoint, torch.nn.Module, int]:
    """(the checkpoint, its model, its iteration). A run's newest checkpoint whose CRC-32s fail (a
    changed byte the sizes did not show) is passed over for the one before, saying so, as generate,
    export and a resume pass over it; a step directory given is refused."""
    passed_over: list[str] = []
    while True:
        try:
            model, iteration = build_and_load(run, world, device)
            break
        except CheckpointDamagedError as error:
            if is_step_dir(request.checkpoint):
                raise
            passed_over.append(f"{run.step_dir.name} ({error.problem})")
            older = older_checkpoint(run.step_dir)
            if older is None:
                raise CheckpointLoadError(
                    f"{run.step_dir.parent}: every complete checkpoint is damaged (newest: {passed_over[0]}); "
                    "`gptrain checkpoint verify` lists them"
                ) from None
            run = rank_0s_checkpoint(open_run(older, overrides), overrides, world)
    if passed_over and world.rank == 0:
        print(
            f"gptrain: warning: using {run.step_dir.name}, the newest checkpoint that verifies; damaged: "
            f"{', '.join(passed_over)}",
            file=sys.stderr,
        )
    return run, model, iteration


def rank_0s_checkpoint(run: RunCheckpoint, overrides: list[str], world: World) -> RunCheckpoint:
    """The checkpoint rank 0 found, on every rank. Each rank lists the run's checkpoints itself,
    and a node's stale view of a run still saving lacks its newest: ranks evaluating different
    checkpoints would mix two models' losses, silently."""
    if world.world_size == 1:
        return run
    import torch.distributed as dist

    chosen: list[Any] = [str(run.step_dir)]
    dist.broadcast_object_list(chosen, src=0)
    return run if Path(chosen[0]) == run.step_dir else open_run(chosen[0], overrides)


def build_and_load(run: RunCheckpoint, world: World, device: torch.device) -> tuple[torch.nn.Module, int]:
    """The run's model under this layout, with the checkpoint's weights, and the saved iteration."""
    cfg = run.cfg
    b.seed_everything(cfg.model.seed)
    model = b.build_parallel_model(b.build_model_config(cfg, vocabulary_rows(run)), cfg, world, device)
    return model, load_model(model, run.step_dir, world)


def vocabulary_rows(run: RunCheckpoint) -> int:
    """The checkpoint's own padded vocabulary when this layout can shard it, else Megatron's.

    Padding rows take part in the softmax; rows a checkpoint never had would change the loss,
    so evaluating under another TP keeps the saved rows (any multiple of TP shards evenly).
    """
    if run.saved_rows % run.cfg.model.tensor_model_parallel_size == 0:
        return run.saved_rows
    return padded_vocab_size(run.cfg, run.tokenizer)[1]


def load_model(model: torch.nn.Module, step_dir: Path, world: World) -> int:
    """Read the model weights (any saved layout, resharded by DCP) and return the saved iteration."""
    train = TrainState()

    def state(saved) -> dict[str, Any]:  # a counter a checkpoint predates (validated_at) keeps its default
        return {"model": model_state_dict(model), "train": saved_values("train", train.state_dict(), saved)}

    def apply(loaded: dict[str, Any]) -> None:
        load_model_state_dict(model, loaded["model"])
        if "train" in loaded:  # an import holds model weights only
            train.load_state_dict(loaded["train"])

    manager = CheckpointManager(step_dir.parent, None, rank=world.rank)
    manager.load_verified(step_dir, state, apply)  # its CRC-32s, read once between the ranks
    return train.step


def eval_setup(cfg: TrainingConfig, model: torch.nn.Module, device: torch.device, dp_rank: int, dp_size: int):
    b.check_batch_sizes(cfg, dp_size)
    m = cfg.model
    opts = b.with_parallel_seams(b.build_step_options(cfg, dp_size), model)
    return EvalSetup(
        model=model,
        step_opts=opts,
        device=device,
        micro_batch_size=m.micro_batch_size,
        num_microbatches=m.global_batch_size // (m.micro_batch_size * dp_size),
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=m.seed,
    )


def eval_data(
    cfg: TrainingConfig, request: EvalRequest, vocab: int, tokenizer: Any, hparams: Path | None = None
) -> tuple[Any, int, str]:
    """(dataset, global batches, description): a split of the run's data (relative prefixes of the
    run's `hparams` from where it was started), or --data-prefix."""
    if request.batches is not None and request.batches < 1:
        raise ConfigError(f"--batches must be at least 1, got {request.batches}")
    if request.data_prefix:
        return prefix_data(cfg, request, vocab, tokenizer)
    recorded = cfg.model.data.data_prefix  # its numbers, before relative prefixes are made paths
    not_found_note = prefixes_from_start(cfg, hparams, request.overrides) if hparams else None
    t = cfg.trainer
    default = {"validation": t.limit_val_batches, "test": t.limit_test_batches, "train": t.limit_val_batches}
    batches = request.batches or default[request.split]
    asked_by = _asked_by(cfg, request)  # before --batches raises a limit
    grown = _split_grown_for(request, cfg)
    if grown is not None:
        setattr(t, grown, request.batches)
    if batches < 1:
        key = "limit_test_batches" if request.split == "test" else "limit_val_batches"
        raise ConfigError(f"the run has trainer.{key}=0 (no {request.split} batches); pass --batches N")
    if not_found_note is not None:
        check_relative_prefixes(cfg, not_found_note)
    check_run_data_files(cfg, recorded)
    train, valid, test = b.build_datasets(cfg, vocab, tokenizer, asked_by=asked_by)
    data = {"train": train, "validation": valid, "test": test}[request.split]
    if data is None or len(data) == 0:
        per_split = isinstance(cfg.model.data.data_prefix, Mapping)
        why = (
            "its per-split model.data.data_prefix has no entry for it"
            if per_split
            else f"model.data.splits_string={cfg.model.data.splits_string}"
        )
        raise ConfigError(
            f"the run's data has no {request.split} split ({why}); choose another --split or give --data-prefix"
        )
    source = f"{request.split} split of the run's data"
    if request.batches is not None:
        _check_split_holds(request.batches, len(data), cfg.model.global_batch_size, source)
    elif request.split == "train":
        batches = _train_batches_held(batches, len(data), cfg.model.global_batch_size, source)
    return data, batches, f"{request.split} split of the run's {run_data_words(cfg)}"


def run_data_words(cfg: TrainingConfig) -> str:
    """What the run's data is, in the result line: an import without tokenizer files (or a smoke
    run) has mock data, random tokens, whose loss read as the model's loss on the run's data."""
    return (
        "mock data (random tokens; --data-prefix evaluates on real text)" if b.is_mock_data(cfg) else "data"
    )


NOT_FOUND_NOTE = "relative to the directory the run was started in; run from there or pass --data-prefix"


def prefixes_from_start(cfg: TrainingConfig, hparams: Path, overrides: Sequence[str]) -> str | None:
    """hparams.yaml records model.data.data_prefix as given, relative to the directory the run was
    started in: `gptrain eval RUN` from anywhere else found none ("check the path"). Where the run's
    relative explicit_log_dir tells that directory, its relative prefixes are taken from there; else
    the note for a prefix not found. A data_prefix given as an override is the user's, from here."""
    if b.is_mock_data(cfg) or any(
        override_key(item).startswith("model.data.data_prefix") for item in overrides
    ):
        return None
    started = run_started_in(cfg, hparams)
    if started is None:
        return NOT_FOUND_NOTE
    cfg.model.data.data_prefix = _prefixes_under(cfg.model.data.data_prefix, started)
    return None


def _prefixes_under(spec: Any, directory: Path) -> Any:
    """A data_prefix (one prefix, [weight, prefix, ...], or per split) with its relative prefixes
    under `directory`; one that does not parse is left for the builder to refuse."""
    from gptrain.data.blend_spec import with_prefixes

    return with_prefixes(
        spec, lambda prefix: _under_start(prefix, directory) if _is_relative(prefix) else prefix
    )


def _under_start(prefix: str, started: Path) -> str:
    """`prefix` read from the directory the run was started in; from the working directory where
    only it holds the pair (a run copied elsewhere under the same path ending, as eval read it
    before it knew where runs start)."""
    from gptrain.data.pair_check import pair_problem

    under = str(started / prefix)
    return prefix if pair_problem(under) is not None and pair_problem(prefix) is None else under


def _is_relative(prefix: str) -> bool:
    """A prefix named from the working directory (~ and a leading $VAR, which no shell expanded,
    are refused with their own hints, which name the path meant)."""
    return not os.path.isabs(prefix) and not prefix.startswith(("~", "$"))


def check_relative_prefixes(cfg: TrainingConfig, note: str) -> None:
    """A relative prefix of the splits the build reads that names no pair, with `note` (where the
    run was started is not recorded) after the line the builder would give."""
    from gptrain.data.blend_spec import prefixes_of, yaml_number_note
    from gptrain.data.pair_check import pair_problem

    spec = cfg.model.data.data_prefix
    for prefix in filter(_is_relative, prefixes_of(spec, _built_splits(cfg))):
        if (problem := pair_problem(prefix)) is not None:
            raise DataError(
                f"model.data.data_prefix {prefix}: {problem}{yaml_number_note(spec, prefix)}; {note}"
            )


def _built_splits(cfg: TrainingConfig) -> list[str]:
    """The per-split data_prefix keys the build reads: the builder skips a split of no samples
    (the test split under trainer.limit_test_batches=0)."""
    return built_split_keys(cfg)


def _split_grown_for(request: EvalRequest, cfg: TrainingConfig) -> str | None:
    """The trainer key (limit_val_batches, limit_test_batches) that --batches must raise for the split
    it evaluates to hold its batches; None when the run's own split holds them, and is kept.

    Raised only then: the split's size sets its sample order (Megatron's shuffle spans its epochs),
    so a validation split rebuilt for --batches 1 read other samples than the training validated."""
    index = {"validation": 1, "test": 2}.get(request.split)
    if index is None or request.batches is None:
        return None
    if request.batches * cfg.model.global_batch_size <= b.dataset_target_sizes(cfg)[index]:
        return None
    return ("limit_val_batches", "limit_test_batches")[index - 1]


def check_run_data_files(cfg: TrainingConfig, recorded: Any = None) -> None:
    """Each .bin/.idx pair of the splits the build reads, with eval's other way: an imported run's
    hparams.yaml names its preset's placeholder data, and the builder's line said only to prepare
    that. A split not built (test under limit_test_batches=0) may name data long gone. `recorded`:
    the data_prefix hparams.yaml gives, before its relative prefixes were taken from elsewhere."""
    from gptrain.data.blend_spec import prefixes_of, yaml_number_note
    from gptrain.data.pair_check import pair_problem

    data = cfg.model.data
    if data.is_mock():
        return
    for prefix in prefixes_of(data.data_prefix, _built_splits(cfg)):
        if (problem := pair_problem(prefix)) is not None:
            note = yaml_number_note(data.data_prefix if recorded is None else recorded, prefix)
            raise DataError(
                f"the run's model.data.data_prefix: {problem}{note}; or evaluate on another dataset with "
                "--data-prefix PREFIX"
            )


def _asked_by(cfg: TrainingConfig, request: EvalRequest) -> list[str]:
    """What sized each split, for an error about its size: --batches, where it raised
    trainer.limit_val_batches or limit_test_batches, sizes the split it evaluates; the train split
    is built as the run built it."""
    keys = list(b.split_sizes_asked_by(cfg))
    grown = _split_grown_for(request, cfg)
    if grown == "limit_val_batches":
        keys[1] = keys[1].replace("trainer.limit_val_batches", "--batches")
    if grown == "limit_test_batches":
        keys[2] = keys[2].replace("trainer.limit_test_batches", "--batches")
    return keys


def _train_batches_held(batches: int, samples: int, global_batch: int, source: str) -> int:
    """The train split's default count (trainer.limit_val_batches), cut to the batches it holds and
    said: past them the loop stopped early and reported the shorter loss as the asked one."""
    held = samples // global_batch
    if held == 0:
        raise ConfigError(
            f"the {source} holds {samples} samples, less than one global batch of {global_batch}; "
            "evaluate another split or --data-prefix"
        )
    if held < batches:
        print(
            f"gptrain: note: the {source} holds {held} global batches of {global_batch}, fewer than the "
            f"default {batches} (trainer.limit_val_batches): evaluating {held}",
            file=sys.stderr,
        )
    return min(batches, held)


def _check_split_holds(batches: int, samples: int, global_batch: int, source: str) -> None:
    """The train split holds the samples the training read (validation and test are sized by
    --batches): the loop stops where it ends, so more batches than it holds evaluated fewer, said
    only in the count."""
    held = samples // global_batch
    if batches > held:
        fewer = f"pass --batches {held} or fewer" if held else "evaluate another split or --data-prefix"
        raise ConfigError(
            f"--batches {batches}: the {source} holds {samples} samples, {held} global batches of "
            f"{global_batch}; {fewer}"
        )


def prefix_data(
    cfg: TrainingConfig, request: EvalRequest, vocab: int, tokenizer: Any
) -> tuple[Any, int, str]:
    """All of the given indexed dataset(s) as one split, one pass over their samples by default."""
    from gptrain.data.builder import build_gpt_datasets, parse_blend
    from gptrain.data.indexed import IndexedDataset
    from gptrain.train.batches import GPTBatchDataset

    entries = request.data_prefix or []
    prefix: str | list[str] = entries[0] if len(entries) == 1 else list(entries)
    prefixes, _ = parse_blend(prefix)
    b.check_data_tokenizer(cfg, prefixes, "--data-prefix", tokenizer)  # as training checks its data_prefix
    b.check_token_ids(cfg, tokenizer, prefixes, "--data-prefix")
    m = cfg.model
    tokens = {p: IndexedDataset(p).num_tokens for p in prefixes}
    for p, count in tokens.items():  # else build_gpt_indices asks for a split string, which is not ours
        if count < 2:
            raise DataError(
                f"--data-prefix {p}: holds {count} token(s); evaluation needs at least 2 (an input and"
                " the token after it): give a dataset with text in it"
            )
    batches = request.batches
    if batches is None:
        samples = sum((count - 1) // m.data.seq_length for count in tokens.values())
        batches = max(1, samples // m.global_batch_size)
        if (left_out := samples - batches * m.global_batch_size) > 0 and is_rank_zero():  # once, not a rank
            print(left_out_note(" ".join(entries), samples, left_out, batches, cfg), file=sys.stderr)
    _, valid, _ = build_gpt_datasets(
        prefix,
        "0,100,0",
        m.data.seq_length,
        m.seed,
        (0, batches * m.global_batch_size, 0),
        cache_dir=m.data.index_mapping_dir,
        vocab_size=vocab,
        skip_unused=True,
        asked_by=("--batches",) * 3,
        surplus=m.data.mid_level_dataset_surplus,
    )
    eod = b.batch_eod(tokenizer, m.data.eod_mask_loss)
    rows = padded_vocab_size(cfg, tokenizer)[1]
    source = f"--data-prefix {' '.join(entries)}"
    pad = b.batch_pad(tokenizer, m.data.allow_ambiguous_pad_tokens)
    null_vocab = b.null_vocab(tokenizer)
    dataset = GPTBatchDataset(valid, eod, m.data.eod_mask_loss, rows, source, pad, null_vocab)
    return dataset, batches, " ".join(entries)


def left_out_note(source: str, samples: int, left_out: int, batches: int, cfg: TrainingConfig) -> str:
    """One pass reads whole global batches: the samples past the last one were left out of the loss
    in silence, which then was not the loss of the whole dataset."""
    m = cfg.model
    return (
        f"gptrain: note: --data-prefix {source}: holds {samples} samples of {m.data.seq_length} tokens; "
        f"{batches} global batches of {m.global_batch_size} read {samples - left_out}, and the last "
        f"{left_out} (less than a global batch) are not evaluated; a model.global_batch_size that "
        f"divides {samples} evaluates them all"
    )


def report(
    result: EvalResult,
    step_dir: Path,
    iteration: int,
    source: str,
    json_path: str | None,
    cfg: TrainingConfig,
    read: Coverage | None = None,
) -> None:
    if read is not None and read.distinct_tokens < read.read_tokens:
        print(repeats_warning(read, result.batches, source), file=sys.stderr)
    print(
        f"eval {step_dir} (iteration {iteration}) on {source}: lm loss {result.loss:.6E} | "
        f"PPL {result.perplexity:.6E} | {result.tokens:,} tokens in {result.batches} batches of "
        f"{cfg.model.global_batch_size} x {cfg.model.data.seq_length}"
    )
    if json_path:
        record = {
            "checkpoint": str(step_dir),
            "iteration": iteration,
            "data": source,
            **dataclasses.asdict(result),
            "perplexity": result.perplexity,
            "global_batch_size": cfg.model.global_batch_size,
            "seq_length": cfg.model.data.seq_length,
            # tokens counts a token each time a batch reads it; these say how much data that was
            "data_tokens": read.data_tokens if read else None,
            "distinct_tokens": read.distinct_tokens if read else None,
        }
        atomic_write_text(json_path, json.dumps(strict_json(record), indent=2, allow_nan=False) + "\n")
        print(f"wrote {json_path}", file=sys.stderr)


def strict_json(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with null for a NaN or infinite number: json.dumps wrote NaN and Infinity (a diverged
    checkpoint's loss), which are not JSON, and jq or a JavaScript dashboard refused the file."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in record.items()
    }


def repeats_warning(read: Coverage, batches: int, source: str) -> str:
    """One line: the batches read some tokens more than once (the split is built over several epochs,
    as for the training's validation, and Megatron's evaluation wraps around the same way). Fewer
    tokens than the data holds can repeat too (a blend's small dataset read past its end while a large
    one is not read through): "read them 0.82 times over" said otherwise."""
    times = read.read_tokens / max(read.data_tokens, 1)
    if times >= 1:
        how = f"them {times:.2f} times over ({read.read_tokens:,} tokens, {read.distinct_tokens:,} distinct)"
    else:
        how = (
            f"{read.read_tokens:,} of them, yet only {read.distinct_tokens:,} distinct (a blend's smaller "
            "dataset, or a split shuffled over several epochs, repeats before all is read)"
        )
    return (
        f"gptrain: warning: {source}: {read.data_tokens:,} tokens; {batches} batches read {how}: the loss "
        "counts the repeated tokens again"
    )
