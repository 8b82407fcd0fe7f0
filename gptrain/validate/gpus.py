"""Per-GPU checks: NVML health, a bf16 matmul rate and a copy bandwidth measured on the spot,
and `dcgmi diag` where DCGM is installed. Each rank checks its own GPU; rank 0 compares them.

The matmul rate counts 2 n^3 FLOPs per n x n product; the copy bandwidth counts the bytes
read plus the bytes written (2 x size per copy), as memory-bandwidth figures usually do.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch

from gptrain.validate import nvml
from gptrain.validate.dcgm_gpus import node_dcgm_diag
from gptrain.validate.runtime import Context, gather_objects, synchronize
from gptrain.validate.thresholds import Thresholds

MATMUL_N = 8192
COPY_BYTES = 1 << 30
# dcgmi diag's suites (DCGM's dcgmi-diag reference): how long each usually takes, and how long
# dcgmi is given (about four times that) before the node is failed as stuck
DCGM_USUAL = {1: "seconds", 2: "about 2 minutes", 3: "about 15 to 30 minutes", 4: "an hour or more"}
DCGM_LIMIT_S = {1: 600.0, 2: 1200.0, 3: 7200.0, 4: 4 * 3600.0}
DCGM_NVVS_ERROR_EXIT = 226  # dcgmi's exit status for DCGM_ST_NVVS_ERROR (-30)


def seconds_per_call(call: Callable[[], Any], device: torch.device, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    synchronize(device)
    return (time.perf_counter() - start) / iters  # the CLI requires iters >= 1


def matmul_tflops(device: torch.device, iters: int, warmup: int, n: int = MATMUL_N) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    seconds = seconds_per_call(lambda: torch.matmul(a, b, out=out), device, iters, warmup)
    return 2 * n**3 / seconds / 1e12


def copy_GBps(device: torch.device, iters: int, warmup: int, nbytes: int = COPY_BYTES) -> float:
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = seconds_per_call(lambda: dst.copy_(src), device, iters, warmup)
    return 2 * nbytes / seconds / 1e9


def dcgm_limit_s(level: int) -> float:
    """Seconds `dcgmi diag -r level` may run (0 for level 0: not run)."""
    return DCGM_LIMIT_S.get(level, 0.0)


def dcgm_diag(level: int, timeout_s: float | None = None, gpu_ids: list[int] | None = None) -> dict[str, Any]:
    """`dcgmi diag -r level` on this node (on DCGM's GPUs `gpu_ids`, else all): passed, the failing
    lines, the warning ones, the tail of its output."""
    if level <= 0:
        return {"ran": False, "reason": "--dcgm-level 0"}
    if shutil.which("dcgmi") is None:
        return {"ran": False, "reason": "dcgmi not installed"}
    limit = dcgm_limit_s(level) if timeout_s is None else timeout_s
    command = ["dcgmi", "diag", "-r", str(level)] + (["-i", ",".join(map(str, gpu_ids))] if gpu_ids else [])
    shown = shlex.join(command)
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as error:
        tail = (
            error.output.decode(errors="replace") if isinstance(error.output, bytes) else error.output or ""
        )
        why = (
            f"{shown} did not finish in {limit:g} s (level {level} usually takes"
            f" {DCGM_USUAL[level]}): DCGM or a GPU of this node is stuck; run `{shown}`"
            " there by hand, or pass a lower --dcgm-level"
        )
        return {"ran": True, "passed": False, "failures": [why], "tail": tail[-4000:]}
    except OSError as error:
        why = f"{shown} could not be started: {error}"
        return {"ran": True, "passed": False, "failures": [why], "tail": ""}
    text = out.stdout + out.stderr
    table = dcgm_table(text)
    failures, warnings = table.failures(), table.warnings()
    if out.returncode != 0 and not failures and not dcgm_only_warned(out.returncode, table):
        # no table (dcgmi's own "Error:" lines say why), or one that does not explain the status
        why = f": {'; '.join(table.errors)}" if table.errors else ""
        failures = [f"{shown} exited with status {out.returncode}{why}"]
    return {
        "ran": True,
        "command": shown,
        "passed": not failures,
        "failures": failures,
        "warnings": warnings,
        "tail": text[-4000:],
    }


def dcgm_only_warned(returncode: int, table: DcgmTable) -> bool:
    """DCGM 4 exits DCGM_ST_NVVS_ERROR for any error of a software test or a GPU, a Warn's too
    (Diag.cpp's GetFailureResult): that status with a whole table of Warn, Pass and Skip passes.
    Any other status (an isolate error, 205), a table cut short or dcgmi's own "Error:" lines beside
    it do not."""
    return returncode == DCGM_NVVS_ERROR_EXIT and table.closed and not table.errors and bool(table.warnings())


# A row of dcgmi diag's table ("| name | result or text |") and a test's result in it (DCGM's Diag.cpp:
# Pass, Fail, Warn, Skip or Not Run, for all GPUs or followed by the GPUs it names).
DCGM_ROW = re.compile(r"^\|([^|]*)\|([^|]*)\|\s*$")
# The closing border; DCGM 4's category headers ("+-----  Hardware  ---+---+") are drawn alike but
# name their category, and a table cut after one is not closed.
DCGM_BORDER = re.compile(r"\+-+\+-+\+")
DCGM_RESULT = re.compile(r"^(Pass|Fail|Warn|Skip|Not Run)\b")
# DCGM 4 adds a row per entity under its test's, "{group}{id}: {result}" (GPU0, CPU0, GPU_I0,
# Switch0; a Not Run is blank before 4.6), and names the entity beside "Warning".
DCGM_ENTITY = re.compile(r"^\w+\d+:\s*(Pass|Fail|Warn|Skip|Not Run)?$")
DCGM_REASONS = ("Warning", "Error")
DCGM_WRAP = 45  # Diag.cpp's DATA_INFO_TAG_LEN: the characters of a reason shown a row


def dcgm_piece(cell: str) -> str:
    """A piece of a wrapped reason as dcgmi cut it: without the space that opens its cell and the
    padding after, but with a space it starts or ends with (the whole reason is stripped once)."""
    return (cell[1:] if cell.startswith(" ") else cell)[:DCGM_WRAP]


@dataclasses.dataclass
class DcgmTest:
    """One test of dcgmi diag's table: its own result rows ("Fail", DCGM 3's "Fail - GPU: 3"),
    DCGM 4's rows of its entities ("GPU1: Fail") and its Warning/Error texts as dcgmi cut them."""

    own: list[str] = dataclasses.field(default_factory=list)
    entities: list[str] = dataclasses.field(default_factory=list)
    reasons: list[str] = dataclasses.field(default_factory=list)

    def failing(self) -> str | None:
        """The row that fails the test. DCGM 4.0 to 4.6 print an entity's Warn as "Fail", so under
        a test whose own row says Warn its entity rows do not fail it."""
        warned = any(dcgm_result(row) == "Warn" for row in self.own)
        rows = self.own if warned else self.own + self.entities
        return next((row for row in rows if dcgm_result(row) == "Fail"), None)

    def warning(self) -> str | None:
        """The row saying the test warned, where it does not fail."""
        if self.failing() is not None:
            return None
        return next((row for row in self.own if dcgm_result(row) == "Warn"), None)

    def line(self, row: str) -> str:
        """The row, then each reason unwrapped."""
        return row + "".join(f": {why.strip()}" for why in self.reasons)


def dcgm_result(row: str) -> str | None:
    """Pass, Fail, Warn, Skip or Not Run of a test's own row or an entity's (None: a blank one)."""
    match = DCGM_RESULT.match(row) or DCGM_ENTITY.match(row)
    return match[1] if match else None


@dataclasses.dataclass
class DcgmTable:
    """dcgmi diag's table: its tests in order, whether a border closed it after the last, and
    dcgmi's own "Error:" lines outside it."""

    tests: dict[str, DcgmTest] = dataclasses.field(default_factory=dict)
    closed: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)

    def failures(self) -> list[str]:
        return [f"{name}: {t.line(row)}" for name, t in self.tests.items() if (row := t.failing())]

    def warnings(self) -> list[str]:
        return [f"{name}: {t.line(row)}" for name, t in self.tests.items() if (row := t.warning())]


def dcgm_table(text: str) -> DcgmTable:
    """Read dcgmi diag's table. dcgmi wraps a reason every 45 characters, mid-word or at a space,
    so its pieces are joined as they are."""
    table = DcgmTable()
    test = reason = None
    for line in text.splitlines():
        line = line.strip()
        row = DCGM_ROW.match(line)
        if row is None:
            table.closed = table.closed or DCGM_BORDER.fullmatch(line) is not None
            if line.startswith("Error"):
                table.errors.append(line)
            continue
        name, info = row[1].strip(), row[2].strip()
        entity = None if name else DCGM_ENTITY.match(info)
        if DCGM_RESULT.match(info) or entity:
            test = table.tests.setdefault(name, DcgmTest()) if name else test
            reason = None
            if test is not None:
                (test.entities if entity else test.own).append(info)
                table.closed = False
        elif name.split(":")[0] in DCGM_REASONS and test is not None:
            reason = test
            reason.reasons.append(dcgm_piece(row[2]))
        elif not name and reason is not None:
            reason.reasons[-1] += dcgm_piece(row[2])
        else:  # a metadata row or the header: no test's
            test = reason = None
    return table


def dcgm_failures(text: str) -> list[str]:
    """`test: Fail ...: reason` for each test of dcgmi diag's table whose result is Fail. A Warn or
    Skip passes even where its warning text says "fail"."""
    return dcgm_table(text).failures()


def nvml_health(cuda_uuid: str | None, index: int) -> tuple[dict[str, Any], list[str]]:
    """This GPU's NVML record and its problems. NVML unavailable or a GPU it cannot find is
    reported (`error`), not failed; a GPU NVML says is broken (lost, needing a reset) fails."""
    try:
        nv = nvml.load()
        handle = nvml.handle_for(nv, cuda_uuid, index)
        info = nvml.gpu_health(nv, handle)
    except Exception as error:
        fault = nvml.fault_of(error)
        problems = [nvml.fault_problem(f"{error} ({fault})")] if fault else []
        return {"error": f"{type(error).__name__}: {error}"}, problems
    return info, nvml.health_problems(info)


def check_local_gpu(
    ctx: Context, iters: int, warmup: int, dcgm_level: int, xid_since_s: float | None = None
) -> dict[str, Any]:
    """This rank's GPU: identity, NVML health, measured rates; DCGM on one rank per node, once
    every rank has measured."""
    index = ctx.device.index or 0
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)  # 8-4-4-4-12 hex, NVML's name without its GPU-/MIG- prefix
    record: dict[str, Any] = {"rank": ctx.rank, "node": ctx.node, "cuda_index": index, "name": props.name}
    record["nvml"], record["problems"] = nvml_health(None if uuid is None else str(uuid), index)
    record["matmul_bf16_tflops"] = matmul_tflops(ctx.device, iters, warmup)
    record["copy_GBps"] = copy_GBps(ctx.device, iters, warmup)
    torch.cuda.empty_cache()
    # dcgmi diag -r 2 and up loads its GPUs: not while one is timed (the gather waits for every rank)
    mine = gather_objects((ctx.node, record["nvml"].get("uuid"))) if dcgm_level > 0 else []
    if ctx.world.local_rank == 0:
        record["dcgm"] = node_dcgm_diag(dcgm_level, [uuid for node, uuid in mine if node == ctx.node])
        record["xid"] = nvml.xid_events(xid_since_s)
    return record


def unread_note(record: dict[str, Any]) -> str:
    """Said after a GPU's verdict when its NVML health was not read: 'ok' covers only the rates."""
    error = (record.get("nvml") or {}).get("error")
    return f" (NVML health not checked: {error})" if error else ""


def gpu_label(record: dict[str, Any]) -> str:
    """The GPU as nvidia-smi and the Xid lines name it (NVML index, PCI address), then CUDA's index:
    under one GPU per task every rank's GPU is cuda:0."""
    info = record.get("nvml") or {}
    cuda = f"cuda:{record['cuda_index']}"
    if info.get("index") is None and not info.get("pci_bus_id"):
        return cuda
    index = "?" if info.get("index") is None else info["index"]
    pci = f" PCI {nvml.pci_key(info['pci_bus_id'])}" if info.get("pci_bus_id") else ""
    return f"GPU {index}{pci} ({cuda})"


def gpu_line(r: dict[str, Any]) -> str:
    """One judged GPU's line: who, which GPU, its rates and its flags (or ok)."""
    return (
        f"gpus: rank {r['rank']} {r['node']} {gpu_label(r)} {r['name']}: "
        f"{r['matmul_bf16_tflops']:.0f} TFLOP/s bf16, {r['copy_GBps']:.0f} GB/s copy:"
        f" {'; '.join(r['flags']) or 'ok'}{unread_note(r)}"
    )


def judge(records: list[dict[str, Any]], limits: Thresholds) -> list[dict[str, Any]]:
    """Add each GPU's `flags`: NVML problems, DCGM failures, rates below the median or the profile."""
    medians = {key: statistics.median(r[key] for r in records) for key in ("matmul_bf16_tflops", "copy_GBps")}
    floors = {"matmul_bf16_tflops": limits.matmul_tflops, "copy_GBps": limits.copy_GBps}
    units = {"matmul_bf16_tflops": "TFLOP/s bf16 matmul", "copy_GBps": "GB/s copy"}
    links_down = nvlinks_down_alone(records)
    for r in records:
        flags = list(r.get("problems") or [])
        if r["rank"] in links_down:
            flags.append(
                f"all {len(_nvlinks(r))} NVLink links inactive while other GPUs of its model on {r['node']} have"
                " theirs up:"
                " its traffic to them falls back to PCIe (check nvidia-smi nvlink -s; reset the GPU or"
                " service it)"
            )
        for key, median in medians.items():
            if median and r[key] < median * (1 - limits.slow_pct / 100):
                flags.append(
                    f"{r[key]:.0f} {units[key]} is {100 * (1 - r[key] / median):.0f}% below the median {median:.0f}"
                )
            if floors[key] is not None and r[key] < floors[key]:
                flags.append(f"{r[key]:.0f} {units[key]} below the profile's {floors[key]:.0f}")
        dcgm = r.get("dcgm") or {}
        if dcgm.get("ran") and not dcgm.get("passed"):
            flags.append("dcgmi diag failed: " + "; ".join(dcgm.get("failures") or ["see gpus.json"]))
        r["flags"] = flags
    return records


def dcgm_warning_lines(records: list[dict[str, Any]]) -> list[str]:
    """A line for each test dcgmi diag says warned on a node: they do not fail it, but are told."""
    return [
        f"gpus: {r['node']}: dcgmi diag warned (the node passes): {warning}"
        for r in records
        for warning in (r.get("dcgm") or {}).get("warnings") or []
    ]


def nvlinks_down_alone(records: list[dict[str, Any]]) -> set[int]:
    """The ranks of GPUs whose NVLinks are all inactive while another GPU of their model on their
    node has some up. A GPU reads every link inactive where it has no NVLink in use (a PCIe card
    without a bridge beside a bridged pair; a display GPU of another model), so the down ones are
    let pass only where NVML names every up link's remote device of their model a GPU (bridges, no
    NVSwitch); a remote not read counts as a switch, a false fail rather than a false pass. Where
    GPUs link to each other directly (a mesh), a dead GPU leaves its peers' links to it down, which
    nvml.health_problems fails (some links down); a bridged pair whose bridge is gone reads as two
    bridge-less cards and passes."""
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for r in records:
        if _nvlinks(r):  # NVML read it
            model = (r.get("nvml") or {}).get("name") or r.get("name")
            groups.setdefault((r["node"], model), []).append(r)
    ranks = set()
    for group in groups.values():
        up = [link for r in group for link in _nvlinks(r) if link["active"]]
        down = [r["rank"] for r in group if not any(link["active"] for link in _nvlinks(r))]
        if up and not all(link.get("remote") == "gpu" for link in up):
            ranks.update(down)
    return ranks


def _nvlinks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The NVLink links NVML read for a GPU's record (none where NVML was not read)."""
    return (record.get("nvml") or {}).get("nvlinks") or []


def gpus_expected(limits: Thresholds, asked: bool, env: Mapping[str, str] = os.environ) -> str | None:
    """Why this job should see a GPU (then none visible is a failure), or None (a CPU machine)."""
    if asked:
        return "--expect-gpus was given"
    if limits.matmul_tflops is not None or limits.copy_GBps is not None:
        return f"the profile {limits.profile} sets GPU thresholds"
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        if env.get(key, "").strip() not in ("", "0"):
            return f"Slurm gave the job GPUs ({key}={env[key]})"
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible not in ("", "-1", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible}"
    return None


def run_gpus(
    ctx: Context, iters: int, warmup: int, dcgm_level: int, xid_since_s: float | None = None
) -> list[dict[str, Any]] | None:
    """Every rank's record (rank 0 gets them all), or None on a machine without a CUDA GPU.

    The records are gathered in a group that waits --timeout plus dcgmi's own limit: the ranks
    that do not run dcgmi wait there for those that do (a level 3 takes longer than the default
    --timeout, and they would have named the node running it as hung)."""
    if not ctx.is_gpu:
        return None
    group = None
    if dcgm_level > 0:
        import torch.distributed as dist

        group = dist.new_group(timeout=ctx.timeout + timedelta(seconds=dcgm_limit_s(dcgm_level)))
        if ctx.rank == 0 and dcgm_level >= 3:
            print(
                f"gpus: dcgmi diag -r {dcgm_level} on each node: it usually takes {DCGM_USUAL[dcgm_level]}"
                f" (given up after {dcgm_limit_s(dcgm_level):g} s)",
                flush=True,
            )
    return gather_objects(check_local_gpu(ctx, iters, warmup, dcgm_level, xid_since_s), group=group)
