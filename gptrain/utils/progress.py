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
