"""A `pretrain_gpt.py` argument list -> gptrain `key=value` overrides, with Megatron's defaults.

The overrides start from Megatron's own defaults where they differ from gptrain's (fp32, Adam
beta2 0.999, weight decay 0.01, linear decay, split "969, 30, 1", log every 100 iterations,
evaluate 100 batches every 1000 as up to core 0.15; FILLED_IN says what stands in where Megatron
has no default), then apply the flags in order (a later flag wins, as with
argparse). Unknown and unsupported flags are refused by name; flags that change speed or
logs only are accepted and reported once. No torch here: `--dry-run` must start fast.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.config.validate import MAX_STATIC_LOSS_SCALE
from gptrain.data.blend_spec import is_number
from gptrain.errors import ConfigError
from gptrain.megatron import batch_schedule, data_paths
from gptrain.megatron.flags import (
    NO_EFFECT,
    NO_EFFECT_CHOICES,
    NO_EFFECT_WHY,
    REFUSED,
    SPECIAL,
    SWITCH,
    VALUE,
)
from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule_checks import ScheduleNames, config_ramp, shown_steps
from gptrain.utils.tokenizer_types import names_a_file

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig
    from gptrain.train.schedule import ScheduleSpec

# Megatron-LM's argument defaults (megatron/training/arguments.py) where gptrain's differ (for
# --lr and, since core 0.16, --eval-interval Megatron has none: FILLED_IN).
MEGATRON_DEFAULTS: dict[str, Any] = {
    "run.name": "megatron",
    "trainer.precision": "32",
    "trainer.log_every_n_steps": 100,
    "trainer.val_check_interval": 1000,
    "trainer.limit_val_batches": 100,
    "trainer.limit_test_batches": 100,
    "trainer.gradient_clip_val": 1.0,
    "exp_manager.resume_if_exists": False,
    "exp_manager.checkpoint_callback_params.save_top_k": -1,  # Megatron removes no checkpoint
    "model.optim.lr": 6e-4,
    "model.optim.betas": [0.9, 0.999],
    "model.optim.eps": 1e-8,
    "model.optim.weight_decay": 0.01,
    "model.optim.sched.name": "LinearAnnealing",
    "model.optim.sched.min_lr": 0.0,
    "model.optim.sched.warmup_steps": 0,
    "model.optim.sched.constant_steps": 0,
    "model.optim.sched.warmup_style": "megatron",
    "model.data.splits_string": "969, 30, 1",
    "model.data.num_workers": 2,
    "model.activations_checkpoint_granularity": None,
    "model.data_parallel_sharding": "ddp",  # Megatron replicates unless --use-distributed-optimizer
    "model.tokenizer.library": "megatron",
    "model.tokenizer.type": "GPT2BPETokenizer",
    "model.make_vocab_size_divisible_by": 128,
    "model.init_method_std": 0.02,
    "model.hidden_dropout": 0.1,
    "model.attention_dropout": 0.1,
    "model.layernorm_epsilon": 1e-5,
    "model.seed": 1234,
}
# The flags that set the warmup; Megatron's default is --lr-warmup-iters 0.
WARMUP_FLAGS = ("--lr-warmup-samples", "--lr-warmup-fraction", "--lr-warmup-iters")
REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size")
# Flags without which Megatron stops, or stops since core 0.16 (February 2026: no --eval-interval
# default, and `train_iters // None` fails as the datasets are sized): the value gptrain takes instead.
FILLED_IN: dict[str, str] = {
    "--lr": f"learning rate {MEGATRON_DEFAULTS['model.optim.lr']}; Megatron has no default and stops",
    "--eval-interval": (
        f"validation every {MEGATRON_DEFAULTS['trainer.val_check_interval']} iterations, the default of "
        "Megatron up to core 0.15; from core 0.16 (February 2026) it has none and stops"
    ),
}

DECAY_STYLES = VALUE["--lr-decay-style"][1]  # Megatron's word -> gptrain's schedule name


@dataclass
class Translation:
    """The overrides for `gptrain train`, what was accepted without effect (one line), and what
    differs from some Megatron versions (a line each)."""

    values: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    given: dict[str, list[str]] = field(default_factory=dict)

    @property
    def overrides(self) -> list[str]:
        return [f"{key}={render(value)}" for key, value in self.values.items()]

    def in_flags(self, message: str) -> str:
        """`message` (a check of the loaded config) with each gptrain key named by the flag that
        sets it, the one given where two do: `--hidden-size (8192)`, not `model.hidden_size (8192)`;
        a key a given switch set, with the value it set, by the switch alone."""
        flags: dict[str, str] = {}
        for flag, (keys, _) in VALUE.items():
            for key in keys:
                if key not in flags or flag in self.given:
                    flags[key] = flag
        pattern = "|".join(re.escape(key) for key in sorted(flags, key=len, reverse=True))
        message = re.sub(rf"(?<![\w.])({pattern})(?!\w|\.\w)", lambda m: flags[m.group(1)], message)
        for flag in (name for name in self.given if name in SWITCH):
            for key, value in SWITCH[flag].items():
                named = rf"(?<![\w.]){re.escape(key)}(={re.escape(render(value))})?(?![\w=]|\.\w)"
                message = re.sub(named, flag, message)
        return message

    def schedule_names(self, cfg: TrainingConfig, spec: ScheduleSpec) -> ScheduleNames:
        """The start warnings' names for the flags given (a count in samples with its iterations), and
        Megatron's way to decay over the whole run: no --lr-decay-* flag, in samples under a ramp-up."""
        run_flag = "--train-samples" if "--train-samples" in self.given else "--train-iters"
        decay_flag = next(
            (flag for flag in ("--lr-decay-samples", "--lr-decay-iters") if flag in self.given), None
        )
        warmup_flag = next((flag for flag in WARMUP_FLAGS if flag in self.given), "--lr-warmup-iters")
        ramp = config_ramp(cfg)
        if decay_flag is not None and (ramp.start is None or run_flag == "--train-samples"):
            follow = f"drop {decay_flag} to decay over the whole run, as Megatron does without it"
        else:  # a ramp-up moves an iterations schedule by each batch's share: Megatron's counts samples
            without = f" and no {decay_flag}" if decay_flag else ""
            samples = ramp.samples_for(cfg.trainer.max_steps)
            follow = (
                f"give --train-samples {samples} (the samples the run consumes) in place of --train-iters"
                f"{without} to decay over the whole run, as Megatron's ramp-up needs"
            )
        decay = f"the decay over {self._named(run_flag, spec.max_steps)}"  # Megatron's without a flag
        if decay_flag is not None:
            decay = self._named(decay_flag, spec.max_steps)
        return ScheduleNames(
            run=self._named(run_flag, cfg.trainer.max_steps),
            decay=decay,
            warmup=self._named(warmup_flag, spec.warmup_steps),
            follow_run=follow,
            run_key=run_flag,
            warmup_key=warmup_flag,
            lr="--lr ",
            min_lr="--min-lr ",
            unit="iterations",
            settings=self._schedule_flags(run_flag),
            values={"model.optim.sched.name": {name: style for style, name in DECAY_STYLES.items()}},
        )

    def _schedule_flags(self, run_flag: str) -> dict[str, str]:
        """The flag that sets each schedule key (its --lr-decay-samples: --train-samples without it),
        for the line at a resume."""
        sched = "model.optim.sched."
        decay_samples = "--lr-decay-samples" if "--lr-decay-samples" in self.given else "--train-samples"
        return {
            "trainer.max_steps": run_flag,
            "model.optim.lr": "--lr",
            f"{sched}min_lr": "--min-lr",
            f"{sched}name": "--lr-decay-style",
            f"{sched}max_steps": "--lr-decay-iters",
            f"{sched}decay_samples": decay_samples,
            f"{sched}warmup_steps": "--lr-warmup-iters",
            f"{sched}warmup_samples": "--lr-warmup-samples",
            f"{sched}warmup_fraction": "--lr-warmup-fraction",
            f"{sched}warmup_init_lr": "--lr-warmup-init",
        }

    def _named(self, flag: str, iterations: float) -> str:
        """`--flag value` as given (Megatron's default 0 where absent), with its `iterations` where the
        flag counts otherwise (samples, a fraction)."""
        shown = f"{flag} {self.given.get(flag, ['0'])[0]}"
        return shown if flag.endswith("-iters") else f"{shown} ({shown_steps(iterations)} iterations)"


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
    finish(result, env)
    return result


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[('--flag', [values...]), ...]; `--flag=value` is split; values run to the next `--flag`."""
    pairs: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--") and not is_number(token):
            flag, sep, value = token.partition("=")
            pairs.append((flag, [value] if sep else []))
        elif not pairs:
            raise ConfigError(f"'{token}' is not a flag; pretrain_gpt.py arguments start with --")
        else:
            pairs[-1][1].append(token)
    return pairs


def apply_flag(result: Translation, flag: str, values: list[str]) -> None:
    if flag in REFUSED:
        raise ConfigError(f"{flag}: {REFUSED[flag]}")
    if flag.startswith("--moe-"):  # the router, dispatcher and loss of Megatron's experts, dozens of them
        raise ConfigError(f"{flag}: {REFUSED['--num-experts']}")
    if flag in SPECIAL:
        _expect(flag, values, SPECIAL[flag])
        return  # handled in finish(), which sees all flags
    if flag in SWITCH:
        _expect(flag, values, 0)
        result.values.update(SWITCH[flag])
    elif flag in VALUE:
        _expect(flag, values, 1)
        keys, convert = VALUE[flag]
        for key in keys:
            result.values[key] = _convert(flag, values[0], convert)
    elif flag in NO_EFFECT:
        _expect(flag, values, NO_EFFECT[flag])
        accepted, why = NO_EFFECT_CHOICES.get(flag, (None, ""))
        if accepted is not None and not _is_accepted(flag, values[0], accepted):
            raise ConfigError(f"{flag} {values[0]}: {why}")
        note = f"{flag} ({NO_EFFECT_WHY[flag]})" if flag in NO_EFFECT_WHY else flag
        if note not in result.notes:  # a flag repeated (scripts that join arrays) is listed once
            result.notes.append(note)
    else:
        raise ConfigError(  # not "remove it": what an unknown flag changes, gptrain cannot say
            f"{flag}: gptrain does not know this flag{_flag_meant(flag)}; check what it changes in Megatron "
            "before removing it (docs/migrating.md lists the flags gptrain takes)"
        )


def _is_accepted(flag: str, text: str, accepted: tuple[Any, ...]) -> bool:
    """Whether `text` is one of `accepted` as Megatron's argparse reads it, in their type: int('01')
    is 1, so `--context-parallel-size 01` is Megatron's default too."""
    kind = type(accepted[0])
    return (text if kind is str else _convert(flag, text, kind)) in accepted


def _flag_meant(flag: str) -> str:
    """` (did you mean --wandb-exp-name?)` for a near known flag; only close ones: a far one misleads."""
    known = [*VALUE, *SWITCH, *NO_EFFECT, *REFUSED, *SPECIAL]
    meant = difflib.get_close_matches(flag, known, n=1, cutoff=0.8)
    return f" (did you mean {meant[0]}?)" if meant else ""


def _expect(flag: str, values: list[str], count: int | None) -> None:
    if count is None:
        if not values:
            raise ConfigError(f"{flag}: needs at least one value")
    elif len(values) != count:
        wanted = "no value" if count == 0 else f"{count} value" + ("s" if count > 1 else "")
        raise ConfigError(f"{flag}: takes {wanted}, got {values or 'none'}")


def _convert(flag: str, text: str, convert: Any) -> Any:
    if isinstance(convert, dict):
        if text not in convert:
            raise ConfigError(f"{flag} {text}: not supported; use one of {', '.join(convert)}")
        return convert[text]
    try:
        return convert(text)
    except ValueError:
        kind = {int: "a whole number", float: "a number"}.get(convert, "a whole number")  # (minutes)
        raise ConfigError(f"{flag} {text}: expects {kind}") from None


# Megatron's Adam betas where the flags are absent.
BETA_DEFAULTS = (("--adam-beta1", "0.9"), ("--adam-beta2", "0.999"))


def finish(result: Translation, env: dict[str, str]) -> None:
    """Flags that combine: data paths, betas, samples, directories; then the layout and checks."""
    v, given = result.values, result.given
    v.setdefault("model.max_position_embeddings", v["model.encoder_seq_length"])
    betas = [_convert(flag, given.get(flag, [default])[0], float) for flag, default in BETA_DEFAULTS]
    v["model.optim.betas"] = betas
    data_paths.apply(v, given)
    _null_tokenizer(result)
    _null_tokenizer_ids(result)
    _sentencepiece_vocabulary(result)
    _tokenizers_vocabulary(result)
    _vocab_extra_ids(result)
    _tiktoken(result)
    _padded_vocab(result)
    _no_pad_vocab(result)
    _eod_mask_on_mock_data(result)
    _query_groups(result)
    _no_position_embedding(result)
    _qkv_bias(result)
    _swiglu_width(v, given)
    if "--fp16" in given and "--bf16" in given:  # Megatron refuses the pair too
        raise ConfigError("--fp16 and --bf16: give one of them")
    _xla_precision(result, env)
    _fp16_gradients(result)
    _static_loss_scale(result)
    _nan_check(result)
    _grad_reduce_in_bf16(result)
    _data_parallel_sharding(result)
    _decoupled_lr(result)
    _loss_average(result)
    _recompute(v, given)
    _full_recompute_layers(result)
    _sequence_parallel(result)
    _step_batch_schedule(result)
    _layout(v, env)
    _virtual_pipeline(v, given)
    if "--rampup-batch-size" in given:
        v["model.rampup_batch_size"] = [
            _convert("--rampup-batch-size", x, int) for x in given["--rampup-batch-size"]
        ]
    _iterations(v, given)
    _no_periodic_saves(result)
    _schedule_lengths(v, given)
    _directories(result)
    _wandb(result)
    check_benchmark_mode(result)
    _filled_in(result)


def _sequence_parallel(result: Translation) -> None:
    """Megatron's validate_args turns --sequence-parallel off at tensor parallel size 1 (with a
    warning) where gptrain's config refuses the pair: a command line that runs there runs here."""
    if (
        "--sequence-parallel" in result.given
        and result.values.get("model.tensor_model_parallel_size", 1) == 1
    ):
        result.values["model.sequence_parallel"] = False
        result.notes.append(
            "--sequence-parallel (off at --tensor-model-parallel-size 1, as Megatron turns it off)"
        )


def _null_tokenizer(result: Translation) -> None:
    """Megatron's NullTokenizer (its mock-data benchmarks) has --vocab-size ids, the last one the end of
    document (since core 0.18; up to 0.17 it added that one: --vocab-size + 1), padded as any
    vocabulary. gptrain's mock data without a tokenizer is that vocabulary; real data needs the
    tokenizer it was prepared with."""
    v, given = result.values, result.given
    if v.get("model.tokenizer.type") != "NullTokenizer":
        return
    if "--vocab-size" not in given:
        raise ConfigError("--tokenizer-type NullTokenizer needs --vocab-size, as in Megatron")
    if v.get("model.data.data_impl") != "mock":
        raise ConfigError(
            "--tokenizer-type NullTokenizer: gptrain reads a dataset with the tokenizer it was prepared with "
            "(its vocabulary and end-of-document id); give that --tokenizer-type, or --mock-data without "
            "--data-path"
        )
    v["model.tokenizer.type"] = MEGATRON_DEFAULTS["model.tokenizer.type"]  # read by no tokenizer
    result.notes.append(
        f"--tokenizer-type NullTokenizer (a vocabulary of --vocab-size {v['model.data.mock_vocab_size']} ids, "
        "as Megatron's since core 0.18; up to core 0.17 it added one, the end of document)"
    )


def _null_tokenizer_ids(result: Translation) -> None:
    """--null-tokenizer-eod-id and --null-tokenizer-pad-id (core 0.18) set NullTokenizer's ids, which
    Megatron's mock documents end with and its loss masks; gptrain's mock samples are uniform random
    ids (NullTokenizer stands for mock data only here), so neither has a token to find."""
    kind = _tokenizer_type(result.given)
    for flag, none in (
        ("--null-tokenizer-eod-id", "documents to end"),
        ("--null-tokenizer-pad-id", "padding to mask"),
    ):
        if flag not in result.given:
            continue
        _convert(flag, result.given[flag][0], int)
        if kind == "NullTokenizer":
            result.notes.append(f"{flag} (gptrain's mock data is uniform random ids, without {none})")
        else:
            result.notes.append(f"{flag} (Megatron reads it only for NullTokenizer, not {kind})")


def _sentencepiece_vocabulary(result: Translation) -> None:
    """gptrain's SentencePieceTokenizer is Megatron's legacy one, as `data prepare` encodes it (data
    and model agree). Megatron's tokenizer system of core 0.15 gave the GPT dataset the model's eos as
    the end of document (the model kept the legacy vocabulary), and from core 0.17, with the legacy
    system gone, the vocabulary is the model's pieces alone: said where the model is read (not mock
    data without one), not with --legacy-tokenizer."""
    if _tokenizer_type(result.given) != "SentencePieceTokenizer" or "--legacy-tokenizer" in result.given:
        return
    if not result.values.get("model.tokenizer.model"):
        return
    result.notices.append(
        "--tokenizer-type SentencePieceTokenizer builds Megatron's legacy vocabulary (the model's pieces, then "
        "<CLS> <SEP> <EOD> <MASK> and the <PAD>/<BOS>/<EOS> it lacks; <EOD> ends documents), as Megatron-LM up "
        "to core 0.14 and with --legacy-tokenizer; core 0.15 and 0.16 end documents with the model's eos, and "
        "from core 0.17 the vocabulary is the model's pieces alone: GPTSentencePieceTokenizer's, give that "
        "type (and data prepared with it) for them"
    )


def _tokenizer_type(given: dict[str, list[str]]) -> str:
    """The --tokenizer-type given (Megatron's default where absent), NullTokenizer included."""
    return (given.get("--tokenizer-type") or [MEGATRON_DEFAULTS["model.tokenizer.type"]])[0]


def _tokenizers_vocabulary(result: Translation) -> None:
    """Megatron reads --vocab-size for NullTokenizer and TikTokenizer only: beside a tokenizer's files
    (GPT-2's vocab and merges, a tokenizer.json, a SentencePiece model) the vocabulary is the
    tokenizer's, with mock data too, where gptrain would otherwise take --vocab-size instead."""
    v, given = result.values, result.given
    kind = _tokenizer_type(given)
    has_files = v.get("model.tokenizer.vocab_file") or v.get("model.tokenizer.model")
    if "--vocab-size" in given and kind not in ("NullTokenizer", "TikTokenizer") and has_files:
        del v["model.data.mock_vocab_size"]
        result.notes.append(
            f"--vocab-size (Megatron reads it only with NullTokenizer and TikTokenizer: the vocabulary is {kind}'s)"
        )


def _vocab_extra_ids(result: Translation) -> None:
    """Megatron passes --vocab-extra-ids to BERT's tokenizers and its legacy SentencePieceTokenizer
    only (T5's <extra_id_N> span tokens, which grow the vocabulary): with any other type it trains
    unchanged, as `data prepare` says too; with SentencePieceTokenizer gptrain has no such rows."""
    if "--vocab-extra-ids" not in result.given:
        return
    count = _convert("--vocab-extra-ids", result.given["--vocab-extra-ids"][0], int)
    if count < 0:
        raise ConfigError(f"--vocab-extra-ids {count}: give 0 or more")
    if count and _tokenizer_type(result.given) == "SentencePieceTokenizer":
        raise ConfigError(
            f"--vocab-extra-ids {count}: Megatron's legacy SentencePieceTokenizer adds <extra_id_0> ... to "
            "its vocabulary (T5's span masking), which gptrain does not; drop the flag or give 0"
        )


# Megatron's TikTokenizer flags (the last its older name of --tokenizer-special-tokens)
TIKTOKEN_FLAGS = (
    "--tiktoken-pattern",
    "--tiktoken-num-special-tokens",
    "--tokenizer-special-tokens",
    "--tiktoken-special-tokens",
)


def _tiktoken(result: Translation) -> None:
    """Megatron's TikTokenizer reads a tiktoken vocabulary file with --tiktoken-pattern,
    --vocab-size, --tiktoken-num-special-tokens and --tokenizer-special-tokens (or its older name
    --tiktoken-special-tokens, which Megatron reads only where the newer one is absent); with another
    tokenizer the TikTokenizer flags change nothing (as in Megatron's llama3 example's mock-data
    branch), but its special tokens are added to it, which gptrain does not do (NullTokenizer, built
    from --vocab-size alone, ignores them too). gptrain's
    TikTokenizer also takes a tiktoken encoding name (cl100k_base), whose split is its own."""
    v, given = result.values, result.given
    kind = _tokenizer_type(given)
    model = v.get("model.tokenizer.model")
    specials = [flag for flag in ("--tokenizer-special-tokens", "--tiktoken-special-tokens") if flag in given]
    if kind != "TikTokenizer":
        if "--tokenizer-special-tokens" in given and kind != "NullTokenizer":
            raise ConfigError(
                f"--tokenizer-special-tokens: Megatron adds them to {kind}'s vocabulary, which gptrain does "
                "not; prepare the data with a tokenizer that holds them, or drop the flag"
            )
        for flag in TIKTOKEN_FLAGS:
            if flag in given:
                result.notes.append(_ignored_tiktoken_flag(flag, kind))
        return
    if model and not names_a_file(model) and not os.path.isfile(model):  # an encoding name
        if named := [flag for flag in TIKTOKEN_FLAGS if flag in given]:
            raise ConfigError(
                f"{', '.join(named)}: --tokenizer-model {model} is a tiktoken encoding name, with its own "
                "split, vocabulary and special tokens; drop the flag, or give Megatron's tiktoken vocabulary file"
            )
        return
    if "--tiktoken-pattern" in given:
        v["model.tokenizer.tiktoken_pattern"] = _convert(
            "--tiktoken-pattern", given["--tiktoken-pattern"][0], {"v1": "v1", "v2": "v2"}
        )
    if "--tiktoken-num-special-tokens" in given:
        count = _convert("--tiktoken-num-special-tokens", given["--tiktoken-num-special-tokens"][0], int)
        v["model.tokenizer.tiktoken_num_special_tokens"] = count
    if specials:
        v["model.tokenizer.special_tokens"] = list(given[specials[0]])
    if "--vocab-size" in given:  # the tokenizer's vocabulary, with mock data too
        v["model.tokenizer.vocab_size"] = v.pop("model.data.mock_vocab_size")


def _padded_vocab(result: Translation) -> None:
    """--padded-vocab-size N (Megatron since August 2025) is the embedding's rows, padding skipped, at
    any tensor-parallel size: model.padded_vocab_size, recorded as N so that a resume under another TP
    keeps them (the config and the layout check it against the tokenizer and TP)."""
    rows = result.values.get("model.padded_vocab_size")
    if rows is not None:
        result.notices.append(
            f"--padded-vocab-size {rows}: {rows} embedding rows at any --tensor-model-parallel-size"
        )


def _no_pad_vocab(result: Translation) -> None:
    """--no-pad-vocab-size (or --disable-pad-vocab-size; Megatron's tokenizer flags since core 0.18)
    skips the padding: the vocabulary's own rows, whatever --make-vocab-size-divisible-by says, where
    --padded-vocab-size does not set them. Under TP they are rounded up to a multiple of it, where
    Megatron's vocabulary-parallel embedding stops unless TP divides them."""
    switch = next(
        (flag for flag in ("--no-pad-vocab-size", "--disable-pad-vocab-size") if flag in result.given), None
    )
    if switch is None:
        return
    v = result.values
    if v.get("model.padded_vocab_size") is not None:
        result.notes.append(f"{switch} (--padded-vocab-size sets the rows)")
        return
    v["model.make_vocab_size_divisible_by"] = 1
    said = f"{switch}: the embedding has the vocabulary's rows, unpadded (--make-vocab-size-divisible-by 1)"
    tp = v.get("model.tensor_model_parallel_size", 1)
    if tp > 1:
        said += f", at --tensor-model-parallel-size {tp} rounded up to a multiple of it (Megatron stops unless it divides them)"
    result.notices.append(said)


def _eod_mask_on_mock_data(result: Translation) -> None:
    """Megatron's mock documents end with the tokenizer's end of document, which --eod-mask-loss takes
    out of the loss; gptrain's mock samples are uniform random ids, with a tokenizer too: without one
    (--vocab-size alone, NullTokenizer) there is no end of document to mask, with one only its id
    where drawn by chance. Said either way."""
    v = result.values
    if "--eod-mask-loss" not in result.given or v.get("model.data.data_impl") != "mock":
        return
    if v.get("model.data.mock_vocab_size"):
        masked = "without end-of-document tokens to mask"
    else:
        masked = (
            "not documents ending with the end of document Megatron's mock data masks: only that id drawn "
            "by chance is masked"
        )
    result.notes.append(f"--eod-mask-loss (gptrain's mock data is uniform random ids, {masked})")


def _ignored_tiktoken_flag(flag: str, kind: str) -> str:
    """The note for a TikTokenizer flag beside `kind`, which Megatron builds without it."""
    if kind == "NullTokenizer" and flag in ("--tokenizer-special-tokens", "--tiktoken-special-tokens"):
        return f"{flag} (Megatron's NullTokenizer is --vocab-size ids alone: it ignores them)"
    return f"{flag} (Megatron reads it only for TikTokenizer, not {kind})"


def _query_groups(result: Translation) -> None:
    """Megatron reads --num-query-groups only with --group-query-attention (then 1 group, multi-query
    attention, unless given); without it attention is multi-head whatever --num-query-groups says."""
    given = result.given
    groups = _convert("--num-query-groups", (given.get("--num-query-groups") or ["1"])[0], int)
    if "--group-query-attention" in given:
        result.values["model.num_query_groups"] = groups
    elif "--num-query-groups" in given:
        result.notes.append(
            "--num-query-groups (Megatron ignores it without --group-query-attention: multi-head attention)"
        )


def _no_position_embedding(result: Translation) -> None:
    """--no-position-embedding drops the learned position table. Beside rope (which has none; Megatron's
    llama-style scripts give both) it changes nothing; without rope Megatron since July 2023 raises
    that it is deprecated, and before it trained without any position embedding, which gptrain cannot."""
    if "--no-position-embedding" not in result.given:
        return
    if result.values.get("model.position_embedding_type") != "rope":
        raise ConfigError(
            "--no-position-embedding without rope: a model without position embeddings is not implemented "
            "(Megatron since July 2023 refuses the flag unless --position-embedding-type rope); give "
            "--position-embedding-type rope for rotary embeddings, or drop the flag for learned absolute ones"
        )
    result.notes.append("--no-position-embedding (rope has no learned position table)")


def _qkv_bias(result: Translation) -> None:
    """--add-qkv-bias (Qwen's scripts) gives the query, key and value projections a bias: theirs already
    beside Megatron's default biased linear layers; alone, with --disable-bias-linear, not implemented."""
    if "--add-qkv-bias" not in result.given:
        return
    if "--disable-bias-linear" in result.given:
        raise ConfigError(
            "--add-qkv-bias with --disable-bias-linear: biases on the query, key and value projections alone "
            "are not implemented (gptrain's linear layers have biases all or none)"
        )
    result.notes.append(
        "--add-qkv-bias (the query, key and value projections have biases already, as every linear layer)"
    )


def _swiglu_width(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron's validate_args: --swiglu without --ffn-hidden-size takes 2/3 of 4h, down to a
    multiple of 64 (the parameters of a 4h GELU MLP in three matrices), not 4h."""
    if "--swiglu" in given and "--ffn-hidden-size" not in given and "model.hidden_size" in v:
        v["model.ffn_hidden_size"] = int((4 * v["model.hidden_size"] * 2 / 3) / 64) * 64


def _xla_precision(result: Translation, env: dict[str, str]) -> None:
    """The Trainium scripts export XLA_USE_BF16=1 (torch-xla casts every float tensor to bf16) instead
    of giving --bf16; gptrain reads the precision from the flags only, so the run is fp32: said."""
    given = result.given
    if env.get("XLA_USE_BF16", "").lower() in ("1", "true") and not ("--bf16" in given or "--fp16" in given):
        result.notes.append(
            "XLA_USE_BF16=1 in the environment (torch-xla's bf16 on Trainium; gptrain reads the precision "
            "from the flags: fp32 here, add --bf16 for bf16 mixed precision)"
        )


def _static_loss_scale(result: Translation) -> None:
    """Megatron's --loss-scale V: a constant scale (ConstantGradScaler, over --initial-loss-scale and
    its dynamic settings), which gptrain keeps under --fp16 only: bf16 gradients need no scale."""
    given, v = result.given, result.values
    if "--loss-scale" not in given:
        return
    scale = _convert("--loss-scale", given["--loss-scale"][0], float)
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


def _nan_check(result: Translation) -> None:
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


def _fp16_gradients(result: Translation) -> None:
    """Megatron's --fp16 keeps the gradients in fp16, accumulated and all-reduced, unless
    --accumulate-allreduce-grads-in-fp32 is given; gptrain's are always fp32 (fp32 weights under
    autocast), so their rounding differs: said."""
    given = result.given
    if "--fp16" in given and "--accumulate-allreduce-grads-in-fp32" not in given:
        result.notes.append(
            "--fp16 (gptrain accumulates and all-reduces gradients in fp32, as Megatron does with "
            "--accumulate-allreduce-grads-in-fp32; Megatron's --fp16 alone keeps them in fp16)"
        )


def _grad_reduce_in_bf16(result: Translation) -> None:
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


# Megatron-FSDP's --data-parallel-sharding-strategy -> model.data_parallel_sharding: optim (ZeRO-1, whole
# gradients) has no equal in gptrain; its nearest is ZeRO-2, as for --use-distributed-optimizer.
MEGATRON_FSDP_SHARDING = {
    "no_shard": "ddp",
    "optim": "shard_grad_op",
    "optim_grads": "shard_grad_op",
    "optim_grads_params": "full_shard",
}
MEGATRON_FSDP_DEFAULT = "optim_grads_params"  # since April 2026; no_shard before


def _data_parallel_sharding(result: Translation) -> None:
    """Megatron-FSDP (--use-megatron-fsdp) shards by --data-parallel-sharding-strategy, which Megatron
    reads only beside it, over --use-distributed-optimizer (Megatron-FSDP runs that optimizer itself);
    --use-torch-fsdp2 is PyTorch's fully_shard, gptrain's full_shard, refused beside either, as Megatron
    refuses it."""
    v, given, flag = result.values, result.given, "--data-parallel-sharding-strategy"
    strategy = (given.get(flag) or [MEGATRON_FSDP_DEFAULT])[0]
    sharding = _convert(flag, strategy, MEGATRON_FSDP_SHARDING)
    if "--use-torch-fsdp2" in given:
        for other in ("--use-megatron-fsdp", "--use-distributed-optimizer"):
            if other in given:
                raise ConfigError(f"--use-torch-fsdp2 and {other}: give one (Megatron refuses the pair)")
        v["model.data_parallel_sharding"] = "full_shard"
    if "--use-megatron-fsdp" not in given:
        if flag in given:
            result.notes.append(f"{flag} (Megatron reads it only with --use-megatron-fsdp)")
        return
    v["model.data_parallel_sharding"] = sharding
    if flag not in given:
        result.notes.append(
            f"no {flag} ({MEGATRON_FSDP_DEFAULT}, Megatron-FSDP's default since April 2026, as full_shard; "
            "no_shard before: give it for that)"
        )
    elif strategy == "optim":
        result.notes.append(
            f"{flag} optim (Megatron's ZeRO-1 keeps whole gradients; gptrain's nearest, shard_grad_op, shards "
            "them too, as for --use-distributed-optimizer)"
        )


def _decoupled_lr(result: Translation) -> None:
    """Megatron's --decoupled-lr (and --decoupled-min-lr, read only beside it) give the embedding and
    output layers a schedule of their own; gptrain has one for every weight, so only the values of
    --lr and --min-lr are taken, and any other is refused saying what it would change."""
    given, v = result.given, result.values
    if "--decoupled-lr" not in given:
        if "--decoupled-min-lr" in given:
            result.notes.append("--decoupled-min-lr (Megatron reads it only with --decoupled-lr)")
        return
    lr, min_lr = v["model.optim.lr"], v["model.optim.sched.min_lr"]
    peak = _convert("--decoupled-lr", given["--decoupled-lr"][0], float)
    floor = _convert("--decoupled-min-lr", (given.get("--decoupled-min-lr") or [str(min_lr)])[0], float)
    if (peak, floor) != (lr, min_lr):
        raise ConfigError(
            f"--decoupled-lr {peak} (--decoupled-min-lr {floor}): a learning rate of their own for the "
            f"embedding and output layers, where the other weights take --lr {lr} (--min-lr {min_lr}), is "
            "not implemented; drop --decoupled-lr and --decoupled-min-lr to train them at --lr"
        )
    result.notes.append("--decoupled-lr (the same as --lr and --min-lr)")
    if "--decoupled-min-lr" in given:
        result.notes.append("--decoupled-min-lr (the same as --min-lr)")


def _loss_average(result: Translation) -> None:
    """--eod-mask-loss without --calculate-per-token-loss: Megatron averages each micro-batch's own
    mean, gptrain the tokens of the whole global batch; said, since the gradients differ slightly. Not on
    mock data, whose note says what is masked (nothing, or an id drawn by chance: micro-batches of as many
    loss tokens, whose averages agree), so the flag is listed once."""
    mock = result.values.get("model.data.data_impl") == "mock"
    if "--eod-mask-loss" in result.given and "--calculate-per-token-loss" not in result.given and not mock:
        result.notes.append(
            "--eod-mask-loss (gptrain averages the loss over every loss token of the global batch, as "
            "Megatron's --calculate-per-token-loss does; Megatron's default averages each micro-batch's "
            "own mean, so gradients differ slightly where micro-batches hold different numbers of loss tokens)"
        )


def _recompute(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron's validate_args, whatever the order of the flags: --checkpoint-activations (before
    April 2023; later Megatron exits on it) is full recompute, uniform, of --recompute-num-layers
    (default 1) layers; then --recompute-activations makes the granularity selective. The names of
    August 2021 to April 2022, --activations-checkpoint-method/-num-layers, recompute full layers."""
    if "--activations-checkpoint-method" in given:
        v["model.activations_checkpoint_granularity"] = "full"
        v.setdefault("model.activations_checkpoint_num_layers", 1)
    if "--checkpoint-activations" in given:
        v["model.activations_checkpoint_granularity"] = "full"
        v["model.activations_checkpoint_method"] = "uniform"
        v.setdefault("model.activations_checkpoint_num_layers", 1)
    if "--recompute-activations" in given:
        v["model.activations_checkpoint_granularity"] = "selective"


def _full_recompute_layers(result: Translation) -> None:
    """Full recompute needs a method and a layer count, as Megatron requires: --recompute-num-layers
    has no default since September 2023 (core 0.4), and its TransformerConfig refuses full recompute
    without it (gptrain would otherwise recompute every layer of a stage)."""
    v = result.values
    if v.get("model.activations_checkpoint_granularity") != "full":
        return
    if v.get("model.activations_checkpoint_method") is None:
        raise ConfigError(
            "--recompute-granularity full needs --recompute-method uniform or block (Megatron refuses it without)"
        )
    if "model.activations_checkpoint_num_layers" not in v:
        raise ConfigError(
            "--recompute-granularity full needs --recompute-num-layers N, the layers each uniform group or "
            "block recomputes (Megatron refuses it without)"
        )


def _parsed_schedule(v: dict[str, Any], given: dict[str, list[str]]) -> list[tuple[int, int]] | None:
    """The schedule's words joined: Megatron's example expands its array unquoted, one word per entry."""
    words = given.get(batch_schedule.FLAG)
    return (
        None
        if words is None
        else batch_schedule.parse_schedule(" ".join(words), v["model.encoder_seq_length"])
    )


def _step_batch_schedule(result: Translation) -> None:
    """--step-batch-size-schedule: the global batch is its last batch size, and a schedule of equal
    steps is Megatron's linear ramp. Megatron refuses --global-batch-size beside it, yet its own 175B
    example gives both: the same size is taken (said), another is refused."""
    v, given, flag = result.values, result.given, batch_schedule.FLAG
    schedule = _parsed_schedule(v, given)
    if schedule is None:
        return
    if "--rampup-batch-size" in given:
        raise ConfigError(
            f"{flag} and --rampup-batch-size: give one (Megatron ignores --rampup-batch-size now)"
        )
    text, last = " ".join(given[flag]), schedule[-1][1]
    if "--global-batch-size" in given:
        if v["model.global_batch_size"] != last:
            raise ConfigError(
                f"--global-batch-size {v['model.global_batch_size']} and {flag} '{text}' (last batch {last}): "
                "drop --global-batch-size, as Megatron refuses the pair"
            )
        result.notes.append(f"--global-batch-size (the last batch of {flag}; Megatron refuses the pair)")
    elif "--train-iters" in given:
        result.notes.append(
            f"{flag} with --train-iters (the --lr-*-iters schedule counts batches of the last size, {last}; "
            "Megatron without --global-batch-size counts batches of micro-batch x data-parallel size)"
        )
    v["model.global_batch_size"] = last
    ramp = batch_schedule.as_ramp(schedule, text)
    if ramp is not None:
        v["model.rampup_batch_size"] = ramp
        if batch_schedule.floored_steps(schedule):
            result.notes.append(
                f"{flag} (its token thresholds floored to samples are not evenly spaced: each batch "
                "step comes at most one sample after Megatron's)"
            )


def _layout(v: dict[str, Any], env: dict[str, str]) -> None:
    """Nodes and processes from torchrun/srun's environment; Megatron's default global batch."""
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1)
    local = int(env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0] or world)
    v["trainer.devices"] = local
    v["trainer.num_nodes"] = max(1, world // max(local, 1))
    if "model.global_batch_size" not in v:
        model_parallel = v.get("model.tensor_model_parallel_size", 1) * v.get(
            "model.pipeline_model_parallel_size", 1
        )
        v["model.global_batch_size"] = v["model.micro_batch_size"] * max(1, world // model_parallel)


UNEVEN_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")


def _virtual_pipeline(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """--num-virtual-stages-per-pipeline-rank N: Megatron's interleaved schedule with N model chunks
    per rank; --num-layers-per-virtual-pipeline-stage N: with (num_layers / pipeline stages) / N,
    num_layers counting the embedding and loss when switched into the split, as Megatron does;
    Megatron refuses it under an uneven split (the stages hold different numbers of layers)."""
    flag, chunks_flag = "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"
    if flag in given and chunks_flag in given:
        raise ConfigError(f"{flag} and {chunks_flag}: give one of them, as Megatron asserts")
    if chunks_flag in given:
        v["model.virtual_pipeline_model_parallel_size"] = _convert(chunks_flag, given[chunks_flag][0], int)
    if flag not in given:
        return
    uneven = [name for name in UNEVEN_FLAGS if name in given]
    if uneven:
        raise ConfigError(
            f"{flag} with {' and '.join(uneven)}: give the chunks per rank with {chunks_flag} instead, "
            "as Megatron asserts under an uneven pipeline split"
        )
    per_chunk = _convert(flag, given[flag][0], int)
    layers, counted = _layers_in_pipeline_split(v)
    pp = v.get("model.pipeline_model_parallel_size", 1)
    if per_chunk < 1 or pp < 2 or layers % pp or (layers // pp) % per_chunk:
        raise ConfigError(
            f"{flag} {per_chunk}: the {counted} per {pp} pipeline stages must split into chunks of "
            f"{per_chunk} layers (and --pipeline-model-parallel-size must be at least 2), as Megatron asserts"
        )
    v["model.virtual_pipeline_model_parallel_size"] = layers // pp // per_chunk


# The switches that count a non-layer part as one layer of the pipeline split, and what each counts.
ACCOUNTED_PARTS = {
    "model.account_for_embedding_in_pipeline_split": "embedding",
    "model.account_for_loss_in_pipeline_split": "loss",
}


def _layers_in_pipeline_split(v: dict[str, Any]) -> tuple[int, str]:
    """The layers Megatron splits over the stages, num_layers + 1 for each part counted as a layer
    (the embedding, the loss), and how to say it: it divides these, not num_layers, into chunks."""
    layers = v["model.num_layers"]
    parts = [part for key, part in ACCOUNTED_PARTS.items() if v.get(key)]
    if not parts:
        return layers, f"{layers} layers"
    counted = layers + len(parts)
    return counted, f"{layers} layers " + " ".join(f"+ 1 ({part})" for part in parts) + f" = {counted}"


# The warmup flags in iterations and in samples, and the key each sets.
WARMUP_COUNTS = {
    "--lr-warmup-iters": "model.optim.sched.warmup_steps",
    "--lr-warmup-samples": "model.optim.sched.warmup_samples",
}


def _zero_warmups_dropped(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron asserts that the warmup flag of the other kind than the run's (and, beside
    --lr-warmup-fraction, of either kind) is 0, its default, not that it is absent: given as 0 it is
    taken as absent (`--train-samples ... --lr-warmup-iters 0` runs, as in Megatron)."""
    kind = "-samples" if "--train-samples" in given else "-iters"
    for flag, key in WARMUP_COUNTS.items():
        other = not flag.endswith(kind) or "--lr-warmup-fraction" in given
        if flag in given and other and _convert(flag, given[flag][0], int) == 0:
            del given[flag]
            if key in MEGATRON_DEFAULTS:
                v[key] = MEGATRON_DEFAULTS[key]
            else:
                v.pop(key, None)


def _iterations(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """--train-iters or --train-samples (exclusive, as in Megatron); the checkpoint interval."""
    _zero_warmups_dropped(v, given)
    if "--train-samples" in given:
        if "--train-iters" in given:
            raise ConfigError("--train-iters and --train-samples: give only one (Megatron refuses both too)")
        samples = _convert("--train-samples", given["--train-samples"][0], int)
        ramp = BatchRamp.from_config(v.get("model.rampup_batch_size"), v["model.global_batch_size"], 1)
        v["trainer.max_steps"] = ramp.iterations_for(samples)  # Megatron's count, ramp-up steps included
        schedule = _parsed_schedule(v, given)
        if schedule is not None:  # Megatron counts a schedule's last partial batch, not a ramp's
            v["trainer.max_steps"] = batch_schedule.iterations_for(schedule, samples)
        if v["trainer.max_steps"] < 1:  # the config's check would name --train-iters, which sets max_steps
            batch = v["model.global_batch_size"]
            raise ConfigError(
                f"--train-samples {samples}: less than one global batch of {batch} samples, so no iteration "
                f"trains (Megatron drops a partial last batch); give at least {batch}"
            )
        if samples < 1:  # a ramp's first batch trains even from 0, which the config's check would name
            raise ConfigError(f"--train-samples {samples}: must be at least 1; give the samples to train")
        v["trainer.train_samples"] = samples  # the train indices are built for it, as Megatron builds them
        if "--lr-decay-iters" in given or "--lr-warmup-iters" in given:
            raise ConfigError("--train-samples goes with --lr-decay-samples/--lr-warmup-samples, not *-iters")
        v.setdefault("model.optim.sched.decay_samples", samples)
    elif "--train-iters" not in given:
        raise ConfigError("pretrain_gpt.py needs --train-iters or --train-samples")
    elif "--lr-decay-samples" in given or "--lr-warmup-samples" in given:
        raise ConfigError("--train-iters goes with --lr-decay-iters/--lr-warmup-iters, not *-samples")
    elif "--rampup-batch-size" in given:
        _refuse_ramp_by_iterations(v, given)
    if "--lr-warmup-fraction" in given and ("--lr-warmup-iters" in given or "--lr-warmup-samples" in given):
        raise ConfigError("--lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples: give only one")
    if "model.optim.sched.warmup_samples" in v or "model.optim.sched.warmup_fraction" in v:
        v["model.optim.sched.warmup_steps"] = 0
    if not {"--save-interval", "--persistent-save-interval"} & given.keys():  # Megatron saves only at the end
        v["exp_manager.checkpoint_callback_params.every_n_train_steps"] = v["trainer.max_steps"]


# Megatron's two names for the interval between its (persistent) checkpoints.
SAVE_INTERVAL_FLAGS = ("--save-interval", "--persistent-save-interval")


def _no_periodic_saves(result: Translation) -> None:
    """A save interval of 0 is no periodic saves in Megatron (it saves when the interval is truthy):
    gptrain's interval of the whole run, which saves at the end (and on --exit-duration-in-mins and
    SIGTERM/SIGUSR1), as without the flag. Megatron since July 2025 asserts an interval above 0 beside
    --save, and before it failed at the end (`iteration % 0`) without saving: said in a note."""
    v, given = result.values, result.given
    key = "exp_manager.checkpoint_callback_params.every_n_train_steps"
    flag = next((flag for flag in reversed(given) if flag in SAVE_INTERVAL_FLAGS), None)
    if flag is None or v[key] != 0:
        return
    v[key] = v["trainer.max_steps"]
    if _directory(given, "--save"):
        result.notes.append(
            f"{flag} 0 (no periodic saves: a checkpoint at the end, on --exit-duration-in-mins and on "
            "SIGTERM/SIGUSR1 only; Megatron since July 2025 refuses 0 beside --save, and before it stopped at "
            "the end on a division by zero without saving)"
        )


def _schedule_lengths(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron's scheduler asserts a decay of at least one step, a warmup that ends before the decay
    does, and a warmup that starts at or below --lr. gptrain would read a decay of 0 as the whole run
    and train the others as given, so they are refused by their flags, as Megatron refuses them."""
    decay, decay_named = _decay_length(given)
    warmup_flag = next((flag for flag in WARMUP_FLAGS if flag in given), None)
    if warmup_flag is not None and decay > 0:
        text = given[warmup_flag][0]
        fraction = warmup_flag == "--lr-warmup-fraction"
        warmup = _convert(warmup_flag, text, float) * decay if fraction else _convert(warmup_flag, text, int)
        if warmup >= decay:
            raise ConfigError(
                f"{warmup_flag} {text} and the decay over {decay_named}: the warmup must end before the decay "
                "does, as Megatron asserts; give a shorter warmup or a longer decay"
            )
    init, lr = v.get("model.optim.sched.warmup_init_lr"), v["model.optim.lr"]
    if init is not None and init > lr:
        if "--lr" not in given:  # the rate it rises to is gptrain's default, on no command line
            raise ConfigError(
                f"--lr-warmup-init {init} is above the default --lr {lr}: the warmup rises from "
                f"--lr-warmup-init to --lr, as Megatron asserts; give --lr, at least {init}"
            )
        raise ConfigError(
            f"--lr-warmup-init {init} > --lr {lr}: the warmup rises from --lr-warmup-init to --lr, as Megatron "
            "asserts; give a smaller --lr-warmup-init"
        )


# The run's length flags, the decay flag of the same unit, and the unit's name.
DECAY_UNITS = {
    "--train-iters": ("--lr-decay-iters", "iteration"),
    "--train-samples": ("--lr-decay-samples", "sample"),
}


def _decay_length(given: dict[str, list[str]]) -> tuple[int, str]:
    """The decay's length in the run's unit and its flag as given (the run's length without one)."""
    run_flag = "--train-samples" if "--train-samples" in given else "--train-iters"
    decay_flag, unit = DECAY_UNITS[run_flag]
    flag = decay_flag if decay_flag in given else run_flag
    length = _convert(flag, given[flag][0], int)
    if length <= 0 and flag == decay_flag:  # a run of no steps is the config's to refuse
        raise ConfigError(
            f"{flag} {length}: Megatron asserts a decay of at least one {unit}; give its length, or drop "
            f"{decay_flag} to decay over {run_flag}"
        )
    return length, f"{flag} {given[flag][0]}"


# The --lr-*-iters flags and their counterparts in samples.
SAMPLE_FLAGS = {"--lr-decay-iters": "--lr-decay-samples", "--lr-warmup-iters": "--lr-warmup-samples"}


def _refuse_ramp_by_iterations(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron ramps the batch only in a run counted in samples: beside --train-iters it asserts
    'expected no batch-size rampup for iteration-based training' (and since April 2026 ignores the
    flag). Refused, naming the sample counts of the same run: the --train-samples that trains those
    iterations, and each --lr-*-iters K as the samples the first K iterations of the ramp consume, so
    the warmup and decay end at the same iterations (K full batches would end them later)."""
    batch, iterations = v["model.global_batch_size"], v["trainer.max_steps"]
    ramp = BatchRamp.from_config(v["model.rampup_batch_size"], batch, 1)
    instead = [f"--train-samples {ramp.train_samples_for(iterations)} in place of --train-iters {iterations}"]
    for flag, samples_flag in SAMPLE_FLAGS.items():
        count = _convert(flag, given[flag][0], int) if flag in given else 0
        if count:
            instead.append(f"{samples_flag} {ramp.samples_for(count)} in place of {flag} {count}")
    raise ConfigError(
        "--rampup-batch-size with --train-iters: Megatron ramps the batch only when the run is counted in "
        "samples (it asserts 'expected no batch-size rampup for iteration-based training'; since April 2026 "
        f"it ignores the flag); give {', '.join(instead)} for the ramp, or drop --rampup-batch-size for a "
        "constant batch"
    )


def _directories(result: Translation) -> None:
    """--save is the run directory (checkpoints in <save>/checkpoints). A --load that differs from it
    is where the run starts from until it has a checkpoint of its own; then a restart resumes that.
    A --load without --save is only read, as Megatron reads it: the run starts from it every time
    and its logs go to the run directory of a run without --save, not into the loaded run's (nor
    into a --tensorboard-dir that is the loaded run). --tensorboard-dir is where the TensorBoard
    events go."""
    v, given = result.values, result.given
    save = _directory(given, "--save")
    load = _directory(given, "--load")
    board = (given.get("--tensorboard-dir") or [None])[0]
    run_dir = save or (board if not (board and load and _holds(board, load)) else None)
    if run_dir:
        v["exp_manager.explicit_log_dir"] = run_dir
    v["exp_manager.resume_if_exists"] = bool(save and load)
    if not save:  # Megatron saves only under --save
        v["exp_manager.create_checkpoint_callback"] = False
        written = f"; {load} is read, not written" if load else ""
        result.notes.append(f"no --save (no checkpoints are written, as in Megatron{written})")
    elsewhere = bool(load and not (save and os.path.abspath(save) == os.path.abspath(load)))
    if elsewhere:
        v["exp_manager.resume_from_checkpoint"] = load
    for flag in ("--finetune", "--no-load-optim", "--no-load-rng"):
        if flag in given and not elsewhere:
            result.notes.append(f"{flag} (applies to a --load that differs from --save)")
    if board:  # Megatron's writer puts its events there, and nothing else
        v["exp_manager.tensorboard_dir"] = board


def _holds(board: str, load: str) -> bool:
    """Whether `load` is the run directory `board` or a directory inside it (its checkpoints/, a
    step_N), however spelled (relative, trailing slash, through a symlink)."""
    return Path(os.path.realpath(load)).is_relative_to(os.path.realpath(board))


def _directory(given: dict[str, list[str]], flag: str) -> str | None:
    """--save / --load, or where they are absent the Neuron fork's --save-xser / --load-xser (the
    Trainium tutorial's), the same directory written or read one rank at a time."""
    return (given.get(flag) or given.get(f"{flag}-xser") or [None])[0]


# The --wandb-* flags Megatron reads only beside a --wandb-project: flag -> wandb_logger_kwargs key.
WANDB_RUN_FLAGS = {"--wandb-exp-name": "name", "--wandb-entity": "entity"}


def _wandb(result: Translation) -> None:
    """Megatron logs to W&B when --wandb-project is not empty, its files in --wandb-save-dir or <save>/wandb."""
    v, given = result.values, result.given
    project = (given.get("--wandb-project") or [""])[0]
    if not project:
        result.notes.extend(
            f"{flag} (without --wandb-project)"
            for flag in given
            if flag in (*WANDB_RUN_FLAGS, "--wandb-save-dir")
        )
        return
    v["exp_manager.create_wandb_logger"] = True
    v["exp_manager.wandb_logger_kwargs.project"] = project
    for flag, key in WANDB_RUN_FLAGS.items():
        if given.get(flag, [""])[0]:  # Megatron passes an empty entity on as none
            v[f"exp_manager.wandb_logger_kwargs.{key}"] = given[flag][0]
    if "--wandb-save-dir" in given:
        v["exp_manager.wandb_logger_kwargs.save_dir"] = given["--wandb-save-dir"][0]
    elif "exp_manager.explicit_log_dir" in v:
        v["exp_manager.wandb_logger_kwargs.save_dir"] = os.path.join(
            v["exp_manager.explicit_log_dir"], "wandb"
        )


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


def render(value: Any) -> str:
    """A value as an override's right-hand side that gptrain reads back to the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(render(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {render(item)}" for key, item in value.items()) + "}"
    if isinstance(value, int | float):
        return repr(value)
    from gptrain.config.yamlio import parse_value

    text = str(value)
    # a leading `~` quoted: unquoted, an override refuses it as a home directory the shell left
    if (
        parse_value(text) == text
        and not any(c in text for c in ",[]{}'\"")
        and ": " not in text
        and text[:1] != "~"
    ):
        return text
    return "'" + text + "'" if "'" not in text else '"' + text + '"'
