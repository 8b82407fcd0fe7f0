"""The embedding's rows for a tokenizer's ids, as Megatron pads them (pure arithmetic, no torch):
in utils so that models (the parameter count), training's start and the launch preflight (which
may not import models) refuse a model.padded_vocab_size with one line."""

from __future__ import annotations

import math

from gptrain.errors import ConfigError


def pad_vocab_size(
    vocab_size: int, make_vocab_size_divisible_by: int = 128, tensor_parallel_size: int = 1
) -> int:
    """Megatron's padded vocab: round up to a multiple of divisible_by * TP (50257 -> 50304).

    Padding keeps the embedding matmul on tensor-core friendly shapes and splits evenly over TP ranks.
    """
    for key, value in (
        ("vocab_size", vocab_size),
        ("make_vocab_size_divisible_by", make_vocab_size_divisible_by),
        ("tensor_model_parallel_size", tensor_parallel_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{key}={value!r} must be a positive integer")
    multiple = make_vocab_size_divisible_by * tensor_parallel_size
    return math.ceil(vocab_size / multiple) * multiple


def vocab_rows(
    vocab_size: int,
    make_vocab_size_divisible_by: int,
    tensor_parallel_size: int,
    padded_vocab_size: int | None,
    source: str = "the tokenizer",
) -> int:
    """The embedding's rows for a vocabulary of `vocab_size` ids (those of `source`): model.padded_vocab_size
    where set, as Megatron takes --padded-vocab-size whatever the TP (gptrain.parallel.layout checks that
    TP divides it), else `pad_vocab_size`'s padding. Megatron would index past fewer rows: refused."""
    if padded_vocab_size is None:
        return pad_vocab_size(vocab_size, make_vocab_size_divisible_by, tensor_parallel_size)
    if vocab_size > padded_vocab_size:
        raise ConfigError(
            f"model.padded_vocab_size={padded_vocab_size}: fewer rows than the {vocab_size} ids of {source}; "
            f"give {vocab_size} or more, or null to pad them by model.make_vocab_size_divisible_by"
        )
    return padded_vocab_size
