"""What a GPU and a cluster offer the planner: memory, peak rates, link bandwidths.

Bandwidths are GB/s per GPU in one direction, the figure a ring collective is limited by
(a datasheet's "900 GB/s NVLink" counts both directions). A cluster profile
(configs/cluster/<name>.yaml) may carry a `plan:` block with `gpu`, `intra_node_GBps` and
`inter_node_GBps`; its `gpus_per_node` (else its gres's GPU count) is the default for
--gpus-per-node.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from gptrain.config.nemo_launcher import read_slurm_launcher_keys
from gptrain.config.yamlio import load_file
from gptrain.errors import ConfigError
from gptrain.launch.cluster_profiles import cluster_profile_path
from gptrain.launch.sbatch_directives import node_gpus
from gptrain.launch.sections import check_cluster_file_keys


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator as the planner sees it."""

    name: str
    memory_gib: float
    """Device memory the allocator can use (what torch.cuda.mem_get_info reports as total)."""
    bf16_tflops: float
    """Dense bf16/fp16 tensor peak; MFU is measured against it."""
    fp8_tflops: float | None
    """Dense fp8 tensor peak (None: no fp8 tensor cores)."""
    intra_node_GBps: float
    """GPU-to-GPU inside a node, per GPU, one direction (NVLink through NVSwitch)."""
    inter_node_GBps: float
    """Across nodes, per GPU, one direction (one InfiniBand/EFA NIC per GPU)."""
    source: str
    fp32_tflops: float | None = None
    """Plain fp32 peak (gptrain leaves TF32 off: trainer.precision=32 is true fp32, and its MFU is
    measured against this); None: half the bf16 peak."""


GPUS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec(
        "h100-80gb",
        79.1,
        989.4,
        1978.9,
        450.0,
        50.0,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, 989.4 bf16 / 1,978.9 fp8 / 66.9 fp32 "
        "dense TFLOP/s, NVLink 900 GB/s both ways); DGX H100: one 400 Gb/s ConnectX-7 NIC per GPU",
        66.9,
    ),
    "h200-141gb": GpuSpec(
        "h200-141gb",
        139.8,
        989.4,
        1978.9,
        450.0,
        50.0,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e at 4.8 TB/s, the H100 SXM's 989.4 bf16 /"
        " 1,978.9 fp8 / 66.9 fp32 dense TFLOP/s, NVLink 900 GB/s both ways); DGX H200: one 400 Gb/s"
        " ConnectX-7 NIC per GPU. Memory: CUDA's total global memory, 139.81 GiB of nvidia-smi's"
        " 143,771 MiB (as vLLM's profiler logs it on an H200, total_gpu_memory)",
        66.9,
    ),
    "b200-180gb": GpuSpec(
        "b200-180gb",
        178.3,
        2250.0,
        4500.0,
        900.0,
        50.0,
        "NVIDIA HGX B200 datasheet (180 GB HBM3e; 4.5 PFLOP/s bf16 and 9 fp8 with sparsity: 2,250 and"
        " 4,500 dense; 75 fp32; NVLink 5 1.8 TB/s both ways); DGX B200: one 400 Gb/s ConnectX-7 NIC per"
        " GPU. Memory: CUDA's total global memory, 178.35 GiB of nvidia-smi's 183,359 MiB (as reported in"
        " pytorch/ao#4002)",
        75.0,
    ),
    "a100-80gb": GpuSpec(
        "a100-80gb",
        79.2,
        312.0,
        None,
        300.0,
        25.0,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB HBM2e, 312 bf16 / 19.5 fp32 dense TFLOP/s, "
        "NVLink 600 GB/s both ways); DGX A100: one 200 Gb/s HDR InfiniBand NIC per GPU",
        19.5,
    ),
    "a100-40gb": GpuSpec(
        "a100-40gb",
        39.4,
        312.0,
        None,
        300.0,
        25.0,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB HBM2, 312 bf16 / 19.5 fp32 dense TFLOP/s, "
        "NVLink 600 GB/s both ways); DGX A100: one 200 Gb/s HDR InfiniBand NIC per GPU",
        19.5,
    ),
    "cpu": GpuSpec(
        "cpu",
        8.0,
        0.05,
        None,
        1.0,
        1.0,
        "nominal: one CPU process with 8 GiB and ~50 GFLOP/s, gloo over loopback; for trials "
        "on a workstation, where --measure replaces the guesses",
        0.05,
    ),
}


@dataclass(frozen=True)
class Cluster:
    """The machines a plan is for."""

    nodes: int
    gpus_per_node: int
    gpu: GpuSpec

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def gpu_spec(name: str) -> GpuSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError(f"--gpu {name!r} is not known; use one of {', '.join(GPUS)}") from None


PLAN_KEYS = ("gpu", "intra_node_GBps", "inter_node_GBps")
"""The keys of a cluster file's `plan:` block."""


def cluster_profile(name: str) -> dict:
    """`gpus_per_node` (else its gres's GPU count) and the `plan:` block of configs/cluster/<name>.yaml
    (or a path)."""
    path = cluster_profile_path(name, "--cluster")
    data = load_file(path) or {}  # a malformed or non-UTF-8 file: one line naming it
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping (a cluster config)")
    read_slurm_launcher_keys(data, f"{path}: ")  # NeMo's num_gpus is its gpus_per_node
    # a misspelt plan: or gpus_per_node: planned for the default 8 H100s a node
    check_cluster_file_keys(data, path, "plan", set(PLAN_KEYS))
    plan = data.get("plan") or {}
    if not isinstance(plan, dict):
        raise ConfigError(f"{path}: 'plan' must be a mapping (gpu, intra_node_GBps, inter_node_GBps)")
    _check_plan_block(plan, path)
    # read as the launcher and `gptrain validate` read it ("4" is 4; null: its gres's count, gpu:a100:4)
    return {"gpus_per_node": node_gpus(data, f"{path}: "), **plan}


def _check_plan_block(plan: dict, path: Path) -> None:
    """A misspelt key, an unknown GPU or a link rate that is no positive number is refused naming
    the file and key: a typo was ignored and a negative rate made the step faster than its compute."""
    for key, value in plan.items():
        if value is None and key in PLAN_KEYS:
            continue  # null: the GPU's own figure
        if key == "gpu":
            if not isinstance(value, str) or value not in GPUS:
                raise ConfigError(f"{path}: plan.gpu={value!r} is not known; use one of {', '.join(GPUS)}")
        elif key in ("intra_node_GBps", "inter_node_GBps"):
            try:
                number = math.nan if isinstance(value, bool) else float(value)
            except (TypeError, ValueError):
                number = math.nan
            if not 0 < number < math.inf:  # nan is not > 0
                raise ConfigError(
                    f"{path}: plan.{key} must be a positive number of GB/s per GPU, got {value!r}"
                )
        else:
            raise ConfigError(f"{path}: unknown key plan.{key}; known: gpu, inter_node_GBps, intra_node_GBps")


def build_cluster(
    nodes: int, gpus_per_node: int | None, gpu: str | None, profile: str | None = None
) -> Cluster:
    """Command-line values win over the profile's; the profile's over the defaults (1 x 8 H100)."""
    defaults = cluster_profile(profile) if profile else {}
    spec = gpu_spec(gpu or defaults.get("gpu") or "h100-80gb")
    links = {
        k: float(defaults[k]) for k in ("intra_node_GBps", "inter_node_GBps") if defaults.get(k) is not None
    }
    spec = dataclasses.replace(spec, **links)
    per_node = gpus_per_node if gpus_per_node is not None else defaults.get("gpus_per_node")
    if per_node is None:
        per_node = 1 if spec.name == "cpu" else 8
    for key, value in (("--nodes", nodes), ("--gpus-per-node", per_node)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a positive integer")
    return Cluster(nodes=nodes, gpus_per_node=int(per_node), gpu=spec)


def cluster_overrides(cluster: Cluster) -> list[str]:
    """The trainer keys that make the config's world the cluster's."""
    accelerator = "cpu" if cluster.gpu.name == "cpu" else "gpu"
    return [
        f"trainer.num_nodes={cluster.nodes}",
        f"trainer.devices={cluster.gpus_per_node}",
        f"trainer.accelerator={accelerator}",
    ]
