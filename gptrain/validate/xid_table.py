"""What an Xid or NVSwitch SXid means and what its node needs: NVIDIA's Xid catalogue
(docs.nvidia.com/deploy/xid-errors/) and NVML's GPU recovery actions as one table, no I/O.
gptrain.validate.nvml reads the kernel log; gptrain.validate.gpus judges and prints."""

from __future__ import annotations

import re

# The NVLink 5 Xids (Blackwell), by the unit the catalogue's mnemonic names (NVLINK_SAW_ERROR, ...)
NVLINK5_UNITS = {
    144: "SAW",
    145: "RLW",
    146: "TLW",
    147: "TREX",
    148: "NVLPW control",
    149: "NETIR",
    150: "MSE",
}
# An NVLink 5 Xid's line names its unit and severity: "145, RLW_REMAP Nonfatal XC0 i0 Link 02 (0x...)".
# NVIDIA's catalogue answers most non-fatal items with IGNORE (or the action of an Xid 154 beside
# them) and the fatal ones with RESET_GPU; NVIDIA's NVSentinel recommends no action for Nonfatal and
# a component reset for Fatal.
NVLINK5_SEVERITY = re.compile(r"^\s*\S+ (Fatal|Nonfatal|Non-fatal)\b")

# Xid classes from NVIDIA's Xid documentation and catalogue (docs.nvidia.com/deploy/xid-errors/):
# `fail` where its remedy is a GPU reset, a node reboot or service (the node is drained), `warn` for memory
# errors corrected, contained or repaired at the next reset, `info` where the application caused it.
# The catalogue's Resolution Bucket (Immediate Action) as NVIDIA's NVSentinel transcribes it
# (xiderrorsmapping.csv): RESET_GPU for 46, 62, 109, 110, 136, 140, 143, 155, 156, 158 (IGNORE for 63,
# which warns), an NVLink 5 workflow for 144 to 150 (a GPU reset for their fatal items: nvlink5_class).
# Xid 109 warns all the same: NVIDIA's k8s-device-plugin skips it, with 13, 31, 43, 45 and 68, as an
# application error that leaves the GPU healthy (internal/rm/health.go). Documented, with the source,
# in docs/validation.md.
XID_CLASSES: dict[int, tuple[str, str]] = {
    13: ("info", "graphics engine exception, usually the application's (a bad instruction or index)"),
    31: ("info", "GPU memory page fault, usually the application's illegal address"),
    43: ("info", "GPU stopped processing: the channel of a faulting application was reset"),
    45: ("info", "preemptive cleanup of a channel after an earlier error or a killed process"),
    46: ("fail", "GPU timeout error"),
    48: ("fail", "double-bit (uncorrectable) ECC error"),
    62: ("fail", "internal micro-controller (PMU) halt"),
    63: ("warn", "ECC page retirement or row remapping recorded: applied at the next GPU reset"),
    64: ("fail", "ECC page retirement or row remapping failed"),
    74: ("fail", "NVLink error"),
    79: ("fail", "the GPU has fallen off the bus"),
    92: ("warn", "high single-bit ECC error rate"),
    94: ("warn", "contained ECC error: the application using the memory was stopped"),
    95: ("fail", "uncontained ECC error: every application on the GPU was affected"),
    109: (
        "warn",
        "context switch timeout, usually the application's (NVIDIA's k8s-device-plugin: the GPU stays"
        " healthy); reset the GPU if it recurs",
    ),
    110: ("fail", "security fault error"),
    119: ("fail", "GSP RPC timeout: the GPU's system processor stopped answering"),
    120: ("fail", "GSP error: the GPU's system processor reported an error"),
    136: ("fail", "NVLink link training (ALI) failed"),
    140: ("fail", "unrecoverable ECC error escaped containment"),
    143: ("fail", "GPU initialization error"),
    **{xid: ("fail", f"fatal NVLink 5 error ({unit})") for xid, unit in NVLINK5_UNITS.items()},
    154: ("fail", "the driver set a recovery action (GPU reset, node reboot or drain) for this GPU"),
    155: ("fail", "NVLink software-defined error"),
    156: ("fail", "resource retirement event (NVIDIA's catalogue: reset the GPU)"),
    158: ("fail", "GPU fatal timeout"),
    160: ("fail", "channel retirement event: the driver retired one of the GPU's channels"),
}
UNLISTED_XID = ("warn", "not in gptrain's table: see NVIDIA's Xid catalogue")
RECOVERY_ACTION_XID = 154

# Xid 154 names the action it changed to: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU
# Reset Required)" (NVIDIA's Xid catalogue; NVML's nvmlDeviceGpuRecoveryAction_t numbers them).
RECOVERY_ACTION = re.compile(
    r"recovery action changed from \S+ \([^)]*\) to (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)"
)
# The actions NVML documents besides None (NVML API change log): 1 GPU reset, 2 node reboot, 3 drain
# P2P from R565 (its GPU recovery action field and event), 4 drain and reset from R570, 5 recover IMEX
# domain from R595, 6 PCIe bus reset and 7 system reboot from R615.
DOCUMENTED_RECOVERY_ACTIONS = range(1, 8)


# NVIDIA's Xid catalogue (Resolution Bucket, Immediate Action RESTART_BM: restart the node) for Xid 79
# (GPU fallen off the bus) and 160 (channel retirement event); Xid 154 names action 0x2, Node Reboot
# Required, or 0x7, System Reboot. Neither a driver reload nor a GPU reset cures them.
REBOOT_XIDS = frozenset({79, 160})
NODE_REBOOT_ACTION, SYSTEM_REBOOT_ACTION = 2, 7


def names_node_reboot(text: str) -> bool:
    """Whether an Xid 154 line's text changes the recovery action to a node or system reboot."""
    match = RECOVERY_ACTION.search(text)
    return match is not None and int(match[1], 16) in (NODE_REBOOT_ACTION, SYSTEM_REBOOT_ACTION)


def xid_class(xid: int, text: str = "") -> tuple[str, str]:
    """(fail | warn | info, what it means) for an Xid whose (last) line says `text`; one not in the
    table needs a look."""
    if xid == RECOVERY_ACTION_XID:
        return recovery_action_class(text)
    if xid in NVLINK5_UNITS:
        return nvlink5_class(xid, text)
    return XID_CLASSES.get(xid, UNLISTED_XID)


def nvlink5_severity(xid: int, text: str) -> str | None:
    """`Fatal` or `Nonfatal` for an NVLink 5 Xid line that names it; None for any other line. The
    parser counts the two apart, so a fatal line followed by non-fatal ones still fails its GPU."""
    match = NVLINK5_SEVERITY.match(text) if xid in NVLINK5_UNITS else None
    if match is None:
        return None
    return "Fatal" if match[1] == "Fatal" else "Nonfatal"


def nvlink5_class(xid: int, text: str) -> tuple[str, str]:
    """An NVLink 5 Xid fails its node only where its line says `Fatal`; a line that names no
    severity needs a look, not a drained node."""
    severity, unit = nvlink5_severity(xid, text), NVLINK5_UNITS[xid]
    if severity == "Fatal":
        return XID_CLASSES[xid]
    if severity == "Nonfatal":
        return "warn", (
            f"non-fatal NVLink 5 error ({unit}): the link carries on (an Xid 154 beside it names any action"
            " the GPU needs)"
        )
    return (
        "warn",
        f"NVLink 5 error ({unit}) whose line names no severity (Fatal, Nonfatal): see NVIDIA's Xid catalogue",
    )


def recovery_action_class(text: str) -> tuple[str, str]:
    """Xid 154 judged by the action it changed to: the driver logs it beside other Xids, and back
    to `0x0 (None)` when no action is needed any more (the GPU can be used by a new process). The
    documented actions (GPU reset, node reboot, drain P2P; R570's drain and reset, R595's recover
    IMEX domain, R615's bus reset and system reboot) fail; one a newer driver added needs a look, not a drained
    node; a line that names none is taken as the worst, as before."""
    match = RECOVERY_ACTION.search(text)
    if match is None:
        return XID_CLASSES[RECOVERY_ACTION_XID]
    action, named = int(match[1], 16), match[2] or match[1]
    if action == 0:  # "0x0" or "0"
        return "info", "the driver's recovery action for this GPU is None: no action needed"
    if action not in DOCUMENTED_RECOVERY_ACTIONS:
        return "warn", (
            f"the driver set this GPU's recovery action to {named} ({match[1]}), one gptrain does not know: "
            "see NVIDIA's Xid catalogue"
        )
    return "fail", f"the driver set this GPU's recovery action to {named}"


# What a failing Xid's GPU needs. NVIDIA's Xid catalogue gives Xids 79 and 160 RESTART_BM (restart
# the node: a GPU off the bus answers no reset); Xid 154's action is NVML's recovery action,
# documented in NVIDIA's GPU memory error management guide ("Error Recovery and Response Flags").
DEFAULT_REMEDY = "drain it, reset or service the GPU"
REBOOT_REMEDY = "drain it and reboot it"
XID_REMEDIES = {
    79: f"{REBOOT_REMEDY} (a GPU reset cannot reach a GPU off the bus); if it recurs, reseat or service the GPU",
    160: REBOOT_REMEDY,
}
P2P_DRAIN = "drain it: stop the GPU's peer-to-peer traffic (its processes, UVM persistence mode), then"
RECOVERY_REMEDIES = {
    1: "drain it and reset the GPU (nvidia-smi -r, no process on it)",
    NODE_REBOOT_ACTION: REBOOT_REMEDY,
    3: f"{P2P_DRAIN} read its recovery action again",
    4: f"{P2P_DRAIN} reset the GPU",
    5: "drain it and recover the IMEX domain of its multi-node NVLink",
    6: "drain it and reset the GPU's PCIe bus",
    SYSTEM_REBOOT_ACTION: REBOOT_REMEDY,
}
UNNAMED_RECOVERY_REMEDY = (
    "drain it and take the recovery action the driver set for the GPU (NVML's GPU recovery action)"
)


def xid_remedy(xid: int, text: str = "") -> str:
    """What to do with the node of a failing Xid whose (last) line says `text`."""
    if xid != RECOVERY_ACTION_XID:
        return XID_REMEDIES.get(xid, DEFAULT_REMEDY)
    match = RECOVERY_ACTION.search(text)
    if match is None:
        return UNNAMED_RECOVERY_REMEDY
    return RECOVERY_REMEDIES.get(int(match[1], 16), DEFAULT_REMEDY)


# A fatal SXid's node: the fabric comes back when the node's GPUs and NVSwitches are reset together.
SXID_REMEDY = "drain it, reboot it (GPUs and NVSwitches reset) or service the NVSwitch"


def sxid_class(fatal: bool, text: str) -> tuple[str, str]:
    """(fail | warn, what it means) for an NVSwitch SXid: a fatal one stops the NVLink fabric, and
    with it NCCL across every GPU of the node, until the node is reset; a non-fatal one is logged
    and the fabric carries on."""
    if fatal:
        return "fail", f"fatal NVSwitch error, the node's NVLink fabric stops: {text}"
    return "warn", f"non-fatal NVSwitch error: {text}"
