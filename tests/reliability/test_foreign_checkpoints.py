"""A NeMo or Megatron run directory resumed by `gptrain train` (resume_if_exists, the presets' default):
gptrain cannot continue those checkpoints, and trained from scratch beside them, overwriting the run's
hparams.yaml and cmd-args.log. It is refused in one line before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import start_ranks, train_args

from gptrain.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

NEMO_LAST = "megatron_gpt--val_loss=2.31-step=100-consumed_samples=800.0-last.ckpt"


def nemo_run(log_dir: Path) -> dict[str, bytes]:
    """A NeMo run directory as exp_manager leaves it; its files' contents."""
    (log_dir / "checkpoints").mkdir(parents=True)
    (log_dir / "checkpoints" / NEMO_LAST).write_bytes(b"lightning")
    (log_dir / "hparams.yaml").write_text("cfg: nemo\n")
    (log_dir / "cmd-args.log").write_text("megatron_gpt_pretraining.py\n")
    return snapshot(log_dir)


def snapshot(log_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(log_dir)): p.read_bytes() for p in sorted(log_dir.rglob("*")) if p.is_file()}


def test_every_rank_refuses_a_nemo_run_directory_in_one_line_and_writes_nothing(tmp_path):
    log_dir = tmp_path / "run"
    before = nemo_run(log_dir)
    processes = start_ranks(log_dir, [])
    outputs = [p.communicate(timeout=120) for p in processes]
    lasts = []
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 2, err[-2000:]
        lasts.append(err.strip().splitlines()[-1])
    assert lasts[0] == lasts[1]
    assert lasts[0].startswith(f"gptrain: error: {log_dir / 'checkpoints' / NEMO_LAST}: NeMo's checkpoint")
    assert "another run.name or exp_manager.explicit_log_dir" in lasts[0]
    assert snapshot(log_dir) == before  # hparams.yaml, cmd-args.log kept; no step_, no lock, no log
    assert sorted(p.name for p in (log_dir / "checkpoints").iterdir()) == [NEMO_LAST]
    assert sorted(p.name for p in log_dir.iterdir()) == ["checkpoints", "cmd-args.log", "hparams.yaml"]


@pytest.mark.parametrize(
    ("made", "kind", "named"),
    [
        ("checkpoints/megatron_gpt--step=100-last/", "NeMo", "checkpoints/megatron_gpt--step=100-last"),
        (
            "checkpoints/sub/megatron_gpt--step=9-end.ckpt",
            "NeMo",
            "checkpoints/sub/megatron_gpt--step=9-end.ckpt",
        ),
        ("latest_checkpointed_iteration.txt", "Megatron", "latest_checkpointed_iteration.txt"),
        ("iter_0000100/", "Megatron", "iter_0000100"),
    ],
)
def test_nemo_and_megatron_resume_markers_are_refused(tmp_path, capsys, made, kind, named):
    log_dir = tmp_path / "run"
    path = log_dir / made
    path.parent.mkdir(parents=True)
    path.mkdir() if made.endswith("/") else path.write_text("100")
    before = sorted(p.relative_to(log_dir) for p in log_dir.rglob("*"))
    assert main(train_args(log_dir)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gptrain: error: {log_dir / named}: {kind}'s checkpoint")
    assert sorted(p.relative_to(log_dir) for p in log_dir.rglob("*")) == before


def test_a_fresh_start_or_a_given_start_is_not_refused_here(tmp_path):
    """resume_if_exists=false starts a new run (the earlier-run check looks at gptrain's checkpoints);
    the check is the resume's alone."""
    log_dir = tmp_path / "run"
    nemo_run(log_dir)
    assert main(train_args(log_dir, "exp_manager.resume_if_exists=false", "trainer.max_steps=1")) == 0
    assert (log_dir / "checkpoints" / NEMO_LAST).is_file()


def test_the_launch_preflight_refuses_it_with_the_launchs_keys(tmp_path):
    """The job would refuse it as it starts, after the queue wait: the launch says it first."""
    from gptrain.config import load_training_config
    from gptrain.errors import ConfigError
    from gptrain.launch.preflight import check_fresh_start

    log_dir = tmp_path / "run"
    nemo_run(log_dir)
    cfg = load_training_config("gpt3/126m", train_args(log_dir)[2:])
    assert cfg.exp_manager.resume_if_exists
    with pytest.raises(
        ConfigError, match=r"NeMo's checkpoint.*another training\.run\.name or training\.exp_"
    ):
        check_fresh_start(cfg)
    cfg.exp_manager.resume_from_checkpoint = str(tmp_path / "elsewhere")  # a start given: not this check's
    assert check_fresh_start(cfg) == []
