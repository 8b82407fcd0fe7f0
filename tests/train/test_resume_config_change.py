"""Resuming with a config the checkpoint does not fit: refused in one line (the run's hparams.yaml
kept), or for a precision change, loaded with the loss scaler started afresh."""

import json

import pytest
import torch
import yaml
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.checkpoint.compat import CheckpointMismatchError
from gptrain.checkpoint.errors import ArchitectureChangedError
from gptrain.train.loss_scale import build_loss_scaler
from gptrain.train.state import parts_to_load

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SHORT = [
    *MOCK,
    "exp_manager.resume_if_exists=true",
    "trainer.max_steps=2",
    "trainer.limit_val_batches=0",
    "model.num_layers=1",
    "model.hidden_size=16",
    "model.num_attention_heads=2",
    "model.encoder_seq_length=8",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 1-layer fp32 run with a checkpoint at step 2; each test resumes a copy of it."""
    log_dir = tmp_path_factory.mktemp("resume") / "run"
    with pytest.MonkeyPatch.context() as mp:
        assert run_recording(mp, tiny_config(log_dir, *SHORT))[0] == 0
    return log_dir


@pytest.fixture
def run(trained, tmp_path):
    import shutil

    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def test_resume_with_more_layers_is_refused_and_keeps_the_runs_hparams(run, monkeypatch):
    before = (run / "hparams.yaml").read_text()
    config = tiny_config(run, *SHORT, "model.num_layers=2", "trainer.max_steps=4")
    with pytest.raises(
        CheckpointMismatchError, match="step_2 does not fit the config: the checkpoint has no model.layers.1"
    ):
        run_recording(monkeypatch, config)
    assert (run / "hparams.yaml").read_text() == before
    assert yaml.safe_load(before)["model"]["num_layers"] == 1
    assert not any("damaged" in line for line in log_lines(run))


def test_resume_as_fp16_resets_the_loss_scaler(run, monkeypatch):
    config = tiny_config(run, *SHORT, "trainer.precision=16", "trainer.max_steps=3")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    lines = log_lines(run)
    assert (
        "loss scaler reset: the checkpoint was saved with a constant loss scale (bf16/fp32, or fp16's "
        "model.native_amp_static_scale), this run (trainer.precision or model.native_amp_static_scale "
        "changed) uses a dynamic loss scale (fp16)"
    ) in lines
    assert any(line.startswith("resuming from ") and "step_2 at iteration 2" in line for line in lines)


def test_resume_with_a_static_fp16_scale_trains_at_the_configured_scale(run, monkeypatch):
    """Megatron's --loss-scale over a checkpoint (ConstantGradScaler keeps no state): the config's
    scale, not the 1.0 the fp32 checkpoint saved under the same key."""
    static = [
        "trainer.precision=16",
        "model.native_amp_static_scale=true",
        "model.native_amp_init_scale=1024",
    ]
    code, losses = run_recording(monkeypatch, tiny_config(run, *SHORT, *static, "trainer.max_steps=3"))
    assert code == 0 and sorted(losses) == [3]
    lines = log_lines(run)
    assert not any(line.startswith("loss scaler reset") for line in lines)
    resumed = [line for line in lines if "iteration        3/" in line]
    assert len(resumed) == 1 and "| loss scale: 1024.0 |" in resumed[0]


@pytest.mark.parametrize("saved_static", [False, True])
def test_a_static_and_a_dynamic_fp16_scaler_do_not_load_each_other(saved_static):
    """Switching model.native_amp_static_scale on a resume: the dynamic trackers mean nothing to a
    static scale, and a static scale's checkpoint holds no trackers for a dynamic one."""
    saved = build_loss_scaler("16", 8.0, 10, 2, static=saved_static)
    keys = {"model.w", *(f"scaler.{key}" for key in saved.state_dict())}
    lines = []
    live = build_loss_scaler("16", 8.0, 10, 2, static=not saved_static)
    assert parts_to_load(["model", "scaler"], keys, live, lines.append) == {"model"}
    assert len(lines) == 1 and "model.native_amp_static_scale changed" in lines[0]


def test_resume_with_another_weight_decay_trains_with_it_and_says_so(run, monkeypatch):
    """As in Megatron, whose schedule sets the weight decay from its arguments at every step: the
    config's value applies, and the log and hparams.yaml agree on it."""
    config = tiny_config(run, *SHORT, "model.optim.weight_decay=0.3", "trainer.max_steps=3")
    seen = []
    real_step = torch.optim.AdamW.step

    def recording_step(optimizer, *args, **kwargs):
        seen.append(sorted({group["weight_decay"] for group in optimizer.param_groups}))
        return real_step(optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    assert seen[-1] == [0.0, 0.3]
    notes = [line for line in log_lines(run) if "weight_decay" in line or "weight decay" in line]
    assert len(notes) == 1 and "constant 0.1 -> constant 0.3" in notes[0], notes
    assert yaml.safe_load((run / "hparams.yaml").read_text())["model"]["optim"]["weight_decay"] == 0.3


def test_a_run_goes_on_at_a_longer_sequence_within_its_position_table(tmp_path, monkeypatch):
    """model.max_position_embeddings sizes the learned position table (as Megatron's does): a run
    trained at 8 tokens with 16 positions resumes at 16 tokens from the same checkpoint."""
    run = tmp_path / "run"
    table = "model.max_position_embeddings=16"
    assert run_recording(monkeypatch, tiny_config(run, *SHORT, table))[0] == 0
    longer = tiny_config(run, *SHORT, table, "model.encoder_seq_length=16", "trainer.max_steps=3")
    code, losses = run_recording(monkeypatch, longer)
    assert code == 0 and sorted(losses) == [3]
    assert any(
        line.startswith("resuming from ") and "step_2 at iteration 2" in line for line in log_lines(run)
    )


def test_a_larger_position_table_than_the_checkpoints_takes_its_rows(run, monkeypatch):
    """Runs before 2026-11-26 saved encoder_seq_length rows whatever max_position_embeddings said
    (their hparams.yaml may say 2048), and a run may raise it to go on longer: the saved rows load
    into the first rows, as the vocabulary's do; eval, export and generate build the table as saved."""
    from gptrain.train.builders import build_model, build_model_config
    from gptrain.trained.load import load_weights, open_run

    config = tiny_config(run, *SHORT, "model.max_position_embeddings=32", "trainer.max_steps=3")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    assert (  # positions the checkpoint never trained (an imported GPT-2 taken longer) are said
        "warning: model.pos_embeddings.weight: the checkpoint has 8 rows, this run's model 32; rows 8-31 "
        "(positions past the saved table) keep their random initialization" in log_lines(run)
    )
    hparams = run / "hparams.yaml"
    hparams.write_text(
        hparams.read_text().replace("max_position_embeddings: 32", "max_position_embeddings: 2048")
    )
    opened = open_run(run)
    model = build_model(build_model_config(opened.cfg, opened.saved_rows), torch.device("cpu"), 0)
    load_weights(model, opened.step_dir)  # as step_3 holds the table, not hparams.yaml's 2048 rows
    assert model.pos_embeddings.weight.shape[0] == 32


@pytest.mark.parametrize("saved, live", [("16", "bf16"), ("16", "32"), ("32", "16")])
def test_a_scaler_of_the_other_kind_is_not_loaded(saved, live):
    keys = {
        "model.w",
        "train.step",
        *(f"scaler.{key}" for key in build_loss_scaler(saved, 8.0, 10, 2).state_dict()),
    }
    lines = []
    parts = parts_to_load(
        ["model", "scaler", "optim"], keys, build_loss_scaler(live, 8.0, 10, 2), lines.append
    )
    assert parts == {"model"} and len(lines) == 1 and lines[0].startswith("loss scaler reset: ")
    same = parts_to_load(["model", "scaler"], keys, build_loss_scaler(saved, 8.0, 10, 2), lines.append)
    assert same == {"model", "scaler"} and len(lines) == 1


def test_an_untied_checkpoint_is_refused_by_a_tied_model(tmp_path, monkeypatch):
    """A checkpoint saved untied (an imported StableLM, GPT-3 with share_embeddings=false) holds an
    output layer and an embedding of its own; a tied model has one tensor for both, and DCP loaded
    both into it, the later one silently winning, where no optimizer state tells them apart (an
    import's weights, or finetune). Untying a tied checkpoint loads (both are one)."""
    untied, tie = tmp_path / "untied", "model.share_embeddings_and_output_weights"
    assert run_recording(monkeypatch, tiny_config(untied, *SHORT, f"{tie}=false"))[0] == 0
    start = [f"exp_manager.resume_from_checkpoint={untied}", "exp_manager.finetune=true"]
    with pytest.raises(
        CheckpointMismatchError,
        match=r"step_2 does not fit the config: its model.output.weight is not its model.tok_embeddings.weight "
        rf"\(saved untied\), the config ties them \({tie}=true\)",
    ):
        run_recording(monkeypatch, tiny_config(tmp_path / "tied", *SHORT, *start, f"{tie}=true"))
    tied = tmp_path / "tied_run"
    assert run_recording(monkeypatch, tiny_config(tied, *SHORT))[0] == 0
    start = [f"exp_manager.resume_from_checkpoint={tied}", "exp_manager.finetune=true"]
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path / "untie", *SHORT, *start, f"{tie}=false"))
    assert code == 0 and sorted(losses) == [1, 2]


def test_resume_with_other_heads_of_the_same_shapes_is_refused_naming_each_key(run, monkeypatch):
    """4 heads of 4 in place of 2 heads of 8 (and the erf GELU for the fused tanh one) give every tensor its shape: the
    shape check passes, and the weights would train another function. The COMPLETE marker records
    the settings; a resume that changes them stops in one line, the run's hparams.yaml kept."""
    before = (run / "hparams.yaml").read_text()
    config = tiny_config(
        run,
        *SHORT,
        "model.num_attention_heads=4",
        "model.bias_activation_fusion=false",
        "trainer.max_steps=3",
    )
    with pytest.raises(ArchitectureChangedError) as refused:
        run_recording(monkeypatch, config)
    text = str(refused.value)
    assert "\n" not in text and "step_2 was trained with other model settings" in text
    for change in (
        "model.num_attention_heads 2 -> 4",
        "model.kv_channels 8 -> 4",
        "model.openai_gelu true -> false",  # the preset's fused bias-GELU is the tanh one
    ):
        assert change in text
    assert "set the old values" in text and "start a new run directory" in text
    assert (run / "hparams.yaml").read_text() == before
    assert not any("damaged" in line for line in log_lines(run))


def test_resume_with_settings_a_run_may_change_goes_on(run, monkeypatch):
    """Dropout, learning rate, batch sizes and max_steps are not architecture: as Megatron, they apply."""
    config = tiny_config(
        run,
        *SHORT,
        "model.hidden_dropout=0.0",
        "model.attention_dropout=0.0",
        "model.optim.lr=1e-3",
        "model.normalization=layernorm1p",  # NeMo's spelling of the same function
        "trainer.max_steps=3",
    )
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]


def test_a_checkpoint_saved_before_the_record_resumes_unchecked(run, monkeypatch):
    marker = run / "checkpoints" / "step_2" / "COMPLETE"
    record = json.loads(marker.read_text())
    assert record["architecture"]["model.num_attention_heads"] == 2
    del record["architecture"]
    marker.write_text(json.dumps(record))
    config = tiny_config(run, *SHORT, "model.num_attention_heads=4", "trainer.max_steps=3")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]


def test_a_start_from_another_runs_checkpoint_with_other_settings_loads_with_a_warning(
    run, tmp_path, monkeypatch
):
    """A new run from another's checkpoint may change the model on purpose (the rope base for longer
    sequences): said, not refused."""
    new = tmp_path / "new"
    start = [f"exp_manager.resume_from_checkpoint={run}", "exp_manager.finetune=true"]
    config = tiny_config(new, *SHORT, *start, "model.bias_activation_fusion=false")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0
    warnings = [line for line in log_lines(new) if "other model settings" in line]
    assert len(warnings) == 1 and "model.openai_gelu true -> false" in warnings[0]
