"""GPU health from NVML (nvidia-ml-py), one field at a time.

Every field is read in its own try: virtual machines and some GPUs do not support some of
them (NVLink on PCIe cards, row remapping before Ampere, ECC counters under vGPU), and an
unsupported field is recorded as null with the reason, never as a failure. A read that fails
because the GPU itself is broken (lost, needing a reset, a corrupted infoROM) is a fault instead.
The node's Xid lines and NVSwitch SXid lines (from dmesg) are read here too; xid_table classifies
them.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from gptrain.validate.fabric_info import FUNCTION_NOT_FOUND, fabric
from gptrain.validate.xid_table import REBOOT_XIDS, RECOVERY_ACTION_XID, names_node_reboot, nvlink5_severity

# Throttle reasons that mean the GPU is being slowed against its will (NVML's bit masks).
BAD_THROTTLE = {
    "nvmlClocksThrottleReasonHwSlowdown": "hw_slowdown",
    "nvmlClocksThrottleReasonHwThermalSlowdown": "hw_thermal",
    "nvmlClocksThrottleReasonSwThermalSlowdown": "sw_thermal",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "hw_power_brake",
}
INFO_THROTTLE = {
    "nvmlClocksThrottleReasonGpuIdle": "idle",
    "nvmlClocksThrottleReasonSwPowerCap": "sw_power_cap",
    "nvmlClocksThrottleReasonApplicationsClocksSetting": "applications_clocks",
    "nvmlClocksThrottleReasonSyncBoost": "sync_boost",
}


LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND


class NvmlUnavailable(Exception):
    """NVML cannot be used in this process: nvidia-ml-py absent, or no libnvidia-ml (a container
    started without the driver's utility libraries), or the driver not loaded."""


def load() -> Any:
    """The pynvml module with NVML initialised; NvmlUnavailable saying why not."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        missing = getattr(error, "value", None) == LIBRARY_NOT_FOUND
        hint = (
            " (no libnvidia-ml: a container needs NVIDIA_DRIVER_CAPABILITIES with utility)" if missing else ""
        )
        raise NvmlUnavailable(f"nvmlInit: {error or type(error).__name__}{hint}") from None
    return pynvml


# NVML's return codes (nvmlReturn_t) that say the GPU is broken, not that a field is missing on
# this GPU, driver or VM: such a GPU must fail the check, not pass with its fields skipped.
FAULT_CODES = {
    8: "its external power cables are not properly attached",  # NVML_ERROR_INSUFFICIENT_POWER
    11: "the kernel detected an interrupt issue",  # NVML_ERROR_IRQ_ISSUE
    14: "its infoROM is corrupted",  # NVML_ERROR_CORRUPTED_INFOROM
    15: "it has fallen off the bus",  # NVML_ERROR_GPU_IS_LOST
    16: "it needs a reset",  # NVML_ERROR_RESET_REQUIRED
}


def fault_of(error: BaseException) -> str | None:
    """What is wrong with the GPU when `error` is an NVML error that says it is broken, else None."""
    if not type(error).__name__.startswith("NVMLError"):
        return None
    return FAULT_CODES.get(getattr(error, "value", None))  # type: ignore[arg-type]


@dataclasses.dataclass
class Unread:
    """The fields NVML did not give, name -> reason: absent here (`unsupported`), or refused
    because the GPU is broken (`faults`)."""

    unsupported: dict[str, str] = dataclasses.field(default_factory=dict)
    faults: dict[str, str] = dataclasses.field(default_factory=dict)


def field(errors: Unread, name: str, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as error:  # NVMLError_NotSupported, NoPermission, ...; GpuIsLost: a fault
        reason, fault = str(error) or type(error).__name__, fault_of(error)
        if fault:
            errors.faults[name] = f"{reason} ({fault})"
        else:
            errors.unsupported[name] = reason
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def handle_for(nv: Any, cuda_uuid: str | None, index: int) -> Any:
    """The NVML handle of the GPU CUDA calls `cuda_uuid`. NVML numbers GPUs regardless of
    CUDA_VISIBLE_DEVICES, so the UUID finds it: GPU-<uuid> for a whole GPU, MIG-<uuid> for a MIG
    slice, whose health (ECC, clocks, temperature, links) is its parent GPU's. By index only when
    CUDA gives no UUID: NVML's GPU of CUDA's index is another GPU under CUDA_VISIBLE_DEVICES."""
    if not cuda_uuid:
        return nv.nvmlDeviceGetHandleByIndex(index)
    for prefix in ("GPU-", "MIG-"):
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(prefix + cuda_uuid)
        except Exception as error:
            if fault_of(error):  # our GPU is broken: another one's record must not stand in for it
                raise
            continue
        return handle if prefix == "GPU-" else nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    raise LookupError(f"NVML has no GPU-{cuda_uuid} or MIG-{cuda_uuid} (CUDA's UUID of this GPU)")


def clock_event_mask(nv: Any, h: Any) -> int:
    """The throttle reasons' bit mask. nvidia-ml-py has the new name (NVML 12.535) whatever the
    driver, and a driver before R535 lacks it (Function Not Found): then the old name is read."""
    new = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if new is not None:
        try:
            return int(new(h))
        except Exception as error:
            if getattr(error, "value", None) != FUNCTION_NOT_FOUND:
                raise
    return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def throttle_reasons(nv: Any, h: Any) -> list[str]:
    mask = clock_event_mask(nv, h)
    names = {**BAD_THROTTLE, **INFO_THROTTLE}
    return [label for attr, label in names.items() if mask & int(getattr(nv, attr, 0))]


def nvlinks(nv: Any, h: Any, errors: Unread) -> list[dict[str, Any]]:
    links = []
    for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
        try:
            active = bool(nv.nvmlDeviceGetNvLinkState(h, link))
        except Exception:
            continue  # a link this GPU does not have
        counters = {}
        for kind in ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA"):
            counters[kind.lower()] = field(
                errors,
                f"nvlink{link}_{kind.lower()}",
                lambda kind=kind, link=link: int(
                    nv.nvmlDeviceGetNvLinkErrorCounter(h, link, getattr(nv, f"NVML_NVLINK_ERROR_DL_{kind}"))
                ),
            )
        remote = (
            field(errors, f"nvlink{link}_remote", lambda link=link: remote_type(nv, h, link))
            if active
            else None
        )
        links.append({"link": link, "active": active, "errors": counters, "remote": remote})
    return links


def remote_type(nv: Any, h: Any, link: int) -> str:
    """What an active link reaches: "gpu" (an NVLink bridge or a direct link), "switch" (an
    NVSwitch), "npu" (IBM's), or "unknown"."""
    kind = int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
    names = {"NVML_NVLINK_DEVICE_TYPE_GPU": "gpu", "NVML_NVLINK_DEVICE_TYPE_SWITCH": "switch"}
    names["NVML_NVLINK_DEVICE_TYPE_IBMNPU"] = "npu"
    return next((name for attr, name in names.items() if getattr(nv, attr, None) == kind), "unknown")


def ecc(nv: Any, h: Any, errors: Unread) -> dict[str, Any]:
    out = {}
    for kind in ("UNCORRECTED", "CORRECTED"):
        for scope in ("VOLATILE", "AGGREGATE"):
            key = f"{kind.lower()}_{scope.lower()}"
            out[key] = field(
                errors,
                f"ecc_{key}",
                lambda k=kind, s=scope: int(
                    nv.nvmlDeviceGetTotalEccErrors(
                        h, getattr(nv, f"NVML_MEMORY_ERROR_TYPE_{k}"), getattr(nv, f"NVML_{s}_ECC")
                    )
                ),
            )
    return out


def memory_health(nv: Any, h: Any, errors: Unread) -> dict[str, Any]:
    remap = field(errors, "remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
    cause = nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    return {
        "retired_pages_dbe": field(
            errors, "retired_pages", lambda: len(nv.nvmlDeviceGetRetiredPages(h, cause))
        ),
        "retired_pages_pending": field(
            errors, "retired_pages_pending", lambda: bool(nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        ),
        "remapped_rows": None
        if remap is None
        else {
            "corrected": remap[0],
            "uncorrected": remap[1],
            "pending": bool(remap[2]),
            "failed": bool(remap[3]),
        },
    }


def gpu_health(nv: Any, h: Any) -> dict[str, Any]:
    """Every field NVML gives for one GPU; unread ones are null and listed in `unsupported`, or in
    `faults` where NVML said the GPU is broken."""
    errors = Unread()
    f = lambda name, read: field(errors, name, read)  # noqa: E731
    info = {
        "name": f("name", lambda: _text(nv.nvmlDeviceGetName(h))),
        "uuid": f("uuid", lambda: _text(nv.nvmlDeviceGetUUID(h))),
        "pci_bus_id": f("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId)),
        "index": f("index", lambda: int(nv.nvmlDeviceGetIndex(h))),  # nvidia-smi's, as Xid lines name it
        "temperature_C": f("temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "slowdown_temperature_C": f(
            "slowdown_temperature",
            lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        ),
        "sm_clock_MHz": f("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        "max_sm_clock_MHz": f("max_sm_clock", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        "mem_clock_MHz": f("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        "power_W": f("power", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        "power_limit_W": f("power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
        "throttle_reasons": f("throttle_reasons", lambda: throttle_reasons(nv, h)),
        "pcie": {
            "gen": f("pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "max_gen": f("pcie_max_gen", lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
            "width": f("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
            "max_width": f("pcie_max_width", lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h)),
        },
        "ecc": ecc(nv, h, errors),
        "memory": memory_health(nv, h, errors),
        "nvlinks": f("nvlinks", lambda: nvlinks(nv, h, errors)),
        "fabric": f("fabric", lambda: fabric(nv, h)),
    }
    info["unsupported"] = errors.unsupported
    info["faults"] = errors.faults
    return info


# What a GPU NVML calls broken needs, by FAULT_CODES' words: a GPU off the bus answers no reset (as
# for Xid 79, the node is rebooted), a reset does not rewrite a corrupted infoROM.
FAULT_REMEDIES = {
    FAULT_CODES[15]: (
        "drain the node and reboot it (a GPU off the bus answers no reset); if it recurs, reseat or service"
        " the GPU"
    ),
    FAULT_CODES[16]: "reset the GPU (nvidia-smi -r, no process on it)",
    FAULT_CODES[8]: "drain the node and attach the GPU's external power cables properly",
    FAULT_CODES[14]: "service the GPU (a reset does not repair its infoROM)",
}


def fault_remedy(reason: str) -> str:
    """What to do about a GPU whose NVML fault reads `reason` (NVML's words and FAULT_CODES')."""
    return next(
        (fix for what, fix in FAULT_REMEDIES.items() if f"({what})" in reason), "reset or service the GPU"
    )


def fault_problem(reason: str, fields: list[str] | None = None) -> str:
    """One line for a broken GPU: NVML's reason, what it was reading, what to do."""
    reading = f" reading {', '.join(fields[:3])}{', ...' if len(fields) > 3 else ''}" if fields else ""
    return f"NVML: {reason}{reading}: {fault_remedy(reason)}"


# What NVML's volatile ECC counter covers (nvmlEccCounterType_t): it is reset each time the driver
# loads, which on Linux without persistence mode is each time an application opens the GPU. The
# aggregate counter spans the GPU's life: its past errors are judged by row remapping instead.
VOLATILE_SPAN = (
    "since the NVIDIA driver last loaded (NVML's volatile count; without persistence mode the driver"
    " loads afresh for each application)"
)


def health_problems(info: dict[str, Any]) -> list[str]:
    """What in an NVML record makes the GPU unfit for a long run (empty: healthy)."""
    problems = []
    faults: dict[str, list[str]] = {}
    for name, reason in (info.get("faults") or {}).items():
        faults.setdefault(reason, []).append(name)
    problems += [fault_problem(reason, names) for reason, names in faults.items()]
    ecc_counts, memory = info.get("ecc") or {}, info.get("memory") or {}
    if (ecc_counts.get("uncorrected_volatile") or 0) > 0:
        problems.append(f"{ecc_counts['uncorrected_volatile']} uncorrected ECC errors {VOLATILE_SPAN}")
    remap = memory.get("remapped_rows") or {}
    if remap.get("failed"):
        problems.append("row remapping failed (the GPU needs service)")
    if remap.get("pending") or memory.get("retired_pages_pending"):
        problems.append("memory repair pending: reset the GPU before use")
    bad = [r for r in info.get("throttle_reasons") or [] if r in BAD_THROTTLE.values()]
    if bad:
        problems.append(f"clocks slowed by {', '.join(bad)}")
    temp, limit = info.get("temperature_C"), info.get("slowdown_temperature_C")
    if temp is not None and limit and temp >= limit - 5:
        problems.append(f"temperature {temp} C within 5 C of the slowdown limit {limit} C")
    pcie = info.get("pcie") or {}
    if pcie.get("width") and pcie.get("max_width") and pcie["width"] < pcie["max_width"]:
        problems.append(f"PCIe link x{pcie['width']} below its x{pcie['max_width']}")
    down = [str(link["link"]) for link in info.get("nvlinks") or [] if not link["active"]]
    if down and len(down) < len(info.get("nvlinks") or []):  # all down: a GPU without NVLink use
        problems.append(f"NVLink link(s) {', '.join(down)} inactive")
    return problems


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."; older drivers print
# no "PCI:" prefix
XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)(?:\.[0-7])?\): (\d+),? ?(.*)"
)


def pci_key(bus_id: str) -> str:
    """domain:bus:device in lower-case hex, four/two/two digits: dmesg's 0000:3b:00 and NVML's
    00000000:3B:00.0 name the same GPU."""
    domain, bus, device = bus_id.split(".")[0].split(":")[-3:]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def lines_a_reload_does_not_cure(lines: list[str]) -> list[int]:
    """The indices of the Xid lines that still speak for their GPU after the driver is reloaded: a
    catalogued reboot Xid, and a GPU's last Xid 154 where it asks for a node reboot (a later one
    back to None says the driver no longer needs it)."""
    kept, last_action = [], {}
    for index, line in enumerate(lines):
        match = XID.search(line)
        if match is None:
            continue
        if int(match[2]) == RECOVERY_ACTION_XID:
            last_action[pci_key(match[1])] = index
        elif int(match[2]) in REBOOT_XIDS:
            kept.append(index)
    kept += [index for index in last_action.values() if names_node_reboot(lines[index])]
    return sorted(kept)


def indices_by_pci(nv: Any) -> dict[str, int]:
    """NVML's index (nvidia-smi's) of every GPU it can read, by PCI address; a GPU it cannot
    (lost) is left out, and its Xids are named by PCI address alone."""
    found = {}
    for index in range(int(nv.nvmlDeviceGetCount())):
        try:
            bus_id = _text(nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(index)).busId)
        except Exception:
            continue
        found[pci_key(bus_id)] = index
    return found


def node_gpu_indices() -> dict[str, int]:
    """indices_by_pci of this node, or none where NVML cannot be used."""
    try:
        return indices_by_pci(load())
    except Exception:
        return {}


def parse_xids(text: str, indices: dict[str, int]) -> list[dict[str, Any]]:
    """The Xid lines of a kernel log, one entry per GPU and Xid (and severity, for an NVLink 5 Xid
    whose line names it): how many, the last line's text (an Xid 13 can repeat thousands of
    times), and the GPU's NVML index where known."""
    events: dict[tuple[str, int, str | None], dict[str, Any]] = {}
    for match in XID.finditer(text):
        pci, xid, last = pci_key(match[1]), int(match[2]), match[3].strip()[:200]
        event = events.setdefault(
            (pci, xid, nvlink5_severity(xid, last)),
            {"pci": pci, "gpu": indices.get(pci), "xid": xid, "count": 0, "last": ""},
        )
        event["count"] += 1
        event["last"] = last
    return list(events.values())


# "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 32 LTSSM Fault Up" opens an NVSwitch
# error (NVIDIA's Fabric Manager user guide, "NVSwitch SXid errors"); the lines after it repeat the
# number with "Severity 1 Engine instance ..." and "Data {...}", and are the same event.
SXID = re.compile(
    r"(?:nvidia-nvswitch(\d+): )?SXid \((?:PCI:)?([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)(?:\.[0-7])?\): "
    r"(\d+), (Fatal|Non-fatal), ?(.*)"
)


def parse_sxids(text: str) -> list[dict[str, Any]]:
    """The NVSwitch SXid events of a kernel log, one entry per switch, SXid and fatality: how many
    (an event's follow-up lines are not counted) and the last one's text. An NVSwitch is no GPU:
    `gpu` is None and `nvswitch` its driver instance (nvidia-nvswitch3 -> 3) where the line names it."""
    events: dict[tuple[str, int, bool], dict[str, Any]] = {}
    for match in SXID.finditer(text):
        pci, sxid, fatal = pci_key(match[2]), int(match[3]), match[4] == "Fatal"
        switch = None if match[1] is None else int(match[1])
        event = events.setdefault(
            (pci, sxid, fatal),
            {
                "kind": "SXid",
                "pci": pci,
                "gpu": None,
                "nvswitch": switch,
                "xid": sxid,
                "fatal": fatal,
                "count": 0,
            },
        )
        event["count"] += 1
        event["last"] = match[5].strip()[:200]
    return list(events.values())


def read_kernel_log() -> tuple[str | None, str]:
    """dmesg's text, or None and why it could not be read (it needs privileges on many systems)."""
    if shutil.which("dmesg") is None:
        return None, "no dmesg"
    try:
        # busybox's dmesg prints the kernel's bytes as they came: a line not in UTF-8 is still read
        out = subprocess.run(["dmesg"], capture_output=True, text=True, errors="replace", timeout=15)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    if out.returncode != 0:
        return None, out.stderr.strip()[:200] or f"dmesg exit {out.returncode}"
    return out.stdout, ""


def is_xid_event(line: str) -> bool:
    """An Xid line, or an SXid's first one (its follow-up lines name no fatality)."""
    return bool(XID.search(line) or SXID.search(line))


def xid_events(since_s: float | None = None) -> dict[str, Any]:
    """This node's Xids and NVSwitch SXids since boot (dmesg holds no older ones), or 'unreadable'
    and why. Those before the driver's reload (but the ones a reload does not cure), or older than
    `since_s` (--xid-since), are counted and left out (gptrain.validate.kernel_log)."""
    from gptrain.validate.kernel_log import Clock, judged_lines

    text, reason = read_kernel_log()
    if text is None:
        return {"readable": False, "reason": reason}
    judged = judged_lines(text, is_xid_event, since_s, Clock.now(), lines_a_reload_does_not_cure)
    events = parse_xids(judged.text, node_gpu_indices()) + parse_sxids(judged.text)
    carried = {(e["pci"], e["xid"]) for e in parse_xids("\n".join(judged.carried), {})}
    for event in events:  # counted across the reload: the span without it
        if (event["pci"], event["xid"]) in carried and event.get("kind") != "SXid":
            event["span"] = judged.span_across_reload
    return {"readable": True, "events": events, **judged.as_dict()}
