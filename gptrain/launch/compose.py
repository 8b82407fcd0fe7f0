"""Compose the launcher config the way the NeMo launcher does, without Hydra.

`configs/config.yaml` names a default file per group (`cluster`, `data_preparation`,
`training`) in its `defaults` list; the command line picks other files (`training=gpt3/126m`)
and overrides dotted keys (`training.trainer.num_nodes=2`). Interpolations such as
`${data_dir}` and `${training.run.results_dir}` resolve against the whole tree. Mistakes
name the closest valid choice, because a typo in a launch should cost seconds, not a queue wait.

Only omegaconf and yaml are imported: this runs on login nodes and must start fast.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from gptrain.config import nemo_launcher
from gptrain.config.build import KeyedSource
from gptrain.config.loader import (
    DATA_PREFIX_SPLIT,
    check_one_split,
    environment_hint,
    meant_choice,
    register_resolvers,
)
from gptrain.config.yamlio import load_file, override_value
from gptrain.errors import ConfigError, printable
from gptrain.utils.overrides import (
    HYDRA_SETTINGS_REASON,
    OverrideForm,
    delete_key,
    is_hydra_setting,
    is_list_item,
    past_the_end,
    set_key,
    setting_override,
    split_override,
)
from gptrain.utils.paths import look_up

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("cluster", "data_preparation", "validation", "training")
STAGES = ("data_preparation", "validation", "training")
# Keys a group file may carry for Hydra that mean nothing here.
HYDRA_KEYS = ("defaults", "hydra")
INTERPOLATION_ROOT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


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


@dataclass
class Composition:
    """The composed (unresolved) config and which file each group came from."""

    cfg: DictConfig
    choices: dict[str, str] = field(default_factory=dict)
    config_root: Path = CONFIG_ROOT
    overrides: dict[str, str] = field(default_factory=dict)  # dotted key -> `key=value` as typed
    # top-level key -> the file it was written in; a dotted key config.yaml's section gave a group -> config.yaml
    files: dict[str, str] = field(default_factory=dict)

    def training_overrides(self) -> dict[str, str]:
        """The overrides of `training.*` keys, by their key within the training config."""
        return {
            key.removeprefix("training."): text
            for key, text in self.overrides.items()
            if key.startswith("training.")
        }

    def resolved(self) -> dict[str, Any]:
        return _to_container(self.cfg, resolve=True, overrides=self.overrides, files=self.files)

    def interpolated_roots(self) -> set[str]:
        """The top-level keys some interpolation reads (`${my_root}/data` -> my_root)."""
        return set(INTERPOLATION_ROOT.findall(OmegaConf.to_yaml(self.cfg)))

    def section(self, group: str) -> dict[str, Any]:
        return _to_container(self.cfg[group], resolve=True, overrides=self.overrides, files=self.files)

    def origin(self, group: str) -> str | None:
        """The group file the section's values came from, as errors about them name it:
        `training=gpt3/5b (<conf>/training/gpt3/5b.yaml)`; None when no file was chosen."""
        choice = self.choices.get(group)
        if not choice:
            return None
        written = {
            key.removeprefix(f"{group}."): file
            for key, file in self.files.items()
            if key.startswith(f"{group}.")
        }
        return KeyedSource(f"{group}={choice} ({group_file(group, choice, self.config_root)})", written)


def _to_container(
    node: Any, resolve: bool, overrides: dict[str, str] | None = None, files: dict[str, str] | None = None
) -> Any:
    try:
        return OmegaConf.to_container(node, resolve=resolve)
    except Exception as error:  # omegaconf raises many types; all mean a bad interpolation
        raise ConfigError(_unresolved(error, overrides or {}, files or {})) from None


def source_files(choices: dict[str, str], root: Path, config_path: Path) -> dict[str, str]:
    """Where each top-level key was written: its group's file (`training=gpt3/5b (<path>)`), else
    the root config (key "")."""
    groups = {
        group: f"{group}={choice} ({group_file(group, choice, root)})" for group, choice in choices.items()
    }
    return {"": str(config_path), **groups}


def _unresolved(error: Exception, overrides: dict[str, str], files: dict[str, str]) -> str:
    """Names the key whose interpolation failed, and the override that set it when one did, else
    the file it was written in: omegaconf's message alone names only the missing key."""
    reason = str(error).splitlines()[0]
    interpolation = isinstance(error, InterpolationResolutionError | GrammarParseError)
    what = "cannot resolve the launch config" if interpolation else "the launch config"
    key = getattr(error, "full_key", None)
    if not key:
        return f"{what}: {reason}"
    typed = setting_override(str(key), overrides)
    written = KeyedSource(files.get("", ""), files).of(str(key))
    source = f" (set by override '{printable(typed)}')" if typed else f" (in {written})" if written else ""
    return f"{what}: {key}{source}: {reason}{_environment_hint(reason)}"


def _environment_hint(reason: str) -> str:
    """`${HOME}` in a config is an interpolation of a config key, not the shell's variable: say how
    to write the environment variable, where the missing key is spelled like one."""
    missing = re.match(r"Interpolation key '([A-Z_][A-Z0-9_]*)' not found", reason)
    if not missing:
        return environment_hint(reason)  # an unset ${oc.env:NAME}: set it or give a default
    name = missing[1]
    return (
        f"; for the environment variable write ${{oc.env:{name}}} (read at launch) or ${name}"
        " (left to the job's shell)"
    )


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


def group_choices(group: str, root: Path = CONFIG_ROOT) -> list[str]:
    base = root / group
    return sorted(str(p.relative_to(base).with_suffix("")) for p in base.rglob("*.yaml"))


def search_roots(root: Path) -> list[Path]:
    """Where group files are looked up: the user's tree first, then gptrain's bundled configs
    (a NeMo tree has no validation/ or aws_p5.yaml, and need not copy them)."""
    return list(dict.fromkeys((root, CONFIG_ROOT)))


def load_yaml(path: Path) -> dict[str, Any]:
    data = load_file(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def group_file(group: str, choice: str, root: Path = CONFIG_ROOT) -> Path:
    """`<group>/<choice>.yaml` of the user's tree, else of gptrain's bundled configs."""
    roots = search_roots(root)
    for base in roots:
        path = base / group / f"{choice}.yaml"
        found = look_up(path)
        if found.kind == "unreachable":
            raise ConfigError(f"{group}={choice}: {path} {found.why}")
        if found.kind == "file":
            return path
    choices = sorted({name for base in roots for name in group_choices(group, base)})
    where = " or ".join(str(base / group) for base in roots)
    raise ConfigError(f"no {group} config '{choice}' in {where}{choice_hint(choice, choices)}")


def choice_hint(choice: str, choices: list[str]) -> str:
    """Hydra lists a group's options when a choice is none of them; here on one line: the nearest by
    its file name (`gpt3/126` -> gpt3/126m, not `gpt3/nope` -> gpt3/5b), then every option (those
    of the choice's folder, `gpt3/`, where that folder has any)."""
    folder = choice.rpartition("/")[0]
    shown = [c for c in choices if folder and c.startswith(f"{folder}/")] or choices
    near = meant_choice(choice, shown, cutoff=0.5)
    meant = f"did you mean '{near}'? " if near else ""
    return f" ({meant}valid: {', '.join(shown)})" if shown else ""


def load_group(group: str, choice: str, root: Path = CONFIG_ROOT) -> dict[str, Any]:
    data = load_yaml(group_file(group, choice, root))
    for key in HYDRA_KEYS:
        data.pop(key, None)
    return data


def default_choices(root_config: dict[str, Any], path: Path) -> dict[str, str]:
    """Read Hydra's `defaults: [_self_, {cluster: bcm}, ...]` list of config.yaml."""
    choices: dict[str, str] = {}
    for entry in root_config.pop("defaults", []) or []:
        if isinstance(entry, dict):
            for group, choice in entry.items():
                if group not in GROUPS:
                    raise ConfigError(f"{path}: unknown group '{group}' in defaults{closest(group, GROUPS)}")
                choices[group] = str(choice)
    return choices


def groups_under_root(defaults: list[Any]) -> set[str]:
    """The groups whose file config.yaml's own section of that name overrides: Hydra merges the
    defaults list in order, config.yaml's own keys where `_self_` stands (last where the list has no
    `_self_`, as in Hydra 1.1+), so the groups listed before it."""
    listed = [entry if isinstance(entry, str) else next(iter(entry), None) for entry in defaults]
    before = listed[: listed.index("_self_")] if "_self_" in listed else listed
    return {str(group) for group in before if group}


def merge_section(own: Any, chosen: dict[str, Any], own_wins: bool) -> dict[str, Any]:
    """A group's file merged with config.yaml's section of that name (`cluster: {account: x}`), which
    was dropped for the file: a key only one has is kept, the later one's (see groups_under_root)
    where both have it."""
    if not isinstance(own, dict):
        return chosen
    return _merged(chosen, own) if own_wins else _merged(own, chosen)


def own_section_keys(own: Any, chosen: dict[str, Any], own_wins: bool) -> list[str]:
    """The dotted keys (within the group) whose value merge_section takes from config.yaml's section,
    for errors about them to name config.yaml, not the group file that lacks them."""
    if not isinstance(own, dict):
        return []
    return _winning_keys(chosen, own) if own_wins else _surviving_keys(own, chosen)


def _winning_keys(base: dict[str, Any], over: dict[str, Any]) -> list[str]:
    """The keys of `over` whose value _merged(base, over) keeps."""
    keys = []
    for key, value in over.items():
        inner = base.get(key)
        if isinstance(inner, dict) and isinstance(value, dict):
            keys += [f"{key}.{below}" for below in _winning_keys(inner, value)]
        elif not _keeps_earlier(base, key, value):
            keys.append(str(key))
    return keys


def _surviving_keys(base: dict[str, Any], over: dict[str, Any]) -> list[str]:
    """The keys of `base` whose value _merged(base, over) keeps."""
    keys = []
    for key, value in base.items():
        later = over.get(key)
        if key not in over or _keeps_earlier(base, key, later):
            keys.append(str(key))
        elif isinstance(value, dict) and isinstance(later, dict):
            keys += [f"{key}.{below}" for below in _surviving_keys(value, later)]
    return keys


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base` as OmegaConf merges: mappings key by key, anything else replaced,
    except by a `???` (OmegaConf.merge({'a': 1}, {'a': '???'}) is {'a': 1})."""
    merged = dict(base)
    for key, value in over.items():
        inner = merged.get(key)
        if isinstance(inner, dict) and isinstance(value, dict):
            merged[key] = _merged(inner, value)
        elif not _keeps_earlier(base, key, value):
            merged[key] = value
    return merged


def _keeps_earlier(base: dict[str, Any], key: Any, value: Any) -> bool:
    """A later `???` ("give it") leaves a value the earlier mapping has, as OmegaConf's merge does."""
    return key in base and isinstance(value, str) and value == MISSING


def launcher_config(root: Path, config_name: str) -> Path:
    """<root>/<config_name>.yaml, or a ConfigError naming --config-dir and what to do: Path.is_dir
    raised PermissionError where a directory on the way may not be searched, said as a bare
    '<path>: Permission denied' naming no flag."""
    config_path = root / f"{config_name.removesuffix('.yaml')}.yaml"
    found = look_up(root)
    if found.kind == "unreachable":
        raise ConfigError(f"--config-dir {root}: {found.why}")
    if found.kind != "directory":
        what = "no such directory" if found.kind == "missing" else "is not a directory"
        raise ConfigError(
            f"--config-dir {root}: {what}; give the conf directory that holds {config_path.name}"
        )
    found = look_up(config_path)
    if found.kind == "unreachable":
        raise ConfigError(f"--config-dir {root}: {config_path} {found.why}")
    if found.kind != "file":
        raise ConfigError(f"{config_path}: no such launcher config; give the conf directory that holds it")
    return config_path


def compose(
    arguments: list[str], root: Path = CONFIG_ROOT, now: float | None = None, config_name: str = "config"
) -> Composition:
    """<root>/<config_name>.yaml + chosen group files + dotted overrides -> Composition (not yet resolved).

    `root` is gptrain's bundled configs or a user's tree (NeMo's `launcher_scripts/conf` works as is).
    """
    register_resolvers()
    register_now()
    config_path = launcher_config(root, config_name)
    base = load_yaml(config_path)
    base.pop("hydra", None)
    notes = nemo_launcher.prepare_root(base, root, GROUPS, config_path)  # a NeMo launcher tree works as is
    under_root = groups_under_root(base.get("defaults") or [])
    choices = default_choices(base, config_path)
    overrides = parse_overrides(arguments)
    dotted, foreign, hydra_settings = [], [], []
    for override in overrides:
        if nemo_launcher.is_foreign_group(override.key):  # `conversion=gpt3/convert_gpt3`, `peft=null`
            foreign.append(override.typed)
            continue
        if is_hydra_setting(override.key):  # `hydra.run.dir=.`
            hydra_settings.append(override.typed)
            continue
        if override.key in GROUPS and override.form.delete:
            raise ConfigError(
                f"override '{override.typed}': removing the {override.key} group is not supported;"
                f" choose its file with {override.key}=NAME"
            )
        if override.key in GROUPS and isinstance(override.value, str | int | float) and override.form.text:
            # a file name, even one YAML reads as a number (`cluster=2024`, `training=010`)
            choices[override.key] = override.value if isinstance(override.value, str) else override.form.text
        else:
            dotted.append(override)
    if foreign:
        notes.append(f"{', '.join(foreign)}: {nemo_launcher.FOREIGN_STAGE_REASON}")
    if hydra_settings:
        notes.append(f"{', '.join(hydra_settings)}: {HYDRA_SETTINGS_REASON}")
    choices = {**bundled_defaults(root, choices), **choices}
    written: dict[str, str] = {}  # keys config.yaml's sections gave the groups -> config.yaml
    for group, choice in choices.items():
        own, chosen = base.get(group), load_group(group, choice, root)
        base[group] = merge_section(own, chosen, group in under_root)
        own_keys = own_section_keys(own, chosen, group in under_root)
        written.update(dict.fromkeys((f"{group}.{key}" for key in own_keys), str(config_path)))
    report_fallbacks(choices, root)
    try:
        cfg = OmegaConf.create(base)
    except OmegaConfBaseException as error:  # a value OmegaConf cannot hold, in a group file
        raise ConfigError(
            f"the composed config ({', '.join(f'{g}={c}' for g, c in choices.items())}): "
            f"{str(error).splitlines()[0]}"
        ) from None
    given: dict[str, str] = {}  # dotted key -> the override that set it, for errors to name it
    for override in dotted:
        given.update(dict.fromkeys(apply_override(cfg, override), override.typed))
    files = {**source_files(choices, root, config_path), **written}
    try:  # these read values, so a bad interpolation (`${oc.env:UNSET}`) first fails here
        notes += nemo_launcher.finalize(cfg, choices, STAGES)
        absolutize_paths(cfg)
        notes += adapt_nemo_data_preparation(cfg)
        nemo_launcher.report(notes)
        if cfg.get("unique_output"):
            make_unique(cfg, now if now is not None else time.time())
        check_stages(cfg, root / f"{config_name}.yaml")
    except OmegaConfBaseException as error:
        if not getattr(error, "full_key", None):  # `cfg.get` errors name no key; resolving all does
            _to_container(cfg, resolve=True, overrides=given, files=files)
        raise ConfigError(_unresolved(error, given, files)) from None
    return Composition(cfg, choices, root, given, files)


def register_now() -> None:
    """Hydra's `${now:%Y%m%d}` (`training.run.name=gpt_${now:%Y%m%d}`): the launch's time, read once
    per config (cached, as Hydra does), so that every resolution gives the run one name. Only the
    launch has it: it writes the configs resolved, where each rank of `gptrain train` would read
    its own clock."""
    if OmegaConf.has_resolver("now"):
        return
    with warnings.catch_warnings():  # omegaconf 2.4 renames the function; both spellings work
        warnings.simplefilter("ignore", UserWarning)
        OmegaConf.register_new_resolver(
            "now", lambda pattern: datetime.now().strftime(pattern), use_cache=True
        )


def bundled_defaults(root: Path, choices: dict[str, str]) -> dict[str, str]:
    """Groups a user's tree neither chooses nor has (NeMo's has no validation/): gptrain's default file."""
    if root == CONFIG_ROOT:
        return {}
    bundled = default_choices(load_yaml(CONFIG_ROOT / "config.yaml"), CONFIG_ROOT / "config.yaml")
    return {
        group: choice
        for group, choice in bundled.items()
        if group not in choices and not (root / group).is_dir()
    }


def report_fallbacks(choices: dict[str, str], root: Path) -> None:
    """One stderr line naming the group files taken from gptrain's configs though the user's tree
    has that group (a file of the same name there would have won)."""
    if root == CONFIG_ROOT:
        return
    taken = [
        f"{group}={choice}"
        for group, choice in choices.items()
        if (root / group).is_dir() and group_file(group, choice, root).is_relative_to(CONFIG_ROOT)
    ]
    if taken:
        print(
            f"gptrain launch: {', '.join(taken)} from gptrain's bundled configs (not in {root})",
            file=sys.stderr,
        )


def adapt_nemo_data_preparation(cfg: DictConfig) -> list[str]:
    """NeMo's download_gpt3_pile.yaml (file_numbers, the_pile_url) -> gptrain's shard list."""
    section = cfg.get("data_preparation")
    if not nemo_launcher.is_pile_download(section):
        return []
    resolved = _to_container(section, resolve=True)
    top = _to_container(cfg, resolve=True)
    data_dir, results = str(top.get("data_dir") or "data"), str(top.get("base_results_dir") or "results")
    adapted, notes = nemo_launcher.adapt_pile_download(resolved, data_dir, results)
    cfg["data_preparation"] = adapted
    return notes


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
        if override.key == "training.run.name":
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
        if not present and not override.form.add and not free_form and parts[0] != "training":
            if override.key in nemo_launcher.PATH_KEYS:
                raise ConfigError(_no_launcher_path(override))
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
    return _set(cfg, override)


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


def absolutize_paths(cfg: DictConfig) -> None:
    """Jobs start in other directories: make relative result/data paths absolute now."""
    if "base_results_dir" in cfg and cfg.get("base_results_dir") in (None, ""):
        raise ConfigError("base_results_dir is empty: give the directory the launch writes its runs into")
    if "data_dir" in cfg and cfg.get("data_dir") in (None, ""):  # else the launch directory, or 'None/...'
        raise ConfigError(
            "data_dir is empty: give the directory of the datasets and tokenizer files, which ${data_dir}"
            " in the configs names (data_dir=$DATA_DIR with DATA_DIR unset gives an empty one)"
        )
    for key in ("base_results_dir", "data_dir"):
        value = cfg.get(key)
        if isinstance(value, str) and "${" not in value and not os.path.isabs(value):
            cfg[key] = os.path.abspath(value)


def make_unique(cfg: DictConfig, now: float) -> None:
    """`unique_output=true`: each launch gets its own timestamped directory under each stage's dir.
    A stamp whose directory exists already (two launches in one second, or the hour local time
    repeats at the autumn clock change) takes the first free `-<n>` suffix: the launch would
    otherwise write into that run's directory and resume its checkpoints."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    runs = [run for stage in STAGES if (run := _stage_run(cfg, stage)) is not None]
    originals = [OmegaConf.to_container(run, resolve=False)["results_dir"] for run in runs]
    for n in range(1000):
        for run, original in zip(runs, originals, strict=True):
            run["results_dir"] = f"{original}/{stamp}" + (f"-{n}" if n else "")
        if not any(_exists(run) for run in runs):
            return
    raise ConfigError(f"unique_output=true: no free directory name for the stamp {stamp} (-1 to -999 exist)")


def _stage_run(cfg: DictConfig, stage: str) -> DictConfig | None:
    """A stage's `run` section when it names a results_dir."""
    section = cfg.get(stage)
    run = section.get("run") if isinstance(section, DictConfig) else None
    return run if isinstance(run, DictConfig) and "results_dir" in run else None


def _exists(run: DictConfig) -> bool:
    """Whether the stage's results_dir is on disk (False where it does not resolve yet)."""
    try:
        return os.path.exists(str(run.results_dir))
    except OmegaConfBaseException:
        return False


def check_stages(cfg: DictConfig, config_file: Path) -> None:
    stages = cfg.get("stages")
    if isinstance(stages, str):
        stages = [stages]
        cfg.stages = stages
    if not isinstance(stages, ListConfig | list) or not stages:
        raise ConfigError(
            f"{config_file}: 'stages' must be a non-empty list (there or as an override), "
            "e.g. stages=[data_preparation,training]"
        )
    for stage in stages:
        if stage not in STAGES:
            raise ConfigError(f"unknown stage '{stage}' in stages{closest(str(stage), STAGES)}")
    cluster_type = cfg.get("cluster_type")
    if cluster_type not in ("local", "slurm"):
        choices = ("local", "slurm", "bcm")  # bcm (NeMo's name for Slurm) is slurm by now
        raise ConfigError(
            f"cluster_type must be 'local', 'slurm' or 'bcm' (Slurm), got '{cluster_type}'"
            f"{closest(str(cluster_type), choices)}"
        )
