"""Command-line parsers for training (light: no torch at module level)."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
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
        file = config_file(args)
        if preset is not None and file is not None:  # the file would win, and the preset go unread
            raise ConfigError(f"give a preset ({preset}) or a config file ({file}), not both")
        cfg = load_training_config(preset, overrides, config_file=file)
        return train(cfg)
