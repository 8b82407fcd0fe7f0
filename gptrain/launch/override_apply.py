"""Command-line overrides of the launch config: parsed as Hydra reads them and applied to the
composed tree, a key that does not exist refused by name (gptrain.launch.compose composes with these).

Only omegaconf is imported: this runs on login nodes and must start fast.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gptrain.config import nemo_launcher
from gptrain.config.loader import DATA_PREFIX_SPLIT, check_one_split
from gptrain.config.yamlio import override_value
from gptrain.errors import ConfigError, printable
from gptrain.utils.overrides import (
    OverrideForm,
    delete_key,
    is_list_item,
    past_the_end,
    set_key,
    split_override,
)


@dataclass
class Override:
    """One override from the command line, split (`form`), and its value as Hydra reads it."""

    form: OverrideForm
    value: Any

    @property
    def key(self) -> str:
        return self.form.key

    @property
    def typed(self) -> str:
        """The override as given, for messages that name it."""
        return self.form.argument


def closest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """' (did you mean X?)' for the nearest choice, or a list of choices when nothing is near."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    if match:
        return f" (did you mean '{match[0]}'?)"
    shown = ", ".join(sorted(choices)[:12])
    return f" (valid: {shown})" if shown else ""


def parse_overrides(arguments: list[str]) -> list[Override]:
    """`key=value` strings (and Hydra's `+key=value`, `++key=value`, `~key`) to Overrides; values
    as Hydra reads them (`2`, `null`, `[0.5,${d}/a]`, `true`).

    `10:00:00` stays a string (YAML 1.1 would make it the base-60 integer 36000).
    """
    overrides = []
    for argument in arguments:
        form = split_override(argument, "training.trainer.num_nodes=2")
        value = override_value(form)
        overrides.append(Override(form, value))
    return overrides


# The training section's own mappings, which the job's messages (and NeMo's training scripts) name
# without the launch's `training.`: at the launch's top level a key under one is read by nothing.
TRAINING_ROOTS = ("run", "trainer", "exp_manager", "model")

# Mappings whose keys are the user's own (variable names, sbatch options): a new one needs no `+`.
FREE_FORM_MAPPINGS = ("env_vars", "additional_parameters")


def apply_override(cfg: DictConfig, override: Override) -> list[str]:
    """Set a dotted key; a key that does not exist is an error unless `+`, in a FREE_FORM_MAPPINGS
    mapping (`env_vars`, `cluster.additional_parameters`), or in `training`. Returns the dotted keys
    it set (none for `~key`): each key of a mapping merged into a section, not the section.

    Training keys are checked by the training config loader, which knows the full schema
    (a preset file lists only some of the keys gptrain accepts).
    """
    if override.form.delete:
        if override.key in ("training.run", "training.run.name"):  # ~training.run deletes the name too
            raise ConfigError(
                f"override '{override.typed}': a run needs a name (its results directory); set it"
            )
        delete_key(cfg, override.key, override.form, override.value)
        return []
    if is_list_item(cfg, override.key, override.form):
        return _set(cfg, override)
    parts = override.key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts):
        index = list_index(node, part, override, ".".join(parts[:depth]))  # an item, as OmegaConf.update
        present = index is not None or (isinstance(node, DictConfig) and part in node)
        key: int | str = part if index is None else index
        free_form = depth > 0 and parts[depth - 1] in FREE_FORM_MAPPINGS
        if not present and depth == 0 and part in TRAINING_ROOTS:  # `+` too: nothing reads it there
            raise ConfigError(_training_key_at_the_top(override))
        if not present and not override.form.add and not free_form and parts[0] != "training":
            if override.key in nemo_launcher.PATH_KEYS:
                raise ConfigError(_no_launcher_path(override))
            if override.key.startswith("run_") and override.key[4:] in nemo_launcher.RUN_SWITCHES:
                raise ConfigError(
                    f"unknown key '{override.key}': this config.yaml picks its stages with the stages list,"
                    " not the run_* switches of older launchers: give stages=[...] (e.g."
                    " stages=[data_preparation,training])"
                )
            where = ".".join(parts[:depth]) or "the top level"
            keys = [str(k) for k in node] if isinstance(node, DictConfig) else []
            raise ConfigError(
                f"unknown key '{override.key}': no '{part}' in {where}{closest(part, keys)};"
                " prefix with + to add a new key"
            )
        # an interpolation there is replaced, not read: `${oc.env:UNSET}` is why one overrides it
        if not present or OmegaConf.is_interpolation(node, key):
            break
        if not isinstance(node[key], DictConfig | ListConfig):
            break
        node = node[key]
    if parts[0] == "training" and len(parts) > 1 and not override.form.add:
        check_training_key(cfg, ".".join(parts[1:]), override)
    unset_for_the_users_order(cfg, override)
    return _set(cfg, override)


def unset_for_the_users_order(cfg: DictConfig, override: Override) -> None:
    """Remove the variables an env_vars override sets (`cluster.env_vars={IFACE: x, NCCL_SOCKET_IFNAME:
    $IFACE}`, `cluster.env_vars.NAME=v`) so that setting them appends them in the user's order: set in
    place, a profile's NCCL_SOCKET_IFNAME kept its place before the IFACE the user wrote first, and
    was exported empty."""
    parent_key, _, leaf = override.key.rpartition(".")
    if leaf == "env_vars" and isinstance(override.value, dict):
        mapping_key, names = override.key, list(override.value)
    elif parent_key.rpartition(".")[2] == "env_vars":
        mapping_key, names = parent_key, [leaf]
    else:
        return
    above, _, name_of_mapping = mapping_key.rpartition(".")
    holder = OmegaConf.select(cfg, above, throw_on_resolution_failure=False) if above else cfg
    if not isinstance(holder, DictConfig) or OmegaConf.is_interpolation(holder, name_of_mapping):
        return  # `env_vars: ${other}` is replaced, not edited
    mapping = holder.get(name_of_mapping)
    if isinstance(mapping, DictConfig):
        for name in names:
            if name in mapping:
                del mapping[name]


def list_index(node: Any, part: str, override: Override, where: str) -> int | None:
    """`part` as the index of an item of the list `node` (`cluster.myl.1.a`), None where `node` is no
    list or `part` no index; an index past its end is an error, as in Hydra."""
    if not (isinstance(node, ListConfig) and part.isascii() and part.isdigit()):
        return None
    if int(part) >= len(node):
        raise past_the_end(override.form, where, len(node))
    return int(part)


def _set(cfg: DictConfig, override: Override) -> list[str]:
    try:
        return set_key(cfg, override.key, override.value)
    except OmegaConfBaseException as error:
        raise ConfigError(f"override '{override.typed}': {str(error).splitlines()[0]}") from None


def _no_launcher_path(override: Override) -> str:
    """NeMo's `launcher_scripts_path=/x` moves its results and data (`${launcher_scripts_path}/results`);
    gptrain's config has no such root, and `+` would add a key nothing reads: say what moves them."""
    root = printable(override.form.text.rstrip("/")) or "DIR"
    return (
        f"unknown key '{override.key}': the NeMo launcher's directory, under which its config.yaml puts"
        " base_results_dir and data_dir; gptrain's config has neither it nor a use for it: give"
        f" base_results_dir={root}/results data_dir={root}/data, or launch from the NeMo tree with"
        f" --config-dir {root}/conf"
    )


def _training_key_at_the_top(override: Override) -> str:
    key = override.key
    meant = shlex.quote(printable(f"training.{key}={override.form.text}"))  # as it would be typed
    return (
        f"unknown key '{key}': no '{key.split('.')[0]}' in the top level of a launch (the training's"
        f" keys are under training.): did you mean {meant}?"
    )


def check_training_key(cfg: DictConfig, dotted: str, override: Override) -> None:
    """Training keys are checked against the training schema (a preset lists only some); one split
    of the data prefix by the loader's rule (`cfg` holds the data prefix it goes into)."""
    from gptrain.config import all_keys
    from gptrain.config.nemo_keys import is_ignored_nemo_key

    key = override.key
    if dotted.startswith(DATA_PREFIX_SPLIT):
        check_one_split(cfg, dotted, override.typed)
        return
    valid = all_keys()
    sections = {k.rsplit(".", 1)[0] for k in valid if "." in k}
    if dotted in valid or dotted in sections or is_ignored_nemo_key(dotted):
        return
    suggestions = [f"training.{k}" for k in valid]
    raise ConfigError(f"unknown key '{key}'{closest(key, suggestions)}")
