"""Container jobs (pyxis): every step runs in the image, and sees the directories the launch wrote for it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.compose import compose
from gptrain.launch.mounts import container_mounts, make_mount_dirs
from gptrain.launch.stages import build_plan, config_path, write_run_files

CPU = ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]
NASTY = "a b;touch owned"
NEMO_CONF = Path(__file__).parents[1] / "config/nemo_launcher/23.07/launcher_scripts/conf"

SRUN = (
    'n=$(ls "$STUB_LOG" | wc -l); printf \'%s\\0\' "$@" > "$STUB_LOG/srun-$n.argv"; exit "${SRUN_EXIT:-0}"\n'
)
PYXIS_ENV = "${PYXIS_CONTAINER_ENV:+,$PYXIS_CONTAINER_ENV}"
SCONTROL = 'case "$1 $2" in "show hostnames") echo n1 ;; esac\n'


def stub_bin(tmp_path: Path, **scripts: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def step_words(line: str) -> list[str]:
    """A script line as bash splits it, without the trailing `|| exit 1` or `&`."""
    words = shlex.split(line.removesuffix(" &"))
    return words[:-3] if words[-3:] == ["||", "exit", "1"] else words


def prepare_and_train(tmp_path: Path, *extra: str) -> tuple[list[str], object]:
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/{NASTY}", f"data_dir={tmp_path}/d", *CPU]
    args += ["stages=[data_preparation,training]", "data_preparation.shards=[https://h/a.jsonl.zst]", *extra]
    plan = build_plan(compose(args))
    return write_run_files(plan, args), plan


def test_with_a_container_the_blend_is_applied_inside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = [
        "container=/apps/my image.sqsh",
        "container_mounts=[/fsx:/fsx]",
        "cluster.srun_args=[--mpi=pmix]",
    ]
    (prep, train), plan = prepare_and_train(tmp_path, *image)
    lines = train.read_text().splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("srun ")]
    assert len(steps) == 2 and not [
        line for line in lines if "-m gptrain" in line and not line.startswith("srun ")
    ]
    setup, training = (step_words(lines[i]) for i in steps)
    assert "apply-blend" in setup and lines[steps[0]].endswith(
        " || exit 1"
    )  # first, and the job stops if it fails
    assert setup[:5] == [
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=1",
        "--ntasks=1",
        "--export=ALL",
    ]  # one task, in the image
    options = training[
        6 : training.index("bash")
    ]  # after srun --kill-on-bad-exit --nodes --ntasks-per-node --export --distribution
    base, data = f"{tmp_path}/{NASTY}", f"{tmp_path}/d"
    exported = "PYTHONUNBUFFERED,GPTRAIN_SIGNAL_SECONDS,TOKENIZERS_PARALLELISM,OMP_NUM_THREADS"
    pyxis_env = "${PYXIS_CONTAINER_ENV:+,$PYXIS_CONTAINER_ENV}"  # expanded by the job's shell
    assert options == [
        "--container-image=/apps/my image.sqsh",
        f"--container-mounts={base}:{base},{data}:{data},/fsx:/fsx",
        f"--container-env={exported},MASTER_ADDR,MASTER_PORT{pyxis_env}",  # the image's values lose
        "--mpi=pmix",
    ]
    [job] = [j for j in plan.jobs if j.stage == "training"]
    command = ["python", "-m", "gptrain.launch.download", "apply-blend", "--blend", f"{data}/blend.yaml"]
    frozen = ["--frozen", str(job.frozen_blend_path)]  # the copy a requeue reads, in the run dir
    setup_options = [
        *options[:2],
        f"--container-env={exported}{pyxis_env}",
        *options[3:],
    ]  # no rendezvous yet
    assert setup[5:] == [*setup_options, *command, "--config", str(config_path(job)), *frozen]
    assert options[1] in step_words(next(x for x in prep.read_text().splitlines() if x.startswith("srun ")))


def test_the_containers_blend_step_runs_its_words_verbatim_and_stops_the_job_on_failure(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (_, train), _ = prepare_and_train(tmp_path, "container=img", f"python={tmp_path}/my py")
    bin_dir, log = stub_bin(tmp_path, srun=SRUN, scontrol=SCONTROL), tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "7"}
    env.update(SLURM_JOB_NODELIST="n1", SLURM_RESTART_COUNT="0")
    for code, steps in (("0", 2), ("1", 1)):  # a failed blend step: the training step never starts
        log.mkdir()
        done = subprocess.run(
            ["bash", str(train)], env={**env, "SRUN_EXIT": code}, capture_output=True, text=True
        )
        assert done.returncode == int(code), done.stderr
        argv = [(log / f"srun-{n}.argv").read_text().split("\0")[:-1] for n in range(steps)]
        assert len(list(log.iterdir())) == steps
        setup = next(line for line in train.read_text().splitlines() if "apply-blend" in line)
        # verbatim but for --container-env's PYXIS_CONTAINER_ENV, which the job's shell expands (unset: empty)
        words = [word.replace(PYXIS_ENV, "") for word in step_words(setup)[1:]]
        assert argv[0] == words and f"{tmp_path}/my py" in argv[0]
        assert not list(tmp_path.rglob("owned"))  # `;touch owned` in the results dir ran nothing
        subprocess.run(["rm", "-r", str(log)], check=True)


def test_without_a_container_the_blend_is_applied_by_the_launching_python(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (_, train), _ = prepare_and_train(tmp_path, "python=/opt/env/bin/python")
    [setup] = [line for line in train.read_text().splitlines() if "apply-blend" in line]
    assert step_words(setup)[:4] == ["/opt/env/bin/python", "-m", "gptrain.launch.download", "apply-blend"]
    assert "--container-mounts" not in train.read_text()


@pytest.mark.parametrize(
    ("base", "data", "user", "expected"),
    [
        ("/r", "/d", [], ["/r:/r", "/d:/d"]),
        ("/fsx/r", "/fsx/d", ["/fsx:/fsx"], ["/fsx:/fsx"]),  # a user mount holds both already
        ("/fsx/r", "/fsx/d", ["/fsx"], ["/fsx"]),  # pyxis: a lone path is mounted at itself
        (
            "/fsx/r",
            "/fsx/d",
            ["/lustre/d:/fsx/d:ro"],
            ["/fsx/r:/fsx/r", "/lustre/d:/fsx/d:ro"],
        ),  # theirs wins
        (
            "/fsx/r",
            "/fsx/d",
            ["/fsx:/mnt"],
            ["/fsx/r:/fsx/r", "/fsx/d:/fsx/d", "/fsx:/mnt"],
        ),  # elsewhere inside
        ("/x", "/x/data", ["/a:/a,/b:/b"], ["/x:/x", "/a:/a,/b:/b"]),  # data inside the results dir
        ("/x/", "/x", [], ["/x:/x"]),
        ("/fsx/r", "/fsx/d", ["/lustre:/fsx"], ["/lustre:/fsx"]),  # theirs would cover ours
        (
            "/fsx/r",
            "/fsx/d",
            ["/fsx/r/sub:/fsx/r/sub"],
            ["/fsx/r:/fsx/r", "/fsx/d:/fsx/d", "/fsx/r/sub:/fsx/r/sub"],
        ),
    ],
)
def test_the_jobs_dirs_are_mounted_once_and_ahead_of_the_users(base, data, user, expected):
    resolved = {"base_results_dir": base, "data_dir": data, "container_mounts": user}
    assert container_mounts(resolved, compose([]).config_root).items == expected


def test_a_user_mount_over_the_run_directory_is_refused_unless_it_shows_that_directory(tmp_path, monkeypatch):
    """A user mount whose destination covers the run directory lands on top of gptrain's mount
    (theirs come after ours), and gptrain left its own out: the job found the mount's source there,
    without the config the launch wrote, after the queue wait. Refused naming both, unless the
    source is the same directory (a symlink: /fsx -> /lustre); the last mount over it is the one seen."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "r4").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "r4")
    args = ["cluster_type=slurm", "container=img", f"base_results_dir={tmp_path}/r4/results", *CPU]
    run_dir = f"{tmp_path}/r4/results/gpt3_126m"
    for mounts in (
        [f"{tmp_path}/other:{tmp_path}/r4"],
        [f"{tmp_path}/r4", f"{tmp_path}/other:{tmp_path}/r4:ro"],
    ):
        with pytest.raises(ConfigError) as error:
            build_plan(compose([*args, f"container_mounts=[{','.join(mounts)}]"]))
        assert str(error.value) == (
            f"container_mounts: '{mounts[-1]}' is mounted over training.run.results_dir ({run_dir}), so the"
            f" job would find {tmp_path}/other/results/gpt3_126m there, not the run directory the launch writes"
            f" its config to; mount {tmp_path}/r4 itself there, or move the run directory (base_results_dir,"
            f" training.run.results_dir) outside {tmp_path}/r4"
        )
    for mounts in ([f"{tmp_path}/link:{tmp_path}/r4"], [f"{tmp_path}/other:{tmp_path}/r4", f"{tmp_path}/r4"]):
        plan = build_plan(compose([*args, f"container_mounts=[{','.join(mounts)}]"]))
        assert plan.top["container_mounts"][-len(mounts) :] == mounts
    with pytest.raises(ConfigError, match=r"would find an empty tmpfs there, not the run directory"):
        build_plan(compose([*args, f"container_mounts=[tmpfs:{tmp_path}/r4/results]"]))
    elsewhere = [
        *args,
        f"training.run.results_dir={tmp_path}/run",
        f"container_mounts=[{tmp_path}/other:{tmp_path}/r4]",
    ]
    build_plan(
        compose(elsewhere)
    )  # base_results_dir covered, the run directory not: the job reads nothing there


def test_a_read_only_user_mount_over_the_run_directory_is_refused(tmp_path, monkeypatch):
    """`/r4:/r4:ro` shows the run directory, so it passed the check above, and gptrain left its own
    writable mount out: the job started after the queue wait unable to write its log, config copy or
    checkpoints. Refused in one line naming the mount; a writable mount after it (the last counts) passes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r4").mkdir()
    args = ["cluster_type=slurm", "container=img", f"base_results_dir={tmp_path}/r4/results", *CPU]
    run_dir = f"{tmp_path}/r4/results/gpt3_126m"
    for mount in (
        f"{tmp_path}/r4:{tmp_path}/r4:ro",
        f"{tmp_path}/r4/results/:{tmp_path}/r4/results:rbind+ro",
    ):
        with pytest.raises(ConfigError) as error:
            build_plan(compose([*args, f"container_mounts=[{mount}]"]))
        assert str(error.value) == (
            f"container_mounts: '{mount}' mounts training.run.results_dir ({run_dir}) read-only, and the"
            " run directory must be writable (the job writes its log, config and checkpoints there): drop"
            f" ro from it, or mount {run_dir} writable after it"
        )
    writable = [f"{tmp_path}/r4:{tmp_path}/r4:ro", f"{tmp_path}/r4/results"]
    plan = build_plan(compose([*args, f"container_mounts=[{','.join(writable)}]"]))
    assert plan.top["container_mounts"][-2:] == writable


def test_a_nemo_tree_is_mounted_with_its_results_and_data(tmp_path, monkeypatch):
    """NeMo's config.yaml sets a container: the conf tree, results and data all reach the job."""
    monkeypatch.chdir(tmp_path)
    args = [
        f"launcher_scripts_path={tmp_path}",
        "training=gpt3/126m",
        "stages=[training]",
        "container_mounts=[/m]",
    ]
    [script] = write_run_files(build_plan(compose(args, NEMO_CONF)), args)
    words = step_words(next(x for x in script.read_text().splitlines() if x.startswith("srun ")))
    mounts = (
        f"{tmp_path}/results:{tmp_path}/results,{tmp_path}/data:{tmp_path}/data,{NEMO_CONF}:{NEMO_CONF},/m"
    )
    assert f"--container-mounts={mounts}" in words


def test_a_dir_pyxis_cannot_mount_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r:1", *CPU]
    write_run_files(build_plan(compose(args)), args)  # no container: nothing to mount
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, "container=img"]))
    assert str(error.value).startswith(
        f"base_results_dir: '{tmp_path}/r:1' cannot be mounted into the container"
    )
    assert "\n" not in str(error.value)


def test_a_launch_creates_the_dirs_it_mounts(tmp_path, capsys, monkeypatch):
    """pyxis cannot mount a source that does not exist: data_dir may not, before data preparation."""
    monkeypatch.chdir(tmp_path)
    sinfo = "echo 'n1|debug*|4|(null)|idle'\n"
    bin_dir = stub_bin(tmp_path, sinfo=sinfo, sbatch='echo 42 >> "$0.log"; echo 42\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    args = ["launch", "cluster_type=slurm", "container=img", f"data_dir={tmp_path}/new data", *CPU]
    args += [f"base_results_dir={tmp_path}/r", "training.trainer.num_nodes=1", "training.trainer.devices=1"]
    args += ["training.model.data.data_impl=mock", "training.model.data.mock_vocab_size=64"]
    assert main(["launch", "--dry-run", *args[1:]]) == 0
    assert not (tmp_path / "new data").exists()  # a dry run creates nothing outside dry-run/
    assert main(args) == 0
    assert (tmp_path / "new data").is_dir() and (bin_dir / "sbatch.log").read_text() == "42\n"
    assert "submitted training as Slurm job 42" in capsys.readouterr().err


def test_run_and_log_dirs_outside_base_results_dir_are_mounted(tmp_path, monkeypatch):
    """The job reads <run dir>/<name>_hydra.yaml and writes to explicit_log_dir, tensorboard_dir and the
    checkpoints' dirpath: wherever they are (before, a tensorboard_dir elsewhere was not mounted: its
    events stayed in the container)."""
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "container=img", f"base_results_dir={tmp_path}/r", f"data_dir={tmp_path}/d"]
    args += [
        f"training.run.results_dir={tmp_path}/scratch/run1",
        f"training.exp_manager.explicit_log_dir={tmp_path}/fsx/ckpt",
        f"training.exp_manager.tensorboard_dir={tmp_path}/tb",
        f"training.exp_manager.checkpoint_callback_params.dirpath={tmp_path}/lustre/ckpts",
    ]
    args += ["stages=[data_preparation,training]", "data_preparation.shards=[https://h/a.jsonl.zst]", *CPU]
    args += [
        f"data_preparation.run.results_dir={tmp_path}/prep",
        f"data_preparation.output_dir={tmp_path}/tok",
    ]
    args += [
        f"data_preparation.blend.file={tmp_path}/blends/b.yaml",
        f"training.model.data.index_mapping_dir={tmp_path}/r/idx",
    ]
    plan = build_plan(compose(args))
    expected = [
        "r",
        "d",
        "prep",
        "tok",
        "blends",
        "scratch/run1",
        "fsx/ckpt",
        "tb",
        "lustre/ckpts",
    ]  # r/idx: in r
    for script in write_run_files(plan, args):
        srun = next(x for x in script.read_text().splitlines() if x.startswith("srun "))
        mounts = ",".join(f"{tmp_path}/{name}:{tmp_path}/{name}" for name in expected)
        assert f"--container-mounts={mounts}" in step_words(srun)


def test_a_mount_dir_that_cannot_be_made_stops_the_launch_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    """A file where data_dir's parent should be: one line naming data_dir, no run files, no sbatch."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("")
    bin_dir = stub_bin(tmp_path, sinfo="echo 'n1|debug*|4|(null)|idle'\n", sbatch='echo 42 >> "$0.log"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    args = ["cluster_type=slurm", "container=img", f"data_dir={tmp_path}/taken/data", *CPU]
    args += [f"base_results_dir={tmp_path}/r", "training.trainer.num_nodes=1", "training.trainer.devices=1"]
    args += ["training.model.data.data_impl=mock", "training.model.data.mock_vocab_size=64"]
    assert main(["launch", *args]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"gptrain: error: data_dir: cannot create {tmp_path}/taken/data to mount it")
    assert not (tmp_path / "r").exists() and not (bin_dir / "sbatch.log").exists()  # nothing written
    assert main(["launch", "--dry-run", *args]) == 0  # a dry run shows the scripts and warns
    assert f"preflight: warning  data_dir: cannot create {tmp_path}/taken/data" in capsys.readouterr().err


def test_a_mount_dir_mkdir_refuses_is_a_one_line_error_naming_the_key(tmp_path):
    """What the preflight cannot foresee (root under /proc) still ends in one line, not a traceback."""
    (tmp_path / "taken").write_text("")
    with pytest.raises(LaunchError) as error:
        make_mount_dirs([("training.run.results_dir", f"{tmp_path}/taken/run")])
    assert str(error.value).startswith(f"training.run.results_dir: cannot create {tmp_path}/taken/run")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("container", ["img.sqsh", None])
@pytest.mark.parametrize("tokenizer", ["tok.model", "hf_tok"])  # a file, or a directory of files
def test_relative_paths_reach_a_container_job_absolute(tmp_path, monkeypatch, container, tokenizer):
    """pyxis starts the job in the image's WORKDIR (srun's --chdir does not carry into it), where
    the README's relative `data/corpus_text_document` would name nothing; outside a container the
    job's --chdir keeps them meaning what they mean at the launch, and they are left as written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok.model").write_text("x")
    (tmp_path / "hf_tok").mkdir()
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "stages=[training]"]
    args += ["training.model.data.data_prefix=[0.3,data/a_text_document,0.7,/abs/b_text_document]"]
    args += [
        "training.model.tokenizer.vocab_file=gpt2/vocab.json",
        f"training.model.tokenizer.model={tokenizer}",
    ]
    args += ["training.model.data.index_mapping_dir=cache", f"container={container or 'null'}"]
    training = build_plan(compose(args)).configs["training"]
    data, tok = training["model"]["data"], training["model"]["tokenizer"]
    if container:
        assert data["data_prefix"] == [0.3, f"{tmp_path}/data/a_text_document", 0.7, "/abs/b_text_document"]
        assert (
            tok["vocab_file"] == f"{tmp_path}/gpt2/vocab.json" and tok["model"] == f"{tmp_path}/{tokenizer}"
        )
        assert data["index_mapping_dir"] == f"{tmp_path}/cache"
    else:
        assert data["data_prefix"] == [0.3, "data/a_text_document", 0.7, "/abs/b_text_document"]
        assert tok["vocab_file"] == "gpt2/vocab.json" and data["index_mapping_dir"] == "cache"


def test_a_checkpoint_to_start_from_outside_the_results_is_mounted_and_absolute(tmp_path, monkeypatch):
    """exp_manager.resume_from_checkpoint on another filesystem (a pretrained run to continue) was
    neither mounted nor made absolute: inside the container the job found nothing there. A path
    that does not exist is not mounted (the training names it)."""
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fsx/pretrained/checkpoints").mkdir(parents=True)
    args = ["cluster_type=slurm", "container=img", f"base_results_dir={tmp_path}/r", f"data_dir={tmp_path}/d"]
    args += [
        "stages=[training]",
        *CPU,
        "training.exp_manager.resume_from_checkpoint=fsx/pretrained/checkpoints",
    ]
    plan = build_plan(compose(args))
    script = write_run_files(plan, args)[0]
    srun = next(x for x in script.read_text().splitlines() if x.startswith("srun "))
    mounts = next(w for w in step_words(srun) if w.startswith("--container-mounts="))
    source = f"{tmp_path}/fsx/pretrained/checkpoints"
    assert f"{source}:{source}" in mounts.split("=", 1)[1].split(",")
    written = yaml.safe_load(config_path(plan.jobs[0]).read_text())
    assert written["exp_manager"]["resume_from_checkpoint"] == source
    missing = ["training.exp_manager.resume_from_checkpoint=/nowhere/ckpt"]
    plan = build_plan(compose([*args[:-1], *missing]))
    script = write_run_files(plan, [*args[:-1], *missing])[0]
    assert "/nowhere" not in next(x for x in script.read_text().splitlines() if x.startswith("srun "))


@pytest.mark.parametrize(
    "srun_args",
    [
        "cluster.srun_args=[--container-image=nvcr.io/nvidia/nemo:24.12]",
        "cluster.srun_args=[-l,--container-image,nvcr.io/nvidia/nemo:24.12]",
    ],
)
def test_a_second_image_in_srun_args_is_refused_before_the_queue_wait(tmp_path, srun_args):
    """An image in srun_args (a tutorial's srun line copied) beside `container` went to srun as a
    second --container-image, which pyxis refuses as the step starts ('specified multiple times'):
    the job failed after its queue wait. The same image twice is what pyxis accepts."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "container=/apps/gptrain.sqsh"]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, srun_args]))
    assert str(error.value) == (
        "cluster.srun_args: --container-image nvcr.io/nvidia/nemo:24.12 beside container=/apps/gptrain.sqsh:"
        " pyxis refuses a second image when the job starts ('--container-image specified multiple times');"
        " give the image as container only"
    )
    same = "cluster.srun_args=[--container-image=/apps/gptrain.sqsh]"
    build_plan(compose([*args, same]))
    build_plan(compose([*args[:-1], "container=null", srun_args]))  # no container: pyxis options left out


@pytest.mark.parametrize(
    "srun_args", ["cluster.srun_args=null", "cluster.srun_args=[]", "cluster.srun_args=' '"]
)
@pytest.mark.parametrize("container", ["/apps/gptrain.sqsh", "null"])
def test_no_srun_args_launches_with_or_without_a_container(tmp_path, srun_args, container):
    """`srun_args: null` (or an empty list) beside a container, and a blank srun_args string with or
    without one, were a Python traceback (zip() argument 2 is shorter than argument 1)."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, f"container={container}"]
    [script] = write_run_files(build_plan(compose([*args, srun_args])), [*args, srun_args])
    srun = next(line for line in script.read_text().splitlines() if line.startswith("srun "))
    assert ("--container-image=/apps/gptrain.sqsh" in srun) is (container != "null")


@pytest.mark.parametrize(
    "mount, why",
    [
        ("data:/data", "its source 'data' is not a path starting with '/' or '.' (nor tmpfs or umount)"),
        ("/fsx:fsx", "its destination 'fsx' is not a path starting with '/' or '.'"),
        ("/fsx:", "an empty source or destination"),
        ("/fsx,,/apps", "an empty mount"),
    ],
)
def test_a_mount_pyxis_refuses_is_refused_before_the_queue_wait(tmp_path, mount, why):
    """pyxis checks each --container-mounts entry only as the job starts (`data:/data`: 'mount source
    must be a relative path, an absolute path, "tmpfs" or "umount"'), so the job failed after its
    queue wait; its rules are applied at launch. Paths, ./relative ones and tmpfs still pass."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", *CPU, "container=/apps/gptrain.sqsh"]
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*args, f"container_mounts=['{mount}']"]))
    assert str(error.value) == (
        f"container_mounts: {mount!r}: {why}, which pyxis refuses as the job starts; give SRC[:DST[:FLAGS]]"
        " with absolute paths (or ./relative ones)"
    )
    fine = "container_mounts=['/fsx','./data:/data:ro+rprivate','tmpfs:/scratch,/apps:/apps']"
    [path] = write_run_files(build_plan(compose([*args, fine])), [*args, fine])
    srun = step_words(next(line for line in path.read_text().splitlines() if line.startswith("srun ")))
    mounts = next(word for word in srun if word.startswith("--container-mounts="))
    assert mounts.endswith(",/fsx,./data:/data:ro+rprivate,tmpfs:/scratch,/apps:/apps")


def test_a_home_relative_dirpath_and_tensorboard_dir_name_the_same_place_in_train_and_launch(
    tmp_path, monkeypatch
):
    """`dirpath: ~/ckpts` in a YAML file: train expanded ~ (<home>/ckpts) but launch made it
    <cwd>/~/ckpts, and tensorboard_dir=~/tb was <cwd>/~/tb in both. Both commands expand ~ first."""
    import yaml

    from gptrain.config import load_training_config
    from gptrain.config.loader import preset_path
    from gptrain.launch.mounts import with_absolute_paths

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    keys = {"tensorboard_dir": "~/tb", "checkpoint_callback_params": {"dirpath": "~/ckpts"}}
    launched = with_absolute_paths({"training": {"exp_manager": keys}})["training"]["exp_manager"]
    assert launched["tensorboard_dir"] == f"{home}/tb"
    assert launched["checkpoint_callback_params"]["dirpath"] == f"{home}/ckpts"
    preset = yaml.safe_load(Path(preset_path("gpt3/126m")).read_text())
    preset["exp_manager"]["tensorboard_dir"] = "~/tb"
    preset["exp_manager"].setdefault("checkpoint_callback_params", {})["dirpath"] = "~/ckpts"
    (work / "train.yaml").write_text(yaml.safe_dump(preset))
    em = load_training_config(config_file="train.yaml", report_ignored=False).exp_manager
    assert (em.tensorboard_dir, em.checkpoint_callback_params.dirpath) == (f"{home}/tb", f"{home}/ckpts")


def test_nemos_filepath_gives_the_mounted_dirpath_as_training_reads_it(tmp_path, monkeypatch):
    """NeMo's deprecated filepath is dirpath=<its directory> for training, but launch neither mounted
    that directory nor made a relative one absolute: the job saved inside the container."""
    from gptrain.launch.mounts import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    given = {"training": {"exp_manager": {"checkpoint_callback_params": {"filepath": "ck/megatron_gpt"}}}}
    params = with_absolute_paths(given)["training"]["exp_manager"]["checkpoint_callback_params"]
    assert params["dirpath"] == f"{tmp_path}/ck"
    args = ["cluster_type=slurm", "container=img", f"base_results_dir={tmp_path}/r", f"data_dir={tmp_path}/d"]
    args += [
        "stages=[training]",
        *CPU,
        f"training.exp_manager.checkpoint_callback_params.filepath={tmp_path}/lustre/m",
    ]
    for script in write_run_files(build_plan(compose(args)), args):
        srun = next(x for x in script.read_text().splitlines() if x.startswith("srun "))
        assert f"{tmp_path}/lustre:{tmp_path}/lustre" in next(w for w in step_words(srun) if "mounts" in w)
