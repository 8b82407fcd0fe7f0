"""The command line split into flags, each checked against the flag table and applied alone."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from gptrain.data.blend_spec import is_number
from gptrain.errors import ConfigError
from gptrain.megatron.flags import (
    NO_EFFECT,
    NO_EFFECT_CHOICES,
    NO_EFFECT_WHY,
    REFUSED,
    SPECIAL,
    SWITCH,
    VALUE,
)
from gptrain.megatron.unimplemented_flags import NOT_IMPLEMENTED, RENAMED

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


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
            result.values[key] = convert_value(flag, values[0], convert)
    elif flag in NO_EFFECT:
        _expect(flag, values, NO_EFFECT[flag])
        accepted, why = NO_EFFECT_CHOICES.get(flag, (None, ""))
        if accepted is not None and not _is_accepted(flag, values[0], accepted):
            raise ConfigError(f"{flag} {values[0]}: {why}")
        note = f"{flag} ({NO_EFFECT_WHY[flag]})" if flag in NO_EFFECT_WHY else flag
        if note not in result.notes:  # a flag repeated (scripts that join arrays) is listed once
            result.notes.append(note)
    else:
        refuse_unknown(flag)


def refuse_unknown(flag: str) -> None:
    """A flag of none of the tables: Megatron's deprecated name, a Megatron flag gptrain does not
    implement, or a name no Megatron knows (a typo: the near gptrain flag named)."""
    if flag in RENAMED:  # Megatron's validate_args stops on it too, naming the successor
        raise ConfigError(f"{flag}: no longer a Megatron flag (Megatron refuses it too); use {RENAMED[flag]}")
    # not "remove it": what an unknown flag changes, gptrain cannot say
    check = "check what it changes in Megatron before removing it (docs/migrating.md lists the flags gptrain takes)"
    if flag in NOT_IMPLEMENTED:  # no hint: the nearest gptrain flag is another flag, not this one misspelt
        raise ConfigError(f"{flag}: a Megatron flag gptrain does not implement; {check}")
    raise ConfigError(f"{flag}: gptrain does not know this flag{_flag_meant(flag)}; {check}")


def _is_accepted(flag: str, text: str, accepted: tuple[Any, ...]) -> bool:
    """Whether `text` is one of `accepted` as Megatron's argparse reads it, in their type: int('01')
    is 1, so `--context-parallel-size 01` is Megatron's default too."""
    kind = type(accepted[0])
    return (text if kind is str else convert_value(flag, text, kind)) in accepted


def _flag_meant(flag: str) -> str:
    """` (did you mean --wandb-exp-name?)` for a near known flag; only close ones: a far one misleads."""
    known = [*VALUE, *SWITCH, *NO_EFFECT, *REFUSED, *SPECIAL]
    # Megatron's other flags compete: a typo of one of them is not hinted to a different gptrain flag
    meant = difflib.get_close_matches(flag, [*known, *NOT_IMPLEMENTED], n=1, cutoff=0.8)
    if not meant:
        return ""
    either = ", a Megatron flag gptrain does not implement either" if meant[0] in NOT_IMPLEMENTED else ""
    return f" (did you mean {meant[0]}{either}?)"


def _expect(flag: str, values: list[str], count: int | None) -> None:
    if count is None:
        if not values:
            raise ConfigError(f"{flag}: needs at least one value")
    elif len(values) != count:
        wanted = "no value" if count == 0 else f"{count} value" + ("s" if count > 1 else "")
        raise ConfigError(f"{flag}: takes {wanted}, got {values or 'none'}")


def convert_value(flag: str, text: str, convert: Any) -> Any:
    if isinstance(convert, dict):
        if text not in convert:
            raise ConfigError(f"{flag} {text}: not supported; use one of {', '.join(convert)}")
        return convert[text]
    try:
        return convert(text)
    except ValueError:
        kind = {int: "a whole number", float: "a number"}.get(convert, "a whole number")  # (minutes)
        raise ConfigError(f"{flag} {text}: expects {kind}") from None
