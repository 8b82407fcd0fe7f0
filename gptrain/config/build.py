"""The resolved training section built into TrainingConfig: each leaf type-checked, each unknown key named."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any

from gptrain.config.nemo_keys import is_ignored_nemo_key, refused_value
from gptrain.config.schema import TrainingConfig
from gptrain.config.yamlio import as_int, as_switch
from gptrain.errors import ConfigError
from gptrain.utils.overrides import setting_override


def all_keys(cls: type = TrainingConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, for suggestions and docs."""
    return list(_schema_keys(cls, prefix))


@functools.cache
def _schema_keys(cls: type, prefix: str) -> tuple[str, ...]:
    """all_keys, worked out once: every override's check asks for it, and get_type_hints over the
    whole schema made that about 1.5 ms an override (40 ms of a 26-override config's 67)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "ignored_keys":
            continue
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(all_keys(hints[f.name], f"{dotted}."))
        else:
            keys.append(dotted)
    return tuple(keys)


def check_known_key(dotted: str, where: str) -> None:
    valid = all_keys()
    sections = {k.rsplit(".", 1)[0] for k in valid if "." in k}
    if dotted in valid or dotted in sections or is_ignored_nemo_key(dotted):
        return
    raise ConfigError(f"{where}: unknown key '{dotted}'{_suggest(dotted, valid)}")


def _suggest(name: str, choices: list[str]) -> str:
    """The likeliest meant key: a near leaf in the same section, the same leaf elsewhere, a near key.

    Only close matches are offered: a far one (`replace_sampler_ddp` -> `accelerator`) misleads.
    """
    section, _, leaf = name.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in choices if c.rpartition(".")[0] == section}
    close = [siblings[m] for m in difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.75)]
    if not close:
        close = [c for c in choices if c.rpartition(".")[2] == leaf][:1]
    if not close:
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.85)
    return f"; did you mean '{close[0]}'?" if close else ""


def build(
    cls: type, data: Any, prefix: str, ignored: list[str], source: str, given: dict[str, str] | None = None
) -> Any:
    """Turn a nested dict into the dataclass `cls`, type-checking each leaf; an error names the
    override that set the key (`given`) or else the file (`source`)."""
    given = given or {}
    section = prefix.rstrip(".") or "the top level"
    if data is None:
        _refuse_null_section(section, given)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{setting_source(prefix.rstrip('.'), source, given)}: '{section}' must be a mapping, got {data!r}"
        )
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - {"ignored_keys"}
    values = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if "." in str(key):
            raise ConfigError(
                f"{setting_source(dotted, source, given)}: {_dotted_key_hint(str(key), section)}"
            )
        if key not in names:
            if is_ignored_nemo_key(dotted):
                _refuse_unignorable(dotted, value, source, given, data)
                ignored.append(dotted)
                continue
            raise ConfigError(
                f"{setting_source(dotted, source, given)}: unknown key '{dotted}'{_suggest(dotted, all_keys())}"
            )
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            values[key] = build(kind, value, f"{dotted}.", ignored, source, given)
        else:
            _refuse_lightning_fraction(dotted, value, setting_source(dotted, source, given))
            values[key] = _coerce(value, kind, dotted, setting_source(dotted, source, given))
    return cls(**values)


def _refuse_unignorable(dotted: str, value: Any, source: str, given: dict[str, str], siblings: dict) -> None:
    """An ignored key holding a value that would change the training (nemo_keys.NO_OP_VALUES), the
    keys of an ignored sub-tree included (`exp_manager.ema: {enable: true}`); `siblings`: its section."""
    refused = refused_value(dotted, value, siblings)
    if refused:
        raise ConfigError(f"{setting_source(dotted, source, given)}: {refused}")
    if isinstance(value, dict):
        for key, inner in value.items():
            _refuse_unignorable(f"{dotted}.{key}", inner, source, given, value)


def _refuse_null_section(section: str, given: dict[str, str]) -> None:
    """`trainer=null` (or `model={optim: null}`) on the command line: read as an empty section, it put
    every key of it back to gptrain's defaults (an 8-node preset on one device) without a word; NeMo
    stops on it. A file's empty section (`trainer:` with nothing under it) is still read as one with
    no keys."""
    if section in given:
        typed = _as_typed(section, given[section])
        raise ConfigError(
            f"override '{given[section]}': '{section}' is a section of keys, not a value; set its keys "
            f"({typed}.<key>=...), or delete it (~{typed}) for gptrain's defaults"
        )


def _as_typed(dotted: str, override: str) -> str:
    """`dotted` (a key under `training`) as `override` spells its keys: `training.trainer` under
    gptrain launch, whose `training.model={optim: null}` set model.optim."""
    typed = override.partition("=")[0].lstrip("+")
    return f"training.{dotted}" if typed == "training" or typed.startswith("training.") else dotted


def _dotted_key_hint(key: str, section: str) -> str:
    """`trainer.max_steps: 5` in a YAML file is one key whose name has a dot (OmegaConf reads it so,
    and NeMo would not see it); the refusal said "unknown key 'trainer.max_steps'; did you mean
    'trainer.max_steps'?"."""
    first, _, rest = key.partition(".")
    return (
        f"'{key}' in {section} is one key with a dot in its name (YAML nests keys only by indentation);"
        f" write it nested: '{first}:' and under it '{rest}:'"
    )


# Trainer keys that NeMo's PyTorch Lightning reads as a fraction when given a float in (0, 1]
# (limit_val_batches: 1.0 validates on the whole split); gptrain counts batches and steps.
LIGHTNING_FRACTIONS = {
    "trainer.limit_val_batches": ("of the validation split (1.0: all of it)", "global batches"),
    "trainer.limit_test_batches": ("of the test split (1.0: all of it)", "global batches"),
    "trainer.val_check_interval": ("of an epoch", "steps"),
}


def _refuse_lightning_fraction(dotted: str, value: Any, where: str) -> None:
    """1.0 there is "all" to NeMo, and would be 1 here: refused, where before it was read as 1."""
    if dotted in LIGHTNING_FRACTIONS and isinstance(value, float) and 0.0 < value <= 1.0:
        fraction, unit = LIGHTNING_FRACTIONS[dotted]
        raise ConfigError(
            f"{where}: '{dotted}' {value} is a fraction {fraction} in NeMo and PyTorch Lightning;"
            f" gptrain counts {unit}: give a whole number"
        )


class KeyedSource(str):
    """The file a section's values came from (the str), and `written`: keys another file gave it, which
    errors about them name instead (`training: {model: {foo: 1}}` in the launcher's config.yaml is
    merged into the training group file, and gpt3/126m.yaml has no foo)."""

    written: dict[str, str]

    def __new__(cls, default: str, written: dict[str, str]) -> KeyedSource:
        source = super().__new__(cls, default)
        source.written = written
        return source

    def of(self, dotted: str) -> str:
        """The file that wrote `dotted` or the section above it that another file added."""
        parts = dotted.split(".")
        for depth in range(len(parts), 0, -1):
            if written := self.written.get(".".join(parts[:depth])):
                return written
        return str(self)


def setting_source(dotted: str, source: str, given: dict[str, str]) -> str:
    """What set `dotted`: its command-line override (or one of a key in it, which made a section the
    file lacks: `+training.model.foo.bar=1` made model.foo), else the config file that wrote it."""
    setter = setting_override(dotted, given) or next(
        (text for key, text in given.items() if key.startswith(f"{dotted}.")), None
    )
    if setter:
        return f"override '{setter}'"
    return source.of(dotted) if isinstance(source, KeyedSource) else source


def _coerce(value: Any, kind: Any, dotted: str, source: str) -> Any:
    """Check `value` against the annotation `kind` (int, float, bool, str, list, optional, Any)."""
    if kind is Any:
        return value
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{source}: '{dotted}' must not be null; give {_wanted(options, dotted)}")
    for option in options:
        converted = _convert(value, option)
        if converted is not _NO:
            return converted
    whole = _whole(value)
    if int in options and whole is not None:  # 1e23 or 100000000000000000000000: a whole number, too big
        raise ConfigError(
            f"{source}: '{dotted}' is {whole}, past the 64-bit integers that numpy and torch hold "
            f"(at most {INT64_MAX:,}); give a smaller value"
        )
    expected = " or ".join(_expected(o) for o in options if o is not type(None))
    raise ConfigError(f"{source}: '{dotted}' expects {expected}, got {value!r}{_bad_item(value, options)}")


_ITEMS = {int: "whole numbers", float: "finite floats", str: "strings", bool: "true or false values"}
_ITEM = {int: "a whole number", float: "a finite float", str: "a string", bool: "true or false"}


def _expected(option: Any) -> str:
    """An annotation in the words of the error (`list[float]` -> a list of finite floats)."""
    if typing.get_origin(option) is list:
        (item,) = typing.get_args(option)
        return f"a list of {_ITEMS.get(item, getattr(item, '__name__', str(item)))}"
    return "a finite float" if option is float else getattr(option, "__name__", str(option))


def _bad_item(value: Any, options: tuple[Any, ...]) -> str:
    """Where a list is given for a list key, the first item that does not convert (by position, from
    1): `[0.9, abc]` for a list of floats is a list, and `'abc'` is what is wrong."""
    lists = [o for o in options if typing.get_origin(o) is list]
    if not lists or not isinstance(value, list | tuple):
        return ""
    (item,) = typing.get_args(lists[0])
    for position, element in enumerate(value, start=1):
        if _convert(element, item) is _NO:
            return f": item {position}, {element!r}, is not {_ITEM.get(item, item)}"
    return ""


_WANTED = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}


def _wanted(options: tuple[Any, ...], dotted: str) -> str:
    """What a null key takes instead, in words (`int` -> a whole number, of steps for NeMo's fractions)."""
    if dotted in LIGHTNING_FRACTIONS and float not in options:
        fraction, unit = LIGHTNING_FRACTIONS[dotted]
        return (
            f"a whole number of {unit} (NeMo's float fraction {fraction} is refused: gptrain counts {unit})"
        )
    return " or ".join(_WANTED.get(o, getattr(o, "__name__", str(o))) for o in options)


_NO = object()


# Every int of the config ends up in numpy or torch (sizes, counts, seeds), whose integers are int64.
INT64_MAX = 2**63 - 1


def _whole(value: Any) -> int | None:
    """The int of an int field's value: an int, text of one (OmegaConf's rule, `${oc.env:N}`), or a
    whole float (`1e3`, which OmegaConf refuses; gptrain took it before). None: not a whole number."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return as_int(value)


def _convert(value: Any, option: Any) -> Any:
    origin = typing.get_origin(option)
    if origin is list:
        (item,) = typing.get_args(option)
        if not isinstance(value, list | tuple):
            return _NO
        items = [_convert(v, item) for v in value]
        return _NO if any(i is _NO for i in items) else items
    if option is bool:
        switch = as_switch(value)
        return _NO if switch is None else switch
    if option is int:
        whole = _whole(value)
        return whole if whole is not None and -INT64_MAX - 1 <= whole <= INT64_MAX else _NO
    if option is float:  # finite only: nan passes every `x > 0` check, inf trains to NaN losses
        if isinstance(value, bool):
            return _NO
        try:
            number = float(value) if isinstance(value, int | float | str) else None
        except (ValueError, OverflowError):  # an integer of 400 digits is past any float
            return _NO
        return number if number is not None and math.isfinite(number) else _NO
    if option is str:
        return str(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else _NO
    return _NO
