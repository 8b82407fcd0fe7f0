"""The shard files a torch.distributed.checkpoint `.metadata` names, and how long each must be, read
without torch and without running anything the pickle names.

A checkpoint saved to a node-local root before saves were refused there has a manifest of rank 0's
node's files only; its `.metadata` still names every rank's shard, which is how `verify` finds the
ones that never reached this directory. Every class the pickle names is read as a stand-in that
holds what it was built from: nothing is imported, no function the pickle names is called.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

METADATA = ".metadata"


class _StandIn:
    """Any object of the pickle: keeps its arguments and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:  # a dict subclass's items
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: Any) -> None:  # a list subclass's items
        self.__dict__.setdefault("values", []).append(value)

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)


class _StandInUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type:
        return type(name, (_StandIn,), {})  # called (a class, a function) or taken as a value: inert


MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def _check_bounded(data: bytes) -> None:
    """Refuse (ValueError) a pickle whose unpickling would take memory the file does not account
    for: the unpickler sizes its memo by the index a PUT names (4 bytes of LONG_BINPUT 0x4000000
    took 1 GB), and a read by the length an opcode or a FRAME states (a flipped bit: 22 GB). The
    pickler numbers its memo in order, so an index past the entries stored so far is not a
    pickler's; genops refuses a length past the end of `data`, this a FRAME's."""
    stored = 0
    for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
        if opcode.name in MEMO_PUTS:
            if type(arg) is not int or not 0 <= arg <= stored:
                raise ValueError(f"memo index {arg} after {stored} entries")
            stored = max(stored, arg + 1)
        elif opcode.name == "MEMOIZE":
            stored += 1
        elif opcode.name == "FRAME" and arg > len(data):
            raise ValueError(f"a frame of {arg} bytes in {len(data)}")


def _fields(obj: object) -> dict:
    """A stand-in's dataclass fields: its state as a dict, or a slotted class's (dict, slots) pair."""
    state = getattr(obj, "state", None)
    if isinstance(state, dict):
        return state
    if isinstance(state, tuple) and len(state) == 2:
        return {**(state[0] or {}), **(state[1] or {})}
    return {}


def shard_extents(path: Path) -> dict[str, int] | None:
    """{shard file name: the bytes its items need (the largest offset + length)}, from the
    `.metadata` at `path`; None where it is not a metadata this reads (another format, torn, or
    ill formed: a state of another shape, a name no file of the step directory can have), so
    nothing more is checked."""
    data = path.read_bytes()  # OSError: the disk's or the reader's, as every read of `verify`
    try:
        _check_bounded(data)
        metadata = _StandInUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 (any malformed pickle: not understood, never a traceback)
        return None
    try:
        return _extents(metadata)
    except Exception:  # noqa: BLE001 (states of shapes DCP never writes: not understood, as above)
        return None


def _extents(metadata: object) -> dict[str, int] | None:
    storage = _fields(metadata).get("storage_data")
    if not isinstance(storage, dict):
        return None
    extents: dict[str, int] = {}
    for info in storage.values():
        fields = _fields(info)
        name, offset, length = fields.get("relative_path"), fields.get("offset"), fields.get("length")
        if not _plain_name(name) or type(offset) is not int or type(length) is not int:
            return None
        extents[name] = max(extents.get(name, 0), offset + length)
    return extents


NAME_MAX = 255
"""The longest file name, in bytes, of Linux's file systems (ext4, xfs, Lustre, GPFS)."""


def _plain_name(name: object) -> bool:
    """A file of the step directory itself (DCP's `__<rank>_<n>.distcp`), never a path out of it, nor
    a name no file can have (a NUL byte, longer than NAME_MAX bytes), which stat refuses."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(char in name for char in "/\\\0")
        and len(os.fsencode(name)) <= NAME_MAX
    )
