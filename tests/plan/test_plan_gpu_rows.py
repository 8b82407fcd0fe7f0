"""The planner's H200 and B200 rows against their datasheets' figures, worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.plan.hardware import GPUS, Cluster, gpu_spec
from gptrain.plan.memory import GIB
from gptrain.plan.rank import evaluate
from gptrain.plan.spec import layout_from_config, workload_from_config
from gptrain.plan.time import rank_busy_seconds, rank_flops, recomputed_flops


@pytest.mark.parametrize(
    ("name", "memory_gib", "bf16", "fp8", "fp32", "intra", "inter"),
    [
        # SXM H200: 141 GB HBM3e at 4.8 TB/s, the H100 SXM's Tensor Cores (989.4 / 1,978.9 dense),
        # NVLink 900 GB/s both ways; DGX H200: a 400 Gb/s NIC per GPU. CUDA's total of an H200 whose
        # nvidia-smi shows 143,771 MiB: 139.81 GiB (vLLM's profiler log, total_gpu_memory).
        ("h200-141gb", 139.8, 989.4, 1978.9, 66.9, 450.0, 50.0),
        # HGX B200: 4.5 PFLOP/s bf16 and 9 fp8 with sparsity -> 2,250 and 4,500 dense; 75 fp32; NVLink 5
        # 1.8 TB/s both ways; DGX B200: a 400 Gb/s NIC per GPU; CUDA's 178.35 GiB of nvidia-smi's 183,359 MiB.
        ("b200-180gb", 178.3, 2250.0, 4500.0, 75.0, 900.0, 50.0),
    ],
)
def test_h200_and_b200_rows_carry_their_datasheet_figures(name, memory_gib, bf16, fp8, fp32, intra, inter):
    spec = gpu_spec(name)
    figures = (spec.memory_gib, spec.bf16_tflops, spec.fp8_tflops, spec.fp32_tflops)
    assert figures == (memory_gib, bf16, fp8, fp32)
    assert (spec.intra_node_GBps, spec.inter_node_GBps) == (intra, inter)


def test_a_step_on_h200_and_b200_is_timed_at_their_peaks_and_fits_their_memory():
    """gpt3/5b on one GPU (bf16): its compute is the step's FLOPs over peak x MFU, the H100's on an
    H200 (same Tensor Cores) and 989.4/2250 of it on a B200; its 92.9 GiB does not fit an H100's
    79.1 x 0.9 = 71.2 GiB, and fits an H200's 139.8 x 0.9 = 125.8 and a B200's 178.3 x 0.9 = 160.5."""
    cfg = load_training_config("gpt3/5b", ["trainer.devices=1", "model.micro_batch_size=1"])
    work, layout = workload_from_config(cfg), layout_from_config(cfg, world_size=1)
    flops = rank_flops(work, layout)[0] + recomputed_flops(work, layout)[0]
    computed = {}
    for name in ("h100-80gb", "h200-141gb", "b200-180gb"):
        cluster = Cluster(1, 1, gpu_spec(name))
        computed[name] = rank_busy_seconds(work, layout, cluster, 0.4)[0][0]
        assert computed[name] == pytest.approx(flops / (GPUS[name].bf16_tflops * 1e12 * 0.4), rel=1e-12)
        candidate = evaluate(work, layout, cluster, 0.4, 0.1)
        assert candidate.fits is (name != "h100-80gb")
        assert 71.2 * GIB < candidate.memory.total < 125.8 * GIB
    assert computed["h200-141gb"] == computed["h100-80gb"]
    assert computed["b200-180gb"] == pytest.approx(computed["h100-80gb"] * 989.4 / 2250.0, rel=1e-12)


def test_plan_takes_h200_and_b200_from_the_flag_and_a_cluster_file(tmp_path: Path, capsys) -> None:
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--gpu", "h200-141gb", "--top", "1"]) == 0
    assert "h200-141gb" in capsys.readouterr().out
    site = tmp_path / "site.yaml"
    site.write_text("gpus_per_node: 8\nplan:\n  gpu: b200-180gb\n")
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--cluster", str(site), "--top", "1"]) == 0
    assert "b200-180gb" in capsys.readouterr().out
