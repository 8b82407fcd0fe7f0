"""A trained run's config readied to rebuild its model: tokenizer files, tokenizer and architecture checks."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptrain.checkpoint.compat import CheckpointMismatchError
from gptrain.checkpoint.integrity import recorded_architecture, recorded_tokenizer
from gptrain.errors import DataError, GptrainError
from gptrain.utils.paths import look_up, started_in
from gptrain.utils.rank import is_rank_zero


def run_started_in(cfg: Any, hparams: Path) -> Path | None:
    """The directory the run of `hparams` was started in, which its relative paths are relative to,
    where its relative explicit_log_dir tells; None where it does not (absolute, or moved)."""
    recorded = cfg.exp_manager.explicit_log_dir
    # the path as given: through a symlinked results directory the run was started above the link
    return started_in(Path(os.path.abspath(hparams)).parent, recorded) if recorded else None


def tokenizer_files_from_start(cfg: Any, hparams: Path, overrides: Sequence[str]) -> dict[str, str]:
    """hparams.yaml records model.tokenizer's files as given, relative to the directory the run was
    started in: generate, export and eval from anywhere else found none. Where that directory is
    known, relative ones are taken from there (a file given as an override is the user's, from
    here); the keys so moved, with the values hparams.yaml records."""
    started = run_started_in(cfg, hparams)
    if started is None:
        return {}
    tok, moved = cfg.model.tokenizer, {}
    for key in tokenizer_path_keys(tok, started):
        value = getattr(tok, key)
        if _overridden(f"model.tokenizer.{key}", overrides) or not _is_relative_path(value):
            continue
        if only_here(value, started):
            continue
        moved[key] = value
        setattr(tok, key, str(started / value))
    return moved


def only_here(value: str, started: Path) -> bool:
    """Whether the working directory holds `value` and the start directory does not: a run copied
    elsewhere under the same path ending (/backup/results/run) seems started at the copy's root, and
    its files are where the training ran, read from there as before (eval's data prefixes alike)."""
    return not (started / value).exists() and Path(value).exists()


def tokenizer_path_keys(tok: Any, started: Path) -> tuple[str, ...]:
    """The model.tokenizer keys whose values are paths: all three, but a TikTokenizer's model that
    names one of tiktoken's encodings (no directory or extension, no such file where the run started)."""
    from gptrain.data.tokenizer_args import canonical_type
    from gptrain.utils.tokenizer_types import names_a_file

    model = tok.model
    encoding = (
        canonical_type(str(tok.type)) == "tiktoken"
        and isinstance(model, str)
        and not names_a_file(model)
        and not (started / model).is_file()
    )
    return ("vocab_file", "merge_file") if encoding else ("vocab_file", "merge_file", "model")


def _overridden(key: str, overrides: Sequence[str]) -> bool:
    """Whether an override sets `key`, or a section holding it."""
    return any(key == given or key.startswith(f"{given}.") for given in map(override_key, overrides))


def _is_relative_path(value: Any) -> bool:
    """A path named from the working directory (~ is the home directory's)."""
    return isinstance(value, str) and bool(value) and not os.path.isabs(value) and not value.startswith("~")


def build_run_tokenizer(cfg: Any, hparams: Path, moved: dict[str, str] | None = None) -> Any | None:
    """The tokenizer the run trained with (None for mock data); the files its type reads must still
    be where hparams.yaml says (`moved`: those tokenizer_files_from_start took from where the run
    was started)."""
    from gptrain.train.tokenizer_setup import build_tokenizer, tokenizer_file_keys

    tok, moved = cfg.model.tokenizer, moved or {}
    for key in tokenizer_file_keys(cfg):
        value = getattr(tok, key)
        if not value:
            continue
        found = look_up(value)  # Path.exists raised PermissionError where it may not be looked up
        if found.kind == "unreachable":
            raise DataError(f"{hparams}: model.tokenizer.{key}={value} {found.why}")
        if found.kind == "missing" and key in moved:
            raise DataError(
                f"{hparams}: model.tokenizer.{key}={moved[key]} not found in the directory the run was "
                f"started in ({value}); restore the file"
            )
        if found.kind == "missing":
            raise DataError(
                f"{hparams}: model.tokenizer.{key}={value} not found; {_missing_file_advice(key, value)}"
            )
    return build_tokenizer(cfg)


def _missing_file_advice(key: str, value: str) -> str:
    """What to do about a tokenizer file not found: a relative path may be found from where the
    training ran; an absolute one was told that too, which no working directory changes."""
    if _is_relative_path(value):
        return "run from the directory the training ran in, or restore the file"
    return f"restore the file, or set model.tokenizer.{key} there to where it is now"


def check_run_tokenizer(
    cfg: Any, tokenizer: Any | None, step_dir: Path, hparams: Path, takes_overrides: bool = False
) -> None:
    """The tokenizer hparams.yaml now gives against the one the checkpoint records: another one
    (files replaced since training) is refused, as at resume; an extension is a warning (the model
    never trained its new ids). The refusal says what to do where the command is told it: overrides
    for eval, hparams.yaml's keys for generate and export, which take none."""
    from gptrain.train.tokenizer_setup import tokenizer_check

    check = tokenizer_check(cfg, tokenizer)
    recorded = recorded_tokenizer(step_dir)
    if check is None or recorded is None:  # mock data, or a checkpoint from before records
        return
    if takes_overrides:
        fix = (
            "restore the files it names, or name the ones the checkpoint was trained with as "
            "model.tokenizer overrides"
        )
        allow = "pass exp_manager.allow_tokenizer_change=true"
    else:
        fix = "restore the files it names, or name the ones the checkpoint was trained with there"
        allow = "set exp_manager.allow_tokenizer_change: true there"
    error, note = check.check(
        recorded, f"checkpoint {step_dir}", f"the model.tokenizer of {hparams}", fix, allow
    )
    if error is not None:
        raise DataError(error)
    if note is not None and is_rank_zero():  # `gptrain eval` under torchrun: once, not once a rank
        print(f"gptrain: warning: {note}", file=sys.stderr)


def check_run_architecture(
    cfg: Any, step_dir: Path, hparams: Path, overrides: Sequence[str], rows: int
) -> None:
    """The architecture settings the command builds (`cfg`: hparams.yaml under `overrides`) against
    those the checkpoint records (what no tensor's shape shows: rope base, norm epsilon, activation,
    heads of another width). A difference would load the weights into a model that computes something
    else, and export's verification, comparing two models built from the same settings, would pass
    it: refused, as a resume refuses it, unless overrides changed those settings on purpose (`gptrain
    eval`), which includes the settings they move in turn (more heads: narrower ones)."""
    from gptrain.checkpoint import architecture

    saved, live = recorded_architecture(step_dir), architecture_of(cfg, rows)
    given = hparams_architecture(hparams, overrides, live, rows) if overrides else live
    asked = {override_key(item) for item in overrides}
    asked |= {change.split(" ", 1)[0] for change in architecture.changes(given, live)}
    found = [change for change in architecture.changes(saved, live) if change.split(" ", 1)[0] not in asked]
    if found:
        raise CheckpointMismatchError(
            f"checkpoint {step_dir} was trained with other model settings than {hparams} gives "
            f"({'; '.join(found)}): the weights would load into a model that computes something else; "
            "set the old values there"
        )


def override_key(override: str) -> str:
    """The dotted key of `key=value`, `+key=value`, `~key`, as the training config names it."""
    return override.split("=", 1)[0].lstrip("+~").removeprefix("training.")


def hparams_architecture(
    hparams: Path, overrides: Sequence[str], live: dict[str, Any], rows: int
) -> dict[str, Any]:
    """The architecture hparams.yaml gives, read under the command's overrides but those of the
    architecture (`live`'s keys, or a section holding them): the others may be what makes it load
    (a key this gptrain no longer knows, deleted with `~key`). Where hparams.yaml's own architecture
    does not build, the overrides mend it: `live`, so only the keys they name count as asked."""

    from gptrain.checkpoint.architecture import DECIDING

    def names_architecture(override: str) -> bool:
        key = override_key(override)
        settings = [*live, *DECIDING]
        return any(setting == key or setting.startswith(f"{key}.") for setting in settings)

    kept = [override for override in overrides if not names_architecture(override)]
    try:
        return architecture_of(load_hparams(hparams, kept), rows)
    except GptrainError:
        return live


def architecture_of(cfg: Any, rows: int) -> dict[str, Any]:
    """The architecture record of the model `cfg` builds."""
    from gptrain.checkpoint import architecture
    from gptrain.train.builders import build_model_config

    return architecture.record(build_model_config(cfg, rows))


def load_hparams(hparams: Path, overrides: Sequence[str] = ()) -> Any:
    """The run's config as its hparams.yaml gives it under `overrides`."""
    from gptrain.config import load_training_config

    recorded = [*_gelu_before_fusion(hparams), *overrides]
    return load_training_config(config_file=str(hparams), overrides=recorded, report_ignored=False)


def _gelu_before_fusion(hparams: Path) -> list[str]:
    """An hparams.yaml written before model.bias_activation_fusion (on by default: the tanh GELU) records
    the GELU that ran in openai_gelu alone, or (before 2026-11-23) nothing: erf, gptrain's only GELU
    then; without the fusion it reads as that GELU. gptrain writes the key into every hparams.yaml now."""
    from gptrain.config.yamlio import load_file

    model = load_file(hparams).get("model")
    if isinstance(model, dict) and "bias_activation_fusion" not in model:
        return ["model.bias_activation_fusion=false"]
    return []
