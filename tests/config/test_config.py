import os
import re
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from gptrain.config import all_keys, list_presets, load_training_config
from gptrain.config.validate import get
from gptrain.errors import ConfigError
from gptrain.launch.compose import compose

NEMO_SHAPES = {  # layers, hidden, heads from the NeMo launcher's GPT-3 family
    "gpt3/126m": (12, 768, 12),
    "gpt3/400m_improved": (24, 1024, 16),
    "gpt3/1b_improved": (24, 2048, 16),
    "gpt3/5b": (24, 4096, 32),
    "gpt3/7b_improved": (32, 4096, 32),
    "gpt3/20b": (44, 6144, 48),
    "gpt3/40b": (48, 8192, 64),
    "gpt3/40b_improved": (48, 8192, 64),
    "gpt3/175b": (96, 12288, 96),
}


@pytest.mark.parametrize("preset", sorted(NEMO_SHAPES))
def test_every_preset_loads_and_validates(preset):
    cfg = load_training_config(preset)
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == NEMO_SHAPES[preset]
    assert cfg.model.data.seq_length == cfg.model.encoder_seq_length == 2048
    assert cfg.exp_manager.explicit_log_dir == f"results/{cfg.run.name}/results"
    assert cfg.model.ffn_hidden_size >= cfg.model.hidden_size
    if preset.endswith("_improved"):
        assert cfg.model.position_embedding_type == "rope" and cfg.model.activation == "fast-swiglu"
        assert not cfg.model.bias and not cfg.model.share_embeddings_and_output_weights


def test_every_shipped_yaml_is_a_known_preset():
    assert sorted(NEMO_SHAPES) == [p for p in list_presets() if p.startswith("gpt3/")]
    for preset in list_presets():
        load_training_config(preset, report_ignored=False)


def test_overrides_are_typed_and_interpolations_follow():
    cfg = load_training_config(
        "gpt3/126m",
        [
            "model.encoder_seq_length=256",
            "trainer.max_steps=5",
            "model.optim.lr=1e-4",
            "model.data.data_prefix=[0.3,/d/a,0.7,/d/b]",
            "trainer.precision=16-mixed",
            "base_results_dir=/tmp/r",
            "training.run.name=my run",
        ],
    )
    assert cfg.model.data.seq_length == 256 and cfg.model.max_position_embeddings == 256
    assert cfg.trainer.max_steps == 5 and cfg.model.optim.lr == pytest.approx(1e-4)
    assert cfg.model.data.data_prefix == [0.3, "/d/a", 0.7, "/d/b"]
    assert cfg.trainer.precision == "16"
    assert cfg.run.results_dir == "/tmp/r/my run"
    assert cfg.exp_manager.explicit_log_dir == "/tmp/r/my run/results"
    assert cfg.model.ffn_hidden_size == 4 * 768


def test_the_nemo_launchers_divide_resolvers_resolve_in_train_and_launch(tmp_path):
    # NeMo's main.py registers divide_ceil and divide_floor beside multiply; before: Unsupported interpolation type
    cfg = load_training_config("gpt3/126m", ["model.num_layers=${divide_ceil:23,2}",
                                             "model.num_attention_heads=${divide_floor:25,2}"])  # fmt: skip
    assert (cfg.model.num_layers, cfg.model.num_attention_heads) == (12, 12)
    composed = compose(["training.trainer.num_nodes=${divide_ceil:${training.model.tensor_model_parallel_size},8}",
                        f"base_results_dir={tmp_path}"])  # fmt: skip
    assert composed.resolved()["training"]["trainer"]["num_nodes"] == 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.name=${oc.env:GPTRAIN_TEST_UNSET}", "cannot resolve 'training.run.name': .*GPTRAIN_TEST_UNSET"),
        (
            "model.num_layers=${model.nope}",
            "cannot resolve 'training.model.num_layers': .*'model.nope' not found",
        ),
        ("model.num_layers=???", r"'model.num_layers' is \?\?\?: give it"),
    ],
)
def test_an_override_that_cannot_resolve_is_named_not_the_preset(override, message, monkeypatch):
    # before: "<...>/gpt3/126m.yaml: cannot resolve ...", sending the user to a file they did not edit
    monkeypatch.delenv("GPTRAIN_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError, match=rf"^override '{re.escape(override)}': {message}"):
        load_training_config("gpt3/126m", [override])


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("run.name=${oc.env:GPTRAIN_TEST_UNSET}", "; set GPTRAIN_TEST_UNSET, or give a default: "
         "${oc.env:GPTRAIN_TEST_UNSET,DEFAULT}"),
        ("trainer.num_nodes=${GPTRAIN_TEST_UNSET}", "; for the environment variable write ${oc.env:GPTRAIN_TEST_UNSET}"),
    ],
)  # fmt: skip
def test_an_environment_variable_that_cannot_be_read_says_what_to_write(override, hint, monkeypatch):
    """OmegaConf's message named the variable, and not what to do about it."""
    monkeypatch.delenv("GPTRAIN_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override], report_ignored=False)
    assert str(error.value).startswith(f"override '{override}': cannot resolve") and str(
        error.value
    ).endswith(hint)


def test_unknown_key_suggests_closest():
    with pytest.raises(
        ConfigError, match=r"unknown key 'model.hiden_size'.*did you mean 'model.hidden_size'"
    ):
        load_training_config("gpt3/126m", ["model.hiden_size=10"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.optim={name: adamw, lr: abc}", "'model.optim.lr' expects a finite float, got 'abc'"),
        ("trainer={max_steps: abc}", "'trainer.max_steps' expects int, got 'abc'"),
        ("model.data={seq_length: abc}", "'model.data.seq_length' expects int, got 'abc'"),
        ("model={data: {seq_length: abc}}", "'model.data.seq_length' expects int, got 'abc'"),
    ],
)
def test_a_bad_value_inside_a_mapping_override_is_blamed_on_that_override(override, message):
    """The value came from the command line's mapping, but the error named the preset file, which
    does not hold it (a key set by its own override was named right)."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override], report_ignored=False)
    assert str(error.value).startswith(f"override '{override}': {message}")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "model.optim.betas=[0.9,abc]",
            "'model.optim.betas' expects a list of finite floats, got [0.9, 'abc']: item 2, 'abc', is not a"
            " finite float",
        ),
        ("model.optim.betas=abc", "'model.optim.betas' expects a list of finite floats, got 'abc'"),
        (
            "model.rampup_batch_size=[4,x,100]",
            "'model.rampup_batch_size' expects a list of whole numbers, got [4, 'x', 100]: item 2, 'x', is not"
            " a whole number",
        ),
    ],
)
def test_a_list_keys_bad_item_is_named(override, message):
    """A list for a list key, one item wrong: the error said it 'expects list' of what is a list."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override], report_ignored=False)
    assert str(error.value) == f"override '{override}': {message}"


@pytest.mark.parametrize(
    ("override", "key", "problem"),
    [
        ("trainer={devices: 1}", "trainer.max_steps", "expects int, got 'abc'"),
        ("model={optim: {lr: 2e-3}}", "model.optim.sched.warmup_steps", "expects int, got 'xyz'"),
        ("model.data={seq_length: 64}", "model.data.data_prefix", "is ??? (mandatory) in the file: give it"),
    ],
)
def test_a_mapping_override_is_not_blamed_for_the_keys_the_file_set(tmp_path, override, key, problem):
    """A mapping merged into a section claimed the whole section: `trainer={devices: 1}` was named
    for the file's `max_steps: abc`, which no override set."""
    path = tmp_path / "bad.yaml"
    bad = {
        "trainer.max_steps": "abc",
        "model.optim.sched.warmup_steps": "xyz",
        "model.data.data_prefix": "???",
    }
    path.write_text(yaml.safe_dump(OmegaConf.to_container(OmegaConf.from_dotlist([f"{key}={bad[key]}"]))))
    with pytest.raises(ConfigError) as error:
        load_training_config(config_file=str(path), overrides=[override], report_ignored=False)
    assert str(error.value).startswith(f"{path}: '{key}' {problem}")


def test_unknown_key_in_file_names_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"max_step": 3}}))
    with pytest.raises(ConfigError, match=r"c.yaml: unknown key 'trainer.max_step'.*trainer.max_steps"):
        load_training_config(config_file=str(path))


@pytest.mark.parametrize(
    ("text", "key", "section"),
    [
        ("trainer.max_steps: 5\n", "trainer.max_steps", "the top level"),
        ("model:\n  optim.lr: 0.1\n", "optim.lr", "model"),
    ],
)
def test_a_key_with_a_dot_in_a_file_says_to_nest_it(tmp_path, text, key, section):
    """OmegaConf reads `trainer.max_steps: 5` as one key named so (NeMo would not see it); the refusal
    said "unknown key 'trainer.max_steps'; did you mean 'trainer.max_steps'?"."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    loaded = OmegaConf.load(path)  # the reference: one key, not nested
    assert key in (loaded if section == "the top level" else loaded[section])
    first, _, rest = key.partition(".")
    with pytest.raises(ConfigError) as error:
        load_training_config(config_file=str(path))
    assert str(error.value) == (
        f"{path}: '{key}' in {section} is one key with a dot in its name (YAML nests keys only by"
        f" indentation); write it nested: '{first}:' and under it '{rest}:'"
    )


def test_nemo_key_is_ignored_and_reported_once(capsys):
    cfg = load_training_config("gpt3/126m", ["model.megatron_amp_O2=true", "model.transformer_engine=false"])
    assert set(cfg.ignored_keys) == {"model.megatron_amp_O2", "model.transformer_engine"}
    err = capsys.readouterr().err
    assert err.count("ignoring NeMo keys") == 1 and "model.megatron_amp_O2" in err


def test_monitor_and_mode_are_taken_and_a_preset_keeps_the_newest(capsys):
    """NeMo keeps the save_top_k best checkpoints by `monitor` and `mode`: they were ignored (reported
    at load), so a NeMo config's `monitor: val_loss` kept the newest. gptrain's presets set no monitor
    (NeMo's default, val_loss, would change their retention): they keep the newest, as before."""
    params = load_training_config("gpt3/126m").exp_manager.checkpoint_callback_params
    assert (params.monitor, params.mode) == (None, "min")
    params = load_training_config(
        "gpt3/126m",
        [
            "exp_manager.checkpoint_callback_params.monitor=val_loss",
            "exp_manager.checkpoint_callback_params.mode=max",
        ],
    ).exp_manager.checkpoint_callback_params
    assert (params.monitor, params.mode) == ("val_loss", "max")
    assert "checkpoint_callback_params.m" not in capsys.readouterr().err  # neither reported as ignored


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "exp_manager.checkpoint_callback_params.monitor=val_acc",
            "exp_manager.checkpoint_callback_params.monitor: 'val_acc' is not recorded with a checkpoint; "
            "use val_loss to keep the best by validation loss, step (with mode=max) or null to keep the newest",
        ),
        (
            "exp_manager.checkpoint_callback_params.mode=lowest",
            "exp_manager.checkpoint_callback_params.mode: 'lowest' is not one of min, max",
        ),
    ],
)
def test_a_monitor_no_save_records_or_an_unknown_mode_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override])
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("override", "accepted"),
    [
        ("model.data.reset_position_ids=false", True),
        ("model.data.reset_position_ids=true", False),
        ("model.data.reset_attention_mask=true", False),
        ("model.context_parallel_size=1", True),
        ("model.context_parallel_size=2", False),
        ("model.ffn_dropout=0.0", True),
        ("model.ffn_dropout=0.1", False),
        ("model.transformer_block_type=pre_ln", True),
        ("model.transformer_block_type=post_ln", False),
        ("model.data.shuffle_documents=false", False),
        ("model.fp32_residual_connection=0", True),  # NeMo reads 0 as false
        ("model.layernorm_zero_centered_gamma=true", True),  # layernorm1p: the same function
        ("trainer.accumulate_grad_batches=1", True),  # the launcher's configs carry it
        ("trainer.accumulate_grad_batches=4", False),  # NeMo raises; ignored, it trained a 4x smaller batch
    ],
)
def test_an_ignored_nemo_key_that_would_change_the_model_is_refused(override, accepted, capsys):
    """Before, reset_position_ids=true and the like were reported as ignored and the run trained without them."""
    if accepted:
        assert override.split("=")[0] in load_training_config("gpt3/126m", [override]).ignored_keys
        return
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override])
    message = str(error.value)
    assert override.split("=")[0] in message and "does not implement" in message and "\n" not in message
    assert "NeMo's default" in message


@pytest.mark.parametrize("value", ["true", "1"])
def test_fp32_residual_connection_is_refused_saying_what_precision_the_stream_has(value):
    """NeMo's fp32_residual_connection=true was refused as "an fp32 residual stream, which gptrain does not
    implement", yet under DDP (autocast over fp32 weights) the stream is fp32 already; under FSDP with
    bf16 it is bf16 (the weights gathered in bf16). The line says which runs where, and why no switch."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [f"model.fp32_residual_connection={value}"])
    message = str(error.value)
    assert "does not implement" not in message and "\n" not in message
    assert (
        "model.fp32_residual_connection" in message
        and "fp32 under model.data_parallel_sharding=ddp" in message
    )
    assert "bf16 under FSDP" in message and "NeMo's default" in message


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.num_layers=abc", "'model.num_layers' expects int"),
        ("model.optim.lr=nan", "'model.optim.lr' expects a finite float, got nan"),  # passed `lr > 0` checks
        ("model.optim.lr=inf", "'model.optim.lr' expects a finite float"),  # trained to NaN losses, exit 0
        ("model.optim.sched.min_lr=-inf", "'model.optim.sched.min_lr' expects a finite float"),
        ("model.optim.lr=1" + "0" * 400, "'model.optim.lr' expects a finite float"),  # OverflowError before
        ("trainer.max_time=00:00:-1:00", "trainer.max_time: '00:00:-1:00' is not DD:HH:MM:SS"),  # was 59 min
        ("trainer.max_time=00:00:nan:00", "trainer.max_time: '00:00:nan:00' is not DD:HH:MM:SS"),  # never hit
        ("trainer.max_time=inf", "trainer.max_time: 'inf' is not DD:HH:MM:SS"),
        # each job trained one step, saved and exited 75 to be requeued, until max_requeues was spent
        ("trainer.max_time=00:00:00:00", "trainer.max_time: '00:00:00:00' leaves no time to train"),
        ("trainer.max_time=0", "trainer.max_time: '0' leaves no time to train"),
        ("exp_manager.max_time_per_run=0:0", "exp_manager.max_time_per_run: '0:0' leaves no time to train"),
        ("trainer.precision=8", "trainer.precision: '8'"),
        ("model.num_attention_heads=7", "divisible by model.num_attention_heads"),
        ("model.global_batch_size=10", "divisible by model.micro_batch_size"),
        ("model.data.seq_length=100", "model.data.seq_length (100) differs"),
        ("model.activation=relu", "model.activation: 'relu'"),
        ("model.num_query_groups=5", "model.num_query_groups (5)"),
        ("trainer.max_steps=0", "trainer.max_steps: must be at least 1"),
        # 0 (read as "never stop") and below stopped the run at the first non-finite iteration
        ("trainer.max_consecutive_nonfinite=0", "trainer.max_consecutive_nonfinite: must be at least 1 (the"),
        ("trainer.max_consecutive_nonfinite=-1", "--check-for-nan-in-loss-and-grad), got -1"),
        ("trainer.gradient_clip_val=-1.0", "trainer.gradient_clip_val: must be 0 or more, got -1.0"),
        ("model.optim.weight_decay=-0.1", "model.optim.weight_decay: must be 0 or more"),
        ("model.data.num_workers=-1", "model.data.num_workers: must be 0 or more"),
        # accepted, and refused by the job only at its start, after its wait in the queue
        ("model.optim.sched.warmup_steps=-3", "model.optim.sched.warmup_steps: must be 0 or more, got -3"),
        ("model.optim.sched.warmup_ratio=-0.1", "model.optim.sched.warmup_ratio: must be 0 or more"),
        ("model.optim.sched.warmup_samples=-8", "model.optim.sched.warmup_samples: must be 0 or more"),
        ("model.optim.sched.warmup_fraction=-0.1", "model.optim.sched.warmup_fraction: must be 0 or more"),
        ("model.optim.sched.warmup_init_lr=-1e-5", "model.optim.sched.warmup_init_lr: must be 0 or more"),
        ("model.optim.sched.constant_steps=-1", "model.optim.sched.constant_steps: must be 0 or more"),
        ("model.optim.sched.constant_ratio=-0.1", "model.optim.sched.constant_ratio: must be 0 or more"),
        ("model.optim.sched.min_lr=-1e-5", "model.optim.sched.min_lr (-1e-05) between 0 and lr"),
        ("model.optim.betas=[0.9,1.5]", "model.optim.betas ([0.9, 1.5]) must be two values in [0, 1)"),
        ("model.optim.eps=0", "model.optim.eps (0"),
        ("model.seed=4294967296", "model.seed: 4294967296 is outside 0 to 4294967295"),
        ("model.seed=-1", "model.seed: -1 is outside 0 to 4294967295"),
        # past int64: a numpy ValueError or a torch "Overflow when unpacking long long" traceback before
        ("trainer.max_steps=" + str(2**63), f"'trainer.max_steps' is {2**63}, past the 64-bit integers"),
        ("model.encoder_seq_length=1e23", f"'model.encoder_seq_length' is {int(1e23)}, past the 64-bit"),
        (
            "model.data.mock_vocab_size=-" + str(2**63 + 1),
            "'model.data.mock_vocab_size' is -9223372036854775809",
        ),
        ("noequals", "override 'noequals' is not key=value (e.g. trainer.max_steps=100"),
        ("model.data.data_prefix={train: /d/a, valid: /d/b}", "model.data.data_prefix.valid: not a split"),
        ("model.data.data_prefix={validation: /d/b}", "model.data.data_prefix.train: no training data"),
        # found only when the job built its datasets, after its wait in the queue
        (
            "model.data.splits_string=98,2,x",
            "model.data.splits_string: split string '98,2,x': 'x' is not a weight",
        ),
        ("model.data.splits_string=", "model.data.splits_string: split string '' sums to 0"),
        (
            "model.data.splits_string=1,1,1,1",
            "model.data.splits_string: split string '1,1,1,1' has 4 numbers",
        ),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_training_config("gpt3/126m", [override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.hysteresis=0", "model.hysteresis: must be at least 1, got 0"),
        ("model.native_amp_growth_interval=0", "model.native_amp_growth_interval: must be at least 1, got 0"),
        ("model.native_amp_init_scale=0", "model.native_amp_init_scale: must be greater than 0, got 0"),
    ],
)
def test_the_loss_scalers_settings_are_checked_only_where_fp16_has_a_scaler(override, message):
    """Megatron asserts each > 0 in its fp16 scaler, which bf16 and fp32 runs do not have: NeMo takes
    precision bf16 with model.hysteresis=0; gptrain refused it."""
    for precision in ("bf16", "bf16-mixed", "32"):
        cfg = load_training_config("gpt3/126m", [f"trainer.precision={precision}", override])
        assert str(get(cfg, override.split("=")[0])) in ("0", "0.0")
    for precision in ("16", "16-mixed"):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_training_config("gpt3/126m", [f"trainer.precision={precision}", override])


def test_a_static_fp16_scale_reads_only_the_scale():
    """Megatron's ConstantGradScaler (--loss-scale) reads no window or hysteresis: with
    model.native_amp_static_scale they are not checked, the scale still is."""
    static = [
        "trainer.precision=16",
        "model.native_amp_static_scale=true",
        "model.native_amp_init_scale=1024",
    ]
    cfg = load_training_config(
        "gpt3/126m", [*static, "model.native_amp_growth_interval=0", "model.hysteresis=0"]
    )
    assert cfg.model.native_amp_static_scale
    with pytest.raises(
        ConfigError, match=re.escape("model.native_amp_init_scale: must be greater than 0, got 0")
    ):
        load_training_config("gpt3/126m", [*static, "model.native_amp_init_scale=0"])


def test_a_static_fp16_scale_above_2_24_is_refused_naming_the_scale():
    """The 2**32 default is the dynamic scaler's start (it halves in a few steps); kept static, every
    fp16 backward overflowed and the run stopped after max_consecutive_nonfinite steps advising a
    lower lr. Megatron's --loss-scale always carries an explicit value."""
    static = ["trainer.precision=16", "model.native_amp_static_scale=true"]
    for scale in (None, 2**24 + 1, 2**32):
        overrides = static if scale is None else [*static, f"model.native_amp_init_scale={scale}"]
        with pytest.raises(ConfigError) as info:
            load_training_config("gpt3/126m", overrides)
        text = str(info.value)
        assert text.startswith("model.native_amp_init_scale: ") and "2**24 = 16777216" in text
        assert "\n" not in text
    cfg = load_training_config("gpt3/126m", [*static, f"model.native_amp_init_scale={2**24}"])
    assert cfg.model.native_amp_init_scale == 2**24
    dynamic = load_training_config("gpt3/126m", ["trainer.precision=16"])  # the dynamic scaler's start
    assert dynamic.model.native_amp_init_scale == 2**32


def test_a_warmup_starting_above_the_peak_rate_is_refused_naming_both_keys(tmp_path):
    """Megatron asserts --lr-warmup-init <= --lr (gptrain megatron refuses it); a NeMo YAML with
    warmup_style megatron was taken and its warmup fell from warmup_init_lr down to lr."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "model:\n  optim:\n    lr: 1.0e-4\n    sched:\n      warmup_style: megatron\n"
        "      warmup_init_lr: 1.0e-3\n      warmup_steps: 10\n  data:\n    data_impl: mock\n    mock_vocab_size: 64\n"
    )
    refusal = (
        "model.optim.sched.warmup_init_lr (0.001) is above model.optim.lr (0.0001): the warmup rises from "
        "warmup_init_lr to lr, as Megatron asserts; give a warmup_init_lr of at most lr"
    )
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        load_training_config(config_file=str(config))
    equal = load_training_config(config_file=str(config), overrides=["model.optim.sched.warmup_init_lr=1e-4"])
    assert equal.model.optim.sched.warmup_init_lr == equal.model.optim.lr


def test_a_bad_override_is_blamed_on_the_command_line_not_the_preset(tmp_path):
    """The value came from the command line: naming the preset file sent users to a file that is fine."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", ["training.trainer.max_steps=abc"])
    assert str(error.value).startswith(
        "override 'training.trainer.max_steps=abc': 'trainer.max_steps' expects int"
    )
    with pytest.raises(ConfigError, match=r"^override 'model.optim=5': 'model.optim' must be a mapping"):
        load_training_config("gpt3/126m", ["model.optim=5"])
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  max_steps: abc\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(config))}: 'trainer.max_steps' expects int"):
        load_training_config(config_file=str(config))  # from the file: the file is named, as before


@pytest.mark.parametrize("name", ["gpt3/126", "126m", "gpt3/126m.yaml"])
def test_unknown_preset_suggests(name):
    with pytest.raises(ConfigError, match="did you mean 'gpt3/126m'"):
        load_training_config(name)


def test_an_unknown_preset_far_from_all_lists_them():
    with pytest.raises(ConfigError, match="the presets are .*gpt3/126m.*quickstart/cpu"):
        load_training_config("llama")


def test_nemo_switches_map_onto_gptrain():
    cfg = load_training_config(
        "gpt3/126m", ["model.data.mock_dataset=true", "model.fsdp=true", "model.tokenizer.type=tiktoken"]
    )
    assert cfg.model.data.data_impl == "mock"
    assert cfg.model.data_parallel_sharding == "full_shard"
    assert cfg.model.tokenizer.type == "TikTokenizer"


def test_hydras_add_force_add_and_delete_forms():
    """`gptrain train gpt3/126m +trainer.max_steps=5` said "unknown key '+trainer.max_steps'; did
    you mean 'trainer.max_steps'?", `~key` "is not of the form key.sub=value"."""
    cfg = load_training_config("gpt3/126m", ["+trainer.max_steps=5", "++trainer.val_check_interval=5"])
    assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval) == (5, 5)
    preset = load_training_config("gpt3/126m")
    assert preset.model.optim.sched.min_lr > 0
    for deletion in (
        "~model.optim.sched.min_lr",
        f"~model.optim.sched.min_lr={preset.model.optim.sched.min_lr}",
    ):
        assert load_training_config("gpt3/126m", [deletion]).model.optim.sched.min_lr == 0.0  # the default
    with pytest.raises(ConfigError, match=r"^override '~model.optim.sched.min_lr=1': the value there is"):
        load_training_config("gpt3/126m", ["~model.optim.sched.min_lr=1"])
    with pytest.raises(ConfigError, match=r"^override '\+model.nope=1': unknown key 'model.nope'"):
        load_training_config("gpt3/126m", ["+model.nope=1"])  # + adds no key gptrain does not know


def test_delete_takes_away_unknown_keys_and_gives_back_the_run_directory(tmp_path):
    """`~key` of a key gptrain does not know (what a newer NeMo file carries) was "unknown key",
    and `~run.name` left `run.results_dir` unresolvable, the error naming the preset file."""
    path = tmp_path / "newer.yaml"
    path.write_text("model:\n  foo_unknown: 1\n  data:\n    data_impl: mock\n    mock_vocab_size: 64\n")
    with pytest.raises(ConfigError, match="foo_unknown"):
        load_training_config(config_file=str(path))
    assert load_training_config(config_file=str(path), overrides=["~model.foo_unknown"]).model.num_layers
    default = load_training_config("gpt3/126m")
    cfg = load_training_config("gpt3/5b", ["run.name=mine", "~base_results_dir"])
    assert cfg.run.results_dir == "results/mine"
    assert load_training_config("gpt3/126m", ["~data_dir"]).run.results_dir == default.run.results_dir
    with pytest.raises(ConfigError, match=r"^override '~run.name': a run needs a name"):
        load_training_config("gpt3/5b", ["~run.name"])  # gpt3_126m's directory for a 5b run: refused


def test_nemos_0_and_1_for_a_switch_are_false_and_true(tmp_path):
    """NeMo's mlperf presets write `resume_if_exists: 0` and `create_checkpoint_callback: 0`, which
    NeMo's typed exp_manager reads as false (as OmegaConf does); gptrain refused them ("expects bool")."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "model:\n  data:\n    data_impl: mock\n    mock_vocab_size: 64\n"
        "exp_manager:\n  resume_if_exists: 0\n  create_checkpoint_callback: 0\n"
    )
    cfg = load_training_config(config_file=str(path), overrides=["exp_manager.create_wandb_logger=1"])
    assert cfg.exp_manager.resume_if_exists is False
    assert cfg.exp_manager.create_checkpoint_callback is False
    assert cfg.exp_manager.create_wandb_logger is True
    for value in ("0.0", "maybe", "''"):  # what OmegaConf refuses for a bool field: one line
        with pytest.raises(ConfigError, match=r"'exp_manager.resume_if_exists' expects bool, got"):
            load_training_config("gpt3/126m", [f"exp_manager.resume_if_exists={value}"])


@pytest.mark.parametrize(("value", "switch"), [("yes", True), ("On", True), ("y", True), ("'no'", False),
                                                ("OFF", False), ("n", False), ("2", True), ("'0'", False)])  # fmt: skip
def test_a_switch_takes_the_words_nemos_typed_exp_manager_takes(value, switch):
    """Hydra leaves `yes`/`on` text, which NeMo's typed exp_manager (OmegaConf) reads as true;
    gptrain refused them ("expects bool, got 'yes'")."""
    cfg = load_training_config("gpt3/126m", [f"exp_manager.resume_if_exists={value}"], report_ignored=False)
    assert cfg.exp_manager.resume_if_exists is switch


def test_launcher_style_file_with_training_section(tmp_path):
    path = tmp_path / "hydra.yaml"
    path.write_text(
        "base_results_dir: /runs\ndata_dir: /data\n"
        "training:\n  run:\n    name: x\n    results_dir: ${base_results_dir}/${.name}\n"
        "  model:\n    data:\n      data_prefix: ${data_dir}/corpus_text_document\n"
    )
    cfg = load_training_config(config_file=str(path))
    assert cfg.run.results_dir == "/runs/x"
    assert cfg.model.data.data_prefix == "/data/corpus_text_document"


def test_round_trip_through_yaml(tmp_path):
    cfg = load_training_config("gpt3/1b_improved", ["trainer.max_steps=7"])
    path = tmp_path / "hparams.yaml"
    path.write_text(cfg.to_yaml())
    again = load_training_config(config_file=str(path))
    assert again.to_dict() == cfg.to_dict()


def test_schema_keys_cover_issue_keys():
    keys = set(all_keys())
    for key in [
        "run.name",
        "trainer.max_time",
        "exp_manager.checkpoint_callback_params.every_n_train_steps",
        "model.optim.sched.constant_steps",
        "model.tokenizer.merge_file",
        "model.data.splits_string",
        "model.make_vocab_size_divisible_by",
    ]:
        assert key in keys


def test_loading_config_does_not_import_torch():
    code = "import sys\nfrom gptrain.config import load_training_config\nload_training_config('gpt3/126m')\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_max_time_seconds():
    cfg = load_training_config("gpt3/126m", ["trainer.max_time=01:02:03:04"])
    assert cfg.trainer.max_time_seconds() == 86400 + 2 * 3600 + 3 * 60 + 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"trainer:\n  max_steps: 5  # caf\xe9\n", r"c\.yaml: not UTF-8 text \(byte 0xe9"),
        (
            b"trainer: &t\n  plugins: [*t]\n",
            r"c\.yaml: 'trainer\.plugins\.0' is an alias of a node that contains it",
        ),
    ],
)
def test_an_unreadable_config_file_is_one_line_naming_it(content, message, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_training_config(config_file=str(path))


def test_a_directory_given_as_the_config_file_is_said_to_be_one(tmp_path, capsys):
    """`gptrain train --config-file runs/x` (the run dir, not its hparams.yaml) said "cannot read
    config runs/x: Is a directory", the OS's words without what to give instead."""
    from gptrain.cli import main

    assert main(["train", "--config-file", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err == f"gptrain: error: {tmp_path}: is a directory; give the YAML file in it\n"
    )


def test_a_shared_alias_is_not_recursion(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer: &t {max_steps: 7}\nexp_manager: {name: x}\nother: *t\n")
    with pytest.raises(ConfigError, match="other"):  # an unknown key, not a recursion error
        load_training_config(config_file=str(path))


def test_per_split_data_prefix_in_a_launcher_file_with_interpolation(tmp_path):
    """NeMo's per-split form, as a launcher config writes it."""
    path = tmp_path / "hydra.yaml"
    path.write_text(
        "data_dir: /data\ntraining:\n  model:\n    data:\n      data_prefix:\n"
        "        train:\n          - 0.5\n          - ${data_dir}/a_text_document\n"
        "          - 0.5\n          - ${data_dir}/b_text_document\n"
        "        validation: ${data_dir}/held_out_text_document\n"
    )
    cfg = load_training_config(config_file=str(path))
    assert dict(cfg.model.data.data_prefix) == {
        "train": [0.5, "/data/a_text_document", 0.5, "/data/b_text_document"],
        "validation": "/data/held_out_text_document",
    }


def test_hydras_dict_override_needs_no_space_after_the_colon():
    """NeMo users type Hydra's `{train:a,validation:b}`; YAML's flow mapping read `train:a` as one
    key, and the error said `train:a` was not a split."""
    cfg = load_training_config(
        "gpt3/126m", ["model.data.data_prefix={train:/d/a,validation:[0.5,/d/b,0.5,/d/c],test:s3://bucket/t}"]
    )
    assert cfg.model.data.data_prefix == {
        "train": "/d/a",
        "validation": [0.5, "/d/b", 0.5, "/d/c"],
        "test": "s3://bucket/t",
    }


def test_a_mapping_override_merges_into_the_section_as_hydra_does():
    """`model.optim={lr: 1e-3}` replaced the whole section: the preset's warmup_steps, constant_steps
    and min_lr fell to gptrain's defaults (0) without a word, and `trainer={max_steps: 5}` put an
    8-node preset on one device. Hydra merges a mapping given for a mapping."""
    preset = load_training_config("gpt3/126m", report_ignored=False)
    cfg = load_training_config(
        "gpt3/126m", ["model.optim={lr: 1e-3}", "trainer={max_steps: 5}", "trainer={}"], report_ignored=False
    )
    assert cfg.model.optim.lr == 1e-3 and cfg.trainer.max_steps == 5
    assert cfg.model.optim.sched == preset.model.optim.sched and cfg.model.optim.sched.min_lr == 6e-5
    assert (cfg.trainer.num_nodes, cfg.trainer.devices, cfg.trainer.max_time) == (8, 8, "00:23:30:00")


@pytest.mark.parametrize("override", ["trainer=null", "model.optim=null", "training.exp_manager=null"])
def test_a_section_set_to_null_on_the_command_line_is_refused(override):
    """It was read as an empty section: every key of it went back to gptrain's defaults without a
    word (`trainer=null` put the 8-node preset on one device)."""
    section = override.removeprefix("training.").partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^override '{re.escape(override)}': '{section}' is a section"):
        load_training_config("gpt3/126m", [override], report_ignored=False)


@pytest.mark.parametrize(
    ("override", "section"),
    [("model={optim: null}", "model.optim"), ("model={optim: {sched: null}}", "model.optim.sched")],
)
def test_a_null_section_inside_a_mapping_override_is_refused(override, section):
    """`model={optim: null}` was merged in as an empty section: the optimizer and its schedule went
    back to gptrain's defaults (no warmup, min_lr 0) without a word, where `model.optim=null` is
    refused."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override], report_ignored=False)
    assert str(error.value) == (
        f"override '{override}': '{section}' is a section of keys, not a value; set its keys "
        f"({section}.<key>=...), or delete it (~{section}) for gptrain's defaults"
    )


def test_an_empty_section_in_a_file_is_a_section_of_no_keys(tmp_path):
    data = "  data:\n    data_impl: mock\n    mock_vocab_size: 64\n"
    (tmp_path / "empty.yaml").write_text(f"model:\n{data}")
    (tmp_path / "sections.yaml").write_text(f"trainer:\nmodel:\n  optim:\n{data}")
    defaults = load_training_config(config_file=str(tmp_path / "empty.yaml"), report_ignored=False)
    cfg = load_training_config(config_file=str(tmp_path / "sections.yaml"), report_ignored=False)
    assert (cfg.trainer, cfg.model.optim) == (defaults.trainer, defaults.model.optim)


@pytest.mark.parametrize("key", ["run.name", "run.results_dir", "exp_manager.explicit_log_dir"])
def test_an_empty_run_name_or_directory_is_refused(key):
    """`run.name=$NAME` with NAME unset made the run's directory base_results_dir itself; an empty
    explicit_log_dir wrote the run into the current directory."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: empty \(an unset shell variable\?\)"):
        load_training_config("gpt3/126m", [f"{key}="], report_ignored=False)


def test_a_run_directory_set_to_null_on_the_command_line_is_gptrains_as_in_a_file():
    """NeMo's own default, `explicit_log_dir: null`, was taken from a file but refused as an override
    ('must not be null'), and `gptrain launch` took it as an override."""
    cfg = load_training_config(
        "gpt3/126m",
        ["run.name=x", "run.results_dir=null", "exp_manager.explicit_log_dir=null"],
        report_ignored=False,
    )
    assert (cfg.run.results_dir, cfg.exp_manager.explicit_log_dir) == ("results/x", "results/x/results")
    with pytest.raises(ConfigError, match=r"^override 'run.name=null': 'run.name' must not be null"):
        load_training_config("gpt3/126m", ["run.name=null"], report_ignored=False)
    # inside a mapping it was filled in with gpt3_126m's name (and so its directory)
    with pytest.raises(ConfigError, match=r"^override 'run=\{name: null\}': 'run.name' must not be null"):
        load_training_config("gpt3/126m", ["run={name: null}"], report_ignored=False)


def test_a_section_set_to_null_by_a_launch_is_refused_too():
    """The launcher writes `exp_manager: null` into the training's config file: its run-directory
    default filled the section in, and every other exp_manager key took gptrain's default."""
    text = (
        "run:\n  name: x\nexp_manager: null\nmodel:\n  data:\n    data_impl: mock\n    mock_vocab_size: 64\n"
    )
    given = {"exp_manager": "training.exp_manager=null"}
    with pytest.raises(
        ConfigError, match=r"^override 'training.exp_manager=null': 'exp_manager' is a section"
    ):
        load_training_config(config_file="t.yaml", config_text=text, given=given, report_ignored=False)


def test_a_mapping_override_replaces_a_list_and_a_list_a_mapping():
    """What is not a mapping given for a mapping is set, as Hydra sets it: a blend after a per-split
    data prefix, a per-split one after a blend; a second per-split mapping merges into the first."""
    per_split = "model.data.data_prefix={train: /d/a, validation: /d/b}"
    cfg = load_training_config(
        "gpt3/126m", [per_split, "model.data.data_prefix=[1,/d/c]"], report_ignored=False
    )
    assert cfg.model.data.data_prefix == [1, "/d/c"]
    cfg = load_training_config(
        "gpt3/126m", ["model.data.data_prefix=[1,/d/c]", per_split], report_ignored=False
    )
    assert cfg.model.data.data_prefix == {"train": "/d/a", "validation": "/d/b"}
    cfg = load_training_config(
        "gpt3/126m", [per_split, "model.data.data_prefix={train: /d/c}"], report_ignored=False
    )
    assert cfg.model.data.data_prefix == {"train": "/d/c", "validation": "/d/b"}


def test_a_key_given_twice_in_a_file_is_one_line_naming_the_file_and_both_lines(tmp_path):
    """An edit that added `max_steps: 200` below the old `max_steps: 100` trained for whichever came
    last, silently; OmegaConf's own loader refuses such a file, and so does gptrain."""
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  max_steps: 100\n  devices: 1\n  max_steps: 200\n")
    with pytest.raises(ConfigError) as error:
        load_training_config(config_file=str(path))
    assert str(error.value) == (
        f"{path}:4: invalid YAML: 'max_steps' is given twice in one mapping (lines 2 and 4): keep one"
    )
    from gptrain.config.yamlio import load_text  # keys a `<<:` merge brings in may be given again

    merged = load_text(
        "base: &base {max_steps: 100, devices: 1}\ntrainer:\n  <<: *base\n  max_steps: 200\n", "m"
    )
    assert merged["trainer"] == {"max_steps": 200, "devices": 1}


def test_the_64_bit_integers_are_accepted_to_their_ends():
    """The range check is int64's: its largest value and smallest values pass the loader."""
    cfg = load_training_config("gpt3/126m", [f"trainer.max_steps={2**63 - 1}"])
    assert cfg.trainer.max_steps == 2**63 - 1
    with pytest.raises(ConfigError, match=r"model.num_layers: must be at least 1, got -9223372036854775808"):
        load_training_config("gpt3/126m", [f"model.num_layers={-(2**63)}"])


def test_save_top_k_minus_one_keeps_every_checkpoint_and_zero_keeps_the_newest():
    """-1 is PyTorch Lightning's (and NeMo's) 'keep every checkpoint', as Megatron keeps them. 0 (no
    best ones, only Lightning's last.ckpt, which NeMo's launcher saves) was refused, so a NeMo config
    with it did not run: it keeps the newest now. With save_last=false Lightning saves nothing, which a
    requeued run cannot resume from: refused naming both ways out; another negative is refused."""
    key = "exp_manager.checkpoint_callback_params.save_top_k"
    cfg = load_training_config("gpt3/126m", [f"{key}=-1"], report_ignored=False)
    assert cfg.exp_manager.checkpoint_callback_params.save_top_k == -1
    cfg = load_training_config("gpt3/126m", [f"{key}=0"], report_ignored=False)
    assert cfg.exp_manager.checkpoint_callback_params.save_top_k == 0
    with pytest.raises(ConfigError, match=rf"^{key}: must be 0 or more \(0 keeps only the newest\), or -1"):
        load_training_config("gpt3/126m", [f"{key}=-2"], report_ignored=False)
    no_last = [f"{key}=0", "exp_manager.checkpoint_callback_params.save_last=false"]
    with pytest.raises(ConfigError) as refused:
        load_training_config("gpt3/126m", no_last, report_ignored=False)
    assert str(refused.value) == (
        f"{key}: 0 with save_last=false keeps no checkpoint (PyTorch Lightning saves none), so a stopped "
        "run could not resume; set exp_manager.checkpoint_callback_params.save_last=true to keep only the "
        "newest, or exp_manager.create_checkpoint_callback=false to save none"
    )
    cfg = load_training_config(
        "gpt3/126m", [*no_last, "exp_manager.create_checkpoint_callback=false"], report_ignored=False
    )
    assert cfg.exp_manager.create_checkpoint_callback is False


def test_every_n_train_steps_null_is_each_validation_in_a_file_and_an_override(tmp_path):
    """Lightning's every_n_train_steps=None (NeMo's default) saves at each validation; gptrain said
    "'exp_manager.checkpoint_callback_params.every_n_train_steps' must not be null"."""
    key = "exp_manager.checkpoint_callback_params.every_n_train_steps"
    cfg = load_training_config("gpt3/126m", [f"{key}=null", "trainer.val_check_interval=500"])
    assert cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 500
    path = tmp_path / "run.yaml"
    path.write_text(
        "model:\n  data:\n    data_impl: mock\n    mock_vocab_size: 100\n"
        "trainer:\n  val_check_interval: 250\n"
        "exp_manager:\n  checkpoint_callback_params:\n    every_n_train_steps: null\n"
    )
    cfg = load_training_config(config_file=str(path))
    assert cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 250


def test_sequence_parallel_at_tensor_parallel_size_1_is_turned_off_as_nemo_does(capsys) -> None:
    """The 20b preset runs TP 2 with sequence parallelism; a NeMo user overriding TP to 1 on it got
    a refusal ('needs model.tensor_model_parallel_size > 1') that NeMo, which turns it off with a
    log line, never gave. TP 2 keeps it on, without the note."""
    cfg = load_training_config("gpt3/20b", ["model.tensor_model_parallel_size=1"])
    assert cfg.model.sequence_parallel is False
    assert "model.sequence_parallel=true needs model.tensor_model_parallel_size > 1; turned off" in (
        capsys.readouterr().err
    )
    cfg = load_training_config("gpt3/20b", ["model.tensor_model_parallel_size=2"])
    assert cfg.model.sequence_parallel is True
    assert "sequence_parallel" not in capsys.readouterr().err


def test_nemos_max_time_per_run_is_the_per_job_time_limit():
    """NeMo's exp_manager.max_time_per_run (a limit per job, replacing trainer.max_time where both are
    set) was "unknown key 'exp_manager.max_time_per_run'"."""
    cfg = load_training_config(
        "gpt3/126m", ["+exp_manager.max_time_per_run=00:03:55:00"], report_ignored=False
    )
    assert cfg.trainer.max_time == "00:03:55:00" and cfg.trainer.max_time_seconds() == 3 * 3600 + 55 * 60
    both = ["trainer.max_time=00:01:00:00", "exp_manager.max_time_per_run=00:00:30:00"]
    assert load_training_config("gpt3/126m", both, report_ignored=False).trainer.max_time == "00:00:30:00"
    with pytest.raises(
        ConfigError, match=r"^exp_manager.max_time_per_run: '00:00:-1:00' is not DD:HH:MM:SS$"
    ):
        load_training_config("gpt3/126m", ["exp_manager.max_time_per_run=00:00:-1:00"], report_ignored=False)


@pytest.mark.parametrize("override", ["+training@foo=gpt3/5b", "training@foo=gpt3/5b", "training.model@x=1"])
def test_hydras_group_at_package_form_is_one_line_not_a_key_nothing_reads(override):
    """`+training@foo=gpt3/5b` (Hydra: the group's file composed at `foo`) became a top-level key
    `training@foo` of the launch config that nothing reads: the run trained the default preset."""
    message = rf"^override '{re.escape(override)}': Hydra's group@package form is not supported"
    with pytest.raises(ConfigError, match=message):
        compose([override])
    train_override = override.removeprefix("+").removeprefix("training.")
    with pytest.raises(ConfigError, match=rf"^override '{re.escape(train_override)}': Hydra's group@package"):
        load_training_config("gpt3/126m", [train_override], report_ignored=False)


OLD_NEMO_RECOMPUTE = (
    "model:\n  data:\n    data_impl: mock\n    mock_vocab_size: 128\n"
    "  activations_checkpoint_method: block\n  activations_checkpoint_num_layers: 2\n"
)


def test_a_recompute_method_without_the_granularity_key_is_full_recompute_as_in_old_nemo(tmp_path, capsys):
    """NeMo <= 1.10 (bignlp 22.x) had no activations_checkpoint_granularity: the method alone
    recomputed full layers. Before, gptrain read the absent key as null and recomputed nothing."""
    path = tmp_path / "old_nemo.yaml"
    path.write_text(OLD_NEMO_RECOMPUTE)
    model = load_training_config(config_file=str(path)).model
    assert (model.activations_checkpoint_granularity, model.activations_checkpoint_method) == (
        "full",
        "block",
    )
    assert model.activations_checkpoint_num_layers == 2
    [note] = [line for line in capsys.readouterr().err.splitlines() if "granularity" in line]
    assert note.startswith(
        "gptrain: note: model.activations_checkpoint_method=block without model.activations_checkpoint_granularity"
    )
    assert note.endswith("full recompute; set model.activations_checkpoint_granularity=null for none")


def test_old_nemos_block_of_no_layers_is_said_to_recompute_none(tmp_path, capsys):
    """bignlp 22.06's configs give activations_checkpoint_method=block with
    activations_checkpoint_num_layers=0: NeMo <= 1.10 recomputed the first 0 layers, none; the note
    said "full recompute"."""
    path = tmp_path / "old_nemo.yaml"
    path.write_text(OLD_NEMO_RECOMPUTE.replace("num_layers: 2", "num_layers: 0"))
    model = load_training_config(config_file=str(path)).model
    assert (model.activations_checkpoint_granularity, model.activations_checkpoint_num_layers) == ("full", 0)
    [note] = [line for line in capsys.readouterr().err.splitlines() if "granularity" in line]
    assert note == (
        "gptrain: note: model.activations_checkpoint_method=block without model.activations_checkpoint_granularity "
        "(NeMo <= 1.10's config, where the method alone recomputes full layers) and "
        "model.activations_checkpoint_num_layers=0: no layer is recomputed, as in NeMo; set "
        "model.activations_checkpoint_num_layers=N to recompute the first N of each pipeline stage"
    )


@pytest.mark.parametrize("granularity", ["null", "selective"])
def test_a_granularity_given_beside_the_method_keeps_its_meaning(granularity, tmp_path, capsys):
    path = tmp_path / "nemo.yaml"
    path.write_text(OLD_NEMO_RECOMPUTE + f"  activations_checkpoint_granularity: {granularity}\n")
    as_file = load_training_config(config_file=str(path)).model.activations_checkpoint_granularity
    given = f"model.activations_checkpoint_granularity={granularity}"
    typed = load_training_config(config_file=str(tmp_path / "nemo.yaml"), overrides=[given])
    preset = load_training_config("gpt3/126m", ["model.activations_checkpoint_method=uniform"])
    assert (
        as_file
        == typed.model.activations_checkpoint_granularity
        == (None if granularity == "null" else granularity)
    )
    assert preset.model.activations_checkpoint_granularity is None  # the preset gives it: null
    assert "granularity" not in capsys.readouterr().err


def test_a_training_yaml_under_a_directory_that_may_not_be_searched_is_one_line(unsearchable_dir):
    """`gptrain train locked/mine.yaml`: Path.is_file raised PermissionError (Python 3.11), said
    as a bare '<path>: Permission denied'. Root may search any directory, so the refusal is stood in for."""
    locked = unsearchable_dir
    with pytest.raises(ConfigError) as error:
        load_training_config(str(locked / "mine.yaml"))
    assert str(error.value) == (
        f"{locked}/mine.yaml: cannot be looked up (Permission denied); check the permissions of {locked}"
        " and the directories above it"
    )


def test_a_config_file_under_a_directory_that_may_not_be_searched_names_that_directory(
    tmp_path, refuse_search
):
    """Was 'cannot read config <file>: Permission denied', as if the file's own permissions were
    wrong. Root may search any directory, so the refusal is stood in for (open and stat alike)."""
    from pathlib import Path

    from gptrain.config.yamlio import read_config_text

    locked = tmp_path / "locked"
    locked.mkdir()
    refuse_search(locked, also=[(Path, "open")])
    with pytest.raises(ConfigError) as error:
        read_config_text(locked / "mine.yaml")
    assert str(error.value) == (
        f"{locked}/mine.yaml: cannot be looked up (Permission denied); check the permissions of {locked}"
        " and the directories above it"
    )


def test_one_split_of_a_per_split_data_prefix_is_set_as_hydra_sets_it():
    """`model.data.data_prefix.validation=...` on a per-split data prefix replaces that split, as Hydra
    does; it was refused as an unknown key."""
    per_split = "model.data.data_prefix={train: /d/a, validation: /d/b, test: /d/c}"
    cfg = load_training_config(
        "gpt3/126m", [per_split, "model.data.data_prefix.validation=[1.0,/d/v]"], report_ignored=False
    )
    assert cfg.model.data.data_prefix == {"train": "/d/a", "validation": [1.0, "/d/v"], "test": "/d/c"}


@pytest.mark.parametrize("before", ["[1.0,/d/a]", "/d/a", "null"])
def test_one_split_of_a_blend_data_prefix_says_how_to_write_the_per_split_form(before):
    """The preset's data_prefix is a blend (a list): a split cannot be set inside it (Hydra refuses
    it too); the error said 'unknown key' and nothing of the per-split form."""
    override = "model.data.data_prefix.validation=[1.0,/d/v]"
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [f"model.data.data_prefix={before}", override])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"override '{override}': model.data.data_prefix is ")
    assert (
        "not per split; give every split its data in one override: model.data.data_prefix={train:" in message
    )
    written = message.partition("one override: ")[2].partition(" (")[0]
    cfg = load_training_config("gpt3/126m", [written], report_ignored=False)  # what it says to write loads
    assert list(cfg.model.data.data_prefix) == ["train", "validation", "test"]


def test_a_sub_key_of_data_prefix_that_is_no_split_names_the_splits():
    per_split = "model.data.data_prefix={train: /d/a, validation: /d/b}"
    expected = r"'valid' is not a split: the per-split form has the keys train, validation, test"
    with pytest.raises(ConfigError, match=expected):
        load_training_config("gpt3/126m", [per_split, "model.data.data_prefix.valid=/d/v"])


def test_one_split_of_data_prefix_in_a_launch_is_set_or_says_how(tmp_path):
    """The same override under `gptrain launch` (training.model.data.data_prefix.validation=...): it was
    'unknown key' there too."""
    per_split = "training.model.data.data_prefix={train:/d/a,validation:/d/b}"
    composed = compose(
        [per_split, "training.model.data.data_prefix.validation=/d/v", f"base_results_dir={tmp_path}"]
    )
    assert composed.resolved()["training"]["model"]["data"]["data_prefix"] == {
        "train": "/d/a",
        "validation": "/d/v",
    }
    override = "training.model.data.data_prefix.validation=/d/v"
    with pytest.raises(
        ConfigError, match=rf"^override '{re.escape(override)}': model.data.data_prefix is a blend"
    ):
        compose([override, f"base_results_dir={tmp_path}"])


CALLBACK = "exp_manager.checkpoint_callback_params"


@pytest.mark.parametrize(
    ("given", "top_k"),
    [
        ([f"{CALLBACK}.every_n_epochs=0"], 0),
        ([f"{CALLBACK}.every_n_epochs=2"], 0),  # a NeMo GPT run is one epoch: never a second
        ([f"{CALLBACK}.every_n_epochs=1"], 10),
        ([f"{CALLBACK}.every_n_epochs=null"], 10),
        ([f"{CALLBACK}.every_n_epochs=0", f"{CALLBACK}.every_n_train_steps=500"], 10),
        ([f"{CALLBACK}.every_n_epochs=0", "exp_manager.create_checkpoint_callback=false"], 10),
    ],
)
def test_every_n_epochs_beside_a_null_step_interval_keeps_lightnings_last_only(given, top_k, capsys):
    """every_n_epochs was ignored: 0 beside every_n_train_steps=null kept save_top_k checkpoints, where
    Lightning saves only its last one at each validation."""
    cfg = load_training_config("gpt3/126m", [f"{CALLBACK}.every_n_train_steps=null", *given])
    params = cfg.exp_manager.checkpoint_callback_params
    assert params.save_top_k == top_k
    assert params.every_n_train_steps == (500 if f"{CALLBACK}.every_n_train_steps=500" in given else 2000)
    noted = (
        "with every_n_train_steps=null: as PyTorch Lightning, only the last checkpoint"
        in capsys.readouterr().err
    )
    assert noted == (top_k == 0)


def test_every_n_epochs_0_without_save_last_saves_nothing_in_lightning_and_is_refused():
    given = [
        f"{CALLBACK}.every_n_train_steps=null",
        f"{CALLBACK}.every_n_epochs=0",
        f"{CALLBACK}.save_last=false",
    ]
    with pytest.raises(ConfigError, match=r"^exp_manager.checkpoint_callback_params.every_n_epochs=0 with every_n_"
                       r"train_steps=null and save_last=false: PyTorch Lightning saves no checkpoint at all"):  # fmt: skip
        load_training_config("gpt3/126m", given, report_ignored=False)


@pytest.mark.parametrize(
    ("given", "dirpath"),
    [
        ([f"{CALLBACK}.filepath=/fsx/ckpts/megatron_gpt"], "/fsx/ckpts"),
        ([f"{CALLBACK}.filepath=/fsx/ckpts/megatron_gpt", f"{CALLBACK}.dirpath=/lustre/c"], "/lustre/c"),
        ([f"{CALLBACK}.filepath=null"], None),
    ],
)
def test_nemos_deprecated_filepath_gives_dirpath_its_directory(given, dirpath):
    """NeMo's exp_manager reads a non-null filepath (deprecated) as dirpath=<its directory> where dirpath
    is null; gptrain ignored it, and the checkpoints went elsewhere than the file said."""
    cfg = load_training_config("gpt3/126m", given, report_ignored=False)
    assert cfg.exp_manager.checkpoint_callback_params.dirpath == dirpath


TOK = "model.tokenizer"


@pytest.mark.parametrize(
    ("given", "kind", "model"),
    [  # NeMo's get_nmt_tokenizer: huggingface is AutoTokenizer(type), tiktoken reads vocab_file
        (["library=huggingface", "type=/tok/llama", "model=null"], "HuggingFaceTokenizer", "/tok/llama"),
        (
            ["library=huggingface", "type=/tok/llama", "model=/tok/sp.model"],
            "HuggingFaceTokenizer",
            "/tok/llama",
        ),
        (
            ["library=huggingface", "type=gpt2"],
            "GPT2BPETokenizer",
            None,
        ),  # with the preset's vocab and merges
        (
            ["library=tiktoken", "type=null", "vocab_file=/tok/tiktoken.json"],
            "TikTokenizer",
            "/tok/tiktoken.json",
        ),
        (
            ["library=tiktoken", "type=null", "model=cl100k_base", "vocab_file=null"],
            "TikTokenizer",
            "cl100k_base",
        ),
        (
            ["library=tiktoken", "type=null", "model=/tok/a.json", "vocab_file=/tok/b.json"],
            "TikTokenizer",
            "/tok/b.json",
        ),
        (["library=tiktoken", "vocab_file=/tok/b.json"], "TikTokenizer", "/tok/b.json"),  # the preset's type
    ],
)
def test_the_tokenizer_library_is_read_as_nemo_reads_it(given, kind, model):
    """library=huggingface with a tokenizer's path for type, or library=tiktoken with its vocab_file,
    were refused ('not one of ...', 'name the type')."""
    tokenizer = load_training_config(
        "gpt3/126m", [f"{TOK}.{x}" for x in given], report_ignored=False
    ).model.tokenizer
    assert (tokenizer.type, tokenizer.model) == (kind, model)


@pytest.mark.parametrize(
    ("given", "type_"),
    [
        (["type=GPT2BPETokenizer"], "GPT2BPETokenizer"),
        ([], "GPT2BPETokenizer"),  # the preset's
        (["type=null", "model=/tok/t.json"], "None"),
        (["type=llama2", "model=/tok/t.model"], "llama2"),
    ],
)
def test_library_huggingface_without_a_tokenizers_path_or_name_in_type_is_refused(given, type_):
    """NeMo's get_nmt_tokenizer gives AutoTokenizer the type and never reads model: a Megatron type
    name (a preset's GPT2BPETokenizer) trained Megatron's GPT-2 BPE, and a model was read as the
    tokenizer, where NeMo fails or reads another."""
    overrides = [f"{TOK}.library=huggingface", *(f"{TOK}.{x}" for x in given)]
    with pytest.raises(ConfigError, match=rf"^model.tokenizer.type: {type_} with model.tokenizer.library="
                       r"huggingface, which reads type as the Hugging Face tokenizer's path or hub name"):  # fmt: skip
        load_training_config("gpt3/126m", overrides, report_ignored=False)


@pytest.mark.parametrize("library", ["byte-level", "regex", "tabular", "yttm"])
def test_a_tokenizer_library_gptrain_does_not_read_is_refused(library):
    """Any library was taken and the preset's GPT-2 BPE trained instead, silently (byte-level too)."""
    with pytest.raises(ConfigError, match=rf"^model.tokenizer.library: '{library}' is not one of megatron, "
                       "huggingface, sentencepiece, tiktoken"):  # fmt: skip
        load_training_config("gpt3/126m", [f"{TOK}.library={library}"], report_ignored=False)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("bf16-true", "'bf16-true' is PyTorch Lightning's bf16 weights without fp32 master weights, which gptrain"
         " does not implement; use bf16 (bf16-mixed): bf16 compute over fp32 weights"),
        ("16-true", "'16-true' is PyTorch Lightning's 16 weights without fp32 master weights, which gptrain"
         " does not implement; use 16 (16-mixed): 16 compute over fp32 weights"),
        ("64", "'64' is not one of 32, 16, bf16 (also 32-true, 16-mixed, bf16-mixed)"),
    ],
)  # fmt: skip
def test_a_precision_gptrain_does_not_train_says_why_and_what_to_use(value, message):
    """Lightning's *-true precisions were 'not one of 32, 16, bf16', which says nothing of what they ask."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [f"trainer.precision={value}"], report_ignored=False)
    assert str(error.value) == f"trainer.precision: {message}"


def test_every_n_train_steps_0_is_lightnings_no_step_saves_the_last_one_at_each_validation(capsys):
    """Lightning reads every_n_train_steps=0 as no saves by step, and (every_n_epochs then 0) only its
    last checkpoint at each validation; gptrain refused 0 ('must be at least 1')."""
    cfg = load_training_config("gpt3/126m", [f"{CALLBACK}.every_n_train_steps=0"])
    params = cfg.exp_manager.checkpoint_callback_params
    assert (params.every_n_train_steps, params.save_top_k) == (2000, 0)
    assert (
        f"{CALLBACK}.every_n_train_steps=0: as PyTorch Lightning, only the last checkpoint"
        in capsys.readouterr().err
    )
    cfg = load_training_config(
        "gpt3/126m", [f"{CALLBACK}.every_n_train_steps=0", f"{CALLBACK}.every_n_epochs=1"]
    )
    assert (
        cfg.exp_manager.checkpoint_callback_params.save_top_k == 10
    )  # top-k at each validation, as Lightning


@pytest.mark.parametrize(("value", "kept"), [("link", True), ("true", True), ("false", False)])
def test_save_last_link_is_lightnings_save_last(value, kept):
    """Lightning 2.1's save_last='link' (last.ckpt a link to the newest) was refused ('expects bool')."""
    cfg = load_training_config("gpt3/126m", [f"{CALLBACK}.save_last={value}"], report_ignored=False)
    assert cfg.exp_manager.checkpoint_callback_params.save_last is kept


def test_a_save_last_that_is_no_switch_nor_link_is_refused():
    with pytest.raises(ConfigError, match=rf"^{CALLBACK}.save_last: 'always' is not true, false or link"):
        load_training_config("gpt3/126m", [f"{CALLBACK}.save_last=always"], report_ignored=False)


def test_the_tokenizer_block_of_the_launchers_llama3_and_mistral_files_loads():
    """`library: huggingface`, `type: <its path>`, `use_fast: true` (the launcher's llama3 and mistral
    files): use_fast was an unknown key; gptrain reads tokenizer.json with the fast tokenizer, as asked."""
    given = [f"{TOK}.library=huggingface", f"{TOK}.type=/tok/Meta-Llama-3-8B", f"{TOK}.use_fast=true"]
    cfg = load_training_config("gpt3/126m", given, report_ignored=False)
    assert (cfg.model.tokenizer.type, cfg.model.tokenizer.model) == (
        "HuggingFaceTokenizer",
        "/tok/Meta-Llama-3-8B",
    )
    assert cfg.model.tokenizer.use_fast is True and f"{TOK}.use_fast" not in cfg.ignored_keys


def test_use_fast_false_with_gpt2_bpe_says_the_slow_tokenizer_gives_the_same_ids(capsys):
    """`use_fast: false` was listed among ignored keys as "the fast tokenizer": read as fast with no
    word on whether the ids are NeMo's (its slow GPT2Tokenizer's, which are the fast one's)."""
    cfg = load_training_config("gpt3/126m", [f"{TOK}.use_fast=false"])
    assert cfg.model.tokenizer.use_fast is False and f"{TOK}.use_fast" not in cfg.ignored_keys
    assert (
        "gptrain: note: model.tokenizer.use_fast: false: transformers' slow GPT2Tokenizer gives the same ids "
        "as the fast one gptrain encodes with (the same byte-level BPE, split and <|endoftext|>)\n"
    ) in capsys.readouterr().err


def test_trust_remote_code_is_refused_where_it_asks_for_code():
    load_training_config("gpt3/126m", [f"{TOK}.trust_remote_code=false"], report_ignored=False)
    with pytest.raises(ConfigError, match=rf"^override '{TOK}.trust_remote_code=true': '{TOK}.trust_remote_code: "
                       "True' asks for a tokenizer's own Python code"):  # fmt: skip
        load_training_config("gpt3/126m", [f"{TOK}.trust_remote_code=true"], report_ignored=False)


@pytest.mark.parametrize("where", ["{log}", "{log}/", "{parent}"])
def test_a_dirpath_that_is_or_holds_the_log_dir_is_refused(tmp_path, where):
    """Checkpoints saved into the log dir itself (or a directory above it) mix with the run's files:
    move_aside_earlier_run then moved the live run's lock away with the earlier run's checkpoints."""
    log = tmp_path / "runs" / "run"
    dirpath = where.format(log=log, parent=tmp_path / "runs")
    given = [f"exp_manager.explicit_log_dir={log}", f"{CALLBACK}.dirpath={dirpath}"]
    with pytest.raises(ConfigError, match=rf"^{CALLBACK}.dirpath={os.path.normpath(dirpath)} is the run's "):
        load_training_config("gpt3/126m", given, report_ignored=False)


@pytest.mark.parametrize("where", ["{log}/ckpts", "{log}-ckpts", "{other}"])
def test_a_dirpath_inside_or_beside_the_log_dir_is_taken(tmp_path, where):
    log = tmp_path / "runs" / "run"
    dirpath = where.format(log=log, other=tmp_path / "ckpts")
    given = [f"exp_manager.explicit_log_dir={log}", f"{CALLBACK}.dirpath={dirpath}"]
    cfg = load_training_config("gpt3/126m", given, report_ignored=False)
    assert cfg.exp_manager.checkpoint_callback_params.dirpath == dirpath


@pytest.mark.parametrize("steps", ["null", "100"])
def test_a_negative_every_n_epochs_is_refused_as_lightning_refuses_it(steps):
    """Lightning's ModelCheckpoint raises 'Invalid value for every_n_epochs=-1. Must be >= 0'; it
    was taken (with every_n_train_steps=null: the last checkpoint only, at each validation)."""
    given = [f"{CALLBACK}.every_n_epochs=-1", f"{CALLBACK}.every_n_train_steps={steps}"]
    with pytest.raises(ConfigError, match=rf"^{CALLBACK}.every_n_epochs=-1: must be >= 0"):
        load_training_config("gpt3/126m", given, report_ignored=False)
    off = [*given, "exp_manager.create_checkpoint_callback=false"]  # no ModelCheckpoint to refuse it
    assert (
        load_training_config("gpt3/126m", off, report_ignored=False).exp_manager.create_checkpoint_callback
        is False
    )


@pytest.mark.parametrize("epochs", [1, 2])
def test_every_n_train_steps_beside_every_n_epochs_is_refused_as_lightning_refuses_it(epochs):
    """Lightning's ModelCheckpoint raises 'Combination of parameters every_n_train_steps=500,
    every_n_epochs=1 and train_time_interval=None should be mutually exclusive'; both were taken and
    every_n_epochs silently dropped."""
    given = [f"{CALLBACK}.every_n_train_steps=500", f"{CALLBACK}.every_n_epochs={epochs}"]
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", given, report_ignored=False)
    message = str(error.value)
    assert message.startswith(f"{CALLBACK}.every_n_train_steps=500 and every_n_epochs={epochs}: ")
    assert "mutually exclusive" in message and "\n" not in message
    off = [*given, "exp_manager.create_checkpoint_callback=false"]  # no ModelCheckpoint to refuse it
    assert (
        load_training_config("gpt3/126m", off, report_ignored=False).exp_manager.create_checkpoint_callback
        is False
    )


@pytest.mark.parametrize("link_to", ["log", "parent", "log_dir_link"])
def test_a_dirpath_that_is_or_holds_the_log_dir_through_a_symlink_is_refused(tmp_path, link_to):
    """The check compared the paths as given: a dirpath that was a symlink to the log dir (or above
    it), or a log dir given through a symlink, passed it. Compared resolved, as Lightning resolves
    dirpath."""
    log = tmp_path / "runs" / "run"
    log.mkdir(parents=True)
    link = tmp_path / "link"
    if link_to == "log_dir_link":  # the log dir through a symlink, dirpath the real directory
        link.symlink_to(log)
        given = [f"exp_manager.explicit_log_dir={link}", f"{CALLBACK}.dirpath={log}"]
    else:
        link.symlink_to(log if link_to == "log" else log.parent)
        given = [f"exp_manager.explicit_log_dir={log}", f"{CALLBACK}.dirpath={link}"]
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", given, report_ignored=False)
    assert str(error.value).startswith(f"{CALLBACK}.dirpath=") and "is the run's explicit_log_dir" in str(
        error.value
    )
    assert "\n" not in str(error.value)


def test_an_override_of_a_list_item_sets_it_as_hydra_does():
    """`model.data.data_prefix.1=/b` sets the blend's second item, as Hydra does; it was refused
    as "'1' is not a split". An index past the end is one line saying to give the whole list."""
    cfg = load_training_config(
        "gpt3/126m", ["model.data.data_prefix.1=/data/b_text_document"], report_ignored=False
    )
    assert cfg.model.data.data_prefix == [1.0, "/data/b_text_document"]
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", ["model.data.data_prefix.3=/c"], report_ignored=False)
    assert str(error.value) == (
        "override 'model.data.data_prefix.3=/c': model.data.data_prefix has 2 items (0 to 1); an override"
        " sets one of them and adds none: give the whole list, model.data.data_prefix=[...]"
    )


@pytest.mark.parametrize(
    ("preset", "hint"),
    [
        ("gpt3/7b", "; did you mean 'gpt3/7b_improved'?"),
        ("gpt3/400m", "; did you mean 'gpt3/400m_improved'?"),
        ("gpt3/126", "; did you mean 'gpt3/126m'?"),
        ("126m", "; did you mean 'gpt3/126m'?"),
        ("gpt3/1", "; did you mean 'gpt3/1b_improved'?"),
    ],
)
def test_a_missing_preset_is_never_offered_another_model_size(preset, hint):
    """`gptrain train gpt3/7b` was asked 'did you mean gpt3/175b?' and `gpt3/400m` 'gpt3/40b?'; `gpt3/1`
    (the start of 1b_improved's name) 'gpt3/126m?', and `gpt3/12` too, whose size no preset has."""
    with pytest.raises(ConfigError) as error:
        load_training_config(preset)
    assert str(error.value) == f"unknown training preset '{preset}'{hint}"
    for other in ("gpt3/30b", "gpt3/12"):
        with pytest.raises(
            ConfigError, match=rf"^unknown training preset '{other}'; the presets are gpt3/126m, "
        ):
            load_training_config(other)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "trainer.val_check_interval=null",
            "'trainer.val_check_interval' must not be null; give a whole number of steps"
            " (NeMo's float fraction of an epoch is refused: gptrain counts steps)",
        ),
        ("trainer.max_steps=null", "'trainer.max_steps' must not be null; give a whole number"),
        ("model.optim.lr=null", "'model.optim.lr' must not be null; give a number"),
        ("run.name=null", "'run.name' must not be null; give a string"),
    ],
)
def test_a_null_names_the_values_the_key_takes(override, expected):
    """`trainer.val_check_interval=null` said only 'must not be null', not what to give instead."""
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", [override], report_ignored=False)
    assert str(error.value) == f"override '{override}': {expected}"
