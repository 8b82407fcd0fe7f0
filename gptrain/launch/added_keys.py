"""`+key=value` overrides outside the training section: a key gptrain reads nowhere is refused.

`+` adds a key the composed config lacks; where nothing reads it the launch went on without it,
unseen (`+data_preparation.keep_extractd=true` for keep_extracted: the extracted text was then
deleted). The training section is checked by the training schema, the cluster section by
sections.check_unknown_cluster_keys; the keys of the user's own (env_vars, additional_parameters)
and a top-level root an interpolation reads (`+FSX=/fsx data_dir=${FSX}/data`) pass through.

Only omegaconf is imported: this runs on login nodes and must start fast.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gptrain.config import nemo_launcher
from gptrain.errors import ConfigError
from gptrain.launch.override_apply import FREE_FORM_MAPPINGS, Override
from gptrain.launch.sections import ENV_NAME, RUN, TOP_READ

RUN_READ = tuple(f"run.{key}" for key in RUN)
# gptrain's data_preparation keys (configs/data_preparation/download_shards.yaml lists them), with
# the tokenizer keys a TikTokenizer also reads and the shard name prefix a NeMo Pile download sets.
DATA_PREPARATION_READ = (
    *RUN_READ, "run.node_array_size", "shards", "download_dir", "output_dir", "output_name_prefix",
    "extract", "keep_compressed", "keep_extracted", "retries", "backoff_seconds", "timeout_seconds",
    "tokenizer.type", "tokenizer.vocab_file", "tokenizer.merge_file", "tokenizer.model",
    "tokenizer.vocab_url", "tokenizer.merge_url", "tokenizer.vocab_size", "tokenizer.tiktoken_pattern",
    "tokenizer.tiktoken_num_special_tokens", "tokenizer.special_tokens", "json_key", "append_eod",
    "workers", "blend.file", "blend.weights",
)  # fmt: skip
# NeMo's download_gpt3_pile.yaml keys that nemo_launcher.adapt_pile_download reads.
PILE_READ = (
    *RUN_READ, "run.node_array_size", "run.array", "run.bcp_preproc_npernode", "the_pile_url",
    "file_numbers", "rm_downloaded", "rm_extracted", "tokenizer_type", "vocab_save_dir",
    "merges_save_dir", "download_vocab_url", "download_merges_url", "workers", "download_the_pile",
    "preprocess_data", "nodes", "bcp_preproc_npernode", "log_dir", "time_limit",
)  # fmt: skip
# configs/validation/default.yaml's keys, which validation_stage passes to `gptrain validate`.
VALIDATION_READ = (
    *RUN_READ, "checks", "min_bytes", "max_bytes", "iters", "warmup", "pair_bytes", "min_busbw_GBps",
    "dcgm_level", "xid_since", "exclude_failed", "exclude_file",
)  # fmt: skip
INTERPOLATION_ROOT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def check_added_keys(cfg: DictConfig, overrides: Iterable[Override]) -> None:
    """Refuse each `+`/`++` override (applied to `cfg`) that adds a key gptrain reads nowhere: one
    line naming it, the nearest key read in its section, and what to do."""
    roots = set(INTERPOLATION_ROOT.findall(OmegaConf.to_yaml(cfg)))
    for override in overrides:
        if not override.form.add:
            continue
        for key in leaf_keys(override.key, override.value):
            known = keys_read(cfg, key, roots)
            if known is not None and not is_read(key, known):
                raise ConfigError(refusal(override, key, known))


def leaf_keys(key: str, value: Any) -> list[str]:
    """`blend` given {file: x} -> [blend.file]: each key a mapping value adds."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in leaf_keys(f"{key}.{k}", v)]
    return [key]


def keys_read(cfg: DictConfig, key: str, roots: set[str]) -> tuple[str, ...] | None:
    """The dotted keys gptrain reads in `key`'s section (with its section's prefix), or None where
    the section is checked elsewhere or its keys are the user's own."""
    parts = key.split(".")
    if any(part in FREE_FORM_MAPPINGS for part in parts[:-1]) or parts[0] in ("training", "cluster"):
        return None
    if len(parts) > 1 and parts[0] in ("data_preparation", "validation"):
        section = cfg.get(parts[0])
        if parts[0] == "validation":
            read = VALIDATION_READ
        else:
            read = PILE_READ if nemo_launcher.is_pile_download(section) else DATA_PREPARATION_READ
        return tuple(f"{parts[0]}.{k}" for k in read)
    root = parts[0]
    left_to_sections = ENV_NAME.fullmatch(root) or difflib.get_close_matches(root, TOP_READ, n=1, cutoff=0.85)
    passed_through = (*TOP_READ, *nemo_launcher.IGNORED_TOP_KEYS, *roots)
    switch = root.startswith("run_") and root[4:] in nemo_launcher.RUN_SWITCHES
    if left_to_sections or root in passed_through or switch:
        return None  # sections.py names a misspelt one or an environment variable; the rest are read
    return TOP_READ


def is_read(key: str, known: tuple[str, ...]) -> bool:
    """`key` is read, inside a key read (an item of shards), or holds keys read (`tokenizer`)."""
    return any(key == k or key.startswith(f"{k}.") or k.startswith(f"{key}.") for k in known)


def refusal(override: Override, key: str, known: tuple[str, ...]) -> str:
    """`known` is TOP_READ for a top-level key (its root is compared), else the section's keys."""
    top = known is TOP_READ
    word = key.split(".")[0] if top else key
    where = "at the top level of a launch" if top else f"in {key.split('.')[0]}"
    # compared without the section's prefix, which every key there shares: a far one misleads, list them
    prefix = "" if top else f"{key.split('.')[0]}."
    inside = [k.removeprefix(prefix) for k in known]
    near = difflib.get_close_matches(word.removeprefix(prefix), inside, n=1, cutoff=0.5)
    meant = (
        f"; the nearest key it reads there is '{prefix}{near[0]}'"
        if near
        else f"; it reads {', '.join(known)}"
    )
    return (
        f"override '{override.typed}': gptrain reads no '{word}' {where}{meant}; fix the key's spelling"
        " (+ adds a key, and only a key gptrain reads does anything), or drop the override"
    )
