"""bench/profile_step.py's arithmetic: busy time is the union of kernel intervals, kinds by name."""

import importlib.util
import random
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def profile_step():
    spec = importlib.util.spec_from_file_location("profile_step", BENCH / "profile_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_busy_time_is_the_union_of_overlapping_kernel_intervals(profile_step):
    rng = random.Random(7)
    for _ in range(200):
        intervals = []
        for _ in range(rng.randint(0, 12)):
            start = rng.randint(0, 100)
            intervals.append((start, start + rng.randint(0, 30)))
        covered = {t for start, end in intervals for t in range(start, end)}  # µs ticks
        assert profile_step.busy_ms(intervals) == pytest.approx(len(covered) / 1000)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
        ("triton_tem_fused_mm_3", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
        ("void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>", "optimizer"),
        ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_9", "fused (triton)"),
        ("Memcpy DtoD (Device -> Device)", "copy/fill"),
        ("some_other_kernel", "other"),
    ],
)
def test_kernels_are_grouped_by_kind(profile_step, name, kind):
    assert profile_step.kind_of(name) == kind
