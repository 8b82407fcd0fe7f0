"""pyxis's --container-env: in a container, the variables the job exports win over the image's own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_launch_container import stub_bin

from gptrain.cli import main
from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.container_env import check_srun_reads_container_env
from gptrain.launch.stages import build_plan, write_run_files

CPU = ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]
# The srun stub: its argv (NUL-separated) and the environment it was started with, per call.
SRUN = (
    'n=$(ls "$STUB_LOG"/*.argv 2>/dev/null | wc -l); printf \'%s\\0\' "$@" > "$STUB_LOG/srun-$n.argv";'
    ' env -0 > "$STUB_LOG/srun-$n.env"; exit 0\n'
)
SCONTROL = 'case "$1 $2" in "show hostnames") echo n1 ;; esac\n'
# Variables bash itself passes to a child, which no line of the script exports.
BASH_OWN = {"SHLVL", "PWD", "OLDPWD", "_"}


def launch_scripts(tmp_path: Path, *extra: str) -> list[Path]:
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", f"data_dir={tmp_path}/d", *CPU]
    args += ["stages=[data_preparation,training]", "data_preparation.shards=[https://h/a.jsonl.zst]", *extra]
    return write_run_files(build_plan(compose(args)), args)


def run_with_stub_srun(tmp_path: Path, script: Path, **env: str) -> list[tuple[list[str], dict[str, str]]]:
    """Each srun call of `script` run under bash: its argv and its environment, less the base one."""
    bin_dir, log = stub_bin(tmp_path, srun=SRUN, scontrol=SCONTROL), tmp_path / "log"
    subprocess.run(["rm", "-rf", str(log)], check=True)
    log.mkdir()
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "7"}
    base.update(SLURM_JOB_NODELIST="n1", SLURM_RESTART_COUNT="0", SLURM_ARRAY_TASK_ID="0", **env)
    done = subprocess.run(["bash", str(script)], env=base, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = []
    for n in range(len(list(log.glob("*.argv")))):
        argv = (log / f"srun-{n}.argv").read_text().split("\0")[:-1]
        pairs = (item.partition("=") for item in (log / f"srun-{n}.env").read_text().split("\0") if item)
        added = {name: value for name, _, value in pairs if name not in base and name not in BASH_OWN}
        calls.append((argv, added))
    return calls


def container_env_words(argv: list[str]) -> list[str]:
    """srun's own options naming --container-env (before the command it runs)."""
    options = argv[: argv.index("bash")] if "bash" in argv else argv[: argv.index("python")]
    return [word for word in options if word.startswith("--container-env")]


def test_in_a_container_every_variable_the_script_exports_is_named_in_container_env(tmp_path, monkeypatch):
    """pyxis keeps an image's value of a variable over the job's unless --container-env names it:
    the azure_nd_a100_v4 profile's NCCL_IB_PCI_RELAXED_ORDERING=1 stayed NGC pytorch's 0. Each srun
    line names exactly the variables the script exported before it (profile, env_vars, the W&B key,
    gptrain's own, the rendezvous pair for the training step), measured by running the script."""
    monkeypatch.chdir(tmp_path)
    key_file = tmp_path / "wandb.key"
    key_file.write_text("k\n")
    own = [
        "cluster=azure_nd_a100_v4",
        "container=img",
        "+env_vars.MY_FLAG=1",
        f"wandb_api_key_file={key_file}",
    ]
    for script in launch_scripts(tmp_path, *own):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        calls = run_with_stub_srun(tmp_path, script)
        assert calls and all(argv.count("--container-image=img") == 1 for argv, _ in calls)
        for argv, added in calls:
            [word] = container_env_words(argv)
            names = word.removeprefix("--container-env=").split(",")
            assert sorted(names) == sorted(added), script.name  # each once, and every one
            assert {"NCCL_IB_PCI_RELAXED_ORDERING", "MY_FLAG", "PYTHONUNBUFFERED", "WANDB_API_KEY"} <= set(
                names
            )
        if "training" in script.name:
            [_, (argv, _)] = calls  # the blend step, then the training with the rendezvous pair
            assert {"MASTER_ADDR", "MASTER_PORT"} <= set(
                container_env_words(argv)[0].split("=")[1].split(",")
            )


def test_a_users_container_env_in_srun_args_is_merged_into_the_one_rendered(tmp_path, monkeypatch):
    """cluster.srun_args' own --container-env (either form) and the job's PYXIS_CONTAINER_ENV, which
    pyxis reads only where srun has no option, are kept in the one --container-env, each name once."""
    monkeypatch.chdir(tmp_path)
    for srun_args in (
        "[--container-env=MY_OWN,NCCL_DEBUG,--mpi=pmix]",
        "'--container-env MY_OWN --mpi=pmix'",
    ):
        extra = ["cluster=azure_nd_a100_v4", "container=img", f"cluster.srun_args={srun_args}"]
        [_, train] = launch_scripts(tmp_path, *extra)
        for pyxis_env, more in (({}, []), ({"PYXIS_CONTAINER_ENV": "LANG,TERM"}, ["LANG", "TERM"])):
            for argv, added in run_with_stub_srun(tmp_path, train, **pyxis_env):
                [word] = container_env_words(argv)
                names = word.removeprefix("--container-env=").split(",")
                assert names == [*sorted(added, key=names.index), "MY_OWN", *more], srun_args
                assert "--mpi=pmix" in argv and "MY_OWN" not in added


def test_a_variable_built_from_its_own_host_value_is_not_named(tmp_path, monkeypatch):
    """`PATH: /opt/x:$PATH` expands the host's PATH in the batch shell: named, it would replace the
    image's PATH (its python); it is left to the image, the other variables still named."""
    monkeypatch.chdir(tmp_path)
    extra = ["container=img", "+env_vars.PATH=/opt/x:$PATH", "+env_vars.LD_LIBRARY_PATH=/opt/lib"]
    [_, train] = launch_scripts(tmp_path, *extra)
    for argv, _ in run_with_stub_srun(tmp_path, train):
        names = container_env_words(argv)[0].split("=")[1].split(",")
        assert "PATH" not in names and "LD_LIBRARY_PATH" in names and "OMP_NUM_THREADS" in names


def test_cluster_container_env_false_leaves_the_option_as_the_user_gave_it(tmp_path, monkeypatch):
    """pyxis before 0.15 refuses --container-env as the step starts: cluster.container_env=false
    renders none of gptrain's; a user's own in srun_args stays as given. No container: none at all."""
    monkeypatch.chdir(tmp_path)
    off = ["container=img", "cluster.container_env=false"]
    for script in launch_scripts(tmp_path, *off):
        for argv, _ in run_with_stub_srun(tmp_path, script):
            assert container_env_words(argv) == []
    for script in launch_scripts(tmp_path, *off, "cluster.srun_args=[--container-env=A]"):
        for argv, _ in run_with_stub_srun(tmp_path, script):
            assert container_env_words(argv) == ["--container-env=A"]
    for script in launch_scripts(tmp_path, "cluster.srun_args=[--container-env=A]"):
        assert "--container-env" not in script.read_text()
    with pytest.raises(ConfigError, match=r"^cluster\.container_env: expected true or false"):
        launch_scripts(tmp_path, *off[:1], "cluster.container_env=maybe")


def test_a_container_env_item_that_is_no_variable_name_is_refused(tmp_path, monkeypatch):
    """A name pyxis would write into its start-up script as it stands: one line naming the key."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        launch_scripts(tmp_path, "container=img", "cluster.srun_args=['--container-env=A,$(id)']")
    assert str(error.value).startswith("cluster.srun_args: --container-env names '$(id)'")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("help_text", "refused"),
    [
        ("--container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\\n--container-mounts=SRC:DST", True),
        ("--container-image=IMAGE\\n--container-env=NAME[,NAME...]", False),
        ("--nodes=N", False),  # no pyxis on this host: nothing to tell
    ],
)
def test_preflight_refuses_a_pyxis_without_container_env(tmp_path, monkeypatch, capsys, help_text, refused):
    """A pyxis older than 0.15 (no --container-env in `srun --help`) failed every step as it started,
    after the queue wait: refused before submitting, naming cluster.container_env; false passes."""
    monkeypatch.chdir(tmp_path)
    srun = f'[ "$1" = --help ] && printf \'%b\\n\' "{help_text}"\n'
    sinfo, sbatch = "echo 'n1|debug*|4|(null)|idle'\n", 'echo 42 >> "$0.log"; echo 42\n'
    bin_dir = stub_bin(tmp_path, srun=srun, sinfo=sinfo, sbatch=sbatch)  # nothing reaches Slurm
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    args = [
        "launch",
        "--dry-run",
        "cluster_type=slurm",
        "container=img",
        f"base_results_dir={tmp_path}/r",
        *CPU,
    ]
    args += ["training.model.data.data_impl=mock", "training.model.data.mock_vocab_size=64"]
    args += ["training.trainer.num_nodes=1", "training.trainer.devices=1"]
    assert main(args) == 0
    err = capsys.readouterr().err
    line = "cluster.container_env: this srun's pyxis has no --container-env (pyxis 0.15 added it)"
    assert (line in err) == refused, err
    assert main(args[:1] + args[2:]) == (2 if refused else 0)  # a real launch stops there
    assert (bin_dir / "sbatch.log").exists() != refused
    capsys.readouterr()
    check_srun_reads_container_env({"container_env": False})  # never asks srun
    assert main([*args, "cluster.container_env=false"]) == 0
    assert line not in capsys.readouterr().err


def test_srun_help_that_hangs_is_cut_off(tmp_path, monkeypatch):
    bin_dir = stub_bin(tmp_path, srun="exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    check_srun_reads_container_env({}, timeout=0.5)  # no answer: nothing said, no traceback


def test_a_variable_built_from_its_own_host_value_is_named_in_a_launch_note(tmp_path, monkeypatch):
    """Left out of --container-env, `LD_LIBRARY_PATH: /x:$LD_LIBRARY_PATH` keeps the image's value in the
    container, the /x lost with no word: a launch note names such variables where a container is used."""
    from gptrain.launch.launcher import launch_notes

    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "training.trainer.num_nodes=1"]
    args += ["+env_vars.LD_LIBRARY_PATH=/x:$LD_LIBRARY_PATH", "+env_vars.PATH=/opt/bin:$PATH"]
    args += ["+env_vars.OTHER=/y:$HOME"]  # another variable's host value: named, not noted

    def notes(*extra: str) -> list[str]:
        return [n for n in launch_notes(build_plan(compose([*args, *extra])), ["training"]) if "own" in n]

    [note] = notes("container=img")
    assert note.startswith("note  env_vars LD_LIBRARY_PATH, PATH are built from their own host value")
    assert "OTHER" not in note and "\n" not in note
    assert notes() == []  # no container: the host's value is what the job gets
    assert notes("container=img", "cluster.container_env=false") == []  # nothing named at all
