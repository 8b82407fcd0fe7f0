"""The cluster file `gptrain plan --measure --cluster-type slurm` renders its trial jobs from.

`gptrain launch` checks a cluster file's keys (types, spelling, one-line values) before it renders
anything; the planner read the same file raw, so `srun_args: --mpi=pmix` (one string, which launch
takes as a one-item list) reached srun one character a word (`srun ... - - m p i ...`), and
`exclusive: "false"` (a string launch refuses) asked for whole nodes. Each trial failed only
once it ran.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from gptrain.errors import ConfigError, LaunchError
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


def test_a_profile_with_a_tab_before_a_comment_reads_as_the_plan_read_it(tmp_path):
    """`cluster_profile` reads the file with libyaml, as OmegaConf does (a tab before a comment is
    fine); the trial scripts' second read used PyYAML's pure parser, which raised its ScannerError."""
    path = tmp_path / "site.yaml"
    path.write_text("partition: gpu\t# the GPU queue\nplan:\n  gpu: cpu\n")
    assert slurm_profile(str(path))["partition"] == "gpu"


@pytest.mark.parametrize(
    ("profile", "named"),
    [
        ({"partitoin": "gpu"}, "cluster.partitoin: unknown cluster key; did you mean 'cluster.partition'?"),
        ({"srun_args": [1, 2]}, "cluster.srun_args: expected a string or a list of strings"),
        (
            {"exclusive": "maybe"},
            "cluster.exclusive: expected true, false or an sbatch --exclusive mode (user, mcs, topo), got 'maybe' (str)",
        ),
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


def measured_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: dict | None) -> str:
    """The batch script `--measure --cluster-type slurm --gpus-per-node 4 [--cluster FILE]` submits
    for the top candidate, on a partition of 4-GPU nodes (sinfo, sbatch and the job's state stubbed)."""
    scripts, error = measured_trial(tmp_path, monkeypatch, profile)
    assert scripts, error
    return scripts[0]


def measured_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: dict | None
) -> tuple[list[str], str | None]:
    """The scripts measured_script's trial submitted, and the error its candidate was given."""
    from argparse import Namespace

    from plan_helpers import TINY

    from gptrain.launch.job_states import JobState
    from gptrain.launch.preflight import Node
    from gptrain.plan import slurm_trials
    from gptrain.plan.build import build_plan

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(profile))
    args = Namespace(
        preset="gpt3/126m", overrides=list(TINY), config_file=None, nodes=1, gpus_per_node=4, gpu=None,
        cluster=None if profile is None else str(path), mfu=0.4, tokens=3e11, headroom=0.1, vocab_size=None, top=1, steps=2,
        trial_timeout=60.0, trial_time_limit="0:10:00", exclude_file=str(tmp_path / "none.txt"),
    )  # fmt: skip
    plan = build_plan(args)
    scripts = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(slurm_trials, "query_nodes", lambda: [Node("n1", "gpu", True, 64, 4, "idle")])
    monkeypatch.setattr(
        slurm_trials, "sbatch", lambda job, _: scripts.append(job.script_path.read_text()) or "7"
    )
    monkeypatch.setattr(slurm_trials, "record_submission", lambda *_: None)
    monkeypatch.setattr(slurm_trials, "wait_for_job", lambda *_: JobState("COMPLETED", ""))
    candidate = plan.shown()[0]
    slurm_trials.run_slurm_trial(plan, args, candidate, tmp_path / "trial")
    return scripts, candidate.error


@pytest.mark.parametrize(
    ("gres", "per_node", "asked"),
    [
        ("gpu:8", 8, "gpu:4"),
        ("gpu:a100:8,nvme:1", None, "gpu:a100:4,nvme:1"),
        ("gpu:a100:8", 8, "gpu:a100:4"),
        ("gres/gpu=8", None, "gpu:4"),  # the TRES form sbatch takes too: it held all 8
        ("nvme:1,gres/gpu:a100:8", None, "nvme:1,gpu:a100:4"),
    ],
)
def test_a_trial_asks_for_the_plans_gpus_per_node_not_the_profiles(
    tmp_path, monkeypatch, gres, per_node, asked
):
    """A profile for whole 8-GPU nodes (`gres: gpu:8`, as the bundled ones) held all 8 GPUs for
    a `--gpus-per-node 4` trial, and on 4-GPU nodes the trial was refused before it was submitted
    ('8 GPUs per node requested but nodes of ... have 4'); the gres count is now the plan's."""
    profile = {"gres": gres, "gpus_per_node": per_node, "exclusive": True, "plan": {"gpu": "a100-80gb"}}
    lines = measured_script(tmp_path, monkeypatch, profile).splitlines()
    assert [line for line in lines if "gres" in line or "gpus-per-node" in line] == [
        f"#SBATCH --gres={asked}"
    ]


@pytest.mark.parametrize("profile", [None, {"gres": None, "gpus_per_node": None}])
def test_a_gpu_trial_asks_for_its_gpus_where_the_profile_asks_for_none(tmp_path, monkeypatch, profile):
    """Without --cluster (or with a profile that names no GPUs) a plan for 4 H100s a node rendered
    its trials with no GPU request: Slurm gave the job no GPU and every rank stopped at training's
    start ('no CUDA device is visible'); the trial now asks for the plan's GPUs per node."""
    lines = measured_script(tmp_path, monkeypatch, profile).splitlines()
    assert [line for line in lines if "gres" in line or "gpus-per-node" in line] == [
        "#SBATCH --gpus-per-node=4"
    ]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])  # Ctrl-C; SIGTERM (Terminated)
def test_a_trial_job_is_cancelled_when_the_planner_stops_while_it_runs(monkeypatch, stop):
    """Ctrl-C or SIGTERM to `plan --measure --cluster-type slurm` while a trial ran left the job
    running (holding its nodes up to --trial-time-limit) after the planner had exited."""
    from gptrain.launch.job_states import JobState
    from gptrain.plan import slurm_trials

    commands = []
    monkeypatch.setattr(slurm_trials, "slurm_state", lambda job_id: JobState("RUNNING", ""))
    monkeypatch.setattr(slurm_trials, "run_command", lambda command, *_: commands.append(command))

    def stopped(seconds: float) -> None:
        raise stop()

    monkeypatch.setattr(slurm_trials.time, "sleep", stopped)
    with pytest.raises(stop):
        slurm_trials.wait_for_job("42", timeout_s=600)
    assert commands == [["scancel", "42"]]


def test_a_trial_asks_for_the_profiles_cpus_per_task_as_the_training_does(tmp_path, monkeypatch):
    """The launcher renders cluster.cpus_per_task (NeMo's SlurmLauncher --cpus-per-task) for the
    training's ranks; a trial, which runs the training's step with its data loader, got Slurm's one
    CPU per task, and the partition check counted one CPU per rank."""
    script = measured_script(tmp_path, monkeypatch, {"cpus_per_task": 8, "plan": {"gpu": "a100-80gb"}})
    assert "#SBATCH --cpus-per-task=8" in script.splitlines()
    assert "--cpus-per-task=8" in srun_words(script)
    with pytest.raises(AssertionError, match=r"4 tasks x 32 CPUs\) but nodes of .* have 64"):
        measured_script(tmp_path, monkeypatch, {"cpus_per_task": 32, "plan": {"gpu": "a100-80gb"}})


def test_a_trial_with_exclusive_topo_is_refused_where_sbatch_is_older_than_24_05(tmp_path, monkeypatch):
    """`gptrain launch` asks `sbatch --version` before it renders cluster.exclusive=topo (Slurm 24.05+);
    the planner's trials did not, so each trial was submitted and refused by sbatch in turn. A trial is
    now refused before it is submitted, naming the key, as the launch is; a 24.05 sbatch submits it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/sh\necho 'slurm 23.02.7'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    profile = {"exclusive": "topo", "plan": {"gpu": "a100-80gb"}}
    scripts, error = measured_trial(tmp_path, monkeypatch, profile)
    assert scripts == []
    assert error is not None and error.startswith(
        "cluster.exclusive=topo: this sbatch is Slurm 23.02.7, which refuses --exclusive=topo"
    )
    fake.write_text("#!/bin/sh\necho 'slurm 24.05.1'\n")
    assert "#SBATCH --exclusive=topo" in measured_script(tmp_path, monkeypatch, profile).splitlines()


def test_a_trial_names_its_time_limit_flag_where_the_profiles_time_min_is_longer(tmp_path, monkeypatch):
    """A profile's additional_parameters.time_min over --trial-time-limit was refused naming
    training.run.time_limit, a key `gptrain plan` has not; the partition's MaxTime check said the same."""
    from gptrain.launch.preflight import Node, check_cluster

    profile = {"additional_parameters": {"time_min": "02:00:00"}, "plan": {"gpu": "a100-80gb"}}
    with pytest.raises(ConfigError) as error:
        measured_trial(tmp_path, monkeypatch, profile)
    assert str(error.value).startswith(
        "cluster.additional_parameters.time_min=02:00:00 is longer than --trial-time-limit=0:10:00,"
    )
    assert str(error.value).endswith("give at most 0:10:00, or a longer --trial-time-limit")
    job = Job("training", "t", "t", tmp_path, ["x"], tasks_per_node=1, time_limit="3:00:00")
    job.time_limit_key = "--trial-time-limit"
    with pytest.raises(
        LaunchError, match=r"^--trial-time-limit=3:00:00 is longer than partition 'gpu' allows"
    ):
        check_cluster(job, {}, [Node("n1", "gpu", True, 64, 4, "idle", "1:00:00")])
