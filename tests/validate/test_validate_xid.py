"""Xid errors from a recorded kernel log: read per GPU, named by NVML's index, classified; a
hardware Xid fails its node, which is then listed for exclusion like any failing node."""

from __future__ import annotations

import argparse
import json
import time
import types

import pytest

from gptrain.validate import gpus, kernel_log, nvml, xid_table
from gptrain.validate import main as validate_main
from gptrain.validate.thresholds import Thresholds

# A node's dmesg: a GPU fallen off the bus (which NVML then cannot read), an application's
# out-of-range access twice on another GPU, a warning in an older driver's format (no "PCI:")
DMESG = """\
[   12.345678] nvidia 0000:18:00.0: enabling device (0000 -> 0002)
[ 5107.644336] NVRM: GPU at PCI:0000:3b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae
[ 5107.644340] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[ 6000.100000] NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics SM Warp Exception
[ 6000.200000] NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics Exception: ESR 0x51
[ 7000.000000] NVRM: Xid (0000:db:00): 92, High single-bit ECC error rate
"""


def lost(*_):
    import pynvml

    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


def fake_nvml(bus_ids):
    """A driver whose GPU of NVML index i sits at bus_ids[i] (None: lost, unreadable)."""

    def pci_info(handle):
        if bus_ids[handle] is None:
            lost()
        return types.SimpleNamespace(busId=bus_ids[handle].encode())

    return types.SimpleNamespace(
        nvmlDeviceGetCount=lambda: len(bus_ids),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetPciInfo=pci_info,
    )


NODE_GPUS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:DB:00.0", None]  # GPU 3 (3b) lost


def test_xid_lines_are_counted_per_gpu_and_named_by_nvml_index():
    indices = nvml.indices_by_pci(fake_nvml(NODE_GPUS))
    assert indices == {"0000:18:00": 0, "0000:2a:00": 1, "0000:db:00": 2}
    assert nvml.parse_xids(DMESG, indices) == [
        {
            "pci": "0000:3b:00",
            "gpu": None,
            "xid": 79,
            "count": 1,
            "last": "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        },
        {
            "pci": "0000:18:00",
            "gpu": 0,
            "xid": 13,
            "count": 2,
            "last": "pid=1234, name=python, Graphics Exception: ESR 0x51",
        },
        {"pci": "0000:db:00", "gpu": 2, "xid": 92, "count": 1, "last": "High single-bit ECC error rate"},
    ]


@pytest.mark.parametrize(
    "xids, severity",
    [
        ([48, 64, 74, 79, 95, 119, 120, 154, 160], "fail"),
        ([63, 92, 94, 1000], "warn"),
        ([13, 31, 43, 45], "info"),
    ],
)
def test_xids_are_classed_as_hardware_attention_or_the_application(xids, severity):
    assert [xid_table.xid_class(x)[0] for x in xids] == [severity] * len(xids)
    assert xid_table.xid_class(79)[1] == "the GPU has fallen off the bus"
    assert "NVIDIA's Xid catalogue" in xid_table.xid_class(1000)[1]


def node_dmesg(monkeypatch, text, returncode=0, stderr=""):
    """This node's dmesg answers `text` (or fails with `stderr`); NVML sees NODE_GPUS."""
    monkeypatch.setattr(nvml.shutil, "which", lambda name: "/usr/bin/dmesg")
    monkeypatch.setattr(
        nvml.subprocess,
        "run",
        lambda *a, **k: types.SimpleNamespace(returncode=returncode, stdout=text, stderr=stderr),
    )
    monkeypatch.setattr(nvml, "load", lambda: fake_nvml(NODE_GPUS))


def gpu_record(rank, node, xid=None):
    record = {
        "rank": rank,
        "node": node,
        "cuda_index": rank % 2,
        "name": "NVIDIA H100",
        "matmul_bf16_tflops": 800,
        "copy_GBps": 3000,
        "problems": [],
        "nvml": {},
    }
    if xid is not None:  # local rank 0 reads the node's dmesg
        record["xid"] = xid
    return record


def run_check_gpus(monkeypatch, tmp_path, records, exclude_file=None, xid_since=None):
    """check_gpus then the verdict on rank 0 of `records`' world: the outcome and the exit code."""
    import torch.distributed as dist

    monkeypatch.setattr(gpus, "run_gpus", lambda *a: records)
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: None)
    nodes = [r["node"] for r in records]
    ctx = types.SimpleNamespace(rank=0, size=len(records), nodes=nodes)
    args = argparse.Namespace(
        iters=1,
        warmup=0,
        dcgm_level=0,
        xid_since=xid_since,
        output_dir=str(tmp_path),
        check="gpus",
        exclude_file=exclude_file,
    )
    out = validate_main.Outcome()
    validate_main.check_gpus(ctx, args, Thresholds(), out)
    return out, validate_main.conclude(ctx, args, out)


def test_a_hardware_xid_fails_its_node_which_is_written_to_the_exclude_file(monkeypatch, tmp_path, capsys):
    """Xids were recorded in gpus.json and never judged: a node whose GPU had fallen off the bus
    passed validation."""
    node_dmesg(monkeypatch, DMESG)
    bad = nvml.xid_events()
    node_dmesg(monkeypatch, "[ 1.0] nvidia: loading out-of-tree module\n")
    clean = nvml.xid_events()
    records = [gpu_record(0, "gpu01", bad), gpu_record(1, "gpu01"), gpu_record(2, "gpu02", clean)]
    exclude = tmp_path / "exclude.txt"
    out, code = run_check_gpus(monkeypatch, tmp_path, records, str(exclude))
    failure = (
        "gpus: gpu01 GPU (index unknown) PCI 0000:3b:00: Xid 79 (1 since boot): the GPU has fallen off"
        " the bus; fails the node: drain it and reboot it (a GPU reset cannot reach a GPU off the bus); if it"
        " recurs, reseat or service the GPU"
    )
    assert code == 1 and out.failures == [failure] and out.bad_nodes == {"gpu01"}
    assert exclude.read_text() == "gpu01\n"
    printed = capsys.readouterr().out.splitlines()
    assert failure in printed and f"FAILED {failure}" in printed and "--exclude=gpu01" in printed
    assert (
        "gpus: gpu01 GPU 2 PCI 0000:db:00: Xid 92 (1 since boot): high single-bit ECC error rate;"
        " needs attention (the node does not fail)"
    ) in printed
    assert any(
        line.startswith("gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 13 (2 since boot): graphics engine exception")
        and line.endswith("usually the application's, not the GPU's")
        for line in printed
    )
    saved = json.loads((tmp_path / "gpus.json").read_text())
    assert [(x["node"], x["gpu"], x["xid"], x["severity"]) for x in saved["xid"]] == [
        ("gpu01", None, 79, "fail"),
        ("gpu01", 2, 92, "warn"),
        ("gpu01", 0, 13, "info"),
    ]


def test_warning_and_application_xids_do_not_fail_the_node(monkeypatch, tmp_path):
    node_dmesg(monkeypatch, "\n".join(line for line in DMESG.splitlines() if ": 79," not in line))
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 0 and out.failures == [] and out.bad_nodes == set()


def test_an_unreadable_dmesg_is_said_once_for_all_nodes_and_fails_none(monkeypatch, tmp_path, capsys):
    denied = "dmesg: read kernel buffer failed: Operation not permitted"
    node_dmesg(monkeypatch, "", returncode=1, stderr=denied + "\n")
    unread = nvml.xid_events()
    assert unread == {"readable": False, "reason": denied}
    records = [gpu_record(r, f"gpu0{r // 2 + 1}", unread if r % 2 == 0 else None) for r in range(6)]
    out, code = run_check_gpus(monkeypatch, tmp_path, records)
    assert code == 0 and out.failures == []
    notes = [line for line in capsys.readouterr().out.splitlines() if "Xid" in line]
    assert notes == [
        f"gpus: Xid errors not checked on gpu[01-03]: dmesg unreadable ({denied}): run validate as root,"
        " or allow users to read it (sysctl kernel.dmesg_restrict=0)"
    ]


def test_a_kernel_log_with_bytes_that_are_not_utf8_is_still_read(monkeypatch, tmp_path):
    """busybox's dmesg (util-linux's escapes them) passes the kernel's bytes through: one that was
    not UTF-8 stopped the rank reading them, and the validation, with a UnicodeDecodeError."""
    fake = tmp_path / "dmesg"
    fake.write_bytes(
        b"#!/bin/sh\nprintf 'usb 1-1: Product: \\377\\376\\nNVRM: Xid (PCI:0000:18:00): 48, DBE\\n'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(nvml, "load", lambda: fake_nvml(NODE_GPUS))
    assert nvml.xid_events() == {
        "readable": True,
        "events": [{"pci": "0000:18:00", "gpu": 0, "xid": 48, "count": 1, "last": "DBE"}],
        "span": "since boot",
        "since_s": None,
        "before_driver_load": 0,
        "kept_across_reload": 0,
        "older": 0,
        "untimed": 0,
    }


# An NVSwitch's fatal link error, its two follow-up lines, and a non-fatal error on another switch
SXID_DMESG = """\
[ 1108.858286] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 32 LTSSM Fault Up
[ 1108.858290] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Severity 1 Engine instance 32 Sub-engine instance 00
[ 1108.858295] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Data {0x00000000, 0x00000000, 0x00000000}
[ 2000.000000] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate
[ 2000.000010] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Severity 0 Engine instance 04 Sub-engine instance 00
[ 2000.000020] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Data {0x00000004, 0x00000004, 0x00000000}
[ 2100.000000] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 05 RX Short Error Rate
"""


def test_nvswitch_sxids_are_counted_once_per_event_and_named_by_their_switch():
    assert nvml.parse_sxids(SXID_DMESG) == [
        {
            "kind": "SXid",
            "pci": "0000:86:00",
            "gpu": None,
            "nvswitch": 3,
            "xid": 20034,
            "fatal": True,
            "count": 1,
            "last": "Link 32 LTSSM Fault Up",
        },
        {
            "kind": "SXid",
            "pci": "0000:06:00",
            "gpu": None,
            "nvswitch": 1,
            "xid": 20009,
            "fatal": False,
            "count": 2,
            "last": "Link 05 RX Short Error Rate",
        },
    ]
    assert nvml.parse_xids(SXID_DMESG, {}) == []  # no NVRM: Xid line among them


def test_a_fatal_nvswitch_sxid_fails_its_node_and_a_non_fatal_one_warns(monkeypatch, tmp_path, capsys):
    """SXids were not read at all: a node whose NVSwitch had stopped its NVLink fabric (NCCL across
    its GPUs hangs or fails) passed validation."""
    node_dmesg(monkeypatch, SXID_DMESG)
    records = [gpu_record(0, "gpu01", nvml.xid_events())]
    node_dmesg(monkeypatch, "\n".join(line for line in SXID_DMESG.splitlines() if "nvswitch1" in line))
    records.append(gpu_record(1, "gpu02", nvml.xid_events()))
    out, code = run_check_gpus(monkeypatch, tmp_path, records)
    failure = (
        "gpus: gpu01 NVSwitch 3 PCI 0000:86:00: SXid 20034 (1 since boot): fatal NVSwitch error, the node's"
        " NVLink fabric stops: Link 32 LTSSM Fault Up; fails the node: drain it, reboot it (GPUs and"
        " NVSwitches reset) or service the NVSwitch"
    )
    assert code == 1 and out.failures == [failure] and out.bad_nodes == {"gpu01"}
    printed = capsys.readouterr().out.splitlines()
    warning = (
        "gpus: gpu02 NVSwitch 1 PCI 0000:06:00: SXid 20009 (2 since boot): non-fatal NVSwitch error: Link 05"
        " RX Short Error Rate; needs attention (the node does not fail)"
    )
    assert failure in printed and warning in printed and "--exclude=gpu01" in printed
    saved = json.loads((tmp_path / "gpus.json").read_text())["xid"]
    assert [(x["node"], x["kind"], x["nvswitch"], x["xid"], x["severity"]) for x in saved] == [
        ("gpu01", "SXid", 3, 20034, "fail"),
        ("gpu01", "SXid", 1, 20009, "warn"),
        ("gpu02", "SXid", 1, 20009, "warn"),
    ]


@pytest.mark.parametrize(
    ("changed", "severity", "meaning"),
    [
        (
            "0x0 (None) to 0x1 (GPU Reset Required)",
            "fail",
            "the driver set this GPU's recovery action to GPU Reset Required",
        ),
        (
            "0x0 (None) to 0x2 (Node Reboot Required)",
            "fail",
            "the driver set this GPU's recovery action to Node Reboot Required",
        ),
        (
            "0x0 (None) to 0x4 (Drain and Reset)",
            "fail",
            "the driver set this GPU's recovery action to Drain and Reset",
        ),
        (
            "0x1 (GPU Reset Required) to 0x0 (None)",
            "info",
            "the driver's recovery action for this GPU is None: no action needed",
        ),
        (  # an action newer than NVML's documented eight: it failed the node, unknown as it is
            "0x0 (None) to 0x8 (Reset Fabric Required)",
            "warn",
            "the driver set this GPU's recovery action to Reset Fabric Required (0x8), one gptrain does not"
            " know: see NVIDIA's Xid catalogue",
        ),
        (  # NVML documents 5 (R595), 6 and 7 (R615): they warned as unknown
            "0x0 (None) to 0x7 (System Reboot Required)",
            "fail",
            "the driver set this GPU's recovery action to System Reboot Required",
        ),
    ],
)
def test_xid_154_is_judged_by_the_recovery_action_it_names(changed, severity, meaning):
    """Xid 154 failed the node whatever action it named, `0x0 (None)` (no action needed) too."""
    line = f"NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from {changed}\n"
    [event] = nvml.parse_xids(line, {"0000:18:00": 0})
    assert xid_table.xid_class(event["xid"], event["last"]) == (severity, meaning)


def test_the_last_recovery_action_of_a_gpu_decides_and_none_does_not_fail_the_node(monkeypatch, tmp_path):
    log = (
        "[ 10.0] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
        "[ 90.0] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)\n"
    )
    node_dmesg(monkeypatch, log)
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 0 and out.failures == [] and out.bad_nodes == set()
    [saved] = json.loads((tmp_path / "gpus.json").read_text())["xid"]
    assert (saved["xid"], saved["count"], saved["severity"]) == (154, 2, "info")
    node_dmesg(monkeypatch, log.splitlines()[0])
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert out.failures == [
        "gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 154 (1 since boot): the driver set this GPU's recovery action to"
        " GPU Reset Required; fails the node: drain it and reset the GPU (nvidia-smi -r, no process on it)"
    ]


def test_an_unknown_recovery_action_warns_naming_it_and_does_not_fail_the_node(monkeypatch, tmp_path, capsys):
    """A recovery action newer than NVML's documented ones failed the node as a GPU reset would."""
    node_dmesg(
        monkeypatch,
        "[ 10.0] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x8 (Fabric"
        " Check Required)\n",
    )
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 0 and out.failures == [] and out.bad_nodes == set()
    assert (
        "gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 154 (1 since boot): the driver set this GPU's recovery action to"
        " Fabric Check Required (0x8), one gptrain does not know: see NVIDIA's Xid catalogue; needs attention"
        " (the node does not fail)"
    ) in capsys.readouterr().out.splitlines()


# A node whose GPU 0 had an uncorrectable ECC error at 10:00 (a GPU reset cures it), had its driver
# reloaded (rmmod, modprobe: every GPU reset), and logged only an application's Xid 13 since; read
# at 14:00 (4 h after boot).
# uptime (s since boot) of each line, and the read
RESET_AT_BOOT_S, READ_AT_BOOT_S = 3600.0, 14400.0
RELOADED = """\
[    5.100000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
[  600.000000] NVRM: Xid (PCI:0000:18:00): 95, pid='<unknown>', name=<unknown>, Uncontained: FBHUB. RST: Yes, D-RST: No
[  600.000100] NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error
[ 3600.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
[ 9000.000000] NVRM: Xid (PCI:0000:18:00): 13, pid=4321, name=python, Graphics SM Warp Exception
"""


def test_xids_before_the_drivers_last_load_are_not_judged(monkeypatch, tmp_path, capsys):
    """A driver reload (which resets every GPU) left its Xids 95 and 48 in dmesg, and
    the node failed every validation until it was rebooted."""
    node_dmesg(monkeypatch, RELOADED)
    xid = nvml.xid_events()
    assert [(e["xid"], e["count"]) for e in xid["events"]] == [(13, 1)]
    assert (xid["before_driver_load"], xid["span"]) == (2, "since the NVIDIA driver was reloaded")
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", xid)])
    assert code == 0 and out.failures == [] and out.bad_nodes == set()
    printed = capsys.readouterr().out.splitlines()
    assert (
        "gpus: gpu01: Xid line(s) not judged: 2 before the NVIDIA driver was last loaded (that resets its GPUs)"
        in printed
    )
    assert any(
        line.startswith("gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 13 (1 since the NVIDIA driver was reloaded):")
        for line in printed
    )


def test_a_log_with_one_driver_load_is_judged_since_boot():
    """The load at boot precedes every Xid: nothing is left out, the counts are 'since boot'."""
    log = RELOADED.splitlines()
    text = "\n".join(log[:3]) + "\n"
    judged = kernel_log.judged_lines(text, nvml.is_xid_event, None, kernel_log.Clock(READ_AT_BOOT_S, 0.0))
    assert (judged.text, judged.span, judged.before_driver_load) == (text, "since boot", 0)


# One boot, one driver load: nvidia.ko's module init brings up the NVSwitch driver, which probes the
# switches (and logs what they report) before it prints its "NVRM: loading" line.
SWITCH_INIT_SXID = """\
[   20.100000] nvidia-nvswitch0: probing 0x22a3, minor 0
[   20.900000] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 32 LTSSM Fault Up
[   21.400000] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build
"""


def test_an_sxid_of_switch_init_before_the_boots_only_driver_load_is_judged(monkeypatch, tmp_path, capsys):
    """The boot's one load was taken for a reload: a fatal SXid raised at switch init was left out
    'before the NVIDIA driver was last loaded', and the node passed with its NVLink fabric stopped."""
    node_dmesg(monkeypatch, SWITCH_INIT_SXID)
    xid = nvml.xid_events()
    assert [(e["kind"], e["xid"]) for e in xid["events"]] == [("SXid", 20034)]
    assert (xid["before_driver_load"], xid["span"]) == (0, "since boot")
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", xid)])
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert out.failures[0].startswith("gpus: gpu01 NVSwitch 3 PCI 0000:86:00: SXid 20034 (1 since boot):")
    assert not [line for line in capsys.readouterr().out.splitlines() if "not judged" in line]


def test_only_a_reload_sets_the_span_and_leaves_lines_out():
    """Two loads: what came before the last one is left out and the span says so; one load: nothing
    is, and the span is the boot's, whatever precedes the load."""
    clock = kernel_log.Clock(READ_AT_BOOT_S, 0.0)
    twice = SWITCH_INIT_SXID + RELOADED.splitlines()[3] + "\n"
    judged = kernel_log.judged_lines(twice, nvml.is_xid_event, None, clock)
    assert (judged.before_driver_load, judged.span) == (1, "since the NVIDIA driver was reloaded")
    once = kernel_log.judged_lines(SWITCH_INIT_SXID, nvml.is_xid_event, None, clock)
    assert (once.text, once.before_driver_load, once.span) == (SWITCH_INIT_SXID, 0, "since boot")


def test_a_reload_whose_boot_load_the_ring_buffer_dropped_is_still_a_reload():
    """A node up for weeks loses the boot's load line first; a GPU Xid before the one load line left
    shows an earlier driver wrote it, so that line is a reload: the Xid 48 it cured was judged as
    current, failing and excluding a recovered node (review V26)."""
    clock = kernel_log.Clock(3000.0, 1e9)
    full = (
        "[    5.100000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
        "[ 1000.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=123, DBE (double bit error) ECC error\n"
        "[ 2000.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    )
    for log in (full, full.split("\n", 1)[1]):
        judged = kernel_log.judged_lines(
            log, nvml.is_xid_event, None, clock, nvml.lines_a_reload_does_not_cure
        )
        assert nvml.parse_xids(judged.text, {}) == [], log
        assert (judged.before_driver_load, judged.span) == (1, "since the NVIDIA driver was reloaded")
    once = kernel_log.judged_lines(
        SWITCH_INIT_SXID, nvml.is_xid_event, None, clock
    )  # SXids precede boot's load
    assert (once.before_driver_load, once.span) == (0, "since boot")


# GPU 0 fell off the bus and its driver asked for a node reboot; GPU 1 (2a) asked for a reboot and
# then for none; the driver was reloaded, not the node rebooted.
REBOOT_NEEDED = """\
[    5.100000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
[  600.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[  600.000100] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
[  700.000000] NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error
[  700.000100] NVRM: Xid (PCI:0000:2a:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
[  800.000000] NVRM: Xid (PCI:0000:2a:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)
[ 3600.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
"""


def test_xids_a_driver_reload_does_not_cure_stay_judged(monkeypatch, tmp_path, capsys):
    """A reload left out Xid 79 (NVIDIA's catalogue: restart the node) and Xid 154 'Node Reboot
    Required': the node passed with its GPU still off the bus."""
    node_dmesg(monkeypatch, REBOOT_NEEDED)
    xid = nvml.xid_events()
    assert [(e["pci"], e["xid"], e["count"], e.get("span")) for e in xid["events"]] == [
        ("0000:18:00", 79, 1, "since boot"),
        ("0000:18:00", 154, 1, "since boot"),
    ]
    assert (xid["before_driver_load"], xid["kept_across_reload"]) == (3, 2)
    assert xid["span"] == "since the NVIDIA driver was reloaded"
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", xid)])
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert [line.split(": ")[2] for line in out.failures] == [
        "Xid 79 (1 since boot)",
        "Xid 154 (1 since boot)",
    ]
    printed = capsys.readouterr().out.splitlines()
    assert (
        "gpus: gpu01: 2 Xid line(s) from before the NVIDIA driver's reload judged: a reload does not cure"
        " them (Xid 79, 160, 154 'Node Reboot Required' or 'System Reboot': reboot the node)"
    ) in printed


@pytest.mark.parametrize(
    ("line", "needs_reboot"),
    [
        (
            "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            True,
        ),
        ("NVRM: Xid (0000:18:00): 160, pid='<unknown>', name=<unknown>, Channel retirement event", True),
        (
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            True,
        ),
        (
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            False,
        ),
        (
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x7 (System Reboot)",
            True,
        ),
        ("NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error", False),
        ("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 32 LTSSM Fault Up", False),
    ],
)
def test_which_xid_lines_a_reload_does_not_cure(line, needs_reboot):
    """NVIDIA's Xid catalogue gives RESTART_BM (restart the node) for Xids 79 and 160; Xid 154 names its action."""
    assert nvml.lines_a_reload_does_not_cure([line]) == ([0] if needs_reboot else [])


def wall_clock_log(read_at_epoch: float) -> str:
    """RELOADED's Xid lines as `dmesg -T` prints them (local time), the last line read at read_at_epoch."""
    lines = []
    for line in RELOADED.splitlines():
        seconds, rest = line[1:].split("]", 1)
        stamp = time.strftime(
            "%a %b %e %H:%M:%S %Y", time.localtime(read_at_epoch - READ_AT_BOOT_S + float(seconds))
        )
        lines.append(f"[{stamp}]{rest}")
    return "\n".join(lines) + "\n"


RELOAD_SPAN = "since the NVIDIA driver was reloaded"


@pytest.mark.parametrize("form", ["since boot", "dmesg -T"])
@pytest.mark.parametrize(
    ("since", "kept", "older", "span"),
    [
        ("4h", [(13, 1)], 0, RELOAD_SPAN),
        ("3h", [(13, 1)], 0, RELOAD_SPAN),
        ("1h", [], 1, "in the last 1h"),
        ("90m", [(13, 1)], 0, "in the last 90m"),
    ],
)
def test_xid_since_judges_only_the_xids_of_that_window(monkeypatch, form, since, kept, older, span):
    """Xid 13 is 5400 s old at the read: inside 4h, 3h and 90m (5400 s: the bound is kept), outside
    1h; the Xids before the driver's reload (10800 s ago) are left out whatever the window. The span
    names the later limit: a 4h window holds the reload, whose Xids it did not count, and was named."""
    epoch = time.mktime((2026, 11, 29, 14, 0, 0, 0, 0, -1))
    text = RELOADED if form == "since boot" else wall_clock_log(epoch)
    monkeypatch.setattr(kernel_log.Clock, "now", classmethod(lambda cls: cls(READ_AT_BOOT_S, epoch)))
    node_dmesg(monkeypatch, text)
    xid = nvml.xid_events(kernel_log.parse_duration(since))
    assert [(e["xid"], e["count"]) for e in xid["events"]] == kept
    assert (xid["before_driver_load"], xid["older"], xid["untimed"]) == (2, older, 0)
    assert xid["span"] == span


@pytest.mark.parametrize(
    ("since", "kept", "older"),
    [("4h", [(79, "in the last 4h"), (154, "in the last 4h")], 0), ("3h", [], 2)],
)
def test_xids_kept_across_a_reload_are_held_to_the_window(monkeypatch, since, kept, older):
    """The reload (3h ago) binds the node's span; the lines kept from before it (600 s after boot,
    13800 s old) are counted in the window, or left out as older than it, once either way."""
    monkeypatch.setattr(kernel_log.Clock, "now", classmethod(lambda cls: cls(READ_AT_BOOT_S, 0.0)))
    node_dmesg(monkeypatch, REBOOT_NEEDED)
    xid = nvml.xid_events(kernel_log.parse_duration(since))
    assert [(e["xid"], e["span"]) for e in xid["events"]] == kept
    assert xid["span"] == RELOAD_SPAN
    assert (xid["before_driver_load"], xid["kept_across_reload"], xid["older"]) == (3, len(kept), older)


def test_an_old_hardware_xid_outside_the_window_does_not_fail_the_node(monkeypatch, tmp_path, capsys):
    """No driver reload in the log (the GPU reset with nvidia-smi -r): an Xid 48 of four hours ago
    failed the node forever; with --xid-since 2h it is left out, said in one line, and a recent one
    on another node still fails."""
    monkeypatch.setattr(kernel_log.Clock, "now", classmethod(lambda cls: cls(READ_AT_BOOT_S, 0.0)))
    old = "[   10.000000] NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error\n"
    node_dmesg(monkeypatch, old)
    records = [gpu_record(0, "gpu01", nvml.xid_events(7200.0))]
    node_dmesg(monkeypatch, old.replace("   10.000000", "14000.000000"))
    records.append(gpu_record(1, "gpu02", nvml.xid_events(7200.0)))
    out, code = run_check_gpus(monkeypatch, tmp_path, records, xid_since=7200.0)
    assert code == 1 and out.bad_nodes == {"gpu02"}
    assert out.failures == [
        "gpus: gpu02 GPU 0 PCI 0000:18:00: Xid 48 (1 in the last 2h): double-bit (uncorrectable) ECC error;"
        " fails the node: drain it, reset or service the GPU"
    ]
    assert (
        "gpus: gpu01: Xid line(s) not judged: 1 older than --xid-since 2h"
        in capsys.readouterr().out.splitlines()
    )


def test_xid_lines_without_a_time_are_judged_under_a_window_and_said(monkeypatch, tmp_path, capsys):
    """printk.time=0: no age to hold against --xid-since, so the Xid is judged, and the line says why."""
    node_dmesg(monkeypatch, "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
    xid = nvml.xid_events(1800.0)
    assert ([e["xid"] for e in xid["events"]], xid["untimed"]) == ([79], 1)
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", xid)], xid_since=1800.0)
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert (
        "gpus: gpu01: 1 Xid line(s) without a timestamp judged whatever their age (--xid-since needs the"
        " kernel's times: printk.time=1)"
    ) in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("boot", None), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), ("900", 900.0), ("1.5h", 5400.0)],
)
def test_xid_since_durations(text, seconds):
    assert kernel_log.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "0", "-2h", "2w", "nan", "infh", "h"])
def test_a_bad_xid_since_is_one_usage_line(bad, capsys):
    from gptrain.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["validate", "gpus", "--output-dir", "/tmp/x", f"--xid-since={bad}"])
    assert exit_.value.code == 2
    assert (
        f"--xid-since: must be a duration like 30m, 2h or 1d (or boot), got {bad!r}"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("line", "action"),
    [
        (  # NVIDIA's Xid catalogue: RESTART_BM; no GPU reset reaches a GPU off the bus
            "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "drain it and reboot it (a GPU reset cannot reach a GPU off the bus); if it recurs, reseat or"
            " service the GPU",
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            "drain it and reset the GPU (nvidia-smi -r, no process on it)",
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "drain it and reboot it",
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
            "drain it: stop the GPU's peer-to-peer traffic (its processes, UVM persistence mode), then"
            " read its recovery action again",
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            "drain it: stop the GPU's peer-to-peer traffic (its processes, UVM persistence mode), then"
            " reset the GPU",
        ),
        (  # NVML of R595 drivers: 5 Recover IMEX Domain; of R615: 6 Bus Reset, 7 System Reboot
            "154, GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)",
            "drain it and recover the IMEX domain of its multi-node NVLink",
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x6 (Bus Reset)",
            "drain it and reset the GPU's PCIe bus",
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x7 (System Reboot)",
            "drain it and reboot it",
        ),
        (
            "154, the driver set a recovery action",
            "drain it and take the recovery action the driver set for the GPU (NVML's GPU recovery action)",
        ),
        (
            "48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
            "drain it, reset or service the GPU",
        ),
    ],
)
def test_a_failing_xid_says_the_action_its_gpu_needs(monkeypatch, tmp_path, line, action):
    """Every failing Xid said 'reset or service the GPU': Xid 79 needs the node rebooted (NVIDIA's
    catalogue: RESTART_BM), and Xid 154 names its action (a node reboot, a P2P drain)."""
    node_dmesg(monkeypatch, f"[ 10.0] NVRM: Xid (PCI:0000:18:00): {line}\n")
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 1 and len(out.failures) == 1
    assert out.failures[0].endswith(f"; fails the node: {action}")
    [saved] = json.loads((tmp_path / "gpus.json").read_text())["xid"]
    assert saved["remedy"] == action


def test_xid_160_fails_its_node_which_needs_a_reboot(monkeypatch, tmp_path):
    """Xid 160 (a channel retirement event) only warned, though NVIDIA's Xid catalogue gives it
    RESTART_BM, and gptrain already judged it across a driver reload as one only a reboot cures."""
    node_dmesg(monkeypatch, "[ 10.0] NVRM: Xid (PCI:0000:18:00): 160, Channel Retirement event\n")
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert out.failures == [
        "gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 160 (1 since boot): channel retirement event: the driver"
        " retired one of the GPU's channels; fails the node: drain it and reboot it"
    ]


# NVIDIA's Xid catalogue, Resolution Bucket (Immediate Action), as NVIDIA's NVSentinel transcribes it
# (xiderrorsmapping.csv): RESET_GPU for these, the NVLink 5 workflow for 144 to 150.
CATALOGUE_RESET_GPU = [46, 62, 110, 136, 140, 143, 155, 156, 158]  # 109 warns: below
# An NVLink 5 Xid's line names its unit and severity: only a fatal one needs the reset.
CATALOGUE_NVLINK5 = [144, 145, 146, 147, 148, 149, 150]
APPLICATION_TEXT = "pid='<unknown>', name=<unknown>"
NVLINK5_FATAL_TEXT = "SAW_MVB Fatal XC0 i0 Link 03 (0x00000021 0x00000002 0x00000000 0x00000000)"


@pytest.mark.parametrize(
    ("xid", "text"),
    [(xid, APPLICATION_TEXT) for xid in CATALOGUE_RESET_GPU]
    + [(xid, NVLINK5_FATAL_TEXT) for xid in CATALOGUE_NVLINK5],
)
def test_xids_whose_catalogued_remedy_is_a_gpu_reset_fail_their_node(monkeypatch, tmp_path, xid, text):
    """Xids NVIDIA's catalogue answers with a GPU reset (an unrecoverable ECC error that escaped
    containment, a GPU fatal timeout, a fatal NVLink 5 error) were not in gptrain's table and only warned."""
    assert xid_table.xid_class(xid, text)[0] == "fail"
    assert "not in gptrain's table" not in xid_table.xid_class(xid, text)[1]
    node_dmesg(monkeypatch, f"[ 10.0] NVRM: Xid (PCI:0000:18:00): {xid}, {text}\n")
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert out.failures[0].endswith("; fails the node: drain it, reset or service the GPU")


# NVLink 5 Xids as R570 drivers log them: unit mnemonic, severity word, crossbar, link, IntrInfo
NVLINK5_FATAL = (
    "[ 10.0] NVRM: Xid (PCI:0000:18:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040"
    " 0x00000000 0x00000000 0x00000000 0x00000000)\n"
)
NVLINK5_NONFATAL = (
    "[ 20.0] NVRM: Xid (PCI:0000:18:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02 (0x00000004 0x00000001"
    " 0x00000000 0x00000000)\n"
)


def test_an_nvlink5_xid_fails_its_node_only_when_its_line_says_fatal(monkeypatch, tmp_path, capsys):
    """Xids 144 to 150 failed their node on every line, `Nonfatal` ones too (NVIDIA's catalogue
    answers most with IGNORE, NVSentinel recommends no action): only a `Fatal` one needs the GPU
    reset, and a GPU whose fatal line was followed by a non-fatal one still fails."""
    node_dmesg(monkeypatch, NVLINK5_FATAL + NVLINK5_NONFATAL)
    records = [gpu_record(0, "gpu01", nvml.xid_events())]
    node_dmesg(monkeypatch, NVLINK5_NONFATAL + NVLINK5_NONFATAL.replace("145, RLW_REMAP", "144, SAW_MVB"))
    records.append(gpu_record(1, "gpu02", nvml.xid_events()))
    out, code = run_check_gpus(monkeypatch, tmp_path, records)
    assert code == 1 and out.bad_nodes == {"gpu01"}
    assert out.failures == [
        "gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 145 (1 since boot): fatal NVLink 5 error (RLW); fails the"
        " node: drain it, reset or service the GPU"
    ]
    assert (
        "gpus: gpu02 GPU 0 PCI 0000:18:00: Xid 145 (1 since boot): non-fatal NVLink 5 error (RLW): the link"
        " carries on (an Xid 154 beside it names any action the GPU needs); needs attention (the node does"
        " not fail)"
    ) in capsys.readouterr().out.splitlines()
    saved = json.loads((tmp_path / "gpus.json").read_text())["xid"]
    assert [(x["node"], x["xid"], x["count"], x["severity"], x["remedy"]) for x in saved] == [
        ("gpu01", 145, 1, "fail", "drain it, reset or service the GPU"),
        ("gpu01", 145, 1, "warn", ""),
        ("gpu02", 144, 1, "warn", ""),
        ("gpu02", 145, 1, "warn", ""),
    ]


@pytest.mark.parametrize(
    ("text", "severity"),
    [
        ("SAW_MVB Fatal XC0 i0 Link -1 (0x00000021 0x00000002 0x00000000 0x00000000)", "fail"),
        ("TLW_CTRL Non-fatal XC0 i0 Link 04 (0x00000043 0x00000001)", "warn"),
        ("pid='<unknown>', name=<unknown>", "warn"),  # no severity word: a look, not a drained node
    ],
)
def test_an_nvlink5_xid_is_judged_by_its_severity_word(text, severity):
    assert xid_table.xid_class(146, text)[0] == severity


def test_xid_109_warns_as_an_application_error_and_does_not_fail_its_node(monkeypatch, tmp_path, capsys):
    """Xid 109 (context switch timeout) failed its node, though NVIDIA's k8s-device-plugin skips it
    with 13, 31, 43, 45 and 68 as an application error that leaves the GPU healthy."""
    node_dmesg(
        monkeypatch,
        "[ 10.0] NVRM: Xid (PCI:0000:18:00): 109, pid=2519562, name=python3, Ch 0000000a, errorString CTX"
        " SWITCH TIMEOUT, Info 0x3c046\n",
    )
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    assert code == 0 and out.failures == [] and out.bad_nodes == set()
    assert (
        "gpus: gpu01 GPU 0 PCI 0000:18:00: Xid 109 (1 since boot): context switch timeout, usually the"
        " application's (NVIDIA's k8s-device-plugin: the GPU stays healthy); reset the GPU if it recurs;"
        " needs attention (the node does not fail)"
    ) in capsys.readouterr().out.splitlines()
    [saved] = json.loads((tmp_path / "gpus.json").read_text())["xid"]
    assert (saved["xid"], saved["severity"], saved["remedy"]) == (109, "warn", "")


def test_a_failing_sxid_records_the_remedy_its_line_gives(monkeypatch, tmp_path):
    """A fatal SXid's printed line named its remedy, but gpus.json recorded `remedy: ""` for it."""
    node_dmesg(monkeypatch, SXID_DMESG)
    out, code = run_check_gpus(monkeypatch, tmp_path, [gpu_record(0, "gpu01", nvml.xid_events())])
    remedy = "drain it, reboot it (GPUs and NVSwitches reset) or service the NVSwitch"
    assert code == 1 and out.failures[0].endswith(f"; fails the node: {remedy}")
    saved = json.loads((tmp_path / "gpus.json").read_text())["xid"]
    assert [(x["xid"], x["severity"], x["remedy"]) for x in saved] == [
        (20034, "fail", remedy),
        (20009, "warn", ""),
    ]


def test_the_xid_report_needs_no_torch_and_validate_modules_stay_near_500_lines():
    """The Xid findings sat in gpus.py (which imports torch) and their report in main.py, both at
    the 500-line mark; they are a module of their own now, which rank 0 runs without torch."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; from gptrain.validate import xid_findings as x;"
        " print(x.xid_findings([{'node': 'n0', 'xid': {'readable': False, 'reason': 'denied'}}])[1]);"
        " print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["{'n0': 'denied'}", "False"]
    package = Path(validate_main.__file__).parent
    lengths = {p.name: len(p.read_text().splitlines()) for p in package.glob("*.py")}
    assert max(lengths.values()) <= 500, lengths


def test_a_flagged_gpu_is_named_by_its_nvml_index_and_pci_address_as_its_xids_are(
    monkeypatch, tmp_path, capsys
):
    """Under one GPU per task every rank's GPU is cuda:0: a flagged GPU was named `rank 5 on gpu01`
    and `cuda:0` only, while its Xid lines and nvidia-smi -r -i need NVML's index or PCI address.
    A GPU whose NVML record was not read keeps its CUDA index alone."""
    records = [gpu_record(rank, "gpu01") for rank in range(2)]
    for rank, record in enumerate(records):
        record["cuda_index"] = 0
        record["nvml"] = {"index": 4 + rank, "pci_bus_id": f"00000000:{0x66 + 2 * rank:02X}:00.0"}
    records[1]["problems"] = ["3 uncorrected ECC errors since the NVIDIA driver last loaded"]
    records.append(dict(gpu_record(2, "gpu02"), cuda_index=0))  # NVML unread: {}
    out, code = run_check_gpus(monkeypatch, tmp_path, records)
    printed = capsys.readouterr().out.splitlines()
    assert code == 1 and out.failures == [
        "gpus: rank 1 on gpu01 GPU 5 PCI 0000:68:00 (cuda:0): 3 uncorrected ECC errors since the NVIDIA driver"
        " last loaded"
    ]
    assert [line.split(" NVIDIA H100")[0] for line in printed[:3]] == [
        "gpus: rank 0 gpu01 GPU 4 PCI 0000:66:00 (cuda:0)",
        "gpus: rank 1 gpu01 GPU 5 PCI 0000:68:00 (cuda:0)",
        "gpus: rank 2 gpu02 cuda:0",
    ]
