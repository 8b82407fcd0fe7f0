import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.sbatch import Job, render_local
from gptrain.launch.script_quoting import Raw, env_lines
from gptrain.launch.stages import build_plan, write_run_files

NASTY = "a b;touch x"
CPU = ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]


def directives(script: str) -> dict[str, str]:
    """#SBATCH lines parsed the way sbatch does (shell-like quoting)."""
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            option = shlex.split(line[len("#SBATCH ") :])[0]
            key, _, value = option.partition("=")
            found[key] = value
    return found


def test_local_script_runs_values_verbatim_and_nothing_else(tmp_path):
    job = Job("training", NASTY, NASTY, tmp_path, ["printf", "%s\n", NASTY, "$(touch y)", "`touch z`"])
    job.workdir = str(tmp_path)
    job.setup = [["printf", "%s\n", "'quoted' \"twice\""]]
    script = tmp_path / "s.sh"
    script.write_text(
        render_local(job, {"env_vars": {"V": "$(touch w) ok"}}).replace(
            "exec printf", 'echo "$V"; exec printf'
        )
    )
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.splitlines() == [
        "'quoted' \"twice\"",
        "$(touch w) ok",
        NASTY,
        "$(touch y)",
        "`touch z`",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.sh"]


def test_wandb_api_key_file_is_read_by_the_job_not_copied_into_the_script(tmp_path):
    key_file = tmp_path / "my keys" / "wandb"
    key_file.parent.mkdir()
    key_file.write_bytes(b"0123abcd\r\nNeMo reads the first line only\n")  # a CRLF file, a second line
    job = Job("training", "r", "r", tmp_path, ["printenv", "WANDB_API_KEY"])
    job.workdir = str(tmp_path)
    script = render_local(job, {"wandb_api_key_file": str(key_file)})
    assert "0123abcd" not in script
    (tmp_path / "s.sh").write_text(script)
    out = subprocess.run(["bash", str(tmp_path / "s.sh")], capture_output=True, text=True, check=True)
    assert out.stdout == "0123abcd\n"
    assert "export WANDB_API_KEY" not in render_local(job, {"wandb_api_key_file": None})


def test_env_var_references_expand_when_the_job_starts_and_nothing_else_runs(tmp_path):
    """NeMo exports env_vars unquoted, so `:$LD_LIBRARY_PATH` extends the path; before, gptrain
    exported the literal text `$LD_LIBRARY_PATH`."""
    values = {
        "LD_LIBRARY_PATH": "/opt/amazon/efa/lib:$LD_LIBRARY_PATH",
        "W": "${HOME}/x;$(touch y) `touch z` $1 $ ${UNSET_THING}end",
    }
    script = "set -u\n" + "\n".join(env_lines(values)) + '\nprintf "%s\\n" "$LD_LIBRARY_PATH" "$W"\n'
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/me", "LD_LIBRARY_PATH": "/usr/lib"}
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, check=True
    )
    assert out.stdout.splitlines() == [
        "/opt/amazon/efa/lib:/usr/lib",
        "/home/me/x;$(touch y) `touch z` $1 $ end",  # an unset one is empty, as without set -u
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_dollar_escaped_with_a_backslash_is_a_literal_dollar(tmp_path):
    """NeMo's unquoted `export P=pa\\$word` exports `pa$word`; gptrain exported `pa\\` and the
    expansion of $word (empty), and no spelling gave a literal `$` before a name (a password, a
    proxy URL, a template)."""
    values = {
        "P": "http://u:pa\\$word@proxy",
        "Q": "\\${HOME}/\\$",
        "R": "a\\b\\\\$HOME",
        "S": "x\\\\\\$HOME",
    }
    script = "set -u\n" + "\n".join(env_lines(values)) + '\nprintf "%s\\n" "$P" "$Q" "$R" "$S"\n'
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/me"}
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, check=True
    )
    # `\\$` is `$`, and nothing else changes: other backslashes stay, a name after `$` is not read;
    # a backslash pair before `$` escapes nothing (NeMo's `\\\\$HOME` expands HOME), an odd run does
    assert out.stdout.splitlines() == [
        "http://u:pa$word@proxy",
        "${HOME}/$",
        "a\\b\\\\/home/me",
        "x\\\\$HOME",
    ]


def test_a_tilde_opening_an_env_var_value_or_a_part_of_it_is_the_home_directory(tmp_path):
    """NeMo's unquoted `export HF_HOME=~/hf_cache` expands `~` (at the start, and after each `:` of
    a PATH-like value); gptrain exported the text `~/hf_cache`, so caches went to `./~/` and `~/bin`
    in PATH found nothing. The reference is bash's own unquoted export of the same text."""
    values = {
        "HF_HOME": "~/hf_cache",
        "P": "~/bin:~:$EXTRA:~/y:a~/b:~",
        "T": "~",
        "K": "a~b/~x:x~/:/o/~",
        "E": "$EXTRA:~/z",
    }
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/me", "EXTRA": "/e"}
    show = '\nprintf "%s\\n" ' + " ".join(f'"${name}"' for name in values) + "\n"
    rendered = "\n".join(env_lines(values)) + show
    reference = "\n".join(f"export {name}={value}" for name, value in values.items()) + show
    out = [
        subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env).stdout
        for script in (rendered, reference)
    ]
    assert out[0] == out[1]
    assert out[0].splitlines()[:2] == [
        "/home/me/hf_cache",
        "/home/me/bin:/home/me:/e:/home/me/y:a~/b:/home/me",
    ]
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "env_vars={HF_HOME: '~/hf'}"]
    [path] = write_run_files(build_plan(compose(args)), args)  # a YAML file's value, or a dict override's
    assert 'export HF_HOME="${HOME-}"/hf' in path.read_text().splitlines()


@pytest.mark.parametrize("value, prefix", [("~root/x", "~root"), ("/a:~me:/b", "~me"), ("~+/x", "~+")])
def test_a_tilde_naming_another_users_home_in_an_env_var_is_refused(tmp_path, value, prefix):
    """`~user` (or bash's `~+`, `~-`) is another directory than the home the job's `~` is: refused
    in one line, as the command line's `~` is (utils/overrides.py)."""
    why = f"{value!r} starts a path with {prefix!r}, which gptrain does not expand (only ~ and ~/, as $HOME)"
    with pytest.raises(ConfigError) as error:
        env_lines({"HF_HOME": value})
    assert str(error.value) == f"env_vars.HF_HOME: {why}; write that directory in full"
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]  # a cluster file's, named so
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, f"cluster.env_vars={{HF_HOME: '{value}'}}"]))
    assert str(error.value) == f"cluster.env_vars.HF_HOME: {why}; write that directory in full"
    assert not (tmp_path / "r").exists()


def test_env_var_names_are_checked():
    assert env_lines({"A": True, "B": None, "C": 1}) == ["export A=true", "export C=1"]
    with pytest.raises(ConfigError, match="not a valid environment variable"):
        env_lines({"A;rm": "x"})


def test_slurm_training_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*CPU, "cluster_type=slurm", "training.trainer.num_nodes=2", "training.trainer.devices=3"]
    args += ["cluster.partition=cpu", "cluster.signal_seconds=120", "cluster.max_requeues=2"]
    args += [f"training.run.name={NASTY}", "cluster.job_name_prefix=p-", "training.run.time_limit=00:30:00"]
    plan = build_plan(compose(args))
    [script_path] = write_run_files(plan, args)
    script = script_path.read_text()
    subprocess.run(["bash", "-n", str(script_path)], check=True)
    found = directives(script)
    assert found["--job-name"] == f"p-{NASTY}"
    assert found["--nodes"] == "2" and found["--ntasks-per-node"] == "3"
    assert found["--partition"] == "cpu" and found["--time"] == "00:30:00"
    assert found["--signal"] == "B:USR1@120" and "--requeue" in found and "--exclusive" in found
    assert found["--dependency"] == "singleton"  # the NeMo preset's run.dependency
    assert found["--output"] == f"{tmp_path}/results/{NASTY}/log-p-{NASTY}_%j.out"
    assert "--gres" not in found and "--gpus-per-node" not in found  # CPU nodes

    assert "max_requeues=2" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--container-image" not in srun and "--no-container-mount-home" not in srun
    assert srun.endswith(shlex.quote(str(tmp_path / f"results/{NASTY}/{NASTY}_hydra.yaml")) + " &")
    assert (script_path.parent / "launcher_cmd.log").read_text().startswith("gptrain launch ")


@pytest.mark.parametrize(
    "override, asked, not_asked",
    [
        ("cluster.max_requeues=0", "--no-requeue", "--requeue"),
        ("cluster.max_requeues=3", "--requeue", "--no-requeue"),
    ],
)
def test_max_requeues_0_asks_slurm_never_to_requeue_the_job(tmp_path, override, asked, not_asked):
    """0 rendered --requeue, so a node failure or a preemption requeued a job whose user asked for no
    requeue (Slurm's own default, JobRequeue=1, would too without --no-requeue). 1 or more keep
    --requeue, which the script's own `scontrol requeue` needs; unset leaves the site's default."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "training.run.time_limit=01:00:00"]
    [path] = write_run_files(build_plan(compose([*args, override])), [*args, override])
    found = directives(path.read_text())
    assert asked in found and not_asked not in found and found["--signal"] == "B:USR1@300"
    unset = [*args, "~cluster.max_requeues"]
    [path] = write_run_files(build_plan(compose(unset)), unset)
    found = directives(path.read_text())
    assert "--requeue" not in found and "--no-requeue" not in found and "--signal" in found


@pytest.mark.parametrize("time_limit", ["0", "'0'", "00:00:00"])
def test_a_time_limit_of_0_asks_slurm_for_no_limit(tmp_path, time_limit):
    """`training.run.time_limit=0` (an int once composed) rendered no --time, so the job got the
    partition's DefaultTime (often an hour or so) and was killed there; sbatch's --time=0 is no limit."""
    args = [
        "cluster_type=slurm",
        f"base_results_dir={tmp_path}/r",
        *CPU,
        f"training.run.time_limit={time_limit}",
    ]
    [path] = write_run_files(build_plan(compose(args)), args)
    assert directives(path.read_text())["--time"] == time_limit.strip("'")
    args[-1] = "training.run.time_limit=null"
    [path] = write_run_files(build_plan(compose(args)), args)
    assert "--time" not in directives(path.read_text())


def test_gpu_and_container_options(tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", "container=nvcr.io/nvidia/pytorch:24.01"]
    args += [
        "container_mounts=[/data:/data,/home/me x:/w]",
        "training.trainer.num_nodes=4",
        f"data_dir={tmp_path}/d",
    ]
    plan = build_plan(compose(args))
    [path] = write_run_files(plan, args)
    script = path.read_text()
    found = directives(script)
    assert found["--gres"] == "gpu:8" and "--gpus-per-node" not in found and found["--mem"] == "0"
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    assert "--container-image=nvcr.io/nvidia/pytorch:24.01" in words
    ours = f"{tmp_path}/r:{tmp_path}/r,{tmp_path}/d:{tmp_path}/d"  # the job's results and data dirs first
    assert (
        f"--container-mounts={ours},/data:/data,/home/me x:/w" in words
        and "--no-container-mount-home" in words
    )
    assert words[words.index("gptrain-rank") + 1] == "python"  # the image's python, not the launcher's


def test_qos_reservation_and_constraint_reach_sbatch(tmp_path, monkeypatch):
    """Sites that need them could not give them: `+cluster.qos` went unread (and is now checked)."""
    monkeypatch.chdir(tmp_path)
    args = [*CPU, "cluster_type=slurm", "+cluster.qos=high", "+cluster.reservation=maint 1"]
    args += ["+cluster.constraint=h100&ib"]
    [script_path] = write_run_files(build_plan(compose(args)), args)
    found = directives(script_path.read_text())
    assert (found["--qos"], found["--reservation"], found["--constraint"]) == ("high", "maint 1", "h100&ib")


def test_data_preparation_is_an_array_and_training_applies_the_blend(tmp_path):
    shards = "[http://h/a.jsonl.zst,http://h/b.jsonl.xz,file:///c.jsonl]"
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", f"data_dir={tmp_path}/d", *CPU]
    args += ["stages=[data_preparation,training]", f"data_preparation.shards={shards}"]
    plan = build_plan(compose(args))
    prep, train = write_run_files(plan, args)
    found = directives(prep.read_text())
    assert found["--array"] == "0-2" and found["--cpus-per-task"] == "2"
    assert found["--output"].endswith("log-gptrain-download_shards_%A_%a.out")
    assert '--index "$SLURM_ARRAY_TASK_ID"' in prep.read_text() and "--cpus-per-task=2 " in prep.read_text()
    assert f"apply-blend --blend {tmp_path}/d/blend.yaml" in train.read_text()
    assert "--dependency" not in found  # none asked for
    args.append("data_preparation.run.dependency=singleton")  # as NeMo's download_gpt3_pile.yaml has
    prep, _ = write_run_files(build_plan(compose(args)), args)
    assert directives(prep.read_text())["--dependency"] == "singleton"


def test_data_preparation_workers_auto_takes_every_cpu_slurm_gives_the_task(tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", f"data_dir={tmp_path}/d", *CPU]
    args += ["stages=[data_preparation]", "data_preparation.shards=[http://h/a.jsonl.zst]"]
    args += ["data_preparation.workers=auto"]
    (prep,) = write_run_files(build_plan(compose(args)), args)
    assert "--cpus-per-task" not in directives(prep.read_text())
    srun = next(line for line in prep.read_text().splitlines() if line.startswith("srun "))
    assert '--cpus-per-task="$SLURM_CPUS_ON_NODE"' in srun
    from gptrain.launch.tokenize_step import worker_count

    assert worker_count("auto") == len(os.sched_getaffinity(0)) and worker_count(3) == 3


def test_local_training_uses_torchrun(tmp_path):
    args = [f"base_results_dir={tmp_path}", "training.trainer.num_nodes=1", "training.trainer.devices=2"]
    plan = build_plan(compose(args))
    command = plan.jobs[0].command
    assert command[1:7] == [
        "-m",
        "gptrain.parallel.torchrun",  # torchrun, with the workers' 75/76 passed on
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
        "-m",
    ]
    assert Path(command[-1]).name == "gpt3_126m_hydra.yaml"


WORKER_EXITS = {75: 75, 76: 76, 2: 2, 3: 1, 0: 0}  # a worker's exit: the local torchrun's
IN_TURN = """import json, sys
from gptrain.parallel.torchrun import main

print(json.dumps([main(["--standalone", "--nproc-per-node=2", worker]) for worker in sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def torchrun_codes(tmp_path_factory) -> tuple[dict[int, int], str]:
    """The local torchrun's exit code over 2 workers exiting with each of WORKER_EXITS, all run in
    turn in one process (a torch import each costs seconds), and its stderr."""
    root = tmp_path_factory.mktemp("torchrun_codes")
    workers = []
    for worker_exit in WORKER_EXITS:
        workers.append(root / f"worker_{worker_exit}.py")
        workers[-1].write_text(f"import sys\nsys.exit({worker_exit})\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", IN_TURN, *map(str, workers)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(WORKER_EXITS, json.loads(done.stdout.splitlines()[-1]), strict=True)), done.stderr


@pytest.mark.parametrize(("worker_exit", "expected"), WORKER_EXITS.items())
def test_local_torchrun_passes_on_the_workers_requeue_and_hang_codes(torchrun_codes, worker_exit, expected):
    """torchrun ends with 1 whatever its workers exited with: a local launch whose ranks stopped to
    be requeued reported a failure, and never printed how to resume."""
    codes, stderr = torchrun_codes
    assert codes[worker_exit] == expected, stderr[-2000:]


def signal_local_torchrun(tmp_path, worker_lines: list[str], signum: int, wait: float) -> tuple[int, str]:
    """Start the local torchrun wrapper over 2 workers running `worker_lines`, send it `signum` once
    both are ready, and return its exit code and stderr."""
    worker = tmp_path / "worker.py"
    ready = "open(sys.argv[1] + '/ready-' + str(time.time_ns()), 'w').close()"
    worker.write_text("\n".join(["import signal, sys, time", *worker_lines, ready, "time.sleep(60)", ""]))
    command = [sys.executable, "-m", "gptrain.parallel.torchrun", "--standalone", "--nproc-per-node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [*command, str(worker), str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready-*"))) < 2:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        process.send_signal(signum)
        _, err = process.communicate(timeout=wait)
    finally:
        process.kill()
    return process.returncode, err


def test_sigterm_to_local_torchrun_reaches_the_workers_which_save_and_exit_75(tmp_path):
    """torchrun stops on SIGTERM itself and kills its workers 30 s later, saved or not; it ended 1."""
    saving = ["signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))"]
    returncode, err = signal_local_torchrun(tmp_path, saving, signal.SIGTERM, wait=60)
    assert returncode == 75, err[-2000:]


def test_sigusr1_to_local_torchrun_reaches_the_workers_as_sigusr1_which_save_and_exit_75(tmp_path):
    """Slurm's warning signal (documented: checkpoint at the next step, exit 75) killed the wrapper
    (-10) and left its workers training with nobody watching them."""
    saving = ["signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))"]  # the run names the signal it got
    returncode, err = signal_local_torchrun(tmp_path, saving, signal.SIGUSR1, wait=60)
    assert returncode == 75, err[-2000:]


def test_ctrl_c_to_local_torchrun_ends_it_with_the_shells_130_not_a_traceback(tmp_path):
    """torchrun raises its SignalException out of main on SIGINT: Python's exit 1 and a traceback,
    which `gptrain status` read as a failed run."""
    returncode, err = signal_local_torchrun(tmp_path, [], signal.SIGINT, wait=90)
    assert returncode == 130, err[-2000:]
    assert "SignalException" not in err and "gptrain: stopped by SIGINT" in err  # (the worker's own may show)


def test_raw_is_not_quoted():
    from gptrain.launch.script_quoting import quote_command

    assert quote_command(["a b", Raw('"$X"')]) == "'a b' \"$X\""


def test_wandb_api_key_file_reaches_the_slurm_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*CPU, "cluster_type=slurm", "cluster.partition=cpu", "wandb_api_key_file=/secrets/wandb key"]
    [script_path] = write_run_files(build_plan(compose(args)), args)
    assert (
        "export WANDB_API_KEY=\"$(head -n 1 -- '/secrets/wandb key' | tr -d '[:space:]')\""
        in Path(script_path).read_text().splitlines()
    )


def test_percent_is_escaped_in_the_whole_output_path(tmp_path, monkeypatch):
    """Slurm expands %j anywhere in --output: `run%j` must stay a directory named run%j."""
    monkeypatch.chdir(tmp_path)
    args = [*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/b%x", "training.run.name=run%j"]
    plan = build_plan(compose(args))
    [script_path] = write_run_files(plan, args)
    output = directives(script_path.read_text())["--output"]
    assert output == f"{tmp_path}/b%%x/run%%j/log-gptrain-run%%j_%j.out"
    assert plan.jobs[0].log_path("42") == tmp_path / "b%x/run%j/log-gptrain-run%j_42.out"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.partition=gp\\u", "cluster.partition"),
        ("training.run.name=a\\b", "training.run.name"),
        ("cluster.job_name_prefix=p\\", "cluster.job_name_prefix"),
        ("training.run.dependency=after\\ok", "training.run.dependency"),
    ],
)
def test_a_backslash_in_an_sbatch_line_is_refused(override, key, tmp_path, monkeypatch):
    """sbatch reads a backslash in an #SBATCH line as an escape: the value would not arrive as written."""
    monkeypatch.chdir(tmp_path)
    args = [*CPU, "cluster_type=slurm", f"base_results_dir={tmp_path}/r", override]
    with pytest.raises(ConfigError, match="backslash") as error:
        write_run_files(build_plan(compose(args)), args)
    assert key in str(error.value) and "#SBATCH --" in str(error.value)
    assert not (tmp_path / "r").exists()


def test_a_local_launch_runs_the_launching_python_whatever_container_says(tmp_path, capsys):
    """A NeMo tree's config.yaml names an image; the local executor runs no container, but its
    scripts ran `python` from PATH (the image's, were there one): often a Python without gptrain
    or torch, so the stage failed with `No module named gptrain`."""
    import sys

    from gptrain.launch.launcher import launch_notes

    args = ["cluster_type=local", f"base_results_dir={tmp_path}/r", "training.trainer.num_nodes=1"]
    args += ["container=nvcr.io/nvidia/nemo:24.05"]
    plan = build_plan(compose(args))
    [job] = plan.jobs
    assert job.command[0] == sys.executable
    [script] = write_run_files(plan, args)
    assert f"exec {shlex.quote(sys.executable)} -m gptrain.parallel.torchrun" in script.read_text()
    [note] = launch_notes(plan, ["training"])
    assert note.startswith("note  container nvcr.io/nvidia/nemo:24.05 is not used by cluster_type=local")
    assert "has no gptrain" not in note  # the image is not what runs


def test_relative_paths_that_start_with_a_dash_stay_arguments(tmp_path, monkeypatch):
    """A relative run dir, blend file or exclude file named `-...` reached a command as a word of
    its own after its option (`--blend -b.yaml`), which argparse reads as an option: the training
    job failed at its start ('expected one argument') after data preparation had run; and the
    script itself was `bash -r/...`/`sbatch -r/...`."""
    from gptrain.cli import build_parser
    from gptrain.launch import download

    monkeypatch.chdir(tmp_path)
    args = [
        "cluster_type=slurm",
        "stages=[data_preparation,validation,training]",
        "training.run.results_dir=-r",
    ]
    args += ["data_preparation.shards=[http://h/a.jsonl]", "data_preparation.blend.file=-b.yaml"]
    args += [
        "validation.exclude_failed=true",
        "validation.exclude_file=-ex.txt",
        "data_preparation.run.results_dir=-d",
    ]
    plan = build_plan(compose(args))
    scripts = write_run_files(plan, args)
    assert all(not str(path).startswith("-") for path in scripts)
    validation, training = (job.command[job.command.index("-m") + 2 :] for job in plan.jobs[1:])
    parsed = build_parser().parse_args(validation)
    assert Path(parsed.exclude_file).resolve() == tmp_path / "-ex.txt"
    parsed = build_parser().parse_args(training)
    assert Path(parsed.config_file) == plan.jobs[2].config_path and Path(parsed.config_file).is_absolute()
    [setup] = plan.jobs[2].setup
    Path("-b.yaml").write_text("data_prefix: [1.0, /d/a_text_document]\n")
    assert download.main(setup[setup.index("apply-blend") :]) == 0  # argparse takes it, the blend is applied
    assert "/d/a_text_document" in plan.jobs[2].config_path.read_text()


def test_a_requeued_training_keeps_the_blend_of_its_first_start(tmp_path, monkeypatch, capsys):
    """The training's setup line re-read the shared blend (${data_dir}/blend.yaml) at every start of
    its job: a later data preparation into the same data_dir (another run's) switched a running
    training to that corpus at its next requeue. The job's first start freezes the blend into the run
    dir; a requeue reads that copy, and says in one line when the live blend differs."""
    import yaml

    from gptrain.launch import download

    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "stages=[data_preparation,training]", f"data_dir={tmp_path}/d"]
    plan = build_plan(compose([*args, "data_preparation.shards=[http://h/a.jsonl]"]))
    write_run_files(plan, args)
    job = plan.jobs[-1]
    [setup] = job.setup
    blend, frozen = tmp_path / "d" / "blend.yaml", job.run_dir / f"{job.run_name}_blend.yaml"
    blend.parent.mkdir()

    def start(job_id):  # one start of the batch script's job (a requeue keeps the job id)
        monkeypatch.setenv("SLURM_JOB_ID", job_id)
        assert download.main(setup[setup.index("apply-blend") :]) == 0
        config = yaml.safe_load(job.config_path.read_text())
        return config["model"]["data"]["data_prefix"], capsys.readouterr().err

    blend.write_text("data_prefix: [1.0, /d/a_text_document]\n")
    assert start("125") == ([1.0, "/d/a_text_document"], "")
    blend.write_text("data_prefix: [2.0, /d/b_text_document]\n")  # another data preparation, same data_dir
    assert start("125") == (
        [1.0, "/d/a_text_document"],
        f"gptrain: note: the blend {blend} differs from {frozen}, the copy job 125 took at its first start;"
        " the run keeps that copy's data: launch again (a new job) to train on the new blend\n",
    )
    assert start("126") == ([2.0, "/d/b_text_document"], "")  # a new launch's job reads it anew
    assert yaml.safe_load(frozen.read_text())["data_prefix"] == [2.0, "/d/b_text_document"]


def test_the_jobs_srun_lines_do_not_read_srun_variables_of_the_launching_shell(tmp_path, monkeypatch):
    """A launch from inside a Slurm job or step passed its srun input variables to the batch job
    (sbatch's --export=ALL), and the job's srun read them as its options: SLURM_EXPORT_ENV=NONE (a
    driver job submitted with --export=NONE) failed the step after the queue wait (`execve(): bash: No
    such file or directory`), SLURM_DISTRIBUTION=cyclic (`srun -m cyclic --pty bash`) placed rank 1
    on n2, every tensor-parallel group across nodes. Options on srun's command line beat its
    variables, and cluster.srun_args, after them, still wins (measured on the local Slurm 22.05)."""
    from gptrain.launch.sbatch_env import sbatch_environment, srun_variables_note

    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "stages=[data_preparation,validation,training]"]
    args += ["data_preparation.shards=[http://h/a.jsonl]", "cluster.srun_args=[-m,cyclic]"]
    plan = build_plan(compose(args))
    for script in write_run_files(plan, args):
        [srun] = [line.split() for line in script.read_text().splitlines() if line.startswith("srun ")]
        explicit = srun.index("--export=ALL")
        assert srun[explicit + 1] == "--distribution=block" and srun.index("-m") > explicit + 1
    # srun's other variables that place the ranks or set what they run with are left out of sbatch's
    environ = {"SLURM_CPU_BIND": "none", "SLURM_MPI_TYPE": "pmix", "SLURM_WORKING_DIR": "/x", "PATH": "/bin"}
    assert sbatch_environment(["#SBATCH --job-name=j"], environ) == {"PATH": "/bin"}
    assert srun_variables_note(environ) == (
        "note  srun's variables set in this shell, left out of the sbatch calls (the job's srun would read"
        " them as its options): SLURM_CPU_BIND (--cpu-bind), SLURM_MPI_TYPE (--mpi), SLURM_WORKING_DIR"
        " (--chdir); give such an option in cluster.srun_args"
    )
    assert srun_variables_note({"PATH": "/bin"}) is None


def test_no_srun_variable_of_an_enclosing_allocation_reaches_the_job(tmp_path):
    """The srun variables left out were a list of sixteen: SLURM_GPUS_PER_TASK (an `srun
    --gpus-per-task=8 --pty bash`) or SLURM_GPUS (`salloc --gpus=8`) reached the batch job, whose srun
    read them as its options (`srun: error: Invalid generic resource (gres) specification` after the
    queue wait, measured on the local Slurm 22.05). Every SLURM_*/SRUN_* variable is left out but those
    sbatch reads itself (SLURM_CONF; SLURM_HINT and SLURM_CLUSTERS, as its options)."""
    from gptrain.launch.sbatch_env import sbatch_environment, srun_variables_note

    environ = {"SLURM_GPUS_PER_TASK": "8", "SLURM_GPUS": "8", "SLURM_MEM_PER_NODE": "1000"}
    environ |= {"SRUN_CPUS_PER_TASK": "4", "SLURM_TRES_PER_TASK": "cpu:4", "SLURM_JOB_NODELIST": "n1"}
    kept = {"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_HINT": "nomultithread", "SLURM_CLUSTERS": "c1"}
    kept |= {"SBATCH_ACCOUNT": "a", "PATH": "/bin"}
    assert sbatch_environment(["#SBATCH --job-name=j"], environ | kept) == kept
    assert srun_variables_note(environ | kept) == (
        "note  srun's variables set in this shell, left out of the sbatch calls (the job's srun would read"
        " them as its options): SLURM_GPUS (--gpus), SLURM_GPUS_PER_TASK (--gpus-per-task),"
        " SLURM_MEM_PER_NODE (--mem), SRUN_CPUS_PER_TASK (--cpus-per-task), and 2 other SLURM_*/SRUN_*"
        " variables (SLURM_JOB_NODELIST, SLURM_TRES_PER_TASK); give such an option in cluster.srun_args"
    )


def test_the_note_inside_an_allocation_names_a_few_and_counts_the_rest():
    """Inside salloc the shell holds some 30 SLURM_* variables describing the allocation: the note
    listed them all in one line; it names 8 srun options and counts the rest."""
    from gptrain.launch.sbatch_env import SRUN_VARIABLES, srun_variables_note

    options = sorted(SRUN_VARIABLES)[:12]
    environ = {name: "1" for name in options} | {f"SLURM_ALLOC_{n}": "x" for n in range(20)}
    note = srun_variables_note(environ)
    assert [name for name in options if name in note] == options[:8]
    assert note.endswith(
        ": "
        + ", ".join(f"{n} (--{SRUN_VARIABLES[n]})" for n in options[:8])
        + (", and 24 other SLURM_*/SRUN_* variables; give such an option in cluster.srun_args")
    )


def test_more_shards_than_the_clusters_max_array_size_share_its_array_tasks(tmp_path):
    """sbatch refuses an array task id at or above MaxArraySize (Slurm's default 1001 refused
    `--array=0-1499`): past it each task prepares every n-th shard, each shard exactly once;
    data_preparation.run.node_array_size caps the tasks at once (`%N`), as NeMo's launcher does."""
    from gptrain.launch.download import task_shards

    shards = [f"http://h/{n:02d}.jsonl.zst" for n in range(10)]
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", f"data_dir={tmp_path}/d", *CPU]
    args += ["stages=[data_preparation]", f"data_preparation.shards=[{','.join(shards)}]"]
    args += ["data_preparation.run.node_array_size=3"]
    (prep,) = write_run_files(build_plan(compose(args), max_array_size=4), args)
    assert directives(prep.read_text())["--array"] == "0-3%3"
    srun = next(line for line in prep.read_text().splitlines() if line.startswith("srun "))
    assert srun.endswith('--index "$SLURM_ARRAY_TASK_ID" --stride 4')
    cfg = {"shards": shards}
    done = [shard for task in range(4) for shard in task_shards(cfg, task, 4)]
    assert sorted(done) == list(range(10)) and task_shards(cfg, 1, 4) == [1, 5, 9]
    (prep,) = write_run_files(build_plan(compose(args[:-1]), max_array_size=10), args)
    assert directives(prep.read_text())["--array"] == "0-9" and "--stride" not in prep.read_text()


def test_node_array_size_must_be_a_count(tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "stages=[data_preparation]"]
    args += ["data_preparation.shards=[http://h/a.jsonl]", "data_preparation.run.node_array_size=0"]
    with pytest.raises(ConfigError, match=r"data_preparation\.run\.node_array_size: expected a whole number"):
        build_plan(compose(args))


def test_a_dependency_of_any_of_is_refused_before_a_stage_is_queued(tmp_path, monkeypatch):
    """The training's `afterok:<data preparation>` is joined to run.dependency with ','; a '?' in it
    made sbatch refuse the training once the data preparation was already queued."""
    monkeypatch.chdir(tmp_path)
    args = [
        *CPU,
        "cluster_type=slurm",
        "stages=[data_preparation,training]",
        "data_preparation.shards=[http://h/a]",
    ]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, "training.run.dependency=afterany:55?afterok:56"]))
    assert str(error.value) == (
        "training.run.dependency='afterany:55?afterok:56': '?' (any of) cannot be joined to the afterok on the"
        " data_preparation stage this launch adds (Slurm takes one kind of separator in a dependency); use ','"
        " (all of), or launch the training stage on its own (stages=[training])"
    )
    build_plan(compose([*args, "training.run.dependency=afterany:55,singleton"]))  # all of: joins
    build_plan(
        compose([*CPU, "cluster_type=slurm", "training.run.dependency=afterany:55?afterok:56"])
    )  # alone


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        # bcm.yaml's (and NeMo's): both ask for 8 GPUs per node
        ([], {"--gres": "gpu:8"}),
        (["cluster.gres=gpu:h100:8"], {"--gres": "gpu:h100:8"}),
        (["cluster.gres=null"], {"--gpus-per-node": "8"}),
        (["cluster.gpus_per_node=null"], {"--gres": "gpu:8"}),
        (["cluster.gres=nvme:1"], {"--gres": "nvme:1", "--gpus-per-node": "8"}),  # no GPU in the gres
    ],
)
def test_gpus_per_node_are_asked_for_once(tmp_path, monkeypatch, cluster, expected):
    """Slurm 26.05 made --gres=gpu:N and --gpus-per-node mutually exclusive ('sbatch: fatal:
    --gpus-per-node and --gres=gpu are mutually exclusive.'), and the bundled bcm.yaml, like NeMo's,
    sets both: every GPU launch was refused there. One request goes to sbatch now."""
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *cluster]
    [path] = write_run_files(build_plan(compose(args)), args)
    found = directives(path.read_text())
    assert {key: found[key] for key in ("--gres", "--gpus-per-node") if key in found} == expected


def test_a_gres_and_gpus_per_node_that_disagree_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", "cluster.gres=gpu:a100:4"]
    with pytest.raises(ConfigError) as error:
        write_run_files(build_plan(compose(args)), args)
    assert str(error.value) == (
        "cluster.gres=gpu:a100:4 asks for 4 GPUs per node and cluster.gpus_per_node for 8; give one of them"
        " (the other null)"
    )


def test_pyxis_options_given_as_two_words_are_dropped_with_their_value(tmp_path):
    """Without a container, srun_args' pyxis options are dropped (srun fails on them); one given as
    an sbatch script's srun line often has it, `--container-mounts /fsx`, left its value behind,
    and srun ran `/fsx` as the command. The value goes with its option; other options stay."""
    srun_args = "[-l,--container-mounts,/fsx,--container-workdir,/w,--no-container-mount-home,--mpi,pmix]"
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, f"cluster.srun_args={srun_args}"]
    [path] = write_run_files(build_plan(compose(args)), args)
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    assert words[words.index("-l") : words.index("bash")] == ["-l", "--mpi", "pmix"]


@pytest.mark.parametrize(
    "given, word, option, key",
    [
        ("-l -N 1", "-N", "nodes", "training.trainer.num_nodes"),
        ("[-lN2]", "-lN2", "nodes", "training.trainer.num_nodes"),
        ("--nodes=1 --mpi=pmix", "--nodes=1", "nodes", "training.trainer.num_nodes"),
        ("[-n,'16']", "-n", "ntasks", "training.trainer.num_nodes and training.trainer.devices"),
        ("--ntasks-per-node 8", "--ntasks-per-node", "ntasks-per-node", "training.trainer.devices"),
    ],
)
def test_srun_args_that_set_the_steps_nodes_or_tasks_are_refused(tmp_path, given, word, option, key):
    """srun takes the last of an option given twice, and srun_args follow gptrain's own: `-N 1` (an
    srun line's options copied whole, as the Azure tutorial's `srun -p ndmv4 -N 1 ...`) ran the
    training on one node of a two-node job, with fewer ranks than its config, found as it started."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "training.trainer.num_nodes=2"]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
    assert str(error.value) == (
        f"cluster.srun_args: {word!r} sets srun's --{option}, which gptrain renders on each srun line itself;"
        f" use {key} instead"
    )
    ok = "cluster.srun_args=[-lJ,step,--comment=-N,--nodelist=n1]"  # a value is no option; --nodelist is not --nodes
    build_plan(compose([*args, ok]))
    wrapper = (
        "cluster.srun_args=[-l,nsys,profile,-n,'false',--stats=true]"  # nsys's -n: --inherit-environment
    )
    build_plan(compose([*args, wrapper]))


@pytest.mark.parametrize(
    "given, error",
    [
        (
            "--lab Data",
            "splits into 'Data' after '--lab', which takes no value, or only one in the same word",
        ),
        ("[--mpi=pmix,--unbuf,x]", None),  # a list is not split: x is no stray word, and stays
        ("--ntasks-per-n=4", "'--ntasks-per-n=4' sets srun's --ntasks-per-node"),
        ("[-l,--ntasks=2]", "'--ntasks=2' sets srun's --ntasks,"),  # a full name, as before
        ("--tasks 4", "'--tasks' sets srun's --tasks-per-node"),
    ],
)
def test_srun_args_checks_read_a_long_options_unique_prefix_as_srun_does(tmp_path, given, error):
    """srun reads a unique prefix of a long option as the option (`--lab` is --label): the checks
    for a word srun would run as its command and for options that set the step's tasks knew full
    names only, so `--lab Data` and `--ntasks-per-n=4` passed and failed (or ran with another
    layout) after the queue wait."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]
    if error is None:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
        return
    with pytest.raises(ConfigError) as raised:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
    assert error in str(raised.value)


@pytest.mark.parametrize(
    "given, word",
    [
        ("[--export=NCCL_DEBUG=INFO]", "--export=NCCL_DEBUG=INFO"),
        ("--export NONE -l", "--export"),
        ("[-l,--exp,NCCL_DEBUG=INFO]", "--exp"),  # srun reads a unique prefix as the option
        ("--expor=ALLX", "--expor=ALLX"),
        ("[--export]", "--export"),  # its value would be the `bash` srun runs
    ],
)
def test_srun_args_that_export_less_than_all_are_refused(tmp_path, given, word):
    """srun's --export without ALL passes only the variables it names (and SLURM_*): after gptrain's
    pinned --export=ALL it won, and every step failed as it started, after the queue wait ("execve():
    bash: No such file or directory", measured on the local Slurm 22.05), without PATH, env_vars or
    the rendezvous variables. Refused, naming the key; ALL with more variables stays."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
    assert str(error.value) == (
        f"cluster.srun_args: {word!r} sets srun's --export without ALL, so the ranks would start without"
        " PATH, env_vars or the rendezvous variables; give the variables as env_vars or cluster.env_vars"
        " (or --export=ALL,NAME=value)"
    )
    kept = ["[--export=ALL,NCCL_DEBUG=INFO]", "--export all -l", "[--exp=ALL]"]
    kept.append("[-l,nsys,profile,--export=sqlite]")  # the wrapper's own option, after srun's
    for given in kept:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))


def test_an_srun_export_keeps_the_environment_with_all_anywhere_before_none_and_the_last_one_counts(tmp_path):
    """srun walks the whole --export list and keeps the environment when any item before a NONE is
    ALL (any case): `--export=FOO=1,ALL` was refused as "without ALL". The last --export given is the
    one srun takes, so `--export=NONE --export=ALL` keeps it and `--export=ALL --export=FOO=1` does not."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]
    for given in ("['--export=FOO=1,ALL']", "['--export=FOO=1,all,BAR=2']", "[--export=NONE,--export=ALL]"):
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
    for given, word in (
        ("['--export=FOO=1,NONE,ALL']", "--export=FOO=1,NONE,ALL"),  # srun stops reading at NONE
        ("[--export=ALL,--export=FOO=1]", "--export=FOO=1"),
        ("['--export=FOO=1,ALLX']", "--export=FOO=1,ALLX"),
    ):
        with pytest.raises(
            ConfigError, match=f"^cluster.srun_args: '{word}' sets srun's --export without ALL"
        ):
            build_plan(compose([*args, f"cluster.srun_args={given}"]))


def test_an_ambiguous_srun_option_prefix_is_left_to_srun(tmp_path):
    """`--nod` could be --nodefile, --nodelist or --nodes, and `--c` many: srun refuses such a
    prefix itself; the checks take a word after it for its value, as after an option they do not know."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "cluster.srun_args=--nod 1 --c x"]
    [path] = write_run_files(build_plan(compose(args)), args)
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    assert words[words.index("--nod") : words.index("bash")] == ["--nod", "1", "--c", "x"]


@pytest.mark.parametrize(
    "given", ["[--container,/oci/bundle,-l]", "'--container /oci/bundle -l'", "[--container=/oci/bundle,-l]"]
)
def test_slurms_own_container_option_is_no_pyxis_option_and_stays(tmp_path, given):
    """srun's --container (an OCI bundle, Slurm's own) was dropped with pyxis's options where
    `container` is null, its value left behind: srun ran `/oci/bundle` as the command. It stays."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, f"cluster.srun_args={given}"]
    [path] = write_run_files(build_plan(compose(args)), args)
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    kept = words[
        words.index("--kill-on-bad-exit=1") + 5 : words.index("bash")
    ]  # after --nodes, --ntasks-per-node, --export, --distribution
    assert " ".join(kept).replace("=", " ") == "--container /oci/bundle -l"


def exported(script: str) -> dict[str, str]:
    """The `export NAME=value` lines of a script, with their value as bash reads it."""
    found = {}
    for line in script.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            found[name] = "".join(shlex.split(value))
    return found


def test_a_null_in_env_vars_keeps_the_cluster_profiles_value(tmp_path):
    """NeMo's config.yaml ships NCCL_TOPO_FILE, NCCL_IB_TIMEOUT, ... as null (NeMo renders nothing for
    them); with the Azure profile, those nulls wiped its interconnect settings from the job. A null
    is now "not set here"; the profile's variable is removed in the cluster's own key."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "cluster=azure_nd_a100_v4"]
    nemo_nulls = [
        "+env_vars.NCCL_TOPO_FILE=null",
        "+env_vars.NCCL_IB_TIMEOUT=null",
        "+env_vars.NCCL_DEBUG=null",
    ]
    [path] = write_run_files(build_plan(compose([*args, *nemo_nulls, "+env_vars.NCCL_PROTO=null"])), args)
    env = exported(path.read_text())
    assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv4-topo.xml" and env["NCCL_IB_TIMEOUT"] == "22"
    assert env["NCCL_DEBUG"] == "WARN" and "NCCL_PROTO" not in env
    removed = [
        "cluster.env_vars.NCCL_TOPO_FILE=null",
        "~cluster.env_vars.NCCL_IB_TIMEOUT",
        "env_vars.NCCL_DEBUG=INFO",
    ]
    [path] = write_run_files(build_plan(compose([*args, *nemo_nulls, *removed])), args)
    env = exported(path.read_text())
    assert "NCCL_TOPO_FILE" not in env and "NCCL_IB_TIMEOUT" not in env and env["NCCL_DEBUG"] == "INFO"


def test_an_env_var_overriding_the_profiles_comes_after_the_users_earlier_ones(tmp_path):
    """env_vars over a cluster profile's variable were exported in the profile's place, before the
    user's own: `{IFACE: ens5, NCCL_SOCKET_IFNAME: $IFACE}` with aws_p4d exported NCCL_SOCKET_IFNAME
    before IFACE, so it was empty on every node. The profile's other variables come first, then the
    user's in the user's order, as NeMo's `export K=V` lines stand."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "cluster=aws_p4d"]
    given = "env_vars={IFACE: ens5, NCCL_SOCKET_IFNAME: '$IFACE', NCCL_DEBUG: INFO}"
    [path] = write_run_files(build_plan(compose([*args, given])), args)
    exports = [line for line in path.read_text().splitlines() if line.startswith("export ")]
    names = [line[len("export ") :].partition("=")[0] for line in exports]
    profile = ["FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE"]  # not overridden
    user = names.index("IFACE")
    assert names.index("NCCL_SOCKET_IFNAME") == user + 1 and names.index("NCCL_DEBUG") == user + 2
    assert all(names.index(name) < user for name in profile)
    script = "\n".join([*exports, 'printf "%s|%s" "$NCCL_SOCKET_IFNAME" "$NCCL_DEBUG"'])
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env={})
    assert shell.stdout == "ens5|INFO"


@pytest.mark.parametrize(
    "given",
    [
        ["cluster.env_vars={IFACE: ens5, NCCL_SOCKET_IFNAME: '$IFACE'}"],
        ["cluster.env_vars.IFACE=ens5", "cluster.env_vars.NCCL_SOCKET_IFNAME=$IFACE"],
    ],
)
def test_a_cluster_env_vars_override_of_the_profiles_variable_takes_the_users_place(tmp_path, given):
    """The order fix above covered env_vars only: `cluster.env_vars` overrides (the key the docs name
    for changing a profile's variable) set NCCL_SOCKET_IFNAME in the profile's place, before the
    IFACE the user wrote first, so it was exported empty. An overridden key moves into the user's
    order, for a mapping and for dotted keys alike."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "cluster=aws_p4d"]
    [path] = write_run_files(build_plan(compose([*args, *given])), args)
    exports = [line for line in path.read_text().splitlines() if line.startswith("export ")]
    names = [line[len("export ") :].partition("=")[0] for line in exports]
    assert names.index("NCCL_SOCKET_IFNAME") == names.index("IFACE") + 1
    script = "\n".join([*exports, 'printf "%s" "$NCCL_SOCKET_IFNAME"'])
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env={})
    assert shell.stdout == "ens5"


def test_srun_args_given_as_one_string_are_split_into_options(tmp_path):
    """`cluster.srun_args: "--mpi=pmix -l"` (an srun line's options copied whole) reached srun as one
    word, `'--mpi=pmix -l'`, which srun cannot read. A string is split as a shell splits it."""
    srun_args = "cluster.srun_args=--mpi=pmix -l --comment='run 3'"
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, srun_args]
    [path] = write_run_files(build_plan(compose(args)), args)
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    assert words[words.index("--mpi=pmix") : words.index("bash")] == ["--mpi=pmix", "-l", "--comment=run 3"]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args[:-1], "cluster.srun_args=--comment='run 3"]))
    assert str(error.value) == (
        'cluster.srun_args: "--comment=\'run 3" cannot be split into options (No closing quotation);'
        " close the quote, or give a list (cluster.srun_args=[a,b])"
    )


@pytest.mark.parametrize(
    "given, stray",
    [
        ("--container-mounts=/lustre/My Data:/data", "Data:/data"),  # a path with a space, unquoted
        ("--container-mounts /lustre/My Data:/data", "Data:/data"),
        ("pmix --label", "pmix"),
    ],
)
def test_a_word_of_srun_args_srun_would_run_as_its_command_is_refused(tmp_path, given, stray):
    """A split srun_args string whose word is neither an option nor the value of the option before
    it reached srun as its command, run on every node once the job left the queue. Refused naming
    the key; an option's value after a space stays one (`--mpi pmix`)."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
    assert str(error.value) == (
        f"cluster.srun_args: {given!r} splits into {stray!r}, which is neither an option nor the value of"
        " the option before it (srun would run it as the command); quote a value with a space, or give a"
        " list (cluster.srun_args=[a,b])"
    )
    ok = "cluster.srun_args=--mpi pmix -l --container-mounts '/lustre/My Data:/data'"
    [path] = write_run_files(build_plan(compose([*args, ok])), [*args, ok])
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    assert words[words.index("--mpi") : words.index("bash")] == ["--mpi", "pmix", "-l"]


@pytest.mark.parametrize(
    "given, stray, before, why",
    [
        ("-l Data", "Data", "-l", "takes no value, or only one in the same word"),
        ("--mpi=pmix --label Data", "Data", "--label", "takes no value, or only one in the same word"),
        (
            "--no-container-mount-home /fsx",
            "/fsx",
            "--no-container-mount-home",
            "takes no value, or only one in the same word",
        ),
        ("-lu x", "x", "-lu", "takes no value, or only one in the same word"),  # bundled flags
        ("--nice 5", "5", "--nice", "takes no value, or only one in the same word"),  # optional: --nice=5
        ("-N2 x", "x", "-N2", "has its value already"),
        ("-- x", "x", "--", "ends srun's options"),
        # -k is --no-kill[=off]: srun 22.05 reads `-kN` as --no-kill=N, so `2` is the command
        ("-kN 2", "2", "-kN", "has its value already"),
    ],
)
def test_a_word_after_an_srun_option_that_takes_no_value_is_refused(tmp_path, given, stray, before, why):
    """`-l Data` passed: any word after any option was taken for its value, yet srun's -l takes none
    and srun ran `Data` as the command on every node, after the queue wait. srun's own options are
    known (srun 22.05 parses each as this test expects); a word after an unknown one may be its value."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, f"cluster.srun_args={given}"]))
    assert str(error.value) == (
        f"cluster.srun_args: {given!r} splits into {stray!r} after {before!r}, which {why}: srun would run"
        f" {stray!r} as the command; remove it, or attach an optional value (--nice=5, -I5)"
    )
    ok = "cluster.srun_args=-lJ step -K --nice=5 --container-image img -I5 --mpi pmix --new-option x"
    [path] = write_run_files(build_plan(compose([*args, ok])), [*args, ok])
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    kept = [
        "-lJ",
        "step",
        "-K",
        "--nice=5",
        "-I5",
        "--mpi",
        "pmix",
        "--new-option",
        "x",
    ]  # no pyxis: no image
    assert words[words.index("-lJ") : words.index("bash")] == kept


def test_a_list_item_holding_several_srun_options_is_refused(tmp_path):
    """A list reaches srun one word per item (as NeMo's shlex.join renders it): an item holding two
    options reached srun as one it cannot read, failing every node after the queue wait."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, "cluster.srun_args=['--mpi=pmix --label']"]))
    assert str(error.value) == (
        "cluster.srun_args: the item '--mpi=pmix --label' reaches srun as one word (a list gives one word"
        " per item); give each option its own item, or all of them as one string"
        " (cluster.srun_args='--mpi=pmix --label')"
    )


def test_a_list_of_options_and_their_values_is_rendered_one_word_each(tmp_path):
    """A value that starts with a dash is no option (`--comment=c -3`), and words after the options
    stay (a wrapper srun runs, as on NeMo's srun line)."""
    given = "cluster.srun_args=[--mpi,pmix,-l,--comment,a -b,--comment=c -3,nsys,profile]"
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, given]
    [path] = write_run_files(build_plan(compose(args)), args)
    srun = next(line for line in path.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun.removesuffix(" &"))
    kept = ["--mpi", "pmix", "-l", "--comment", "a -b", "--comment=c -3", "nsys", "profile"]
    assert words[words.index("--mpi") : words.index("bash")] == kept
