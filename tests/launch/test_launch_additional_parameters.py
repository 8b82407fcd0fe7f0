"""cluster.additional_parameters: sbatch options outside gptrain's cluster keys (NeMo/submitit's
additional_parameters), rendered quoted into every stage's script; gptrain's own options refused."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.compose import compose
from gptrain.launch.sbatch import Job
from gptrain.launch.stages import build_plan, write_run_files

CPU = ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]
# after CPU: a GPU training (which keeps per-GPU options), on nodes of one GPU
GPU = ["training.trainer.accelerator=gpu", "training.trainer.devices=1", "cluster.gpus_per_node=1"]
NASTY = """ablation 3; $(touch x) `touch y` "q" 'it's'"""
PREP = [
    "stages=[data_preparation,training]",
    "data_dir=d",
    "data_preparation.shards=[file:///a.jsonl,file:///b.jsonl]",
]


def sbatch_lines(script: str) -> list[tuple[str, str | None]]:
    """(option, value) of each #SBATCH line, read the way sbatch reads them (shell-like quoting)."""
    found = []
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            [word] = shlex.split(line[len("#SBATCH ") :])
            option, equals, value = word.partition("=")
            found.append((option, value if equals else None))
    return found


def launch_files(tmp_path, monkeypatch, *overrides: str, stages: list[str] = ()) -> list:
    monkeypatch.chdir(tmp_path)
    args = [*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/r", *stages, *overrides]
    return write_run_files(build_plan(compose(args)), args)


def test_extra_options_reach_every_stages_script_quoted(tmp_path, monkeypatch):
    """`--mail-type`, `--comment`, ... could not be given at all (an unknown cluster key)."""
    scripts = launch_files(
        tmp_path,
        monkeypatch,
        "cluster.additional_parameters.mail_type=END,FAIL",
        "cluster.additional_parameters.mail-user=me@example.com",
        f"cluster.additional_parameters.comment={NASTY}",
        "cluster.additional_parameters.hold=true",
        "cluster.additional_parameters.wckey=null",
        "cluster.additional_parameters.nice=10",
        stages=PREP,
    )
    assert len(scripts) == 2
    for script in scripts:
        lines = sbatch_lines(script.read_text())
        assert lines[-5:] == [
            ("--mail-type", "END,FAIL"),
            ("--mail-user", "me@example.com"),
            ("--comment", NASTY),
            ("--hold", None),
            ("--nice", "10"),
        ]
        assert not any(option == "--wckey" for option, _ in lines)
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_yaml_mapping_in_the_cluster_file_is_rendered_in_order(tmp_path, monkeypatch):
    [script] = launch_files(
        tmp_path,
        monkeypatch,
        "cluster.additional_parameters={comment: a b, begin: now+1hour, requeue_x: true}",
    )
    assert sbatch_lines(script.read_text())[-3:] == [
        ("--comment", "a b"),
        ("--begin", "now+1hour"),
        ("--requeue-x", None),
    ]


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("nodes", "gptrain renders --nodes itself; use training.trainer.num_nodes instead"),
        ("ntasks_per_node", "gptrain renders --ntasks-per-node itself; use training.trainer.devices instead"),
        ("output", "gptrain renders --output itself; use base_results_dir or <stage>.run.results_dir"),
        ("error", "gptrain renders --error itself; use cluster.stderr_to_stdout instead"),
        ("job_name", "gptrain renders --job-name itself; use cluster.job_name_prefix or <stage>.run.name"),
        ("dependency", "gptrain renders --dependency itself; use <stage>.run.dependency instead"),
        ("array", "gptrain renders --array itself; use data_preparation.run.node_array_size instead"),
        ("signal", "gptrain renders --signal itself; use cluster.signal_seconds instead"),
        ("requeue", "gptrain renders --requeue itself; use cluster.max_requeues instead"),
        ("partition", "gptrain renders --partition itself; use cluster.partition instead"),
        ("time", "gptrain renders --time itself; use <stage>.run.time_limit instead"),
        ("gpus_per_node", "gptrain renders --gpus-per-node itself; use cluster.gpus_per_node instead"),
        ("part", "gptrain renders --partition (which --part abbreviates) itself; use cluster.partition"),
        ("parsable", "gptrain renders --parsable itself; leave it out (gptrain submits with it and reads"),
        ("open_mode", "gptrain renders --open-mode itself; leave it out (logs are appended, so a requeued"),
    ],
)
def test_options_gptrain_renders_itself_are_refused_naming_the_key_to_use(tmp_path, monkeypatch, key, says):
    """A second --nodes or --output would override gptrain's (sbatch takes the last one)."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.{key}=1")
    message = str(error.value)
    assert message.startswith(f"cluster.additional_parameters.{key}: ") and says in message
    assert "\n" not in message and not (tmp_path / "r").exists()


@pytest.mark.parametrize(("key", "spelt"), [("export", "--export")])
def test_export_is_refused_naming_env_vars(tmp_path, monkeypatch, key, spelt):
    """--export=NONE sets SLURM_EXPORT_ENV, which the srun inside the batch script inherits: the
    ranks would lose env_vars, MASTER_ADDR/MASTER_PORT and PATH."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.{key}=NONE")
    message = str(error.value)
    assert message.startswith(f"cluster.additional_parameters.{key}: {spelt} is refused: ")
    assert message.endswith("; use env_vars or cluster.env_vars instead")
    assert "\n" not in message and not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["ALL", "all,NCCL_DEBUG=INFO", "NCCL_DEBUG=INFO,ALL"])
def test_export_all_keeps_the_environment_and_is_passed(tmp_path, monkeypatch, value):
    """Slurm's default, the whole environment kept: a cluster file that set it launched before the
    refusal of --export=NONE, and was refused with it."""
    [script] = launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.export='{value}'")
    assert ("--export", value) in sbatch_lines(script.read_text())


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "a\x1bb"])
def test_control_characters_are_refused_naming_the_key(tmp_path, monkeypatch, value):
    """A newline inside quotes still ends the #SBATCH line: the rest would be a line of the batch shell."""
    with pytest.raises(ConfigError) as error:
        launch_files(
            tmp_path, monkeypatch, f"cluster.additional_parameters.comment=x{value}#SBATCH --nodes=99"
        )
    message = str(error.value)
    assert message.startswith("cluster.additional_parameters.comment: ") and "\n" not in message
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            "cluster.additional_parameters.comment=false",
            "expected one value, true (a bare --comment) or null",
        ),
        ("cluster.additional_parameters.comment=[a,b]", "expected one value"),
        ("cluster.additional_parameters={'mail type': END}", "not an sbatch option name"),
        ("cluster.additional_parameters={'-x': 1}", "not an sbatch option name"),
        ("cluster.additional_parameters={mail_type: END, mail-type: ALL}", "--mail-type is given twice"),
        ("cluster.additional_parameters.comment=a\\b", "backslash"),
        ("cluster.additional_parameters.mem_per_cpu=4G", "set cluster.mem=null to use it"),
        ("cluster.additional_parameters=[mail_type]", "expected a mapping"),
    ],
)
def test_values_sbatch_cannot_take_are_refused_in_one_line(tmp_path, monkeypatch, override, says):
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, override)
    assert "cluster.additional_parameters" in str(error.value) and says in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("N", "gptrain renders --nodes (sbatch's -N) itself; use training.trainer.num_nodes instead"),
        ("n", "gptrain renders --ntasks (sbatch's -n) itself; use training.trainer.num_nodes and"),
        ("t", "gptrain renders --time (sbatch's -t) itself; use <stage>.run.time_limit instead"),
        ("c", "gptrain renders --cpus-per-task (sbatch's -c) itself; use cluster.cpus_per_task"),
        ("w", "gptrain renders --nodelist (sbatch's -w) itself; use cluster.nodelist instead"),
        ("L", "renders --L, which sbatch does not read (-L is its short form of --licenses); write the"
         " long name, licenses"),
        ("y", "renders --y, which sbatch does not read (it has no -y either); write the long option's name"),
    ],
)  # fmt: skip
def test_a_one_letter_key_is_read_as_sbatchs_short_option(tmp_path, monkeypatch, key, says):
    """`N: 2` (an srun/sbatch line's -N) rendered `--N=2`, which sbatch refuses only at submission;
    `n`, `c` and `w` were refused as --nodes, --chdir and --wait, options they do not stand for."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.{key}=2")
    message = str(error.value)
    assert message.startswith(f"cluster.additional_parameters.{key}: ") and says in message
    assert "\n" not in message and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (  # sbatch takes the last of the two, silently
            ["cluster.additional_parameters={mail_type: END, mail_t: ALL}"],
            "mail_t: --mail-type (which --mail-t abbreviates) is given twice (also as"
            " cluster.additional_parameters.mail_type); keep one",
        ),
        (  # sbatch refuses --mem-per-cpu with --mem, abbreviated or not
            ["cluster.mem=0", "cluster.additional_parameters.mem_per_c=4G"],
            "mem_per_c: sbatch refuses it together with --mem, which cluster.mem=0 renders",
        ),
        (
            ["cluster.additional_parameters.mem_per=4G"],
            "mem_per: --mem-per abbreviates several sbatch options (--mem-per-cpu, --mem-per-gpu), and"
            " sbatch refuses it as ambiguous; write the full name",
        ),
        (  # --expo is --export or --export-file to sbatch: refused as ambiguous
            ["cluster.additional_parameters.expo=NONE"],
            "expo: --expo abbreviates several sbatch options (--export, --export-file)",
        ),
        (  # --resv-ports (Slurm 24.05+): --res is no longer --reservation alone
            ["cluster.additional_parameters.res=r1"],
            "res: --res abbreviates several sbatch options (--reservation, --resources, --resv-ports)",
        ),
        (  # --spread-segments (Slurm 25.11+): --spread is no longer --spread-job alone
            ["cluster.additional_parameters.spread=true"],
            "spread: --spread abbreviates several sbatch options (--spread-job, --spread-segments)",
        ),
        (  # --ntasks-per-t is --ntasks-per-tres, not an option sbatch does not know
            ["cluster.additional_parameters={ntasks_per_tres: 1, ntasks_per_t: 2}"],
            "ntasks_per_t: --ntasks-per-tres (which --ntasks-per-t abbreviates) is given twice",
        ),
    ],
)
def test_an_abbreviated_key_is_read_as_the_option_sbatch_takes_it_for(tmp_path, monkeypatch, overrides, says):
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, *overrides)
    message = str(error.value)
    assert message.startswith("cluster.additional_parameters.") and says in message
    assert "\n" not in message and not (tmp_path / "r").exists()


def test_a_unique_abbreviation_of_another_option_is_rendered_as_written(tmp_path, monkeypatch):
    [script] = launch_files(tmp_path, monkeypatch, "cluster.additional_parameters.mail_t=END")
    assert ("--mail-t", "END") in sbatch_lines(script.read_text())


@pytest.mark.parametrize("key", ["tasks_per_node", "tasks_per", "tasks-per-node"])
def test_another_name_of_an_option_gptrain_renders_is_refused_as_that_option(tmp_path, monkeypatch, key):
    """sbatch's --tasks-per-node is --ntasks-per-node: it passed unchecked and, rendered after
    gptrain's, set the tasks per node (sbatch takes the last one)."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.{key}=1")
    message = str(error.value)
    assert message.startswith(f"cluster.additional_parameters.{key}: gptrain renders --ntasks-per-node ")
    assert message.endswith(" itself; use training.trainer.devices instead")
    how = "abbreviates --tasks-per-node, another name of it" if key == "tasks_per" else "is another name of"
    assert f"(which --{key.replace('_', '-')} {how})" in message
    assert "\n" not in message and not (tmp_path / "r").exists()


@pytest.mark.parametrize("both", ["{clusters: a, cluster: b}", "{cluster: a, clusters: b}"])
def test_two_names_of_one_option_are_refused_as_given_twice(tmp_path, monkeypatch, both):
    """--cluster sets what --clusters (-M) sets: sbatch took the last of them, silently."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters={both}")
    assert "is given twice (also as cluster.additional_parameters." in str(error.value)


@pytest.mark.parametrize(("key", "option"), [("cluster", "--cluster"), ("context", "--context")])
def test_an_options_full_name_is_not_read_as_a_prefix_of_longer_ones(tmp_path, monkeypatch, key, option):
    """getopt_long takes an exact name before prefixes: --cluster (--clusters' other name) was refused
    as an abbreviation of --cluster-constraint and --clusters."""
    [script] = launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.{key}=c1")
    assert (option, "c1") in sbatch_lines(script.read_text())


@pytest.mark.parametrize("mem", ["null", "''", "' '"])
def test_mem_per_cpu_is_rendered_when_cluster_mem_is_null(tmp_path, monkeypatch, mem):
    """sbatch refuses --mem with --mem-per-cpu; with cluster.mem=null only the latter is rendered. A
    blank cluster.mem is none too, as a blank partition is: it rendered `--mem=''`, which sbatch
    refuses, and beside mem_per_cpu was refused as a --mem."""
    [script] = launch_files(
        tmp_path, monkeypatch, f"cluster.mem={mem}", "cluster.additional_parameters.mem_per_cpu=4G"
    )
    lines = sbatch_lines(script.read_text())
    assert ("--mem-per-cpu", "4G") in lines and not any(option == "--mem" for option, _ in lines)


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        (
            "sbatch: unrecognized option '--mail-typo=END'\nTry \"sbatch --help\" for more information",
            "sbatch: unrecognized option '--mail-typo=END'; check cluster.additional_parameters (an option"
            " this sbatch does not know)",
        ),
        (
            "sbatch: option '--hold' doesn't allow an argument\nTry \"sbatch --help\" for more information",
            "sbatch: option '--hold' doesn't allow an argument; check cluster.additional_parameters (true for"
            " a bare flag, a value for an option that takes one)",
        ),
        (
            "sbatch: error: Invalid --mail-type specification",
            "sbatch: error: Invalid --mail-type specification; check cluster.additional_parameters",
        ),
        (  # an option gptrain renders from its own key (cluster.mem=16Gi): that key, not the extras
            "sbatch: error: Invalid --mem specification",
            "sbatch: error: Invalid --mem specification; check cluster.mem",
        ),
        (
            "sbatch: error: Invalid --time specification",
            "sbatch: error: Invalid --time specification; check training.run.time_limit",
        ),
        (  # --exclude's nodes: cluster.exclude and those a failed validation blamed
            "sbatch: error: Invalid --exclude specification",
            "sbatch: error: Invalid --exclude specification; check cluster.exclude or validation.exclude_file",
        ),
    ],
)
def test_an_option_sbatch_cannot_read_is_named_in_one_line(tmp_path, monkeypatch, stderr, said):
    """sbatch's last line after an unknown option is 'Try "sbatch --help"...': that was all the
    launch said, not which option it could not read."""
    from gptrain.launch.executors.slurm import sbatch

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/bash\necho {shlex.quote(stderr)} >&2\nexit 255\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    job = Job("training", "r", "gptrain-r", tmp_path, [])
    with pytest.raises(LaunchError) as error:
        sbatch(job, None)
    assert str(error.value) == f"sbatch refused {job.script_path}: {said}"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("export_file", "missing.env", "missing.env: No such file or directory"),
        ("export-fil", "missing.env", "missing.env: No such file or directory"),  # sbatch's abbreviation
        ("export_file", "7", "7: No such file or directory (a file descriptor: gptrain runs sbatch itself"),
        ("export_file", ".", ".: Is a directory"),
        ("export_file", "true", "--export-file takes a file"),
    ],
)
def test_an_export_file_sbatch_cannot_read_stops_the_launch(tmp_path, monkeypatch, capsys, name, value, says):
    """sbatch reads --export-file when gptrain submits: a file it cannot open passed unchecked, and
    sbatch refused the job ('Could not open user environment file') after the run files were
    written. It is checked like the other files a launch reads: one line naming the key, nothing
    written (a warning under --dry-run)."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")  # no sinfo here: the file check alone decides
    args = ["launch", *CPU, "cluster_type=slurm", "training.model.data.data_impl=mock"]
    args += ["training.model.data.mock_vocab_size=64", f"base_results_dir={tmp_path}/r"]
    args.append(f"cluster.additional_parameters.{name}={value}")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gptrain: error: cluster.additional_parameters.{name}: {says}") and "\n" not in err
    assert not (tmp_path / "r").exists()
    assert main(["launch", "--dry-run", *args[1:]]) == 0
    assert f"preflight: warning  cluster.additional_parameters.{name}: {says}" in capsys.readouterr().err


def test_an_export_file_sbatch_can_read_is_passed(tmp_path, monkeypatch, capsys):
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    (tmp_path / "nccl.env").write_bytes(b"NCCL_DEBUG=INFO\0FI_PROVIDER=efa\0")
    args = ["launch", "--dry-run", *CPU, "cluster_type=slurm", "training.model.data.data_impl=mock"]
    args += ["training.model.data.mock_vocab_size=64", f"base_results_dir={tmp_path}/r"]
    assert main([*args, "cluster.additional_parameters.export_file=nccl.env"]) == 0
    assert (
        "preflight: ok  cluster.additional_parameters.export_file: nccl.env can be read"
        in capsys.readouterr().err
    )
    [script] = (tmp_path / "r").glob("*/dry-run/*_submission.sh")
    assert ("--export-file", "nccl.env") in sbatch_lines(script.read_text())


def test_the_sbatch_keys_nemos_slurm_launcher_takes_in_a_cluster_file_are_rendered(tmp_path, monkeypatch):
    """NeMo's SlurmLauncher renders every key of its cluster file it has a parameter for: `comment`,
    `mem_per_cpu`, `mem_per_gpu` and `cpus_per_gpu` beside bcm.yaml's own were refused as unknown
    cluster keys. They are sbatch options gptrain does not render itself: they go to sbatch as
    additional_parameters would, checked as those are (--mem-per-cpu beside cluster.mem)."""
    [script] = launch_files(
        tmp_path,
        monkeypatch,
        "cluster.mem=null",
        "+cluster.comment=ablation 3",
        "+cluster.mem_per_cpu=4G",
        "+cluster.cpus_per_gpu=null",  # null: no line, as NeMo's
    )
    lines = sbatch_lines(script.read_text())
    assert [line for line in lines if line[0] in ("--comment", "--mem-per-cpu", "--cpus-per-gpu")] == [
        ("--comment", "ablation 3"),
        ("--mem-per-cpu", "4G"),
    ]
    with pytest.raises(ConfigError, match=r"^cluster\.mem_per_cpu: sbatch refuses it"):
        launch_files(tmp_path, monkeypatch, "+cluster.mem_per_cpu=4G")  # cluster.mem=0 renders --mem
    with pytest.raises(
        ConfigError,
        match=r"^cluster\.comment: --comment is given twice \(also as cluster\.additional_parameters\.comment\)",
    ):
        launch_files(tmp_path, monkeypatch, "+cluster.comment=a", "+cluster.additional_parameters.comment=b")


def test_a_cluster_files_cpus_per_task_gives_the_training_its_cpus(tmp_path, monkeypatch):
    """NeMo's SlurmLauncher renders a cluster file's `cpus_per_task` as --cpus-per-task: it was an
    unknown cluster key, and additional_parameters refuses the option (gptrain renders it), so a
    training could not ask for CPUs per rank at all. It goes to the training's #SBATCH line and its
    srun (Slurm 22.05's srun does not inherit it); the data preparation keeps data_preparation.workers."""
    prep, train = launch_files(tmp_path, monkeypatch, "+cluster.cpus_per_task=4", stages=PREP)
    training = train.read_text()
    assert ("--cpus-per-task", "4") in sbatch_lines(training)
    srun = next(line for line in training.splitlines() if line.startswith("srun "))
    assert "--cpus-per-task=4" in shlex.split(srun.removesuffix(" &"))
    assert ("--cpus-per-task", "4") not in sbatch_lines(prep.read_text())
    with pytest.raises(
        ConfigError, match=r"^cluster\.cpus_per_gpu: sbatch refuses it together with --cpus-per-task"
    ):
        launch_files(tmp_path, monkeypatch, "+cluster.cpus_per_task=4", "+cluster.cpus_per_gpu=2")
    with pytest.raises(ConfigError, match=r"^cluster\.cpus_per_task: expected a whole number"):
        launch_files(tmp_path, monkeypatch, "+cluster.cpus_per_task=many")


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["+cluster.mem_per_cpu=4G", "+cluster.mem_per_gpu=16G"],
            "cluster.mem_per_gpu: sbatch refuses it together with --mem-per-cpu, which"
            " cluster.mem_per_cpu=4G renders; give one of them",
        ),
        (
            ["+cluster.mem_per_cpu=4G", "cluster.additional_parameters.mem_per_gpu=16G"],
            "cluster.additional_parameters.mem_per_gpu: sbatch refuses it together with --mem-per-cpu,"
            " which cluster.mem_per_cpu=4G renders; give one of them",
        ),
        (
            ["cluster.additional_parameters.mem_per_c=4G", "cluster.additional_parameters.mem_per_gpu=16G"],
            "cluster.additional_parameters.mem_per_gpu: sbatch refuses it together with --mem-per-cpu,"
            " which cluster.additional_parameters.mem_per_c=4G renders; give one of them",
        ),
    ],
)
def test_any_two_of_sbatchs_memory_options_are_refused_naming_both(tmp_path, monkeypatch, overrides, says):
    """sbatch refuses any two of --mem, --mem-per-cpu and --mem-per-gpu ('mutually exclusive', at
    submission): only --mem beside one of the others was refused, so --mem-per-cpu with
    --mem-per-gpu was rendered and refused after the earlier stages were queued."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, "cluster.mem=null", *overrides)
    assert str(error.value) == says
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("key", ["+cluster.cpus_per_gpu", "cluster.additional_parameters.cpus_per_g"])
def test_cpus_per_gpu_is_left_out_of_the_data_preparation_with_a_note(tmp_path, monkeypatch, key):
    """cluster.cpus_per_gpu was rendered on every stage, the data preparation's too: a job asking for
    no GPU, which sbatch refuses --cpus-per-gpu on, and whose --cpus-per-task (data_preparation.workers)
    Slurm 23.11+ refuses beside it. It is left out there, said once; the GPU training keeps it."""
    from gptrain.launch.launcher import launch_notes

    extra = [*PREP, *GPU, "data_preparation.workers=3", f"{key}=4"]
    prep, train = launch_files(tmp_path, monkeypatch, *extra)
    prep_lines = sbatch_lines(prep.read_text())
    assert ("--cpus-per-task", "3") in prep_lines
    assert not any(option.startswith("--cpus-per-g") for option, _ in prep_lines)
    assert (f"--{key.rsplit('.', 1)[1].replace('_', '-')}", "4") in sbatch_lines(train.read_text())
    plan = build_plan(compose([*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/r", *extra]))
    notes = launch_notes(plan, ["data_preparation", "training"])
    said = [note for note in notes if note.startswith("note  data_preparation:")]
    assert said == [
        f"note  data_preparation: {key.lstrip('+')}=4 is left out of its script: it asks for no GPU"
        " (sbatch refuses --cpus-per-gpu without one); its CPUs per task are data_preparation.workers"
    ]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["+cluster.cpus_per_task=4", "cluster.additional_parameters.tres_per_task=cpu:4"],
            "cluster.additional_parameters.tres_per_task: sbatch refuses it together with --cpus-per-task,"
            " which cluster.cpus_per_task=4 renders; give one of them",
        ),
        (
            ["+cluster.cpus_per_task=4", "cluster.additional_parameters.tres_per_task='gres/gpu:1,CPU=2'"],
            "cluster.additional_parameters.tres_per_task: sbatch refuses it together with --cpus-per-task,"
            " which cluster.cpus_per_task=4 renders; give one of them",
        ),
        (
            ["+cluster.cpus_per_gpu=8", "cluster.additional_parameters.tres_per_task=cpu:4"],
            "cluster.additional_parameters.tres_per_task: sbatch refuses it together with --cpus-per-gpu,"
            " which cluster.cpus_per_gpu=8 renders; give one of them",
        ),
        (
            [*PREP, "data_preparation.workers=3", "cluster.additional_parameters.tres_per_task=cpu:4"],
            "cluster.additional_parameters.tres_per_task: sbatch refuses it together with --cpus-per-task,"
            " which data_preparation.workers=3 renders for the data preparation (cpu:4 asks for CPUs per"
            " task too); give the training's CPUs as cluster.cpus_per_task instead",
        ),
    ],
)
def test_a_tres_per_task_cpu_count_beside_another_cpu_request_is_refused(
    tmp_path, monkeypatch, overrides, says
):
    """--tres-per-task=cpu:N is --cpus-per-task to sbatch: Slurm 23.02+ refuses the two together and
    23.11+ either beside --cpus-per-gpu ('mutually exclusive'); it was rendered, refused at submission."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, *overrides)
    assert str(error.value) == says
    assert not (tmp_path / "r").exists()


def test_a_tres_per_task_of_gpus_or_alone_is_rendered(tmp_path, monkeypatch):
    """Only a cpu count clashes: gres/gpu beside cluster.cpus_per_task, or cpu:N with no other CPU
    request (the training alone, no cpus_per_task), goes to sbatch as given."""
    gpu = "cluster.additional_parameters.tres_per_task=gres/gpu:1"
    [script] = launch_files(tmp_path, monkeypatch, "+cluster.cpus_per_task=4", gpu)
    assert ("--tres-per-task", "gres/gpu:1") in sbatch_lines(script.read_text())
    [script] = launch_files(tmp_path, monkeypatch, "cluster.additional_parameters.tres_per_task=cpu:4")
    assert ("--tres-per-task", "cpu:4") in sbatch_lines(script.read_text())


@pytest.mark.parametrize(("key", "spelt"), [("ntasks_per_gpu", "--ntasks-per-gpu"), ("ntasks_per_g", None)])
def test_ntasks_per_gpu_is_refused_naming_the_ntasks_per_node_gptrain_renders(
    tmp_path, monkeypatch, key, spelt
):
    """sbatch refuses --ntasks-per-gpu beside --ntasks-per-node ('mutually exclusive', 22.05+), which
    every stage's script has: it was rendered (and counted as a GPU request) and refused at submission."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, f"cluster.additional_parameters.{key}=1")
    spelt = spelt or "--ntasks-per-gpu (which --ntasks-per-g abbreviates)"
    assert str(error.value) == (
        f"cluster.additional_parameters.{key}: {spelt} is refused: sbatch refuses it beside --ntasks-per-node,"
        " which gptrain renders on every stage (training.trainer.devices); give the ranks per node as"
        " training.trainer.devices and their GPUs as cluster.gpus_per_node or cluster.gpus_per_task"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("+cluster.cpus_per_gpu=false", "cluster.cpus_per_gpu: expected a whole number, got False (bool)"),
        ("+cluster.cpus_per_gpu=true", "cluster.cpus_per_gpu: expected a whole number, got True (bool)"),
        ("+cluster.cpus_per_gpu=-2", "cluster.cpus_per_gpu: expected a whole number 1 or more, got -2"),
        (
            "+cluster.cpus_per_gpu=''",
            "cluster.cpus_per_gpu: empty; give a whole number (on the command line, a $VARIABLE the shell"
            " found unset is empty)",
        ),
        ("+cluster.comment=true", "cluster.comment: expected one value or null (left out), got True (bool)"),
        (
            "+cluster.comment=false",
            "cluster.comment: expected one value or null (left out), got False (bool)",
        ),
        (
            "+cluster.mem_per_cpu=true",
            "cluster.mem_per_cpu: expected one value or null (left out), got True (bool)",
        ),
        (
            "+cluster.mem_per_gpu=false",
            "cluster.mem_per_gpu: expected one value or null (left out), got False (bool)",
        ),
    ],
)
def test_nemo_sbatch_keys_are_checked_as_values_their_options_take(tmp_path, monkeypatch, override, says):
    """cluster.comment, cpus_per_gpu, mem_per_cpu and mem_per_gpu were checked only as single values:
    false rendered `--cpus-per-gpu=False`, true a bare option, -2 a count sbatch refuses, each at
    submission after the earlier stages were queued."""
    with pytest.raises(ConfigError) as error:
        launch_files(tmp_path, monkeypatch, "cluster.mem=null", override)
    assert str(error.value) == says
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("blank", ["''", "' '"])
def test_a_blank_nemo_mem_per_key_is_none_as_a_blank_cluster_mem_is(tmp_path, monkeypatch, blank):
    """A blank mem_per_cpu rendered `--mem-per-cpu=''` (sbatch refuses it) and, beside cluster.mem,
    was refused as a second memory option; it is no option, as a blank cluster.mem is."""
    [script] = launch_files(
        tmp_path, monkeypatch, f"+cluster.mem_per_cpu={blank}", f"+cluster.mem_per_gpu={blank}"
    )
    lines = sbatch_lines(script.read_text())
    assert ("--mem", "0") in lines and not any(option.startswith("--mem-per") for option, _ in lines)


def test_a_cluster_files_cpus_per_task_gives_the_validation_its_cpus(tmp_path, monkeypatch):
    """The validation's ranks run on the training's nodes as its ranks do: NeMo renders cpus_per_task
    for every job, so the validation's #SBATCH line and srun carry it too (nothing checked it)."""
    validation, training = launch_files(
        tmp_path, monkeypatch, "+cluster.cpus_per_task=4", stages=["stages=[validation,training]"]
    )
    for script in (validation, training):
        text = script.read_text()
        assert ("--cpus-per-task", "4") in sbatch_lines(text)
        srun = next(line for line in text.splitlines() if line.startswith("srun "))
        assert "--cpus-per-task=4" in shlex.split(srun.removesuffix(" &"))
    assert validation.name.endswith("_validation_submission.sh")


@pytest.mark.parametrize("key", ["+cluster.mem_per_gpu", "cluster.additional_parameters.mem_per_g"])
def test_mem_per_gpu_is_left_out_of_the_data_preparation_with_a_note(tmp_path, monkeypatch, key):
    """NeMo's SlurmLauncher key mem_per_gpu was rendered on every stage, the data preparation's too:
    a job that asks for no GPU, which sbatch refuses --mem-per-gpu on ('Invalid generic resource
    (gres) specification'), after nothing else was queued. It is left out there (the job gets the
    partition's default memory), said once; the GPU training keeps it."""
    from gptrain.launch.launcher import launch_notes

    extra = [*PREP, *GPU, "cluster.mem=null", f"{key}=16G"]
    prep, train = launch_files(tmp_path, monkeypatch, *extra)
    assert not any(option.startswith("--mem") for option, _ in sbatch_lines(prep.read_text()))
    assert (f"--{key.rsplit('.', 1)[1].replace('_', '-')}", "16G") in sbatch_lines(train.read_text())
    plan = build_plan(compose([*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/r", *extra]))
    notes = launch_notes(plan, ["data_preparation", "training"])
    said = [note for note in notes if note.startswith("note  data_preparation:")]
    assert said == [
        f"note  data_preparation: {key.lstrip('+')}=16G is left out of its script: it asks for no GPU"
        " (sbatch refuses --mem-per-gpu without one); its memory is the partition's default"
    ]


@pytest.mark.parametrize(
    ("key", "instead"),
    [
        ("+cluster.cpus_per_gpu=2", "its ranks' CPUs are cluster.cpus_per_task (one each where null)"),
        ("cluster.additional_parameters.mem_per_gpu=16G", "its memory is the partition's default"),
    ],
)
def test_per_gpu_options_are_left_out_of_a_cpu_training_with_a_note(tmp_path, monkeypatch, key, instead):
    """A cluster file's cpus_per_gpu or mem_per_gpu reached the script of a training with
    trainer.accelerator=cpu, whose job asks for no GPU: sbatch refused it ('Invalid generic resource
    (gres) specification'), after the queue's preflight had passed. Left out, said once."""
    from gptrain.launch.launcher import launch_notes

    [train] = launch_files(tmp_path, monkeypatch, "cluster.mem=null", key)
    assert not any(option.endswith("-per-gpu") for option, _ in sbatch_lines(train.read_text()))
    plan = build_plan(
        compose([*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/r", "cluster.mem=null", key])
    )
    setting = key.lstrip("+")
    option = "--" + setting.split("=")[0].rsplit(".", 1)[1].replace("_", "-")
    assert [note for note in launch_notes(plan, ["training"]) if setting in note] == [
        f"note  training: {setting} is left out of its script: training.trainer.accelerator=cpu asks for"
        f" no GPU (sbatch refuses {option} without one); {instead}"
    ]


GPUS_IN_ADDITIONAL_PARAMETERS = [
    "cluster.additional_parameters.gpus_per_socket=1",
    "cluster.additional_parameters.gpus_per_s=a100:1",
    "cluster.additional_parameters.tres_per_task=gres/gpu:1",
    "cluster.additional_parameters.tres_per_task='cpu=2,gres/gpu=1'",
]


@pytest.mark.parametrize("gpus", GPUS_IN_ADDITIONAL_PARAMETERS)
@pytest.mark.parametrize("key", ["+cluster.mem_per_gpu", "cluster.additional_parameters.mem_per_g"])
def test_per_gpu_options_stay_on_a_stage_given_gpus_through_additional_parameters(
    tmp_path, monkeypatch, gpus, key
):
    """GPUs asked through additional_parameters (which reach every stage's script) still lost the
    per-GPU options of the data preparation and of a trainer.accelerator=cpu training, with a note
    that the stage 'asks for no GPU': Slurm allocates it GPUs all the same. Left out only where the
    stage has no GPU from any source."""
    from gptrain.launch.launcher import launch_notes

    stages = ["data_preparation", "training"]
    extra = [*PREP, "cluster.mem=null", "data_preparation.workers=auto", gpus, f"{key}=16G"]
    option = f"--{key.rsplit('.', 1)[1].replace('_', '-')}"
    for script in launch_files(tmp_path, monkeypatch, *extra):
        assert (option, "16G") in sbatch_lines(script.read_text()), script.name
    plan = build_plan(compose([*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/r", *extra]))
    assert not [note for note in launch_notes(plan, stages) if "is left out of its script" in note]


@pytest.mark.parametrize(
    "gpus",
    [
        "cluster.additional_parameters.gpus_per_socket=0",
        "cluster.additional_parameters.tres_per_task=gres/gpu:0",
    ],
)
def test_a_count_of_no_gpu_in_additional_parameters_leaves_per_gpu_options_out(tmp_path, monkeypatch, gpus):
    extra = [*PREP, "cluster.mem=null", gpus, "+cluster.mem_per_gpu=16G"]
    for script in launch_files(tmp_path, monkeypatch, *extra):
        assert not any(option == "--mem-per-gpu" for option, _ in sbatch_lines(script.read_text())), (
            script.name
        )


def test_cpus_per_gpu_stays_off_a_data_preparation_with_gpus_beside_its_workers_cpus(tmp_path, monkeypatch):
    """Given GPUs through additional_parameters the data preparation may keep --cpus-per-gpu, but not
    beside the --cpus-per-task data_preparation.workers renders (Slurm 23.11+ refuses the two
    together): said so, not that it asks for no GPU; with workers=auto it is kept."""
    from gptrain.launch.launcher import launch_notes

    extra = [*PREP, "cluster.additional_parameters.gpus_per_socket=1", "+cluster.cpus_per_gpu=4"]
    prep, train = launch_files(tmp_path, monkeypatch, *extra, "data_preparation.workers=3")
    assert ("--cpus-per-task", "3") in sbatch_lines(prep.read_text())
    assert not any(option == "--cpus-per-gpu" for option, _ in sbatch_lines(prep.read_text()))
    assert ("--cpus-per-gpu", "4") in sbatch_lines(train.read_text())
    args = [
        *CPU,
        "cluster_type=slurm",
        f"base_results_dir={tmp_path}/r2",
        *extra,
        "data_preparation.workers=3",
    ]
    notes = launch_notes(build_plan(compose(args)), ["data_preparation", "training"])
    assert [note for note in notes if "left out" in note] == [
        "note  data_preparation: cluster.cpus_per_gpu=4 is left out of its script: sbatch refuses --cpus-per-gpu"
        " beside the --cpus-per-task that data_preparation.workers=3 renders (Slurm 23.11+); its CPUs per"
        " task are data_preparation.workers"
    ]
    (tmp_path / "auto").mkdir()
    prep, _ = launch_files(tmp_path / "auto", monkeypatch, *extra, "data_preparation.workers=auto")
    assert ("--cpus-per-gpu", "4") in sbatch_lines(prep.read_text())
