"""NeMo's own training file (examples/nlp/language_modeling/conf/megatron_gpt_config.yaml, what
megatron_gpt_pretraining.py reads with Hydra) loads in gptrain: its keys, with our own values."""

from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError

NEMO_GPT_CONFIG = str(Path(__file__).parent / "nemo_training" / "megatron_gpt_config.yaml")
DATA = "model.data.data_prefix=[1.0,/data/tiny_text_document]"


def load(*overrides: str):
    return load_training_config(
        config_file=NEMO_GPT_CONFIG, overrides=[DATA, *overrides], report_ignored=False
    )


def test_nemo_gpt_config_loads_with_its_own_interpolations_and_defaults():
    cfg = load()
    model = cfg.model
    assert model.data.seq_length == model.max_position_embeddings == 64  # ${model.encoder_seq_length}
    assert model.ffn_hidden_size == 256  # ${multiply:4, ${.hidden_size}}
    assert (model.position_embedding_type, model.rotary_percentage, model.num_query_groups) == (
        "rope",
        0.5,
        2,
    )
    assert model.data.data_prefix == [1.0, "/data/tiny_text_document"] and model.data.eod_mask_loss
    assert (model.optim.lr, model.optim.sched.warmup_steps, model.optim.sched.constant_steps) == (3e-4, 8, 0)
    assert cfg.trainer.max_steps == 40 and cfg.trainer.precision == "32"
    # `explicit_log_dir: null` is NeMo's "choose one": gptrain's default, not a refusal
    assert cfg.exp_manager.explicit_log_dir == "results/gpt3_126m/results"
    assert cfg.exp_manager.resume_from_checkpoint is None  # ${model.resume_from_checkpoint}
    ignored = set(cfg.ignored_keys)
    assert {"model.reset_lr", "model.reset_lr_steps", "model.drop_layers", "model.skip_train"} <= ignored
    assert {"model.dist_ckpt_parallel_load", "model.data.num_dataset_builder_threads", "name"} <= ignored
    assert "model.cpu_offloading_num_layers" in ignored  # ${sum:${.num_layers},-1} resolved


def test_nemo_gpt_config_reports_what_it_ignores_on_one_line(capsys):
    load_training_config(config_file=NEMO_GPT_CONFIG, overrides=[DATA])
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gptrain: ignoring NeMo keys (")
    assert "NeMo's experiment name (gptrain names a run by run.name): name" in line
    assert "MLPerf" not in line  # the file is NeMo's, not MLPerf's (s3_checkpointing, name)


def test_nemo_gpt_config_without_its_data_prefix_names_the_key(capsys):
    assert main(["train", "--config-file", NEMO_GPT_CONFIG]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        f"gptrain: error: {NEMO_GPT_CONFIG}: 'model.data.data_prefix' is ??? (mandatory) in the file: "
        "give it, e.g. model.data.data_prefix=..."
    )


def test_restore_from_ckpt_is_the_checkpoint_to_start_from():
    cfg = load("model.restore_from_ckpt=/runs/old/checkpoints")
    assert cfg.exp_manager.resume_from_checkpoint == "/runs/old/checkpoints"
    assert cfg.exp_manager.load_data_position is False  # NeMo's continue_training: samples from 0
    assert load("exp_manager.resume_from_checkpoint=/runs/old").exp_manager.load_data_position is True
    with pytest.raises(ConfigError) as error:
        load("model.restore_from_ckpt=/runs/a", "exp_manager.resume_from_checkpoint=/runs/b")
    assert str(error.value) == (
        "exp_manager.resume_from_checkpoint (/runs/b) and model.restore_from_ckpt (/runs/a) differ: give one of them"
    )


REFUSED = {
    "model.reset_lr=true": "exp_manager.load_optimizer=false",
    "model.optim.sched.last_epoch=100": "a resumed run takes the schedule's step from its checkpoint",
    "model.restore_from_path=/models/gpt.nemo": "exp_manager.finetune=true",
    "model.skip_train=true": "gptrain eval RUN",
    "model.data.data_cache_generation_only=true": "gptrain builds the caches at the start of training",
    "model.drop_layers=[0]": "layers left out of the model",
    "model.scale_positional_embedding=true": "rope frequency scaling",
    "exp_manager.create_early_stopping_callback=true": "gptrain trains to trainer.max_steps",
    "exp_manager.checkpoint_callback_params.train_time_interval=01:00:00": "set every_n_train_steps",
    "exp_manager.checkpoint_callback_params.save_weights_only=true": "gptrain export RUN --to hf OUT",
    "exp_manager.checkpoint_callback_params.save_on_train_epoch_end=true": "(null: at each validation)",
    "exp_manager.ema.enable=true": "an exponential moving average of the weights",
}


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_a_value_gptrain_cannot_honour_is_refused_in_one_line_naming_the_key(override):
    key, _, value = override.partition("=")
    with pytest.raises(ConfigError) as error:
        load(override)
    message = str(error.value)
    assert message.startswith(f"override '{override}': '{key}: ") and "\n" not in message
    assert "which gptrain does not implement" in message and REFUSED[override] in message


# NeMo's ExpManagerConfig keys as its examples carry them (the values are NeMo's defaults, but for
# use_datetime_version and version, which NeMo too ignores under an explicit_log_dir).
NEMO_EXP_MANAGER_DEFAULTS = [
    "exp_manager.version=null",
    "exp_manager.version=v2",
    "exp_manager.use_datetime_version=true",
    "exp_manager.use_datetime_version=false",
    "exp_manager.create_early_stopping_callback=false",
    "exp_manager.early_stopping_callback_params.patience=10",
    "exp_manager.checkpoint_callback_params.train_time_interval=null",
    "exp_manager.checkpoint_callback_params.save_weights_only=false",
    "exp_manager.checkpoint_callback_params.save_weights_only=null",  # NeMo reads null as false
    "exp_manager.checkpoint_callback_params.save_on_train_epoch_end=false",
    "exp_manager.checkpoint_callback_params.save_on_train_epoch_end=null",
    "exp_manager.checkpoint_callback_params.save_best_model=true",
    "exp_manager.checkpoint_callback_params.verbose=true",
    "exp_manager.checkpoint_callback_params.auto_insert_metric_name=false",
    "exp_manager.checkpoint_callback_params.prefix=megatron_gpt",
    "exp_manager.checkpoint_callback_params.postfix=.nemo",
    "exp_manager.resume_past_end=false",
    "exp_manager.disable_validation_on_resume=true",
    "exp_manager.create_preemption_callback=true",
    "exp_manager.files_to_copy=[a.yaml]",
    "exp_manager.summary_writer_kwargs.flush_secs=30",
    "exp_manager.create_mlflow_logger=false",
    "exp_manager.mlflow_logger_kwargs.experiment_name=x",
    "exp_manager.create_dllogger_logger=false",
    "exp_manager.dllogger_logger_kwargs.json_file=x.json",
    "exp_manager.create_clearml_logger=false",
    "exp_manager.clearml_logger_kwargs.project=x",
    "exp_manager.log_local_rank_0_only=false",
    "exp_manager.log_delta_step_timing=false",
    "exp_manager.log_tflops_per_sec_per_gpu=true",
    "exp_manager.ema.enable=false",
    "exp_manager.ema.enable=null",
    "exp_manager.ema.decay=0.999",
    "exp_manager.create_straggler_detection_callback=false",
    "exp_manager.straggler_detection_params.stop_if_detected=false",
    "exp_manager.create_fault_tolerance_callback=false",
    "exp_manager.fault_tolerance.max_rank_restarts=0",
]


@pytest.mark.parametrize("override", NEMO_EXP_MANAGER_DEFAULTS)
def test_nemo_exp_manager_keys_of_its_examples_load_and_are_reported_ignored(override):
    """Before, each was refused as an unknown key, so a config copied from NeMo's examples did not load."""
    cfg = load(override)
    key = override.split("=")[0]
    assert any(f"{key}.".startswith(f"{ignored}.") for ignored in cfg.ignored_keys)  # or its sub-tree
    assert cfg.exp_manager.explicit_log_dir == "results/gpt3_126m/results"  # no version subdirectory


def test_save_on_train_epoch_end_is_taken_beside_a_given_every_n_train_steps():
    """Lightning saves on every_n_train_steps whatever save_on_train_epoch_end holds (it only moves the
    saves at validation); gptrain refused `true` even beside the interval. Null still refuses it."""
    epoch_end = "exp_manager.checkpoint_callback_params.save_on_train_epoch_end=true"
    cfg = load(epoch_end, "exp_manager.checkpoint_callback_params.every_n_train_steps=10")
    assert cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 10
    assert "exp_manager.checkpoint_callback_params.save_on_train_epoch_end" in cfg.ignored_keys
    with pytest.raises(ConfigError, match="save_on_train_epoch_end: True' asks for checkpoints at the end"):
        load(epoch_end, "exp_manager.checkpoint_callback_params.every_n_train_steps=null")


def test_checkpoint_naming_keys_are_reported_as_naming_on_the_one_line(capsys):
    """Lightning's ModelCheckpoint keys that only name files or print were unknown keys: the note says
    that gptrain names its checkpoints step_<N>."""
    params = "exp_manager.checkpoint_callback_params"
    load_training_config(
        "gpt3/126m",
        [f"{params}.verbose=false", f"{params}.auto_insert_metric_name=false", f"{params}.prefix=x"],
    )
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "gptrain: ignoring NeMo keys (PyTorch Lightning's checkpoint file names and messages (gptrain names "
        f"each checkpoint checkpoints/step_<N> and logs each save): {params}.verbose, "
        f"{params}.auto_insert_metric_name, {params}.prefix)"
    )


def test_a_refused_value_inside_an_ignored_section_of_a_file_names_the_file_and_key(tmp_path):
    """exp_manager.ema is ignored as a whole; its enable: true (EMA weights validated and saved) is
    refused, as the override is, where the section's keys were not looked at."""
    text = Path(NEMO_GPT_CONFIG).read_text()
    path = tmp_path / "megatron_gpt_config.yaml"
    path.write_text(
        text.replace("\nexp_manager:\n", "\nexp_manager:\n  ema:\n    enable: true\n    decay: 0.99\n", 1)
    )
    with pytest.raises(ConfigError) as error:
        load_training_config(config_file=str(path), overrides=[DATA], report_ignored=False)
    assert str(error.value).startswith(
        f"{path}: 'exp_manager.ema.enable: True' asks for an exponential moving"
    )
    path.write_text(text.replace("\nexp_manager:\n", "\nexp_manager:\n  ema:\n    enable: false\n", 1))
    cfg = load_training_config(config_file=str(path), overrides=[DATA], report_ignored=False)
    assert "exp_manager.ema" in cfg.ignored_keys


@pytest.mark.parametrize("override", ["model.reset_lr=true", "model.drop_layers=[1]"])
def test_a_refused_value_in_the_file_names_the_file(override, tmp_path):
    key, _, value = override.partition("=")
    leaf = key.rpartition(".")[2]
    text = Path(NEMO_GPT_CONFIG).read_text()
    assert text.count(f"\n  {leaf}: ") == 1
    path = tmp_path / "megatron_gpt_config.yaml"
    path.write_text(text.replace(f"\n  {leaf}: ", f"\n  {leaf}: {value}  # was: ", 1))
    with pytest.raises(ConfigError) as error:
        load_training_config(config_file=str(path), overrides=[DATA], report_ignored=False)
    assert str(error.value).startswith(f"{path}: '{key}: ")


def test_reset_lr_steps_alone_changes_nothing():
    """NeMo reads reset_lr_steps only under reset_lr (refused): alone it is ignored, as in NeMo."""
    assert "model.reset_lr_steps" in load("model.reset_lr_steps=true").ignored_keys


def test_a_file_without_every_n_train_steps_saves_at_each_validation_as_nemo_does():
    """NeMo's CallbackParams default every_n_train_steps to None (save at each validation), and its
    files leave it out; gptrain saved every 2000 steps instead: a 40-step run saved only at its end."""
    from types import SimpleNamespace

    from gptrain.train.saving import saves_at

    cfg = load()
    assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval) == (40, 20)
    session = SimpleNamespace(cfg=cfg)
    assert [step for step in range(1, 41) if saves_at(session, step)] == [20, 40]


def test_the_bignlp_22_06_training_files_keys_are_ignored_with_their_reasons(capsys):
    """bignlp-scripts 22.06's training/gpt3/*.yaml (the Azure NDv4 tutorial's release, which it edits
    only for its data_prefix) has trainer.amp_backend (Lightning 1.x) and model.model_type: both
    were refused as unknown keys, so the tutorial's training stopped at the first."""
    cfg = load_training_config("gpt3/126m", ["trainer.amp_backend=native", "model.model_type=gpt"])
    assert {"trainer.amp_backend", "model.model_type"} <= set(cfg.ignored_keys)
    [line] = capsys.readouterr().err.splitlines()
    assert "(gptrain has its own loop): trainer.amp_backend" in line
    assert "bignlp-scripts 22.x's model family of the file (gptrain's model is GPT): model.model_type" in line


@pytest.mark.parametrize(
    "overrides, tanh",
    [
        ((), True),  # the file's bias_activation_fusion: true, activation gelu, bias true
        (("model.bias_activation_fusion=false",), False),
        (("model.bias=false",), False),  # nothing to fuse: Megatron turns the fusion off
        (("model.bias_activation_fusion=false", "model.openai_gelu=true"), True),
        (("model.activation=swiglu",), False),  # a gated MLP: SiLU, no GELU to approximate
    ],
)
def test_bias_activation_fusion_picks_the_tanh_gelu_nemo_runs(overrides, tanh):
    """NeMo's bias_activation_fusion runs Megatron's fused bias-GELU kernel, GELU's tanh approximation
    (megatron/core/fusions/fused_bias_gelu.py): true with gelu and biases trains the tanh GELU, false
    the erf one. It was reported as an ignored fused-kernel switch, and every run trained erf."""
    cfg = load(*overrides)
    assert cfg.model.openai_gelu is tanh
    assert "model.bias_activation_fusion" not in cfg.ignored_keys
