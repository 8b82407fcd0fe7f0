"""Where a run writes and reads: --save, --load, save intervals, --tensorboard-dir, --wandb-*, and
the checks Megatron makes of its logging intervals."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gptrain.errors import ConfigError
from gptrain.megatron.flag_parsing import convert_value

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


# Megatron's two names for the interval between its (persistent) checkpoints.
SAVE_INTERVAL_FLAGS = ("--save-interval", "--persistent-save-interval")


def no_periodic_saves(result: Translation) -> None:
    """A save interval of 0 is no periodic saves in Megatron (it saves when the interval is truthy):
    gptrain's interval of the whole run, which saves at the end (and on --exit-duration-in-mins and
    SIGTERM/SIGUSR1), as without the flag. Megatron since July 2025 asserts an interval above 0 beside
    --save, and before it failed at the end (`iteration % 0`) without saving: said in a note."""
    v, given = result.values, result.given
    key = "exp_manager.checkpoint_callback_params.every_n_train_steps"
    flag = next((flag for flag in reversed(given) if flag in SAVE_INTERVAL_FLAGS), None)
    if flag is None or v[key] != 0:
        return
    v[key] = v["trainer.max_steps"]
    if _directory(given, "--save"):
        result.notes.append(
            f"{flag} 0 (no periodic saves: a checkpoint at the end, on --exit-duration-in-mins and on "
            "SIGTERM/SIGUSR1 only; Megatron since July 2025 refuses 0 beside --save, and before it stopped at "
            "the end on a division by zero without saving)"
        )


def save_needs_interval(given: dict[str, list[str]]) -> None:
    """Megatron asserts a save interval beside --save (it has since v1.0, April 2020): a script
    without one does not start there, so it is refused here rather than run with a save at the end
    only. The Neuron fork's --save-xser is not what that assertion reads."""
    if "--save" in given and not set(SAVE_INTERVAL_FLAGS) & given.keys():
        raise ConfigError(
            "--save without --save-interval: Megatron refuses it (it asserts a save interval); give "
            "--save-interval N, a checkpoint every N iterations (N of --train-iters: at the end only)"
        )


def output_directories(result: Translation) -> None:
    """--save is the run directory (checkpoints in <save>/checkpoints). A --load that differs from it
    is where the run starts from until it has a checkpoint of its own; then a restart resumes that.
    A --load without --save is only read, as Megatron reads it: the run starts from it every time
    and its logs go to the run directory of a run without --save, not into the loaded run's (nor
    into a --tensorboard-dir that is the loaded run). --tensorboard-dir is where the TensorBoard
    events go."""
    v, given = result.values, result.given
    save = _directory(given, "--save")
    load = _directory(given, "--load")
    board = (given.get("--tensorboard-dir") or [None])[0]
    run_dir = save or (board if not (board and load and _holds(board, load)) else None)
    if run_dir:
        v["exp_manager.explicit_log_dir"] = run_dir
    v["exp_manager.resume_if_exists"] = bool(save and load)
    if not save:  # Megatron saves only under --save
        v["exp_manager.create_checkpoint_callback"] = False
        written = f"; {load} is read, not written" if load else ""
        result.notes.append(f"no --save (no checkpoints are written, as in Megatron{written})")
    elsewhere = bool(load and not (save and os.path.abspath(save) == os.path.abspath(load)))
    if elsewhere:
        v["exp_manager.resume_from_checkpoint"] = load
    for flag in ("--finetune", "--no-load-optim", "--no-load-rng"):
        if flag in given and not elsewhere:
            result.notes.append(f"{flag} (applies to a --load that differs from --save)")
    if board:  # Megatron's writer puts its events there, and nothing else
        v["exp_manager.tensorboard_dir"] = board


def _holds(board: str, load: str) -> bool:
    """Whether `load` is the run directory `board` or a directory inside it (its checkpoints/, a
    step_N), however spelled (relative, trailing slash, through a symlink)."""
    return Path(os.path.realpath(load)).is_relative_to(os.path.realpath(board))


def _directory(given: dict[str, list[str]], flag: str) -> str | None:
    """--save / --load, or where they are absent the Neuron fork's --save-xser / --load-xser (the
    Trainium tutorial's), the same directory written or read one rank at a time."""
    return (given.get(flag) or given.get(f"{flag}-xser") or [None])[0]


# The --wandb-* flags Megatron reads only beside a --wandb-project: flag -> wandb_logger_kwargs key.
WANDB_RUN_FLAGS = {"--wandb-exp-name": "name", "--wandb-entity": "entity"}


def wandb_flags(result: Translation) -> None:
    """Megatron logs to W&B when --wandb-project is not empty, its files in --wandb-save-dir or <save>/wandb."""
    v, given = result.values, result.given
    project = (given.get("--wandb-project") or [""])[0]
    if not project:
        result.notes.extend(
            f"{flag} (without --wandb-project)"
            for flag in given
            if flag in (*WANDB_RUN_FLAGS, "--wandb-save-dir")
        )
        return
    v["exp_manager.create_wandb_logger"] = True
    v["exp_manager.wandb_logger_kwargs.project"] = project
    for flag, key in WANDB_RUN_FLAGS.items():
        if given.get(flag, [""])[0]:  # Megatron passes an empty entity on as none
            v[f"exp_manager.wandb_logger_kwargs.{key}"] = given[flag][0]
    if "--wandb-save-dir" in given:
        v["exp_manager.wandb_logger_kwargs.save_dir"] = given["--wandb-save-dir"][0]
    elif "exp_manager.explicit_log_dir" in v:
        v["exp_manager.wandb_logger_kwargs.save_dir"] = os.path.join(
            v["exp_manager.explicit_log_dir"], "wandb"
        )


def memory_interval(result: Translation) -> None:
    """Megatron asserts --log-memory-interval is a multiple of --log-interval (its report comes with a
    line); gptrain refuses the others too."""
    given = result.given
    if "--log-memory-interval" not in given:
        return
    text = given["--log-memory-interval"][0]
    interval = convert_value("--log-memory-interval", text, int)
    log_interval = result.values["trainer.log_every_n_steps"]
    if log_interval and interval % log_interval:  # an interval of 0 is refused by its own check
        raise ConfigError(
            f"--log-memory-interval {text}: must be a multiple of --log-interval ({log_interval}), as Megatron asserts"
        )
