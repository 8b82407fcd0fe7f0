"""On/off keys of the launch config read as OmegaConf reads a bool field (yes/no, on/off, 1/0, text
of true/false): `no`, `off` and a quoted 'false' were text, so Python truthiness read them as on."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.config.nemo_launcher import adapt_pile_download
from gptrain.errors import ConfigError
from gptrain.launch.compose import compose
from gptrain.launch.download import remove_extracted
from gptrain.launch.stages import build_plan
from gptrain.launch.tokenize_step import tokenize_command

OFF = ["no", "off", "'false'", "0", "n", "OFF"]
ON = ["yes", "on", "'true'", "1", "y", "True"]
PREP = ["cluster_type=slurm", "stages=[data_preparation]", "data_preparation.shards=[https://h/a.jsonl]"]
PREP_SWITCHES = ("extract", "keep_compressed", "keep_extracted", "append_eod")


@pytest.mark.parametrize("value", OFF)
def test_unique_output_off_in_any_spelling_gives_no_timestamp(value, tmp_path):
    comp = compose([f"base_results_dir={tmp_path}", f"unique_output={value}"], now=0)
    assert comp.resolved()["training"]["run"]["results_dir"] == f"{tmp_path}/gpt3_126m"


@pytest.mark.parametrize("value", ON)
def test_unique_output_on_in_any_spelling_gives_a_timestamp(value, tmp_path):
    comp = compose([f"base_results_dir={tmp_path}", f"unique_output={value}"], now=0)
    assert comp.resolved()["training"]["run"]["results_dir"] != f"{tmp_path}/gpt3_126m"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("unique_output=maybe", "unique_output"),
        ("unique_output=[1]", "unique_output"),
        ("unique_output=0.5", "unique_output"),
        *((f"data_preparation.{key}=maybe", f"data_preparation.{key}") for key in PREP_SWITCHES),
        ("data_preparation.append_eod=[1]", "data_preparation.append_eod"),
        ("validation.exclude_failed=maybe", "validation.exclude_failed"),
    ],
)
def test_a_switch_that_is_no_switch_is_one_line_naming_the_key(override, key, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--dry-run", *PREP, f"base_results_dir={tmp_path}/r", override]
    args[4:4] = ["stages=[data_preparation,validation,training]"] if "validation" in override else []
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptrain: error: ") and "\n" not in err and "Traceback" not in err
    assert f"{key}: expected true or false" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", OFF)
def test_data_preparation_switches_off_in_any_spelling_are_false_for_the_job(value, tmp_path):
    switches = [f"data_preparation.{key}={value}" for key in PREP_SWITCHES]
    plan = build_plan(compose([*PREP, f"base_results_dir={tmp_path}", *switches]))
    section = plan.resolved["data_preparation"]
    assert [section[key] for key in PREP_SWITCHES] == [False] * 4
    assert "--append-eod" not in tokenize_command(section, Path("/x/a.jsonl"), Path("/x/a"), "python")


@pytest.mark.parametrize("value", ["no", "off", "false", "0", "N"])
def test_the_job_reads_a_stage_file_switch_as_a_switch(value, tmp_path):
    """A stage config written by hand (or by an older launch) reaches the job unchecked."""
    cfg = {"append_eod": value, "keep_extracted": value}
    assert "--append-eod" not in tokenize_command(cfg, Path("/x/a.jsonl"), Path("/x/a"), "python")
    raw, plain = tmp_path / "a.jsonl.zst", tmp_path / "a.jsonl"
    plain.write_text("{}\n")
    (tmp_path / "a.jsonl.gptrain-extracted").touch()
    remove_extracted(cfg, raw, plain)
    assert not plain.exists()


def test_the_job_refuses_a_stage_file_switch_that_is_no_switch(tmp_path):
    with pytest.raises(ConfigError, match=r"^data_preparation.append_eod: expected true or false, got"):
        tokenize_command({"append_eod": "maybe"}, Path("/x/a.jsonl"), Path("/x/a"), "python")
    with pytest.raises(ConfigError, match=r"^data_preparation.keep_extracted: expected true or false"):
        remove_extracted({"keep_extracted": "maybe"}, tmp_path / "a.zst", tmp_path / "a")


@pytest.mark.parametrize("value", OFF)
def test_validation_exclude_failed_off_passes_no_exclude_file(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "stages=[validation,training]", f"validation.exclude_failed={value}"]
    validation = build_plan(compose(args)).jobs[0]
    assert "--exclude-file" not in validation.command


@pytest.mark.parametrize(("value", "stages"), [("on", ["training"]), ("y", ["training"]), ("off", None)])
def test_nemo_run_switches_read_on_and_off(value, stages):
    overrides = ["cluster_type=slurm", "~stages", "+run_data_preparation=False", f"+run_training={value}"]
    if stages is None:
        with pytest.raises(ConfigError, match="no stage to run"):
            compose(overrides)
    else:
        assert compose(overrides).resolved()["stages"] == stages


def test_nemo_run_switch_that_is_no_switch_is_refused_naming_it():
    overrides = ["cluster_type=slurm", "~stages", "+run_data_preparation=True", "+run_training=maybe"]
    with pytest.raises(ConfigError, match=r"^run_training: expected true or false, got 'maybe'"):
        compose(overrides)


@pytest.mark.parametrize(
    ("value", "keep"), [("off", True), ("no", True), (0, True), ("on", False), ("y", False)]
)
def test_nemo_pile_rm_switches_read_on_and_off(value, keep):
    section = {
        "the_pile_url": "https://h/pile",
        "file_numbers": "0",
        "rm_downloaded": value,
        "rm_extracted": value,
    }
    adapted, _ = adapt_pile_download(section, "/data")
    assert adapted["keep_compressed"] is keep and adapted["keep_extracted"] is keep
    section["rm_extracted"] = "maybe"
    with pytest.raises(ConfigError, match=r"^data_preparation.rm_extracted: expected true or false"):
        adapt_pile_download(section, "/data")


@pytest.mark.parametrize("value", OFF)
def test_the_launchs_notes_read_the_training_switches_as_the_training_does(value, tmp_path):
    """The launch read exp_manager's switches from the raw section: `no` was on, so a launch saving no
    checkpoints was told about requeues, and a relaunch without resume was not told how to resume."""
    from gptrain.launch.executors.local import resume_override
    from gptrain.launch.launcher import launch_notes

    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "training.trainer.num_nodes=1"]
    no_requeue = [*args, "cluster.max_requeues=0"]
    plan = build_plan(compose([*no_requeue, f"training.exp_manager.create_checkpoint_callback={value}"]))
    assert not [note for note in launch_notes(plan, ["training"]) if "max_requeues is" in note]
    assert [
        note
        for note in launch_notes(build_plan(compose(no_requeue)), ["training"])
        if "max_requeues is" in note
    ]
    plan = build_plan(compose([*args, f"training.exp_manager.resume_if_exists={value}"]))
    assert resume_override(plan) == " and training.exp_manager.resume_if_exists=true"
    assert resume_override(build_plan(compose(args))) == ""


@pytest.mark.parametrize("value", [*OFF, "null"])
def test_nemos_heterogeneous_off_in_any_spelling_is_dropped(value):
    """`+cluster.heterogeneous=no` was refused as `heterogeneous=true`: only null and false were off."""
    from gptrain.config.nemo_launcher import slurm_launcher_keys

    cluster = {"heterogeneous": yaml_value(value)}
    assert slurm_launcher_keys(cluster) == [] and cluster == {}


@pytest.mark.parametrize(
    ("value", "message"), [("on", "heterogeneous=true: gptrain"), ("maybe", "heterogeneous: expected true")]
)
def test_nemos_heterogeneous_on_or_no_switch_is_refused(value, message):
    from gptrain.config.nemo_launcher import slurm_launcher_keys

    with pytest.raises(ConfigError, match=rf"^cluster\.{message}"):
        slurm_launcher_keys({"heterogeneous": value})


def yaml_value(text: str):
    from gptrain.config.yamlio import parse_value

    return parse_value(text)


@pytest.mark.parametrize("value", ["no", "off", "false", "N"])
def test_a_shard_prepared_with_keep_switches_off_leaves_neither_archive_nor_text(
    value, tmp_path, monkeypatch
):
    """The job's own reading, for a stage file that reached it unchecked: `keep_compressed: no` kept
    the download and `extract: no` (truthy) still extracted."""
    import subprocess

    import zstandard

    from gptrain.launch import download

    source = tmp_path / "src" / "a.jsonl.zst"
    source.parent.mkdir()
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "x"}\n'))
    cfg = {
        "shards": [source.as_uri()],
        "download_dir": str(tmp_path / "dl"),
        "output_dir": str(tmp_path / "out"),
        "keep_compressed": value,
        "keep_extracted": value,
        "extract": "yes",
    }
    monkeypatch.setattr(download.subprocess, "run", lambda command: subprocess.CompletedProcess(command, 0))
    download.prepare_shard(cfg, 0)
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == []
    cfg["extract"] = value
    (tmp_path / "out").rename(tmp_path / "out0")
    download.prepare_shard(cfg, 0)
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["a.jsonl.zst"]  # not extracted, kept
