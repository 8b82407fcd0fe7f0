"""Precision, loss-scale and NaN-check flags: where gptrain's numerics differ, refused or said."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gptrain.config.validate import MAX_STATIC_LOSS_SCALE
from gptrain.errors import ConfigError
from gptrain.megatron.flag_parsing import convert_value

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


def xla_precision(result: Translation, env: dict[str, str]) -> None:
    """The Trainium scripts export XLA_USE_BF16=1 (torch-xla casts every float tensor to bf16) instead
    of giving --bf16; gptrain reads the precision from the flags only, so the run is fp32: said."""
    given = result.given
    if env.get("XLA_USE_BF16", "").lower() in ("1", "true") and not ("--bf16" in given or "--fp16" in given):
        result.notes.append(
            "XLA_USE_BF16=1 in the environment (torch-xla's bf16 on Trainium; gptrain reads the precision "
            "from the flags: fp32 here, add --bf16 for bf16 mixed precision)"
        )


def static_loss_scale(result: Translation) -> None:
    """Megatron's --loss-scale V: a constant scale (ConstantGradScaler, over --initial-loss-scale and
    its dynamic settings), which gptrain keeps under --fp16 only: bf16 gradients need no scale."""
    given, v = result.given, result.values
    if "--loss-scale" not in given:
        return
    scale = convert_value("--loss-scale", given["--loss-scale"][0], float)
    if not scale > 0:  # Megatron's 0 falls back to dynamic scaling; below it asserts
        raise ConfigError(
            f"--loss-scale {given['--loss-scale'][0]}: a static loss scale must be greater than 0; drop the "
            "flag for dynamic fp16 scaling (--initial-loss-scale, --loss-scale-window, --hysteresis)"
        )
    if "--fp16" not in given:
        result.notes.append(
            "--loss-scale (gptrain scales fp16 losses only; under --bf16 or fp32 it trains unscaled, where "
            "Megatron scales a --bf16 loss by it and unscales the gradients: the same steps, rounding aside)"
        )
        return
    if scale > MAX_STATIC_LOSS_SCALE:  # named here: the config's check names --initial-loss-scale's key
        raise ConfigError(
            f"--loss-scale {given['--loss-scale'][0]}: fp16 gradients scaled by it overflow on every step; "
            f"give at most 2**24 = {MAX_STATIC_LOSS_SCALE} (2**12 to 2**16 is usual)"
        )
    v["model.native_amp_init_scale"] = scale
    v["model.native_amp_static_scale"] = True


# How many non-finite iterations in a row stop a run with Megatron's check (its default): the first.
NAN_CHECK_LIMIT = 1


def nan_check(result: Translation) -> None:
    """Megatron's --check-for-nan-in-loss-and-grad (on unless --no-check-for-nan-in-loss-and-grad)
    stops at the first NaN or Inf loss or gradient: trainer.max_consecutive_nonfinite 1. Under --fp16
    without --loss-scale Megatron turns the check off and its dynamic scaler skips the step, as
    gptrain's does: gptrain's limit of non-finite losses in a row stays, and a note says so (the
    default's limit needs none: it is one of the overrides shown)."""
    given = result.given
    if "--no-check-for-nan-in-loss-and-grad" in given:
        return  # its NO_EFFECT note says what gptrain does instead
    if "--fp16" in given and "--loss-scale" not in given:
        result.notes.append(
            "--fp16 with dynamic loss scaling (Megatron turns --check-for-nan-in-loss-and-grad off: an "
            "overflowing step is skipped by the loss scaler, as in Megatron; a non-finite loss is skipped too and "
            "trainer.max_consecutive_nonfinite (5) in a row stop the run)"
        )
        return
    result.values["trainer.max_consecutive_nonfinite"] = NAN_CHECK_LIMIT  # shown with the overrides


def fp16_gradients(result: Translation) -> None:
    """Megatron's --fp16 keeps the gradients in fp16, accumulated and all-reduced, unless
    --accumulate-allreduce-grads-in-fp32 is given; gptrain's are always fp32 (fp32 weights under
    autocast), so their rounding differs: said."""
    given = result.given
    if "--fp16" in given and "--accumulate-allreduce-grads-in-fp32" not in given:
        result.notes.append(
            "--fp16 (gptrain accumulates and all-reduces gradients in fp32, as Megatron does with "
            "--accumulate-allreduce-grads-in-fp32; Megatron's --fp16 alone keeps them in fp16)"
        )


def grad_reduce_in_bf16(result: Translation) -> None:
    """Megatron reads --grad-reduce-in-bf16 only with --bf16, where it accumulates and reduces the
    gradients in bf16 instead of fp32. gptrain's are fp32 (fp32 weights under autocast; FSDP's
    reduce_dtype), so the flag would change the gradients' rounding: refused with --bf16."""
    if "--grad-reduce-in-bf16" not in result.given:
        return
    if "--bf16" in result.given:
        raise ConfigError(
            "--grad-reduce-in-bf16: gptrain accumulates and all-reduces gradients in fp32, as Megatron does "
            "with --bf16 alone; in bf16 they would be rounded to 8 significant bits, which is not implemented: "
            "drop the flag"
        )
    result.notes.append("--grad-reduce-in-bf16 (Megatron reads it only with --bf16)")


def loss_average(result: Translation) -> None:
    """--eod-mask-loss without --calculate-per-token-loss: Megatron averages each micro-batch's own
    mean, gptrain the tokens of the whole global batch; said, since the gradients differ slightly. Not on
    mock data, whose note says what is masked (nothing, or an id drawn by chance: micro-batches of as many
    loss tokens, whose averages agree), so the flag is listed once. A notice, not a note: the flag takes
    effect, and notes list the flags accepted without one."""
    mock = result.values.get("model.data.data_impl") == "mock"
    if "--eod-mask-loss" in result.given and "--calculate-per-token-loss" not in result.given and not mock:
        result.notices.append(  # the flag takes effect (model.data.eod_mask_loss): not one without
            "--eod-mask-loss: end-of-document tokens leave the loss, and gptrain averages it over every loss "
            "token of the global batch, as Megatron's --calculate-per-token-loss does; Megatron's default "
            "averages each micro-batch's own mean, so gradients differ slightly where micro-batches hold "
            "different numbers of loss tokens"
        )
