"""`gptrain ...` under test hooks, for multi-rank reliability tests.

python rank_hooks.py fail RANK ITERATION gptrain-args...   that rank raises a rank-local error
                                                            (as a CUDA OOM would) after ITERATION
python rank_hooks.py kill RANK ITERATION gptrain-args...   that rank SIGKILLs itself after ITERATION
                                                            (as the out-of-memory killer would)
python rank_hooks.py kill-in-save RANK ITERATION gptrain-args...   that rank SIGKILLs itself as it
                                                            starts saving the checkpoint of ITERATION
python rank_hooks.py report-index-builds gptrain-args...   each rank prints when it builds
                                                            dataset indices itself
python rank_hooks.py signal-in-save RANK ITERATION gptrain-args...   that rank gets SIGUSR1 while it
                                                            saves the checkpoint of ITERATION
python rank_hooks.py signal-in-test RANK gptrain-args...   that rank gets SIGUSR1 while its first
                                                            micro-batch of the test split is evaluated
python rank_hooks.py stop-in-train-load RANK ITERATION gptrain-args...   that rank's training loader
                                                            never gives the batch of ITERATION
python rank_hooks.py stop-in-validation RANK gptrain-args...   that rank's validation loader never
                                                            gives its first micro-batch (a hung data mount);
                                                            RANK -1: every rank's (a dead shared mount)
python rank_hooks.py signal-in-startup RANK gptrain-args...   that rank gets SIGTERM while it loads
                                                            the checkpoint (start-up, before step 1)
python rank_hooks.py nan-from RANK ITERATION gptrain-args...   that rank's training loss is NaN from
                                                            ITERATION on (one micro-batch a step)
python rank_hooks.py stop-in-save RANK ITERATION gptrain-args...   that rank's write of the checkpoint
                                                            of ITERATION never returns (a dead file system)
python rank_hooks.py stop-in-save-mkdir RANK ITERATION gptrain-args...   that rank's creation of the
                                                            checkpoint directory of ITERATION never returns
                                                            (a stalled mount), before any write
python rank_hooks.py disk-full-in-save RANK ITERATION gptrain-args...   that rank's write of the
                                                            checkpoint of ITERATION fails (ENOSPC)
python rank_hooks.py staging-fails-in-save RANK ITERATION gptrain-args...   that rank's staging copy
                                                            of the checkpoint of ITERATION fails
python rank_hooks.py complete-full ITERATION gptrain-args...   rank 0 cannot write the COMPLETE
                                                            marker of the checkpoint of ITERATION (ENOSPC)
python rank_hooks.py complete-hangs ITERATION gptrain-args...   rank 0's write of the COMPLETE marker
                                                            of the checkpoint of ITERATION never returns
python rank_hooks.py complete-full-awaited ITERATION gptrain-args...   as complete-full, and rank 0
                                                            ends the next step once that marking has failed;
                                                            each rank prints "recorded iteration N" as it ends step N
python rank_hooks.py signal-before-start RANK gptrain-args...   that rank gets SIGUSR1 while it loads
                                                            its config (before train() installs its handlers)
python rank_hooks.py runs JSON   several of the above in turn in this one process (a torch start-up per
                                 run costs seconds): JSON is a list of {"hook": [hook, its args],
                                 "argv": gptrain-args, "port": PORT, "out": DIR} and optionally
                                 "snapshot": RUN_DIR to copy to DIR/snapshot; see `run_in_turn`
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from torch.distributed.checkpoint.staging import DefaultStager

import gptrain.config
from gptrain.checkpoint import checksum_writer, manager
from gptrain.cli import main
from gptrain.data import gpt_dataset
from gptrain.train import builders, eval_splits, evaluation, resuming, saving, step_loop
from gptrain.train.results import TB_TEST_LOSS


def fail_after(failing_rank: int, failing_iteration: int) -> None:
    record = step_loop.record

    def record_then_fail(s, result, samples=None):
        record(s, result, samples)
        if s.world.rank == failing_rank and s.state.step == failing_iteration:
            raise RuntimeError(f"rank-local failure injected on rank {failing_rank}")

    step_loop.record = record_then_fail


def kill_after(killed_rank: int, iteration: int) -> None:
    record = step_loop.record

    def record_then_die(s, result, samples=None):
        record(s, result, samples)
        if s.world.rank == killed_rank and s.state.step == iteration:
            s.watchdog.publish()  # its heartbeat, as a run minutes old always has one in the store
            os.kill(os.getpid(), signal.SIGKILL)

    step_loop.record = record_then_die


def kill_in_save(killed_rank: int, iteration: int) -> None:
    save = saving.save_checkpoint

    def dying_while_saving(s, *args, **kwargs):
        if s.world.rank == killed_rank and s.state.step == iteration:
            s.watchdog.publish()
            os.kill(os.getpid(), signal.SIGKILL)
        return save(s, *args, **kwargs)

    saving.save_checkpoint = dying_while_saving


def report_index_builds() -> None:
    build = gpt_dataset.build_gpt_indices

    def reporting(*args, **kwargs):
        print(f"rank {os.environ['RANK']} builds dataset indices", flush=True)
        time.sleep(1.0)  # as a large build takes a while: without a rank order, every rank misses the cache
        return build(*args, **kwargs)

    gpt_dataset.build_gpt_indices = reporting


def signal_in_save(signalled_rank: int, iteration: int) -> None:
    save = saving.save_checkpoint

    def signalled_while_saving(s, *args, **kwargs):
        if s.world.rank == signalled_rank and s.state.step == iteration:
            os.kill(os.getpid(), signal.SIGUSR1)
        return save(s, *args, **kwargs)

    saving.save_checkpoint = signalled_while_saving


def signal_in_test(signalled_rank: int) -> None:
    evaluate_split, to_device = eval_splits.evaluate_split, evaluation.to_device
    testing = {"now": False, "signalled": False}

    def noting_the_test_split(s, data, batches, where, tag, *stop_check):
        testing["now"] = tag == TB_TEST_LOSS and s.world.rank == signalled_rank
        return evaluate_split(s, data, batches, where, tag, *stop_check)

    def signalled_while_testing(batch, device):
        if testing["now"] and not testing["signalled"]:
            testing["signalled"] = True
            os.kill(os.getpid(), signal.SIGUSR1)
        return to_device(batch, device)

    eval_splits.evaluate_split = noting_the_test_split
    evaluation.to_device = signalled_while_testing


def stop_in_validation(stopped_rank: int) -> None:
    evaluate_split, build_loader = eval_splits.evaluate_split, evaluation.build_loader
    validating = {"now": False}

    def noting_the_validation(s, data, batches, where, tag, *stop_check):
        validating["now"] = tag != TB_TEST_LOSS and stopped_rank in (s.world.rank, -1)
        return evaluate_split(s, data, batches, where, tag, *stop_check)

    def never_delivering(*args, **kwargs):
        loader = build_loader(*args, **kwargs)
        if not validating["now"]:
            return loader
        print(f"rank {stopped_rank}: its validation data never comes", file=sys.stderr, flush=True)  # -1: all
        return iter(lambda: time.sleep(3600), object())  # a read that never returns

    eval_splits.evaluate_split = noting_the_validation
    evaluation.build_loader = never_delivering


def stop_in_train_load(stopped_rank: int, iteration: int) -> None:
    microbatches = step_loop.microbatches

    def never_delivering(s, data):
        for drawn, batch in enumerate(microbatches(s, data), start=s.state.step + 1):
            if s.world.rank == stopped_rank and drawn == iteration:
                print(
                    f"rank {stopped_rank}: its batch of iteration {iteration} never comes",
                    file=sys.stderr,
                    flush=True,
                )
                while True:
                    time.sleep(3600)
            yield batch

    step_loop.microbatches = never_delivering


def signal_in_startup(signalled_rank: int) -> None:
    resume = resuming.resume

    def signalled_while_loading(s, *args, **kwargs):
        if s.world.rank == signalled_rank:
            os.kill(os.getpid(), signal.SIGTERM)
        return resume(s, *args, **kwargs)

    resuming.resume = signalled_while_loading


def signal_before_start(signalled_rank: int) -> None:
    import gptrain.config

    load = gptrain.config.load_training_config

    def signalled_while_loading(*args, **kwargs):  # as Slurm's warning signal during the imports
        if int(os.environ.get("RANK", "0")) == signalled_rank:
            os.kill(os.getpid(), signal.SIGUSR1)
        return load(*args, **kwargs)

    gptrain.config.load_training_config = signalled_while_loading


def nan_from(nan_rank: int, iteration: int) -> None:
    import dataclasses

    import torch

    options = builders.build_step_options
    steps: list[int] = []

    def with_nan_loss(cfg, dp_size):
        opts = options(cfg, dp_size)
        loss_fn = opts.loss_fn

        def nan_loss(model, batch):
            loss = loss_fn(model, batch)
            if not torch.is_grad_enabled():  # validation
                return loss
            steps.append(1)
            return loss * float("nan") if len(steps) >= iteration else loss

        rank = int(os.environ.get("RANK", "0"))
        return dataclasses.replace(opts, loss_fn=nan_loss) if rank == nan_rank else opts

    builders.build_step_options = with_nan_loss


def disk_full_in_save(full_rank: int, iteration: int) -> None:
    from gptrain.checkpoint.directory import step_dir_name

    writer = checksum_writer.ChecksummingWriter
    write_data = writer.write_data

    def failing_write(self, plan, planner):
        if int(os.environ["RANK"]) == full_rank and str(self.path).endswith(step_dir_name(iteration)):
            raise OSError(28, "No space left on device (injected)")
        return write_data(self, plan, planner)

    writer.write_data = failing_write


def stop_in_save(stopped_rank: int, iteration: int) -> None:
    """The rank's first shard file of the step never opens: inside the writer's write_data."""
    from gptrain.checkpoint.directory import step_dir_name

    open_shard_file = checksum_writer.open_shard_file

    def never_returning_open(path, direct):
        if int(os.environ["RANK"]) == stopped_rank and Path(path).parent.name == step_dir_name(iteration):
            print(f"rank {stopped_rank}: its checkpoint write never returns", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        return open_shard_file(path, direct=direct)

    checksum_writer.open_shard_file = never_returning_open


def stop_in_save_mkdir(stopped_rank: int, iteration: int) -> None:
    from gptrain.checkpoint.directory import step_dir_name

    mkdir = Path.mkdir

    def never_returning_mkdir(self, *args, **kwargs):
        if int(os.environ["RANK"]) == stopped_rank and self.name == step_dir_name(iteration):
            print(f"rank {stopped_rank}: its mkdir of the step never returns", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        return mkdir(self, *args, **kwargs)

    Path.mkdir = never_returning_mkdir


def staging_fails_in_save(failing_rank: int, iteration: int) -> None:
    """The copy of the state an async save stages (DefaultStager's, on CPU) fails on that rank alone."""
    save, stage = saving.save_checkpoint, DefaultStager._stage
    saving_now = {"failing": False}

    def noting_the_save(s, *args, **kwargs):
        saving_now["failing"] = s.world.rank == failing_rank and s.state.step == iteration
        return save(s, *args, **kwargs)

    def failing_copy(self, state_dict, **kwargs):
        if saving_now["failing"]:
            time.sleep(1.0)  # half way through a copy: the next optimizer step waits for it
            raise RuntimeError("staging copy failed (injected)")
        return stage(self, state_dict, **kwargs)

    saving.save_checkpoint = noting_the_save
    DefaultStager._stage = failing_copy


def complete_full(iteration: int) -> None:
    from gptrain.checkpoint.directory import step_dir_name

    write_text = manager.atomic_write_text

    def failing_write(path, text):
        if path.name == "COMPLETE" and path.parent.name == step_dir_name(iteration):
            raise OSError(28, "No space left on device (injected)")
        return write_text(path, text)

    manager.atomic_write_text = failing_write


def complete_hangs(iteration: int) -> None:
    """Rank 0's write of the COMPLETE marker of the checkpoint of ITERATION never returns (a stalled mount)."""
    from gptrain.checkpoint.directory import step_dir_name

    write_text = manager.atomic_write_text

    def never_returning_write(path, text):
        if path.name == "COMPLETE" and path.parent.name == step_dir_name(iteration):
            print(f"rank 0: its COMPLETE of iteration {iteration} never returns", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        return write_text(path, text)

    manager.atomic_write_text = never_returning_write


def complete_full_awaited(iteration: int) -> None:
    """complete_full; rank 0 ends step ITERATION + 1 once its marking of that checkpoint has failed (its
    future is done), so that its poll finds the failure there, however loaded the machine: the stop
    flag, not the next save, stops the ranks. Each rank prints "recorded iteration N" as it ends step N."""
    from concurrent.futures import wait

    complete_full(iteration)
    marking, marked_when_written = {}, manager.marked_when_written

    def kept(upload, mark, report, *args):
        marking[report.step] = marked_when_written(upload, mark, report, *args)
        return marking[report.step]

    record = step_loop.record

    def record_then_await(s, result, samples=None):
        record(s, result, samples)
        print(f"recorded iteration {s.state.step}", flush=True)
        if s.world.rank == 0 and s.state.step == iteration + 1:
            wait([marking[iteration]])

    manager.marked_when_written = kept
    step_loop.record = record_then_await


HOOKS = {  # name: (install, how many integer arguments it takes)
    "fail": (fail_after, 2),
    "kill": (kill_after, 2),
    "kill-in-save": (kill_in_save, 2),
    "signal-in-save": (signal_in_save, 2),
    "signal-in-test": (signal_in_test, 1),
    "nan-from": (nan_from, 2),
    "disk-full-in-save": (disk_full_in_save, 2),
    "stop-in-save": (stop_in_save, 2),
    "stop-in-save-mkdir": (stop_in_save_mkdir, 2),
    "staging-fails-in-save": (staging_fails_in_save, 2),
    "complete-full": (complete_full, 1),
    "complete-hangs": (complete_hangs, 1),
    "complete-full-awaited": (complete_full_awaited, 1),
    "signal-before-start": (signal_before_start, 1),
    "signal-in-startup": (signal_in_startup, 1),
    "stop-in-validation": (stop_in_validation, 1),
    "stop-in-train-load": (stop_in_train_load, 2),
    "report-index-builds": (report_index_builds, 0),
    "none": (lambda: None, 0),
}
# Every function a hook replaces, put back after each run of `run_in_turn`.
PATCHED = [
    (step_loop, "record"),
    (step_loop, "microbatches"),
    (saving, "save_checkpoint"),
    (gpt_dataset, "build_gpt_indices"),
    (eval_splits, "evaluate_split"),
    (evaluation, "to_device"),
    (evaluation, "build_loader"),
    (resuming, "resume"),
    (gptrain.config, "load_training_config"),
    (builders, "build_step_options"),
    (DefaultStager, "_stage"),
    (checksum_writer.ChecksummingWriter, "write_data"),
    (checksum_writer, "open_shard_file"),
    (Path, "mkdir"),
    (manager, "atomic_write_text"),
    (manager, "marked_when_written"),
]


def install(hook: str, args: list[str]) -> list[str]:
    """Install `hook` with its leading integer arguments; the rest of `args` (gptrain's)."""
    function, count = HOOKS[hook]
    function(*map(int, args[:count]))
    return args[count:]


@contextlib.contextmanager
def output_into(out: Path, rank: str):
    """This process's stdout and stderr (file descriptors too) into out/rank_R.{out,err}."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out / f"rank_{rank}.out", "w") as stdout, open(out / f"rank_{rank}.err", "w") as stderr:
        os.dup2(stdout.fileno(), 1), os.dup2(stderr.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def wait_for_every_rank(out: Path, world: int, suffix: str = "code", timeout_s: float = 120) -> None:
    """Each rank has written out/rank_R.SUFFIX: with "code", its run has ended (as separate launches
    would wait for every process to exit)."""
    deadline = time.monotonic() + timeout_s
    while any(not (out / f"rank_{r}.{suffix}").exists() for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank ended its run in {out}")
        time.sleep(0.05)


def run_in_turn(runs: list[dict]) -> None:
    """Each run as a fresh rank process would run it: the stop signals at their default, the hook
    installed and removed after, its own port and output files, its exit code in out/rank_R.code."""
    rank, world = os.environ["RANK"], int(os.environ["WORLD_SIZE"])
    originals = [(owner, name, getattr(owner, name)) for owner, name in PATCHED]
    for run in runs:
        out = Path(run["out"])
        out.mkdir(parents=True, exist_ok=True)
        os.environ["MASTER_PORT"] = str(run["port"])
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        with output_into(out, rank):
            try:
                code = main(install(run["hook"][0], [*run["hook"][1:], *run["argv"]]))
            except BaseException:  # as the interpreter would print it, and exit 1
                traceback.print_exc()
                code = 1
            finally:
                for owner, name, function in originals:
                    setattr(owner, name, function)
        (out / f"rank_{rank}.code").write_text(f"{code}\n")
        wait_for_every_rank(out, world)
        if "snapshot" in run:  # the run directory as this run left it, before a later run resumes it
            if rank == "0":
                shutil.copytree(run["snapshot"], out / "snapshot")
            (out / f"rank_{rank}.snapshot").touch()
            wait_for_every_rank(out, world, "snapshot")


if __name__ == "__main__":
    if sys.argv[1] == "runs":
        run_in_turn(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main(install(sys.argv[1], sys.argv[2:])))
