import os
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gptrain.errors import ConfigError
from gptrain.launch.compose import CONFIG_ROOT, closest, compose, group_choices, parse_overrides

MOCK = ["training.trainer.num_nodes=1", "training.model.data.data_impl=mock"]


def test_defaults_compose_and_interpolate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    comp = compose([])
    resolved = comp.resolved()
    assert comp.choices == {
        "cluster": "bcm",
        "data_preparation": "download_shards",
        "validation": "default",
        "training": "gpt3/126m",
    }
    assert resolved["stages"] == ["training"] and resolved["cluster_type"] == "local"
    # relative base_results_dir/data_dir become absolute against the launch directory
    assert resolved["base_results_dir"] == str(tmp_path / "results")
    assert resolved["training"]["run"]["results_dir"] == str(tmp_path / "results" / "gpt3_126m")
    assert resolved["training"]["exp_manager"]["explicit_log_dir"] == str(
        tmp_path / "results/gpt3_126m/results"
    )
    assert resolved["training"]["model"]["ffn_hidden_size"] == 4 * 768  # NeMo's multiply resolver


def test_group_choice_and_dotted_overrides():
    comp = compose(
        [
            "training=gpt3/5b",
            "cluster=aws_p5",
            "stages=[data_preparation,training]",
            "data_dir=/datasets",
            "training.trainer.num_nodes=2",
            "training.model.micro_batch_size=4",
            "cluster.partition=gpu",
            "env_vars.MY_VAR=x y",
        ]
    )
    resolved = comp.resolved()
    assert resolved["training"]["model"]["hidden_size"] == 4096
    assert resolved["training"]["trainer"]["num_nodes"] == 2
    assert resolved["training"]["model"]["micro_batch_size"] == 4
    assert resolved["cluster"]["partition"] == "gpu"
    assert resolved["cluster"]["env_vars"]["FI_PROVIDER"] == "efa"
    assert resolved["env_vars"]["MY_VAR"] == "x y"
    assert resolved["stages"] == ["data_preparation", "training"]
    assert resolved["training"]["model"]["tokenizer"]["vocab_file"] == "/datasets/bpe/vocab.json"
    assert resolved["data_preparation"]["output_dir"] == "/datasets/tokenized"


@pytest.mark.parametrize(
    ("argument", "suggestion"),
    [
        ("traning=gpt3/126m", "did you mean 'training'"),
        ("training=gpt3/126n", "did you mean 'gpt3/126m'"),
        ("cluster=bmc", "did you mean 'bcm'"),
        ("cluster.partion=gpu", "did you mean 'partition'"),
        ("cluster_typ=slurm", "did you mean 'cluster_type'"),
        ("training.trainer.max_step=5", "did you mean 'training.trainer.max_steps'"),
        ("training.model.hiden_size=5", "did you mean 'training.model.hidden_size'"),
        ("stages=[training,data_preperation]", "did you mean 'data_preparation'"),
    ],
)
def test_unknown_keys_and_groups_name_the_closest(argument, suggestion):
    with pytest.raises(ConfigError, match=suggestion):
        compose([argument])


def test_plus_adds_a_key_and_bad_values_fail():
    assert compose(["+cluster.qos=high"]).resolved()["cluster"]["qos"] == "high"
    with pytest.raises(ConfigError, match="cluster_type"):
        compose(["cluster_type=kubernetes"])
    with pytest.raises(ConfigError) as error:  # a typo: every accepted name, and the nearest
        compose(["cluster_type=slrum"])
    assert str(error.value) == (
        "cluster_type must be 'local', 'slurm' or 'bcm' (Slurm), got 'slrum' (did you mean 'slurm'?)"
    )
    with pytest.raises(ConfigError, match="not key=value"):
        compose(["training.trainer.num_nodes"])


def test_a_mapping_override_merges_into_the_group_files_mapping():
    """`training.trainer={max_steps: 5}` replaced the training's whole trainer section (the preset's
    nodes, devices and max_time gone), and `cluster.env_vars={A: b}` the cluster's interconnect
    variables; Hydra, and so the NeMo launcher, merges a mapping given for a mapping."""
    resolved = compose(
        ["training=gpt3/5b", "cluster=aws_p5", "training.trainer={max_steps: 5}", "cluster.env_vars={A: b}"]
    ).resolved()
    trainer = resolved["training"]["trainer"]
    assert trainer["max_steps"] == 5 and trainer["num_nodes"] > 1 and trainer["max_time"]
    assert (
        resolved["cluster"]["env_vars"]["FI_PROVIDER"] == "efa"
        and resolved["cluster"]["env_vars"]["A"] == "b"
    )


def test_hydras_delete_and_force_add_forms():
    """`~key` (Hydra's delete: the key takes its default) and `++key=value` were refused as
    "not key=value"; a delete of what is not there, or of another value, is one line."""
    resolved = compose(
        ["~cluster.srun_args", "~training.model.optim.sched.min_lr", "++training.trainer.max_steps=7"]
    ).resolved()
    assert "srun_args" not in resolved["cluster"]
    assert "min_lr" not in resolved["training"]["model"]["optim"]["sched"]
    assert resolved["training"]["trainer"]["max_steps"] == 7
    assert "partition" not in compose(["~cluster.partition=null"]).resolved()["cluster"]  # =null: bare ~key
    with pytest.raises(ConfigError, match=r"^override '~cluster.partition=gpu': the value there is None"):
        compose(["~cluster.partition=gpu"])
    with pytest.raises(ConfigError, match=r"^override '~cluster.nope': the key is not in the config"):
        compose(["~cluster.nope"])


def test_delete_compares_the_resolved_value_names_the_override_as_typed_and_keeps_groups():
    """`~key=value` compared the value as written (`${base_results_dir}/${.name}`), where Hydra
    compares the resolved one; `~training=gpt3/5b` chose that file, where Hydra's `~group`
    removes the group."""
    written = OmegaConf.to_container(compose([]).cfg.training.run, resolve=False)["results_dir"]
    assert written == "${base_results_dir}/${.name}"  # resolved, before the paths are made absolute:
    kept = compose(["~training.run.results_dir=results/gpt3_126m", "+training.run.results_dir=/elsewhere"])
    assert kept.resolved()["training"]["run"]["results_dir"] == "/elsewhere"
    with pytest.raises(ConfigError, match=r"^override '~training=gpt3/5b': removing the training group"):
        compose(["~training=gpt3/5b"])
    with pytest.raises(ConfigError, match=r"^override '~training.run.name': a run needs a name"):
        compose(["~training.run.name"])  # was 'cannot resolve the launch config', no override named


def test_parse_overrides_reads_yaml_values():
    parsed = {o.key: o.value for o in parse_overrides(["a=2", "b=null", "c=[x,y]", "d=true", "e=a b;c"])}
    assert parsed == {"a": 2, "b": None, "c": ["x", "y"], "d": True, "e": "a b;c"}


def test_unique_output_gets_a_timestamped_dir(tmp_path):
    now = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    comp = compose([f"base_results_dir={tmp_path}", "unique_output=true", *MOCK], now=now)
    run = comp.resolved()["training"]
    assert run["run"]["results_dir"] == f"{tmp_path}/gpt3_126m/20260102-030405"
    assert run["exp_manager"]["explicit_log_dir"] == f"{tmp_path}/gpt3_126m/20260102-030405/results"


def test_unique_output_never_joins_an_existing_run_directory(tmp_path):
    """Two launches in the same second (a sweep submitted in a loop), or an hour apart across the
    autumn clock change (local time repeats that hour), got the same stamp: the second wrote its
    scripts into the first's directory and, resuming by default, trained on from its checkpoints."""
    now = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    overrides = [f"base_results_dir={tmp_path}", "unique_output=true", *MOCK]
    first = compose(overrides, now=now).resolved()["training"]["run"]["results_dir"]
    Path(first).mkdir(parents=True)
    second = compose(overrides, now=now).resolved()["training"]
    assert second["run"]["results_dir"] == f"{first}-1"
    assert second["exp_manager"]["explicit_log_dir"] == f"{first}-1/results"
    Path(first + "-1").mkdir()
    assert compose(overrides, now=now).resolved()["training"]["run"]["results_dir"] == f"{first}-2"


def test_every_shipped_launch_config_composes():
    for group in ("cluster", "data_preparation"):
        for choice in group_choices(group):
            assert compose([f"{group}={choice}"]).resolved()[group] is not None
    for name in ("aws_p4d", "aws_p5", "azure_nd_a100_v4", "bcm"):
        cluster = compose([f"cluster={name}"]).resolved()["cluster"]
        assert {"partition", "account", "exclusive", "gpus_per_task", "gpus_per_node", "mem"} <= set(cluster)
        assert {"job_name_prefix", "gres", "srun_args", "stderr_to_stdout", "nodelist"} <= set(cluster)
    azure = compose(["cluster=azure_nd_a100_v4"]).resolved()["cluster"]["env_vars"]
    assert azure["NCCL_IB_PCI_RELAXED_ORDERING"] == 1 and azure["NCCL_TOPO_FILE"].endswith("ndv4-topo.xml")


def test_a_group_choice_that_does_not_exist_lists_the_available_ones(conf):
    """Hydra lists a group's options; the error offered one near name (`gpt3/nope` -> 'gpt3/5b'), or
    the first 12 of a NeMo tree's many, as if they were all."""
    presets = ", ".join(name for name in group_choices("training") if name.startswith("gpt3/"))
    with pytest.raises(ConfigError) as error:
        compose(["training=gpt3/nope"])
    assert str(error.value).endswith(f"/configs/training (valid: {presets})")
    with pytest.raises(ConfigError) as error:
        compose(["training=gpt3/126"])
    assert str(error.value).endswith(f"/configs/training (did you mean 'gpt3/126m'? valid: {presets})")
    sites = sorted(f"site{number:02}" for number in range(15))
    for site in sites:
        (conf / "cluster" / f"{site}.yaml").write_text("partition: gpu\n")
    with pytest.raises(ConfigError) as error:
        compose(["cluster=zzz"], root=conf)
    listed = str(error.value).partition(" (valid: ")[2].removesuffix(")").split(", ")
    assert listed == sorted(["aws_p4d", "aws_p5", "azure_nd_a100_v4", "bcm", *sites])


def test_closest_lists_choices_when_nothing_is_near():
    assert closest("zzz", ["alpha", "beta"]) == " (valid: alpha, beta)"
    assert os.path.isabs(compose(["data_dir=rel"]).resolved()["data_dir"])


@pytest.fixture
def conf(tmp_path):
    """A copy of the bundled launch conf tree, to break one file at a time."""
    import shutil

    from gptrain.launch.compose import CONFIG_ROOT

    shutil.copytree(CONFIG_ROOT, tmp_path / "conf")
    return tmp_path / "conf"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.run.name=${data_dir", r"^override 'training\.run\.name=\$\{data_dir': "),
        ("base_results_dir=null", r"^base_results_dir is empty: give the directory"),
    ],
)
def test_a_value_omegaconf_refuses_is_one_line_naming_the_override(override, message):
    with pytest.raises(ConfigError, match=message) as error:
        compose(["cluster_type=slurm", override]).resolved()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("value", ["", "null"])
def test_an_empty_data_dir_is_one_line_not_the_launch_directory_or_none(value, conf, tmp_path):
    """`data_dir=${DATA_DIR}` with DATA_DIR unset (NeMo's example scripts leave `DATA_DIR=` for the user
    to fill) made data_dir the launch directory: the data, the tokenizer files and the shards data
    preparation writes were looked for there, unseen; `data_dir=null` read the blend as
    'None/my-gpt3_00_text_document'. An empty base_results_dir was refused already."""
    said = (
        "data_dir is empty: give the directory of the datasets and tokenizer files, which ${data_dir}"
        " in the configs names (data_dir=$DATA_DIR with DATA_DIR unset gives an empty one)"
    )
    prepare = ["stages=[data_preparation,training]", "data_preparation.shards=[https://h/a.jsonl]"]
    for where in (["cluster_type=slurm"], prepare):
        with pytest.raises(ConfigError) as error:
            compose([*where, f"data_dir={value}", f"base_results_dir={tmp_path}"])
        assert str(error.value) == said
    text = (conf / "config.yaml").read_text()
    assert "\ndata_dir: data\n" in text
    written = value or "''"
    (conf / "config.yaml").write_text(text.replace("\ndata_dir: data\n", f"\ndata_dir: {written}\n"))
    with pytest.raises(ConfigError) as error:
        compose([], conf)
    assert str(error.value) == said
    assert compose([f"data_dir={tmp_path}"], conf).resolved()["data_dir"] == str(tmp_path)


def test_a_date_in_a_group_file_stays_its_text(conf):
    (conf / "cluster/dated.yaml").write_text("partition: 2024-01-05\n")
    assert compose(["cluster=dated"], root=conf).resolved()["cluster"]["partition"] == "2024-01-05"


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        (
            "cluster/bad.yaml",
            b"partition: caf\xe9\n",
            r"cluster/bad\.yaml: not UTF-8 text \(byte 0xe9 at offset 14\)",
        ),
        (
            "cluster/bad.yaml",
            b"partition: p\na: &x [*x]\n",
            r"cluster/bad\.yaml: 'a\.0' is an alias of a node",
        ),
        ("config.yaml", b"defaults:\n  - {}\nstages: [training]\n", r"config\.yaml: an empty defaults entry"),
        ("config.yaml", b"defaults: 5\n", r"config\.yaml: 'defaults' must be a list"),
    ],
)
def test_an_unreadable_conf_file_is_one_line_naming_it(conf, file, content, message):
    (conf / file).write_bytes(content)
    with pytest.raises(ConfigError, match=message) as error:
        compose(["cluster=bad"] if file.startswith("cluster/") else [], root=conf)
    assert "\n" not in str(error.value)


NEMO_CONF = Path(__file__).parents[1] / "config/nemo_launcher/23.07/launcher_scripts/conf"


def test_a_nemo_tree_reaches_gptrains_own_group_files(tmp_path, capsys):
    """NeMo's tree has no aws_p5.yaml, no gpt3/5b.yaml and no validation/: gptrain's files are used."""
    nemo = [f"launcher_scripts_path={tmp_path}", "training=gpt3/5b", "cluster=aws_p5"]
    comp = compose([*nemo, "stages=[validation,training]"], root=NEMO_CONF)
    resolved = comp.resolved()
    assert resolved["cluster"]["env_vars"]["FI_PROVIDER"] == "efa"  # gptrain's aws_p5.yaml
    assert resolved["training"]["model"]["hidden_size"] == 4096  # gptrain's gpt3/5b.yaml
    assert resolved["validation"]["checks"] == "all"  # gptrain's validation/default.yaml
    assert resolved["stages"] == ["validation", "training"]
    assert comp.choices["validation"] == "default"
    err = capsys.readouterr().err
    assert f"cluster=aws_p5, training=gpt3/5b from gptrain's bundled configs (not in {NEMO_CONF})" in err
    assert "validation=default" not in err  # a group the tree lacks altogether is no surprise
    # the tree's own file still wins over gptrain's of the same name
    own = compose([*nemo[:1], "stages=[training]"], root=NEMO_CONF).resolved()
    assert own["cluster"]["job_name_prefix"] == "nemo-megatron-"  # the tree's bcm.yaml


def test_a_group_file_in_neither_tree_lists_both(tmp_path):
    with pytest.raises(ConfigError) as error:
        compose([f"launcher_scripts_path={tmp_path}", "cluster=zzz"], root=NEMO_CONF)
    message = str(error.value)
    assert f"in {NEMO_CONF}/cluster or {CONFIG_ROOT}/cluster" in message and "\n" not in message
    assert "(valid: aws_p4d, aws_p5, azure_nd_a100_v4, bcm)" in message


def test_a_bad_training_override_of_a_launch_names_the_override():
    """The launcher checks the training config it renders before writing it: a bad value typed on
    the command line was blamed on that not-yet-written file."""
    from gptrain.launch.stages import build_plan, render_run_files, validate_training

    args = ["cluster_type=slurm", "training.trainer.max_steps=abc"]
    plan = build_plan(compose(args))
    with pytest.raises(
        ConfigError, match=r"^override 'training.trainer.max_steps=abc': 'trainer.max_steps' expects"
    ):
        validate_training(plan, render_run_files(plan, args))


def test_a_bad_value_in_the_training_group_file_names_that_file(conf):
    """NeMo's 24.05 gpt3/5b_64k.yaml sets context_parallel_size: 4; the refusal named
    `<results>/<run>/<run>_hydra.yaml`, a file no launch had written (nor ever would, refused)."""
    from gptrain.launch.stages import build_plan, render_run_files, validate_training

    preset = conf / "training/gpt3/126m.yaml"
    (conf / "training/gpt3/cp4.yaml").write_text(
        preset.read_text().replace(
            "  tensor_model_parallel_size:", "  context_parallel_size: 4\n  tensor_model_parallel_size:"
        )
    )
    args = ["cluster_type=slurm", "training=gpt3/cp4"]
    plan = build_plan(compose(args, root=conf))
    with pytest.raises(ConfigError) as error:
        validate_training(plan, render_run_files(plan, args))
    message = str(error.value)
    assert message.startswith(
        f"training=gpt3/cp4 ({conf}/training/gpt3/cp4.yaml): 'model.context_parallel_size: 4'"
    )
    assert "_hydra.yaml" not in message and "\n" not in message


def test_a_mapping_override_of_a_launch_is_not_blamed_for_the_group_files_keys(conf, monkeypatch):
    """`training.trainer={devices: 1}` claimed the whole trainer section: the group file's bad
    max_steps, and its unreadable results_dir, were blamed on that override."""
    from gptrain.launch.stages import build_plan, render_run_files, validate_training

    monkeypatch.delenv("GPTRAIN_TEST_UNSET", raising=False)
    preset = (conf / "training/gpt3/126m.yaml").read_text()
    (conf / "training/gpt3/bad.yaml").write_text(preset.replace("max_steps: 600000", "max_steps: abc"))
    unset = "results_dir: ${oc.env:GPTRAIN_TEST_UNSET}"
    (conf / "training/gpt3/unset.yaml").write_text(preset.replace("results_dir: ${base_results_dir}", unset))
    args = ["cluster_type=slurm", "training=gpt3/bad", "training.trainer={devices: 1}"]
    plan = build_plan(compose(args, root=conf))
    with pytest.raises(ConfigError, match=r"^training=gpt3/bad \(.*/bad.yaml\): 'trainer.max_steps' expects"):
        validate_training(plan, render_run_files(plan, args))
    with pytest.raises(ConfigError, match=r"training.run.results_dir \(in training=gpt3/unset \("):
        compose(["training=gpt3/unset", "training.run={name: x}"], root=conf).resolved()


@pytest.mark.parametrize(
    ("override", "section"),
    [
        ("training.model={optim: null}", "model.optim"),
        ("training={model: {optim: {sched: null}}}", "model.optim.sched"),
        ("training.model.optim=null", "model.optim"),
    ],
)
def test_a_null_section_inside_a_launchs_mapping_override_is_refused(override, section):
    """`training={model: {optim: {sched: null}}}` was merged in, and the job trained with gptrain's
    default schedule (no warmup); `training.model.optim=null` was refused."""
    from gptrain.launch.stages import build_plan, render_run_files, validate_training

    args = ["cluster_type=slurm", override]
    plan = build_plan(compose(args))
    with pytest.raises(ConfigError) as error:
        validate_training(plan, render_run_files(plan, args))
    assert str(error.value) == (
        f"override '{override}': '{section}' is a section of keys, not a value; set its keys "
        f"(training.{section}.<key>=...), or delete it (~training.{section}) for gptrain's defaults"
    )


def test_a_config_dir_that_is_missing_or_a_file_says_so(tmp_path):
    """Both were '<dir>/config.yaml: no such launcher config', as if only the file were missing."""
    with pytest.raises(
        ConfigError, match=rf"^--config-dir {tmp_path}/nope: no such directory; give the conf"
    ):
        compose([], tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(
        ConfigError, match=r"file: is not a directory; give the conf directory that holds c.yaml"
    ):
        compose([], tmp_path / "file", config_name="c.yaml")


@pytest.mark.parametrize("locked", ["above the conf directory", "the conf directory", "a group directory"])
def test_a_config_tree_that_may_not_be_searched_is_one_line_naming_the_directory(
    tmp_path, refuse_search, locked
):
    """Path.is_dir and is_file raised PermissionError (Python 3.11): a bare '<path>: Permission denied'."""
    conf = tmp_path / "site" / "conf"
    (conf / "training").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - training: mine\n")
    (conf / "training" / "mine.yaml").write_text("{}\n")
    refused = {"above the conf directory": tmp_path / "site", "the conf directory": conf}
    refused = refused.get(locked, conf / "training")
    refuse_search(refused)
    with pytest.raises(ConfigError) as error:
        compose([], conf)
    said = f"check the permissions of {refused} and the directories above it"
    assert str(error.value).endswith(said) and "\n" not in str(error.value)
    lookup = {"above the conf directory": f"--config-dir {conf}: cannot be looked up"}
    lookup["the conf directory"] = f"--config-dir {conf}: {conf}/config.yaml cannot be looked up"
    lookup["a group directory"] = f"training=mine: {conf}/training/mine.yaml cannot be looked up"
    assert str(error.value).startswith(lookup[locked])


def test_two_launches_that_chose_one_unique_directory_do_not_share_it(tmp_path, monkeypatch):
    """unique_output checked that the directory did not exist when composing, and created it only
    when writing: two launches started together (a sweep run in the background) chose the same name
    and the second wrote into the first's run. The launch now claims each directory exclusively."""
    from gptrain.errors import LaunchError
    from gptrain.launch import launcher
    from gptrain.launch.stages import build_plan, claim_run_dirs

    now = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    overrides = [f"base_results_dir={tmp_path}", "unique_output=true", "cluster_type=local", *MOCK]
    overrides += ["training.model.data.mock_vocab_size=64"]
    first, second = (build_plan(compose(overrides, now=now)) for _ in range(2))  # both before either writes
    third = compose(overrides, now=now)
    assert first.jobs[0].run_dir == second.jobs[0].run_dir
    claim_run_dirs(first)
    with pytest.raises(LaunchError, match="another launch took this directory"):
        claim_run_dirs(second)
    # the launch itself claims before anything is written (mount directories included)
    monkeypatch.setattr(launcher, "compose", lambda *args, **kwargs: third)
    with pytest.raises(LaunchError, match="another launch took this directory"):
        launcher.launch(overrides, echo=False)
    assert list(first.jobs[0].run_dir.iterdir()) == []  # nothing of the second launch written there


def test_an_interpolation_that_cannot_resolve_names_its_key_and_override(monkeypatch):
    """`${oc.env:UNSET}` was a 60-line omegaconf traceback where a path read it, and a missing
    interpolation key named only the missing key, not the override that asked for it."""
    monkeypatch.delenv("GPTRAIN_TEST_UNSET", raising=False)
    typed = "base_results_dir=${oc.env:GPTRAIN_TEST_UNSET}"
    with pytest.raises(
        ConfigError, match=r"^cannot resolve the launch config: base_results_dir \(set by override "
    ) as error:
        compose([typed])
    assert str(error.value).endswith(
        "; set GPTRAIN_TEST_UNSET, or give a default: ${oc.env:GPTRAIN_TEST_UNSET,DEFAULT}"
    )
    with pytest.raises(
        ConfigError, match=r"training.model.optim.lr \(set by override .*'training.model.nosuch' not found"
    ):
        compose(["training.model.optim.lr=${training.model.nosuch}"]).resolved()


def test_an_interpolation_that_cannot_resolve_names_the_file_or_override_that_wrote_it(conf):
    """A missing key read from a group file or config.yaml named the key alone, not the file (as
    `gptrain train` names its config file); set inside an override's mapping, not that override."""
    preset = conf / "training/gpt3/126m.yaml"
    preset.write_text(preset.read_text().replace("  max_steps: ", "  max_steps: ${.nosuch} #"))
    with pytest.raises(ConfigError) as raised:
        compose(["training=gpt3/126m"], root=conf).resolved()
    assert str(raised.value).startswith(
        f"cannot resolve the launch config: training.trainer.max_steps (in training=gpt3/126m ({preset})):"
    )
    preset.write_text(preset.read_text().replace("${.nosuch} #", ""))
    with (conf / "config.yaml").open("a") as config:
        config.write("my_root: ${nosuch_root}\n")
    with pytest.raises(
        ConfigError, match=rf"^cannot resolve the launch config: my_root \(in {conf}/config.yaml\)"
    ):
        compose([], root=conf).resolved()
    with pytest.raises(ConfigError, match=r"env_vars.B \(set by override 'env_vars={B: \$\{nokey\}}'\)"):
        compose(["env_vars={B: ${nokey}}"]).section("env_vars")


def test_a_key_whose_interpolation_cannot_resolve_can_be_overridden(conf, monkeypatch):
    """`partition: ${oc.env:PARTITION}` in a cluster file with PARTITION unset: overriding it
    (`cluster.partition=gpu`, the reason to type it) was an omegaconf traceback, as the old value
    was read to see whether it was a mapping."""
    monkeypatch.delenv("GPTRAIN_TEST_UNSET", raising=False)
    bcm = conf / "cluster/bcm.yaml"
    bcm.write_text(bcm.read_text().replace("partition: null", "partition: ${oc.env:GPTRAIN_TEST_UNSET}"))
    assert compose(["cluster.partition=gpu"], root=conf).section("cluster")["partition"] == "gpu"


def test_a_shell_variable_written_as_an_interpolation_says_how_to_write_it():
    """`${HOME}` in env_vars is an interpolation of a config key: the error named the missing key
    'HOME' and nothing more, and the user was left to guess."""
    with pytest.raises(ConfigError) as raised:
        compose(["cluster_type=slurm", 'env_vars={B: "${HOME}/x"}']).section("env_vars")
    assert str(raised.value).endswith(
        "Interpolation key 'HOME' not found; for the environment variable write ${oc.env:HOME} (read at"
        " launch) or $HOME (left to the job's shell)"
    )
    with pytest.raises(ConfigError) as raised:  # a config key's name: no such hint
        compose(["cluster_type=slurm", 'env_vars={B: "${nokey}/x"}']).section("env_vars")
    assert str(raised.value).endswith("Interpolation key 'nokey' not found")


@pytest.mark.parametrize("stages", ["0", "true", "1.5", "{a: 1}"])
def test_stages_that_are_not_a_list_are_one_line(stages):
    """`stages=0` (or true, a number, a mapping) was iterated while NeMo's stage names were dropped
    from it: a TypeError traceback ('int' object is not iterable) before the check that names the key."""
    with pytest.raises(ConfigError, match=r"'stages' must be a non-empty list \(there or as an override\)"):
        compose([f"stages={stages}"])


@pytest.mark.parametrize("cluster_type", ["[1,2]", "{a: 1}"])
def test_a_cluster_type_that_is_a_list_or_mapping_is_one_line(cluster_type):
    """It was looked up in a dict of NeMo's names: 'unhashable type: ListConfig', a traceback."""
    with pytest.raises(ConfigError, match=r"^cluster_type must be 'local', 'slurm' or 'bcm' \(Slurm\), got"):
        compose([f"cluster_type={cluster_type}"])


def test_an_override_of_a_list_item_sets_it_as_hydra_does():
    """Hydra's keys take list indices (`cluster.srun_args.0=--x`, `...data_prefix.1=/b`) and set that
    item; gptrain said "unknown key ... prefix with + to add a new key" (and `+` then set it) or, for
    the data prefix, "'1' is not a split". An index past the end is one line saying to give the list."""
    resolved = compose(
        ["cluster.srun_args.0=--mpi=pmix", "training.model.data.data_prefix.1=/data/b_text_document"]
    ).resolved()
    assert resolved["cluster"]["srun_args"] == ["--mpi=pmix"]
    assert resolved["training"]["model"]["data"]["data_prefix"] == [1.0, "/data/b_text_document"]
    with pytest.raises(ConfigError) as error:
        compose(["training.model.data.data_prefix.2=0.5"])
    assert str(error.value) == (
        "override 'training.model.data.data_prefix.2=0.5': training.model.data.data_prefix has 2 items"
        " (0 to 1); an override sets one of them and adds none: give the whole list,"
        " training.model.data.data_prefix=[...]"
    )
    with pytest.raises(
        ConfigError, match=r"^override '\+cluster.srun_args.1=-v': cluster.srun_args has 1 item"
    ):
        compose(["+cluster.srun_args.1=-v"])


@pytest.mark.parametrize(
    ("choice", "meant"),
    [
        ("gpt3/7b", "gpt3/7b_improved"),
        ("gpt3/400m", "gpt3/400m_improved"),
        ("gpt3/1b", "gpt3/1b_improved"),
        ("gpt3/1", "gpt3/1b_improved"),  # began 126m's and 175b's names too
        ("gpt3/40", "gpt3/40b"),  # began 400m_improved's too
    ],
)
def test_a_missing_model_size_is_never_offered_another_size(choice, meant):
    """`training=gpt3/7b` (NeMo's 7b is 7b_improved) was asked 'did you mean gpt3/175b?', and
    `gpt3/400m` 'gpt3/40b?': a model 25 or 100 times larger, one word from being launched. The
    file the name begins is offered; a near name only where its size is the same."""
    presets = ", ".join(name for name in group_choices("training") if name.startswith("gpt3/"))
    with pytest.raises(ConfigError) as error:
        compose([f"training={choice}"])
    assert str(error.value).endswith(f"/configs/training (did you mean '{meant}'? valid: {presets})")
    with pytest.raises(ConfigError) as error:
        compose(["training=gpt3/7"])  # no 7-something preset but 7b_improved's own prefix
    assert "did you mean 'gpt3/7b_improved'?" in str(error.value)
    for other in ("gpt3/30b", "gpt3/12"):  # `gpt3/12` began 126m's name: a size no preset has
        with pytest.raises(ConfigError) as error:
            compose([f"training={other}"])
        assert str(error.value).endswith(f"/configs/training (valid: {presets})")


@pytest.mark.parametrize("switch", ["run_training=True", "run_data_preparation=False"])
def test_a_bignlp_run_switch_on_a_stages_config_names_stages_not_training(switch):
    """bignlp-scripts' `run_training=True` on a config.yaml that lists `stages` was refused with
    "did you mean 'training'?" (the group, which selects no stage); it names the stages list now."""
    with pytest.raises(ConfigError) as error:
        compose([switch])
    key = switch.split("=")[0]
    assert str(error.value) == (
        f"unknown key '{key}': this config.yaml picks its stages with the stages list, not the run_*"
        " switches of older launchers: give stages=[...] (e.g. stages=[data_preparation,training])"
    )
    with pytest.raises(ConfigError, match=r"no 'run_trainig' in the top level"):
        compose(["run_trainig=True"])  # no stage's switch: the usual line


@pytest.mark.parametrize("key", ["launcher_scripts_path", "bignlp_path"])
def test_nemos_launcher_path_with_gptrains_config_says_which_keys_move_the_run(key):
    """`launcher_scripts_path=/shared/nemo` (the NeMo launcher's root, which moves its results and
    data) was refused as an unknown key to be added with `+`, which then placed nothing there."""
    with pytest.raises(ConfigError) as error:
        compose([f"{key}=/shared/nemo"])
    assert str(error.value) == (
        f"unknown key '{key}': the NeMo launcher's directory, under which its config.yaml puts"
        " base_results_dir and data_dir; gptrain's config has neither it nor a use for it: give"
        " base_results_dir=/shared/nemo/results data_dir=/shared/nemo/data, or launch from the NeMo tree"
        " with --config-dir /shared/nemo/conf"
    )


def test_hydras_now_resolver_reads_the_launchs_clock_once():
    """`training.run.name=gpt_${now:%Y%m%d}` (Hydra's resolver, which NeMo launcher users write)
    was 'Unsupported interpolation type now'; it is the launch's time, one value however often the
    config is resolved (Hydra caches it too), so the run's name and directory agree."""
    before = time.strftime("%Y%m%d")
    comp = compose(["training.run.name=gpt_${now:%Y%m%d-%H%M%S.%f}"])
    name = comp.resolved()["training"]["run"]["name"]
    assert name.startswith(f"gpt_{before}") or name.startswith(f"gpt_{time.strftime('%Y%m%d')}")
    time.sleep(0.01)
    training = comp.section("training")
    assert training["run"]["name"] == name
    assert training["run"]["results_dir"].endswith(f"/{name}")


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("+training.model.foo.bar=1", "unknown key 'model.foo'"),
        ("++training.model.fp8.enabled=true", "'model.fp8' expects bool, got {'enabled': True}"),
    ],
)
def test_a_section_made_by_an_override_of_a_key_in_it_names_that_override(override, problem):
    """`+training.model.foo.bar=1` made a section the group file does not have; the refusal blamed
    the file (`training=gpt3/126m (<path>): unknown key 'model.foo'`)."""
    from gptrain.launch.stages import build_plan, render_run_files, validate_training

    args = ["cluster_type=slurm", override]
    plan = build_plan(compose(args))
    with pytest.raises(ConfigError) as error:
        validate_training(plan, render_run_files(plan, args))
    assert str(error.value).startswith(f"override '{override}': {problem}")


def test_deleting_an_item_of_a_list_says_to_give_the_list():
    """`~cluster.srun_args.0` said 'the key is not in the config, so there is nothing to delete',
    of an item that is there."""
    with pytest.raises(ConfigError) as error:
        compose(["~cluster.srun_args.0"])
    assert str(error.value) == (
        "override '~cluster.srun_args.0': an item of a list cannot be deleted by its index; give the"
        " list without it: cluster.srun_args=[...]"
    )


@pytest.mark.parametrize(
    ("stages", "order"),
    [("[training,data_preparation]", "data_preparation, training"), ("[training,training]", "training")],
)
def test_stages_listed_out_of_their_order_say_the_order_they_run_in(tmp_path, capsys, stages, order):
    """NeMo submits the stages in the order listed, each after the one before; gptrain runs them in
    data_preparation, validation, training order, each once: a list in another order (or a stage
    twice) ran otherwise than written without a word."""
    from gptrain.cli import main

    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", f"data_dir={tmp_path}/data"]
    args += ["data_preparation.shards=[https://host/a.jsonl.zst]", "+cluster.max_requeues=3"]
    assert main(["launch", "--dry-run", *args, f"stages={stages}"]) == 0
    listed = stages.strip("[]").replace(",", ", ")
    note = f"note  stages [{listed}] run as {order}: each stage runs once, after the ones it needs"
    assert note in capsys.readouterr().err
    assert main(["launch", "--dry-run", *args, "stages=[data_preparation,training]"]) == 0
    assert "note  stages" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("self_at", "partition"), [("first", "gpu"), ("last", "rootpart"), ("absent", "rootpart")]
)
def test_a_section_in_config_yaml_merges_with_its_group_file_as_hydra_orders_them(conf, self_at, partition):
    """`cluster: {account: acct}` written in config.yaml was dropped for the group file without a word;
    Hydra merges the defaults list in order, config.yaml's own keys at `_self_` (last when the
    list has none, Hydra 1.1+): a key only one of them has survives, a key both have is the later's."""
    (conf / "cluster" / "site.yaml").write_text("partition: gpu\nsrun_args: []\n")
    defaults = ["cluster: site", "data_preparation: download_shards", "training: gpt3/126m"]
    if self_at != "absent":
        defaults.insert(0 if self_at == "first" else len(defaults), "_self_")
    text = (conf / "config.yaml").read_text()
    head, _, rest = text.partition("defaults:\n")
    rest = rest[rest.index("\n\n") :]  # the bundled list, replaced
    listed = "".join(f"  - {entry}\n" for entry in defaults)
    (conf / "config.yaml").write_text(
        f"{head}defaults:\n{listed}{rest}\ncluster:\n  account: acct\n  partition: rootpart\n"
    )
    cluster = compose([], root=conf).resolved()["cluster"]
    assert cluster["account"] == "acct" and cluster["partition"] == partition


def test_a_key_config_yaml_adds_to_a_group_is_named_as_written_in_config_yaml(conf, capsys):
    """`training: {model: {foo: 1}}` in config.yaml was refused as written in the group file
    (gpt3/126m.yaml has no foo); the error names config.yaml, and a key of the file still the file."""
    from gptrain.cli import main

    with (conf / "config.yaml").open("a") as out:
        out.write("\ntraining:\n  model:\n    foo: 1\n")
    args = ["launch", "--dry-run", "--config-dir", str(conf), "training.trainer.num_nodes=1"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert f"{conf / 'config.yaml'}: unknown key 'model.foo'" in err
    assert "126m.yaml" not in err
    assert main([*args, "training.model.foo=2"]) != 0  # the override set it last
    assert "error: unknown key 'training.model.foo'" in capsys.readouterr().err
    (conf / "config.yaml").write_text((conf / "config.yaml").read_text().replace("foo: 1", "num_layers: 2"))
    with (conf / "training/gpt3/126m.yaml").open("a") as out:
        out.write("baz: 1\n")
    assert main(args) != 0
    assert f"training=gpt3/126m ({conf / 'training/gpt3/126m.yaml'}): unknown key 'baz'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("self_at", ["first", "last"])
def test_a_mandatory_value_merged_over_a_groups_value_keeps_it_as_omegaconf_merges(conf, self_at):
    """OmegaConf's merge keeps the earlier value where the later is `???` (OmegaConf.merge({'a': 1},
    {'a': '???'}) is {'a': 1}); the merge of a config.yaml section with its group file gave '???',
    rendered as `#SBATCH --partition='???'`. A `???` that nothing fills stays `???`."""
    (conf / "cluster" / "site.yaml").write_text("partition: gpu\naccount: ???\nsrun_args: []\n")
    defaults = ["cluster: site", "data_preparation: download_shards", "training: gpt3/126m"]
    defaults.insert(0 if self_at == "first" else len(defaults), "_self_")
    text = (conf / "config.yaml").read_text()
    head, _, rest = text.partition("defaults:\n")
    rest = rest[rest.index("\n\n") :]
    listed = "".join(f"  - {entry}\n" for entry in defaults)
    section = "cluster:\n  partition: ???\n  account: ???\n  qos: ???\n"
    (conf / "config.yaml").write_text(f"{head}defaults:\n{listed}{rest}\n{section}")
    cluster = compose([], root=conf).cfg.cluster
    assert cluster.partition == "gpu"
    assert OmegaConf.is_missing(cluster, "account") and OmegaConf.is_missing(cluster, "qos")
    file, own = {"partition": "gpu"}, {"partition": "???"}  # the rule, as OmegaConf merges
    assert OmegaConf.merge(*((own, file) if self_at == "first" else (file, own))).partition == "gpu"


def test_an_override_steps_into_a_mapping_in_a_list_as_hydra_does():
    """`cluster.myl.1.a=5` on a list of mappings was refused ("no '1' in cluster.myl; prefix with +"),
    where Hydra (OmegaConf.update) sets that item's key; a key the item lacks still needs `+`."""
    items = "+cluster.myl=[{a: 1},{a: 2, b: [3]}]"
    resolved = compose([items, "cluster.myl.1.a=5", "cluster.myl.1.b.0=4"]).resolved()
    assert resolved["cluster"]["myl"] == [{"a": 1}, {"a": 5, "b": [4]}]
    with pytest.raises(ConfigError) as error:
        compose([items, "cluster.myl.0.c=5"])
    assert (
        str(error.value)
        == "unknown key 'cluster.myl.0.c': no 'c' in cluster.myl.0 (valid: a); prefix with + to add a new key"
    )
    assert compose([items, "+cluster.myl.0.c=5"]).resolved()["cluster"]["myl"][0] == {"a": 1, "c": 5}
    with pytest.raises(ConfigError) as error:
        compose([items, "cluster.myl.2.a=5"])
    assert str(error.value) == (
        "override 'cluster.myl.2.a=5': cluster.myl has 2 items (0 to 1); an override sets one of them and"
        " adds none: give the whole list, cluster.myl=[...]"
    )


def test_run_switches_added_beside_a_stages_list_are_ignored_as_nemo_does(capsys):
    """`+run_training=False +run_data_preparation=True` on a config.yaml that lists stages replaced the
    list without a word; NeMo 23.07 reads only the list there: so does gptrain, saying so."""
    switches = ["+run_training=False", "+run_data_preparation=True"]
    resolved = compose(switches).resolved()
    assert resolved["stages"] == ["training"]  # config.yaml's list
    assert not any(key.startswith("run_") for key in resolved)
    assert capsys.readouterr().err == (
        "gptrain launch: ignoring +run_training=False, +run_data_preparation=True (NeMo reads no run_*"
        " switch beside a stages list: give stages=[...] to choose the stages)\n"
    )
    # beside a stages override too, whatever the order
    resolved = compose(["+run_data_preparation=True", "stages=[training]"]).resolved()
    assert resolved["stages"] == ["training"]


@pytest.mark.parametrize("plus", ["", "+"])
@pytest.mark.parametrize(
    "key", ["exp_manager.move_aside_earlier_run", "run.name", "trainer.devices", "model.x"]
)
def test_a_training_key_given_without_training_is_told_its_launch_name(plus, key):
    """`exp_manager.move_aside_earlier_run=true` was told "prefix with + to add a new key"; with `+`
    it was taken and read by nothing (the run was refused again for the same reason)."""
    with pytest.raises(ConfigError) as error:
        compose([f"{plus}{key}=1"])
    root = key.split(".")[0]
    assert "did you mean training." in str(error.value) and f"training.{key}=1" in str(error.value)
    assert "prefix with +" not in str(error.value) and root in str(error.value)
