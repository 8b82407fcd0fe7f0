"""NeMo's SlurmLauncher parameters in a cluster file that are not gptrain cluster keys: num_gpus
(its deprecated gpus_per_node), setup, array, heterogeneous. Each was 'unknown cluster key'."""

from __future__ import annotations

import shlex

import pytest
import yaml

from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.stages import build_plan, write_run_files

GPUS_BY_KEY = ["cluster.gres=null", "cluster.gpus_per_node=null", "training.trainer.devices=4"]


def training_script(tmp_path, monkeypatch, *overrides: str) -> str:
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *GPUS_BY_KEY, *overrides]
    [script] = write_run_files(build_plan(compose(args)), args)
    return script.read_text()


def sbatch_options(script: str) -> list[str]:
    return [shlex.split(line)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_num_gpus_is_read_as_gpus_per_node_and_taken_over_it_as_nemo_does(tmp_path, monkeypatch, capsys):
    """NeMo's SlurmLauncher: num_gpus is 'deprecated, please use gpus_per_node instead
    (overwriting with num_gpus)'."""
    assert "--gpus-per-node=4" in sbatch_options(
        training_script(tmp_path, monkeypatch, "+cluster.num_gpus=4")
    )
    assert "num_gpus" not in capsys.readouterr().err
    script = training_script(tmp_path, monkeypatch, "+cluster.num_gpus=4", "cluster.gpus_per_node=8")
    assert "--gpus-per-node=4" in sbatch_options(script)
    assert (
        "cluster.gpus_per_node=8 (cluster.num_gpus=4, NeMo's deprecated spelling of it, is taken over it"
        in (capsys.readouterr().err)
    )
    with pytest.raises(
        ConfigError, match=r"^cluster\.num_gpus: expected a whole number 0 or more, got 'four'"
    ):
        training_script(tmp_path, monkeypatch, "+cluster.num_gpus=four")


def test_a_cluster_files_setup_is_dropped_as_nemo_replaced_it(tmp_path, monkeypatch, capsys):
    """NeMo's stages set the SlurmLauncher's setup to their own exports, over a cluster file's: it
    never ran there."""
    script = training_script(tmp_path, monkeypatch, "+cluster.setup=[module load nccl]")
    assert "module load" not in script
    assert "cluster.setup (NeMo's launcher replaces it with each stage's environment exports" in (
        capsys.readouterr().err
    )
    training_script(tmp_path, monkeypatch, "+cluster.setup=null", "+cluster.heterogeneous=false")
    assert "setup" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        ("+cluster.array=0-3", r"^cluster\.array: gptrain submits each training as one job"),
        (
            "+cluster.heterogeneous=true",
            r"^cluster\.heterogeneous=true: gptrain submits each stage as one job",
        ),
    ],
)
def test_array_and_heterogeneous_jobs_are_refused_naming_the_key(tmp_path, monkeypatch, override, refusal):
    with pytest.raises(ConfigError, match=refusal):
        training_script(tmp_path, monkeypatch, override)


def test_plan_and_validate_read_num_gpus_from_a_cluster_file(tmp_path):
    from gptrain.plan.hardware import cluster_profile
    from gptrain.plan.slurm_trials import slurm_profile
    from gptrain.validate.thresholds import load_thresholds

    path = tmp_path / "nemo_bcm.yaml"
    path.write_text(yaml.safe_dump({"partition": "gpu", "num_gpus": 4, "setup": None, "array": None}))
    assert cluster_profile(str(path))["gpus_per_node"] == 4
    assert slurm_profile(str(path))["gpus_per_node"] == 4
    assert load_thresholds(str(path)).gpus_per_node == 4
    path.write_text(yaml.safe_dump({"partition": "gpu", "array": "0-3"}))
    with pytest.raises(ConfigError, match=rf"^--cluster {path}: cluster\.array: gptrain submits"):
        slurm_profile(str(path))
    with pytest.raises(ConfigError, match=rf"^{path}: cluster\.array: gptrain submits"):
        cluster_profile(str(path))
