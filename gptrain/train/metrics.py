"""Throughput numbers printed in the iteration line and sent to TensorBoard.

TFLOP/s/GPU follows Megatron (megatron-data-format.md section 11): the model FLOPs of
one global batch over the elapsed time per iteration, divided by the world size.
"""

from __future__ import annotations


def tflops_per_gpu(flops_per_iteration: float, seconds_per_iteration: float, world_size: int) -> float:
    """Megatron's `throughput per GPU (TFLOP/s/GPU)`."""
    if seconds_per_iteration <= 0:
        return 0.0
    return flops_per_iteration / (seconds_per_iteration * 1e12 * world_size)


def tokens_per_second(global_batch_size: int, seq_length: int, seconds_per_iteration: float) -> float:
    """Tokens of the whole job per second (all ranks together)."""
    if seconds_per_iteration <= 0:
        return 0.0
    return global_batch_size * seq_length / seconds_per_iteration


def mfu(tflops_per_gpu_value: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction of the device's dense peak, or None if unknown."""
    if not peak_tflops:
        return None
    return tflops_per_gpu_value / peak_tflops
