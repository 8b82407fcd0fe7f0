"""Hydra's override forms, read once for `gptrain train` and `gptrain launch`.

`key=value` sets a key, `+key=value` adds one, `++key=value` adds or sets, and `~key` (or
`~key=value`, which must match the value there) deletes one, so that the key takes its default.
gptrain is lenient where Hydra is strict: `+` on a key that exists sets it, as `++` does.

Nothing heavy is imported at the top (omegaconf only to set or delete a key): `gptrain/cli.py` reads
`OVERRIDE` before any command runs, and `gptrain launch` runs on login nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gptrain.errors import ConfigError, non_utf8, printable

# a word of the command line that is an override in one of Hydra's forms, not a preset or a path
OVERRIDE = re.compile(r"^(\+\+|\+)?[A-Za-z_][\w.]*=|^~[A-Za-z_][\w.]*(=|$)")
# a word after the options that is an override (split_override takes any key): also an sbatch option
# name (`cluster.additional_parameters.gpu-bind=none`) or a Hydra setting (`hydra/job_logging=x`).
# Not OVERRIDE itself: `gptrain eval --data-prefix` tells prefixes (`data/a=b/x`) from overrides by it.
OVERRIDE_WORD = re.compile(r"^(\+\+|\+)?[A-Za-z_][^=\s]*=|^~[A-Za-z_][^=\s]*(=|$)")
_FORM = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[^=]*)(?P<sep>=?)(?P<text>.*)$", re.S)


@dataclass(frozen=True)
class OverrideForm:
    """One command-line override, split; `text` is the value as typed ("" for a bare `~key`)."""

    key: str
    text: str
    add: bool = False
    delete: bool = False
    has_value: bool = True
    argument: str = ""  # the whole word as typed, for messages that name it


HYDRA_SETTINGS_REASON = "Hydra's own settings (gptrain reads configs without Hydra)"


def is_hydra_setting(key: str) -> bool:
    """`hydra.run.dir=.`, `hydra/job_logging=disabled`: settings of Hydra itself, which NeMo's scripts
    take and which mean nothing here (a config file's `hydra:` section is dropped, too)."""
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def split_preset(preset: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """argparse puts a leading override (`key=value`, `~key`) into the preset slot; move it back."""
    if preset is not None and ("=" in preset or OVERRIDE.match(preset)):
        return None, [preset, *overrides]
    return preset, overrides


def split_override(argument: str, example: str) -> OverrideForm:
    """`argument` in one of Hydra's forms; a one-line ConfigError (showing `example`) otherwise."""
    form = _FORM.match(argument)
    assert form is not None  # the pattern matches any text
    prefix, key, has_value = form["prefix"] or "", form["key"].strip(), bool(form["sep"])
    if not key or key.startswith(("+", "~")) or (not has_value and prefix != "~"):
        raise ConfigError(
            f"override '{argument}' is not key=value (e.g. {example}; +key=value adds a key, ~key deletes one)"
        )
    _check_utf8(argument)
    text = form["text"].strip()
    if not is_hydra_setting(key):  # ignored whatever its value
        _refuse_package(argument, key)
        _refuse_tilde(argument, text)
    return OverrideForm(key, text, prefix.startswith("+"), prefix == "~", has_value, argument)


def _refuse_package(argument: str, key: str) -> None:
    """`+training@foo=gpt3/126m` is Hydra's group@package form, which composes a group's file at
    another place; gptrain composes each group at its own, and the launcher kept `training@foo`
    as a new top-level key that nothing reads (the run trained the default preset)."""
    if "@" in key:
        raise ConfigError(
            f"override '{printable(argument)}': Hydra's group@package form is not supported (each group is"
            " composed at its own key); choose a group's file with GROUP=NAME, set a key with key.sub=value"
        )


def _check_utf8(argument: str) -> None:
    """A word of the command line that is not UTF-8 (a path in Latin-1) reaches Python with its bytes
    as surrogates, which no UTF-8 file can hold: hparams.yaml, the training log and the launch's
    config.yaml failed to be written with a UnicodeEncodeError traceback."""
    if (bad := non_utf8(argument)) is not None:
        raise ConfigError(
            f"override '{printable(argument)}': {bad[1]} is not UTF-8, and the config, its copies and the "
            "logs are UTF-8 text; rename the path (or give the value) in UTF-8"
        )


# `~` opening the value, an item of it, a cast's value (`str(~/x)`) or a value inside braces
# (`{a: ~}`), outside quotes
_TILDE = re.compile(r"(?:^|[\[{,(])\s*~|\{[^{}]*:\s*~")
# A quoted value as Hydra's override grammar reads one: a backslash escapes the character after it
# (`'It\'s'`, `'C:\\'`), so a quote after an odd number of backslashes does not close the value.
QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)


def _refuse_tilde(argument: str, text: str) -> None:
    """`vocab_file=~/gpt2/vocab.json`: the shell expands `~` only where a word starts (or after the
    `=` of a plain NAME=), so a dotted key's value keeps it, and no file `~/...` exists on the nodes;
    nor is it YAML's null (Hydra refuses it, as NeMo does). Quoted (`'~/x'`) it is that text."""
    if _TILDE.search(QUOTED.sub("", text)):
        raise ConfigError(
            f"override '{printable(argument)}': the shell did not expand this '~' (it does only at the start "
            "of a word) and it is not null here; write the path in full ($HOME/...), or null"
        )


def set_key(cfg: Any, key: str, value: Any) -> list[str]:
    """Set dotted `key` in the OmegaConf mapping `cfg` as Hydra applies an override: a mapping given
    for a mapping is merged into it (`trainer={max_steps: 5}` keeps the file's other trainer keys),
    anything else replaces what is there. Replacing the whole section dropped the preset's other keys
    to gptrain's defaults without a word (`model.optim={lr: 1e-3}` lost warmup_steps and min_lr).

    Returns the dotted keys the override set, for errors to name it: `key` when it replaced what was
    there, each key of the mapping it merged (`trainer.devices`) otherwise, so that an error in a key
    the file set (`trainer.max_steps: abc`) names the file, not the override."""
    from omegaconf import DictConfig, OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False) if parent_key else cfg
    merge = (
        isinstance(value, dict)
        and isinstance(parent, DictConfig)
        and leaf in parent
        and not OmegaConf.is_interpolation(parent, leaf)
        and not OmegaConf.is_missing(parent, leaf)
        and isinstance(parent[leaf], DictConfig)
    )
    OmegaConf.update(cfg, key, value, merge=merge, force_add=True)
    return merged_keys(key, value) if merge else [key]


def is_list_item(cfg: Any, key: str, form: OverrideForm) -> bool:
    """Whether dotted `key` (the override's key, in `cfg`) names an item of a list by its index (`cluster.srun_args.0`,
    `training.model.data.data_prefix.1`): Hydra sets such an item as any other key. An index past
    the end is a one-line error (Hydra's, too: an override cannot grow a list)."""
    from omegaconf import ListConfig, OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    if not parent_key or not (leaf.isascii() and leaf.isdigit()):
        return False
    parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False)
    if not isinstance(parent, ListConfig):
        return False
    if int(leaf) < len(parent):
        return True
    raise past_the_end(form, form.key.rpartition(".")[0], len(parent))  # as typed: no `training.`


def past_the_end(form: OverrideForm, shown: str, size: int) -> ConfigError:
    """The error for an index past the end of the list `shown` (as the override spells it)."""
    items = f"{size} item{'' if size == 1 else 's'}" + (f" (0 to {size - 1})" if size else "")
    return ConfigError(
        f"override '{printable(form.argument)}': {shown} has {items}; an override sets one of them and adds"
        f" none: give the whole list, {shown}=[...]"
    )


def merged_keys(key: str, mapping: dict[Any, Any]) -> list[str]:
    """The dotted keys under `key` that merging `mapping` sets: each value that is not a mapping
    (`model={optim: {lr: 1}}` sets model.optim.lr; `model={optim: null}` sets model.optim)."""
    keys = []
    for name, value in mapping.items():
        dotted = f"{key}.{name}"
        keys.extend(merged_keys(dotted, value) if isinstance(value, dict) else [dotted])
    return keys


def delete_key(cfg: Any, key: str, form: OverrideForm, expected: Any) -> None:
    """Remove dotted `key` from the OmegaConf mapping `cfg` (`~key`); with `~key=value`, only when
    the value there, resolved or as written, is `expected` (Hydra compares the resolved value;
    `~key=null` is a bare `~key`, as in Hydra). A key that is not there, or an item of a list, is a
    one-line error."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False) if parent_key else cfg
    if isinstance(parent, ListConfig):
        raise ConfigError(
            f"override '{form.argument}': an item of a list cannot be deleted by its index; give the list"
            f" without it: {form.key.rpartition('.')[0]}=[...]"
        )
    if not isinstance(parent, DictConfig) or leaf not in parent:
        raise ConfigError(
            f"override '{form.argument}': the key is not in the config, so there is nothing to delete"
        )
    if form.has_value and expected is not None:
        written = OmegaConf.to_container(parent, resolve=False)[leaf]
        resolved = OmegaConf.select(cfg, key, throw_on_resolution_failure=False, default=written)
        if expected not in (written, resolved):
            raise ConfigError(
                f"override '{form.argument}': the value there is {resolved!r}, not {expected!r};"
                " leave out '=value' to delete the key whatever it holds"
            )
    del parent[leaf]


def setting_override(dotted: str, given: dict[str, str]) -> str | None:
    """The override (as typed) that set `dotted`, or a mapping above it: `model.optim={lr: abc}` set
    model.optim.lr, `env_vars={B: x}` env_vars.B; None when the value came from a file."""
    parts = dotted.split(".")
    for depth in range(len(parts), 0, -1):
        if setter := given.get(".".join(parts[:depth])):
            return setter
    return None
