"""A run that fails by an exception leaves promptly and keeps what it finished.

Before: the failing rank waited in the shutdown barrier for peers blocked in a collective it
would never join (no output, until torch's collective timeout), and a background save of a
finished step was never marked complete.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from reliability_helpers import (
    TINY,
    finish_or_end_together,
    finish_ranks,
    free_port,
    start_program,
    start_ranks,
    train_args,
)

from gptrain.checkpoint.integrity import complete_steps
from gptrain.config import load_training_config
from gptrain.train import loop, step_loop

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

HOOKED = [sys.executable, str(Path(__file__).with_name("rank_hooks.py"))]
TEST_SPLIT = ["trainer.limit_test_batches=3"]


def in_save(async_save: str) -> list[str]:
    return [
        "trainer.max_steps=20",
        "trainer.log_every_n_steps=5",  # iteration 5 unlogged too: the flag would have been read at 6
        f"exp_manager.checkpoint_callback_params.async_save={async_save}",
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, module_indexed_corpus: list[str]) -> Path:
    """The scenarios whose ranks end by returning (none is killed, none raises), each in its own run
    directory root/NAME/run, in one launch of two ranks running them in turn (one start-up): each
    run as a fresh process would (rank_hooks.run_in_turn); each rank's out, err and code under
    root/NAME/out. The one a signal reaches before its handlers are installed runs first."""
    root = tmp_path_factory.mktemp("rank_failure")
    scenarios = [
        ("before_start", ["signal-before-start", "1"], ["trainer.max_steps=4"]),
        ("startup", ["signal-in-startup", "1"], ["trainer.max_steps=4"]),
        ("nan", ["nan-from", "1", "3"], ["trainer.max_steps=50", "trainer.max_consecutive_nonfinite=2"]),
        ("index_builds", ["report-index-builds"], module_indexed_corpus),
        ("save_false", ["signal-in-save", "1", "4"], in_save("false")),
        ("save_true", ["signal-in-save", "1", "4"], in_save("true")),
        ("test_split", ["signal-in-test", "1"], TEST_SPLIT),
        ("test_split_resumed", ["none"], TEST_SPLIT),
        *(
            (f"disk_full_{mode}", ["disk-full-in-save", "1", "4"], disk_full(mode))
            for mode in ("true", "false")
        ),
        *((f"cannot_mark_{n}", ["complete-full-awaited", "6"], cannot_mark(n)) for n in (1, 5)),
        ("final_cannot_mark", ["complete-full", "4"], FINAL_CANNOT_MARK),
    ]
    in_turn = []
    for name, hook, overrides in scenarios:
        run = root / name.removesuffix("_resumed") / "run"
        argv = train_args(run, "trainer.devices=2", *overrides)
        in_turn.append({"hook": hook, "argv": argv, "port": free_port(), "out": str(root / name / "out")})
        if name == "test_split":  # resumed next: its directory as this run left it
            in_turn[-1]["snapshot"] = str(run)
    launch = start_program([*HOOKED, "runs", json.dumps(in_turn)])
    outputs = finish_or_end_together(launch, timeout=480)
    assert [rank.returncode for rank in launch] == [0, 0], outputs
    return root


def ended(out: Path) -> tuple[list[int], list[tuple[str, str]]]:
    """Each rank's exit code and (stdout, stderr) of one run of `runs`."""
    codes = [int((out / f"rank_{r}.code").read_text()) for r in (0, 1)]
    return codes, [((out / f"rank_{r}.out").read_text(), (out / f"rank_{r}.err").read_text()) for r in (0, 1)]


def test_a_rank_local_error_ends_every_rank_promptly_and_is_printed(tmp_path):
    overrides = ["trainer.max_steps=50", "trainer.hang_timeout_minutes=0"]
    ranks = start_ranks(tmp_path / "run", overrides, program=[*HOOKED, "fail", "1", "3"])
    outputs = finish_ranks(ranks)
    codes = [rank.returncode for rank in ranks]
    assert all(code != 0 for code in codes), codes
    assert "rank-local failure injected on rank 1" in outputs[1][1]


def test_a_nan_loss_on_one_ranks_batch_is_skipped_and_stops_every_rank_at_one_iteration(runs):
    """The loss and gradients are reduced over the ranks, so every rank skips the step one rank's batch
    made NaN, names it, and stops at the same iteration with the same one line (no rank waits in a
    collective the others left), naming the last checkpoint saved before the streak."""
    codes, outputs = ended(runs / "nan" / "out")
    assert codes == [2, 2], outputs
    tmp_path = runs / "nan"
    last_good = tmp_path / "run" / "checkpoints" / "step_2"
    for rank, (_, err) in enumerate(outputs):
        assert "Traceback" not in err, err[-3000:]
        line = (
            "gptrain: error: loss or gradients not finite for 2 iterations in a row (last at iteration 4: lm loss nan); "
            f"last good checkpoint: {last_good};"
        )
        assert err.splitlines()[-1].startswith(line), err[-3000:]
        log = (tmp_path / "run" / f"nemo_log_globalrank-{rank}_localrank-{rank}.txt").read_text()
        assert "warning: iteration 3 skipped: loss or gradients not finite (lm loss nan); 1 in a row" in log
    assert complete_steps(tmp_path / "run" / "checkpoints") == [2]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_a_rank_killed_mid_run_is_named_by_the_other_in_one_line(tmp_path, killed):
    """SIGKILL (the out-of-memory killer) of one rank: the other's collective fails at once on gloo,
    and it printed the backend's traceback naming a socket address, not the rank that died."""
    overrides = ["trainer.max_steps=50", "trainer.hang_timeout_minutes=0.5"]
    ranks = start_ranks(tmp_path / "run", overrides, program=[*HOOKED, "kill", str(killed), "3"])
    outputs = finish_ranks(ranks)
    survivor = 1 - killed
    err = outputs[survivor][1]
    assert ranks[killed].returncode == -9 and ranks[survivor].returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # c10d's C++ stack of a failed store call may still come first: the watchdog peeks at the store's
    # socket before its own calls (test_watchdog), but a call already under way when rank 0 dies prints
    # it (a CI run under load did); gptrain's own line is the one this test holds to
    line = next(x for x in err.splitlines() if "a collective lost its peer" in x)
    named = f"rank {killed} on host" if killed else "rank 0 (the job's store"
    assert line.startswith(f"gptrain: error: rank {survivor}: ") and named in line, line
    assert (
        f"not requeued (the rank that ended says why); launch the same command again to resume from the "
        f"last complete checkpoint ({tmp_path / 'run' / 'checkpoints' / 'step_2'})" in line
    )


def test_a_rank_killed_during_a_save_is_said_to_have_ended_in_that_save(tmp_path):
    """The survivor's line said 'at iteration 5' of a peer that died while the ranks saved iteration 4:
    a step that never started. It names the save."""
    overrides = ["trainer.max_steps=6", "trainer.hang_timeout_minutes=0.5"]
    ranks = start_ranks(tmp_path / "run", overrides, program=[*HOOKED, "kill-in-save", "1", "4"])
    outputs = finish_ranks(ranks)
    err = outputs[0][1]
    assert ranks[1].returncode == -9 and ranks[0].returncode == 2, err[-3000:]
    line = next(x for x in err.splitlines() if "a collective lost its peer" in x)
    assert "rank 0: a collective lost its peer while saving iteration 4's checkpoint: rank 1 on host" in line
    assert f"last complete checkpoint ({tmp_path / 'run' / 'checkpoints' / 'step_2'})" in line


def test_a_background_save_of_a_finished_step_completes_when_a_later_step_fails(tmp_path, monkeypatch):
    record = step_loop.record

    def record_then_fail(s, result, samples=None):
        record(s, result, samples)
        if s.state.step == 3:
            raise RuntimeError("injected failure at iteration 3")

    monkeypatch.setattr(step_loop, "record", record_then_fail)
    overrides = [
        *TINY,
        f"exp_manager.explicit_log_dir={tmp_path}",
        "exp_manager.checkpoint_callback_params.async_save=true",
    ]
    with pytest.raises(RuntimeError, match="injected"):
        loop.train(load_training_config("gpt3/126m", [*overrides, "trainer.max_steps=10"]))
    assert complete_steps(tmp_path / "checkpoints") == [2]
    assert "saved checkpoint step_2" in (tmp_path / "nemo_log_globalrank-0_localrank-0.txt").read_text()


def test_rank_zero_builds_the_dataset_indices_and_the_others_load_them(runs):
    """As Megatron: on a cache miss one builder, not one per rank (gigabytes each at scale)."""
    codes, outputs = ended(runs / "index_builds" / "out")
    assert codes == [0, 0], outputs
    assert "rank 0 builds dataset indices" in outputs[0][0]
    assert "builds dataset indices" not in outputs[1][0]


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_a_stop_one_rank_gets_during_a_save_ends_every_rank_with_that_checkpoint(runs, async_save):
    """Slurm's warning signal lands while the ranks save iteration 4 (seen by rank 1 first): every
    rank agrees right after the save and exits 75 there, where they trained on and saved again
    (runs: `in_save`)."""
    tmp_path = runs / f"save_{async_save}"
    codes, outputs = ended(tmp_path / "out")
    assert codes == [75, 75], outputs
    assert complete_steps(tmp_path / "run" / "checkpoints") == [2, 4]
    logs = [(tmp_path / "run" / f"nemo_log_globalrank-{r}_localrank-{r}.txt").read_text() for r in (0, 1)]
    assert "stopping at iteration 4: stop requested on another rank" in logs[0]
    assert "stopping at iteration 4: received SIGUSR1" in logs[1]


def test_a_stop_one_rank_gets_inside_the_test_split_ends_every_rank_at_one_batch(runs):
    """Slurm's warning signal on rank 1 inside the final test split: every rank gives it up at the same
    global batch (the flag agreed a batch late, as on unlogged steps) and exits 75 with the final
    checkpoint; the relaunch evaluates only the test split, which it records done."""
    tmp_path = runs / "test_split"
    first = tmp_path / "out" / "snapshot"  # the run directory before the resume
    codes, outputs = ended(tmp_path / "out")
    assert codes == [75, 75], outputs
    assert complete_steps(first / "checkpoints")[-1] == 4
    logs = [(first / f"nemo_log_globalrank-{r}_localrank-{r}.txt").read_text() for r in (0, 1)]
    left = "; trained to trainer.max_steps: the resumed run only evaluates the test split; exit 75"
    assert f"stopping at iteration 4: stop requested on another rank{left}" in logs[0]
    assert f"stopping at iteration 4: received SIGUSR1{left}" in logs[1]
    assert "on test set" not in logs[0] + logs[1] and not (first / "test_split_done.txt").exists()
    codes, outputs = ended(runs / "test_split_resumed" / "out")
    assert codes == [0, 0], outputs
    logs = [(tmp_path / "run" / f"nemo_log_globalrank-{r}_localrank-{r}.txt").read_text() for r in (0, 1)]
    assert (logs[0] + logs[1]).count("validation loss at iteration 4 on test set") == 1
    assert (tmp_path / "run" / "test_split_done.txt").read_text() == "4\n"


def test_a_stop_one_rank_gets_during_start_up_ends_every_rank_before_a_step(runs):
    """SIGTERM on rank 1 while it loads the checkpoint: every rank agrees before step 1 and exits 75
    without training (it trained and saved one step), and saves nothing (no checkpoint to resume
    is not a reason to write one of step 0)."""
    tmp_path = runs / "startup"
    codes, outputs = ended(tmp_path / "out")
    assert codes == [75, 75], outputs
    assert complete_steps(tmp_path / "run" / "checkpoints") == []
    logs = [(tmp_path / "run" / f"nemo_log_globalrank-{r}_localrank-{r}.txt").read_text() for r in (0, 1)]
    for log, reason in zip(logs, ("stop requested on another rank", "received SIGTERM"), strict=True):
        assert f"stopping before the first step: {reason}; nothing trained since no checkpoint" in log
        assert "iteration        1/" not in log


def test_a_stop_signal_before_the_run_installs_its_handlers_is_not_fatal(runs):
    """SIGUSR1 on rank 1 while `gptrain train` still imports torch and loads its config (Slurm's
    warning signal to a job that starts up for longer than the time left): the rank died of it
    (-SIGUSR1, which the batch script does not requeue); now every rank stops before step 1, exit 75."""
    tmp_path = runs / "before_start"
    codes, outputs = ended(tmp_path / "out")
    assert codes == [75, 75], outputs
    assert complete_steps(tmp_path / "run" / "checkpoints") == []
    log = (tmp_path / "run" / "nemo_log_globalrank-1_localrank-1.txt").read_text()
    assert "stopping before the first step: received SIGUSR1; nothing trained since no checkpoint" in log


def disk_full(async_save: str) -> list[str]:
    return ["trainer.max_steps=8", f"exp_manager.checkpoint_callback_params.async_save={async_save}"]


@pytest.mark.parametrize("async_save", ["true", "false"])
def test_a_save_failing_on_one_rank_stops_every_rank_naming_that_rank(runs, async_save):
    """Rank 1's disk is full while iteration 4 is saved (in the background, or at once): no rank marks
    step_4 complete, and every rank ends with one line that names the rank whose write failed and why."""
    codes, outputs = ended(runs / f"disk_full_{async_save}" / "out")
    assert all(code not in (0, 75) for code in codes), outputs
    assert complete_steps(runs / f"disk_full_{async_save}" / "run" / "checkpoints") == [2]
    for _, err in outputs:
        assert "Traceback" not in err, err[-3000:]
        line = err.splitlines()[-1]
        assert line.startswith("gptrain: error: "), err[-3000:]
        assert "rank 1" in line and "No space left on device (injected)" in line, line


def cannot_mark(log_every: int) -> list[str]:
    return [
        "trainer.max_steps=12",
        f"trainer.log_every_n_steps={log_every}",
        "trainer.hang_timeout_minutes=0.5",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=6",
        "exp_manager.checkpoint_callback_params.async_save=true",
    ]


FINAL_CANNOT_MARK = ["trainer.limit_test_batches=2", "exp_manager.checkpoint_callback_params.async_save=true"]


@pytest.mark.parametrize("log_every", [1, 5])
def test_a_background_save_rank_0_cannot_mark_stops_every_rank_at_one_step_with_its_cause(runs, log_every):
    """Rank 0's COMPLETE of iteration 6 meets a full disk in its background marking thread, which only
    rank 0 learns of: it raised at its next poll, and rank 1 trained on into a collective rank 0 had
    left, to stop with 'a collective lost its peer', without the cause. Now the failure is agreed as a
    stop is (a step late on unlogged iterations): every rank stops at the same step, before the next
    save (rank 0 ends step 7 once its marking has failed, which a loaded machine delayed past step 12:
    the ranks stopped at the save instead), with rank 0's line, and step_6 is no
    checkpoint. Rank 1 (the logging rank) logged 'saved checkpoint step_6' once its own write was
    done, before failing on that same save: a save is now reported once every rank has it done, rank
    0's marking included."""
    tmp_path = runs / f"cannot_mark_{log_every}"
    codes, outputs = ended(tmp_path / "out")
    assert codes == [2, 2], outputs
    assert complete_steps(tmp_path / "run" / "checkpoints") == [], outputs
    lines, stopped_at = [], []
    for rank, (out, err) in enumerate(outputs):
        assert "Traceback" not in err, err[-3000:]
        lines.append(err.splitlines()[-1])
        stopped_at.append([line for line in out.splitlines() if line.startswith("recorded iteration ")][-1])
        log = (tmp_path / "run" / f"nemo_log_globalrank-{rank}_localrank-{rank}.txt").read_text()
        assert "saved checkpoint step_6" not in log and "saved checkpoint step_6" not in out, log
    # by the stop flag, not by the save at 12 (which agrees on the failure too)
    assert stopped_at[0] == stopped_at[1] and 6 < int(stopped_at[0].split()[-1]) < 12, stopped_at
    step_6 = tmp_path / "run" / "checkpoints" / "step_6"
    assert lines[0] == lines[1], lines
    assert lines[0].startswith(f"gptrain: error: checkpoint {step_6} could not be written (OSError: "), lines
    assert "No space left on device (injected)" in lines[0]


def test_a_final_background_save_rank_0_cannot_mark_is_not_reported_saved_on_another_rank(runs):
    """The last save, written in the background beside the test split, that rank 0 cannot mark: rank 1
    logged 'saved checkpoint step_4' and died in the shutdown with gloo's traceback. Every rank now waits
    for the save's agreed outcome and stops with rank 0's line."""
    tmp_path = runs / "final_cannot_mark"
    codes, outputs = ended(tmp_path / "out")
    assert codes == [2, 2], outputs
    assert complete_steps(tmp_path / "run" / "checkpoints") == [2]
    step_4 = tmp_path / "run" / "checkpoints" / "step_4"
    for rank, (_, err) in enumerate(outputs):
        assert "Traceback" not in err, err[-3000:]
        assert err.splitlines()[-1].startswith(f"gptrain: error: checkpoint {step_4} could not be written")
        log = (tmp_path / "run" / f"nemo_log_globalrank-{rank}_localrank-{rank}.txt").read_text()
        assert "saved checkpoint step_2" in log and "saved checkpoint step_4" not in log


def test_a_staging_copy_failing_on_one_rank_stops_every_rank_with_its_cause(tmp_path):
    """Rank 1's staging copy of the async save of iteration 4 fails a second into it, while the next
    optimizer step waits for it. That wait raised on rank 1 alone, out of the step; rank 0 went on into
    the next collective and ended with 'a collective lost its peer', without the cause (and, with rank 1
    alive, its writer thread waited in DCP's gather until gloo's timeout: test_save_failures_ranks). The
    ranks now agree on the copy before the write starts, and on its failure as on any failed background
    save: both stop with one line naming rank 1 and its cause, and step_4 is no checkpoint."""
    overrides = [
        "trainer.max_steps=8",
        "trainer.hang_timeout_minutes=0.5",  # the way out waits at most a minute for a pending save
        "exp_manager.checkpoint_callback_params.async_save=true",
    ]
    ranks = start_ranks(tmp_path / "run", overrides, program=[*HOOKED, "staging-fails-in-save", "1", "4"])
    outputs = finish_ranks(ranks)
    assert [rank.returncode for rank in ranks] == [2, 2], outputs
    assert complete_steps(tmp_path / "run" / "checkpoints") == [2], outputs
    step_4 = tmp_path / "run" / "checkpoints" / "step_4"
    for _, err in outputs:
        assert "Traceback" not in err, err[-3000:]
        assert err.splitlines()[-1] == (
            f"gptrain: error: checkpoint {step_4} could not be written (on rank 1: RuntimeError: staging "
            f"copy failed (injected)); the partial directory was removed and earlier checkpoints are "
            f"unchanged: free space or fix permissions under {step_4.parent}"
        ), err[-3000:]
