"""Property: Slurm's own parser reads each `#SBATCH` value exactly as the config gave it.

bash never reads the `#SBATCH` lines: sbatch does, with a parser of its own (quotes, `\\`
escapes, `#` comments, a line per option). Hypothesis draws text for the keys that reach those
lines; the rendered script goes to the real `sbatch --test-only -vv` (skipped where there is no
sbatch), which lists the options it parsed before it asks the controller anything. Every value
must be listed unchanged, with no option that was not asked for; a value sbatch cannot read
back (a backslash, a control character) must be refused by the launch, naming the key.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.stages import build_plan, render_run_files

PAYLOADS = [
    "'",
    '"',
    "\\",
    "#",
    " ",
    "#SBATCH --qos=x",
    "hetjob",
    "packjob",
    ":",
    "=",
    "-",
    "$(x)",
    "é",
    "\u00a0",
]
TEXT = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(PAYLOADS)), min_size=1, max_size=4).map(
    "".join
)
# config key -> the name sbatch -vv lists the option under
KEYS = {
    "cluster.partition": "partition",
    "cluster.account": "account",
    "cluster.qos": "qos",
    "cluster.reservation": "reservation",
    "cluster.constraint": "constraint",
    "cluster.job_name_prefix": "job-name",
    # sbatch options no gptrain key renders: NeMo's SlurmLauncher key and additional_parameters
    "cluster.comment": "comment",
    "cluster.additional_parameters.mail_user": "mail-user",
    # the run's name: the job's name, and a directory in its log path (--output) and --chdir's sibling
    "training.run.name": "job-name",
}
LISTED = re.compile(r"^sbatch: (\S+)\s+: (.*)$")


def parsed_options(script: str) -> dict[str, str]:
    """The options sbatch read from `script`, as `sbatch --test-only -vv` lists them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "SLURM_"))}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.sh"
        path.write_text(script)
        done = subprocess.run(
            ["sbatch", "--test-only", "-vv", str(path)], capture_output=True, text=True, env=env, timeout=60
        )
    listing = done.stderr.partition("defined options")[2].partition("end of defined options")[0]
    lines = listing.split("\n")  # sbatch's lines: str.splitlines would also cut at \x85, \u2028, ...
    return dict(m.groups() for m in map(LISTED.match, lines) if m and m.group(1) != "-" * 20)


def sbatch_missing() -> str | None:
    """Why sbatch cannot list what it parses here (no sbatch, no slurm.conf), or None."""
    if shutil.which("sbatch") is None:
        return "no sbatch here"
    if "job-name" not in parsed_options("#!/bin/bash\n#SBATCH --job-name=x\ntrue\n"):
        return "sbatch lists no options here (no Slurm configuration?)"
    return None


pytestmark = pytest.mark.skipif(sbatch_missing() is not None, reason=str(sbatch_missing()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(KEYS)), text=TEXT)
@example(key="cluster.account", text="a'b\"c #d")
@example(key="cluster.job_name_prefix", text="hetjob ")
@example(key="cluster.account", text="\x85")  # a line break to str.splitlines, not to sbatch
@example(key="training.run.name", text='run 1; it\'s "é" %j')
@example(key="cluster.comment", text="#SBATCH --qos=x")
def test_sbatch_reads_every_directive_value_as_given(key, text, tmp_path):
    text = text.replace("${", "$_{")  # OmegaConf interpolation syntax: a feature, not a value
    if not text or (key in ("cluster.job_name_prefix", "training.run.name") and "/" in text):
        return
    if key == "training.run.name" and text.strip() in (".", ".."):
        return
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", "cluster.partition=p"]
    composition = compose(args)
    OmegaConf.update(composition.cfg, key, text, merge=False, force_add=True)
    if "\\" in text or re.search(r"[\x00-\x1f\x7f]", text):
        with pytest.raises(ConfigError, match=re.escape(key)):
            render_run_files(build_plan(composition), args)
        return
    plan = build_plan(composition)
    [script] = [f.text for f in render_run_files(plan, args) if f.executable]
    options = parsed_options(script)
    want = {
        "cluster.job_name_prefix": f"{text}{plan.jobs[0].run_name}",
        "training.run.name": f"{plan.cluster.get('job_name_prefix') or ''}{text}",
    }.get(key, text)
    assert options[KEYS[key]] == want, script
    assert options["output"] == str(plan.jobs[0].log_pattern("out")), script
    asked = {
        line.split("=")[0].removeprefix("#SBATCH --")
        for line in script.splitlines()
        if line.startswith("#SBATCH")
    }
    assert set(options) - {"test-only", "verbose", "gres", "gpus-per-node", "mem"} <= asked
