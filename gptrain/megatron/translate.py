"""A `pretrain_gpt.py` argument list -> gptrain `key=value` overrides, with Megatron's defaults.

The overrides start from Megatron's own defaults where they differ from gptrain's (fp32, Adam
beta2 0.999, weight decay 0.01, linear decay, split "969, 30, 1", log every 100 iterations,
evaluate 100 batches every 1000 as up to core 0.15; FILLED_IN says what stands in where Megatron
has no default), then apply the flags in order (a later flag wins, as with
argparse). Unknown and unsupported flags are refused by name; flags that change speed or
logs only are accepted and reported once. No torch here: `--dry-run` must start fast.
"""

from __future__ import annotations

import os

from gptrain.errors import ConfigError
from gptrain.megatron import data_paths
from gptrain.megatron.defaults import FILLED_IN, MEGATRON_DEFAULTS, REQUIRED
from gptrain.megatron.flag_parsing import apply_flag, convert_value, split_flags
from gptrain.megatron.model_flags import (
    full_recompute_layers,
    no_position_embedding,
    openai_gelu,
    qkv_bias,
    query_groups,
    recompute_flags,
    rotary_switch,
    swiglu_width,
)
from gptrain.megatron.numerics_flags import (
    fp16_gradients,
    grad_reduce_in_bf16,
    loss_average,
    nan_check,
    static_loss_scale,
    xla_precision,
)
from gptrain.megatron.output_flags import (
    memory_interval,
    no_periodic_saves,
    output_directories,
    save_needs_interval,
    wandb_flags,
)
from gptrain.megatron.parallel_flags import (
    data_parallel_sharding,
    layout_from_environment,
    sequence_parallel,
    virtual_pipeline,
)
from gptrain.megatron.schedule_flags import (
    decoupled_lr,
    iteration_flags,
    megatron_decay_styles,
    resumed_schedule,
    schedule_lengths,
    step_batch_schedule,
    weight_decay_increment,
)
from gptrain.megatron.tokenizer_flags import (
    eod_mask_on_mock_data,
    no_pad_vocab,
    null_tokenizer,
    null_tokenizer_ids,
    padded_vocab,
    sentencepiece_vocabulary,
    tiktoken_flags,
    tokenizers_vocabulary,
    vocab_extra_ids,
)
from gptrain.megatron.translation import Translation


def translate(argv: list[str], env: dict[str, str] | None = None) -> Translation:
    """Megatron flags -> Translation; a flag gptrain cannot honour is a one-line ConfigError."""
    env = dict(os.environ) if env is None else env
    result = Translation(values=dict(MEGATRON_DEFAULTS))
    for flag, values in split_flags(argv):
        result.given[flag] = values
        apply_flag(result, flag, values)
    missing = [flag for flag in REQUIRED if flag not in result.given]
    if missing:
        raise ConfigError(f"pretrain_gpt.py needs {', '.join(missing)} (Megatron has no default for them)")
    try:
        finish(result, env)
    except ConfigError as error:  # a check of keys the flags set (the ramp's), said by the flags
        raise ConfigError(result.in_flags(str(error))) from None
    return result


# Megatron's Adam betas where the flags are absent.
BETA_DEFAULTS = (("--adam-beta1", "0.9"), ("--adam-beta2", "0.999"))


def finish(result: Translation, env: dict[str, str]) -> None:
    """Flags that combine: data paths, betas, samples, directories; then the layout and checks."""
    v, given = result.values, result.given
    v.setdefault("model.max_position_embeddings", v["model.encoder_seq_length"])
    betas = [convert_value(flag, given.get(flag, [default])[0], float) for flag, default in BETA_DEFAULTS]
    v["model.optim.betas"] = betas
    data_paths.apply(v, given)
    null_tokenizer(result)
    null_tokenizer_ids(result)
    sentencepiece_vocabulary(result)
    tokenizers_vocabulary(result)
    vocab_extra_ids(result)
    tiktoken_flags(result)
    padded_vocab(result)
    no_pad_vocab(result)
    eod_mask_on_mock_data(result)
    query_groups(result)
    rotary_switch(result)
    openai_gelu(result)
    no_position_embedding(result)
    qkv_bias(result)
    swiglu_width(v, given)
    if "--fp16" in given and "--bf16" in given:  # Megatron refuses the pair too
        raise ConfigError("--fp16 and --bf16: give one of them")
    xla_precision(result, env)
    fp16_gradients(result)
    static_loss_scale(result)
    nan_check(result)
    grad_reduce_in_bf16(result)
    data_parallel_sharding(result)
    decoupled_lr(result)
    weight_decay_increment(result)
    resumed_schedule(result)
    loss_average(result)
    recompute_flags(v, given)
    full_recompute_layers(result)
    sequence_parallel(result)
    step_batch_schedule(result)
    layout_from_environment(v, env)
    virtual_pipeline(v, given)
    if "--rampup-batch-size" in given:
        v["model.rampup_batch_size"] = [
            convert_value("--rampup-batch-size", x, int) for x in given["--rampup-batch-size"]
        ]
    iteration_flags(v, given)
    megatron_decay_styles(result)
    save_needs_interval(given)
    no_periodic_saves(result)
    schedule_lengths(v, given)
    output_directories(result)
    wandb_flags(result)
    memory_interval(result)
    check_benchmark_mode(result)
    _filled_in(result)


def check_benchmark_mode(result: Translation) -> None:
    """`--eval-iters 40 --split 100,0,0`: an empty validation split is not evaluated, as Megatron
    before 2023 skipped it (the Trainium tutorial's script); today's Megatron dies on `assert
    num_samples > 0` instead. Said in a note. (An empty test split is not built, as ever.)"""
    v = result.values
    if isinstance(v.get("model.data.data_prefix"), dict):
        _split_unused(result)
        return  # per-split paths: without --valid-data-path there is no validation, as in Megatron
    from gptrain.data.splits import parse_split_string  # Megatron's parse: "98,2,0", "98 2 0", "98/2"

    split = str(v["model.data.splits_string"])
    try:
        weights = parse_split_string(split)
    except ConfigError as error:
        raise ConfigError(f"--split {split}: {error}") from None
    if v.get("model.data.data_impl") == "mock":
        return
    if v.get("trainer.limit_val_batches", 0) > 0 and weights[1] == 0:
        given = "" if "--eval-iters" in result.given else " (Megatron's default)"
        result.notes.append(
            f"--eval-iters {v['trainer.limit_val_batches']}{given} with --split {split} (the validation split "
            "is empty: not evaluated, as Megatron before 2023 skipped it)"
        )
        v["trainer.limit_val_batches"] = 0


def _split_unused(result: Translation) -> None:
    """--split beside per-split paths divides nothing: Megatron before its core datasets ignored it,
    core asserts "split and blend_per_split are incompatible". Said in a note, and not shown as set."""
    if "--split" in result.given:
        del result.values["model.data.splits_string"]
        result.notes.append(
            "--split (each split reads its own --train/valid/test-data-path; Megatron core refuses the pair)"
        )


def _filled_in(result: Translation) -> None:
    """Say what an absent flag of FILLED_IN became, where it matters (the interval: with validation)."""
    v, given = result.values, result.given
    used = {
        "--lr": True,
        "--eval-interval": v.get("trainer.limit_val_batches", 0) > 0
        and not (
            isinstance(v.get("model.data.data_prefix"), dict)
            and "validation" not in v["model.data.data_prefix"]
        ),
    }
    result.notes.extend(
        f"no {flag} ({why})" for flag, why in FILLED_IN.items() if used[flag] and flag not in given
    )
