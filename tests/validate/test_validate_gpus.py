"""GPU checks without a GPU: NVML records from a fake driver (fields unsupported as in VMs), verdicts."""

from __future__ import annotations

import ctypes
import struct
import types

import pytest

from gptrain.validate import nvml
from gptrain.validate.gpus import judge
from gptrain.validate.thresholds import Thresholds


class NotSupported(Exception):
    pass


def fake_nvml(**overrides):
    """A pynvml stand-in: a healthy 8-NVLink H100 unless `overrides` replace a reader."""
    import pynvml

    def unsupported(*_):
        raise NotSupported("Not Supported")

    nv = types.SimpleNamespace(
        **{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML_", "nvmlClocks"))}
    )
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetUUID = lambda h: "GPU-1234"
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:18:00.0")
    nv.nvmlDeviceGetIndex = lambda h: 3
    nv.nvmlDeviceGetTemperature = lambda h, kind: 40
    nv.nvmlDeviceGetTemperatureThreshold = lambda h, kind: 87
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, scope: 0
    nv.nvmlDeviceGetRetiredPages = unsupported  # Ampere and later remap rows instead
    nv.nvmlDeviceGetRetiredPagesPendingStatus = unsupported
    nv.nvmlDeviceGetRemappedRows = lambda h: (0, 0, 0, 0)
    nv.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < 18 else unsupported()
    nv.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, kind: 0
    for name, value in overrides.items():
        setattr(nv, name, value)
    return nv, unsupported


def test_healthy_gpu_has_no_problems_and_records_unsupported_fields():
    nv, _ = fake_nvml()
    info = nvml.gpu_health(nv, object())
    assert nvml.health_problems(info) == []
    assert info["name"] == "NVIDIA H100 80GB HBM3" and len(info["nvlinks"]) == 18
    assert info["memory"]["retired_pages_dbe"] is None and "retired_pages" in info["unsupported"]


def test_a_vm_without_most_fields_is_not_a_failure():
    _, unsupported = fake_nvml()
    names = [
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetPowerUsage",
    ]
    nv, _ = fake_nvml(**{n: unsupported for n in names})
    info = nvml.gpu_health(nv, object())
    assert nvml.health_problems(info) == []
    assert info["nvlinks"] == [] and info["ecc"]["uncorrected_volatile"] is None
    assert {"ecc_uncorrected_volatile", "remapped_rows", "throttle_reasons"} <= set(info["unsupported"])


def test_broken_gpus_are_named_for_what_is_wrong():
    nv, _ = fake_nvml(
        nvmlDeviceGetTotalEccErrors=lambda h, kind, scope: 3 if kind == nv_kind("UNCORRECTED") else 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 2, 1, 0),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: int(
            nv_attr("nvmlClocksThrottleReasonHwThermalSlowdown")
        ),
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 8,
        nvmlDeviceGetNvLinkState=lambda h, link: 0 if link == 3 else (1 if link < 18 else 1 / 0),
    )
    problems = nvml.health_problems(nvml.gpu_health(nv, object()))
    text = " | ".join(problems)
    assert "3 uncorrected ECC errors" in text and "memory repair pending" in text
    assert "hw_thermal" in text and "x8 below its x16" in text and "NVLink link(s) 3 inactive" in text


def nv_kind(kind):
    import pynvml

    return getattr(pynvml, f"NVML_MEMORY_ERROR_TYPE_{kind}")


def nv_attr(name):
    import pynvml

    return getattr(pynvml, name)


def record(rank, node, tflops, copy, problems=()):
    return {
        "rank": rank,
        "node": node,
        "matmul_bf16_tflops": tflops,
        "copy_GBps": copy,
        "problems": list(problems),
    }


def test_judge_flags_gpus_below_the_median_and_below_the_profile():
    records = [record(r, f"n{r // 2}", 800, 3000) for r in range(6)]
    records[3] = record(3, "n1", 600, 3000)  # 25% slower matmul
    records[4] = record(4, "n2", 800, 3000, ["row remapping failed (the GPU needs service)"])
    judged = judge(records, Thresholds(slow_pct=10, copy_GBps=3100))
    assert [bool(r["flags"]) for r in judged] == [True] * 6  # the profile's copy floor fails everyone
    assert any("25% below the median 800" in f for f in judged[3]["flags"])
    assert "row remapping failed (the GPU needs service)" in judged[4]["flags"]
    relaxed = judge([dict(r, problems=r["problems"]) for r in records], Thresholds(slow_pct=10))
    assert [r["rank"] for r in relaxed if r["flags"]] == [3, 4]


def test_a_gpu_whose_nvlinks_are_all_down_fails_where_its_node_peers_have_theirs_up():
    """health_problems leaves a GPU with every NVLink inactive alone (a PCIe card without a bridge
    reads so), but on an NVSwitch node where the other GPUs have theirs up it is the GPU whose
    links failed to train: its NCCL traffic falls back to PCIe, and it passed. Judged against its
    node's GPUs now; a node where every GPU reads all links down stays unflagged."""

    def links(active):
        return [{"link": k, "active": active, "errors": {}} for k in range(18)]

    records = [record(r, f"n{r // 4}", 800, 3000) for r in range(8)]
    for r in records:
        r["nvml"] = {"nvlinks": links(True)}
    records[2]["nvml"] = {"nvlinks": links(False)}
    for r in records[4:]:  # n1: PCIe cards, no bridge
        r["nvml"] = {"nvlinks": links(False)}
    records[5]["nvml"] = {"error": "NVMLError: Unknown Error"}
    judged = judge(records, Thresholds(slow_pct=10))
    assert [r["rank"] for r in judged if r["flags"]] == [2]
    assert judged[2]["flags"] == [
        "all 18 NVLink links inactive while other GPUs of its model on n0 have theirs up: its traffic to them"
        " falls back to PCIe (check nvidia-smi nvlink -s; reset the GPU or service it)"
    ]


def test_nvlinks_all_down_are_judged_against_the_other_gpus_of_the_same_model():
    """All links down was flagged wherever any GPU of the node had one up: a PCIe node whose GPUs 0
    and 1 share an NVLink bridge and 2 and 3 have none flagged 2 and 3, and so would a display GPU
    of another model. Flagged now only where every other GPU of its model on its node has links up
    (one of 8 SXM GPUs down); a node with a bridge-less pair beside a bridged one (NVML names the
    up links' remote a GPU) is not."""

    def with_links(r, name, active, n=12, remote="switch"):
        links = [{"link": k, "active": active, "errors": {}, "remote": remote} for k in range(n)]
        r["nvml"] = {"name": name, "nvlinks": links}
        return r

    pcie = "NVIDIA H100 PCIe"
    bridged = [with_links(record(r, "n0", 800, 3000), pcie, r < 2, remote="gpu") for r in range(4)]
    assert [r["flags"] for r in judge(bridged, Thresholds(slow_pct=10))] == [[]] * 4

    sxm = "NVIDIA H100 80GB HBM3"
    node = [with_links(record(r, "n1", 800, 3000), sxm, r != 5, 18) for r in range(8)]
    node.append(with_links(record(8, "n1", 800, 3000), "NVIDIA L4", False))  # another model: no NVLink
    judged = judge(node, Thresholds(slow_pct=10))
    assert [r["rank"] for r in judged if r["flags"]] == [5]
    assert judged[5]["flags"][0].startswith(
        "all 18 NVLink links inactive while other GPUs of its model on n1"
    )


@pytest.mark.parametrize(
    "returncode, text, passed", [(0, "| Memory | Pass |", True), (226, "| Memory | Fail - GPU 3 |", False)]
)
def test_dcgm_result_is_read_from_its_output(monkeypatch, returncode, text, passed):
    from gptrain.validate import gpus

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/dcgmi")
    monkeypatch.setattr(
        gpus.subprocess,
        "run",
        lambda *a, **k: types.SimpleNamespace(returncode=returncode, stdout=text, stderr=""),
    )
    result = gpus.dcgm_diag(1)
    assert result["ran"] and result["passed"] is passed
    assert result["failures"] == ([] if passed else ["Memory: Fail - GPU 3"])


def dcgmi_table(*rows):
    """dcgmi diag's text output (DCGM's Diag.cpp stencil: a 27-wide name and a 46-wide result
    column; Warning, Error and Info text wrapped every 45 characters, mid-word). A row given as a
    bare word is DCGM 4's category header (Hardware, Integration, Stress): a border with a name."""
    lines = [
        "Successfully ran diagnostic for group.",
        "+---------------------------+------------------------------------------------+",
        "| Diagnostic                | Result                                         |",
        "+===========================+================================================+",
        "|-----  Metadata  ----------+------------------------------------------------|",
        "| DCGM Version              | 3.3.7                                          |",
        "|-----  Deployment  --------+------------------------------------------------|",
    ]
    for row in rows:
        if isinstance(row, str):
            lines.append("+" + f"-----  {row}  ".ljust(27, "-") + "+" + "-" * 48 + "+")
            continue
        name, info = row
        chunks = (
            [info[i : i + 45] for i in range(0, len(info), 45)]
            if name.split(":")[0] in ("Warning", "Error")
            else [info]
        )
        for k, chunk in enumerate(chunks):
            lines.append(f"| {name if k == 0 else '':<25} | {chunk:<46} |")
    lines.append("+---------------------------+------------------------------------------------+")
    return "\n".join(lines) + "\n"


def run_dcgmi(monkeypatch, returncode, stdout, stderr=""):
    from gptrain.validate import gpus

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/dcgmi")
    monkeypatch.setattr(
        gpus.subprocess,
        "run",
        lambda *a, **k: types.SimpleNamespace(returncode=returncode, stdout=stdout, stderr=stderr),
    )
    return gpus.dcgm_diag(2)


GRAPHICS_WARNING = (
    "NVVS has detected processes with graphics contexts open running on at least one GPU."
    " This may cause some tests to fail."
)
BANDWIDTH_FAILURE = (
    "GPU 3 only achieved a memory bandwidth of 1812.40 GB/s, failing to meet 2400.00 GB/s for test 0"
)


def test_a_dcgmi_warning_that_says_fail_does_not_fail_a_passing_node(monkeypatch):
    """Any line of dcgmi's output with "fail" in it failed the node: a Warn result (dcgmi exits 0)
    whose warning text says "may cause some tests to fail" drained a healthy node. Only a test whose
    result is Fail (or a non-zero exit) fails it now."""
    text = dcgmi_table(
        ("Denylist", "Pass"),
        ("Targeted Stress", "Warn - GPU: 0"),
        ("Warning", GRAPHICS_WARNING),
        ("Memory Bandwidth", "Pass - All"),
    )
    result = run_dcgmi(monkeypatch, 0, text)
    assert result["passed"] is True and result["failures"] == []


def test_a_failing_dcgmi_test_is_named_with_its_whole_reason(monkeypatch):
    """The failure listed only the lines that said "fail": the result row, and of its reason (which
    dcgmi wraps every 45 characters) only the piece holding the word. Now: the test, its result and
    its Warning text unwrapped; a Warn of the same test after it changes nothing."""
    text = dcgmi_table(
        ("Memory Bandwidth", "Pass - GPUs: 0, 1, 2   "),
        ("", "Fail - GPU: 3   "),
        ("Warning", BANDWIDTH_FAILURE),
        ("SM Stress", "Pass - All"),
    )
    result = run_dcgmi(monkeypatch, 226, text)
    assert result["passed"] is False
    assert result["failures"] == [f"Memory Bandwidth: Fail - GPU: 3: {BANDWIDTH_FAILURE}"]


def test_a_dcgmi_reason_wrapped_at_a_space_keeps_it(monkeypatch):
    """dcgmi cuts a reason every 45 characters wherever they fall; each piece was stripped before
    the pieces were joined, so a cut just after a space lost it ("18GB/s"). Only the whole reason
    is stripped now, in DCGM 3's layout and in DCGM 4's (the GPU beside "Warning")."""
    reason = "GPU 3 only achieved a memory bandwidth of 18 GB/s, failing to meet 2400.00 GB/s"
    assert reason[44] == " "  # the first piece ends with the space
    dcgm3 = dcgmi_table(("Memory Bandwidth", "Fail - GPU: 3   "), ("Warning", reason))
    assert run_dcgmi(monkeypatch, 226, dcgm3)["failures"] == [f"Memory Bandwidth: Fail - GPU: 3: {reason}"]
    reason = reason.replace(" 18 ", " 812 ")
    assert reason[45] == " "  # the second piece starts with the space
    dcgm4 = dcgmi_table(("memory_bandwidth", "Fail"), ("", "GPU3: Fail"), ("Warning: GPU3", reason))
    assert run_dcgmi(monkeypatch, 226, dcgm4)["failures"] == [f"memory_bandwidth: Fail: {reason}"]


def test_dcgmi_4s_rows_per_gpu_are_read_as_their_tests(monkeypatch):
    """DCGM 4 lists each GPU's result under its test's ("GPU0: Fail") and may name the GPU beside
    "Warning": the test still fails, with its reason."""
    text = dcgmi_table(
        ("memory", "Pass"),
        ("", "GPU0: Pass"),
        ("diagnostic", "Fail"),
        ("", "GPU0: Fail"),
        ("Warning: GPU0", "Detected XID 79 for GPU 0"),
    )
    result = run_dcgmi(monkeypatch, 226, text)
    assert result["failures"] == ["diagnostic: Fail: Detected XID 79 for GPU 0"]


@pytest.mark.parametrize(
    "entity_row",
    ["GPU0: Not Run", "GPU0:", "CPU0: Pass", "GPU_I0: Pass", "Switch0: Skip", "CPU_Core12: Pass"],
)
def test_a_dcgmi_4_entity_row_of_any_kind_stays_in_its_test(monkeypatch, entity_row):
    """DCGM 4 lists a row per entity under its test ("{group}{id}: {result}"): only GPU rows with
    Pass, Fail, Warn or Skip were known, so a GPU Not Run (DCGM 4.6; 4.0 leaves it blank), a CPU,
    a MIG instance or an NVSwitch row closed the test and the failing GPU's reason after it was
    lost. Any such row is its test's now."""
    text = dcgmi_table(
        ("memory", "Fail"),
        ("", entity_row),
        ("", "GPU1: Fail"),
        ("Warning: GPU1", "Detected XID 48 for GPU 1"),
    )
    assert run_dcgmi(monkeypatch, 226, text)["failures"] == ["memory: Fail: Detected XID 48 for GPU 1"]


def dcgm4_software_warn(closed=True):
    """dcgmi diag -r 1 of DCGM 4 on a node whose GPU 1 has persistence mode off: the software test
    warns, its GPU1 row says "Fail" (Diag.cpp prints an entity's Warn so) and dcgmi exits 226."""
    text = dcgmi_table(
        ("software", "Warn"),
        ("", "GPU0: Pass"),
        ("", "GPU1: Fail"),
        ("Warning: GPU1", "Persistence mode for GPU 1 is disabled."),
    )
    return text if closed else text.rstrip("\n").rsplit("\n", 1)[0] + "\n"


@pytest.mark.parametrize("returncode", [0, 226])
def test_a_dcgmi_4_warned_gpu_shown_as_fail_under_a_warn_test_passes(monkeypatch, returncode):
    """DCGM 4.0 to 4.6 print a GPU's Warn as "GPU1: Fail" under the test's own "Warn" row, and exit
    226 (DCGM_ST_NVVS_ERROR) for a software test's warning: the node failed on "software: GPU1:
    Fail". Under a Warn test its entity rows do not fail; a closed table with only Warn, Pass and
    Skip passes at 226, its warnings kept."""
    result = run_dcgmi(monkeypatch, returncode, dcgm4_software_warn())
    assert result["passed"] is True and result["failures"] == []
    assert result["warnings"] == ["software: Warn: Persistence mode for GPU 1 is disabled."]
    from gptrain.validate.gpus import dcgm_warning_lines

    assert dcgm_warning_lines([{"node": "gpu01", "dcgm": result}, {"node": "gpu02"}]) == [
        "gpus: gpu01: dcgmi diag warned (the node passes): software: Warn: Persistence mode for GPU 1 is"
        " disabled."
    ]


def test_a_dcgmi_4_real_fail_or_a_doubtful_exit_still_fails(monkeypatch):
    """What passes at exit 226 is a whole table of Warn, Pass and Skip: a Fail row (the test's or,
    under a test that does not say Warn, an entity's), another status (205: an isolate error), an
    "Error:" line of dcgmi's beside the table, or a table cut short fails the node."""
    warned = dcgm4_software_warn()
    failing = dcgmi_table(
        ("software", "Warn"),
        ("", "GPU1: Fail"),
        ("Warning: GPU1", "Persistence mode for GPU 1 is disabled."),
        ("memory", "Pass"),
        ("", "GPU0: Fail"),
        ("Warning: GPU0", "Detected XID 48"),
    )
    result = run_dcgmi(monkeypatch, 226, failing)
    assert result["passed"] is False and result["failures"] == ["memory: GPU0: Fail: Detected XID 48"]
    assert result["warnings"] == ["software: Warn: Persistence mode for GPU 1 is disabled."]
    assert run_dcgmi(monkeypatch, 205, warned)["failures"] == ["dcgmi diag -r 2 exited with status 205"]
    assert run_dcgmi(monkeypatch, 226, warned, "Error: GPU 1 fell off the bus\n")["failures"] == [
        "dcgmi diag -r 2 exited with status 226: Error: GPU 1 fell off the bus"
    ]
    cut = run_dcgmi(monkeypatch, 226, dcgm4_software_warn(closed=False))
    assert cut["passed"] is False and cut["failures"] == ["dcgmi diag -r 2 exited with status 226"]
    passing = dcgmi_table(("software", "Pass"), ("", "GPU0: Pass"))
    assert run_dcgmi(monkeypatch, 226, passing)["failures"] == ["dcgmi diag -r 2 exited with status 226"]


def test_a_dcgmi_that_exits_non_zero_without_a_failing_test_says_why(monkeypatch):
    """dcgmi that could not reach its host engine (nv-hostengine not running) exits non-zero with an
    "Error:" line and no table: the node failed as "dcgmi diag failed: see gpus.json". Its error
    lines and exit status are the failure now."""
    text = (
        "Error: unable to establish a connection to the specified host: localhost\n"
        "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
    )
    result = run_dcgmi(monkeypatch, 255, "", text)
    assert result["passed"] is False
    assert result["failures"] == [
        "dcgmi diag -r 2 exited with status 255: Error: unable to establish a connection to the specified"
        " host: localhost; Error: Unable to connect to host engine. Host engine connection"
        " invalid/disconnected."
    ]
    assert run_dcgmi(monkeypatch, 3, "", "")["failures"] == ["dcgmi diag -r 2 exited with status 3"]


def test_gpus_are_expected_from_the_profile_the_flag_or_the_job_never_on_a_cpu_machine():
    from gptrain.validate.gpus import gpus_expected

    assert gpus_expected(Thresholds(), False, {}) is None
    assert gpus_expected(Thresholds(), False, {"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "0"}) is None
    assert (
        gpus_expected(Thresholds(profile="p", copy_GBps=1.0), False, {})
        == "the profile p sets GPU thresholds"
    )
    assert gpus_expected(Thresholds(), True, {}) == "--expect-gpus was given"
    assert gpus_expected(Thresholds(), False, {"SLURM_GPUS_ON_NODE": "8"}) == (
        "Slurm gave the job GPUs (SLURM_GPUS_ON_NODE=8)"
    )
    assert gpus_expected(Thresholds(), False, {"CUDA_VISIBLE_DEVICES": "0,1"}) == "CUDA_VISIBLE_DEVICES=0,1"


def nvml_error(code_name):
    """The exception nvidia-ml-py raises for NVML's return code `code_name`."""
    import pynvml

    return pynvml.NVMLError(getattr(pynvml, code_name))


def raising(code_name):
    def read(*_):
        raise nvml_error(code_name)

    return read


def test_a_lost_gpu_fails_instead_of_passing_with_its_fields_unsupported():
    lost = raising("NVML_ERROR_GPU_IS_LOST")
    readers = [name for name in dir(fake_nvml()[0]) if name.startswith("nvmlDevice")]
    nv, _ = fake_nvml(**{name: lost for name in readers})
    info = nvml.gpu_health(nv, object())
    problems = nvml.health_problems(info)
    assert len(problems) == 1 and problems[0].startswith(
        "NVML: GPU is lost (it has fallen off the bus) reading"
    )
    assert problems[0].endswith(LOST_REMEDY) and "temperature" in info["faults"]
    assert "temperature" not in info["unsupported"]


def test_a_corrupted_inforom_fails_while_unsupported_fields_do_not():
    nv, _ = fake_nvml(
        nvmlDeviceGetTotalEccErrors=raising("NVML_ERROR_CORRUPTED_INFOROM"),
        nvmlDeviceGetPowerUsage=raising("NVML_ERROR_NOT_SUPPORTED"),
    )
    info = nvml.gpu_health(nv, object())
    assert nvml.health_problems(info) == [
        "NVML: Corrupted infoROM (its infoROM is corrupted) reading ecc_uncorrected_volatile, "
        "ecc_uncorrected_aggregate, ecc_corrected_volatile, ...: service the GPU (a reset does not repair its"
        " infoROM)"
    ]
    assert info["unsupported"]["power"] == "Not Supported" and "power" not in info["faults"]


def test_a_gpu_lost_before_its_handle_is_found_fails_and_is_not_replaced_by_another(monkeypatch):
    from gptrain.validate import gpus

    nv, _ = fake_nvml(
        nvmlDeviceGetHandleByUUID=raising("NVML_ERROR_GPU_IS_LOST"),
        nvmlDeviceGetHandleByIndex=lambda index: object(),  # some healthy GPU of the node
    )
    with pytest.raises(Exception, match="GPU is lost"):
        nvml.handle_for(nv, "1234", 0)
    monkeypatch.setattr(nvml, "load", lambda: nv)
    record, problems = gpus.nvml_health("1234", 0)
    assert record == {"error": "NVMLError_GpuIsLost: GPU is lost"}
    assert problems == [f"NVML: GPU is lost (it has fallen off the bus): {LOST_REMEDY}"]


def test_clocks_slowed_are_read_on_a_driver_before_r535():
    # nvidia-ml-py always has the new reader; an older driver's NVML lacks the function
    hw_slowdown = int(nv_attr("nvmlClocksThrottleReasonHwSlowdown"))
    nv, _ = fake_nvml(
        nvmlDeviceGetCurrentClocksEventReasons=raising("NVML_ERROR_FUNCTION_NOT_FOUND"),
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: hw_slowdown,
    )
    info = nvml.gpu_health(nv, object())
    assert info["throttle_reasons"] == ["hw_slowdown"] and "throttle_reasons" not in info["unsupported"]
    assert nvml.health_problems(info) == ["clocks slowed by hw_slowdown"]


def by_uuid(known):
    """nvmlDeviceGetHandleByUUID of a driver that knows the handles `known` (by NVML UUID)."""

    def lookup(uuid):
        if uuid not in known:
            raise nvml_error("NVML_ERROR_NOT_FOUND")
        return known[uuid]

    return lookup


def named_fake(**overrides):
    """The fake driver whose GPU name says which handle was read."""
    nv, _ = fake_nvml(nvmlDeviceGetName=lambda h: f"GPU of handle {h}".encode(), **overrides)
    return nv


def test_a_mig_slice_is_found_by_its_uuid_and_read_on_its_parent_gpu(monkeypatch):
    from gptrain.validate import gpus

    nv = named_fake(
        nvmlDeviceGetHandleByUUID=by_uuid({"MIG-aa11": "slice", "GPU-bb22": "gpu3"}),
        nvmlDeviceGetDeviceHandleFromMigDeviceHandle=lambda h: {"slice": "gpu3"}[h],
        nvmlDeviceGetHandleByIndex=lambda index: f"gpu{index}",  # NVML's numbering, not CUDA's
    )
    monkeypatch.setattr(nvml, "load", lambda: nv)
    record, problems = gpus.nvml_health("aa11", 0)  # CUDA_VISIBLE_DEVICES=MIG-aa11: cuda:0
    assert record["name"] == "GPU of handle gpu3" and problems == []
    assert gpus.nvml_health("bb22", 0)[0]["name"] == "GPU of handle gpu3"


def test_a_gpu_nvml_does_not_know_is_not_read_by_index_as_another_gpu(monkeypatch):
    from gptrain.validate import gpus

    nv = named_fake(
        nvmlDeviceGetHandleByUUID=by_uuid({"GPU-bb22": "gpu3"}),
        nvmlDeviceGetHandleByIndex=lambda index: f"gpu{index}",
    )
    monkeypatch.setattr(nvml, "load", lambda: nv)
    record, problems = gpus.nvml_health("cc33", 0)
    assert record == {"error": "LookupError: NVML has no GPU-cc33 or MIG-cc33 (CUDA's UUID of this GPU)"}
    assert problems == []
    assert gpus.nvml_health(None, 1)[0]["name"] == "GPU of handle gpu1"  # no UUID: NVML's index


def test_a_gpu_whose_nvml_health_was_not_read_does_not_just_say_ok(monkeypatch, tmp_path, capsys):
    import argparse

    import pynvml

    from gptrain.validate import gpus, main

    monkeypatch.setattr(pynvml, "nvmlInit", raising("NVML_ERROR_LIBRARY_NOT_FOUND"))
    info, problems = gpus.nvml_health("1234", 0)
    assert problems == [] and info["error"] == (
        "NvmlUnavailable: nvmlInit: NVML Shared Library Not Found"
        " (no libnvidia-ml: a container needs NVIDIA_DRIVER_CAPABILITIES with utility)"
    )
    rec = dict(record(0, "n1", 800, 3000), cuda_index=0, name="NVIDIA H100", nvml=info)
    monkeypatch.setattr(gpus, "run_gpus", lambda *a: [rec])
    ctx = types.SimpleNamespace(rank=0)
    args = argparse.Namespace(iters=1, warmup=0, dcgm_level=0, xid_since=None, output_dir=str(tmp_path))
    main.check_gpus(ctx, args, Thresholds(), main.Outcome())
    line = capsys.readouterr().out.strip()
    assert line.endswith("GB/s copy: ok (NVML health not checked: " + info["error"] + ")")


@pytest.mark.parametrize(
    "level, limit, usual",
    [
        (1, 600.0, "seconds"),
        (2, 1200.0, "about 2 minutes"),
        (3, 7200.0, "about 15 to 30 minutes"),
        (4, 14400.0, "an hour or more"),
    ],
)
def test_dcgmi_is_given_the_time_its_level_takes_and_a_timeout_says_so(monkeypatch, level, limit, usual):
    """dcgmi diag was given 7200 s at every level, and a level that ran out said only
    "dcgmi diag did not finish: Command '[...]' timed out after 7200.0 seconds"."""
    import subprocess

    from gptrain.validate import gpus

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/dcgmi")
    given = []

    def stuck(command, **kwargs):
        given.append(kwargs["timeout"])
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output="| Deployment | Pass |\n")

    monkeypatch.setattr(gpus.subprocess, "run", stuck)
    result = gpus.dcgm_diag(level)
    assert given == [limit] and result["ran"] and result["passed"] is False
    assert result["failures"] == [
        f"dcgmi diag -r {level} did not finish in {limit:g} s (level {level} usually takes "
        f"{usual}): DCGM or a GPU of this node is stuck; run `dcgmi diag -r {level}` "
        "there by hand, or pass a lower --dcgm-level"
    ]
    assert result["tail"] == "| Deployment | Pass |\n"


def test_uncorrected_ecc_errors_are_counted_since_the_driver_loaded_not_since_boot():
    """The finding read NVML's volatile counter and said 'since boot': NVML resets it each time the
    driver loads, which without persistence mode is each time an application opens the GPU."""
    problems = nvml.health_problems({"ecc": {"uncorrected_volatile": 2, "uncorrected_aggregate": 9}})
    assert problems == [
        "2 uncorrected ECC errors since the NVIDIA driver last loaded (NVML's volatile count; without"
        " persistence mode the driver loads afresh for each application)"
    ]


LOST_REMEDY = "drain the node and reboot it (a GPU off the bus answers no reset); if it recurs, reseat or service the GPU"


@pytest.mark.parametrize(
    ("code_name", "remedy"),
    [
        ("NVML_ERROR_GPU_IS_LOST", LOST_REMEDY),
        ("NVML_ERROR_RESET_REQUIRED", "reset the GPU (nvidia-smi -r, no process on it)"),
        (
            "NVML_ERROR_INSUFFICIENT_POWER",
            "drain the node and attach the GPU's external power cables properly",
        ),
        ("NVML_ERROR_CORRUPTED_INFOROM", "service the GPU (a reset does not repair its infoROM)"),
        ("NVML_ERROR_IRQ_ISSUE", "reset or service the GPU"),
    ],
)
def test_a_broken_gpu_is_told_the_remedy_its_fault_needs(monkeypatch, code_name, remedy):
    """Every NVML fault said 'reset or service the GPU': a GPU off the bus answers no reset (the node
    must be rebooted, as for Xid 79), a corrupted infoROM is not repaired by one."""
    from gptrain.validate import gpus

    nv, _ = fake_nvml(nvmlDeviceGetTemperature=raising(code_name))
    [problem] = nvml.health_problems(nvml.gpu_health(nv, object()))
    assert problem.endswith(f" reading temperature: {remedy}")
    nv, _ = fake_nvml(nvmlDeviceGetHandleByUUID=raising(code_name))
    monkeypatch.setattr(nvml, "load", lambda: nv)
    _, problems = gpus.nvml_health("1234", 0)
    assert len(problems) == 1 and problems[0].endswith(f"): {remedy}")


def test_nvlinks_all_down_on_several_gpus_of_a_model_are_flagged_unless_bridges_explain_them():
    """Since only a lone all-down GPU of its model was flagged, two down together passed: on 8 H100
    SXM GPUs, 5 and 6 down flagged none. Every all-down GPU of a model is flagged now where another
    of its model has links up, unless NVML says those up links reach only GPUs (NVLink bridges, no
    NVSwitch): then the down cards are bridge-less ones. A link whose remote type NVML did not give
    is taken as a switch's (a false fail, never a false pass)."""

    def with_links(r, name, active, remote, n=18):
        links = [
            {"link": k, "active": active, "errors": {}, "remote": remote if active else None}
            for k in range(n)
        ]
        r["nvml"] = {"name": name, "nvlinks": links}
        return r

    sxm = "NVIDIA H100 80GB HBM3"
    for remote in ("switch", None):
        node = [with_links(record(r, "n0", 800, 3000), sxm, r not in (5, 6), remote) for r in range(8)]
        assert [r["rank"] for r in judge(node, Thresholds(slow_pct=10)) if r["flags"]] == [5, 6]
        old_record = [
            with_links(record(r, "n0", 800, 3000), sxm, r not in (5, 6), "switch") for r in range(8)
        ]
        for r in old_record:
            for link in r["nvml"]["nvlinks"]:
                link.pop("remote")  # a gpus.json written before the remote type was read
        assert [r["rank"] for r in judge(old_record, Thresholds(slow_pct=10)) if r["flags"]] == [5, 6]

    pcie = "NVIDIA H100 PCIe"
    bridged = [with_links(record(r, "n1", 800, 3000), pcie, r < 2, "gpu", 12) for r in range(4)]
    assert [r["flags"] for r in judge(bridged, Thresholds(slow_pct=10))] == [[]] * 4
    unknown = [with_links(record(r, "n1", 800, 3000), pcie, r < 2, None, 12) for r in range(4)]
    assert [r["rank"] for r in judge(unknown, Thresholds(slow_pct=10)) if r["flags"]] == [2, 3]


def test_nvml_reads_the_remote_device_type_of_each_active_nvlink():
    import pynvml

    def remote(h, link):
        if link == 1:
            raise NotSupported("Not Supported")
        return pynvml.NVML_NVLINK_DEVICE_TYPE_GPU if link == 0 else pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    nv, _ = fake_nvml(
        nvmlDeviceGetNvLinkState=lambda h, link: (0 if link == 3 else 1) if link < 4 else 1 / 0,
        nvmlDeviceGetNvLinkRemoteDeviceType=remote,
    )
    info = nvml.gpu_health(nv, object())
    assert [link["remote"] for link in info["nvlinks"]] == ["gpu", None, "switch", None]
    assert "nvlink1_remote" in info["unsupported"]


def test_a_dcgmi_4_table_cut_after_a_category_header_fails(monkeypatch):
    """DCGM 4 opens its Hardware, Integration and Stress tests with a header drawn as a border
    ("+-----  Hardware  ---+---+"), and that counted as the closing one: a table cut after it passed
    at exit 226 as a whole Warn-only table. Only a border without words closes it now."""
    rows = [
        ("software", "Warn"),
        ("", "GPU0: Pass"),
        ("", "GPU1: Fail"),
        ("Warning: GPU1", "Persistence mode for GPU 1 is disabled."),
    ]
    for header in ("Hardware", "Integration", "Stress"):
        cut = dcgmi_table(*rows, header).rstrip("\n").rsplit("\n", 1)[0] + "\n"
        assert f"-----  {header}  " in cut.splitlines()[-1]
        result = run_dcgmi(monkeypatch, 226, cut)
        assert result["passed"] is False and result["failures"] == ["dcgmi diag -r 2 exited with status 226"]
    whole = dcgmi_table(*rows, "Hardware", ("memory", "Pass"), ("", "GPU0: Pass"), ("", "GPU1: Pass"))
    result = run_dcgmi(monkeypatch, 226, whole)
    assert result["passed"] is True and result["warnings"] == [
        "software: Warn: Persistence mode for GPU 1 is disabled."
    ]


def with_fabric(rank, node, name, active, fabric=None, n=18):
    """A judged GPU record as NVML gives it: `n` links up or down, the fabric state if read."""
    links = [
        {"link": k, "active": active, "errors": {}, "remote": "switch" if active else None} for k in range(n)
    ]
    r = dict(record(rank, node, 800, 3000), cuda_index=rank % 8, name=name)
    r["nvml"] = {"name": name, "nvlinks": links, "fabric": fabric}
    return r


def test_a_whole_nvswitch_node_with_every_nvlink_down_fails_and_says_start_the_fabric_manager(
    monkeypatch, tmp_path, capsys
):
    """With the fabric manager not running on an HGX A100, no NVLink of any GPU trains: each GPU read
    all links inactive, which passes for a PCIe card, and with no GPU of the node up to judge against
    the node passed. One line names the node and the fabric manager now; PCIe cards and bridged
    H100 NVL pairs without links, a lone GPU, and GH200 are not flagged."""
    import argparse

    from gptrain.validate import fabric, gpus, main

    a100 = "NVIDIA A100-SXM4-80GB"
    records = [with_fabric(r, "n0", a100, False, n=12) for r in range(8)]
    records += [with_fabric(r, "n1", a100, True, n=12) for r in range(8, 16)]
    records += [with_fabric(r, "n2", "NVIDIA H100 PCIe", False) for r in range(16, 20)]
    records += [with_fabric(r, "n3", "NVIDIA H100 NVL", False) for r in range(20, 22)]
    records += [with_fabric(22, "n4", "NVIDIA H100 80GB HBM3", False)]
    records += [with_fabric(r, "n5", "NVIDIA GH200 480GB", False) for r in range(23, 25)]
    monkeypatch.setattr(gpus, "run_gpus", lambda *a: records)
    args = argparse.Namespace(iters=1, warmup=0, dcgm_level=0, xid_since=None, output_dir=str(tmp_path))
    out = main.Outcome()
    main.check_gpus(types.SimpleNamespace(rank=0), args, Thresholds(slow_pct=10), out)
    line = (
        "gpus: n0: all 96 NVLink links of its 8 NVIDIA A100-SXM4-80GB GPU(s) inactive on an NVSwitch board:"
        " the fabric manager is not running (NCCL's traffic falls back to PCIe or fails): " + fabric.START_FM
    )
    assert out.failures == [line] and out.bad_nodes == {"n0"}
    assert line in capsys.readouterr().out.splitlines()


def test_gpus_on_no_fabric_or_one_gpu_shared_by_ranks_are_not_told_to_start_the_fabric_manager():
    """The all-links-down fallback fired whenever no GPU read `completed`: a VM of two H100 SXM
    without NVLink, whose NVML says not_supported (on no fabric), was told to start the fabric
    manager, and two ranks on MIG slices of one A100 counted as two GPUs. It is now only for GPUs
    whose fabric state NVML cannot read (A100), counted by UUID."""
    from gptrain.validate import fabric

    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    no_fabric = {"state": "not_supported", "status": None}
    vm = [with_fabric(r, "vm1", h100, False, dict(no_fabric)) for r in range(2)]
    for r in vm:
        r["nvml"]["uuid"] = f"GPU-{r['rank']}"
    assert fabric.fabric_down(vm) == []
    mig = [with_fabric(r, "n9", a100, False, n=12) for r in range(2)]
    for r in mig:
        r["nvml"]["uuid"] = "GPU-same"
    assert fabric.fabric_down(mig) == []
    mig.append(with_fabric(2, "n9", a100, False, n=12))
    mig[-1]["nvml"]["uuid"] = "GPU-other"
    [(node, line)] = fabric.fabric_down(mig)
    assert node == "n9" and line.startswith(
        "gpus: n9: all 24 NVLink links of its 2 NVIDIA A100-SXM4-80GB GPU(s)"
    )


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA A100-SXM4-80GB", True),
        ("NVIDIA A100-SXM4-40GB", True),
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H200", True),
        ("NVIDIA B200", True),
        ("NVIDIA A100-PCIE-40GB", False),
        ("NVIDIA A100 80GB PCIe", False),
        ("NVIDIA H100 PCIe", False),
        ("NVIDIA H100 NVL", False),
        ("NVIDIA H200 NVL", False),
        ("NVIDIA GH200 480GB", False),
        ("NVIDIA GB200", False),
        ("NVIDIA L40S", False),
    ],
)
def test_nvswitch_boards_are_told_from_pcie_cards_and_bridged_pairs_by_name(name, expected):
    from gptrain.validate import fabric

    assert fabric.is_nvswitch_model(name) is expected


def test_hopper_fabric_state_says_the_fabric_manager_is_not_running_even_with_links_up():
    """An H100's links train on their own (ALI), so a node without its fabric manager can read
    every link active; NVML's fabric state (not_started, in_progress) says what is missing, and a
    registration completed with an error fails too. A completed, registered node passes even with
    its links down (the manager is running: not its fault)."""
    from gptrain.validate import fabric

    h100 = "NVIDIA H100 80GB HBM3"
    waiting = [with_fabric(r, "n0", h100, True, {"state": "not_started", "status": None}) for r in range(8)]
    waiting[3]["nvml"]["fabric"] = {"state": "in_progress", "status": None}
    [(node, line)] = fabric.fabric_down(waiting)
    assert node == "n0" and line == (
        "gpus: n0: NVLink fabric registration in_progress / not_started on its 8 NVIDIA H100 80GB HBM3"
        " GPU(s): the fabric manager is not running: " + fabric.START_FM
    )
    failed = [with_fabric(r, "n1", h100, True, {"state": "completed", "status": 0}) for r in range(8)]
    failed[5]["nvml"]["fabric"] = {"state": "completed", "status": 26}
    [(node, line)] = fabric.fabric_down(failed)
    assert (
        node == "n1" and "registration of its 8 NVIDIA H100 80GB HBM3 GPU(s) failed (NVML status 26)" in line
    )
    registered = [with_fabric(r, "n2", h100, False, {"state": "completed", "status": 0}) for r in range(8)]
    assert fabric.fabric_down(registered) == []


def test_a_fabric_state_not_completed_names_what_to_check_by_the_system():
    """Every fabric state short of completed said "the fabric manager is not running": a GB200
    compute tray runs none (its NVLink switch trays' NMX and the IMEX service drive it), and
    in_progress is also a fabric manager in shared-NVSwitch mode with no partition activated."""
    from gptrain.validate import fabric

    def node(name, state):
        return [with_fabric(r, "n0", name, True, {"state": state, "status": None}) for r in range(4)]

    [(_, rack)] = fabric.fabric_down(node("NVIDIA GB200", "not_started"))
    assert "NMX" in rack and "IMEX" in rack and "not running" not in rack
    assert rack == (
        "gpus: n0: NVLink fabric registration not_started on its 4 NVIDIA GB200 GPU(s): "
        + fabric.CHECK_RACK_FABRIC
    )
    [(_, shared)] = fabric.fabric_down(node("NVIDIA H100 80GB HBM3", "in_progress"))
    assert "partition" in shared and "not running" not in shared and "\n" not in shared
    assert shared == (
        "gpus: n0: NVLink fabric registration in_progress on its 4 NVIDIA H100 80GB HBM3 GPU(s): "
        + fabric.CHECK_PARTITION
    )


class OldFabricInfoV(ctypes.Structure):
    """nvidia-ml-py 12.560..13.580's c_nvmlGpuFabricInfoV_t: clusterUuid 80 bytes, not NVML's 16."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_char * 80), ("status", ctypes.c_uint)]
    _fields_ += [("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint)]

    def __init__(self):
        super().__init__(version=0x02000024)


class OldFabricInfo(ctypes.Structure):
    """nvidia-ml-py's c_nvmlGpuFabricInfo_t before 13.615.71: clusterUuid 80 bytes."""

    _fields_ = [("clusterUuid", ctypes.c_char * 80), ("status", ctypes.c_uint)]
    _fields_ += [("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint)]


def fabric_driver(state, status=0, versioned=True):
    """pynvml's fabric calls over a fake driver that writes status, cliqueId, state where NVML's C
    structs hold them (v2: at 20, 24, 28 after its version; v1: at 16, 20, 24), as the driver does."""
    import pynvml

    def write(ref, offset):
        raw = struct.pack("<3I", status, 7, state)
        ctypes.memmove(ctypes.addressof(ref._obj) + offset, raw, len(raw))
        return 0

    def get_v(h, ref):
        version = ctypes.c_uint.from_address(ctypes.addressof(ref._obj)).value
        return write(ref, 20) if version == 0x02000024 else pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

    drivers = {"nvmlDeviceGetGpuFabricInfo": lambda h, ref: write(ref, 16)}
    if versioned:
        drivers["nvmlDeviceGetGpuFabricInfoV"] = get_v

    def lookup(name):
        if name not in drivers:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return drivers[name]

    def wrapper(name):  # pynvml's: look the function up, call it, raise on its return code
        return lambda h, ref: pynvml._nvmlCheckReturn(lookup(name)(h, ref))

    return {
        "_nvmlGetFunctionPointer": lookup,
        "NVMLError": pynvml.NVMLError,
        "c_nvmlGpuFabricInfoV_t": OldFabricInfoV,
        "c_nvmlGpuFabricInfo_t": OldFabricInfo,
        "nvmlDeviceGetGpuFabricInfoV": wrapper("nvmlDeviceGetGpuFabricInfoV"),
        "nvmlDeviceGetGpuFabricInfo": wrapper("nvmlDeviceGetGpuFabricInfo"),
    }


@pytest.mark.parametrize("versioned", [True, False])
def test_nvml_reads_the_fabric_state_where_the_driver_writes_it_whatever_nvidia_ml_py(versioned):
    """nvidia-ml-py 12.535..13.580 declares the fabric structs with an 80-byte clusterUuid (NVML's
    is 16): the driver's state landed where those classes do not read, so a GPU whose fabric manager
    is not running read not_supported and its node passed. NVML's C layout is read now, by the
    versioned call (R550) or, on an older driver, the first one."""
    import pynvml

    nv, _ = fake_nvml(**fabric_driver(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, versioned=versioned))
    assert nvml.gpu_health(nv, object())["fabric"] == {"state": "not_started", "status": None}
    nv, _ = fake_nvml(**fabric_driver(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 26, versioned=versioned))
    assert nvml.gpu_health(nv, object())["fabric"] == {"state": "completed", "status": 26}


def test_the_fabric_info_structs_have_nvml_h_layout():
    from gptrain.validate import fabric_info

    assert ctypes.sizeof(fabric_info.FabricInfo) == 28 and fabric_info.FabricInfo.state.offset == 24
    assert ctypes.sizeof(fabric_info.FabricInfoV2) == 0x24 and fabric_info.FabricInfoV2.state.offset == 28
    assert fabric_info.FABRIC_INFO_V2 == 0x02000024  # nvml.h's nvmlGpuFabricInfo_v2


def test_a_gpu_without_the_fabric_calls_reads_unsupported_and_passes():
    import pynvml

    def not_supported(h, ref):
        return pynvml.NVML_ERROR_NOT_SUPPORTED

    nv, _ = fake_nvml(_nvmlGetFunctionPointer=lambda name: not_supported, NVMLError=pynvml.NVMLError)
    info = nvml.gpu_health(nv, object())
    assert info["fabric"] is None and info["unsupported"]["fabric"] == "Not Supported"
    assert nvml.health_problems(info) == []
    nv, _ = fake_nvml()  # nvidia-ml-py without the lookup: unsupported, no failure
    info = nvml.gpu_health(nv, object())
    assert info["fabric"] is None and "fabric" in info["unsupported"] and nvml.health_problems(info) == []


DISCOVERY = """8 GPUs found.
+--------+----------------------------------------------------------------------+
| GPU ID | Device Information                                                   |
+--------+----------------------------------------------------------------------+
{rows}+--------+----------------------------------------------------------------------+
"""


def discovery_text(uuids):
    """`dcgmi discovery -l` as DCGM prints it: each GPU's id, then its name, bus and UUID rows."""
    rows = ""
    for gpu, uuid in enumerate(uuids):
        rows += f"| {gpu:<6} | {'Name: NVIDIA H100 80GB HBM3':<68} |\n"
        rows += f"|        | {f'PCI Bus ID: 00000000:{gpu:02X}:00.0':<68} |\n"
        rows += f"|        | {'Device UUID: ' + uuid:<68} |\n"
        rows += "+--------+----------------------------------------------------------------------+\n"
    return DISCOVERY.format(rows=rows)


NODE_UUIDS = [f"GPU-{gpu:08x}-4cd8-8d01-0310-79f2720f37de" for gpu in range(8)]


def test_dcgmi_diag_is_given_the_dcgm_ids_of_the_jobs_own_gpus_on_a_shared_node(monkeypatch):
    """dcgmi diag ran without -i: on a node shared with other jobs it tested (from level 2, loaded)
    their GPUs too. The GPUs this job's ranks use there are matched by UUID to the ids `dcgmi
    discovery -l` gives (the host engine's: inside a cgroup-confined job the job's GPU 0 may be the
    node's GPU 5), and dcgmi diag is given them; without the job's GPUs named in its environment, or
    with a UUID unread, it runs on all as before."""
    from gptrain.validate import dcgm_gpus, gpus

    calls = []

    def run(command, **kwargs):
        calls.append(command)
        out = discovery_text(NODE_UUIDS) if command[1] == "discovery" else dcgmi_table(("Memory", "Pass"))
        return types.SimpleNamespace(returncode=0, stdout=out, stderr="")

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/dcgmi")
    monkeypatch.setattr(gpus.subprocess, "run", run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    mine = [NODE_UUIDS[5].upper(), NODE_UUIDS[2]]
    result = dcgm_gpus.node_dcgm_diag(2, mine)
    assert calls == [["dcgmi", "discovery", "-l"], ["dcgmi", "diag", "-r", "2", "-i", "2,5"]]
    assert result["passed"] and result["command"] == "dcgmi diag -r 2 -i 2,5"

    for unknown in ([NODE_UUIDS[5], None], []):
        calls.clear()
        dcgm_gpus.node_dcgm_diag(2, unknown)
        assert calls == [["dcgmi", "diag", "-r", "2"]]
    for key in dcgm_gpus.JOB_GPU_ENV:
        monkeypatch.delenv(key, raising=False)
    calls.clear()
    dcgm_gpus.node_dcgm_diag(2, mine)
    assert calls == [["dcgmi", "diag", "-r", "2"]]


def test_a_job_gpu_dcgm_does_not_list_is_not_replaced_by_testing_the_whole_node(monkeypatch):
    from gptrain.validate import dcgm_gpus, gpus

    calls = []

    def run(command, **kwargs):
        calls.append(command)
        return types.SimpleNamespace(returncode=0, stdout=discovery_text(NODE_UUIDS[:4]), stderr="")

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/dcgmi")
    monkeypatch.setattr(gpus.subprocess, "run", run)
    monkeypatch.setenv("SLURM_STEP_GPUS", "6")
    result = dcgm_gpus.node_dcgm_diag(3, [NODE_UUIDS[6]])
    assert calls == [["dcgmi", "discovery", "-l"]] and result["ran"] is False
    records = [dict(record(0, "n7", 800, 3000), dcgm=result)]
    assert dcgm_gpus.dcgm_skipped_lines(records) == [
        f"gpus: n7: dcgmi diag `dcgmi discovery -l` does not list this job's GPU(s) {NODE_UUIDS[6]}: not run,"
        " as without -i it would test every GPU of the node, other jobs' too; run `dcgmi diag` there by hand"
    ]


def test_a_timed_out_dcgmi_on_the_jobs_gpus_names_the_command_to_rerun(monkeypatch):
    import subprocess

    from gptrain.validate import gpus

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/dcgmi")

    def stuck(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output="")

    monkeypatch.setattr(gpus.subprocess, "run", stuck)
    [why] = gpus.dcgm_diag(2, gpu_ids=[1, 6])["failures"]
    assert (
        why.startswith("dcgmi diag -r 2 -i 1,6 did not finish in 1200 s")
        and "run `dcgmi diag -r 2 -i 1,6`" in why
    )


def test_no_cuda_gpu_on_a_node_whose_fabric_manager_is_down_says_so(monkeypatch, tmp_path):
    """On an NVSwitch board CUDA does not start before the fabric manager registers the GPUs
    (cudaErrorSystemNotReady): validate saw no CUDA GPU and said only that Slurm gave the job some.
    NVML still reads the GPUs: their fabric state not started now names the fabric manager."""
    import pynvml

    from gptrain.validate import fabric, main, runtime

    nv, _ = fake_nvml(
        **fabric_driver(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED),
        nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda i: i,
    )
    monkeypatch.setattr(nvml, "load", lambda: nv)
    monkeypatch.setattr(runtime, "gather_objects", lambda obj, group=None: [obj])
    out = main.Outcome()
    ctx = types.SimpleNamespace(rank=0, node="n3")
    main.no_gpu(ctx, "Slurm gave the job GPUs (SLURM_JOB_GPUS=0-7)", tmp_path / "gpus.json", out)
    assert out.failures == [
        "gpus: no CUDA GPU visible on n3, but Slurm gave the job GPUs (SLURM_JOB_GPUS=0-7); NVML: NVLink fabric"
        " registration not_started on its 8 NVIDIA H100 80GB HBM3 GPU(s): the fabric manager is not running: "
        + fabric.START_FM
    ]
    monkeypatch.setattr(nvml, "load", raising("NVML_ERROR_LIBRARY_NOT_FOUND"))
    out = main.Outcome()
    main.no_gpu(ctx, "Slurm gave the job GPUs (SLURM_JOB_GPUS=0-7)", tmp_path / "gpus.json", out)
    assert out.failures == [
        "gpus: no CUDA GPU visible on n3, but Slurm gave the job GPUs (SLURM_JOB_GPUS=0-7)"
    ]
