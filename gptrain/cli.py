"""The `gptrain` command line.

Each command group lives in its own light module that only builds argparse
parsers; heavy libraries (torch, tokenizers) are imported inside the handlers,
so `gptrain --help` and the launcher commands start fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gptrain import __version__
from gptrain.errors import ConfigError, GptrainError, error_text, os_error_text
from gptrain.utils.limits import raise_open_file_limit
from gptrain.utils.overrides import OVERRIDE_WORD
from gptrain.utils.signals import Terminated, recording_interrupts

# Modules with a `register(subparsers)` function; each must not import torch at module level.
COMMAND_MODULES = (
    "gptrain.data.cli",
    "gptrain.train.cli",
    "gptrain.trained.cli",
    "gptrain.megatron.cli",
    "gptrain.launch.cli",
    "gptrain.validate.cli",
    "gptrain.plan.cli",
    "gptrain.checkpoint.cli",
)


class Parser(argparse.ArgumentParser):
    """argparse's parser; a command group given a word that is none of its subcommands
    (`gptrain checkpoint --sizes-only RUN`) names them as the bare group does, where argparse said
    "argument action: invalid choice: 'RUN'" (its dest). Subparsers are made of the same class."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if getattr(action, "names_its_choices", False) and value not in action.choices:
            refuse_a_group_without_its_subcommand(self, given=str(value))
        super()._check_value(action, value)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gptrain",
        description="Pretrain GPT models end to end: data, training, parallelism, Slurm launch.",
    )
    parser.add_argument("--version", action="version", version=f"gptrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for group in command_groups(parser):
        subcommands(group).required = False  # run_command names the choices, where argparse named the dest
        subcommands(group).names_its_choices = True  # and so does Parser for a word that is none of them
    return parser


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    """The parser's subcommands (`checkpoint`'s verify and rewind), or None for a leaf command."""
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def command_groups(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below `parser` that takes a subcommand (`gptrain data`, `gptrain checkpoint`)."""
    action = subcommands(parser)
    groups = []
    for child in dict.fromkeys(action.choices.values() if action else ()):  # aliases share a parser
        if subcommands(child):
            groups += [child, *command_groups(child)]
    return groups


def refuse_a_group_without_its_subcommand(group: argparse.ArgumentParser, given: str | None = None) -> None:
    """`gptrain checkpoint` alone, or before a word that is no subcommand: a usage error naming the
    subcommands, exit 2. argparse said 'the following arguments are required: action' (its dest),
    or CHECK (its metavar)."""
    choices = ",".join(subcommands(group).choices)
    instead = "" if given is None else f"; {given!r} is none of them"
    group.error(
        f"the following arguments are required: {{{choices}}} "
        f"(a subcommand{instead}; --help says what each does)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run one command; Ctrl-C anywhere (the parser's imports included) is one line and exit 130."""
    with recording_interrupts() as interrupts:
        try:
            return run_command(argv)
        except KeyboardInterrupt:
            return interrupted()
        except Exception:  # Ctrl-C inside a library's import surfaces as another error (signals.py)
            if not interrupts.seen or os.environ.get("GPTRAIN_DEBUG"):
                raise
            return interrupted()


def interrupted() -> int:
    print("gptrain: interrupted", file=sys.stderr)
    return 130


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` ran: `data prepare`'s, not the top level's."""
    while True:
        commands = subcommands(parser)
        chosen = getattr(args, commands.dest, None) if commands else None
        if chosen is None:
            return parser
        parser = commands.choices[chosen]


def refuse_empty_option_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An option given an empty value (`--json=`, `--output-dir "$DIR"` with DIR unset) is an
    error naming it: read as absent, it fell back to its default (no JSON written, reports in the
    current directory, the default cluster) and the command succeeded."""
    for action in parser._actions:
        if getattr(action, "empty_means_none", False):  # `--exclude-file ''`: read no file
            continue
        if action.option_strings and action.default != "" and getattr(args, action.dest, None) == "":
            option = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
            wanted = action.metavar or action.dest.upper()
            also = "" if action.required else f" or leave {option} out"
            raise ConfigError(f"{option}: empty value; give {wanted}{also}")


def run_command(argv: list[str] | None) -> int:
    """Parse `argv` and run its handler; the errors a user can cause become one line."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    chosen = command_parser(parser, args)
    if chosen is not parser and subcommands(chosen):  # before the extras: `checkpoint --sizes-only RUN`
        refuse_a_group_without_its_subcommand(chosen)
    if extra:  # `key=value` overrides may also follow the options (`eval RUN --json F key=value`)
        if not hasattr(args, "overrides") or not all(OVERRIDE_WORD.match(item) for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    handler = getattr(args, "func", None)
    if handler is None:
        parser.print_help()
        return 2
    raise_open_file_limit()  # a blend of hundreds of shards holds thousands of open files
    try:
        refuse_empty_option_values(chosen, args)
        return int(handler(args) or 0)
    except GptrainError as error:
        print(f"gptrain: error: {error_text(error)}", file=sys.stderr)
        return 2
    except Terminated as terminated:  # raised only where a command asked for it (data prepare, merge)
        print(f"gptrain: {terminated}", file=sys.stderr)
        return terminated.status
    except BrokenPipeError:
        return 0
    except OSError as error:  # a path the file system refuses (read-only, a directory, full): one line
        if os.environ.get("GPTRAIN_DEBUG"):
            raise
        text = (
            os_error_text(error, "")
            if error.filename
            else (str(error.strerror or error).splitlines() or [""])[0]
        )
        print(f"gptrain: error: {text} (GPTRAIN_DEBUG=1 shows where)", file=sys.stderr)
        return 2
    except MemoryError as error:  # numpy's "Unable to allocate 21.5 TiB for an array ..."
        if os.environ.get("GPTRAIN_DEBUG"):
            raise
        reason = (str(error).splitlines() or ["no detail"])[0]
        print(f"gptrain: error: out of memory ({reason}): ask for less", file=sys.stderr)
        return 2
