"""Compose the launcher config the way the NeMo launcher does, without Hydra.

`configs/config.yaml` names a default file per group (`cluster`, `data_preparation`,
`training`) in its `defaults` list; the command line picks other files (`training=gpt3/126m`)
and overrides dotted keys (`training.trainer.num_nodes=2`). Interpolations such as
`${data_dir}` and `${training.run.results_dir}` resolve against the whole tree. Mistakes
name the closest valid choice, because a typo in a launch should cost seconds, not a queue wait.

Only omegaconf and yaml are imported: this runs on login nodes and must start fast.
"""

from __future__ import annotations

import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from gptrain.config import nemo_launcher
from gptrain.config.build import KeyedSource, setting_source
from gptrain.config.loader import (
    environment_hint,
    meant_choice,
    register_resolvers,
)
from gptrain.config.yamlio import load_file
from gptrain.errors import ConfigError, printable
from gptrain.launch.added_keys import check_added_keys
from gptrain.launch.defaults_merge import groups_under_root, merge_section, own_section_keys
from gptrain.launch.key_types import boolean
from gptrain.launch.override_apply import apply_override, closest, parse_overrides
from gptrain.utils.overrides import (
    HYDRA_SETTINGS_REASON,
    is_hydra_setting,
    setting_override,
)
from gptrain.utils.paths import look_up

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("cluster", "data_preparation", "validation", "training")
STAGES = ("data_preparation", "validation", "training")
# Keys a group file may carry for Hydra that mean nothing here.
HYDRA_KEYS = ("defaults", "hydra")
INTERPOLATION_ROOT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


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

    def source_of(self, dotted: str) -> str:
        """What set `dotted`: its override, else its group's file (`cluster=bcm (<path>)`) or config.yaml."""
        group, _, key = dotted.partition(".")
        origin = self.origin(group)
        if origin is not None and key:
            source = origin.of(key)
        else:
            source = KeyedSource(self.files.get("", ""), self.files).of(dotted)
        return setting_source(dotted, source, self.overrides)


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
    check_added_keys(cfg, dotted)
    files = {**source_files(choices, root, config_path), **written}
    try:  # these read values, so a bad interpolation (`${oc.env:UNSET}`) first fails here
        notes += nemo_launcher.ignore_switches_beside_stages(cfg, given)  # NeMo reads the list alone
        notes += nemo_launcher.finalize(cfg, choices, STAGES)
        absolutize_paths(cfg)
        notes += adapt_nemo_data_preparation(cfg)
        nemo_launcher.report(notes)
        if unique_output(cfg):
            make_unique(cfg, now if now is not None else time.time())
        check_stages(cfg, config_path)
    except OmegaConfBaseException as error:
        if not getattr(error, "full_key", None):  # `cfg.get` errors name no key; resolving all does
            _to_container(cfg, resolve=True, overrides=given, files=files)
        raise ConfigError(_unresolved(error, given, files)) from None
    return Composition(cfg, choices, root, given, files)


def unique_output(cfg: DictConfig) -> bool:
    """`unique_output`, read here before check_launch_sections types it: `no`, `off`, a quoted
    'false' are off (truthiness read them as on: each relaunch in a new directory, from scratch)."""
    value = cfg.get("unique_output")
    return bool(boolean("unique_output", OmegaConf.to_object(value) if OmegaConf.is_config(value) else value))


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
