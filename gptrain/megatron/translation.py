"""A translation's result: the overrides, the notes, and the flag names its checks are said in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gptrain.megatron.defaults import WARMUP_FLAGS
from gptrain.megatron.flags import SWITCH, VALUE
from gptrain.train.schedule_checks import ScheduleNames, config_ramp, shown_steps

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig
    from gptrain.train.schedule import ScheduleSpec


DECAY_STYLES = VALUE["--lr-decay-style"][1]  # Megatron's word -> gptrain's schedule name
# the switches that make a resume take the checkpoint's schedule (model.optim.sched.from_checkpoint)
CHECKPOINT_SCHEDULE_FLAGS = ("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler")
# keys that flags read together set (translate.finish), named by their flags in a config check's message
# where one of them was given; a list value (`key=[3, 4, 10]`) as the words given (`--flag 3 4 10`)
SET_BY_COMBINED: dict[str, tuple[str, ...]] = {
    "model.tokenizer.vocab_size": ("--vocab-size",),
    "model.tokenizer.null_eod_id": ("--null-tokenizer-eod-id",),
    "model.tokenizer.null_pad_id": ("--null-tokenizer-pad-id",),
    "model.optim.betas": ("--adam-beta1", "--adam-beta2"),
    "model.rampup_batch_size": ("--rampup-batch-size",),
}


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
        for key, combined in SET_BY_COMBINED.items():
            if any(flag in self.given for flag in combined):
                flags[key] = "/".join(combined)
                if len(combined) == 1:
                    words = f"{combined[0]} {' '.join(self.given[combined[0]])}"
                    listed = rf"(?<![\w.]){re.escape(key)}=\[[^\]]*\]"
                    message = re.sub(listed, lambda _, words=words: words, message)
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
        counted = "--lr-warmup-samples" if run_flag == "--train-samples" else "--lr-warmup-iters"
        warmup_flag = next((flag for flag in WARMUP_FLAGS if flag in self.given), counted)
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
        wsd_flag = "--lr-wsd-decay-samples" if run_flag == "--train-samples" else "--lr-wsd-decay-iters"
        from_checkpoint = next(
            (flag for flag in CHECKPOINT_SCHEDULE_FLAGS if flag in self.given), CHECKPOINT_SCHEDULE_FLAGS[0]
        )
        return ScheduleNames(
            run=self._named(run_flag, cfg.trainer.max_steps),
            wsd_decay=self._named(wsd_flag, spec.wsd_decay_steps or 0),
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
            own_schedule=f"drop {from_checkpoint}",
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
            f"{sched}wsd_decay_steps": "--lr-wsd-decay-iters",
            f"{sched}wsd_decay_samples": "--lr-wsd-decay-samples",
            f"{sched}wsd_decay_style": "--lr-wsd-decay-style",
        }

    def _named(self, flag: str, iterations: float) -> str:
        """`--flag value` as given (Megatron's default 0 where absent), with its `iterations` where the
        flag counts otherwise (samples, a fraction)."""
        shown = f"{flag} {self.given.get(flag, ['0'])[0]}"
        return shown if flag.endswith("-iters") else f"{shown} ({shown_steps(iterations)} iterations)"


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
    text = str(value)
    # a leading `~` quoted: unquoted, an override refuses it as a home directory the shell left
    if (
        _reads_as_itself(text)
        and not any(c in text for c in ",[]{}'\"")
        and ": " not in text
        and text[:1] != "~"
    ):
        return text
    return "'" + text + "'" if "'" not in text else '"' + text + '"'


def _reads_as_itself(text: str) -> bool:
    """Whether `text` unquoted is that text as an override (`str(5)` is 5, `choice(a)` refused)."""
    from gptrain.config.yamlio import parse_value
    from gptrain.errors import ConfigError

    try:
        return parse_value(text) == text
    except ConfigError:
        return False
