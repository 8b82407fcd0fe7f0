"""Which GPUs `dcgmi diag` tests: this job's own, on a node it may share with other jobs.

Without -i dcgmi diag tests every GPU of the node, and from level 2 it loads them: other jobs'
too. DCGM's GPU ids are its host engine's, which numbers every GPU of the node in NVML's order
(DcgmCacheManager::AttachGpus); a job's numbers are not those: inside a Slurm job confined by
cgroups NVML and CUDA number only its own GPUs from 0, CUDA_VISIBLE_DEVICES may hold UUIDs, and
SLURM_JOB_GPUS counts Slurm's gres. So the job's GPUs are matched to DCGM's ids by UUID, as
`dcgmi discovery -l` lists them (no torch here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

# What says the job was given some of the node's GPUs (not all of them, maybe); none set: dcgmi
# tests all, as it did.
JOB_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
DISCOVERY_TIMEOUT_S = 60.0
# `dcgmi discovery -l`: "| 0      | Name: NVIDIA H100 80GB HBM3 |", then rows with a blank id cell,
# one of them "|        | Device UUID: GPU-d6a2c177-... |".
ROW = re.compile(r"^\|\s*(\d*)\s*\|(.*)\|\s*$")
UUID = re.compile(r"Device UUID:\s*(GPU-[0-9a-fA-F-]+)")


def job_gpus_known(env: Mapping[str, str] = os.environ) -> bool:
    return any(env.get(key, "").strip() not in ("", "NoDevFiles") for key in JOB_GPU_ENV)


def discovery_ids(text: str) -> dict[str, int]:
    """DCGM's GPU id of each GPU UUID (lower-case) `dcgmi discovery -l` lists."""
    ids: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        row = ROW.match(line.strip())
        if row is None:
            continue
        current = int(row[1]) if row[1] else current
        uuid = UUID.search(row[2])
        if uuid and current is not None:
            ids[uuid[1].lower()] = current
    return ids


def dcgm_gpu_ids(
    uuids: list[str], env: Mapping[str, str] = os.environ, run: Callable[..., Any] | None = None
) -> tuple[list[int] | None, str]:
    """DCGM's ids of the job's GPUs on this node (their `GPU-` UUIDs), or None and why not: with
    no reason where they are not known or dcgmi cannot list GPUs (dcgmi diag then runs as before,
    on every GPU, and says its own error); with one where DCGM does not list them all (it must
    not then run, or it loads other jobs' GPUs)."""
    if not uuids or not job_gpus_known(env):
        return None, ""
    try:
        out = (run or subprocess.run)(
            ["dcgmi", "discovery", "-l"], capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    known = discovery_ids(out.stdout) if out.returncode == 0 else {}
    if not known:
        return None, ""
    missing = [uuid for uuid in uuids if uuid.lower() not in known]
    if missing:
        return None, (
            f"`dcgmi discovery -l` does not list this job's GPU(s) {', '.join(missing)}: not run, as without"
            " -i it would test every GPU of the node, other jobs' too; run `dcgmi diag` there by hand"
        )
    return sorted({known[uuid.lower()] for uuid in uuids}), ""


def node_dcgm_diag(level: int, uuids: list[str | None]) -> dict[str, Any]:
    """dcgmi diag on the GPUs of this node the job's ranks use (their NVML UUIDs); on all of them,
    as before, where one is unread."""
    from gptrain.validate import gpus  # torch: only on the ranks that run it

    if level <= 0 or shutil.which("dcgmi") is None:
        return gpus.dcgm_diag(level)
    ids, why = dcgm_gpu_ids([u for u in uuids if u]) if all(uuids) else (None, "")
    if why:
        return {"ran": False, "skipped": why}
    return gpus.dcgm_diag(level, gpu_ids=ids)


def dcgm_skipped_lines(records: list[dict[str, Any]]) -> list[str]:
    """A line for each node whose dcgmi diag was not run for want of its GPUs' DCGM ids."""
    return [
        f"gpus: {r['node']}: dcgmi diag {why}"
        for r in records
        if (why := (r.get("dcgm") or {}).get("skipped"))
    ]
