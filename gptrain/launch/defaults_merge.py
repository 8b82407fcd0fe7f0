"""config.yaml's own group sections merged with the group files its defaults list picks, as Hydra
and OmegaConf merge them (gptrain.launch.compose composes with these)."""

from __future__ import annotations

from typing import Any

from omegaconf import MISSING


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
