"""A node whose NVLink fabric never came up: the fabric manager not running on an NVSwitch board.

NCCL users meet it as "fabric manager not running"; validate passed such a node, since a GPU
with every NVLink inactive is let pass (a PCIe card without a bridge reads so) and no GPU of the
node had links up to be judged against. Hopper and later say it in NVML's fabric state (the fabric
manager registers each GPU: not_started is a manager not running, in_progress one still registering
or with no shared-NVSwitch partition activated, completed with an error a registration that failed;
a GB200 rack's NMX and IMEX register them instead); an A100 has no fabric state, and its model name
says whether it sits on an NVSwitch board.
"""

from __future__ import annotations

import re
from typing import Any

from gptrain.validate import nvml

# HGX/DGX boards of NVSwitches: the SXM parts. "H100 80GB HBM3" is the SXM5 H100 ("H100 PCIe" and
# the bridged pair "H100 NVL" are not); \b keeps out GH200 and GB200 (NVLink-C2C, or a rack's fabric).
NVSWITCH_MODEL = re.compile(r"\b(A100-SXM4|A800-SXM4|H100|H800|H200|H20|B100|B200|B300)\b")
NOT_NVSWITCH = re.compile(r"PCIe|NVL\b", re.IGNORECASE)

START_FM = (
    "start nvidia-fabricmanager there (systemctl start nvidia-fabricmanager; on B200 and later with"
    " its NVLSM) and check its log before using the node"
)
# in_progress is also a fabric manager in shared-NVSwitch mode whose partition is not activated.
CHECK_PARTITION = (
    "the fabric manager has not finished registering them, or runs in shared-NVSwitch mode with no"
    " partition of them activated: check nvidia-fabricmanager's log there and the partition's"
    " activation (fmpm -l) before using the node"
)
# GB200/GH200 NVL racks: the compute trays run no fabric manager; the switch trays' NMX and IMEX do.
CHECK_RACK_FABRIC = (
    "its compute tray runs no fabric manager: check the rack's NVLink switch trays (NMX-Controller)"
    " and the node's IMEX service (nvidia-imex) before using the node"
)


def is_nvswitch_model(name: str | None) -> bool:
    """Whether NVML's name is a GPU built for an NVSwitch (HGX 8-GPU) board."""
    return bool(name and NVSWITCH_MODEL.search(name) and not NOT_NVSWITCH.search(name))


def fabric_down(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(node, line) for each node whose NVLink fabric is down: the line names it and what to do."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        info = r.get("nvml") or {}
        if info.get("nvlinks") or info.get("fabric"):  # NVML read them
            groups.setdefault((r["node"], info.get("name") or r.get("name") or "?"), []).append(info)
    found = [(node, fabric_problem(model, by_gpu(infos))) for (node, model), infos in sorted(groups.items())]
    return [(node, f"gpus: {node}: {problem}") for node, problem in found if problem]


def by_gpu(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per GPU: ranks on MIG slices of one GPU read its NVML record each (same UUID)."""
    unique = {info.get("uuid") or id(info): info for info in infos}
    return list(unique.values())


def no_cuda_fabric_problem() -> str | None:
    """Why CUDA finds no GPU on this node where NVML sees them on an NVSwitch board whose fabric is
    down: CUDA does not start there before the fabric manager has registered the GPUs
    (cudaErrorSystemNotReady, "system not yet initialized"). None where NVML cannot say."""
    try:
        nv = nvml.load()
        infos = [
            nvml.gpu_health(nv, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(int(nv.nvmlDeviceGetCount()))
        ]
    except Exception:  # no NVML, no GPU: the plain line says enough
        return None
    models: dict[str, list[dict[str, Any]]] = {}
    for info in infos:
        models.setdefault(info.get("name") or "?", []).append(info)
    return next((p for model, group in models.items() if (p := fabric_problem(model, group))), None)


def waiting_advice(model: str, waiting: list[str]) -> str:
    """What to check for GPUs whose fabric registration has not completed, by their system."""
    if not is_nvswitch_model(model):
        return CHECK_RACK_FABRIC
    if "not_started" in waiting:
        return f"the fabric manager is not running: {START_FM}"
    return CHECK_PARTITION


def fabric_problem(model: str, infos: list[dict[str, Any]]) -> str | None:
    """What is wrong with the NVLink fabric of a node's GPUs of one model (NVML's records), if anything."""
    gpus = f"{len(infos)} {model} GPU(s)"
    states = [(info.get("fabric") or {}) for info in infos]
    waiting = sorted({s["state"] for s in states if s.get("state") in ("not_started", "in_progress")})
    if waiting:
        advice = waiting_advice(model, waiting)
        return f"NVLink fabric registration {' / '.join(waiting)} on its {gpus}: {advice}"
    failed = sorted({s["status"] for s in states if s.get("state") == "completed" and s.get("status")})
    if failed:
        check = (
            "check nvidia-fabricmanager's log there, restart it, and reset the GPUs if it persists"
            if is_nvswitch_model(model)
            else CHECK_RACK_FABRIC
        )
        codes = ", ".join(map(str, failed))
        return f"NVLink fabric registration of its {gpus} failed (NVML status {codes}): {check}"
    unread = not any(s.get("state") for s in states)  # A100: no fabric state; not_supported: no fabric
    all_down = all(
        info.get("nvlinks") and not any(link["active"] for link in info["nvlinks"]) for info in infos
    )
    if len(infos) > 1 and all_down and unread and is_nvswitch_model(model):
        links = sum(len(info["nvlinks"]) for info in infos)
        return (
            f"all {links} NVLink links of its {gpus} inactive on an NVSwitch board: the fabric"
            f" manager is not running (NCCL's traffic falls back to PCIe or fails): {START_FM}"
        )
    return None
