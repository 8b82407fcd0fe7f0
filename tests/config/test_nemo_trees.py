"""The NeMo launcher's own conf trees (23.07 .. 24.12) and the tutorials' command lines, unchanged.

tests/config/nemo_launcher/<release>/launcher_scripts/conf/ holds the key structure of each
release's config.yaml, cluster/bcm.yaml, data_preparation/gpt3/download_gpt3_pile.yaml and
training/gpt3/126m.yaml, values as released.
"""

import re
import shlex
import shutil
from pathlib import Path

import pytest

from gptrain.config import load_training_config
from gptrain.config.nemo_launcher import parse_file_numbers
from gptrain.config.yamlio import parse_value
from gptrain.errors import ConfigError
from gptrain.launch.compose import CONFIG_ROOT, compose
from gptrain.launch.stages import build_plan, write_run_files

TREES = Path(__file__).parent / "nemo_launcher"
RELEASES = ("23.07", "23.11", "24.05", "24.12")

# nemo-megatron-benchmark-azure-ndv4.md, "Run NeMo Megatron" ($NN=2), as the shell passes it
AZURE_TRAINING = [
    "training=gpt3/126m",
    "training.run.name=gpt3_126m-1n-tp1-pp1-mbs1",
    "training.run.time_limit=10:00:00",  # the shell has removed the quotes of "10:00:00"
    "training.trainer.num_nodes=2",
    "training.trainer.max_steps=200",
    "training.trainer.log_every_n_steps=1",
    "training.exp_manager.resume_if_exists=False",
    "training.model.micro_batch_size=4",
    "training.model.tensor_model_parallel_size=1",
    "training.model.pipeline_model_parallel_size=1",
    "training.model.activations_checkpoint_num_layers=0",
]


def conf(release: str) -> Path:
    return TREES / release / "launcher_scripts" / "conf"


def bignlp_tree(tmp_path: Path, switches: str) -> Path:
    """The 23.07 tree with config.yaml as bignlp-scripts 22.x has it: run_* switches and no stages list
    (beside a list, NeMo 23.07+ and gptrain read the list alone)."""
    tree = tmp_path / "conf"
    shutil.copytree(conf("23.07"), tree)
    text = (tree / "config.yaml").read_text()
    without = re.sub(r"(?m)^stages:\n(- .*\n)+", "", text)
    assert without != text
    (tree / "config.yaml").write_text(without + switches)
    return tree


def render(release: str, tmp_path: Path, extra: list[str]) -> dict[str, str]:
    plan = build_plan(compose([*AZURE_TRAINING, *extra, f"launcher_scripts_path={tmp_path}"], conf(release)))
    write_run_files(plan, [])
    return {job.stage: job.script_path.read_text() for job in plan.jobs}


@pytest.mark.parametrize("release", RELEASES)
def test_azure_tutorial_command_on_each_release_tree(release, tmp_path, capsys):
    scripts = render(release, tmp_path, ["stages=[training]"])
    script = scripts["training"]
    assert "#SBATCH --time=10:00:00\n" in script  # not 36000 (base-60) minutes
    assert "#SBATCH --nodes=2" in script
    # mounts: [null] adds nothing; the job's results, data and conf tree are mounted as NeMo's launcher does
    srun = shlex.split(next(line for line in script.splitlines() if line.startswith("srun ")))
    own = [f"{tmp_path}/results", f"{tmp_path}/data", str(conf(release))]
    assert f"--container-mounts={','.join(f'{d}:{d}' for d in own)}" in srun
    assert "nemo-megatron-gpt3_126m-1n-tp1-pp1-mbs1" in script
    run_dir = tmp_path / "results" / "gpt3_126m-1n-tp1-pp1-mbs1"
    hydra = (run_dir / "gpt3_126m-1n-tp1-pp1-mbs1_hydra.yaml").read_text()
    cfg = load_training_config(config_file=str(run_dir / "gpt3_126m-1n-tp1-pp1-mbs1_hydra.yaml"))
    assert cfg.run.time_limit == "10:00:00" and "time_limit: '10:00:00'" in hydra
    assert cfg.model.data.data_prefix[1] == f"{tmp_path}/data/my-gpt3_00_text_document"
    assert not cfg.exp_manager.create_wandb_logger  # the upstream file's W&B settings are read, not ignored
    assert cfg.exp_manager.wandb_logger_kwargs.project == "nemo_gpt3"
    assert cfg.exp_manager.wandb_logger_kwargs.name == "gpt3_126m-1n-tp1-pp1-mbs1"
    err = capsys.readouterr().err
    assert (
        "conversion" in err
        and "gptrain runs data_preparation, validation (its cluster check) and training only" in err
    )


def test_upstream_defaults_need_not_exist_and_cluster_type_bcm(tmp_path):
    base = [f"launcher_scripts_path={tmp_path}", "training=gpt3/126m"]
    resolved = compose([*base, "stages=[training,conversion]"], conf("24.12")).resolved()
    assert resolved["cluster_type"] == "slurm"  # bcm
    assert resolved["stages"] == ["training"]
    assert resolved["container_mounts"] == []
    assert resolved["training_config"] == "gpt3/126m"  # ${hydra:runtime.choices.training}
    with pytest.raises(ConfigError) as error:
        compose(base, conf("24.12"))  # 24.12's config.yaml runs only `conversion`
    assert str(error.value).startswith(f"{conf('24.12') / 'config.yaml'}: 'stages' must be a non-empty list")


def test_launcher_scripts_path_defaults_to_the_trees_parent():
    resolved = compose(["training=gpt3/126m", "stages=[training]"], conf("23.07")).resolved()
    assert resolved["data_dir"] == str(conf("23.07").parent / "data")


def test_run_switches_of_the_azure_config_pick_stages(tmp_path):
    tree = bignlp_tree(  # the tutorial's edits of config.yaml
        tmp_path,
        "run_data_preparation: True\nrun_training: False\nrun_conversion: False\n"
        "run_finetuning: False\nrun_evaluation: False\nbignlp_path: /shared\n",
    )
    (tree / "data_preparation/gpt3/download_gpt3_pile.yaml").write_text(
        (tree / "data_preparation/gpt3/download_gpt3_pile.yaml").read_text().replace("0-29", "0-1")
    )
    comp = compose([*AZURE_TRAINING, f"launcher_scripts_path={tmp_path}"], tree)
    resolved = comp.resolved()
    assert resolved["stages"] == ["data_preparation"]
    prep = resolved["data_preparation"]
    assert prep["shards"] == [
        "https://mystic.the-eye.eu/public/AI/pile/train/00.jsonl.zst",
        "https://mystic.the-eye.eu/public/AI/pile/train/01.jsonl.zst",
    ]
    assert prep["tokenizer"]["vocab_file"] == f"{tmp_path}/data/bpe/vocab.json"
    # NeMo downloads the GPT-2 files: so does the stage, where they are missing
    assert prep["tokenizer"]["vocab_url"] == "https://huggingface.co/gpt2/resolve/main/vocab.json"
    assert prep["tokenizer"]["merge_url"] == "https://huggingface.co/gpt2/resolve/main/merges.txt"
    assert prep["keep_compressed"] is False  # rm_downloaded: True
    assert prep["keep_extracted"] is False  # rm_extracted: True (every release's): deleted once tokenized
    kept = compose(
        [*AZURE_TRAINING, f"launcher_scripts_path={tmp_path}", "data_preparation.rm_extracted=False"], tree
    )
    assert kept.resolved()["data_preparation"]["keep_extracted"] is True
    assert prep["workers"] == "auto"  # NeMo: --workers $SLURM_CPUS_ON_NODE; before, one process
    override = compose(
        [*AZURE_TRAINING, f"launcher_scripts_path={tmp_path}", "+data_preparation.workers=32"], tree
    )
    assert override.resolved()["data_preparation"]["workers"] == 32  # before, dropped without a word
    from gptrain.launch.shards import parse_shards
    from gptrain.launch.tokenize_step import output_prefix

    names = [str(output_prefix(prep, s)) for s in parse_shards(prep["shards"])]
    assert names == [f"{tmp_path}/data/my-gpt3_00_text_document", f"{tmp_path}/data/my-gpt3_01_text_document"]
    training = load_training_config(config_file=str(conf("23.07") / "training/gpt3/126m.yaml"),
                                    overrides=[f"data_dir={tmp_path}/data"], report_ignored=False)  # fmt: skip
    assert set(names) <= set(training.model.data.data_prefix[1::2])  # what training reads


def test_bignlp_switches_and_keys_are_named_not_dropped(tmp_path, capsys):
    """bignlp-scripts 22.06's config.yaml: run_export/run_prompt_learning and a Transformer Engine
    switch are reported as ignored, never silently dropped or read as stages."""
    tree = bignlp_tree(
        tmp_path,
        "run_data_preparation: False\nrun_training: True\nrun_prompt_learning: False\n"
        "run_export: True\nnvte_bias_gelu_nvfusion: 0\n",
    )
    resolved = compose(["training=gpt3/126m"], tree).resolved()
    assert resolved["stages"] == ["training"]
    assert not any(key.startswith("run_") for key in resolved)
    notes = capsys.readouterr().err
    assert "run_export:" in notes and "nvte_bias_gelu_nvfusion (" in notes
    assert "run_prompt_learning" not in notes  # off: nothing to ignore


def test_file_numbers():
    assert parse_file_numbers("0-29") == list(range(30))
    assert parse_file_numbers("0, 3,5-6") == [0, 3, 5, 6]
    with pytest.raises(ConfigError, match="file_numbers"):
        parse_file_numbers("a-b")


def test_blend_on_the_command_line_is_a_list_in_launch_and_train(tmp_path):
    blend = "[0.5,${data_dir}/a_text_document,0.5,${data_dir}/b_text_document]"
    resolved = compose([f"training.model.data.data_prefix={blend}", "data_dir=/d"]).resolved()
    assert resolved["training"]["model"]["data"]["data_prefix"] == [
        0.5,
        "/d/a_text_document",
        0.5,
        "/d/b_text_document",
    ]
    cfg = load_training_config("gpt3/126m", [f"model.data.data_prefix={blend}", "data_dir=/d"])
    assert cfg.model.data.data_prefix == [0.5, "/d/a_text_document", 0.5, "/d/b_text_document"]


def test_time_values_stay_strings_in_files_and_overrides(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("run:\n  name: x\n  time_limit: 10:00:00\ntrainer:\n  max_time: 00:03:50:00\n")
    cfg = load_training_config(config_file=str(path), overrides=["model.data.data_impl=mock",
                                                                 "model.data.mock_vocab_size=64"])  # fmt: skip
    assert cfg.run.time_limit == "10:00:00" and cfg.trainer.max_time == "00:03:50:00"
    cfg = load_training_config("gpt3/126m", ["run.time_limit=1:30:00"])
    assert cfg.run.time_limit == "1:30:00"


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("1e-4", 1e-4), ("null", None), ("True", True), ("10:00:00", "10:00:00"), ("'a,b'", "a,b"),
     ("[]", []), ("[1,[2,3]]", [1, [2, 3]]), ("${x}/y", "${x}/y"), ("gpt3/126m", "gpt3/126m"),
     # as Hydra's grammar reads them, not YAML 1.1: a `#` is no comment, yes/no/on/off are words,
     # a leading zero is no octal, a date is text
     ("exp #2", "exp #2"), ("a#b", "a#b"), ("no", "no"), ("On", "On"), ("0755", "0755"), ("0", 0),
     ("2024-01-05", "2024-01-05"), ("false", False)],
)  # fmt: skip
def test_override_values(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize("release", RELEASES)
def test_every_upstream_126m_key_is_implemented_or_ignored_with_a_reason(release, capsys):
    path = conf(release) / "training/gpt3/126m.yaml"
    cfg = load_training_config(config_file=str(path))
    assert {"exp_manager.step_timing_kwargs", "model.nsys_profile"} <= set(cfg.ignored_keys)
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "loggers and profilers other than TensorBoard" in line


def test_suggestions_are_close_or_absent():
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", ["trainer.replace_sampler_dpp=False"])
    assert "accelerator" not in str(error.value)
    with pytest.raises(ConfigError, match="did you mean 'trainer.max_steps'"):
        load_training_config("gpt3/126m", ["trainer.max_step=3"])
    with pytest.raises(ConfigError, match="did you mean 'model.optim.sched.warmup_steps'"):
        load_training_config("gpt3/126m", ["model.optim.sched.warmup_step=3"])


def test_run_name_and_base_results_dir_without_a_preset():
    cfg = load_training_config(None, ["run.name=mine", "base_results_dir=/r", "model.data.data_impl=mock",
                                      "model.data.mock_vocab_size=64"])  # fmt: skip
    assert cfg.run.results_dir == "/r/mine" and cfg.exp_manager.explicit_log_dir == "/r/mine/results"


def test_train_takes_nemo_config_path_and_name(tmp_path):
    from gptrain.cli import build_parser
    from gptrain.train.cli import config_file
    from gptrain.utils.overrides import split_preset

    tree = conf("24.05") / "training" / "gpt3"
    argv = ["train", "--config-path", str(tree), "--config-name", "126m", "trainer.max_steps=5"]
    args = build_parser().parse_args(argv)
    preset, overrides = split_preset(args.preset, args.overrides)
    assert config_file(args) == str(tree / "126m.yaml") and overrides == ["trainer.max_steps=5"]
    cfg = load_training_config(preset, overrides, config_file=config_file(args), report_ignored=False)
    assert cfg.trainer.max_steps == 5 and cfg.model.num_layers == 12


def test_a_nemo_tree_is_told_about_its_container_and_its_missing_requeues(tmp_path):
    """NeMo's config.yaml names NeMo's image (no gptrain inside) and its bcm.yaml no max_requeues."""
    from gptrain.launch.launcher import launch_notes

    base = [*AZURE_TRAINING, f"launcher_scripts_path={tmp_path}", "stages=[training]"]
    plan = build_plan(compose([*base, "container=nvcr.io/nvidia/nemo:24.12"], conf("24.12")))
    notes = launch_notes(plan, ["training"])
    assert any("looks like NeMo's image, which has no gptrain" in note for note in notes)
    assert any("cluster.max_requeues is unset (Slurm's own requeue is the site's)" in note for note in notes)
    assert any("+cluster.max_requeues=N" in note for note in notes)
    plan = build_plan(compose([*base, "container=null", "+cluster.max_requeues=0"], conf("24.12")))
    assert any(
        "cluster.max_requeues is 0 (--no-requeue)" in note for note in launch_notes(plan, ["training"])
    )
    plan = build_plan(compose([*base, "container=null", "+cluster.max_requeues=3"], conf("24.12")))
    assert launch_notes(plan, ["training"]) == []


def test_a_gpu_training_that_asks_slurm_for_no_gpu_is_noted(tmp_path):
    """NeMo 24.05's bcm.yaml has no gres: with gpus_per_node=null the GPU training's job asked Slurm
    for no GPU, said nowhere, and where Slurm constrains devices its ranks saw none after the wait."""
    from gptrain.launch.launcher import launch_notes

    base = [*AZURE_TRAINING, f"launcher_scripts_path={tmp_path}", "stages=[training]", "container=null"]
    base += ["+cluster.max_requeues=3", "training.trainer.devices=4"]
    plan = build_plan(compose([*base, "cluster.gpus_per_node=null"], conf("24.05")))
    assert launch_notes(plan, ["training"]) == [
        "note  training: training.trainer.accelerator is not cpu, but the job asks Slurm for no GPU"
        " (cluster.gpus_per_node, cluster.gres and cluster.gpus_per_task are null or 0): where Slurm"
        " constrains devices its 4 ranks per node see none; give cluster.gpus_per_node=4 (CPU nodes:"
        " training.trainer.accelerator=cpu)"
    ]
    for asked in (["cluster.gpus_per_node=4"], ["cluster.gpus_per_node=null", "cluster.gpus_per_task=1"]):
        assert launch_notes(build_plan(compose([*base, *asked], conf("24.05"))), ["training"]) == []
    cpu = ["cluster.gpus_per_node=null", "training.trainer.accelerator=cpu"]
    assert launch_notes(build_plan(compose([*base, *cpu], conf("24.05"))), ["training"]) == []
    local = ["cluster.gpus_per_node=null", "cluster_type=local", "training.trainer.num_nodes=1"]
    assert not [
        n
        for n in launch_notes(build_plan(compose([*base, *local], conf("24.05"))), ["training"])
        if "GPU" in n
    ]


def test_a_preset_and_a_config_file_together_are_refused(tmp_path, capsys):
    """Before, the file won and the preset was never read, without a word."""
    from gptrain.cli import main

    file = conf("24.05") / "training" / "gpt3" / "126m.yaml"
    assert main(["train", "gpt3/5b", "--config-file", str(file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gptrain: error: give a preset (gpt3/5b) or a config file ({file}), not both"


# nemo-megatron-on-slurm-aws.md: 1.bmk-pretrain-gpt3.sh's arguments (MODEL_SIZE=126m, NUM_NODES=2,
# MAX_STEPS=40), the benchmark's validation off with PyTorch Lightning's 0.0
AWS_BENCHMARK = [
    "stages=[training]",
    "training=gpt3/126m",
    "training.trainer.num_nodes=2",
    "training.trainer.max_steps=40",
    "training.trainer.val_check_interval=40",
    "training.trainer.limit_val_batches=0.0",
    "training.exp_manager.create_checkpoint_callback=False",
    "training.exp_manager.resume_if_exists=False",
    "training.model.data.data_impl=mock",
    "training.model.data.data_prefix=[]",
]


def test_aws_benchmark_arguments_turn_validation_off(tmp_path):
    plan = build_plan(compose([*AWS_BENCHMARK, f"launcher_scripts_path={tmp_path}"], conf("23.07")))
    write_run_files(plan, [])
    hydra = tmp_path / "results" / "gpt3_126m" / "gpt3_126m_hydra.yaml"
    cfg = load_training_config(config_file=str(hydra), report_ignored=False)
    assert (cfg.trainer.limit_val_batches, cfg.trainer.max_steps, cfg.trainer.num_nodes) == (0, 40, 2)
    assert cfg.model.data.data_impl == "mock" and not cfg.exp_manager.create_checkpoint_callback


@pytest.mark.parametrize(
    ("override", "what"),
    [
        ("trainer.limit_val_batches=1.0", "of the validation split (1.0: all of it)"),
        ("trainer.limit_test_batches=0.5", "of the test split (1.0: all of it)"),
        ("trainer.val_check_interval=1.0", "of an epoch"),
    ],
)
def test_a_lightning_fraction_is_refused_not_read_as_a_count(override, what):
    """NeMo (PyTorch Lightning) reads a float in (0, 1] in these keys as a fraction: 1.0 validates on
    the whole validation split. gptrain counts batches and steps, and took 1.0 as 1 without a word."""
    key, value = override.split("=")
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override], report_ignored=False)
    assert str(error.value) == (
        f"override '{override}': '{key}' {value} is a fraction {what} in NeMo and PyTorch Lightning;"
        f" gptrain counts {'steps' if 'interval' in key else 'global batches'}: give a whole number"
    )
    whole = load_training_config("gpt3/126m", [f"{key}=2.0"], report_ignored=False)  # not a fraction
    assert getattr(whole.trainer, key.split(".")[1]) == 2


def test_bignlp_nccl_topology_file_is_exported_to_the_jobs(tmp_path):
    """bignlp-scripts 22.x's config.yaml names the topology file in nccl_topology_xml_file (its jobs
    export NCCL_TOPO_FILE from it; Azure NDv4 needs /opt/microsoft/ndv4-topo.xml); it was dropped
    without a word, so NCCL ran without the topology."""
    tree = tmp_path / "conf"
    shutil.copytree(conf("23.07"), tree)
    with (tree / "config.yaml").open("a") as config:
        config.write("run_training: True\nrun_data_preparation: False\nbignlp_path: /shared\n")
        config.write("nccl_topology_xml_file: /opt/microsoft/ndv4-topo.xml\n")
    argv = [*AZURE_TRAINING, f"launcher_scripts_path={tmp_path}", f"base_results_dir={tmp_path}/results"]
    plan = build_plan(compose(argv, tree))
    write_run_files(plan, [])
    [script] = (tmp_path / "results").glob("*/*_submission.sh")
    assert "\nexport NCCL_TOPO_FILE=/opt/microsoft/ndv4-topo.xml\n" in script.read_text()
    assert "nccl_topology_xml_file" not in compose(argv, tree).resolved()
    # an explicit env_vars entry wins; null exports nothing
    both = build_plan(compose([*argv, "env_vars.NCCL_TOPO_FILE=/other.xml"], tree))
    assert both.top["env_vars"]["NCCL_TOPO_FILE"] == "/other.xml"
    off = build_plan(compose([*argv, "nccl_topology_xml_file=null"], tree))
    assert (off.top.get("env_vars") or {}).get("NCCL_TOPO_FILE") is None  # null: not exported


# bignlp-scripts 22.x's conf/data_preparation/download_gpt3_pile.yaml (the Azure tutorial's release):
# no run section; the job's logs, node count and time limit at the top
BIGNLP_PILE = """\
dataset: pile
download_the_pile: True
the_pile_url: "https://mystic.the-eye.eu/public/AI/pile/train/"
file_numbers: "0-1"
preprocess_data: True
download_vocab_url: "https://huggingface.co/gpt2/resolve/main/vocab.json"
download_merges_url: "https://huggingface.co/gpt2/resolve/main/merges.txt"
vocab_save_dir: ${data_dir}/bpe
merges_save_dir: ${data_dir}/bpe
tokenizer_type: GPT2BPETokenizer
log_dir: ${base_results_dir}/data_preparation/gpt3_pile_logs
rm_downloaded: True
rm_extracted: True
nodes: 30
time_limit: "4:00:00"
bcp_preproc_npernode: 2
"""


def test_bignlp_data_preparation_file_without_a_run_section(tmp_path, capsys):
    """The Azure tutorial's data step on its own bignlp-scripts tree stopped at 'data_preparation.run.name
    is empty': that release's file has no run section. Its log_dir is the stage's directory now, its
    time_limit the job's, and its nodes are said to be replaced by one array task per shard."""
    tree = bignlp_tree(tmp_path, "run_data_preparation: True\nrun_training: False\nbignlp_path: /shared\n")
    (tree / "data_preparation" / "download_gpt3_pile.yaml").write_text(BIGNLP_PILE)
    argv = [*AZURE_TRAINING, "data_preparation=download_gpt3_pile", f"launcher_scripts_path={tmp_path}"]
    plan = build_plan(compose(argv, tree))
    [job] = plan.jobs
    assert job.run_dir == tmp_path / "results" / "data_preparation" / "gpt3_pile_logs"
    assert (job.run_name, job.array) == ("download_gpt3_pile", 2)
    write_run_files(plan, [])
    script = next(job.run_dir.glob("*_submission.sh")).read_text()
    assert "#SBATCH --time=4:00:00\n" in script
    assert "data_preparation.nodes (one array task per shard)" in capsys.readouterr().err


def test_a_training_blend_of_the_prepared_shards_keeps_its_weights(tmp_path, capsys):
    """With stages=[data_preparation,training], the training read the token-weighted blend data
    preparation writes in place of its own data_prefix, whatever that said: the Azure tutorial's
    [0.5, my-gpt3_00, 0.5, my-gpt3_01], or 0.7/0.3 typed on the command line, were replaced without
    a word. A data_prefix that names exactly the prepared shards is now the training's blend, as NeMo
    reads it; one that names others still gets the prepared blend, and says so."""
    from gptrain.launch.launcher import launch_notes

    tree = tmp_path / "conf"
    shutil.copytree(conf("23.07"), tree)
    pile = tree / "data_preparation/gpt3/download_gpt3_pile.yaml"
    pile.write_text(pile.read_text().replace("0-29", "0-1"))
    base = ["stages=[data_preparation,training]", "training=gpt3/126m", f"launcher_scripts_path={tmp_path}"]
    blend = "[0.7,${data_dir}/my-gpt3_00_text_document,0.3,${data_dir}/my-gpt3_01_text_document]"
    plan = build_plan(compose([*base, f"training.model.data.data_prefix={blend}"], tree))
    training = plan.jobs[-1]
    assert training.stage == "training" and training.setup == []  # no apply-blend step
    data = tmp_path / "data"
    prefix = plan.configs["training"]["model"]["data"]["data_prefix"]
    assert prefix == [0.7, f"{data}/my-gpt3_00_text_document", 0.3, f"{data}/my-gpt3_01_text_document"]
    assert not [note for note in launch_notes(plan, ["data_preparation", "training"]) if "blend" in note]
    # NeMo's file lists all 30 shards: the training reads the blend of the 2 prepared, said in a note
    plan = build_plan(compose(base, tree))
    assert any("apply-blend" in word for step in plan.jobs[-1].setup for word in step)
    notes = launch_notes(plan, ["data_preparation", "training"])
    assert (
        "note  training: reads the blend data_preparation writes"
        f" ({data}/blend.yaml, weighted by tokens), not training.model.data.data_prefix, which names 28"
        " prefix(es) data_preparation does not write" in notes
    )
    # some of the prepared shards only (a subset): read as written too, as NeMo reads it
    plan = build_plan(
        compose([*base, "training.model.data.data_prefix=[1.0,${data_dir}/my-gpt3_00_text_document]"], tree)
    )
    assert plan.jobs[-1].setup == []
    assert plan.configs["training"]["model"]["data"]["data_prefix"] == [
        1.0,
        f"{data}/my-gpt3_00_text_document",
    ]


def test_a_rerun_with_resume_if_exists_false_over_checkpoints_stops_at_launch(tmp_path, capsys):
    """The Azure tutorial's benchmark passes resume_if_exists=False; launching it again under the same
    run.name was refused by the job as it started, after the queue wait. The launch says it now."""
    from gptrain.cli import main

    base = [*AZURE_TRAINING, "stages=[training]", f"launcher_scripts_path={tmp_path}", "container=null"]
    base += [
        "training.model.data.data_impl=mock",
        "training.model.data.mock_vocab_size=64",
        "cluster_type=local",
    ]
    base += ["training.trainer.num_nodes=1", "training.trainer.devices=1", "training.trainer.accelerator=cpu"]
    step = tmp_path / "results" / "gpt3_126m-1n-tp1-pp1-mbs1" / "results" / "checkpoints" / "step_200"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("{}")
    argv = ["launch", "--config-dir", str(conf("23.07")), *base]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"gptrain: error: training.exp_manager.resume_if_exists=false but {step.parent} holds an earlier"
        " run's checkpoints (step_200): resume it with training.exp_manager.resume_if_exists=true, start a"
        " new run under another training.run.name (or training.exp_manager.explicit_log_dir), or move the"
        " earlier run aside with training.exp_manager.move_aside_earlier_run=true (nothing is deleted)"
    )  # the launch's keys: the job's (`exp_manager...`) were refused as unknown, `+` read by nothing
    assert not (step.parent.parent.parent / "launcher.log").exists()  # nothing submitted
    assert main([*argv[:1], "--dry-run", *argv[1:]]) == 0  # a dry run says it as a warning
    assert "preflight: warning  training.exp_manager.resume_if_exists=false but" in capsys.readouterr().err
    moved = main([*argv[:1], "--dry-run", *argv[1:], "training.exp_manager.move_aside_earlier_run=true"])
    assert moved == 0 and "resume_if_exists=false but" not in capsys.readouterr().err


def test_a_nemo_stages_group_on_the_command_line_is_ignored_with_the_note(tmp_path, capsys):
    # NeMo's `main.py training=gpt3/5b conversion=gpt3/convert_gpt3 fine_tuning=null`; before: unknown key 'conversion'
    foreign = [
        "conversion=gpt3/convert_gpt3",
        "fine_tuning=null",
        "conversion.model.tensor_model_parallel_size=2",
    ]
    for root, paths in ((conf("24.05"), [f"launcher_scripts_path={tmp_path}"]), (CONFIG_ROOT, [])):
        resolved = compose([*paths, "training=gpt3/126m", "stages=[training]", *foreign], root).resolved()
        assert "conversion" not in resolved and "fine_tuning" not in resolved
        err = capsys.readouterr().err
        assert (
            f"{', '.join(foreign)}: gptrain runs data_preparation, validation" in err and err.count("\n") == 1
        )


def test_hydras_own_settings_on_the_command_line_are_ignored_with_a_note(tmp_path, capsys):
    # NeMo's scripts run under Hydra, which takes these; before: unknown key 'hydra.run.dir' ... prefix with +
    settings = ["hydra.run.dir=.", "hydra/job_logging=disabled"]
    cfg = load_training_config("gpt3/126m", [*settings, "trainer.max_steps=3"])
    assert cfg.trainer.max_steps == 3
    assert f"ignoring {', '.join(settings)}: Hydra's own settings" in capsys.readouterr().err
    resolved = compose([*settings, "training=gpt3/126m", f"base_results_dir={tmp_path}"]).resolved()
    assert "hydra" not in resolved and "hydra/job_logging" not in resolved
    assert f"{', '.join(settings)}: Hydra's own settings" in capsys.readouterr().err


def test_env_vars_written_flush_left_as_the_azure_tutorial_prints_them_are_refused(tmp_path, capsys):
    """The Azure tutorial prints its config.yaml edit with env_vars' entries flush left: YAML reads
    `env_vars:` as null and NCCL_TOPO_FILE, NCCL_IB_TIMEOUT, ... as top-level keys, which nothing
    reads: the jobs ran without the NDv4 topology file and IB's timeout of 22, without a word."""
    from gptrain.cli import main

    tree = tmp_path / "conf"
    shutil.copytree(conf("23.07"), tree)
    text = (tree / "config.yaml").read_text()
    block = text[text.index("env_vars:") : text.index("numa_mapping:")]
    entries = ["NCCL_TOPO_FILE: /opt/microsoft/ndv4-topo.xml", "UCX_IB_PCI_RELAXED_ORDERING: auto"]
    entries += ["NCCL_IB_PCI_RELAXED_ORDERING: 2", "NCCL_IB_TIMEOUT: 22"]
    (tree / "config.yaml").write_text(text.replace(block, "env_vars:\n" + "".join(f"{e}\n" for e in entries)))
    argv = [*AZURE_TRAINING, "stages=[training]", f"launcher_scripts_path={tmp_path}"]
    with pytest.raises(ConfigError) as error:
        build_plan(compose(argv, tree))
    assert str(error.value) == (
        "NCCL_TOPO_FILE, UCX_IB_PCI_RELAXED_ORDERING, NCCL_IB_PCI_RELAXED_ORDERING, NCCL_IB_TIMEOUT: top-level"
        " keys the launcher does not read, named as environment variables; to export them to the jobs put"
        " them under env_vars (indented below `env_vars:` in config.yaml, or env_vars.NAME=VALUE)"
    )
    assert main(["launch", "--dry-run", "--config-dir", str(tree), *argv, "+NCCL_DEBUG=INFO"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("gptrain: error: NCCL_TOPO_FILE, ")
    # indented as the release's own entries are, they are exported
    (tree / "config.yaml").write_text(
        text.replace(block, "env_vars:\n" + "".join(f"  {e}\n" for e in entries))
    )
    top = build_plan(compose(argv, tree)).top
    assert (top["env_vars"]["NCCL_TOPO_FILE"], top["env_vars"]["NCCL_IB_TIMEOUT"]) == (
        "/opt/microsoft/ndv4-topo.xml",
        22,
    )
    # an override in capitals: the same line; a capitalized root of the user's own that is read stays
    with pytest.raises(
        ConfigError, match=r"^NCCL_DEBUG: a top-level key the launcher does not read, named as"
    ):
        build_plan(compose([*argv, "+NCCL_DEBUG=INFO"], tree))
    plan = build_plan(compose([*argv, "+FSX=/fsx", "data_dir=${FSX}/data"], tree))
    assert plan.resolved["data_dir"] == "/fsx/data"


@pytest.mark.parametrize("tree", ["conf", "launcher_scripts/conf"])
def test_a_launch_beside_a_nemo_conf_tree_without_config_dir_is_refused(tree, tmp_path, monkeypatch, capsys):
    """The Azure tutorial runs `python3 main.py ...` in bignlp-scripts/, whose main.py reads the conf/
    there (the AWS one from the launcher's parent, launcher_scripts/conf): the same arguments to
    `gptrain launch` read gptrain's bundled configs instead, without a word, and the edits of
    bcm.yaml (partition: ndmv4), config.yaml (env_vars) and the training file were never read."""
    from gptrain.cli import main

    shutil.copytree(conf("23.07"), tmp_path / tree)
    monkeypatch.chdir(tmp_path)
    argv = [*AZURE_TRAINING, "stages=[training]", "training.model.data.data_impl=mock"]
    assert main(["launch", "--dry-run", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: {tree}/config.yaml is a launcher conf tree, but without --config-dir gptrain launch"
        f" reads its bundled configs: give --config-dir {tree} to launch from it (NeMo's main.py reads its"
        f" conf/), or --config-dir {CONFIG_ROOT} for the bundled ones"
    )
    base = ["launch", "--dry-run", *argv, f"launcher_scripts_path={tmp_path}"]
    assert main([*base[:2], "--config-dir", tree, *base[2:]]) == 0, capsys.readouterr().err
    assert (tmp_path / "results" / "gpt3_126m-1n-tp1-pp1-mbs1" / "dry-run").is_dir()  # the tree's config.yaml
    bundled = ["launch", "--dry-run", "--config-dir", str(CONFIG_ROOT), *argv, "cluster_type=slurm"]
    assert main([*bundled, f"base_results_dir={tmp_path}/bundled"]) == 0, capsys.readouterr().err
    assert main(["launch", "--dry-run", "--config-name", "other", *argv]) == 2  # any root name: its file
    assert "give --config-dir" not in capsys.readouterr().err


def test_the_aws_tutorials_cluster_copy_nested_in_the_tree_is_noted(tmp_path):
    """nemo-megatron-on-slurm-aws.md copies its bcm.yaml with `cp -Rv conf.template/cluster
    .../launcher_scripts/conf/cluster`: that directory exists, so cp puts the copy inside it
    (conf/cluster/cluster/bcm.yaml) and cluster=bcm read the release's file, partition null and no
    gres, without a word. The launch reads it still (cluster=cluster/bcm picks the copy), and says so."""
    from gptrain.launch.launcher import launch_notes

    tree = tmp_path / "conf"
    shutil.copytree(conf("23.07"), tree)
    (tree / "cluster" / "cluster").mkdir()
    edited = (tree / "cluster" / "bcm.yaml").read_text().replace("partition: null", "partition: us-east-1e")
    (tree / "cluster" / "cluster" / "bcm.yaml").write_text(edited + "gres: gpu:8\n")
    argv = [*AZURE_TRAINING, "stages=[training]", f"launcher_scripts_path={tmp_path}", "container=null"]
    plan = build_plan(compose(argv, tree))
    assert plan.cluster["partition"] is None
    assert (
        f"note  cluster=bcm reads {tree}/cluster/bcm.yaml; {tree}/cluster/cluster/bcm.yaml beside it differs"
        " (`cp -R` of a cluster/ directory onto the existing one puts the copy inside it): copy that file"
        " over cluster/bcm.yaml, or pick cluster=cluster/bcm" in launch_notes(plan, ["training"])
    )
    prep = build_plan(compose([*argv, "stages=[data_preparation]"], tree))  # said for any stage
    assert [note for note in launch_notes(prep, ["data_preparation"]) if "cp -R" in note]
    assert build_plan(compose([*argv, "cluster=cluster/bcm"], tree)).cluster["partition"] == "us-east-1e"
    shutil.copy(tree / "cluster" / "cluster" / "bcm.yaml", tree / "cluster" / "bcm.yaml")  # the fix
    plan = build_plan(compose(argv, tree))
    assert plan.cluster["partition"] == "us-east-1e"
    assert not [note for note in launch_notes(plan, ["training"]) if "cp -R" in note]


def test_run_switches_beside_a_stages_list_in_config_yaml_are_ignored_as_nemo_does(tmp_path, capsys):
    """A config.yaml upgraded from bignlp-scripts 22.x (23.07's stages list, the old run_* switches
    left in): the switches picked the stages, where NeMo 23.07+ reads only the list. The list decides
    now, and the note names the switches dropped (an override of one of them too)."""
    tree = tmp_path / "conf"
    shutil.copytree(conf("23.07"), tree)  # stages: [training, conversion, evaluation, export]
    with (tree / "config.yaml").open("a") as config:
        config.write("run_data_preparation: True\nrun_training: False\nrun_conversion: True\n")
    base = ["training=gpt3/126m", f"launcher_scripts_path={tmp_path}"]
    resolved = compose(base, tree).resolved()
    assert resolved["stages"] == ["training"]  # the list's, less the stages gptrain does not run
    assert not any(key.startswith("run_") for key in resolved)
    notes = capsys.readouterr().err
    assert notes.count("\n") == 1
    assert (
        "run_data_preparation, run_training, run_conversion (NeMo reads no run_* switch beside a stages"
        " list: give stages=[...] to choose the stages)" in notes
    )
    resolved = compose([*base, "run_training=True", "stages=[data_preparation]"], tree).resolved()
    assert resolved["stages"] == ["data_preparation"]
    assert "run_data_preparation, run_training=True, run_conversion (NeMo" in capsys.readouterr().err
