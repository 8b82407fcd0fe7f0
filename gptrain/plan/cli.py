"""The `gptrain plan` command (light: torch is imported only by the trials of --measure)."""

from __future__ import annotations

import argparse
import sys

from gptrain.errors import ConfigError
from gptrain.launch.key_types import slurm_time
from gptrain.utils.overrides import split_preset

DEFAULT_MFU = 0.4
DEFAULT_TOKENS = 300e9


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="parameters, memory per GPU and step time of every parallel layout; the best ones",
        description=(
            "Plan a training run: parameters per (tensor, pipeline) rank as Megatron prints them, "
            "FLOPs, memory per GPU (weights, gradients, optimizer, activations, logits) and step time "
            "of the layout the overrides ask for, then every valid layout that fits, fastest first. "
            "--measure runs a few steps of the best ones with mock data and re-ranks them by what they "
            "measure. Formulas and sources: docs/planning.md."
        ),
    )
    add_options(parser)
    # Options may follow the overrides (`plan gpt3/126m model.x=1 --top 3`): the words after the
    # first positional are parsed again by `parse_words`, which allows them intermixed.
    parser.add_argument(
        "words",
        nargs=argparse.REMAINDER,
        metavar="PRESET [key=value ...]",
        help="preset (default gpt3/126m, or --config-file), then dotted overrides",
    )
    parser.set_defaults(func=run_plan)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", default=None, help="a full training YAML instead of a preset")
    parser.add_argument("--nodes", type=int, default=None, help="default: trainer.num_nodes")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="default: trainer.devices, at most the cluster profile's (gpus_per_node, else its gres)",
    )
    parser.add_argument(
        "--gpu",
        default=None,
        help="h100-80gb, h200-141gb, b200-180gb, a100-80gb, a100-40gb or cpu (default: cpu where "
        "trainer.accelerator=cpu, else the cluster profile's, or h100-80gb)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        help="cluster profile for defaults: a bundled NAME (configs/cluster/NAME.yaml) or a cluster file, .yaml optional",
    )
    parser.add_argument(
        "--mfu", type=float, default=DEFAULT_MFU, help="model FLOPs utilisation assumed (default %(default)s)"
    )
    parser.add_argument(
        "--tokens",
        type=float,
        default=DEFAULT_TOKENS,
        help="token budget for the days estimate (default %(default)g)",
    )
    parser.add_argument(
        "--headroom", type=float, default=0.1, help="fraction of GPU memory kept free (default %(default)s)"
    )
    parser.add_argument("--vocab-size", type=int, default=None, help="unpadded vocabulary, if not known")
    parser.add_argument(
        "--top", type=int, default=5, help="candidates to show and to measure (default %(default)s)"
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="write the plan as JSON")
    parser.add_argument("--measure", action="store_true", help="run short trials of the top candidates")
    parser.add_argument(
        "--steps", type=int, default=4, help="training steps per trial (--measure; default %(default)s)"
    )
    parser.add_argument(
        "--output", default=None, metavar="FILE", help="winning config (--measure); default plan-best.yaml"
    )
    parser.add_argument(
        "--cluster-type",
        default="local",
        choices=["local", "slurm"],
        help="--measure: run the trials here under torchrun (one node), or as Slurm jobs rendered "
        "by the launcher (any --nodes; Slurm settings from --cluster's profile); default %(default)s",
    )
    parser.add_argument(
        "--trials-dir",
        default=None,
        metavar="DIR",
        help="--measure: trials keep configs, logs and results in DIR/<timestamp>/ (a shared path for "
        "Slurm); default: a temporary directory locally, ./plan-trials/<timestamp>/ with Slurm",
    )
    parser.add_argument(
        "--trial-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="--measure: seconds a trial may take (with Slurm, queueing included; then cancelled); "
        "default %(default)g",
    )
    exclude_file = parser.add_argument(
        "--exclude-file",
        default="results/exclude_nodes.txt",
        metavar="FILE",
        help="--measure with Slurm: nodes a failed `gptrain validate` blamed, kept out of the trials "
        "(default %(default)s, gptrain launch's; a missing file excludes nothing; '' reads none)",
    )
    exclude_file.empty_means_none = True  # type: ignore[attr-defined]  # read by refuse_empty_option_values
    parser.add_argument(
        "--trial-time-limit",
        default="00:30:00",
        metavar="HH:MM:SS",
        help="--measure with Slurm: the trial jobs' --time (default %(default)s)",
    )


def parse_words(args: argparse.Namespace) -> argparse.Namespace:
    """Split the remaining words into preset, overrides and options (in any order)."""
    inner = argparse.ArgumentParser(prog="gptrain plan")
    add_options(inner)
    inner.add_argument("positionals", nargs="*")
    parsed = inner.parse_intermixed_args(args.words, namespace=argparse.Namespace(**vars(args)))
    from gptrain.cli import refuse_empty_option_values

    refuse_empty_option_values(inner, parsed)  # the options after the preset are parsed only here
    words = list(parsed.positionals)
    parsed.preset, parsed.overrides = split_preset(words[0] if words else None, words[1:])
    for word in parsed.overrides:
        check_not_a_group_choice(word)
    return parsed


# The launcher's group choices (`gptrain launch training=gpt3/126m cluster=bcm`) as plan takes them.
GROUP_OPTIONS = {"cluster": "--cluster {}", "training": "the preset as the first word: gptrain plan {}"}


def check_not_a_group_choice(word: str) -> None:
    """`cluster=bcm` copied from a launch command line was 'unknown key cluster': say what plan takes."""
    key, sep, value = word.partition("=")
    if sep and key in GROUP_OPTIONS:
        raise ConfigError(
            f"override '{word}' chooses a launcher group; gptrain plan takes {GROUP_OPTIONS[key].format(value)}"
        )


def check_outputs_early(args: argparse.Namespace) -> None:
    """--json, and --output with --measure, before anything runs: found when they are written, a
    path that cannot be written cost the trials' results (hours of Slurm jobs)."""
    from pathlib import Path

    from gptrain.utils.paths import directory_blocker, look_up

    outputs = [("--json", args.json)]
    if args.measure:
        outputs.append(("--output", args.output or "plan-best.yaml"))
    for option, value in outputs:
        if value is None:
            continue
        path = Path(value)
        found = look_up(path)  # Path.is_dir raised PermissionError where it may not be looked up
        if found.kind == "unreachable":
            raise ConfigError(f"{option} {path}: {found.why}")
        if found.kind == "directory":
            raise ConfigError(f"{option} {path}: is a directory; give a file name")
        why = directory_blocker(path.parent, must_write=True)  # missing parents are made when written
        if why:
            raise ConfigError(f"{option} {path}: cannot write it ({why}); give a writable path")
    for option, value in outputs:
        check_output_is_not_the_input(args, option, value)
    if args.measure:
        check_json_is_not_the_winner(args.json, args.output or "plan-best.yaml")
        check_trial_inputs_early(args)


def check_json_is_not_the_winner(json: str | None, output: str) -> None:
    """The plan's JSON is written after the winner: given --output's path, it replaced the winner
    `gptrain train --config-file` was to read."""
    from pathlib import Path

    if json is not None and Path(json).resolve() == Path(output).resolve():
        raise ConfigError(
            f"--json {json}: is --output's path, where the winner is written; give another --json"
        )


OUTPUT_WRITES = {"--output": "the winner is written there", "--json": "the plan's JSON is written there"}


def check_output_is_not_the_input(args: argparse.Namespace, option: str, value: str | None) -> None:
    """`gptrain plan plan-best.yaml --measure` (re-planning from the last winner) wrote the new winner
    over its own input, or, when nothing ran, renamed the input aside; `--json` given the input
    replaced the config with the plan's JSON: refuse such an output."""
    from pathlib import Path

    from gptrain.config.loader import preset_path

    given = args.config_file or (preset_path(args.preset) if args.preset else None)
    if value is None or given is None or Path(value).resolve() != Path(given).resolve():
        return
    raise ConfigError(
        f"{option} {value}: is the plan's input config; give another {option} ({OUTPUT_WRITES[option]})"
    )


def check_trial_inputs_early(args: argparse.Namespace) -> None:
    """--trials-dir and, for Slurm trials, --exclude-file: found only once the first trial started,
    as an error about the trial's own directory or about the launcher's validation.exclude_file."""
    from gptrain.utils.paths import directory_blocker

    trials = args.trials_dir or ("plan-trials" if args.cluster_type == "slurm" else None)
    why = directory_blocker(trials, must_write=True) if trials else None
    if why:
        raise ConfigError(
            f"--trials-dir {trials}: cannot make the trials there ({why}); give a writable directory"
        )
    if args.cluster_type == "slurm":
        from gptrain.launch.validation_stage import read_exclude_file

        read_exclude_file(args.exclude_file, "--exclude-file")


def run_plan(args: argparse.Namespace) -> int:
    from gptrain.plan.build import build_plan
    from gptrain.plan.report import nothing_fits_line, print_plan, write_json

    args = parse_words(args)
    if args.top < 1:
        raise ConfigError(f"--top={args.top} must be >= 1")
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu={args.mfu} must be in (0, 1]")
    if not args.tokens > 0 or args.tokens == float("inf"):  # also refuses nan
        raise ConfigError(f"--tokens={args.tokens:g} must be a positive number of tokens")
    if not 0 <= args.headroom < 1:  # also refuses nan
        raise ConfigError(f"--headroom={args.headroom} must be a fraction of GPU memory in [0, 1)")
    if args.steps < 2:
        raise ConfigError(f"--steps={args.steps} must be >= 2 (the first step pays for start-up)")
    if not args.trial_timeout > 0:  # also refuses nan
        raise ConfigError(f"--trial-timeout={args.trial_timeout} must be > 0 seconds")
    slurm_time("--trial-time-limit", args.trial_time_limit)  # found here, not by sbatch at each trial
    check_outputs_early(args)
    plan = build_plan(args)
    if not plan.ranked:  # the sizes and the requested layout's memory, then why nothing fits
        print_plan(plan, with_table=False)
        if args.json:
            write_json(plan, args.json)
        raise ConfigError(nothing_fits_line(plan))
    winner = None
    if args.measure:
        from gptrain.plan.measure import measure_plan
        from gptrain.utils.signals import terminate_as_exception

        with terminate_as_exception():  # SIGTERM ends the running trial and removes the temporary trials
            winner = measure_plan(plan, args)
    print_plan(plan)
    if args.json:
        write_json(plan, args.json)
    if args.measure and winner is None:  # `plan --measure && gptrain train --config-file F` must stop here
        print(
            "gptrain: plan --measure: no trial ran to the end (the table gives each one's error); nothing written",
            file=sys.stderr,
        )
        return 1
    return 0
