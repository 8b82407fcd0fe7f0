"""Property: the other scripts a launch renders run nothing a value holds, and pass it on intact.

test_launch_script_property covers the Slurm training script. This covers the rest: the local
script (cluster_type=local), and under Slurm the data preparation array job, the validation job
and the training's setup step (apply-blend), with the keys that reach them (run names, the blend
file, validation.exclude_file, wandb_api_key_file, python, qos/reservation/constraint/exclude).
Each script runs under bash with stub srun/scontrol/python on PATH: the stub `owned` must never
run, and every value must arrive byte for byte where it belongs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.script_values import CONTROL
from gptrain.launch.stages import build_plan, write_run_files

PAYLOADS = ["$(owned)", "`owned`", ";owned;", "|owned", "&owned&", "\nowned\n", "'", '"', "\\", "#", " "]
PAYLOADS += [
    "*",
    "~",
    "!",
    "${IFS}owned",
    "$((1))",
    "\r",
    "\t",
    "-",
    "--",
    "=",
    "%j",
    "$SLURM_JOB_ID",
    "é",
    "\u2028",
]
TEXT = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(PAYLOADS)), max_size=4).map("".join)

SBATCH_KEYS = {
    "cluster.qos": "--qos",
    "cluster.reservation": "--reservation",
    "cluster.constraint": "--constraint",
    "cluster.exclude": "--exclude",
}
SLURM_PATH_KEYS = ("data_preparation.run.name", "data_preparation.blend.file", "validation.exclude_file")
LOCAL_KEYS = (
    "local:env_vars.GPTRAIN_V",
    "local:training.run.name",
    "local:python",
    "local:wandb_api_key_file",
)
KEYS = sorted(SBATCH_KEYS) + list(SLURM_PATH_KEYS) + ["wandb_api_key_file", *LOCAL_KEYS]

# Each call of the stub python: its argv (NUL-separated) and the environment it saw, in call order.
PYTHON = """n=$(ls "$STUB_LOG" | grep -c '[.]argv$')
printf '%s\\0' "$0" "$@" > "$STUB_LOG/call$n.argv"
printf '%s\\0' "${GPTRAIN_V-unset}" "${WANDB_API_KEY-unset}" "${MASTER_PORT-unset}" > "$STUB_LOG/call$n.env"
"""
SRUN = 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n'
SCONTROL = 'case "$1 $2" in "show hostnames") echo n1 ;; esac\n'
STUBS = {
    "srun": SRUN,
    "scontrol": SCONTROL,
    "owned": 'touch "$STUB_LOG/OWNED"\n',
    "sbatch": 'touch "$STUB_LOG/OWNED"\n',
}
KEY = "k3y-from-the-file"


def stub(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(0o755)


def path_part(text: str) -> str:
    """`text` as one file name: no '/', never empty, '.' or '..'."""
    return "x" + text.replace("/", "_")


def scenario(key: str, text: str, root: Path) -> tuple[list[str], str, object]:
    """(launch arguments, the config key, the value) for one drawn key and text."""
    local = key.startswith("local:")
    key = key.removeprefix("local:")
    args = [f"base_results_dir={root / 'r'}", f"data_dir={root / 'd'}", f"python={root / 'bin' / 'py'}"]
    if local:
        args += ["cluster_type=local", "training.trainer.num_nodes=1", "training.trainer.devices=1"]
    else:
        args += ["cluster_type=slurm", "stages=[data_preparation,validation,training]"]
        args += ["data_preparation.shards=[http://h/a.jsonl]", "validation.exclude_failed=true"]
        args += [f"validation.exclude_file={root / 'ex.txt'}", "training.trainer.num_nodes=1"]
    value: object = text
    if key in SLURM_PATH_KEYS[1:] or key == "wandb_api_key_file":
        value = str(root / "f" / path_part(text))
    elif key == "python":
        value = str(root / "bin" / path_part(text) / "py")
    elif key.endswith("run.name"):
        value = path_part(text)
    return args, key, value


def expected_refusal(key: str, value: object, local: bool) -> bool:
    """Control characters (but in an argument in quotes, never a directive or a name); a backslash
    in an #SBATCH line (a run name names the job and its log), which sbatch reads as an escape."""
    text = str(value)
    if CONTROL.search(text):  # an exclude_file in quotes takes any but NUL, which no file name holds
        return key != "validation.exclude_file" or "\x00" in text
    return "\\" in text and not local and (key in SBATCH_KEYS or key.endswith("run.name"))


def calls(log: Path) -> list[tuple[list[str], list[str]]]:
    found = []
    for n in range(len(list(log.glob("call*.argv")))):
        # bytes: read_text would turn a '\r' into '\n'
        argv = (log / f"call{n}.argv").read_bytes().decode().split("\0")[:-1]
        env = (log / f"call{n}.env").read_bytes().decode().split("\0")[:-1]
        found.append((argv, env))
    return found


def run_scripts(scripts: list[Path], log: Path, bin_dir: Path) -> None:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "7"}
    env.update(SLURM_JOB_NODELIST="n1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="1")
    env.update(SLURM_NTASKS_PER_NODE="1", SLURM_RESTART_COUNT="0", SLURM_ARRAY_TASK_ID="0")
    for name in ("GPTRAIN_V", "WANDB_API_KEY", "SLURM_STEP_RESV_PORTS"):
        env.pop(name, None)
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert not (log / "OWNED").exists(), script.read_text()
        assert done.returncode == 0, (script.read_text(), done.stderr)


def sbatch_option(script: str, option: str) -> str | None:
    for line in script.split("\n"):  # bash's lines
        if line.startswith(f"#SBATCH {option}="):
            [word] = shlex.split(line[len("#SBATCH ") :])
            return word.partition("=")[2]
    return None


def check_arrival(key: str, value: object, scripts: list[Path], plan, log: Path) -> None:
    seen = calls(log)
    by_stage = {job.stage: job for job in plan.jobs}
    if "training" in by_stage and "data_preparation" in by_stage:  # Slurm: prep, validation, setup, training
        (prep, _), (validation, _), (setup, _), (train, env) = seen
        assert prep[1:] == ["-m", "gptrain.launch.download", "shard", "--config"] + [
            str(by_stage["data_preparation"].config_path),
            "--index",
            "0",
        ]
        assert setup[1:5] == ["-m", "gptrain.launch.download", "apply-blend", "--blend"]
        assert (
            validation[validation.index("--exclude-file") + 1] == plan.resolved["validation"]["exclude_file"]
        )
        assert setup[5] == plan.resolved["data_preparation"]["blend"]["file"]
    else:
        [(train, env)] = seen
    assert train[-2:] == ["--config-file", str(by_stage["training"].config_path)]
    if key in SBATCH_KEYS:
        texts = [script.read_text() for script in scripts]
        assert all(sbatch_option(text, SBATCH_KEYS[key]) == (value or None) for text in texts)
    elif key == "data_preparation.run.name":
        assert by_stage["data_preparation"].run_name == value
    elif key == "data_preparation.blend.file":
        assert setup[5] == value
    elif key == "validation.exclude_file":
        assert validation[validation.index("--exclude-file") + 1] == value
    elif key == "wandb_api_key_file":
        assert env[1] == KEY
    elif key == "python":
        assert train[0] == value
    elif key == "env_vars.GPTRAIN_V":
        if "$" not in value:  # references expand (test_launch_script_property checks how)
            assert env[0] == value
    elif key == "training.run.name":
        assert by_stage["training"].run_name == value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), text=TEXT)
@example(key="data_preparation.blend.file", text="-a b$(owned)")
@example(key="local:wandb_api_key_file", text=" $(owned)'")
@example(key="cluster.constraint", text="h100&ib|a100#x")
@example(key="validation.exclude_file", text="\r")
@example(key="validation.exclude_file", text="\x00")
@example(key="local:python", text="\x00")
def test_no_value_reaching_a_stage_script_is_executed(key, text):
    text = text.replace("${", "$_{")  # OmegaConf interpolation syntax: a feature, not a value
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        root = Path(tmp)
        log, bin_dir = root / "log", root / "bin"
        log.mkdir()
        for name, body in STUBS.items():
            stub(bin_dir / name, body)
        args, config_key, value = scenario(key, text, root)
        if "\x00" not in str(value):  # no file can have that name; the launch refuses it (checked below)
            stub(Path(value) if config_key == "python" else bin_dir / "py", PYTHON)
        if config_key == "wandb_api_key_file" and not CONTROL.search(str(value)):
            Path(value).parent.mkdir(exist_ok=True)
            Path(value).write_text(KEY + "\r\n")
        composition = compose(args)
        OmegaConf.update(composition.cfg, config_key, value, merge=False, force_add=True)
        if expected_refusal(config_key, value, key.startswith("local:")):
            with pytest.raises(ConfigError) as error:
                write_run_files(build_plan(composition), args)
            message = str(error.value)
            assert ("wandb_api_key_file" if "wandb" in config_key else config_key) in message
            assert "\n" not in message and not (root / "r").exists()
            return
        plan = build_plan(composition)
        scripts = write_run_files(plan, args)
        run_scripts(scripts, log, bin_dir)
        check_arrival(config_key, value, scripts, plan, log)
