"""Tensor I/O for conversion: a gptrain DCP checkpoint read key by key, safetensors written in shards.

Reading a subset of keys from DCP touches only their bytes, whatever layout (TP, PP, FSDP)
wrote the checkpoint, so export holds one layer at a time. Shards follow transformers'
convention: `model.safetensors` when one file suffices, else `model-0000i-of-0000n.safetensors`
plus `model.safetensors.index.json` with `total_size` and the `weight_map`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from gptrain.checkpoint import compat
from gptrain.errors import DataError
from gptrain.trained.load import unreadable

Tensors = dict[str, torch.Tensor]
MODEL = "model."
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class CheckpointTensors:
    """The model tensors of one DCP step directory, read a few keys at a time."""

    def __init__(self, step_dir: Path) -> None:
        self.step_dir = step_dir
        try:
            # read once: every read() hands it to DCP, which would unpickle it again per layer
            self.metadata = compat.read_metadata(step_dir)
        except (OSError, RuntimeError, ValueError) as error:
            raise DataError(f"{step_dir}: unreadable checkpoint metadata ({error})") from None
        self.meta = {
            key.removeprefix(MODEL): entry
            for key, entry in self.metadata.state_dict_metadata.items()
            if key.startswith(MODEL) and isinstance(entry, TensorStorageMetadata)
        }

    def keys(self, prefix: str = "") -> list[str]:
        return [key for key in self.meta if key.startswith(prefix)]

    def empty(self, key: str, device: str = "cpu") -> torch.Tensor:
        entry = self.meta[key]
        return torch.empty(tuple(entry.size), dtype=entry.properties.dtype, device=device)

    def read(self, keys: list[str]) -> Tensors:
        """Full (unsharded) tensors of `keys` (names without the 'model.' section)."""
        missing = [key for key in keys if key not in self.meta]
        if missing:
            raise DataError(
                f"{self.step_dir}: checkpoint lacks model.{missing[0]}; is it a gptrain checkpoint?"
            )
        state = {"model": {key: self.empty(key) for key in keys}}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed.*")
            try:
                reader = compat.MetadataReader(self.step_dir, self.metadata)
                dcp.load(state, checkpoint_id=str(self.step_dir), storage_reader=reader, no_dist=True)
            except (Exception, CheckpointException) as error:  # DCP's is a BaseException
                raise unreadable(self.step_dir, error) from None
        return state["model"]


def plan_shards(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Names grouped into shards in order; a shard closes before it would pass max_shard_bytes."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


class ShardWriter:
    """Writes tensors into planned safetensors shards as they arrive; a full shard is written and freed."""

    def __init__(self, directory: Path, shards: list[list[str]]) -> None:
        self.directory = directory
        count = len(shards)
        self.files = (
            [SINGLE]
            if count == 1
            else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
        )
        self.shard_of = {name: i for i, names in enumerate(shards) for name in names}
        self.waiting = [set(names) for names in shards]
        self.pending: list[Tensors] = [{} for _ in shards]
        self.total_size = 0

    def add(self, tensors: Tensors) -> None:
        from safetensors.torch import save_file

        for name, tensor in tensors.items():
            shard = self.shard_of[name]
            self.pending[shard][name] = tensor.contiguous()
            self.waiting[shard].discard(name)
            self.total_size += tensor.numel() * tensor.element_size()
            if not self.waiting[shard]:
                save_file(
                    self.pending[shard], str(self.directory / self.files[shard]), metadata={"format": "pt"}
                )
                self.pending[shard] = {}

    def finish(self) -> None:
        """The index (several shards only); every planned tensor must have arrived."""
        left = sorted(name for names in self.waiting for name in names)
        if left:
            raise RuntimeError(f"export wrote no tensor {left[0]} (a mapping bug)")
        if len(self.files) == 1:
            return
        weight_map = {name: self.files[shard] for name, shard in sorted(self.shard_of.items())}
        index = {"metadata": {"total_size": self.total_size}, "weight_map": weight_map}
        (self.directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")


class SafetensorsTensors:
    """The tensors of a transformers model directory (one file or an index of shards), read by name.

    Names are looked up as given and, failing that, without the `transformer.`/`model.` prefix
    (some GPT-2 checkpoints were saved from the bare model).
    """

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        self.directory = directory
        index = directory / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as error:
                raise DataError(f"{index}: not a safetensors index ({error})") from None
        elif (directory / SINGLE).is_file():
            weight_map = None
        else:
            raise DataError(f"{directory}: no {SINGLE} or {INDEX} (only safetensors weights are read)")
        files = sorted(set(weight_map.values())) if weight_map else [SINGLE]
        self.handles = {}
        for name in files:
            try:
                self.handles[name] = safe_open(str(directory / name), framework="pt")
            except Exception as error:  # safetensors raises its own error types
                raise DataError(f"{directory / name}: unreadable safetensors file ({error})") from None
        self.where = {key: name for name, handle in self.handles.items() for key in handle.keys()}  # noqa: SIM118 (not a dict)

    def has(self, name: str) -> bool:
        return self._resolve(name) is not None

    def _resolve(self, name: str) -> str | None:
        for candidate in (name, name.removeprefix("transformer."), name.removeprefix("model.")):
            if candidate in self.where:
                return candidate
        return None

    def read(self, name: str) -> torch.Tensor:
        key = self._key(name)
        return self.handles[self.where[key]].get_tensor(key)

    def stored_shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name`, unread."""
        key = self._key(name)
        return tuple(self.handles[self.where[key]].get_slice(key).get_shape())

    def stored_dtype(self, name: str) -> str:
        """The dtype tensor `name` is stored in, as safetensors names it ("BF16", "F32"), unread."""
        key = self._key(name)
        return self.handles[self.where[key]].get_slice(key).get_dtype()

    def _key(self, name: str) -> str:
        key = self._resolve(name)
        if key is None:
            raise DataError(f"{self.directory}: the weights have no tensor {name}")
        return key
