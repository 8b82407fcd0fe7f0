"""Whether a checkpoint fits the state built from the config: the same tensors, the same shapes.

DCP alone is no check: it ignores saved tensors the live state lacks (a run resumed with fewer
layers silently drops the others) and reports a missing or resized one as a load failure,
which looks like damage. Comparing the checkpoint's metadata with the live state before
reading any data turns both into one config error naming the key and both values.

One difference is expected and bridged: the rows of the vocabulary tensors. The vocabulary is
padded to a multiple of make_vocab_size_divisible_by x TP (as Megatron pads it), so the padded
row count changes with TP; such a tensor is loaded as saved and its common rows copied in, and
rows it lacks take the mean of its padding rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from gptrain.errors import ConfigError

# Parameters with one row per (padded) vocabulary entry, as gptrain's model names them; their
# optimizer moments are saved flattened as optim.state.<name>.<moment> (gptrain.parallel.state_dict).
VOCABULARY_TENSORS = ("tok_embeddings.weight", "output.weight")
EMBEDDING, OUTPUT = (f"model.{name}" for name in VOCABULARY_TENSORS)
POSITION_TENSORS = ("pos_embeddings.weight",)  # rows past the saved ones keep their initial values


class CheckpointMismatchError(ConfigError):
    """A checkpoint holds other tensors (or other shapes) than the config builds: not damage."""


def read_metadata(path: Path) -> Metadata:
    """DCP's `.metadata` of a checkpoint, unpickled: read it once per load and pass it on
    (`saved_metadata`, `MetadataReader`). For a 20B model under FSDP on 1024 ranks it is ~300 MB
    and takes ~50 s to unpickle, on every rank."""
    return dcp.FileSystemReader(str(path)).read_metadata()


def saved_metadata(path: Path, metadata: Metadata | None = None) -> dict[str, Any]:
    """Flattened key ('model.layers.0.wq.weight') -> DCP storage metadata of one checkpoint (from
    `metadata` when already read)."""
    return dict((metadata or read_metadata(path)).state_dict_metadata)


class MetadataReader(dcp.FileSystemReader):
    """DCP's reader of `path`, handed the metadata already read: `dcp.load` reads and unpickles
    `.metadata` again otherwise."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(str(path))
        self.metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.metadata.storage_meta is not None:  # as FileSystemReader tags the metadata it reads
            self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


def flatten(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple]]:
    """The live state under the keys DCP saves it by, and each key's path into `state`."""
    return flatten_state_dict(state)


def fits_by_rows(key: str) -> bool:
    """True for a vocabulary tensor or the position table (or an optimizer moment of one), whose
    row count may differ: the position table has model.max_position_embeddings rows, which a run
    may raise to go on at a longer sequence (and runs before 2026-11-26 had seq_length rows)."""
    return is_vocabulary(key) or _of(key, POSITION_TENSORS)


def is_vocabulary(key: str) -> bool:
    return _of(key, VOCABULARY_TENSORS)


def _of(key: str, names: tuple[str, ...]) -> bool:
    return any(key == f"model.{name}" or key.startswith(f"optim.state.{name}.") for name in names)


def _shape(meta: Any) -> str:
    return f"shape {list(meta.size)}" if isinstance(meta, TensorStorageMetadata) else "a non-tensor value"


def _live(value: Any) -> str:
    return f"shape {list(value.shape)}" if isinstance(value, torch.Tensor) else "a non-tensor value"


def compare(saved: dict[str, Any], live: dict[str, Any]) -> tuple[str | None, dict[str, torch.Size]]:
    """(the first live key the checkpoint lacks or holds in another shape, or None;
    saved shapes of the vocabulary tensors to load by rows)."""
    rows: dict[str, torch.Size] = {}
    for key in sorted(live, key=lambda key: not key.startswith("model.")):  # weights name it best
        value, meta = live[key], saved.get(key)
        if meta is None:
            return f"the checkpoint has no {key}, the config gives {_live(value)}", rows
        tensor, stored = isinstance(value, torch.Tensor), isinstance(meta, TensorStorageMetadata)
        if tensor != stored:
            return f"{key}: the checkpoint has {_shape(meta)}, the config gives {_live(value)}", rows
        if not tensor or tuple(meta.size) == tuple(value.shape):
            continue
        if fits_by_rows(key) and tuple(meta.size)[1:] == tuple(value.shape)[1:]:
            rows[key] = torch.Size(meta.size)
            continue
        return f"{key}: the checkpoint has {_shape(meta)}, the config gives {_live(value)}", rows
    return None, rows


def tied_vocabulary(live: dict[str, Any]) -> tuple[str, str] | None:
    """The embedding and output keys when the live state holds them as one tensor (tied weights):
    a checkpoint saved untied has two tensors there, and DCP would load both into the one, the
    later silently winning; the reader loads the output apart and compares."""
    embedding, output = (f"model.{name}" for name in VOCABULARY_TENSORS)
    first, second = live.get(embedding), live.get(output)
    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
        return None
    if first.shape != second.shape or local_tensor(first).data_ptr() != local_tensor(second).data_ptr():
        return None
    return embedding, output


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def untied_problem(embedding: str, output: str) -> str:
    return (
        f"its {output} is not its {embedding} (saved untied), the config ties them "
        "(model.share_embeddings_and_output_weights=true)"
    )


def saved_tensors_in(saved: dict[str, Any], sections: set[str]) -> list[str]:
    """The saved tensors of the sections being loaded, sorted (the same list on every rank).

    Non-tensor values (counters, param-group settings) are left out: an old checkpoint may hold
    one a newer gptrain no longer has, and dropping it loses nothing of the model."""
    return sorted(
        key
        for key, meta in saved.items()
        if isinstance(meta, TensorStorageMetadata) and key.split(".", 1)[0] in sections
    )


def unloaded(key: str, meta: Any) -> str:
    return f"the checkpoint has {key} ({_shape(meta)}), the config gives no such tensor"


def mismatch_error(path: Path, problem: str) -> CheckpointMismatchError:
    return CheckpointMismatchError(
        f"checkpoint {path} does not fit the config: {problem}; load it with the model settings it "
        "was saved with (its run's hparams.yaml)"
    )


def set_at(state: dict[str, Any], path: tuple, value: Any) -> None:
    """Replace the value at a flattened key's path in the nested state."""
    node: Any = state
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def drop_at(state: dict[str, Any], path: tuple) -> None:
    """Remove the value `set_at` put at `path`."""
    node: Any = state
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


@torch.no_grad()
def copy_common_rows(live: torch.Tensor, loaded: torch.Tensor, vocab_size: int | None = None) -> None:
    """Copy loaded[:n] into the first n rows of `live` (a plain tensor or a DTensor shard).

    Rows past the loaded ones are padding that the checkpoint never had: they take the mean of
    its padding rows (loaded[vocab_size:]) when it has any, else they keep their values. A fresh
    random row would take softmax mass that the trained padding rows had given up."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = live.full_tensor() if isinstance(live, DTensor) else live.detach().clone()
    rows = min(full.shape[0], loaded.shape[0])
    full[:rows] = loaded[:rows].to(full.device, full.dtype)
    saved_padding = loaded[vocab_size:] if vocab_size is not None else loaded[:0]
    if full.shape[0] > rows and saved_padding.shape[0] > 0:
        mean = saved_padding.to(torch.float64).mean(dim=0)
        full[rows:] = mean.to(full.device, full.dtype)
    if isinstance(live, DTensor):
        local = distribute_tensor(full, live.device_mesh, live.placements, src_data_rank=None).to_local()
        live.to_local().copy_(local)
    else:
        live.copy_(full)
