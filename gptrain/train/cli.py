"""Command-line parsers for training (light: no torch at module level)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gptrain.errors import ConfigError
from gptrain.utils.overrides import split_preset


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `train`."""
    parser = subparsers.add_parser(
        "train",
        help="train a GPT in this process (or in each process started by torchrun/srun)",
        description=(
            "Train a GPT from a NeMo-launcher style preset (e.g. gpt3/126m) or a training YAML, "
            "with key=value overrides (trainer.max_steps=100 model.optim.lr=3e-4). Exits 0 at "
            "trainer.max_steps; 75 after checkpointing on SIGTERM/SIGUSR1 or trainer.max_time; 76 when "
            "the hang watchdog ends a stuck step (a Slurm job requeues itself on 75 and 76); 2 on a "
            "one-line error (bad config, data, a refused run lock)."
        ),
    )
    parser.add_argument("preset", nargs="?", default=None, help="training preset such as gpt3/126m")
    parser.add_argument("--config-file", default=None, help="a full training YAML instead of a preset")
    parser.add_argument(
        "--config-path", "-cp", default=None, help="NeMo spelling: the directory of --config-name's YAML"
    )
    parser.add_argument(
        "--config-name", "-cn", default=None, help="NeMo spelling: the training YAML's name in --config-path"
    )
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="dotted config overrides"
    )
    parser.set_defaults(func=run_train)


def config_file(args: argparse.Namespace) -> str | None:
    """--config-file, or NeMo's --config-path DIR --config-name NAME (NAME with or without .yaml)."""
    if args.config_name is None:
        if args.config_path is not None:
            raise ConfigError("--config-path needs --config-name (the training YAML in that directory)")
        return args.config_file
    if args.config_file is not None:
        raise ConfigError("give --config-file, or --config-path with --config-name, not both")
    name = args.config_name if args.config_name.endswith((".yaml", ".yml")) else f"{args.config_name}.yaml"
    return str(Path(args.config_path or ".") / name)


def run_train(args: argparse.Namespace) -> int:
    from gptrain.train.signals import early_stops

    with early_stops():  # before torch's import: a stop signal from here on stops the run, not kills it
        from gptrain.config import load_training_config
        from gptrain.train.loop import train

        preset, overrides = split_preset(args.preset, list(args.overrides))
        check_no_group_choice(overrides)
        file = config_file(args)
        if preset is not None and file is not None:  # the file would win, and the preset go unread
            raise ConfigError(f"give a preset ({preset}) or a config file ({file}), not both")
        cfg = load_training_config(preset, overrides, config_file=file)
        if file is not None:
            check_moved_run(Path(file), cfg, overrides)
        return train(cfg, process_exits=True)


def check_no_group_choice(overrides: list[str]) -> None:
    """`training=gpt3/126m` copied from a launch command line said "unknown key 'training'": name
    the preset as gptrain train takes it."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.strip() == "training":
            raise ConfigError(
                f"override '{item}' chooses the launcher's training group; gptrain train takes the "
                f"preset as its first word: gptrain train {value.strip()}"
            )


# The spellings of the checkpoint to start from (gptrain.config.normalize).
START_FROM = {
    "exp_manager.resume_from_checkpoint",
    "model.resume_from_checkpoint",
    "model.restore_from_ckpt",
}


def check_moved_run(file: Path, cfg: Any, overrides: list[str]) -> None:
    """A run's hparams.yaml (a training's, or `gptrain import`'s) names its run directory as
    exp_manager.explicit_log_dir. Moved or copied elsewhere, the file still names the old place,
    where the run would start from scratch (random weights, the old tokenizer paths) while the
    checkpoints it was meant to continue sit beside the file: refused, saying what to add."""
    from gptrain.checkpoint.integrity import complete_steps
    from gptrain.utils.overrides import split_override
    from gptrain.utils.paths import started_in

    em = cfg.exp_manager
    keys = {split_override(item, "key=value").key for item in overrides}
    if "exp_manager.explicit_log_dir" in keys or keys & START_FROM or not em.resume_if_exists:
        return  # a checkpoint to start from given now is a choice; one the file records is not
    here, named = file.resolve().parent, Path(em.explicit_log_dir).resolve()
    beside = complete_steps(here / "checkpoints")
    if named == here or not beside or complete_steps(Path(em.checkpoints_dir)):
        return
    moved = [f"exp_manager.explicit_log_dir={here}"]
    tok = cfg.model.tokenizer
    for key in ("model", "vocab_file", "merge_file"):  # the run's own tokenizer files moved with it
        value = getattr(tok, key)
        if value and Path(value).resolve().is_relative_to(named):
            moved.append(f"model.tokenizer.{key}={here / Path(value).resolve().relative_to(named)}")
    started = started_in(here, em.explicit_log_dir)
    if started is not None:  # not moved: run from another directory than the one it was started in
        raise ConfigError(
            f"{file}: exp_manager.explicit_log_dir is {em.explicit_log_dir}, relative to the directory the "
            f"run was started in ({started}); from here it names {named}, which has no checkpoints: "
            f"training would start from scratch there; run from {started} to continue the run (its other "
            f"relative paths are {started}'s too), or add {' '.join(moved)}"
        )
    raise ConfigError(
        f"{file}: exp_manager.explicit_log_dir is {named}, not the directory the file is in, which holds "
        f"checkpoints (step_{beside[-1]}) while {named} has none: training would start from scratch "
        f"there; the run directory was moved or copied: add {' '.join(moved)} to continue it, or set "
        "exp_manager.explicit_log_dir to start a new run"
    )
