"""Issue 14, case 1: a newline (or any control character) in a value that reaches a job script.

sbatch reads `#SBATCH` lines one at a time, so a quoted newline ended the directive and the rest
of the value ran in the batch shell. Such values are now a one-line error naming the key, at
compose time, before any file is written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.errors import ConfigError
from gptrain.launch.compose import CONFIG_ROOT, compose
from gptrain.launch.sbatch import Job, render_slurm
from gptrain.launch.sbatch_directives import directive
from gptrain.launch.script_values import check_value
from gptrain.launch.stages import build_plan, write_run_files

# The issue's keys, each given the issue's value as a YAML double-quoted override.
ISSUE_KEYS = [
    "cluster.partition",
    "cluster.account",
    "cluster.nodelist",
    "cluster.mem",
    "cluster.job_name_prefix",
    "training.run.time_limit",
    "training.run.dependency",
    "base_results_dir",
]
MORE_KEYS = ["cluster.gres", "training.run.name", "container", "env_vars.NCCL_DEBUG", "cluster.env_vars.X"]


def injected(canary: Path) -> str:
    """The issue's value: a quoted override holding a newline (as `key="x<Enter>touch ..."` in a shell)."""
    return f'"x\ntouch {canary} #"'


@pytest.mark.parametrize("key", ISSUE_KEYS + MORE_KEYS)
def test_newline_in_a_script_value_is_a_one_line_error_and_nothing_is_written(
    key, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    canary = tmp_path / "owned"
    results = tmp_path / "results"
    args = [
        "launch",
        "--dry-run",
        "cluster_type=slurm",
        f"base_results_dir={results}",
        f"{key}={injected(canary)}",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptrain: error: ") and "\n" not in err
    assert key in err and "a newline" in err
    assert not results.exists() and not canary.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_newline_from_a_conf_file_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf"
    shutil.copytree(CONFIG_ROOT, conf)
    bcm = conf / "cluster" / "bcm.yaml"
    text = re.sub(r"(?m)^account: .*$", lambda _: 'account: "x\\ntouch owned #"', bcm.read_text())
    bcm.write_text(text)
    with pytest.raises(ConfigError, match=r"cluster\.account: .* contains a newline"):
        build_plan(compose(["cluster_type=slurm", f"base_results_dir={tmp_path}/r"], root=conf))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("a\rb", "a carriage return"),
        ("a\x00b", "a NUL byte"),
        ("a\x1bb", "0x1b"),
        ("a\tb", "a tab"),
        ("a\x7f", "0x7f"),
    ],
)
def test_every_control_character_is_refused(value, name):
    with pytest.raises(ConfigError, match=name):
        check_value("cluster.partition", value)


def test_lists_and_nested_keys_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"cluster\.srun_args\[1\]"):
        build_plan(compose(["cluster_type=slurm", 'cluster.srun_args=[--a, "b\nc"]']))
    with pytest.raises(ConfigError, match=r"container_mounts\[0\]"):
        build_plan(compose(["cluster_type=slurm", 'container_mounts=["/a:/b\n"]']))


def test_job_name_prefix_never_reaches_a_file_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for prefix in ('"p\n"', "a/b-"):
        with pytest.raises(ConfigError, match="cluster.job_name_prefix"):
            build_plan(
                compose(
                    [
                        "cluster_type=slurm",
                        f"base_results_dir={tmp_path}",
                        f"cluster.job_name_prefix={prefix}",
                    ]
                )
            )
    assert list(tmp_path.iterdir()) == []


def test_renderer_refuses_a_newline_even_when_called_directly(tmp_path):
    """The last line of defence, for a value that did not come through the launch config."""
    with pytest.raises(ConfigError, match="#SBATCH --partition"):
        directive("partition", "gpu\ntouch x")
    job = Job("training", "r", "r", tmp_path, ["true"])
    with pytest.raises(ConfigError, match="cluster.srun_args"):
        render_slurm(job, {"srun_args": ["--x\n"]}, {})


SHIPPED = [
    ["training.trainer.num_nodes=1"],
    ["cluster_type=slurm"],
    [
        "cluster_type=slurm",
        "cluster=aws_p5",
        "container=nvcr.io/nvidia/nemo:24.05",
        "container_mounts=[/d:/d]",
    ],
    ["cluster_type=slurm", "cluster=azure_nd_a100_v4", "training=gpt3/5b"],
    [
        "cluster_type=slurm",
        "stages=[data_preparation,training]",
        "data_preparation.shards=[http://h/a.jsonl]",
    ],
    [
        "stages=[data_preparation,training]",
        "data_preparation.shards=[http://h/a.jsonl]",
        "training.trainer.num_nodes=1",
    ],
]


@pytest.mark.parametrize("args", SHIPPED)
def test_every_rendered_script_passes_bash_n(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*args, f"base_results_dir={tmp_path}/r", f"data_dir={tmp_path}/d"]
    for script in write_run_files(build_plan(compose(args)), args):
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_a_word_that_is_not_utf8_is_one_line_and_nothing_is_written(tmp_path):
    """A byte that is not UTF-8 (a Latin-1 name typed or pasted, a legacy file name) reached the
    UTF-8 files the launch writes as a lone surrogate: a UnicodeEncodeError traceback after the
    config and script were written, whatever the key (launcher_cmd.log holds every argument)."""
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    results = tmp_path / "results"
    for key in ("training.exp_manager.name", "training.run.name", "cluster.account"):
        args = [b"launch", b"--dry-run", b"cluster_type=slurm", f"base_results_dir={results}".encode()]
        args.append(key.encode() + b"=ab\xffc")
        done = subprocess.run(
            [sys.executable.encode(), b"-m", b"gptrain", *args], cwd=tmp_path, env=env, capture_output=True
        )
        err = done.stderr.decode(errors="replace").strip()
        assert done.returncode == 2 and "\n" not in err, err
        assert (
            err.startswith(f"gptrain: error: the argument '{key}'")
            and "not UTF-8 text (the byte 0xff)" in err
        )
        assert not results.exists()


def test_a_value_that_is_not_utf8_is_named_by_its_key(tmp_path, monkeypatch):
    """Not from the command line: from the environment (${oc.env:...}), or the directory launched from."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPTRAIN_TEST_LATIN1", "caf\udce9")  # os.environ holds the byte 0xe9
    args = [
        "cluster_type=slurm",
        f"base_results_dir={tmp_path}/r",
        "env_vars.NAME=${oc.env:GPTRAIN_TEST_LATIN1}",
    ]
    with pytest.raises(ConfigError, match=r"^env_vars\.NAME: 'caf\\xe9' is not UTF-8 text \(the byte 0xe9\)"):
        build_plan(compose(args))
    latin1 = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    latin1.mkdir()
    monkeypatch.chdir(latin1)
    with pytest.raises(ConfigError, match=r"^the current directory .* is not UTF-8 text \(the byte 0xe9\)"):
        build_plan(
            compose(["cluster_type=slurm", f"base_results_dir={tmp_path}/r", f"data_dir={tmp_path}/d"])
        )
    assert not (tmp_path / "r").exists()
