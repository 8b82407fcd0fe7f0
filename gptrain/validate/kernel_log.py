"""Which part of a node's kernel log still speaks for its GPUs.

dmesg keeps every Xid since boot: a node whose GPUs were re-initialised hours ago would fail
validation until it is rebooted. Two rules leave out the lines that no longer speak for the GPUs:

- where the log shows the NVIDIA driver loaded again after boot (rmmod, modprobe), the lines before
  its last load: the reload re-initialises every GPU of the node (a reboot empties dmesg itself).
  The lines a reload does not cure stay (nvml.lines_a_reload_does_not_cure);
- with `--xid-since`, the lines older than that window: a GPU reset with `nvidia-smi -r` (NVIDIA's
  documented reset) leaves the driver loaded and logs no line of its own, so only an age tells
  an Xid from before it. A line without a timestamp is kept.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." or, for the open kernel
# modules, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  ..."
DRIVER_LOADED = re.compile(r"NVRM: loading NVIDIA UNIX")
# A GPU's Xid line, which only a loaded driver writes (an NVSwitch's SXid may precede the load line).
GPU_XID = re.compile(r"NVRM: Xid \(")
# dmesg's own "[ 5107.644336]" (seconds since boot) and dmesg -T's "[Fri Aug 30 11:43:09 2024]"
SINCE_BOOT = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")
WALL_CLOCK = re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Clock:
    """When the log was read: seconds since boot (CLOCK_MONOTONIC: the kernel's timestamps keep
    close to it, neither counts a suspend; dmesg -T converts with it) and since the epoch."""

    since_boot: float
    epoch: float

    @classmethod
    def now(cls) -> Clock:
        return cls(time.clock_gettime(time.CLOCK_MONOTONIC), time.time())


@dataclass
class Judged:
    """The lines to judge and how many Xid/SXid lines were left out, and why."""

    text: str
    span: str = "since boot"  # what the counts of the kept lines cover
    before_driver_load: int = 0
    kept_across_reload: int = 0  # before the reload, and judged: a reload does not cure them
    carried: list[str] = field(default_factory=list)  # those lines (after the window)
    older: int = 0
    untimed: int = 0  # kept under a window: no timestamp to tell their age
    since_s: float | None = None  # the window (--xid-since), None: since boot

    def as_dict(self) -> dict[str, float | str | None]:
        return {
            "span": self.span,
            "since_s": self.since_s,
            "before_driver_load": self.before_driver_load,
            "kept_across_reload": self.kept_across_reload,
            "older": self.older,
            "untimed": self.untimed,
        }

    @property
    def span_across_reload(self) -> str:
        """What the counts of the lines kept across the reload cover: the window, or boot."""
        return "since boot" if self.since_s is None else f"in the last {duration_text(self.since_s)}"


def parse_duration(text: str) -> float | None:
    """Seconds of `30m`, `2h`, `1d`, `900s` or `900`; None for `boot` (every line since boot).
    ValueError saying what is accepted."""
    value = text.strip().lower()
    if value == "boot":
        return None
    number, unit = (value[:-1], value[-1]) if value[-1:] in DURATION_UNITS else (value, "s")
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"must be a duration like 30m, 2h or 1d (or boot), got {text!r}")
    return seconds


def duration_text(seconds: float) -> str:
    """2h for 7200, 90m for 5400: the largest unit that divides it."""
    for unit in ("d", "h", "m"):
        if seconds % DURATION_UNITS[unit] == 0:
            return f"{seconds / DURATION_UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


def line_age_s(line: str, clock: Clock) -> float | None:
    """How long before `clock` the kernel logged `line`, or None where it carries no timestamp."""
    match = SINCE_BOOT.match(line)
    if match:
        return clock.since_boot - float(match[1])
    match = WALL_CLOCK.match(line)
    if match:  # dmesg -T prints local time
        try:
            return clock.epoch - time.mktime(time.strptime(match[1], "%a %b %d %H:%M:%S %Y"))
        except ValueError:  # no such date: judged as a line without a time
            return None
    return None


def count(lines: list[str], is_event: Callable[[str], bool]) -> int:
    return sum(1 for line in lines if is_event(line))


def reload_index(lines: list[str]) -> int:
    """The index of the driver's last load when the log shows it loaded again after boot, else 0.
    The boot's one load is no reset: nvidia.ko's init probes the NVSwitches (and logs their SXids)
    before it prints its load line. One load line after a GPU Xid is a reload whose boot load the
    ring buffer dropped on a node up for weeks: only a loaded driver logs a GPU Xid."""
    loads = [i for i, line in enumerate(lines) if DRIVER_LOADED.search(line)]
    if len(loads) > 1:
        return loads[-1]
    if loads and any(GPU_XID.search(line) for line in lines[: loads[0]]):
        return loads[0]
    return 0


def window_binds(reload_line: str, since_s: float, clock: Clock) -> bool:
    """Whether the window starts after the reload: then it, not the reload, limits what the counts
    cover (a reload inside the window left out lines the window would have kept)."""
    age = line_age_s(reload_line, clock)
    return age is not None and age > since_s


def judged_lines(
    text: str,
    is_event: Callable[[str], bool],
    since_s: float | None,
    clock: Clock,
    uncured: Callable[[list[str]], list[int]] = lambda lines: [],
) -> Judged:
    """The part of `text` to judge: after the driver's last load where it was reloaded (and the lines
    before it that `uncured` picks: a reload does not cure them) and, with `since_s`, in that window.
    The counts are of the lines `is_event` says open one (an Xid, or an SXid's first line)."""
    lines = text.splitlines()
    start = reload_index(lines)
    carried = [lines[i] for i in uncured(lines[:start])]
    judged = Judged("", before_driver_load=count(lines[:start], is_event) - count(carried, is_event))
    if start:
        judged.span = "since the NVIDIA driver was reloaded"
    kept = carried + lines[start:]
    if since_s is not None:
        judged.since_s = since_s
        aged = [(line, line_age_s(line, clock)) for line in kept]  # the carried lines first
        judged.older = count([line for line, age in aged if age is not None and age > since_s], is_event)
        judged.untimed = count([line for line, age in aged if age is None], is_event)
        kept = [line for line, age in aged if age is None or age <= since_s]
        carried = [line for line, age in aged[: len(carried)] if age is None or age <= since_s]
        if not start or window_binds(lines[start], since_s, clock):
            judged.span = f"in the last {duration_text(since_s)}"
    judged.carried, judged.kept_across_reload = carried, count(carried, is_event)
    judged.text = "\n".join(kept) + "\n"
    return judged
