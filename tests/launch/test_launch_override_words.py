"""Overrides wherever they stand on the command line, and the files the launch's errors name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gptrain.cli import main

SLURM = ["cluster_type=slurm", "training.trainer.num_nodes=1"]


@pytest.mark.parametrize("after", [False, True])
def test_an_sbatch_option_override_after_an_option_is_taken(after, tmp_path, capsys, monkeypatch):
    """argparse leaves a word after --dry-run to the extras, which took only keys of [\\w.]: an
    sbatch option name (gpu-bind) there was 'unrecognized arguments', though taken before it."""
    monkeypatch.chdir(tmp_path)
    words = ["cluster.additional_parameters.gpu-bind=none", "+cluster.additional_parameters.mail-type=END"]
    args = ["launch", *SLURM, f"base_results_dir={tmp_path}/r", "--dry-run", *words]
    if not after:
        args = ["launch", "--dry-run", *SLURM, f"base_results_dir={tmp_path}/r", *words]
    assert main(args) == 0, capsys.readouterr().err
    [script] = (tmp_path / "r").glob("*/dry-run/*_submission.sh")
    assert "#SBATCH --gpu-bind=none" in script.read_text()
    assert "#SBATCH --mail-type=END" in script.read_text()


def test_a_hydra_setting_after_an_option_is_ignored_as_before_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", *SLURM, f"base_results_dir={tmp_path}/r", "--dry-run", "hydra/job_logging=disabled"]
    assert main(args) == 0
    assert "ignoring hydra/job_logging=disabled: Hydra's own settings" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["/abs/path=1", "-x=1", "not-an-override"])
def test_a_word_after_an_option_that_is_no_override_is_still_unrecognized(
    word, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["launch", *SLURM, f"base_results_dir={tmp_path}/r", "--dry-run", word])
    assert "unrecognized arguments" in capsys.readouterr().err
    assert not Path(tmp_path / "r").exists()


@pytest.mark.parametrize("override", ["~run", "~training.run", "~run.name", "~training.run.name"])
def test_deleting_the_run_section_is_refused_as_deleting_its_name(override):
    """`~run.name` is refused: its default would put a 5b run in gpt3_126m's directory. `~run` (or
    `~training.run`) deleted the name with the section and trained (and resumed) there all the same."""
    from gptrain.config import load_training_config
    from gptrain.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^override '{override}': a run needs a name"):
        load_training_config("gpt3/5b", [override], report_ignored=False)
    assert load_training_config("gpt3/5b", ["~exp_manager"], report_ignored=False).run.name == "gpt3_5b"


def test_the_launch_refuses_deleting_the_training_run_section_naming_the_override():
    """It was refused, but by the unresolvable ${.name} of explicit_log_dir, naming the group file."""
    from gptrain.errors import ConfigError
    from gptrain.launch.compose import compose

    with pytest.raises(ConfigError, match=r"^override '~training.run': a run needs a name"):
        compose(["training=gpt3/5b", "~training.run"])


@pytest.mark.parametrize("config_name", ["config", "config.yaml"])
def test_the_stages_error_names_the_launcher_config_as_it_is_on_disk(config_name):
    """`--config-name config.yaml` was found (.yaml stripped), but the stages error named config.yaml.yaml."""
    from gptrain.errors import ConfigError
    from gptrain.launch.compose import CONFIG_ROOT, compose

    with pytest.raises(ConfigError) as caught:
        compose(["stages=[]"], config_name=config_name)
    assert str(caught.value).startswith(f"{CONFIG_ROOT / 'config.yaml'}: 'stages' must be a non-empty list")


def test_quoted_keys_of_a_dict_override_are_the_keys_unquoted():
    """Hydra's `{'lr':1e-3}`: the key is lr, as in Hydra's grammar (a quoted key is its text)."""
    from gptrain.config import load_training_config
    from gptrain.config.yamlio import parse_value

    assert parse_value("{'lr':1e-3, \"name\":adam}") == {"lr": 1e-3, "name": "adam"}
    default = load_training_config("gpt3/126m", report_ignored=False).model.optim
    optim = load_training_config("gpt3/126m", ["model.optim={'lr':1e-3}"], report_ignored=False).model.optim
    assert optim.lr == 1e-3 and optim.weight_decay == default.weight_decay  # merged, the others kept


@pytest.mark.parametrize("choice", ["1_0", "1.50", "010"])
def test_a_group_choice_yaml_reads_as_a_number_picks_the_file_named_as_typed(choice, tmp_path):
    """`cluster=1_0`: Hydra types the value 10, but a group choice is a file name, spelt as typed."""
    import shutil

    from gptrain.launch.compose import CONFIG_ROOT, compose

    root = tmp_path / "conf"
    shutil.copytree(CONFIG_ROOT, root)
    text = re.sub(
        r"(?m)^partition:.*$",
        f"partition: from_{choice.replace('.', '_')}",
        (root / "cluster/bcm.yaml").read_text(),
    )
    (root / f"cluster/{choice}.yaml").write_text(text)
    comp = compose([f"cluster={choice}"], root)
    assert comp.choices["cluster"] == choice
    assert comp.resolved()["cluster"]["partition"] == f"from_{choice.replace('.', '_')}"
