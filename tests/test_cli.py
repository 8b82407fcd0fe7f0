import argparse
import subprocess
import sys

import pytest

from gptrain import __version__
from gptrain.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_help_does_not_import_torch():
    code = (
        "import sys, contextlib, io\n"
        "from gptrain.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
        "heavy = [m for m in ('torch', 'numpy', 'tiktoken', 'tokenizers', 'sentencepiece', 'omegaconf') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_subcommand_has_help():
    from gptrain.cli import build_parser

    parser = build_parser()
    subparsers = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, sub in subparsers[0].choices.items():
        assert sub.format_help(), name


def test_optional_overrides_are_never_said_to_be_required(capsys):
    """`gptrain eval` without its run said 'the following arguments are required: RUN_OR_CHECKPOINT,
    key=value', as if overrides had to be given: argparse marks a `*` positional without a default
    as required, and names it whenever an earlier positional is missing."""
    from gptrain.cli import build_parser

    parser = build_parser()
    subparsers = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, sub in subparsers[0].choices.items():
        for action in sub._actions:
            assert not (action.nargs == "*" and not action.option_strings and action.required), (
                name,
                action.dest,
            )
    with pytest.raises(SystemExit):
        parser.parse_args(["eval"])
    assert capsys.readouterr().err.endswith(
        "error: the following arguments are required: RUN_OR_CHECKPOINT\n"
    )


def test_a_path_the_file_system_refuses_is_one_line(tmp_path, capsys, monkeypatch):
    """`plan --json DIR` (and eval, plot, import ... onto a directory or a read-only one) was a traceback."""
    # plan now refuses such a --json before planning; its write stands here for any command's
    monkeypatch.setattr("gptrain.plan.cli.check_outputs_early", lambda args: None)
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--gpu", "h100-80gb", "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1]
        == f"gptrain: error: {tmp_path}: is a directory; give a file name (GPTRAIN_DEBUG=1 shows where)"
    )
    monkeypatch.setenv("GPTRAIN_DEBUG", "1")
    with pytest.raises(IsADirectoryError):
        main(["plan", "gpt3/126m", "--nodes", "1", "--gpu", "h100-80gb", "--json", str(tmp_path)])


def test_hydra_override_forms_are_overrides_wherever_they_stand(tmp_path, monkeypatch):
    """`gptrain train --config-file F ~key` took `~key` for the preset (only words with `=` were
    moved back), and `++key=value` or `~key` after an option was "unrecognized arguments"."""
    import gptrain.train.loop as loop
    from gptrain.cli import main

    seen = {}
    monkeypatch.setattr(loop, "train", lambda cfg, **kwargs: seen.setdefault("cfg", cfg) and 0)
    run = tmp_path / "run.yaml"
    run.write_text(
        f"exp_manager:\n  explicit_log_dir: {tmp_path / 'out'}\n"
        "model:\n  data:\n    data_impl: mock\n    mock_vocab_size: 64\n"
        "  optim:\n    sched:\n      min_lr: 1.0e-05\n"
    )
    assert main(["train", "--config-file", str(run), "~model.optim.sched.min_lr"]) == 0
    assert seen.pop("cfg").model.optim.sched.min_lr == 0.0  # deleted: the default
    argv = ["train", "trainer.max_steps=3", "--config-file", str(run), "++trainer.val_check_interval=7",
            "~model.optim.sched.min_lr"]  # fmt: skip
    assert main(argv) == 0
    cfg = seen.pop("cfg")
    assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval, cfg.model.optim.sched.min_lr) == (
        3,
        7,
        0.0,
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["eval", "run", "--json="], "--json: empty value; give FILE or leave --json out"),
        (["plot", "run", "--output", ""], "--output: empty value; give DIR or leave --output out"),
        (["status", "--results-dir="], "--results-dir: empty value; give RESULTS_DIR or leave --results-dir out"),
        (["train", "gpt3/126m", "--config-file="], "--config-file: empty value; give CONFIG_FILE or leave --config-file out"),
        (["validate", "gpus", "--output-dir="], "--output-dir: empty value; give OUTPUT_DIR"),
        (["plan", "gpt3/126m", "--cluster="], "--cluster: empty value; give CLUSTER or leave --cluster out"),
        (["plan", "--cluster=", "gpt3/126m"], "--cluster: empty value; give CLUSTER or leave --cluster out"),
    ],
)  # fmt: skip
def test_an_option_given_an_empty_value_is_refused_by_name(tmp_path, capsys, monkeypatch, argv, said):
    """`--json=$OUT` with OUT unset read as no --json: eval wrote nothing and exited 0; likewise
    validate's reports went to the current directory, plan planned for the default cluster, status
    looked in the current directory, and train trained the preset without the config file."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err == f"gptrain: error: {said}\n"
    assert list(tmp_path.iterdir()) == []


def test_an_empty_exclude_file_still_turns_plans_default_off(tmp_path, capsys, monkeypatch):
    """`plan --exclude-file ''` read no exclude file (the default is gptrain launch's); the refusal of
    empty values turned it into an error whose advice, leaving the option out, brings the file back."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "gpt3/126m", "--exclude-file", ""]) == 0
    assert "empty value" not in capsys.readouterr().err


def group_paths(parser, path=()):
    """The words that name every command group (a command that takes a subcommand), with its choices."""
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if action is None:
        return []
    found = [(list(path), list(action.choices))] if path else []
    for name, child in action.choices.items():
        found += group_paths(child, (*path, name))
    return found


def test_a_word_in_place_of_a_groups_subcommand_names_the_choices_and_exits_2(capsys):
    """`gptrain checkpoint --sizes-only RUN` (verify left out) said "argument action: invalid choice:
    'RUN'", the parser's dest; each group now names its subcommands, as it does when none is given.
    The top level keeps argparse's "argument COMMAND: invalid choice"."""
    from gptrain.cli import build_parser

    for path, choices in group_paths(build_parser()):
        for argv in ([*path, "RUN"], [*path, "--sizes-only", "RUN"]):
            with pytest.raises(SystemExit) as exit_info:
                main(argv)
            assert exit_info.value.code == 2, argv
            assert capsys.readouterr().err.splitlines()[-1] == (
                f"gptrain {' '.join(path)}: error: the following arguments are required: "
                f"{{{','.join(choices)}}} (a subcommand; 'RUN' is none of them; --help says what each does)"
            )
    with pytest.raises(SystemExit):
        main(["RUN"])
    assert "gptrain: error: argument COMMAND: invalid choice: 'RUN'" in capsys.readouterr().err


def test_every_command_group_without_its_subcommand_names_the_choices_and_exits_2(capsys):
    """`gptrain checkpoint` alone said 'the following arguments are required: action' (the parser's
    dest), `gptrain validate` '... required: CHECK': neither named what to type. Each group now names
    its subcommands in one usage error, exit 2; `gptrain` alone still prints the help, exit 2."""
    from gptrain.cli import build_parser

    groups = group_paths(build_parser())
    assert {" ".join(path) for path, _ in groups} >= {"data", "validate", "checkpoint"}
    for path, choices in groups:
        with pytest.raises(SystemExit) as exit_info:
            main(path)
        assert exit_info.value.code == 2, path
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == (
            f"gptrain {' '.join(path)}: error: the following arguments are required: "
            f"{{{','.join(choices)}}} (a subcommand; --help says what each does)"
        )
    with pytest.raises(SystemExit):  # an option of a subcommand is not 'unrecognized' at the top level
        main(["checkpoint", "--sizes-only"])
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("gptrain checkpoint: error: the following arguments are required: {verify,rewind}")
    )
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(command in out for command in build_parser()._subparsers._group_actions[0].choices)
