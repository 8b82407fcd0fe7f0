"""Progress lines for long work: count, rate and ETA on stderr, throttled."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_rate(per_second: float) -> str:
    """A rate in whole units from 10 up, else in two significant digits: a corpus of huge documents
    tokenizes at 0.06 docs/s, which `,.0f` printed as '0 docs/s'."""
    return f"{per_second:,.0f}" if per_second >= 10 else f"{per_second:.2g}"


def counted(number: int, noun: str) -> str:
    """`1 dataset`, `2 datasets`: a run over one file or one document is an ordinary case."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """Reports `done` units (and optionally bytes) with rates and an ETA.

    The ETA uses `total_bytes` when known (input file sizes), else `total`.
    Lines are printed at most every `interval` seconds so reporting stays cheap.
    """

    def __init__(
        self,
        label: str,
        unit: str = "items",
        total: float | None = None,
        total_bytes: float | None = None,
        interval: float = 2.0,
        stream: TextIO | None = None,
    ) -> None:
        self.label, self.unit = label, unit
        self.total, self.total_bytes = total, total_bytes
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self._last_print = self.start
        self.done = 0.0
        self.bytes = 0.0

    def update(self, done: float = 0, nbytes: float = 0) -> None:
        self.done += done
        self.bytes += nbytes
        now = time.perf_counter()
        if now - self._last_print >= self.interval:
            self._last_print = now
            print(self.line(now), file=self.stream, flush=True)

    def fraction(self) -> float | None:
        if self.total_bytes:
            return min(1.0, self.bytes / self.total_bytes)
        if self.total:
            return min(1.0, self.done / self.total)
        return None

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.perf_counter()) - self.start)
        parts = [
            f"{self.label}: {int(self.done):,} {self.unit}",
            f"{format_rate(self.done / elapsed)} {self.unit}/s",
        ]
        if self.bytes:
            parts.append(f"{self.bytes / elapsed / 2**20:.2f} MB/s")
        fraction = self.fraction()
        if fraction:
            parts.append(f"{100 * fraction:.1f}%")
            parts.append(f"ETA {format_duration(elapsed * (1 - fraction) / fraction)}")
        return " | ".join(parts)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


MIB = float(1 << 20)


class ByteProgress(Progress):
    """`download a.bin: 3.0 of 4.0 MiB (75.0%) | 0.1 MiB/s | ETA 00:10` for work over a file's bytes
    (a download, an extraction): minutes to hours of a task's log. Every 2 s on a terminal, every 30 s
    in a log (a Slurm .out), where a line every 2 s would be thousands. `had`: bytes done before (a
    resumed download's part), counted towards the size, not the rate. `what`: the unit as printed."""

    def __init__(
        self, label: str, total: int | None, had: int = 0, what: str = "MiB", stream: TextIO | None = None
    ) -> None:
        stream = stream if stream is not None else sys.stderr
        interval = 2.0 if stream.isatty() else 30.0
        super().__init__(label, "MiB", total_bytes=total, interval=interval, stream=stream)
        self.had, self.what = had, what

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, self.elapsed if now is None else now - self.start)
        got, rate = self.had + self.bytes, self.bytes / elapsed
        if not self.total_bytes:
            return f"{self.label}: {got / MIB:,.1f} {self.what} | {format_rate(rate / MIB)} MiB/s"
        parts = [f"{self.label}: {got / MIB:,.1f} of {self.total_bytes / MIB:,.1f} {self.what}"]
        parts[0] += f" ({100 * min(1.0, got / self.total_bytes):.1f}%)"
        parts.append(f"{format_rate(rate / MIB)} MiB/s")
        if rate > 0:
            parts.append(f"ETA {format_duration(max(0.0, self.total_bytes - got) / rate)}")
        return " | ".join(parts)

    def finished(self) -> None:
        """The last line: what it did, in what time."""
        elapsed = max(1e-9, self.elapsed)
        text = f"{self.label}: done, {(self.had + self.bytes) / MIB:,.1f} {self.what} in {format_duration(elapsed)}"
        text += f" ({format_rate(self.bytes / elapsed / MIB)} MiB/s"
        text += f"; resumed at {self.had / MIB:,.1f} MiB)" if self.had else ")"
        print(text, file=self.stream, flush=True)
