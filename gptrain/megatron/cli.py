"""`gptrain megatron [pretrain_gpt.py flags]`: a drop-in for `python pretrain_gpt.py ...`.

Run it where pretrain_gpt.py ran (under torchrun or srun, one process per rank). The flags
are translated to gptrain keys (gptrain.megatron.translate); `--dry-run` prints the equivalent
`gptrain train` overrides and the resolved config, and exits without importing torch.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig
    from gptrain.megatron.translation import Translation

HELP = """usage: gptrain megatron [--dry-run] [pretrain_gpt.py flags ...]

Train with Megatron-LM's pretrain_gpt.py flags (e.g. --num-layers 24 --hidden-size 1024
--num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 --global-batch-size 256
--train-iters 1000 --lr 3e-4 --data-path DATA_text_document --vocab-file V --merge-file M).
Megatron's defaults apply where a flag is absent. --dry-run prints the gptrain overrides and
the resolved config and exits. docs/migrating.md lists every flag and its gptrain key.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    # prefix_chars="+": Megatron's --flags reach us untouched, as positional words
    parser = subparsers.add_parser(
        "megatron",
        help="train from Megatron-LM pretrain_gpt.py flags (--num-layers 24 ...); --dry-run shows the mapping",
        prefix_chars="+",
        add_help=False,
    )
    parser.add_argument("flags", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run_megatron)


def run_megatron(args: argparse.Namespace) -> int:
    flags = list(args.flags)
    if "--help" in flags or "-h" in flags:
        print(HELP, end="")
        return 0
    if not flags:
        refuse_no_flags()
    dry_run = "--dry-run" in flags
    flags = [f for f in flags if f != "--dry-run"]
    if dry_run:
        return megatron(flags, dry_run)
    from gptrain.train.signals import early_stops

    # as `gptrain train`: a stop signal before the run's handlers stops it (exit 75), and
    # --exit-duration-in-mins counts from here, before torch's import (signals.command_start)
    with early_stops():
        return megatron(flags, dry_run)


def refuse_no_flags() -> None:
    """No flags at all is bad usage, exit 2: printing the help with exit 0 let a batch script whose
    `$FLAGS` came out empty "succeed" without training."""
    from gptrain.errors import ConfigError

    raise ConfigError(
        "gptrain megatron got no flags (an empty $FLAGS?): pass pretrain_gpt.py's flags "
        "(--num-layers 24 ...), or --help for usage"
    )


def check_layout_ahead(cfg: TrainingConfig) -> None:
    """The layout checks the run makes at start (gptrain.parallel.layout, no torch), made by the dry
    run, before a job waits in the queue for them: on the world of torchrun's or srun's environment
    where the dry run has one, else on one data-parallel rank (a login node's dry run: the layers,
    heads and widths that must split over tensor and pipeline ranks)."""
    from gptrain.parallel.layout import check_layout

    m, devices = cfg.model, cfg.trainer.devices
    world = cfg.trainer.num_nodes * devices
    if world == 1:
        world = devices = m.tensor_model_parallel_size * m.pipeline_model_parallel_size
    check_layout(m, world, devices)


def check_data_paths(cfg: TrainingConfig, translation: Translation) -> None:
    """The blend and the prefix files as training checks them before it starts, named by the flags
    given (--data-path, --train-data-path, ...), not the model.data.data_prefix they became."""
    from gptrain.data.blend_spec import check_data_prefix
    from gptrain.errors import DataError
    from gptrain.megatron.data_paths import prefix_in_flags
    from gptrain.train.target_sizes import built_split_keys

    if cfg.model.data.is_mock():
        return
    try:
        check_data_prefix(cfg.model.data.data_prefix, splits=built_split_keys(cfg))
    except DataError as error:
        raise DataError(prefix_in_flags(str(error), translation.given)) from None


def check_megatron_checkpoints(cfg: TrainingConfig, translation: Translation) -> None:
    """A --load that is the --save directory and holds Megatron's checkpoints but no gptrain one:
    Megatron resumes from them; gptrain, which does not read them, would train from iteration 0 and
    save into that directory. Refused in one line (a --load elsewhere is refused by the checkpoint
    search at start)."""
    from pathlib import Path

    from gptrain.errors import ConfigError
    from gptrain.train.earlier_run import MEGATRON_TRACKER, earlier_checkpoints

    em = cfg.exp_manager
    if not em.resume_if_exists or em.resume_from_checkpoint or not em.explicit_log_dir:
        return
    load = translation.given.get("--load") or translation.given.get("--load-xser") or [em.explicit_log_dir]
    tracker = Path(em.explicit_log_dir) / MEGATRON_TRACKER
    if not tracker.is_file() or earlier_checkpoints(Path(em.checkpoints_dir)):
        return
    try:
        iteration = tracker.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        iteration = "?"
    raise ConfigError(
        f"--load {load[0]}: holds Megatron's checkpoints ({MEGATRON_TRACKER}: {iteration}), which gptrain "
        "does not read, and no gptrain checkpoint: the run would start from iteration 0 where Megatron "
        "resumes; give --save and --load a new directory to train from scratch"
    )


def megatron(flags: list[str], dry_run: bool) -> int:
    """The flags translated, then printed (dry run) or trained."""
    from gptrain.config import load_training_config
    from gptrain.errors import ConfigError
    from gptrain.megatron.translate import translate
    from gptrain.utils.rank import is_rank_zero

    translation = translate(flags)
    rank0 = is_rank_zero()
    if translation.notes and rank0:
        print(f"gptrain megatron: accepted without effect: {', '.join(translation.notes)}", file=sys.stderr)
    for notice in translation.notices if rank0 else ():
        print(f"gptrain megatron: note: {notice}", file=sys.stderr)
    try:
        cfg = load_training_config(None, translation.overrides, report_ignored=rank0)
        if dry_run:
            check_layout_ahead(cfg)
        check_megatron_checkpoints(cfg, translation)
    except ConfigError as error:  # the flags typed, not the gptrain keys they became
        raise ConfigError(translation.in_flags(str(error))) from None
    if dry_run:
        print("# gptrain train overrides equivalent to these flags:")
        print("\n".join(translation.overrides))
        print("# resolved config:")
        print(cfg.to_yaml(), end="")
        return 0
    check_data_paths(cfg, translation)
    from gptrain.errors import DataError
    from gptrain.megatron.data_paths import prefix_in_flags
    from gptrain.train.earlier_run import EarlierRunError
    from gptrain.train.loop import train

    try:
        return train(cfg, translation.schedule_names, process_exits=True)
    except EarlierRunError:  # worded for Megatron's flags: --load is how Megatron resumes
        raise ConfigError(
            f"{cfg.exp_manager.explicit_log_dir} holds checkpoints of an earlier run: add --load "
            f"{cfg.exp_manager.explicit_log_dir} to resume it, or --save another directory (gptrain never "
            "overwrites an earlier run's checkpoints, which Megatron does without --load)"
        ) from None
    except ConfigError as error:  # a layout the world size cannot hold, a checkpoint of another shape
        raise ConfigError(translation.in_flags(str(error))) from None
    except DataError as error:  # the data's checks at the start (NullTokenizer's ids), by its flag
        error.args = (translation.in_flags(prefix_in_flags(str(error), translation.given)),)
        raise
