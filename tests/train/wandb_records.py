"""Read back what an offline W&B run wrote: the records of its `run-<id>.wandb` file.

The file is W&B's transaction log: a 7-byte header (`:W&B`, a 2-byte magic, a version byte), then
32 KiB blocks of chunks, each with a 7-byte header (CRC-32 of type and data, length, type: 1 whole,
2 first, 3 middle, 4 last); a chunk header never straddles a block end (the rest is zero padding).
Each assembled record is one `wandb_internal_pb2.Record`, wandb's own protobuf schema. wandb 0.31
ships no Python reader of this file (its reader moved into the Go service), hence these few lines.
"""

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


@dataclass
class OfflineRun:
    """The parts of one offline run the tests look at."""

    directory: Path
    run: object = None
    history: list[dict] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)
    """Series name -> the series it is plotted against (define_metric's step_metric)."""

    def series(self, name: str) -> dict[int, float]:
        """{iteration: value} of one series (the iteration is logged as trainer/global_step)."""
        return {row["trainer/global_step"]: row[name] for row in self.history if name in row}

    def config(self) -> dict:
        return {item.key: json.loads(item.value_json) for item in self.run.config.update}


def chunks(data: bytes):
    pos = HEADER
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:
            return  # zero padding at the end of the file
        payload = data[pos + HEADER : pos + HEADER + length]
        assert zlib.crc32(bytes([kind]) + payload) == crc, f"damaged chunk at byte {pos}"
        yield kind, payload
        pos += HEADER + length


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pending = b""
    for kind, payload in chunks(data):
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_offline_run(directory: Path) -> OfflineRun:
    """`directory` is `<save_dir>/wandb/offline-run-<time>-<id>`."""
    (path,) = directory.glob("run-*.wandb")
    result = OfflineRun(directory)
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            result.run = record.run
        elif kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            result.history.append(row)
        elif kind == "metric" and record.metric.step_metric:
            result.metrics[record.metric.name or record.metric.glob_name] = record.metric.step_metric
    return result


def offline_runs(save_dir: Path) -> list[Path]:
    return sorted((save_dir / "wandb").glob("offline-run-*"))


def offline_only(monkeypatch, tmp_path: Path) -> None:
    """No network and no API key: W&B's server address points at a closed local port, W&B's
    config, cache and data directories are under tmp_path."""
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
