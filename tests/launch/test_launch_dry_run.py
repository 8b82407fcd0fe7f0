"""Issue 14, case 6: `launch --dry-run` renders the scripts even when preflight fails.

A dry run is how one looks at the scripts before the data exists; the failed checks become
warning lines. Without --dry-run they stay one-line errors and nothing is started.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from gptrain.cli import main
from gptrain.launch.compose import compose
from gptrain.launch.stages import build_plan, write_run_files

MISSING = [
    "training.model.data.data_impl=mmap",
    "training.model.data.data_prefix=/nonexistent/corpus_text_document",
]


def answering_sinfo(tmp_path, monkeypatch) -> None:
    """An `sinfo` first on PATH that lists one idle node of partition debug."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/bash\necho 'n1|debug*|4|(null)|idle'\n")
    (bin_dir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_dry_run_renders_when_the_data_is_not_there_yet(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--dry-run", "training.trainer.num_nodes=1", f"base_results_dir={tmp_path}", *MISSING]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "preflight: warning  training.model.data.data_prefix: /nonexistent/corpus_text_document.bin" in err
    assert "dry run: nothing submitted; rendered:" in out
    [script] = Path(tmp_path).glob("*/dry-run/*_submission.sh")
    assert "exec " in script.read_text()


def test_dry_run_on_slurm_warns_about_the_cluster_and_the_data(tmp_path, capsys, monkeypatch):
    """sinfo answers, but the partition does not exist: both problems are listed, the script is written."""
    monkeypatch.chdir(tmp_path)
    answering_sinfo(tmp_path, monkeypatch)
    args = [
        "launch",
        "--dry-run",
        "cluster_type=slurm",
        "cluster.partition=gpu",
        f"base_results_dir={tmp_path}/r",
    ]
    assert main([*args, *MISSING]) == 0
    err = capsys.readouterr().err
    assert "warning  partition 'gpu' does not exist" in err and "data_prefix" in err
    assert list((tmp_path / "r").glob("*/dry-run/*_submission.sh"))


def test_without_dry_run_a_failed_preflight_is_still_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "training.trainer.num_nodes=1", f"base_results_dir={tmp_path}", *MISSING]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptrain: error: training.model.data.data_prefix") and "\n" not in err
    assert not list(Path(tmp_path).glob("*/log-*"))  # nothing ran


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_bad_config_value_is_an_error_even_in_a_dry_run(dry_run, tmp_path, capsys, monkeypatch):
    """Warnings are for the world outside the config (files, cluster); a wrong key is still wrong."""
    monkeypatch.chdir(tmp_path)
    args = ["launch", *(["--dry-run"] if dry_run else []), "training.trainer.max_stepz=3"]
    assert main(args) == 2
    assert "max_stepz" in capsys.readouterr().err


def test_an_error_names_the_override_as_typed(tmp_path, capsys, monkeypatch):
    """A launch respelled `++key=value` as `+key=value` in its errors."""
    monkeypatch.chdir(tmp_path)
    assert (
        main(["launch", "--dry-run", "++training.trainer.max_steps=abc", "training.trainer.num_nodes=1"]) == 2
    )
    assert "override '++training.trainer.max_steps=abc': " in capsys.readouterr().err


def test_a_dry_run_or_a_launch_that_fails_never_touches_a_live_runs_files(tmp_path, capsys, monkeypatch):
    """A requeued job re-reads its _hydra.yaml: only a launch that passed every check may rewrite it."""
    monkeypatch.chdir(tmp_path)
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", "training.model.data.data_impl=mock"]
    live = [*base, "training.trainer.max_steps=1000"]
    write_run_files(build_plan(compose(live)), live)  # the files of a run that is in the queue
    run = tmp_path / "r" / "gpt3_126m"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert yaml.safe_load(before["gpt3_126m_hydra.yaml"])["trainer"]["max_steps"] == 1000

    for dry_run in (["--dry-run"], []):
        assert main(["launch", *dry_run, *base, "training.trainer.max_steps=abc"]) == 2
        assert "max_steps" in capsys.readouterr().err
    assert not (run / "dry-run").exists()  # nothing written by the failed launches
    assert main(["launch", "--dry-run", *base, "training.trainer.max_steps=2000"]) == 0
    out = capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    preview = yaml.safe_load((run / "dry-run/gpt3_126m_hydra.yaml").read_text())
    assert preview["trainer"]["max_steps"] == 2000
    script = (run / "dry-run/gptrain-gpt3_126m_submission.sh").read_text()
    assert f"--config-file {run}/gpt3_126m_hydra.yaml" in script  # as the launch would submit it
    lines = script.splitlines()  # the launch's script, plus one comment saying it is a preview
    assert lines[1].startswith("# gptrain launch --dry-run: a preview, not for sbatch")
    assert lines[:1] + lines[2:] == before["gptrain-gpt3_126m_submission.sh"].decode().splitlines()
    assert f"{run}/dry-run/gptrain-gpt3_126m_submission.sh" in out


def test_a_relaunch_whose_cancel_fails_writes_nothing(tmp_path, capsys, monkeypatch):
    """The previous launch's never-starting jobs were cancelled after the run's files were
    rewritten: a failed scancel (another user's job) left them overwritten and nothing submitted."""
    import gptrain.launch.launcher as launcher
    from gptrain.errors import LaunchError

    monkeypatch.chdir(tmp_path)
    base = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", "training.model.data.data_impl=mock"]
    write_run_files(build_plan(compose([*base, "training.trainer.max_steps=1000"])), base)
    run = tmp_path / "r" / "gpt3_126m"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    def refused(run_dirs, dry_run=False):
        raise LaunchError("scancel 12 failed: Access/permission denied")

    monkeypatch.setattr(launcher, "preflight", lambda plan, dry_run, training: [])
    monkeypatch.setattr(launcher, "cancel_never_starting", refused)
    assert main(["launch", *base, "training.trainer.max_steps=2000"]) == 2
    assert "scancel 12 failed" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_overrides_after_an_option_may_add_keys_with_plus(tmp_path, capsys, monkeypatch):
    """`gptrain launch --dry-run a=b --quiet +env_vars.X=1`: the `+` form follows options too."""
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--dry-run", f"base_results_dir={tmp_path}/r", "training.trainer.num_nodes=1"]
    args += ["--quiet", "+env_vars.GPTRAIN_X=1"]
    assert main([*args, "training.trainer.max_steps=7"]) == 0
    script = (tmp_path / "r/gpt3_126m/dry-run/gptrain-gpt3_126m_submission.sh").read_text()
    assert "export GPTRAIN_X=1" in script.splitlines()
    config = yaml.safe_load((tmp_path / "r/gpt3_126m/dry-run/gpt3_126m_hydra.yaml").read_text())
    assert config["trainer"]["max_steps"] == 7
    capsys.readouterr()
    with pytest.raises(SystemExit):  # anything else after an option is still refused
        main(["launch", "--dry-run", "training.trainer.num_nodes=1", "--quiet", "+=1"])
    assert "unrecognized arguments: +=1" in capsys.readouterr().err


# Issue 21: layouts that cannot work on trainer.num_nodes x trainer.devices ranks.
BAD_LAYOUTS = {
    "tp_pp": (
        ["training.trainer.num_nodes=2", "training.model.tensor_model_parallel_size=8"]
        + ["training.model.pipeline_model_parallel_size=5", "training.model.global_batch_size=100"],
        "training: world size 16 (trainer.num_nodes x trainer.devices) is not divisible by"
        " model.tensor_model_parallel_size x model.pipeline_model_parallel_size = 8 x 5",
    ),
    "batch": (
        ["training.trainer.num_nodes=3", "training.model.micro_batch_size=4"],
        "training: model.global_batch_size=256 is not divisible by model.micro_batch_size x"
        " data-parallel size = 4 x 24",
    ),
    # not a layout, but as impossible, and the job would only find it after its queue wait
    "schedule": (
        ["training.model.optim.sched.constant_steps=100", "training.model.optim.sched.constant_ratio=0.1"],
        "training: model.optim.sched.constant_steps=100 and model.optim.sched.constant_ratio=0.1: give only one",
    ),
}
SLURM_MOCK = [
    "cluster_type=slurm",
    "training.model.data.data_impl=mock",
    "training.model.data.mock_vocab_size=64",
]


@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_an_impossible_layout_stops_a_launch_and_warns_in_a_dry_run(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")  # no sinfo: the layout alone decides
    overrides, message = BAD_LAYOUTS[case]
    args = ["launch", *SLURM_MOCK, f"base_results_dir={tmp_path}/r", *overrides]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gptrain: error: {message}") and "\n" not in err
    assert not (tmp_path / "r").exists()  # nothing written, nothing submitted

    assert main(["launch", "--dry-run", *args[1:]]) == 0
    out, err = capsys.readouterr()
    assert f"preflight: warning  {message}" in err and "(a real launch stops here)" in err
    assert (tmp_path / "r/gpt3_126m/dry-run/gptrain-gpt3_126m_submission.sh").is_file()
    assert "dry run: nothing submitted; rendered:" in out


def test_a_possible_layout_is_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--dry-run", *SLURM_MOCK, f"base_results_dir={tmp_path}/r"]
    args += ["training.trainer.num_nodes=2", "training.model.tensor_model_parallel_size=2"]
    assert main(args) == 0
    assert (
        # the preset's distributed_fused_adam shards AdamW's state, as NeMo does
        "preflight: ok  training: layout TP 2 x PP 1 x DP 8 (shard_grad_op) on 16 ranks (2 node(s) x 8)"
        in capsys.readouterr().err
    )


# Issue 21: mock data builds the tokenizer unless model.data.mock_vocab_size gives the vocabulary.
MOCK_NO_FILES = ["training.model.data.data_impl=mock", "training.model.data.data_prefix=[]"]


def test_mock_data_without_mock_vocab_size_needs_the_tokenizer_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "training.trainer.num_nodes=1", "training.trainer.devices=1", f"data_dir={tmp_path}/d"]
    args += [f"base_results_dir={tmp_path}/r", "training.trainer.accelerator=cpu"]
    assert main([*args, *MOCK_NO_FILES]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"gptrain: error: training.model.tokenizer.vocab_file: {tmp_path}/d/bpe/vocab.json not found"
    )
    assert main([*args, "training.model.data.mock_dataset=true", "training.model.data.data_prefix=[]"]) == 2
    assert "tokenizer.vocab_file" in capsys.readouterr().err  # NeMo's switch for mock data: the same

    assert (
        main(["launch", "--dry-run", *args[1:], *MOCK_NO_FILES, "training.model.data.mock_vocab_size=64"])
        == 0
    )
    err = capsys.readouterr().err
    assert "preflight: ok  training: mock data, no data files needed" in err
    assert "preflight: ok  training: model.data.mock_vocab_size set, no tokenizer files needed" in err
    assert "warning" not in err


MOCK = ["training.trainer.num_nodes=1", "training.model.data.data_impl=mock"]
MOCK += ["training.model.data.mock_vocab_size=64"]


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(
    ("override", "key", "run_dir"),
    [
        ("base_results_dir={tmp}/taken", "training.run.results_dir", "{tmp}/taken/gpt3_126m"),
        ("base_results_dir={tmp}/taken/sub", "training.run.results_dir", "{tmp}/taken/sub/gpt3_126m"),
        ("training.run.results_dir={tmp}/taken", "training.run.results_dir", "{tmp}/taken"),
        (
            "data_preparation.run.results_dir={tmp}/taken",
            "data_preparation.run.results_dir",
            "{tmp}/taken",
        ),
    ],
)
def test_a_run_dir_that_is_a_file_is_one_line_naming_its_key(
    override, key, run_dir, dry_run, tmp_path, capsys, monkeypatch
):
    """It was `<path>: File exists` or `Not a directory` from the write, naming no key."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("a file where the run directory goes")
    args = ["launch", *(["--dry-run"] if dry_run else []), *MOCK, override.format(tmp=tmp_path)]
    if key.startswith("data_preparation"):
        args += ["stages=[data_preparation]", "data_preparation.shards=[https://host/a.jsonl]"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1] == (
        f"gptrain: error: {key}: cannot write the run directory {run_dir.format(tmp=tmp_path)} "
        f"({tmp_path}/taken is not a directory); set base_results_dir or {key} to a directory you can write"
    )


def test_a_read_only_results_dir_is_one_line_before_anything_runs(tmp_path, capsys, monkeypatch):
    """Root writes anywhere, so the test makes the directory look read-only to the check."""
    import gptrain.utils.paths as paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(paths.os, "access", lambda p, m: Path(p) != tmp_path / "ro" and real_access(p, m))
    assert main(["launch", "--dry-run", *MOCK, f"base_results_dir={tmp_path}/ro"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        f"({tmp_path}/ro is not writable); set base_results_dir or training.run.results_dir to a"
        " directory you can write"
    )
    assert not list((tmp_path / "ro").iterdir())


def test_a_wandb_key_file_that_holds_no_key_stops_the_launch(tmp_path, capsys, monkeypatch):
    """The job reads wandb_api_key_file when it starts: a missing or empty file was found only then,
    as W&B failing to start after the queue wait (NeMo's launcher reads the file at launch)."""
    monkeypatch.chdir(tmp_path)
    mock = ["training.model.data.data_impl=mock", "training.model.data.mock_vocab_size=64"]
    wandb = [*mock, "training.trainer.num_nodes=1", "training.exp_manager.create_wandb_logger=true"]
    (tmp_path / "empty").write_text("\n")
    for key_file, reason in (
        ("missing", "missing: No such file or directory"),
        ("empty", "empty has no key"),
    ):
        assert main(["launch", *wandb, f"wandb_api_key_file={key_file}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gptrain: error: wandb_api_key_file: {reason}") and "\n" not in err
        assert not (tmp_path / "results").exists()  # nothing written, nothing ran
    assert main(["launch", "--dry-run", *wandb, "wandb_api_key_file=missing"]) == 0
    assert "preflight: warning  wandb_api_key_file: missing: No such file" in capsys.readouterr().err
    (tmp_path / "key").write_text("0123abcd\nnot the key\n")
    assert main(["launch", "--dry-run", *wandb, "wandb_api_key_file=key"]) == 0
    assert "preflight: ok  wandb_api_key_file: key holds a key" in capsys.readouterr().err
    # a run that does not log to W&B does not read the file
    assert (
        main(["launch", "--dry-run", *mock, "training.trainer.num_nodes=1", "wandb_api_key_file=missing"])
        == 0
    )
    assert "wandb_api_key_file" not in capsys.readouterr().err


def test_launcher_cmd_log_names_the_conf_tree_the_launch_read(tmp_path, monkeypatch):
    """launcher_cmd.log held the overrides only: a launch from a user's tree (--config-dir, as a
    NeMo launcher_scripts/conf) was recorded as one from gptrain's bundled configs, and running the
    recorded command composed another config."""
    import shlex
    import shutil

    from gptrain.cli import build_parser
    from gptrain.launch.compose import CONFIG_ROOT

    monkeypatch.chdir(tmp_path)
    shutil.copytree(CONFIG_ROOT, tmp_path / "my conf")
    shutil.copy(tmp_path / "my conf" / "config.yaml", tmp_path / "my conf" / "site.yaml")
    overrides = ["cluster_type=slurm", f"base_results_dir={tmp_path}/r", "training.run.name=a b"]
    assert main(["launch", "--dry-run", "--config-dir", "my conf", "--config-name", "site", *overrides]) == 0
    [log] = (tmp_path / "r").glob("*/dry-run/launcher_cmd.log")
    words = shlex.split(log.read_text())
    assert words[:2] == ["gptrain", "launch"]
    recorded = build_parser().parse_args(words[1:])
    assert Path(recorded.config_dir) == tmp_path / "my conf" and recorded.config_name == "site"
    assert recorded.overrides == overrides and not recorded.dry_run  # the launch itself, to run again
    assert main(["launch", "--dry-run", *overrides]) == 0  # the bundled tree: recorded as before
    [log] = (tmp_path / "r").glob("*/dry-run/launcher_cmd.log")
    assert shlex.split(log.read_text()) == ["gptrain", "launch", *overrides]


@pytest.mark.parametrize("name", ["exp-${date}", "a\\${b}", "${", "\\\\${x}\\"])
def test_text_that_looks_like_an_interpolation_reaches_the_training_as_text(name, tmp_path, monkeypatch):
    """The launch resolves its config, then writes it for the job, which reads it with OmegaConf
    again: an escaped `\\${date}` given to the launch was written as `${date}` and read back as an
    interpolation, so the launch stopped with "cannot resolve ...: Interpolation key 'date' not
    found" and no spelling could pass the text. It is now written escaped, read back as given."""
    from gptrain.config import load_training_config

    monkeypatch.chdir(tmp_path)
    escaped = re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", name)
    args = [f"base_results_dir={tmp_path}/r", "training.trainer.num_nodes=1"]
    args.append(f"training.exp_manager.wandb_logger_kwargs.name={escaped}")
    assert main(["launch", "--dry-run", *args]) == 0
    [config] = (tmp_path / "r").glob("*/dry-run/*_hydra.yaml")
    cfg = load_training_config(None, [], config_file=str(config))
    assert cfg.exp_manager.wandb_logger_kwargs.name == name


def test_a_slurm_launch_reads_max_array_size_from_scontrol(tmp_path, capsys, monkeypatch):
    """A cluster whose MaxArraySize is below the shard count: the array fits it (sbatch would refuse
    the task ids past it), and the preflight line says the shards share the tasks."""
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\n[ \"$*\" = 'show config' ] || exit 1\n"
        "printf 'MaxArraySize            = 3\\nMaxJobCount             = 10000\\n'\n"
    )
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # no sinfo: the cluster checks are skipped
    shards = ",".join(f"http://h/{n}.jsonl" for n in range(5))
    args = ["launch", "--dry-run", "cluster_type=slurm", f"base_results_dir={tmp_path}/r"]
    args += ["stages=[data_preparation]", f"data_preparation.shards=[{shards}]"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "ok  data_preparation: 5 shard(s) over 3 array tasks (the cluster's MaxArraySize)" in err
    [script] = (tmp_path / "r").glob("*/dry-run/*_submission.sh")
    assert "#SBATCH --array=0-2\n" in script.read_text()


def test_a_dry_run_leaves_only_its_own_preview(tmp_path, capsys, monkeypatch):
    """dry-run/ is what this launch would submit: an earlier dry run's validation script and config
    stayed there beside a training-only preview (review Y26)."""
    monkeypatch.chdir(tmp_path)
    answering_sinfo(tmp_path, monkeypatch)
    common = [
        "launch",
        "--dry-run",
        "cluster_type=slurm",
        f"base_results_dir={tmp_path}/r",
        "training.model.data.data_impl=mock",
        "training.model.data.mock_vocab_size=512",
        "training.trainer.num_nodes=1",
    ]
    assert main([*common, "stages=[validation,training]"]) == 0
    [preview] = (tmp_path / "r").glob("*/dry-run")
    both = sorted(p.name for p in preview.iterdir())
    assert any("validation" in name for name in both), both
    (preview / "notes.txt.orig").mkdir()  # a folder there is not a preview file: left alone
    [script] = [name for name in both if "validation" in name and name.endswith("_submission.sh")]
    edited = (preview / script).read_text().replace("# gptrain launch --dry-run: a preview", "# my copy")
    (preview / "my_submission.sh").write_text(edited)  # a user's own files stay (review X2)
    (preview / "NOTES.md").write_text("node n3 was slow\n")
    assert main(common) == 0
    capsys.readouterr()
    left = sorted(p.name for p in preview.iterdir())
    kept = ["notes.txt.orig", "my_submission.sh", "NOTES.md"]
    assert left == sorted([name for name in both if "validation" not in name] + kept)
