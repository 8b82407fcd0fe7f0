"""Property: no text given to a config key that reaches a job script is ever executed.

Hypothesis draws a key (cluster, run, container, env_vars, mounts, srun_args, results paths) and
arbitrary text mixed with shell payloads that would call the stub command `owned`. The rendered
script is checked with `bash -n`, then run with stub `srun`/`scontrol` and a stub Python on PATH:
`owned` must never run, and the value must arrive intact where it belongs (an #SBATCH option,
an srun option, an environment variable, the config path). Text with a control character must
instead be refused in one line naming the key, before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import re
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
from gptrain.launch.key_types import SLURM_TIME, SLURM_TIME_WORDS
from gptrain.launch.script_values import CONTROL
from gptrain.launch.srun_args import SRUN_OWNED, owned_short_option
from gptrain.launch.stages import build_plan, config_path, write_run_files

PAYLOADS = ["$(owned)", "`owned`", ";owned;", "|owned", "&owned&", "&&owned", "\nowned\n", "'", '"', "\\"]
PAYLOADS += ["#", " ", "*", "~", "!", "${IFS}owned", "$((1))", "\r", "\x00", "--", "%j", "$SLURM_JOB_ID"]
TEXT = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(PAYLOADS)), max_size=4).map("".join)

# key -> how the value is checked once the script ran: an #SBATCH option, or a special check.
SBATCH_KEYS = {
    "cluster.partition": "--partition",
    "cluster.account": "--account",
    "cluster.nodelist": "--nodelist",
    "cluster.mem": "--mem",
    "cluster.gres": "--gres",
    "training.run.time_limit": "--time",
    "training.run.dependency": "--dependency",
    "cluster.additional_parameters.comment": "--comment",
}
PATH_KEYS = ("base_results_dir", "training.run.name", "cluster.job_name_prefix")
OTHER_KEYS = (
    "env_vars.GPTRAIN_V",
    "cluster.env_vars.GPTRAIN_V",
    "container",
    "container_mounts",
    "cluster.srun_args",
)
KEYS = sorted(SBATCH_KEYS) + list(PATH_KEYS) + list(OTHER_KEYS)

SRUN = """printf '%s\\0' "$@" > "$STUB_LOG/srun.argv"
exec "${@: -10}"
"""  # the last 10 words: the rank wrapper (4) and `<python> -m gptrain train --config-file <path>` (6)
PYTHON = """printf '%s\\0' "$@" > "$STUB_LOG/python.argv"
printf '%s' "${GPTRAIN_V-unset}" > "$STUB_LOG/python.env"
"""
SCONTROL = 'case "$1 $2" in "show hostnames") echo n1 ;; esac\n'
OWNED = 'touch "$STUB_LOG/OWNED"\n'


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    bin_dir = tmp_path_factory.mktemp("bin")
    for name, text in (
        ("srun", SRUN),
        ("py", PYTHON),
        ("scontrol", SCONTROL),
        ("owned", OWNED),
        ("sbatch", OWNED),
    ):
        (bin_dir / name).write_text("#!/bin/bash\n" + text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def value_for(key: str, text: str) -> object:
    """Lists for list keys; path keys get one path component (tests must not write elsewhere)."""
    if key in ("container_mounts", "cluster.srun_args"):
        return [text]
    return text


def expected_refusal(key: str, text: str) -> bool:
    """Values the launcher must refuse: control characters, names that cannot be a file name,
    a time Slurm cannot read, a backslash in an #SBATCH line (sbatch reads it as an escape)."""
    if CONTROL.search(text):
        return True
    if "\\" in text and (key in SBATCH_KEYS or key in PATH_KEYS):
        return True
    if key == "training.run.name":
        return not text or "/" in text or text in (".", "..")
    if key.endswith("env_vars.GPTRAIN_V"):  # `~user`: another home than the job's, which is $HOME
        return any(part.startswith("~") and part.split("/")[0] != "~" for part in text.split(":"))
    if key == "cluster.srun_args" and text.startswith("-"):  # the step's nodes or tasks: gptrain's own
        option = text[2:].partition("=")[0] if text.startswith("--") else owned_short_option(text)
        if text.startswith("--") and len(option) >= 3 and "export".startswith(option):  # srun's --exp...
            return text.partition("=")[2].upper().split(",")[0] != "ALL"  # all but ALL: no PATH
        return option in SRUN_OWNED
    if key == "training.run.time_limit":
        return bool(text) and not SLURM_TIME.match(text) and text.upper() not in SLURM_TIME_WORDS
    return key == "cluster.job_name_prefix" and "/" in text


def render(key: str, value: object, base: Path, stubs: Path) -> list[Path]:
    args = ["cluster_type=slurm", "training.trainer.num_nodes=2", f"python={stubs / 'py'}"]
    args += [f"base_results_dir={base}", "cluster.partition=p"]
    composition = compose(args)
    OmegaConf.update(composition.cfg, key, value, merge=False, force_add=True)
    plan = build_plan(composition)
    return write_run_files(plan, args), plan


def script_env(stubs: Path, log: Path) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "7"}
    env.update(SLURM_JOB_NODELIST="n1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="2")
    env.update(SLURM_NTASKS_PER_NODE="1", SLURM_RESTART_COUNT="0")
    env.pop("GPTRAIN_V", None)
    return env


def run_script(script: Path, stubs: Path, log: Path) -> subprocess.CompletedProcess:
    env = script_env(stubs, log)
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)


def expanded(text: str, env: dict[str, str]) -> str:
    """An env_vars value as the job sees it: `$NAME` and `${NAME}` expanded (as NeMo's unquoted
    export does; unset: empty), `\\$` a literal `$` (the last of an odd run of backslashes before a
    `$` escapes it; an even run escapes nothing), a `~` opening the value or a part after `:` (alone
    up to `/`, `:` or the end) $HOME, nothing else."""
    from gptrain.launch.script_quoting import ENV_REFERENCE

    env = {**env, "PYTHONUNBUFFERED": "1"}  # exported by the script before env_vars
    out, i = [], 0
    while i < len(text):
        reference = ENV_REFERENCE.match(text, i)
        run = len(text[i:]) - len(text[i:].lstrip("\\"))
        if text.startswith("~", i) and (i == 0 or text[i - 1] == ":"):
            out.append(env.get("HOME", ""))  # the rest up to / or : is empty (expected_refusal)
            i += 1
        elif run and text.startswith("$", i + run):
            odd = run % 2
            out.append("\\" * (run - odd) + ("$" if odd else ""))
            i += run + odd
        elif reference:
            out.append(env.get(reference.group(1) or reference.group(2), ""))
            i = reference.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def sbatch_options(script: str) -> dict[str, str]:
    found = {}
    for line in script.split("\n"):  # bash's lines: str.splitlines would also cut at \x85, \u2028, ...
        if line.startswith("#SBATCH "):
            words = shlex.split(line[len("#SBATCH ") :])
            assert len(words) == 1, line  # one option per line, whatever the value
            option, _, value = words[0].partition("=")
            found[option] = value
    return found


def words(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def check_arrival(key: str, text: str, script: Path, plan, log: Path, stubs: Path) -> None:
    """The value reached its place in the job unchanged (env_vars: with its references expanded)."""
    srun, python = words(log / "srun.argv"), words(log / "python.argv")
    [job] = plan.jobs
    assert python == ["-m", "gptrain", "train", "--config-file", str(config_path(job))]
    if key in SBATCH_KEYS and text:
        assert sbatch_options(script.read_text())[SBATCH_KEYS[key]] == text
    elif key in PATH_KEYS:
        assert str(config_path(job)).endswith(f"/{job.run_name}_hydra.yaml") and config_path(job).is_file()
        assert text in str(job.script_path)  # the job-name prefix names the script, not the config
        # Slurm expands % anywhere in --output: only the job id slot may be a pattern
        pattern = sbatch_options(script.read_text())["--output"]
        output = re.sub(r"%(%|j)", lambda m: "%" if m.group(1) == "%" else "7", pattern)
        assert output == str(job.run_dir / f"log-{job.job_name}_7.out")
    elif key.endswith("GPTRAIN_V"):
        assert (log / "python.env").read_text() == expanded(text, script_env(stubs, log))
    elif key == "container":
        assert (f"--container-image={text}" in srun) == bool(text)
    elif key == "container_mounts":
        assert all(not w.startswith("--container-mounts") for w in srun)  # no container: no mounts
    elif key == "cluster.srun_args" and not text.startswith(("--container", "--no-container")):
        assert text in srun[: srun.index("bash")]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), text=TEXT)
@example(key="cluster.account", text="\x85")  # a line break to str.splitlines, not to bash
@example(key="cluster.additional_parameters.comment", text="a b;$(owned)`owned`'\"\nowned")
@example(key="cluster.additional_parameters.comment", text="x; $(owned) 'q' \"q\"")
@example(key="env_vars.GPTRAIN_V", text="$SLURM_JOB_ID:$_{IFS}$(owned)$_")  # expands only a name
@example(key="env_vars.GPTRAIN_V", text="\\$SLURM_JOB_ID\\\\$_\\")  # `\\$` is `$`
@example(key="env_vars.GPTRAIN_V", text="~/a:~:b~:$SLURM_JOB_ID:~/$(owned)")  # `~` opening a part: $HOME
@example(key="cluster.env_vars.GPTRAIN_V", text="a:~x/b")  # another user's home: refused
@example(key="cluster.srun_args", text="-lN2")  # the step's nodes: refused, gptrain sets them
@example(key="cluster.srun_args", text="--exp=x")  # an --export without ALL: refused
@example(key="cluster.srun_args", text="--export=all,A=$(owned)")  # ALL: kept
def test_no_value_reaching_a_script_is_executed(stubs, key, text):
    if key in PATH_KEYS and key != "training.run.name":
        text = text.replace("/", "_") if key == "base_results_dir" else text
    if key in ("base_results_dir", "training.run.name") and text in (".", ".."):
        text += "x"
    text = text.replace("${", "$_{")  # OmegaConf interpolation syntax: a feature, not a value
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        root, log = Path(tmp), Path(tmp) / "log"
        log.mkdir()
        base = root / "r" / text if key == "base_results_dir" else root / "r"
        value = value_for(key, text)
        if key == "base_results_dir":
            value = str(base)
        if expected_refusal(key, text):
            with pytest.raises(ConfigError) as error:
                render(key, value, base, stubs)
            assert key in str(error.value) and "\n" not in str(error.value)
            assert not (root / "r").exists()
            return
        [script], plan = render(key, value, base, stubs)
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        done = run_script(script, stubs, log)
        assert not (log / "OWNED").exists(), script.read_text()
        assert done.returncode == 0, done.stderr
        check_arrival(key, text, script, plan, log, stubs)
