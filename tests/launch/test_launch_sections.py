"""Types of the launch config's own keys: one error naming the key, never a traceback or a mangled script."""

from __future__ import annotations

import shlex

import pytest
from test_launch_sbatch import CPU, directives

from gptrain.cli import main
from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.key_types import slurm_time_seconds
from gptrain.launch.stages import build_plan, write_run_files

SHARDS = ["stages=[data_preparation,training]", "data_preparation.shards=[https://h/a.jsonl]"]


def srun_words(script: str) -> list[str]:
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    return shlex.split(line.removesuffix(" &"))


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("training.trainer.num_nodes=abc", "training.trainer.num_nodes", "a whole number"),
        ("training.trainer.devices=0", "training.trainer.devices", "1 or more"),
        # null: int(None), a TypeError traceback (the training loader refuses it too)
        (
            "training.trainer.devices=null",
            "training.trainer.devices",
            "must not be null; give a whole number",
        ),
        ("training.trainer.num_nodes=null", "training.trainer.num_nodes", "must not be null; give a whole"),
        ("training.trainer=5", "training.trainer", "a mapping"),
        ("data_preparation.workers=x", "data_preparation.workers", "a whole number"),
        # not a list: len() of an int, a TypeError traceback
        ("data_preparation.shards=5", "data_preparation.shards", "expected a list of shard URLs"),
        ("data_preparation.shards=true", "data_preparation.shards", "got True (bool)"),
        ("data_preparation.shards={url: x}", "data_preparation.shards", "got {'url': 'x'} (dict)"),
        ("data_preparation.retries=five", "data_preparation.retries", "a whole number"),
        # Path(None), .get of a string: tracebacks at launch (the job would read them too)
        (
            "data_preparation.output_dir=null",
            "data_preparation.output_dir",
            "must not be null; give a directory",
        ),
        ("data_preparation.download_dir=[a,b]", "data_preparation.download_dir", "expected a directory, got"),
        ("data_preparation.output_dir=true", "data_preparation.output_dir", "expected a directory, got True"),
        ("data_preparation.tokenizer=gpt2", "data_preparation.tokenizer", "expected a mapping of keys"),
        # read only when the last shard was prepared (a typo cost the whole download), or a traceback
        (
            "data_preparation.blend.weights=token",
            "data_preparation.blend.weights",
            "'tokens' or 'equal', got 'token'",
        ),
        ("data_preparation.blend.weights=[1,2]", "data_preparation.blend.weights", "got [1, 2] (list)"),
        ("data_preparation.backoff_seconds=soon", "data_preparation.backoff_seconds", "a number of seconds"),
        ("data_preparation.backoff_seconds=-1", "data_preparation.backoff_seconds", "0 or more seconds"),
        ("data_preparation.timeout_seconds=0", "data_preparation.timeout_seconds", "more than 0 seconds"),
        ("data_preparation.timeout_seconds=.inf", "data_preparation.timeout_seconds", "a number of seconds"),
        (
            "+cluster.partitoin=gpu",
            "cluster.partitoin: unknown cluster key",
            "did you mean 'cluster.partition'",
        ),
        ("+cluster.run_training=true", "cluster.run_training", "belong at the top level of config.yaml"),
        ("cluster.signal_seconds=abc", "cluster.signal_seconds", "a whole number"),
        ("cluster.signal_seconds=0", "cluster.signal_seconds", "from 1 to 65535"),
        ("cluster.signal_seconds=-5", "cluster.signal_seconds", "from 1 to 65535"),
        ("cluster.max_requeues=x", "cluster.max_requeues", "a whole number"),
        ("cluster.srun_args=5", "cluster.srun_args", "a string or a list of strings"),
        ("container_mounts={a: b}", "container_mounts", "a string or a list of strings"),
        ("env_vars=5", "env_vars", "a mapping"),
        ("cluster.env_vars=[a]", "cluster.env_vars", "a mapping"),
        ("cluster.exclusive=maybe", "cluster.exclusive", "true, false or an sbatch --exclusive mode (user,"),
        # read as a path whatever the stages: Path([...]), a TypeError traceback
        (
            "validation.exclude_file=[a,b]",
            "validation.exclude_file",
            "expected a file name, got ['a', 'b'] (list)",
        ),
        ("validation.exclude_file=true", "validation.exclude_file", "expected a file name, got True (bool)"),
        ("cluster=5", "no cluster config '5'", ""),
        ("cluster=2024", "no cluster config '2024'", ""),  # a group choice, though YAML reads a number
        ("training.run.time_limit=abc", "training.run.time_limit", "not a Slurm time"),
        ("training.run.time_limit=1-2:3:4:5", "training.run.time_limit", "not a Slurm time"),
        ("data_preparation.run.time_limit=1:2:3:4", "data_preparation.run.time_limit", "not a Slurm time"),
        ("training.run.name=..", "training.run.name '..'", "must not contain '/' or be '.' or '..'"),
        ("training.run.name=.", "training.run.name '.'", "must not contain '/' or be '.' or '..'"),
        ("data_preparation.run.name=..", "data_preparation.run.name '..'", "or be '.' or '..'"),
        ("env_vars.é=1", "env_vars.é", "not a valid environment variable name"),
        ("cluster.env_vars.1X=1", "cluster.env_vars.1X", "not a valid environment variable name"),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_key(override, key, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--dry-run", "cluster_type=slurm", f"base_results_dir={tmp_path}/r", *SHARDS, override]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptrain: error: ") and "\n" not in err and "Traceback" not in err
    assert key in err and expected in err
    assert not (tmp_path / "r").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "time_limit", ["30", "30:00", "04:00:00", "2-12", "2-12:30", "26-00:00:00", "UNLIMITED", "90"]
)
def test_every_slurm_time_format_is_accepted(time_limit, tmp_path):
    args = [
        "cluster_type=slurm",
        f"base_results_dir={tmp_path}",
        *CPU,
        f"training.run.time_limit={time_limit}",
    ]
    [script] = write_run_files(build_plan(compose(args)), args)
    assert directives(script.read_text())["--time"] == time_limit


def test_a_string_is_a_one_item_list_for_mounts_and_srun_args(tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "container=img", *CPU]
    args += ["container_mounts=/data:/data", "cluster.srun_args=--mpi=pmix"]
    [script] = write_run_files(build_plan(compose(args)), args)
    words = srun_words(script.read_text())
    [mounts] = [w for w in words if w.startswith("--container-mounts=")]
    assert mounts.endswith(",/data:/data") and "--mpi=pmix" in words  # after the job's own dirs
    assert not [w for w in words if w in ("-", "m", "p", "i")]  # not iterated as characters


def test_a_launch_switch_takes_what_a_training_switch_takes(tmp_path):
    """`cluster.exclusive=1` was "expected true or false, got 1 (int)", and `cluster.exclusive=no`
    "got 'no' (str)", where a training switch takes them (as OmegaConf reads a bool)."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU]
    for value, exclusive in (("1", True), ("0", False), ("yes", True), ("no", False), ("Off", False)):
        [script] = write_run_files(build_plan(compose([*args, f"cluster.exclusive={value}"])), args)
        assert ("--exclusive" in directives(script.read_text())) is exclusive
    with pytest.raises(
        ConfigError, match=r"^cluster.exclusive: expected true, false or an sbatch --exclusive"
    ):
        build_plan(compose([*args, "cluster.exclusive=0.5"]))


@pytest.mark.parametrize(("value", "rendered"), [("user", "user"), ("MCS", "mcs"), ("topo", "topo")])
def test_exclusive_takes_sbatchs_modes_as_submitit_does(tmp_path, value, rendered):
    """`exclusive: user` (submitit's and the NeMo launcher's exclusive is a bool or text, rendered
    --exclusive=user) was refused: "expected true or false"."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, f"cluster.exclusive={value}"]
    [script] = write_run_files(build_plan(compose(args)), args)
    assert directives(script.read_text())["--exclusive"] == rendered


def test_a_count_from_the_environment_is_the_number_it_reads(tmp_path, monkeypatch):
    """`training.trainer.num_nodes=${oc.env:NODES}` was "expected a whole number, got '2' (str)":
    the environment's text is a number where OmegaConf's typed configs (and the training loader) read one."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU]
    args += ["training.trainer.num_nodes=${oc.env:NODES}", "cluster.max_requeues=${oc.env:REQUEUES,3}"]
    monkeypatch.setenv("NODES", "2")
    [script] = write_run_files(build_plan(compose(args)), args)
    assert directives(script.read_text())["--nodes"] == "2"
    monkeypatch.setenv("NODES", "2.5")
    with pytest.raises(ConfigError, match=r"^training.trainer.num_nodes: expected a whole number, got '2.5'"):
        build_plan(compose(args))


def test_comma_separated_mounts_reach_pyxis_as_written(tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "container=img", *CPU]
    args += ["container_mounts='/a:/a,/b:/b'"]
    [script] = write_run_files(build_plan(compose(args)), args)
    [mounts] = [w for w in srun_words(script.read_text()) if w.startswith("--container-mounts=")]
    assert mounts.endswith(",/a:/a,/b:/b")  # after the job's own dirs


def test_signal_seconds_null_is_the_default_and_a_value_is_honoured(tmp_path):
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU]
    for value, expected in (("null", "B:USR1@300"), ("1", "B:USR1@1"), ("900", "B:USR1@900")):
        args = [*base, f"cluster.signal_seconds={value}"]
        [script] = write_run_files(build_plan(compose(args)), args)
        assert directives(script.read_text())["--signal"] == expected


def test_the_training_learns_the_signal_seconds_from_its_batch_script(tmp_path):
    """The run warns when a save takes longer than the signal's lead; it had no way to know that lead."""
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU]
    for value, expected in (("null", "300"), ("900", "900")):
        args = [*base, f"cluster.signal_seconds={value}"]
        [script] = write_run_files(build_plan(compose(args)), args)
        exports = [line for line in script.read_text().splitlines() if "GPTRAIN_SIGNAL_SECONDS" in line]
        assert exports == [f"export GPTRAIN_SIGNAL_SECONDS={expected}"]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 1800), (30, 1800), ("04:30", 270), ("01:02:03", 3723), ("2-03", 183600),
        ("2-03:04", 183840), ("2-03:04:05", 183845), ("UNLIMITED", None), ("infinite", None), (None, None),
        ("0", None), (0, None), ("00:00:00", None),  # Slurm's --time=0: no limit
    ],
)  # fmt: skip
def test_slurm_time_seconds_reads_every_form_sbatch_takes(value, seconds):
    assert slurm_time_seconds(value) == seconds


def test_a_time_limit_the_warning_signal_would_fill_is_refused_naming_both_keys(tmp_path):
    """Else every start checkpoints and requeues within seconds, until max_requeues is spent."""
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU]
    with pytest.raises(
        ConfigError, match=r"^training\.run\.time_limit=00:04:00 leaves 0 s .*cluster\.signal_seconds=300"
    ):
        write_run_files(build_plan(compose([*base, "training.run.time_limit=00:04:00"])), base)
    args = [*base, "training.run.time_limit=00:04:00", "cluster.signal_seconds=60"]
    [script] = write_run_files(build_plan(compose(args)), args)  # 180 s of training before the signal
    assert directives(script.read_text())["--signal"] == "B:USR1@60"


@pytest.mark.parametrize("key", ["time_min", "time_m"])  # any prefix sbatch reads as --time-min
def test_a_time_min_the_warning_signal_would_fill_is_refused(tmp_path, key):
    """With --time-min Slurm may start the job with a limit lowered down to it (sbatch(1)), and the
    signal then comes signal_seconds before that lower limit: a time-min of 4 minutes under a 5-minute
    lead checkpointed and requeued each such start at once, though time_limit left hours."""
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "training.run.time_limit=04:00:00"]
    args = [*base, f"+cluster.additional_parameters={{{key}: '00:04:00'}}"]
    with pytest.raises(ConfigError) as error:
        write_run_files(build_plan(compose(args)), args)
    assert str(error.value).startswith(
        f"cluster.additional_parameters.{key}=00:04:00 (--time-min: Slurm may start the job with its limit"
        " lowered to it) leaves 0 s before the checkpoint-and-requeue signal, which comes"
        " cluster.signal_seconds=300 s before the limit"
    ), error.value
    args = [*base, f"+cluster.additional_parameters={{{key}: '00:10:00'}}"]  # 300 s before the signal
    [script] = write_run_files(build_plan(compose(args)), args)
    assert directives(script.read_text())["--signal"] == "B:USR1@300"


@pytest.mark.parametrize("key", ["training.run.time_limit", "+cluster.additional_parameters.time_min"])
def test_the_signal_lead_is_checked_against_the_limit_slurm_keeps_in_whole_minutes(tmp_path, key):
    """Slurm rounds a time limit up to whole minutes (time_str2mins: (seconds + 59) / 60): `06:59`
    (MM:SS) is a 7-minute limit, leaving 120 s before a 300 s signal, yet it was refused for its
    exact 119 s; `05:01` is 6 minutes, leaving 60 s, not the 1 s the error said."""
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "training.run.time_limit=04:00:00"]
    args = [*base, f"{key}='06:59'"]
    [script] = write_run_files(build_plan(compose(args)), args)
    assert directives(script.read_text())["--signal"] == "B:USR1@300"
    args = [*base, f"{key}='05:01'"]
    with pytest.raises(ConfigError) as error:
        write_run_files(build_plan(compose(args)), args)
    assert " leaves 60 s before the checkpoint-and-requeue signal" in str(error.value)
    assert str(error.value).startswith(f"{key.lstrip('+')}=05:01")


TIME_MIN_STAGES = [
    "stages=[data_preparation,validation,training]",
    "data_preparation.shards=[file:///a.jsonl]",
    "validation.run.time_limit=00:30:00",
    "training.run.time_limit=1-00:00:00",
]


@pytest.mark.parametrize(
    ("time_min", "says"),
    [
        (
            "02:00:00",  # the training's 1 day fits; the validation's 30 minutes do not
            "cluster.additional_parameters.time_min=02:00:00 is longer than validation.run.time_limit=00:30:00,"
            " and sbatch refuses a --time-min over the job's --time ('Invalid time-min specification'):"
            " --time-min reaches every stage's script; give at most 00:30:00, or a longer"
            " validation.run.time_limit",
        ),
        (
            "UNLIMITED",
            "cluster.additional_parameters.time_min=UNLIMITED asks for no time limit, which is longer than"
            " data_preparation.run.time_limit=4:00:00, and sbatch refuses a --time-min over the job's --time"
            " ('Invalid time-min specification'): --time-min reaches every stage's script; give at most"
            " 4:00:00, or a longer data_preparation.run.time_limit",
        ),
        (
            "soon",
            "cluster.additional_parameters.time_min: 'soon' is not a Slurm time; use minutes, MM:SS,"
            " HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 04:00:00)",
        ),
        (
            "true",
            "cluster.additional_parameters.time_min: --time-min needs a time (sbatch: 'requires an"
            " argument'); give one, e.g. 04:00:00, or null to leave it out",
        ),
    ],
)
def test_a_time_min_sbatch_refuses_beside_a_stages_time_limit_is_one_line_naming_both(
    tmp_path, time_min, says
):
    """cluster.additional_parameters.time_min reaches every stage's script: one longer than a stage's
    run.time_limit (the validation's 30 minutes beside the training's day), no limit at all, a word
    or a bare flag was refused by sbatch only at submission, after the stages before it were queued."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, *TIME_MIN_STAGES]
    args.append(f"+cluster.additional_parameters.time_min={time_min}")
    with pytest.raises(ConfigError) as error:
        write_run_files(build_plan(compose(args)), args)
    assert str(error.value) == says
    assert not list(tmp_path.rglob("*_submission.sh"))


@pytest.mark.parametrize(
    ("time_min", "shown"), [("''", "a blank value"), ("'  '", "a blank value"), ("false", "false")]
)
@pytest.mark.parametrize("time_limit", ["null", "04:00:00"])
def test_a_blank_or_false_time_min_is_refused_offering_only_what_is_accepted(
    tmp_path, time_min, shown, time_limit
):
    """A blank time_min passed under no time limit, rendering `--time-min=''` that sbatch refuses at
    submission, and beside one was said to ask for no time limit; false was told to give true or
    null, and true is refused too. One line, offering a time or null."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "stages=[validation]"]
    args += [f"validation.run.time_limit={time_limit}", f"+cluster.additional_parameters.time_min={time_min}"]
    with pytest.raises(ConfigError) as error:
        write_run_files(build_plan(compose(args)), args)
    assert str(error.value) == (
        f"cluster.additional_parameters.time_min: --time-min needs a time, not {shown}; give one, e.g."
        " 04:00:00, or null to leave it out"
    )
    assert not list(tmp_path.rglob("*_submission.sh"))


@pytest.mark.parametrize(
    ("time_limit", "time_min"),
    [("00:30:00", "00:30:00"), ("30", "0-00:30"), ("UNLIMITED", "10"), ("0", "2-00:00:00"), (None, "10")],
)
def test_a_time_min_within_each_stages_time_limit_is_rendered(tmp_path, time_limit, time_min):
    """Equal (in Slurm's whole minutes), any form, or under no limit (UNLIMITED, 0) or none asked."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "stages=[validation]"]
    args += [f"validation.run.time_limit={'null' if time_limit is None else repr(time_limit)}"]
    args.append(f"+cluster.additional_parameters.time_min='{time_min}'")
    [script] = write_run_files(build_plan(compose(args)), args)
    assert directives(script.read_text())["--time-min"] == time_min


def test_build_plan_names_the_key_when_called_directly(tmp_path):
    with pytest.raises(ConfigError, match=r"^cluster\.max_requeues: expected a whole number 0 or more"):
        build_plan(compose(["cluster_type=slurm", f"base_results_dir={tmp_path}", "cluster.max_requeues=-1"]))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["cluster.gpus_per_node=4", "cluster.gres=gpu:4"], "cluster.gpus_per_node gives 4 GPUs"),
        (["cluster.gpus_per_node=null", "cluster.gres=gpu:a100:4"], "cluster.gres gives 4 GPUs"),
        (["stages=[validation]", "cluster.gpus_per_node=4"], "cluster.gpus_per_node gives 4 GPUs"),
    ],
)
def test_more_tasks_than_gpus_per_node_is_refused_at_plan_time(overrides, key, tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "training.trainer.devices=8", *overrides]
    with pytest.raises(ConfigError, match=r"^training\.trainer\.devices=8 tasks per node") as error:
        build_plan(compose(args))
    assert key in str(error.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster.gpus_per_node=8", "training.trainer.devices=4"],  # fewer tasks than GPUs: allowed
        ["cluster.gpus_per_node=null", "cluster.gres=null", "cluster.gpus_per_task=1"],
        [*CPU, "training.trainer.devices=16"],  # CPU processes: no GPU to count
        ["cluster_type=local", "cluster.gpus_per_node=4", "training.trainer.num_nodes=1"],  # not Slurm
    ],
)
def test_tasks_that_fit_the_gpus_plan(overrides, tmp_path):
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "training.trainer.devices=8", *overrides]
    assert [job.stage for job in build_plan(compose(args)).jobs] == ["training"]


@pytest.mark.parametrize(
    ("override", "meant"),
    [
        ("+env_var={NCCL_DEBUG: INFO}", "env_vars"),
        ("+container_mount=[/fsx:/fsx]", "container_mounts"),
        ("+contianer=/apps/image.sqsh", "container"),
        ("+stage=[training]", "stages"),
        ("+cluster_typ=slurm", "cluster_type"),
    ],
)
def test_a_misspelt_top_level_key_is_named_not_dropped(override, meant, tmp_path, capsys, monkeypatch):
    """config.yaml's top-level keys were not checked: `env_var:` (for env_vars) exported nothing,
    `container_mount:` mounted nothing, without a word. A key near one the launcher reads is now
    an error naming it; a key far from all (a root of the user's own, `${my_root}/data`) stays."""
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--dry-run", "cluster_type=slurm", f"base_results_dir={tmp_path}/r", *SHARDS]
    assert main([*args, override]) == 2
    key = override.removeprefix("+").split("=")[0]
    assert capsys.readouterr().err.strip() == (
        f"gptrain: error: {key}: not a key the launcher reads; did you mean '{meant}'?"
    )
    assert main([*args, "+my_root=/fsx", "data_dir=${my_root}/data"]) == 0, capsys.readouterr().err
    # a root of the user's own that is close to a key (a second data directory) but interpolated
    assert main([*args, "+data_dir2=/fsx", "data_dir=${data_dir2}/data"]) == 0, capsys.readouterr().err


# bignlp-scripts 22.06's conf/cluster/bcm.yaml (the Azure NDv4 tutorial's release), values as released.
BIGNLP_22_06_BCM = """partition: null
account: null
exclusive: True
gpus_per_task: null
gpus_per_node: 8
mem: 0
overcommit: False
job_name_prefix: "bignlp-"
exclude: null
srun_flags: null
"""


def bignlp_tree(tmp_path, bcm: str):
    """The 23.07 conf tree with bignlp-scripts 22.06's cluster file."""
    import shutil
    from pathlib import Path

    tree = tmp_path / "conf"
    shutil.copytree(Path(__file__).parents[1] / "config/nemo_launcher/23.07/launcher_scripts/conf", tree)
    (tree / "cluster" / "bcm.yaml").write_text(bcm)
    return tree


@pytest.mark.parametrize(("overcommit", "lines"), [("False", []), ("True", ["#SBATCH --overcommit"])])
def test_the_bignlp_22_06_cluster_file_is_taken_unchanged(tmp_path, capsys, overcommit, lines):
    """The Azure tutorial edits only the partition of bignlp-scripts 22.06's bcm.yaml; its
    `overcommit` (rendered `#SBATCH --overcommit` when true, as bignlp did) and `srun_flags` (the
    export stage's srun flags) were refused as unknown cluster keys."""
    tree = bignlp_tree(tmp_path, BIGNLP_22_06_BCM.replace("overcommit: False", f"overcommit: {overcommit}"))
    args = ["stages=[training]", "training=gpt3/126m", f"launcher_scripts_path={tmp_path}"]
    args += ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null"]
    [script] = write_run_files(build_plan(compose(args, tree)), args)
    text = script.read_text().splitlines()
    assert [line for line in text if "overcommit" in line] == lines
    assert "srun_flags" not in capsys.readouterr().err  # null: nothing to say
    flagged = bignlp_tree(
        tmp_path / "b", BIGNLP_22_06_BCM.replace("srun_flags: null", "srun_flags: --mpi=pmix")
    )
    build_plan(compose(args, flagged))
    assert (
        "cluster.srun_flags (bignlp-scripts passed it to its export stage's srun only"
        in capsys.readouterr().err
    )


def test_one_shard_url_as_text_is_a_one_item_list(tmp_path):
    """`data_preparation.shards=https://h/a.jsonl` (text, not a list) was iterated character by
    character: 'data_preparation.shards[0]: 'h' is not an http(s):// or file:// URL'."""
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "stages=[data_preparation]"]
    args.append("data_preparation.shards=https://h/a.jsonl")
    plan = build_plan(compose(args))
    assert plan.configs["data_preparation"]["shards"] == ["https://h/a.jsonl"]
    assert plan.jobs[0].array == 1


def test_a_numeric_exclude_file_name_is_read_as_that_file(tmp_path, monkeypatch):
    """`validation.exclude_file=1` (YAML reads a number) named the file `1`, but Path(1) raised."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "1").write_text("n[3-4]\n")
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "validation.exclude_file=1"]
    assert build_plan(compose(args)).cluster["exclude"] == "n[3-4]"


@pytest.mark.parametrize(
    ("override", "key", "read"),
    [
        ("validation.exclude_file=1e3", "validation.exclude_file", 1000.0),
        ("data_preparation.download_dir=1.50", "data_preparation.download_dir", 1.5),
        ("data_preparation.output_dir=1e3", "data_preparation.output_dir", 1000.0),
        ("data_dir=1.50", "data_dir", 1.5),
        ("training.run.results_dir=2.0", "training.run.results_dir", 2.0),
        ("wandb_api_key_file=1e3", "wandb_api_key_file", 1000.0),
        ("training.run.name=1.50", "training.run.name", 1.5),  # the default results_dir ends in it
        ("data_preparation.run.name=1e3", "data_preparation.run.name", 1000.0),
    ],
)
def test_a_path_yaml_reads_as_a_float_is_refused_naming_the_key(tmp_path, monkeypatch, override, key, read):
    """YAML and Hydra read `1e3` and `1.50` as floats, 1000.0 and 1.5: exclude_file=1e3 was looked up
    as `1000.0`, missing, and silently ignored; a directory was created under another name. One
    line naming the key, saying to quote the value; an int (`2024`) still names its file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "1e3").write_text("n[3-4]\n")
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "stages=[data_preparation,training]"]
    args += ["data_preparation.shards=[file:///a.jsonl]", override]
    with pytest.raises(ConfigError) as error:
        write_run_files(build_plan(compose(args)), args)
    assert str(error.value) == (
        f"{key}: read as the number {read!r} (YAML reads 1e3 or 1.50 as a float), which names another"
        f" path than the one written; quote it: \"{key}='...'\" on the command line, '...' in a YAML file"
    )


def test_an_int_directory_name_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "stages=[data_preparation]"]
    args += ["data_preparation.shards=[file:///a.jsonl]", "data_preparation.output_dir=2024"]
    assert build_plan(compose(args)).configs["data_preparation"]["output_dir"] == "2024"


@pytest.mark.parametrize("name", ["1e3", "1e-4", "1E3", "1.50", "0123", "2024_11_29", "true", "null"])
def test_a_quoted_run_name_reaches_the_training_as_written(tmp_path, monkeypatch, name):
    """The refusal above says to quote `run.name=1e3`; the training's config was then written with
    PyYAML's YAML 1.1 rules, under which `1e3` is text and stays unquoted, and the training (which
    reads the YAML 1.2 way, as OmegaConf) took the run's name as 1000.0 (its W&B name, hparams)."""
    from gptrain.config import load_training_config
    from gptrain.launch.stages import config_path

    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", *CPU, "stages=[training]"]
    args.append(f"training.run.name='{name}'")
    plan = build_plan(compose(args))
    write_run_files(plan, args)
    (job,) = plan.jobs
    assert load_training_config(str(config_path(job)), []).run.name == name


@pytest.mark.parametrize("override", ["training.trainer.num_nodes=", "cluster.max_requeues= "])
def test_an_empty_count_says_a_shell_variable_may_be_unset(override, capsys):
    """`training.trainer.num_nodes=$NN` (the Azure tutorial's command) with NN unset reached the launch
    as an empty value, refused as "expected a whole number, got '' (str)", naming no cause."""
    key = override.partition("=")[0]
    assert main(["launch", "--dry-run", "cluster_type=slurm", override]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gptrain: error: {key}: empty; give a whole number (on the command line, a $VARIABLE the shell"
        " found unset is empty)"
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("run_training: True", "cluster.run_training: the run_* switches belong at the top level"),
        ("partitoin: gpu", "cluster.partitoin: unknown cluster key; did you mean 'cluster.partition'?"),
    ],
)
def test_an_unknown_key_in_the_cluster_file_names_that_file(tmp_path, line, expected):
    """A run_* switch (as one tutorial edits bcm.yaml) or a misspelt key in the cluster file was named
    as cluster.<key> alone, not the file to edit."""
    tree = bignlp_tree(tmp_path, BIGNLP_22_06_BCM + line + "\n")
    args = ["stages=[training]", "training=gpt3/126m", f"launcher_scripts_path={tmp_path}"]
    with pytest.raises(ConfigError) as error:
        build_plan(compose(args, tree))
    assert str(error.value).startswith(f"cluster=bcm ({tree / 'cluster' / 'bcm.yaml'}): {expected}")
