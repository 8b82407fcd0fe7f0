"""Weights & Biases gets the series TensorBoard gets (offline only: no network, no API key).

NeMo's exp_manager.create_wandb_logger/wandb_logger_kwargs and Megatron's --wandb-* flags; the run
is read back from W&B's own offline file (tests/train/wandb_records.py)."""

import os
import re
import shlex
import subprocess
import sys

import pytest
from gloo_ranks import free_port
from train_e2e_helpers import MOCK, run_recording, tiny_config
from wandb_records import offline_only, offline_runs, read_offline_run

from gptrain.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
TINY_MEGATRON = shlex.split(
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2"
    " --global-batch-size 4 --train-iters 4 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 2 --lr-decay-iters 4"
    " --lr-decay-style linear --log-interval 1 --eval-iters 1 --eval-interval 2 --mock-data --vocab-size 128"
    " --num-workers 0 --save-interval 4"
)


def test_megatron_wandb_flags_log_the_printed_series_offline(tmp_path, capsys, monkeypatch):
    offline_only(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    wandb = ["--wandb-project", "tiny-project", "--wandb-exp-name", "tiny-run"]
    assert main(["megatron", *TINY_MEGATRON, "--save", str(tmp_path / "run"), *wandb]) == 0
    out = capsys.readouterr().out
    printed = [float(x) for x in re.findall(r"\| lm loss: ([0-9.E+-]+) \|", out)]
    rates = [float(x) for x in re.findall(r"learning rate: ([0-9.E+-]+)", out)]
    assert len(printed) == 4
    (directory,) = offline_runs(tmp_path / "run" / "wandb")  # Megatron's default: <save>/wandb
    run = read_offline_run(directory)
    assert (run.run.project, run.run.display_name) == ("tiny-project", "tiny-run")
    assert run.config()["model"]["num_layers"] == 2  # the resolved config is the run's config
    loss = run.series("lm loss")
    assert sorted(loss) == [1, 2, 3, 4]
    assert [loss[step] for step in (1, 2, 3, 4)] == pytest.approx(printed, rel=1e-6)  # printed with 7 digits
    assert run.series("reduced_train_loss") == loss  # NeMo's tag, the same values
    assert list(run.series("learning-rate").values()) == pytest.approx(rates) == [5e-4, 1e-3, 5.5e-4, 1e-4]
    assert sorted(run.series("lm loss validation")) == [2, 4] and sorted(run.series("val_loss")) == [2, 4]
    assert run.metrics["lm loss vs samples"] == "consumed_samples"  # Megatron's x axis for that series
    assert run.metrics["*"] == "trainer/global_step"  # every other series: the iteration
    by_samples = [
        (row["consumed_samples"], row["lm loss vs samples"])
        for row in run.history
        if "lm loss vs samples" in row
    ]
    assert by_samples == [(4 * step, loss[step]) for step in (1, 2, 3, 4)]


def test_nemo_wandb_logger_kwargs_offline_without_wandb_mode(tmp_path, monkeypatch):
    offline_only(monkeypatch, tmp_path)  # WANDB_MODE unset: wandb_logger_kwargs.offline alone keeps it local
    kwargs = "exp_manager.wandb_logger_kwargs"
    cfg = tiny_config(
        tmp_path / "run",
        *MOCK,
        "trainer.max_steps=3",
        "exp_manager.create_wandb_logger=true",
        f"{kwargs}.offline=true",
        f"{kwargs}.project=nemo_gpt3",
        f"{kwargs}.save_dir={tmp_path / 'wb'}",
        f"{kwargs}.group=g1",
        f"{kwargs}.tags=[tiny,cpu]",
    )
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [1, 2, 3]
    (directory,) = offline_runs(tmp_path / "wb")
    run = read_offline_run(directory)
    assert (run.run.project, run.run.display_name, run.run.run_group) == ("nemo_gpt3", "gpt3_126m", "g1")
    assert list(run.run.tags) == ["tiny", "cpu"]
    assert run.series("reduced_train_loss") == pytest.approx(losses, rel=1e-12)
    assert run.series("global_step") == {1: 1.0, 2: 2.0, 3: 3.0}
    assert sorted(run.series("val_loss")) == [3]


def test_asking_for_wandb_without_it_installed_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    monkeypatch.chdir(tmp_path)
    assert main(["megatron", *TINY_MEGATRON, "--save", str(tmp_path / "run"), "--wandb-project", "p"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'gptrain[wandb]'" in err
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_the_cli_and_the_training_loop_do_not_import_wandb(tmp_path):
    code = (
        "import sys; from gptrain.cli import main; code = main(sys.argv[1:]); import gptrain.train.loop;"
        " print(sorted(m for m in ('wandb', 'torch') if m in sys.modules), code)"
    )
    flags = [*TINY_MEGATRON, "--wandb-project", "p", "--dry-run"]
    out = subprocess.run(
        [sys.executable, "-c", code, "megatron", *flags], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("['torch'] 0")  # torch from importing the loop, never wandb
    assert "exp_manager.create_wandb_logger=true" in out.stdout


@pytest.mark.distributed
@pytest.mark.slow
def test_only_the_logging_rank_logs_to_wandb(tmp_path, monkeypatch):
    offline_only(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}"]
    flags = [
        *TINY_MEGATRON,
        "--save",
        str(tmp_path / "run"),
        "--wandb-project",
        "p",
        "--wandb-save-dir",
        str(tmp_path / "wb"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*torchrun, "-m", "gptrain", "megatron", *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (directory,) = offline_runs(tmp_path / "wb")  # one W&B run for the two ranks
    logged = list(read_offline_run(directory).series("lm loss").values())
    last_rank = (
        tmp_path / "run" / "nemo_log_globalrank-1_localrank-1.txt"
    ).read_text()  # Megatron's logging rank
    printed = [float(x) for x in re.findall(r"\| lm loss: ([0-9.E+-]+) \|", last_rank)]
    assert len(printed) == 4 and logged == pytest.approx(printed, rel=1e-6)


def test_wandb_failing_to_start_is_one_line_naming_what_to_do(tmp_path, monkeypatch):
    """wandb.init's own errors (no API key, no network) become one line, before any training."""
    import importlib.machinery
    import types

    from gptrain.errors import ConfigError
    from gptrain.train.wandb_logger import WandbRun

    def refuse(**_):
        raise RuntimeError("api_key not configured\n(no-tty). call wandb.login(key=[your_api_key])")

    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = refuse
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny_config(tmp_path / "run", *MOCK, "exp_manager.create_wandb_logger=true")
    with pytest.raises(ConfigError) as error:
        WandbRun.start(cfg)
    message = str(error.value)
    assert "\n" not in message and "api_key not configured (no-tty)" in message
    assert "WANDB_MODE=offline" in message and "wandb login" in message


class FakeWandb:
    """The `wandb` module as the loop uses it, with W&B's server-side rule for steps: a resumed run
    (same id, resume given) goes on from its last step, and a row logged with a lower `step=` than
    the run's newest is dropped (W&B warns and drops it). Rows are kept per run id across attempts."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = {}
        self.dropped: list[int] = []
        self.metrics: dict[str, str | None] = {}
        self.attempt = 0

    def module(self):
        import importlib.machinery
        import types

        fake = types.ModuleType("wandb")
        fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        fake.init = self.init
        fake.teardown = lambda: None
        return fake

    def init(self, id, resume=None, **_):
        self.attempt += 1
        rows = self.rows.setdefault(id, [])
        wandb = self

        class Run:
            floor = rows[-1]["_step"] + 1 if resume and rows else 0  # the next step W&B accepts
            current: int | None = None

            def log(self, data, step=None):
                if step is None:
                    step = self.floor if self.current is None else self.current + 1
                if step < self.floor:
                    wandb.dropped.append(step)
                    return
                rows.append({"_step": step, "attempt": wandb.attempt, **data})
                self.current = self.floor = step

            def define_metric(self, name, step_metric=None):
                wandb.metrics[name] = step_metric

            def finish(self, exit_code=0):
                pass

        return Run()


def test_a_requeued_run_resuming_its_wandb_run_keeps_the_iterations_it_logs_again(tmp_path, monkeypatch):
    """A job that stops after its last checkpoint logs the iterations after it again once resumed;
    W&B drops a step lower than its run's newest, so with `id` and `resume` (one W&B run across the
    requeues) the resumed run's values for those iterations, and everything up to the stop, were
    lost. The iteration is now an x axis of its own (trainer/global_step, as Lightning's logger)."""
    wandb = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb.module())
    kwargs = "exp_manager.wandb_logger_kwargs"
    shape = [
        *MOCK,
        "exp_manager.create_wandb_logger=true",
        f"{kwargs}.id=run-1",
        f"{kwargs}.resume=allow",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=3",
    ]
    from gptrain.train import loop, step_loop

    real_record = step_loop.record

    def failing_at_6(session, result, *args):  # after iteration 5's line, before 6's
        if session.state.step == 5:
            raise RuntimeError("node failure")
        real_record(session, result, *args)

    monkeypatch.setattr(step_loop, "record", failing_at_6)
    with pytest.raises(RuntimeError, match="node failure"):
        loop.train(tiny_config(tmp_path / "run", *shape))
    monkeypatch.setattr(step_loop, "record", real_record)
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path / "run", *shape))  # resumes at 3
    assert code == 0 and sorted(losses) == [4, 5, 6]
    assert wandb.dropped == []
    latest: dict[int, dict] = {}  # the newest row holding the loss, by its iteration
    for row in wandb.rows["run-1"]:
        if "lm loss" in row:
            latest[row.get("trainer/global_step", row["_step"])] = row
    assert sorted(latest) == [1, 2, 3, 4, 5, 6]
    assert {step: row["attempt"] for step, row in latest.items()} == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2}
    assert {step: latest[step]["lm loss"] for step in (4, 5, 6)} == pytest.approx(losses, rel=1e-12)
    assert wandb.metrics["*"] == "trainer/global_step"
