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


# Existing dashboards keep working: besides gptrain's own tags (train/results.py), every
# interval also writes Megatron-LM's tags (training.py's training_log and evaluate_and_print_results)
# and NeMo's (the names its Lightning module logs). docs/migrating.md lists them.
MEGATRON_TAGS = {
    "loss": "lm loss",
    "lr": "learning-rate",
    "grad_norm": "grad-norm",
    "loss_scale": "loss-scale",
    "batch_size": "batch-size",
    "seconds": "iteration-time",
    "tflops": "throughput",  # TFLOP/s/GPU; Megatron writes it beside iteration-time (--log-throughput)
    "world_size": "world-size",
}
# Megatron's tags of an interval's timing: by iteration only, no `vs samples` series.
TIMING_KEYS = frozenset({"seconds", "tflops"})
NEMO_TAGS = {
    "loss": "reduced_train_loss",
    "lr": "lr",
    "grad_norm": "grad_norm",
    "loss_scale": "loss_scale",
    "step": "global_step",
    "consumed": "consumed_samples",
    "seconds": "train_step_timing",
}


def dashboard_scalars(
    values: dict[str, float | None],
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """(by iteration, by consumed samples): Megatron's and NeMo's tags for one logging interval.

    `values` has the keys of MEGATRON_TAGS/NEMO_TAGS; Megatron also writes each of its series
    against consumed samples under `<tag> vs samples`.
    """
    by_step: dict[str, float | None] = {}
    by_samples: dict[str, float | None] = {}
    for key, tag in MEGATRON_TAGS.items():
        by_step[tag] = values.get(key)
        if key not in TIMING_KEYS:
            by_samples[f"{tag} vs samples"] = values.get(key)
    for key, tag in NEMO_TAGS.items():
        by_step[tag] = values.get(key)
    return by_step, by_samples


def evaluation_scalars(loss: float, split: str) -> dict[str, float]:
    """Megatron's `lm loss validation` (and ppl), NeMo's `val_loss`; for the test split gptrain's own
    `lm loss test` (and ppl), named as Megatron's (which writes its test loss onto `lm loss validation`),
    and NeMo's `test_loss`."""
    import math

    name = "validation" if split == "valid" else "test"
    ppl = math.exp(min(20.0, loss))
    return {
        f"lm loss {name}": loss,
        f"lm loss {name} ppl": ppl,
        f"{'val' if split == 'valid' else 'test'}_loss": loss,
    }
