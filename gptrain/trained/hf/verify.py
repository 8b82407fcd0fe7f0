"""Proof that a conversion is exact: same logits on a fixed batch, same greedy continuation.

Both models run on the CPU in float32 with full forwards (no KV cache), so what is compared is
the two models' arithmetic, not their generation machinery. The tolerance is relative to the
largest logit: float32 sums of a few thousand terms in a different order agree to about 1e-6,
so 1e-4 leaves room for depth while a wrong layout (a transposed or misordered head, another
GELU, a shifted rotary) moves logits by percents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptrain.errors import GptrainError

RELATIVE_TOLERANCE = 1e-4
BATCH, MAX_TOKENS, NEW_TOKENS, SEED = 2, 64, 12, 0
# what tokenizers disagree on: digit runs, special tokens' text (GPT-2's; SentencePiece's <s> </s>,
# text to sentencepiece), accents (composed and NFD) and other scripts, whitespace runs and CRLF
# (which tokenizers' Precompiled took as one grapheme)
TOKENIZER_PROBE = (
    "The meaning of life is 42, not 1234567. <|endoftext|> 12 ünïcode cafe\u0301 日本語 ✓\r\n\n\tspaces   "
    "end  <s>x</s>"
)


class VerificationError(GptrainError):
    """The converted model computes something else than the original."""


@dataclass
class Rounding:
    """What rounding the float32 weights to a narrower dtype does to the logits on the fixed batch."""

    dtype: str
    max_abs_diff: float
    max_abs_logit: float


@dataclass
class Verification:
    max_abs_diff: float
    max_abs_logit: float
    greedy_tokens: list[int]
    rounding: Rounding | None = None

    @property
    def relative(self) -> float:
        return self.max_abs_diff / max(self.max_abs_logit, 1e-30)

    def describe(self) -> str:
        line = (
            f"max |logit difference| {self.max_abs_diff:.3e} ({self.relative:.2e} of the largest logit, "
            f"tolerance {RELATIVE_TOLERANCE:.0e}); greedy continuation of {len(self.greedy_tokens)} tokens identical"
        )
        if self.rounding is not None:
            r = self.rounding
            line += (
                f"; rounding the weights to {r.dtype} moves the logits by up to {r.max_abs_diff:.3e} "
                f"({r.max_abs_diff / max(r.max_abs_logit, 1e-30):.2e} of the largest)"
            )
        return line


def gptrain_logits(model: nn.Module, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    return model(ids).float()[..., :vocab]


def hf_logits(model: nn.Module, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits.float()[..., :vocab]


def fixed_batch(vocab: int, seq_length: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (BATCH, min(seq_length, MAX_TOKENS)), generator=generator)


@torch.no_grad()
def rounding_effect(model: nn.Module, dtype: torch.dtype, vocab: int, seq_length: int) -> Rounding | None:
    """Round `model`'s parameters to `dtype` in place (kept in float32) and report how far that moves
    its logits on the fixed batch; None (and no change) for float32. Buffers (the rope tables) are not
    exported: transformers computes its own in float32."""
    if dtype == torch.float32:
        return None
    model.eval()
    ids = fixed_batch(vocab, seq_length)
    before = gptrain_logits(model, ids, vocab)
    for parameter in model.parameters():
        parameter.copy_(parameter.to(dtype))
    after = gptrain_logits(model, ids, vocab)
    name = str(dtype).removeprefix("torch.")
    return Rounding(name, float((before - after).abs().max()), float(before.abs().max()))


@torch.no_grad()
def verify_models(
    ours: nn.Module, theirs: nn.Module, vocab: int, seq_length: int, prompt: list[int], what: str
) -> Verification:
    """Compare logits on the fixed batch and a greedy continuation of `prompt`; VerificationError if they differ."""
    ours.eval()
    theirs.eval()
    ids = fixed_batch(vocab, seq_length)
    a, b = gptrain_logits(ours, ids, vocab), hf_logits(theirs, ids, vocab)
    diff, scale = float((a - b).abs().max()), float(a.abs().max())
    if not diff <= RELATIVE_TOLERANCE * scale:  # also catches NaN
        raise VerificationError(
            f"{what}: logits differ by up to {diff:.3e} (largest logit {scale:.3e}, tolerance "
            f"{RELATIVE_TOLERANCE:.0e} relative); the conversion is wrong, do not use its output"
        )
    tokens = greedy_agreement(
        ours, theirs, prompt, vocab, seq_length, tolerance=RELATIVE_TOLERANCE * scale, what=what
    )
    return Verification(diff, scale, tokens)


def greedy_agreement(
    ours: nn.Module,
    theirs: nn.Module,
    prompt: list[int],
    vocab: int,
    seq_length: int,
    tolerance: float,
    what: str,
) -> list[int]:
    """The greedy continuation both models produce; a different pick is an error unless it is a tie
    (the two candidates within `tolerance` of each other in our logits)."""
    tokens = list(prompt)[: max(1, seq_length - NEW_TOKENS)] or [0, 1, 2][: max(1, seq_length - 1)]
    new: list[int] = []  # (a tokenizer that encodes the prompt to nothing: fixed ids, as for mock data)
    for _ in range(min(NEW_TOKENS, seq_length - len(tokens))):
        ids = torch.tensor([tokens])
        mine = gptrain_logits(ours, ids, vocab)[0, -1]
        other = int(hf_logits(theirs, ids, vocab)[0, -1].argmax())
        pick = int(mine.argmax())
        if pick != other and float(mine[pick] - mine[other]) > tolerance:
            raise VerificationError(
                f"{what}: greedy continuation differs at new token {len(new) + 1} "
                f"(gptrain {pick}, transformers {other}); the conversion is wrong"
            )
        tokens.append(pick)
        new.append(pick)
    return new


def verify_tokenizer(directory: Path, tokenizer: Any, what: str, advice: Callable[[], str]) -> None:
    """transformers' AutoTokenizer of `directory` encodes the probe text as gptrain's `tokenizer`
    does; a one-line VerificationError naming the first difference and `advice()` if not."""
    from transformers import AutoTokenizer

    try:
        theirs = list(
            AutoTokenizer.from_pretrained(str(directory), local_files_only=True).encode(TOKENIZER_PROBE)
        )
    except Exception as error:  # a tokenizer class transformers cannot build here: no comparison
        reason = " ".join(str(error).split())[:200]
        raise VerificationError(
            f"{directory}: transformers' AutoTokenizer does not load ({type(error).__name__}: {reason}); {advice()}"
        ) from None
    ours = list(tokenizer.encode(TOKENIZER_PROBE))
    if theirs == ours:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), min(len(theirs), len(ours))
    )
    raise VerificationError(
        f"{directory}: transformers' tokenizer and {what} encode {TOKENIZER_PROBE!r} differently "
        f"(token {at}: transformers {theirs[at : at + 3]}, gptrain {ours[at : at + 3]}); {advice()}"
    )


def tokens_beyond(directory: Path, vocab_size: int) -> list[tuple[int, str]]:
    """(id, token) of the tokens transformers' AutoTokenizer of `directory` has at or past
    `vocab_size`, sorted: those it adds from added_tokens.json, tokenizer_config.json's
    added_tokens_decoder or special_tokens_map.json to the files gptrain reads. The probe text of
    `verify_tokenizer` cannot know them, so they are looked for by id."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return sorted((i, token) for token, i in theirs.get_vocab().items() if i >= vocab_size)
