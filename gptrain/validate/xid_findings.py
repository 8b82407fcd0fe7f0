"""The Xid lines of each node's kernel log (and its NVSwitches' SXid lines) as validate reports
them: classified by xid_table, failing ones first, one line each; the lines left out of the judged
span and the nodes whose dmesg could not be read, each said in one line. No torch: rank 0 reports.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from gptrain.validate import xid_table
from gptrain.validate.kernel_log import duration_text
from gptrain.validate.report import compress_hostlist

if TYPE_CHECKING:
    from gptrain.validate.main import Outcome

XID_ACTIONS = {
    "fail": f"fails the node: {xid_table.DEFAULT_REMEDY}",
    "warn": "needs attention (the node does not fail)",
    "info": "usually the application's, not the GPU's",
}
XID_ORDER = {"fail": 0, "warn": 1, "info": 2}


@dataclasses.dataclass
class XidFinding:
    """One Xid of one GPU (or SXid of one NVSwitch) of a node in its judged span, classified by
    xid_table.XID_CLASSES (xid_table.sxid_class)."""

    node: str
    pci: str
    gpu: int | None  # NVML's index (nvidia-smi's); None for a GPU NVML could not read, or an NVSwitch
    xid: int
    count: int
    severity: str
    meaning: str
    last: str  # the last such line's text after the Xid
    kind: str = "Xid"  # or "SXid": an NVSwitch's, which the whole node's GPUs talk through
    nvswitch: int | None = None  # an SXid's switch instance (nvidia-nvswitch3 -> 3)
    span: str = "since boot"  # what `count` covers (kernel_log.Judged.span)
    remedy: str = ""  # a failing Xid's or SXid's: what its node needs (xid_table.xid_remedy, SXID_REMEDY)

    def line(self) -> str:
        action = XID_ACTIONS[self.severity]
        if self.remedy:
            action = f"fails the node: {self.remedy}"
        return (
            f"{self.node} {self._device()} PCI {self.pci}: {self.kind} {self.xid} ({self.count} {self.span}):"
            f" {self.meaning}; {action}"
        )

    def _device(self) -> str:
        if self.kind == "SXid":
            return f"NVSwitch {self.nvswitch}" if self.nvswitch is not None else "NVSwitch"
        return f"GPU {self.gpu}" if self.gpu is not None else "GPU (index unknown)"


def xid_findings(records: list[dict[str, Any]]) -> tuple[list[XidFinding], dict[str, str]]:
    """Every node's Xids classified, failing ones first, and the nodes whose dmesg could not be
    read with why (one rank a node reads it: the others' records have no `xid`)."""
    findings, unread = [], {}
    for r in records:
        xid = r.get("xid")
        if xid is None:
            continue
        if not xid.get("readable"):
            unread[r["node"]] = xid.get("reason") or "no reason given"
            continue
        span = xid.get("span") or "since boot"
        findings.extend(
            dataclasses.replace(_finding(r["node"], e), span=e.get("span") or span) for e in xid["events"]
        )
    findings.sort(key=lambda f: (XID_ORDER[f.severity], f.node, f.pci, f.kind, f.xid))
    return findings, unread


def _finding(node: str, event: dict[str, Any]) -> XidFinding:
    """One event of a node's kernel log (nvml.parse_xids, nvml.parse_sxids), classified."""
    if event.get("kind") == "SXid":
        severity, meaning = xid_table.sxid_class(event["fatal"], event["last"])
        return XidFinding(
            node,
            event["pci"],
            None,
            event["xid"],
            event["count"],
            severity,
            meaning,
            event["last"],
            kind="SXid",
            nvswitch=event["nvswitch"],
            remedy=xid_table.SXID_REMEDY if severity == "fail" else "",
        )
    severity, meaning = xid_table.xid_class(event["xid"], event["last"])
    remedy = xid_table.xid_remedy(event["xid"], event["last"]) if severity == "fail" else ""
    return XidFinding(
        node,
        event["pci"],
        event["gpu"],
        event["xid"],
        event["count"],
        severity,
        meaning,
        event["last"],
        remedy=remedy,
    )


def xid_left_out_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line for each node whose kernel log had Xid lines left out (kernel_log.judged_lines),
    and for one whose lines carried no time to hold against --xid-since."""
    lines = []
    for r in records:
        xid = r.get("xid") or {}
        parts = []
        if xid.get("before_driver_load"):
            parts.append(
                f"{xid['before_driver_load']} before the NVIDIA driver was last loaded (that resets its GPUs)"
            )
        if xid.get("older"):
            parts.append(f"{xid['older']} older than --xid-since {duration_text(xid['since_s'])}")
        if parts:
            lines.append(f"gpus: {r['node']}: Xid line(s) not judged: {', '.join(parts)}")
        if xid.get("kept_across_reload"):
            lines.append(
                f"gpus: {r['node']}: {xid['kept_across_reload']} Xid line(s) from before the NVIDIA driver's"
                " reload judged: a reload does not cure them (Xid 79, 160, 154 'Node Reboot Required' or 'System"
                " Reboot': reboot the node)"
            )
        if xid.get("untimed"):
            lines.append(
                f"gpus: {r['node']}: {xid['untimed']} Xid line(s) without a timestamp judged whatever their age"
                " (--xid-since needs the kernel's times: printk.time=1)"
            )
    return lines


def xid_unread_line(unread: dict[str, str]) -> str:
    """One line for every node whose Xids were not read: not a failure, but not a clean bill."""
    reasons = "; ".join(sorted(set(unread.values())))
    hint = ""
    if "not permitted" in reasons or "denied" in reasons:
        hint = ": run validate as root, or allow users to read it (sysctl kernel.dmesg_restrict=0)"
    return f"gpus: Xid errors not checked on {compress_hostlist(unread)}: dmesg unreadable ({reasons}){hint}"


def report_xids(records: list[dict[str, Any]], out: Outcome) -> dict[str, Any]:
    """Print each node's Xids since boot (or its driver's reload, or --xid-since); a hardware one
    (xid_table.XID_CLASSES) fails its node. What goes into gpus.json: the findings and the nodes
    whose dmesg could not be read."""
    findings, unread = xid_findings(records)
    for finding in findings:
        print(f"gpus: {finding.line()}")
        if finding.severity == "fail":
            out.failures.append(f"gpus: {finding.line()}")
            out.bad_nodes.add(finding.node)
    for line in xid_left_out_lines(records):
        print(line)
    if unread:
        print(xid_unread_line(unread))
    return {"xid": [dataclasses.asdict(f) for f in findings], "xid_unread": unread}
