"""How a job's log says it ended: its batch script's last line, and the training's stop during start-up;
what `gptrain status` falls back on where Slurm no longer knows the job."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.launch.job_states import JobState, summarize
from gptrain.launch.run_dirs import log_files, stderr_logs
from gptrain.train.logline import PROCESS_START

if TYPE_CHECKING:
    from collections.abc import Iterator

# The training's line for a stop signal during start-up (gptrain.train.stopping.stop_before_training),
# and for a stop that saved a checkpoint (stop_for_requeue); both exit 75.
STOPPED_EARLY = re.compile(
    r"stopping before the first step: (?P<why>.*?); nothing trained since "
    r"(?:no checkpoint|iteration (?P<step>\d+)'s checkpoint)"
)
STOPPED_SAVED = re.compile(r"stopping at iteration \d+: ")
# The training's line for its stop at trainer.exit_interval (gptrain.train.stopping.exit_at_interval),
# which exits 0 as Megatron's --exit-interval does: not the end of the training.
EXITED_AT_INTERVAL = re.compile(
    r"exiting at iteration (?P<step>\d+): trainer\.exit_interval=\d+(?P<saved>; the same command resumes)?"
)
# A line that says the training went on after an exit line read before it (so that one was an earlier
# attempt's): a training or validation line.
TRAINED_ON = re.compile(r"\biteration\s+\d+/\s*\d+\s*\||\bvalidation loss at iteration \d+")


@dataclass
class EarlyStop:
    """A training that exited 75 for a stop signal during its start-up: it saved nothing."""

    why: str  # 'received SIGUSR1'
    step: int | None  # the checkpoint it had loaded; None: there is none, the next start is a fresh one

    def describe(self) -> str:
        if self.step is None:
            return f"{self.why} during start-up: stopped before step 1, no checkpoint exists"
        return (
            f"{self.why} during start-up: nothing trained or saved since iteration {self.step}'s checkpoint"
        )

    @property
    def then(self) -> str:
        """What a relaunch (or a requeue) does."""
        return "start it afresh" if self.step is None else f"resume from iteration {self.step}"


def early_stop(log: Path) -> EarlyStop | None:
    """The log's last stop, when it came before the first step (a requeue appends to the same log:
    an earlier attempt's stop is superseded by a later one's). Read from the end: the stop is near it."""
    try:
        for line in lines_from_the_end(log, holding=("stopping ",)):
            match = STOPPED_EARLY.search(line)
            if match:
                return EarlyStop(match["why"], int(match["step"]) if match["step"] else None)
            if STOPPED_SAVED.search(line):
                return None
    except OSError:
        return None
    return None


def early_stop_of(record: dict[str, Any] | None) -> EarlyStop | None:
    """The early stop in a training record's log, if that is how it last stopped."""
    if not record or record.get("stage") != "training":
        return None
    logs = log_files(record)
    return early_stop(logs[-1]) if logs else None


def interval_exit_of(record: dict[str, Any] | None) -> str | None:
    """What status says of a training that exited 0 at trainer.exit_interval, or None where its log's
    last training line is another (it ran to max_steps): exit 0 there is no finished run."""
    if not record or record.get("stage") != "training" or not (logs := log_files(record)):
        return None
    match = None
    try:  # read from the end: the exit line is the last training line, no iteration line after it; other
        # lines that name an iteration may follow it (on a GPU, the memory report "(after N iterations)")
        for line in lines_from_the_end(logs[-1], holding=("iteration",)):  # PROCESS_START's has it too
            match = EXITED_AT_INTERVAL.search(line)
            if match or TRAINED_ON.search(line) or PROCESS_START.match(line):
                break
    except OSError:
        return None
    if match is None:
        return None
    then = "continue from its checkpoint" if match["saved"] else "start afresh (checkpoints are off)"
    return (
        f"stopped at its exit interval at iteration {match['step']}, not finished; "
        f"launch the same command again to {then}"
    )


def log_ending_text(ended: JobState) -> str:
    """'its log's last attempt ended with exit code 75', from `ended_by_log`'s state."""
    if ended.state.startswith("ARRAY["):
        return f"its tasks' logs say their last attempts ended: {ended.state[len('ARRAY[') : -1]}"
    if ended.state == "CANCELLED":
        return "its log's last attempt was cancelled"
    return f"its log's last attempt ended with exit code {ended.exit_code.split(':')[0]}"


# Each stage's batch script's last lines (sbatch.REQUEUE_LINES, FINISH_LINES): the job's end as it saw it.
STEP_FINISHED = re.compile(r"gptrain: step finished with exit code (\d+)")
CANCEL_SEEN = "gptrain: the job was cancelled (scancel)"
FORGOTTEN = "Slurm no longer knows the job; from its log"
# The line just before the exit line of a job Slurm requeued itself (a preemption): it runs again,
# appending to the same log after that exit line.
REQUEUED_BY_SLURM = "gptrain: Slurm requeued the job itself"
# How much of a log's end `ends_with_exit_line` reads: its last two lines, whatever the log's size.
TAIL_BYTES = 8192


def ended_by_log(record: dict[str, Any]) -> JobState | None:
    """How a job ended by its batch script's last line (an array: each task's log), or None where a
    log has no such line (still running when Slurm was asked, or killed before it) or a task's log
    is missing."""
    logs = log_files(record)
    if not logs or len(logs) < int(record.get("array") or 1) or "array_unread" in record:
        return None  # array_unread: how many task logs make the whole job is not known
    states = [log_ending(log) for log in logs]
    if None in states:
        return None
    state = summarize(states)
    return state if state.reason else JobState(state.state, FORGOTTEN, state.exit_code)


def log_ending(log: Path) -> JobState | None:
    """The end one batch script's log records (its stderr file, where it has one), or None. A
    requeue appends to the same log and prints no such line: only the job's last attempt does."""
    code, cancelled = None, False
    try:
        for path in (log, *(err for err in stderr_logs(log) if err.exists())):
            code, cancelled = last_exit_line(path) or (code, cancelled)
    except OSError:
        return None
    if code is None:
        return None
    if cancelled:
        return JobState("CANCELLED", f"{FORGOTTEN}: cancelled, launch again to resume", f"{code}:0")
    return JobState("COMPLETED" if code == 0 else "FAILED", FORGOTTEN, f"{code}:0")


def last_exit_line(path: Path) -> tuple[int, bool] | None:
    """The exit code on the file's last exit line, and whether the batch script's line just before it
    says the job was cancelled; None where the file has no exit line. Read from the end."""
    code = None
    for line in lines_from_the_end(path, holding=("gptrain: ",)):
        if code is not None:  # the script's line before its exit line
            return code, CANCEL_SEEN in line
        found = STEP_FINISHED.search(line)
        if found:
            code = int(found.group(1))
    return None if code is None else (code, False)


def ended_for_good(record: dict[str, Any]) -> bool:
    """Whether the job's log (an array: every task's) ends as a job that is over ends: with its batch
    script's exit line, the last thing the job writes, not just after Slurm requeued it (a preempted
    job runs again). What `gptrain logs -f` goes by while Slurm does not answer."""
    logs = log_files(record)
    if not logs or len(logs) < int(record.get("array") or 1) or "array_unread" in record:
        return False
    return all(ends_with_exit_line(log) for log in logs)


def ends_with_exit_line(log: Path) -> bool:
    """Whether the batch script's lines (in the stderr file, where the job has one) end with its exit
    line and no requeue by Slurm before it; a requeued job's next attempt writes after it."""
    lines = last_lines(next((err for err in stderr_logs(log) if err.exists()), log), 2)
    if not lines or not STEP_FINISHED.search(lines[-1]):  # as last_exit_line: after a cut line too
        return False
    return len(lines) < 2 or REQUEUED_BY_SLURM not in lines[-2]


def last_lines(path: Path, count: int) -> list[str]:
    """The file's last `count` non-blank lines, from its last TAIL_BYTES only (a log can hold
    gigabytes, and `logs -f` asks every 0.5 s); [] for a file that cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - TAIL_BYTES))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in tail.splitlines() if line.strip()][-count:]


LINES_BLOCK = 1 << 20
LINE_BREAK = re.compile(rb"\r\n|\r|\n")  # as a text-mode file splits lines


class LineEnd:
    """The end of a line whose start lies before what has been read. Its chunks are kept apart and
    joined once: a stretch without a line break (a crashed NFS client's NULs) was copied and searched
    again for every block put before it, minutes for a few hundred MB. Whether it holds a needle is
    known from each chunk and its seam with the chunk after it."""

    def __init__(self, needles: list[bytes]):
        self.needles = needles
        self.seam = max((len(needle) for needle in needles), default=1) - 1
        self.chunks: list[bytes] = []  # last first
        self.head = b""  # the first `seam` bytes, where a needle may begin in the chunk before
        self.holding = not needles

    def put_before(self, chunk: bytes) -> None:
        if not self.holding:
            across = chunk[max(0, len(chunk) - self.seam) :] + self.head if self.seam else b""
            self.holding = any(needle in chunk or needle in across for needle in self.needles)
        self.chunks.append(chunk)
        self.head = (chunk[: self.seam] + self.head)[: self.seam]

    def text(self) -> str:
        return b"".join(reversed(self.chunks)).decode(errors="replace")


def first_and_last_pieces(data: bytes) -> list[bytes]:
    """What comes before the block's first line break and after its last one ([data] without one):
    in a block without a needle the lines between them are not wanted."""
    first = LINE_BREAK.search(data)
    if not first:
        return [data]
    return [data[: first.start()], data[max(data.rfind(b"\n"), data.rfind(b"\r")) + 1 :]]


def lines_from_the_end(path: Path, holding: tuple[str, ...] = (), block: int = LINES_BLOCK) -> Iterator[str]:
    """The file's lines, last first, read a block at a time from its end: a week's log with
    NCCL_DEBUG=INFO holds gigabytes, and status wants its last few lines of one kind. `holding`:
    only lines with one of these in them, and a block without any is skipped unsplit (a log that
    lacks them is read at the disk's pace). Each byte is read and searched about once, however long
    its line. OSError as open raises it."""
    needles = [text.encode() for text in holding]
    with open(path, "rb") as handle:
        position, end = handle.seek(0, 2), LineEnd(needles)
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            data = handle.read(position - start)
            position = start
            if needles and not any(needle in data for needle in needles):
                pieces = first_and_last_pieces(data)  # a needle may still cross a seam
            else:  # a \r\n cut by the block boundary is read as two breaks: one empty line more
                pieces = LINE_BREAK.split(data)
            end.put_before(pieces[-1])
            if len(pieces) == 1:
                continue
            if end.holding:
                yield end.text()
            for line in reversed(pieces[1:-1]):
                if not needles or any(needle in line for needle in needles):
                    yield line.decode(errors="replace")
            end = LineEnd(needles)  # the block before may hold the start of that line
            end.put_before(pieces[0])
        last = end.text()
        if last and end.holding:
            yield last
