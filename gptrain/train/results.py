"""The results directory, laid out as the NeMo launcher lays it out.

Everything of a run goes into `exp_manager.explicit_log_dir`:
hparams.yaml, cmd-args.log, git-info.log, nemo_log_globalrank-<r>_localrank-<l>.txt
(one per rank), events.out.tfevents.* (in exp_manager.tensorboard_dir where set, as Megatron's
--tensorboard-dir) and checkpoints/; gptrain adds test_split_done.txt, the
iteration whose test split was evaluated (a run stopped after its last save and before its test
split evaluates it when resumed).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gptrain.errors import os_error_text
from gptrain.utils.atomic import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from gptrain.config import TrainingConfig

# TensorBoard tags written by the training loop (the plot command reads these).
TB_LM_LOSS = "lm loss"
TB_VAL_LOSS = "val loss"
TB_TEST_LOSS = "test loss"
TB_LEARNING_RATE = "learning rate"
TB_GRAD_NORM = "grad norm"
TB_LOSS_SCALE = "loss scale"
TB_STEP_TIME = "train_step_timing in s"
TB_CONSUMED_SAMPLES = "consumed samples"
TB_TOKENS_PER_SECOND = "tokens per second"
TB_TFLOPS = "TFLOP/s/GPU"


def log_file_name(global_rank: int, local_rank: int) -> str:
    return f"nemo_log_globalrank-{global_rank}_localrank-{local_rank}.txt"


def git_info(directory: Path) -> str:
    """The commit (and whether the tree is dirty) of `directory`, or 'not a git checkout'."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return "not a git checkout\n"
        status = subprocess.run(
            ["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "not a git checkout\n"
    changed = len(status.stdout.splitlines())
    return f"commit hash: {commit.stdout.strip()}\nmodified tracked files: {changed}\n"


def started_layout_note(cfg: TrainingConfig, started: tuple[int, ...] | None) -> str | None:
    """trainer.num_nodes x trainer.devices that disagrees with the number of processes torchrun/srun
    started (`started`: the count on each node; Lightning refuses it): the run trains on those
    started, its records take their layout (`run_record`), and this note says so. Not refused:
    README's torchrun example runs 8 processes on a preset of 8 x 8."""
    trainer = cfg.trainer
    configured = trainer.num_nodes * trainer.devices
    if started is None or sum(started) == configured:
        return None
    world, nodes = sum(started), len(started)
    recorded_nodes, recorded_devices = recorded_layout(started)
    if len(set(started)) == 1:
        layout = f"{nodes} node{'s' if nodes > 1 else ''} x {started[0]}"
        recorded = ""
    else:  # no nodes x devices holds it: the world stays true in the record
        layout = f"{nodes} nodes: {' + '.join(str(count) for count in started)}"
        recorded = " (an uneven layout, as one node of them all)"
    return (
        f"note: trainer.num_nodes x trainer.devices = {trainer.num_nodes} x {trainer.devices} ="
        f" {configured}, but {world} {'processes were' if world > 1 else 'process was'}"
        f" started ({layout}): training runs on those, and hparams.yaml records"
        f" trainer.num_nodes={recorded_nodes} trainer.devices={recorded_devices}{recorded}"
    )


def recorded_layout(started: tuple[int, ...]) -> tuple[int, int]:
    """(trainer.num_nodes, trainer.devices) that the records give processes started as `started`:
    nodes x their count where every node runs as many, else one node of them all."""
    if len(set(started)) == 1:
        return len(started), started[0]
    return 1, sum(started)


def run_record(cfg: TrainingConfig, started: tuple[int, ...] | None) -> dict[str, Any]:
    """The config as the run's records keep it (hparams.yaml, W&B's config): with the layout that was
    started where its number of processes differs from the configured one. trainer.devices itself
    stays as configured for the run (hybrid_shard sizes its groups from it)."""
    record = cfg.to_dict()
    if started is not None and started_layout_note(cfg, started):
        record["trainer"]["num_nodes"], record["trainer"]["devices"] = recorded_layout(started)
    return record


def write_run_files(
    log_dir: Path, resolved_yaml: str, argv: list[str] | None = None, checkpoints: Path | None = None
) -> None:
    """hparams.yaml, cmd-args.log, git-info.log (rank 0 only; atomic). hparams.yaml goes into the
    `checkpoints` directory too where checkpoint_callback_params.dirpath puts it outside `log_dir`:
    eval, export and generate given one of its checkpoints rebuild the model from it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(log_dir / "hparams.yaml", resolved_yaml)
    if checkpoints is not None and checkpoints.is_dir() and checkpoints.resolve().parent != log_dir.resolve():
        atomic_write_text(checkpoints / "hparams.yaml", copy_naming_the_run(resolved_yaml, log_dir))
    command = shlex.join(sys.argv if argv is None else argv) + "\n"  # a non-UTF-8 path: its own bytes
    atomic_write_bytes(log_dir / "cmd-args.log", command.encode("utf-8", "surrogateescape"))
    atomic_write_text(log_dir / "git-info.log", git_info(Path.cwd()))


def copy_naming_the_run(resolved_yaml: str, log_dir: Path) -> str:
    """hparams.yaml as copied into dirpath, with explicit_log_dir absolute (from this working directory,
    as training took it): the tools given the copy find the run directory, whose own hparams.yaml tells
    the directory the run's relative paths are relative to, from any working directory."""
    import yaml

    from gptrain.config.yamlio import dump_config

    config = yaml.safe_load(resolved_yaml)
    config["exp_manager"]["explicit_log_dir"] = str(log_dir.absolute())
    return dump_config(config)


TEST_DONE = "test_split_done.txt"


def record_test_done(log_dir: Path, iteration: int) -> None:
    """Record that the test split was evaluated at `iteration` (atomic; rank 0). A file the file
    system refuses is said in one line: the run is done, a resume only evaluates the split again."""
    path = log_dir / TEST_DONE
    try:
        atomic_write_text(path, f"{iteration}\n")
    except OSError as error:
        warn_unwritable(path, error, "a resume at trainer.max_steps evaluates the test split again")


def forget_test_done(log_dir: Path) -> None:
    """A run about to train makes the record stale: the checkpoint it names may be replaced (a
    rewind, a fresh start in an old directory), and its step may be reached again by other weights
    whose test split a stop before it would then skip for good. Rank 0, before the first step."""
    path = log_dir / TEST_DONE
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        warn_unwritable(path, error, "a resume at trainer.max_steps may skip the test split")


def tested_at(log_dir: Path) -> int | None:
    """The iteration `record_test_done` recorded (None: none, or unreadable)."""
    try:
        return int((log_dir / TEST_DONE).read_text().strip())
    except (OSError, ValueError):
        return None


class RunLog:
    """This rank's log file; the logging rank also echoes to stdout.

    A write the file system refuses (a full disk, a failed mount) is said once on stderr and the
    file is given up; the run goes on (its next checkpoint save stops it in one line if the disk is full).
    """

    def __init__(self, log_dir: Path, global_rank: int, local_rank: int, echo: bool) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / log_file_name(global_rank, local_rank)
        self.echo = echo
        self._file: IO[str] | None = open(self.path, "a", buffering=1)  # noqa: SIM115 (closed in close())

    def __call__(self, line: str) -> None:
        self.to_file(line)
        if self.echo:
            print(line, flush=True)

    def to_file(self, line: str) -> None:
        """The line into this rank's log file only (a line already on the console)."""
        if self._file is None:
            return
        try:
            self._file.write(line + "\n")
        except OSError as error:
            self._give_up(error)

    def _give_up(self, error: OSError) -> None:
        file, self._file = self._file, None
        warn_unwritable(self.path, error, "the rest of this rank's log goes to the console only")
        with contextlib.suppress(OSError):
            file.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as error:
                self._give_up(error)
            self._file = None


def warn_unwritable(path: Path | str, error: OSError, consequence: str) -> None:
    """One stderr line for a results file the file system refuses (Slurm's .out keeps it)."""
    print(
        f"gptrain: WARNING: cannot write {os_error_text(error, path)}: {consequence}",
        file=sys.stderr,
        flush=True,
    )


def quiet_tensorboard_writer_threads() -> None:
    """TensorBoard writes events from a thread of its own, which dies of a refused write (a full disk)
    and re-raises it, so Python printed its traceback into the job's log; the next `Scalars` call gets
    the same error and says it in one line. Installed once per process; every other thread's
    exception still goes to the hook that was there."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread_module = type(args.thread).__module__ if args.thread is not None else ""
        if not (thread_module.startswith("tensorboard.") and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def add_scalar(writer: Any, tag: str, value: float, step: int) -> None:
    """A float as TensorBoard's usual float32; an int as a float64 tensor (new-style scalar), exact
    up to 2**53: float32 holds integers exactly only up to 2**24, which consumed samples pass within
    hours (16.8M samples), after which the curve showed rounded counts."""
    if isinstance(value, int) and not isinstance(value, bool):
        writer.add_scalar(tag, value, step, new_style=True, double_precision=True)
    else:
        writer.add_scalar(tag, value, step)


class Scalars:
    """TensorBoard scalars on the logging rank (and the same series to W&B when given a run);
    a no-op elsewhere or when disabled."""

    def __init__(self, log_dir: Path, enabled: bool) -> None:
        self._writer: Any = None
        self._wandb: Any = None  # a gptrain.train.wandb_logger.WandbRun
        self._open: Callable[[], Any] | None = None
        self._log_dir = log_dir
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            quiet_tensorboard_writer_threads()
            # at the first value: a run that fails before it has one leaves no events file without events
            self._open = lambda: SummaryWriter(log_dir=str(log_dir))

    def send_to_wandb(self, run: Any) -> None:
        """From now on, every value also goes to this W&B run (closed with the writer)."""
        self._wandb = run

    def add(self, values: dict[str, float | None], step: int) -> None:
        """Values at iteration `step`; an int (a count: consumed samples, the step) is kept exact."""
        if self._wandb is not None:
            self._wandb.log(values, step)
        self._add_scalars(values, step)

    def add_vs_samples(self, values: dict[str, float | None], samples: int, step: int) -> None:
        """Series whose x axis is consumed samples (Megatron's `... vs samples`) at iteration `step`."""
        if self._wandb is not None:
            self._wandb.log_vs_samples(values, samples, step)
        self._add_scalars(values, samples)

    def _add_scalars(self, values: dict[str, float | None], x: int) -> None:
        given = {t: v for t, v in values.items() if v is not None}
        if given:  # no values, no events file (the writer opens the file at its first event)
            self._write(lambda writer: [add_scalar(writer, t, v, x) for t, v in given.items()])

    def text(self, tag: str, text: str, step: int) -> None:
        """A warning people should see next to the curves (e.g. a damaged checkpoint skipped)."""
        self._write(lambda writer: writer.add_text(tag, text, step))

    def _write(self, action: Callable[[Any], object]) -> None:
        """An event written, or, where the file system refuses it (its writer thread failed on a
        full disk), TensorBoard given up for the rest of the run, said once: the run goes on."""
        if self._writer is None and self._open is not None:
            opener, self._open = self._open, None
            try:
                self._writer = opener()
            except OSError as error:
                warn_unwritable(self._log_dir, error, "no TensorBoard events in this run")
        if self._writer is None:
            return
        try:
            action(self._writer)
        except OSError as error:
            writer, self._writer = self._writer, None
            warn_unwritable(writer.get_logdir(), error, "no more TensorBoard events in this run")
            with contextlib.suppress(OSError):
                writer.close()

    def close(self) -> None:
        self._open = None  # nothing written: no file
        self._write(lambda writer: writer.flush())
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()
            self._writer = None
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None
