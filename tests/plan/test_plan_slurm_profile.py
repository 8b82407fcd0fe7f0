"""The cluster file `gptrain plan --measure --cluster-type slurm` renders its trial jobs from.

`gptrain launch` checks a cluster file's keys (types, spelling, one-line values) before it renders
anything; the planner read the same file raw, so `srun_args: --mpi=pmix` (one string, which launch
takes as a one-item list) reached srun one character a word (`srun ... - - m p i ...`), and
`exclusive: "false"` (a string launch refuses) asked for whole nodes. Each trial failed only
once it ran.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from gptrain.errors import ConfigError
from gptrain.launch.sbatch import Job, render_slurm
from gptrain.plan.slurm_trials import slurm_profile


def trial_script(profile: dict) -> str:
    job = Job(
        "training", "plan-t", "plan-t", Path("/tmp/t"), ["python", "-m", "x"], nodes=1, tasks_per_node=1
    )
    return render_slurm(job, profile, {})


def srun_words(script: str) -> list[str]:
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    return shlex.split(line.removesuffix(" &"))


def test_a_profile_renders_its_trials_as_launch_would(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"srun_args": "--mpi=pmix", "exclusive": 0, "plan": {"gpu": "cpu"}}))
    script = trial_script(slurm_profile(str(path)))
    words = srun_words(script)
    assert "--mpi=pmix" in words and "-" not in words
    assert "#SBATCH --exclusive" not in script.splitlines()


@pytest.mark.parametrize(
    ("profile", "named"),
    [
        ({"partitoin": "gpu"}, "cluster.partitoin: unknown cluster key; did you mean 'cluster.partition'?"),
        ({"srun_args": [1, 2]}, "cluster.srun_args: expected a string or a list of strings"),
        ({"exclusive": "maybe"}, "cluster.exclusive: expected true or false, got 'maybe' (str)"),
        ({"account": "a\nb"}, "cluster.account: the value 'a\\nb' contains a newline"),
        ({"max_requeues": -1}, "cluster.max_requeues: expected a whole number 0 or more"),
    ],
)
def test_a_bad_profile_is_one_line_naming_the_file_and_key(tmp_path, profile, named):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(profile))
    with pytest.raises(ConfigError) as error:
        slurm_profile(str(path))
    message = str(error.value)
    assert message.startswith(f"--cluster {path}: {named}") and "\n" not in message
