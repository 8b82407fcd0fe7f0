"""Load a training config: NeMo-launcher YAML preset or file + `key.sub=value` overrides.

The YAML is composed under a root that carries the launcher's top-level keys
(`base_results_dir`, `data_dir`), so presets keep NeMo's interpolations
(`${base_results_dir}/${.name}`, `${training.run.results_dir}`, `${multiply:4,${.hidden_size}}`)
and resolve the same way alone as inside `gptrain launch`.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
import typing
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from gptrain.config.build import build, check_known_key, setting_source
from gptrain.config.nemo_keys import ignored_summary
from gptrain.config.normalize import normalize
from gptrain.config.schema import PER_SPLIT_KEYS, TrainingConfig
from gptrain.config.validate import validate
from gptrain.config.yamlio import load_file, load_text, override_value
from gptrain.errors import ConfigError
from gptrain.utils.overrides import (
    HYDRA_SETTINGS_REASON,
    OverrideForm,
    delete_key,
    is_hydra_setting,
    is_list_item,
    set_key,
    setting_override,
    split_override,
)
from gptrain.utils.paths import look_up
from gptrain.utils.rank import is_rank_zero

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "training"
ROOT_DEFAULTS = {"base_results_dir": "results", "data_dir": "data"}
DROPPED_TOP_KEYS = ("defaults", "hydra")
# Where a run goes when the file does not say (NeMo's own spellings), so that `run.name=x` and
# `base_results_dir=y` move a run made from defaults too, instead of every run sharing one dir.
RUN_DIR_DEFAULTS = {
    "run": {"name": "gpt3_126m", "results_dir": "${base_results_dir}/${.name}"},
    "exp_manager": {"explicit_log_dir": "${training.run.results_dir}/results"},
}


def list_presets() -> list[str]:
    """Preset names such as `gpt3/126m`, from the YAML files shipped with gptrain."""
    return sorted(str(p.relative_to(PRESET_DIR).with_suffix("")) for p in PRESET_DIR.rglob("*.yaml"))


def preset_path(name: str) -> Path:
    """The file of a preset name, or the name itself when it is a YAML file path (one under a
    directory this user may not search is a ConfigError: Path.is_file raised PermissionError)."""
    if name.endswith((".yaml", ".yml")):
        found = look_up(name)
        if found.kind == "unreachable":
            raise ConfigError(f"{name}: {found.why}")
        if found.kind == "file":
            return Path(name)
    path = PRESET_DIR / f"{name}.yaml"
    if path.is_file():
        return path
    raise ConfigError(f"unknown training preset '{name}'{_suggest_preset(name, list_presets())}")


def _suggest_preset(name: str, presets: list[str]) -> str:
    """The preset meant (`126m` -> `gpt3/126m`, `gpt3/126` -> `gpt3/126m`), else the list of them."""
    meant = meant_choice(name, presets, cutoff=0.75)
    return f"; did you mean '{meant}'?" if meant else f"; the presets are {', '.join(presets)}"


def meant_choice(name: str, choices: list[str], cutoff: float) -> str | None:
    """The choice a missing `folder/file` most likely meant, by its file name: the same file in
    another folder (`126m` -> gpt3/126m), one of the same model size the name begins (`gpt3/7b` ->
    gpt3/7b_improved, NeMo's only 7b; `gpt3/1` -> gpt3/1b_improved, not gpt3/126m), else a near name of
    the same model size: `gpt3/7b` is not gpt3/175b, nor `gpt3/400m` gpt3/40b, nor `gpt3/12` gpt3/126m
    (models 10 to 100 times larger or smaller, one word from being launched)."""
    leaf = name.rpartition("/")[2].removesuffix(".yaml").removesuffix(".yml")  # `gpt3/126m.yaml`
    by_leaf: dict[str, str] = {}
    for choice in choices:
        by_leaf.setdefault(choice.rpartition("/")[2], choice)
    if leaf in by_leaf:
        return by_leaf[leaf]
    same_size = [other for other in by_leaf if _leading_number(other) == _leading_number(leaf)]
    begun = [other for other in same_size if leaf and other.startswith(leaf)]
    if begun:
        return by_leaf[min(begun, key=len)]
    near = difflib.get_close_matches(leaf, same_size, n=1, cutoff=cutoff)
    return by_leaf[near[0]] if near else None


def _leading_number(name: str) -> str:
    """`400m_improved` -> `400`: the model size a preset's name starts with ("" for none)."""
    return name[: len(name) - len(name.lstrip("0123456789"))]


def register_resolvers() -> None:
    """NeMo's `multiply` and `sum` resolvers: the launcher's presets write
    `ffn_hidden_size: ${multiply:4, ${.hidden_size}}`, NeMo's own megatron_gpt_config.yaml
    `cpu_offloading_num_layers: ${sum:${.num_layers},-1}`; and the launcher's `divide_ceil` and
    `divide_floor`, which its conversion and evaluation files use (`nodes: ${divide_ceil:${tp}, 8}`)."""
    resolvers = {
        "multiply": lambda x, y: x * y,
        "sum": lambda x, y: x + y,
        "divide_ceil": lambda x, y: int(math.ceil(x / y)),
        "divide_floor": lambda x, y: int(math.floor(x / y)),
    }
    for name, function in resolvers.items():
        if not OmegaConf.has_resolver(name):
            with warnings.catch_warnings():  # omegaconf 2.4 renames the function; both spellings work
                warnings.simplefilter("ignore", UserWarning)
                OmegaConf.register_new_resolver(name, function)


def load_training_config(
    preset: str | None = None,
    overrides: typing.Sequence[str] = (),
    config_file: str | None = None,
    report_ignored: bool = True,
    config_text: str | None = None,
    given: typing.Mapping[str, str] | None = None,
    origin: str | None = None,
) -> TrainingConfig:
    """Compose, override, resolve, type-check and validate a training config.

    `config_text`: the YAML of `config_file`, not yet written (the launcher checks a run's
    config before it writes anything); errors name the launcher's override that set the key
    (`given`: key -> `key=value` as typed), else `origin` (the file the values came from: the
    launcher's group file, since `config_file` does not exist yet), else `config_file`.
    """
    register_resolvers()
    source = origin or str(config_file or (preset_path(preset) if preset else "<defaults>"))
    given = dict(given or {})  # dotted key -> the override that set it: its errors name the command line
    root = _compose_root(preset, config_file, config_text, given)
    hydra_settings = []
    for override in overrides:
        if is_hydra_setting(split_override(override, "trainer.max_steps=100").key):
            hydra_settings.append(override)
            continue
        for key in _apply_override(root, override):
            given[key] = override
    _set_run_dir_defaults(root, given)  # `exp_manager.explicit_log_dir=null`: NeMo's "choose", as in a file
    if report_ignored and hydra_settings and is_rank_zero():
        print(f"gptrain: ignoring {', '.join(hydra_settings)}: {HYDRA_SETTINGS_REASON}", file=sys.stderr)
    data = _resolve(root, source, given)
    legacy = _method_without_granularity(data)
    ignored: list[str] = []
    cfg = build(TrainingConfig, data, "", ignored, source, given)
    cfg.ignored_keys = ignored
    notes = legacy + normalize(cfg)
    validate(cfg)
    if report_ignored and ignored and is_rank_zero():
        print(f"gptrain: ignoring NeMo keys ({ignored_summary(ignored)})", file=sys.stderr)
    for note in notes if report_ignored and is_rank_zero() else []:
        print(f"gptrain: note: {note}", file=sys.stderr)
    return cfg


def _load_yaml(path: str | Path, text: str | None = None) -> DictConfig:
    # `10:00:00` stays a string, unlike OmegaConf.load
    data = load_file(path) if text is None else load_text(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    try:
        loaded = OmegaConf.create(data)
    except (OmegaConfBaseException, ValueError) as error:
        raise ConfigError(f"{path}: not a valid config: {str(error).splitlines()[0]}") from None
    for key in DROPPED_TOP_KEYS:
        loaded.pop(key, None)
    return loaded


def _compose_root(
    preset: str | None,
    config_file: str | None,
    config_text: str | None = None,
    given: dict[str, str] | None = None,
) -> DictConfig:
    """Root = {base_results_dir, data_dir, training: <preset or file>}; a launcher file already has it."""
    training = _load_yaml(config_file, config_text) if config_file else None
    if training is None and preset:
        training = _load_yaml(preset_path(preset))
    if training is not None and "training" in training:
        root = training
        for key, value in ROOT_DEFAULTS.items():
            root.setdefault(key, value)
    else:
        root = OmegaConf.create({**ROOT_DEFAULTS, "training": training if training is not None else {}})
        _alias_own_root(root)
    _set_run_dir_defaults(root, given)
    return root


def _alias_own_root(root: DictConfig) -> None:
    """A training file's absolute interpolations read from the file's own top level: NeMo's
    megatron_gpt_config.yaml writes `${model.resume_from_checkpoint}`, which Hydra resolves from
    that file's root, while gptrain composes the file under `training`. A root key per top-level
    section of the file, an interpolation of `training.<section>`, lets both spellings resolve
    (the launcher's `${training.run.results_dir}` as before)."""
    for key in list(root.training.keys()):
        if key not in root:
            root[key] = f"${{training.{key}}}"


def _set_run_dir_defaults(root: DictConfig, given: typing.Mapping[str, str] | None = None) -> None:
    """The run's name and directories where the config lacks them or has null (`given`: what the
    command line set, whose `run.name=null` or `exp_manager=null` is refused where it is read,
    not filled in: gpt3_126m's name, or every other key of the section at its default)."""
    given = given or {}
    if not isinstance(root.get("training"), DictConfig):
        return
    for section, values in RUN_DIR_DEFAULTS.items():
        node = root.training.get(section)
        if node is None and section in given:
            continue
        if node is None:
            root.training[section] = {}
            node = root.training[section]
        if not isinstance(node, DictConfig):
            continue
        for key, value in values.items():
            if key == "name" and f"{section}.{key}" in given:
                continue
            # null as absent: NeMo's megatron_gpt_config.yaml writes `explicit_log_dir: null` for "choose"
            if key not in node or _is_null(node, key):
                node[key] = value


def _is_null(node: DictConfig, key: str) -> bool:
    """`key: null` in the file itself (an interpolation or `???` is not read here)."""
    if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
        return False
    return node[key] is None


def _apply_override(root: DictConfig, override: str) -> list[str]:
    """Set `key.sub=value` (or Hydra's `+key=value`, `++key=value`), or delete `~key`, in `root`;
    returns the dotted keys it set under `training` (or the root key): a mapping merged into a
    section sets the keys it gives, not the section (see set_key)."""
    form = split_override(override, "trainer.max_steps=100")
    key = form.key
    if key in ROOT_DEFAULTS:
        path = key
    else:
        key = key.removeprefix("training.")
        if not form.delete:  # `~key` may remove a key gptrain does not know (a newer NeMo file's)
            _check_key(root, key, form)
        path = f"training.{key}"
    value = override_value(form)
    if form.delete and key in ("run", "run.name"):  # the default name: gpt3_126m's directory, any preset
        raise ConfigError(
            f"override '{override}': a run needs a name (its results directory); set run.name=NAME"
        )
    if form.delete:
        delete_key(root, path, form, value)
        _restore_defaults(root)  # the key takes its default: gptrain's run directory, not none
        return [key]
    try:
        keys = set_key(root, path, value)
    except OmegaConfBaseException as error:
        raise ConfigError(f"override '{override}': {str(error).splitlines()[0]}") from None
    return keys if path == key else [dotted.removeprefix("training.") for dotted in keys]


def _check_key(root: DictConfig, key: str, form: OverrideForm) -> None:
    """An item of a list in range (`model.data.data_prefix.1=/b`, as Hydra sets it), one split of a
    per-split data prefix, or a key of the schema; else a one-line error."""
    if is_list_item(root, f"training.{key}", form):
        return
    if key.startswith(DATA_PREFIX_SPLIT):
        check_one_split(root, key, form.argument)
    else:
        check_known_key(key, f"override '{form.argument}'")


DATA_PREFIX_SPLIT = "model.data.data_prefix."


def check_one_split(root: DictConfig, key: str, override: str) -> None:
    """`key` is under `training` in `root` (the launcher's config too). `model.data.data_prefix.validation=...` sets one split of a per-split data prefix, as Hydra
    does; over a blend, one prefix or none (Hydra refuses it there too) the error shows the whole
    per-split form to write instead, where it said "unknown key"."""
    split = key.removeprefix(DATA_PREFIX_SPLIT)
    if split not in PER_SPLIT_KEYS:
        raise ConfigError(
            f"override '{override}': '{split}' is not a split: the per-split form has the keys "
            f"{', '.join(PER_SPLIT_KEYS)}"
        )
    current = OmegaConf.select(root, f"training.{key.rpartition('.')[0]}", throw_on_resolution_failure=False)
    if isinstance(current, DictConfig):
        return
    what = "a blend (a list)" if isinstance(current, ListConfig) else "one prefix" if current else "not set"
    example = ",".join(f"{name}:[1.0,/path/{name}_text_document]" for name in PER_SPLIT_KEYS)
    raise ConfigError(
        f"override '{override}': model.data.data_prefix is {what}, not per split; give every split its "
        f"data in one override: model.data.data_prefix={{{example}}} (each a prefix or a blend; a split "
        "left out has no data)"
    )


def _restore_defaults(root: DictConfig) -> None:
    """After `~key`: the root keys and run-directory keys gptrain fills in when a file lacks them."""
    for key, value in ROOT_DEFAULTS.items():
        root.setdefault(key, value)
    _set_run_dir_defaults(root)


def _resolve(root: DictConfig, source: str, given: dict[str, str]) -> dict[str, Any]:
    """The training section, resolved; an error names the override that set the key, else the file."""
    node = root.get("training")
    if node is None:
        return {}
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{source}: 'training' must be a mapping")
    try:  # only the training section: a launcher file's other `???` keys are the launcher's
        training = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as error:  # NeMo's `data_prefix: ???`: the user must give it
        key = str(getattr(error, "full_key", "") or "?").removeprefix("training.")
        where = f"{setting_source(key, source, given)}: '{key}' is ???" + (
            "" if setting_override(key, given) else " (mandatory) in the file"
        )
        raise ConfigError(f"{where}: give it, e.g. {key}=...") from None
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or "?"
        where = setting_source(str(key).removeprefix("training."), source, given)
        reason = str(error).splitlines()[0]
        raise ConfigError(f"{where}: cannot resolve '{key}': {reason}{environment_hint(reason)}") from None
    assert isinstance(training, dict)
    return training


def environment_hint(reason: str) -> str:
    """What to write where an interpolation could not read an environment variable (OmegaConf's
    message names the variable only), or spelled one as a config key (`${NODES}`)."""
    if unset := re.search(r"Environment variable '([^']+)' not found", reason):
        return f"; set {unset[1]}, or give a default: ${{oc.env:{unset[1]},DEFAULT}}"
    if missing := re.match(r"Interpolation key '([A-Z_][A-Z0-9_]*)' not found", reason):
        return f"; for the environment variable write ${{oc.env:{missing[1]}}}"
    return ""


def _method_without_granularity(data: dict[str, Any]) -> list[str]:
    """NeMo up to 1.10 (bignlp 22.x) had no model.activations_checkpoint_granularity: a method alone
    recomputed full layers. Such a config keeps that meaning (full), said in a note (a block of 0
    layers, bignlp 22.06's, recomputes none); a config that gives the granularity, null included,
    keeps its own."""
    model = data.get("model")
    if not isinstance(model, dict) or "activations_checkpoint_granularity" in model:
        return []
    method = model.get("activations_checkpoint_method")
    if method is None:
        return []
    model["activations_checkpoint_granularity"] = "full"
    legacy = (
        f"model.activations_checkpoint_method={method} without model.activations_checkpoint_granularity "
        "(NeMo <= 1.10's config, where the method alone recomputes full layers)"
    )
    if method == "block" and model.get("activations_checkpoint_num_layers") == 0:  # bignlp 22.06's
        return [
            f"{legacy} and model.activations_checkpoint_num_layers=0: no layer is recomputed, as in NeMo; set "
            "model.activations_checkpoint_num_layers=N to recompute the first N of each pipeline stage"
        ]
    return [f"{legacy}: full recompute; set model.activations_checkpoint_granularity=null for none"]
