"""A NeMo launcher conf tree (`launcher_scripts/conf/`) read as `gptrain launch` reads its own.

The NeMo launcher's `config.yaml` names a dozen groups (conversion, evaluation, rlhf_*, ...),
Hydra-only values (`${hydra:runtime.choices.training}`), a mandatory `launcher_scripts_path`,
`cluster_type: bcm`, `run_<stage>` switches in older releases, and `container_mounts: [null]`.
Its Pile download config lists shard numbers, not URLs. This module maps all of that onto
gptrain's launch config, and says once, on one line, what it ignores and why.

Only yaml/omegaconf-free dict work here: it runs in `gptrain launch` on login nodes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptrain.config.yamlio import as_switch
from gptrain.errors import ConfigError

# Stages of the NeMo launcher that gptrain does not run (their group files need not exist).
FOREIGN_STAGE_REASON = (
    "gptrain runs data_preparation, validation (its cluster check) and training only "
    "(gptrain export converts checkpoints)"
)
NEMO_STAGES = (
    "adapter_learning", "conversion", "conversion_hf2nemo", "data_curation", "evaluation", "export",
    "external_conversion", "fine_tuning", "fw_inference", "generic", "ia3_learning", "peft",
    "prompt_learning", "ptq", "rag_generating", "rag_indexing", "rlhf_ppo", "rlhf_rm", "steerlm_reg",
)  # fmt: skip
# Top-level keys of NeMo's config.yaml that mean nothing to gptrain.
IGNORED_TOP_KEYS = {
    "debug": "Hydra debug output",
    "numa_mapping": "gptrain does not pin ranks to NUMA nodes",
    "wandb_api_bcp_secret_key": "BCP clusters are not supported",
    "bcp_no_redirect": "BCP clusters are not supported",
    "enable_vboost": "GPU power settings are left alone",
    "nvte_bias_gelu_nvfusion": "a Transformer Engine fusion switch; gptrain does not use Transformer Engine",
}
# Older launchers (bignlp-scripts) switch stages with booleans instead of a `stages` list
# (bignlp 22.06 also has run_export and run_prompt_learning: every NeMo stage may appear).
RUN_SWITCHES = ("data_preparation", "training", "finetuning", *NEMO_STAGES)
CLUSTER_TYPES = {"bcm": "slurm", "slurm": "slurm", "local": "local"}
PATH_KEYS = ("launcher_scripts_path", "bignlp_path")


def prepare_root(
    base: dict[str, Any], root: Path, groups: tuple[str, ...], path: Path | None = None
) -> list[str]:
    """Before the defaults list is read: drop foreign groups, fill the mandatory paths.

    Returns notes (what was ignored and why) for the one report line.
    """
    notes: list[str] = []
    kept, foreign = [], []
    defaults = base.get("defaults") or []
    if not isinstance(defaults, list):
        raise ConfigError(f"{path or root}: 'defaults' must be a list, e.g. [_self_, {{cluster: bcm}}]")
    for entry in defaults:
        if isinstance(entry, dict):
            if not entry:
                raise ConfigError(
                    f"{path or root}: an empty defaults entry {{}}; name a group and its file, e.g. {{cluster: bcm}}"
                )
            (group, choice), *_ = entry.items()
            if str(group).startswith("override ") or (group not in groups and group != "_self_"):
                if not str(group).startswith("override "):
                    foreign.append(str(group))
                continue
            if choice is None:
                continue
        kept.append(entry)
    if "defaults" in base:
        base["defaults"] = kept
    if foreign:
        notes.append(f"groups {', '.join(foreign)}: {FOREIGN_STAGE_REASON}")
    for key in PATH_KEYS:
        if base.get(key) == "???":  # NeMo's conf dir sits in launcher_scripts/
            base[key] = str(root.parent if root.name == "conf" else root)
    for key, value in list(base.items()):
        if isinstance(value, str) and "${hydra:" in value:
            base[key] = None  # `<group>_config`: filled with the choice in finalize()
    return notes


def is_foreign_group(key: str) -> bool:
    """An override of a NeMo stage's group gptrain does not run (`conversion=gpt3/convert_gpt3`,
    `fine_tuning=null`, `conversion.model.tensor_model_parallel_size=2`): ignored, with the note."""
    return key.split(".", 1)[0] in NEMO_STAGES


def finalize(cfg: Any, choices: dict[str, str], stages_known: tuple[str, ...]) -> list[str]:
    """After the overrides: stages from run_* switches (where no stages list is), cluster_type,
    nulls in mounts and env."""
    notes = _stages_from_switches(cfg)
    stages = cfg.get("stages")
    if isinstance(stages, str):
        stages = [stages]
    if isinstance(stages, Sequence) and not isinstance(stages, str):  # else check_stages names the key
        foreign = [str(s) for s in stages if s in NEMO_STAGES]
        if foreign:  # a typo is left for check_stages to name
            cfg["stages"] = [s for s in stages if s not in NEMO_STAGES]
            notes.append(f"stages {', '.join(foreign)}: {FOREIGN_STAGE_REASON}")
    cluster_type = cfg.get("cluster_type")
    if not isinstance(cluster_type, str):  # a list or mapping (unhashable): check_stages names the key
        cluster_type = None
    if cluster_type in CLUSTER_TYPES:
        cfg["cluster_type"] = CLUSTER_TYPES[cluster_type]
    elif cluster_type in ("bcp", "k8s"):
        raise ConfigError(f"cluster_type={cluster_type} is not supported; use bcm (Slurm) or local")
    mounts = cfg.get("container_mounts")
    if isinstance(mounts, str):  # one item (pyxis reads "a:a,b:b" as two mounts: so does the join)
        cfg["container_mounts"] = [mounts]
    elif "container_mounts" in cfg and (mounts is None or isinstance(mounts, Sequence)):
        # NeMo's default is [null]; other types are left for the launch's type check to name
        cfg["container_mounts"] = [m for m in mounts or [] if m is not None]
    for group, choice in choices.items():
        if f"{group}_config" in cfg:
            cfg[f"{group}_config"] = choice
    _topology_file(cfg)
    notes += _export_srun_flags(cfg)
    notes += slurm_launcher_keys(cfg.get("cluster"))
    ignored = [f"{key} ({reason})" for key, reason in IGNORED_TOP_KEYS.items() if key in cfg]
    if ignored:
        notes.append("config.yaml keys " + ", ".join(ignored))
    return notes


def _topology_file(cfg: Any) -> None:
    """bignlp-scripts 22.x's `nccl_topology_xml_file: F` made every job `export NCCL_TOPO_FILE=F`
    (Azure NDv4 needs its topology file): it becomes env_vars.NCCL_TOPO_FILE, unless that is set."""
    if "nccl_topology_xml_file" not in cfg:
        return
    path = cfg.get("nccl_topology_xml_file")
    del cfg["nccl_topology_xml_file"]
    env = cfg.get("env_vars")
    if path is None or not (env is None or hasattr(env, "get")):  # another type: the launch names it
        return
    if env is None:
        cfg["env_vars"] = {"NCCL_TOPO_FILE": path}
    elif env.get("NCCL_TOPO_FILE") is None:
        env["NCCL_TOPO_FILE"] = path


def _export_srun_flags(cfg: Any) -> list[str]:
    """bignlp-scripts 22.x's cluster `srun_flags`: extra flags of its export stage's srun, which
    gptrain does not run; dropped (null without a word, a value with the note)."""
    cluster = cfg.get("cluster")
    if not hasattr(cluster, "get") or "srun_flags" not in cluster:
        return []
    flags = cluster.get("srun_flags")
    del cluster["srun_flags"]
    if flags is None:
        return []
    return [
        "cluster.srun_flags (bignlp-scripts passed it to its export stage's srun only; the training's srun"
        " options are cluster.srun_args)"
    ]


def slurm_launcher_keys(cluster: Any) -> list[str]:
    """NeMo's SlurmLauncher parameters a cluster file may hold that are no gptrain cluster key,
    changed in place to what they meant there (the notes of what is ignored, for `report`): num_gpus,
    its deprecated gpus_per_node, which it takes over gpus_per_node; setup, dropped (NeMo's stages
    set it to their own exports, over the file's); an array or a heterogeneous job, refused (null
    and false are dropped). The launch, `gptrain plan` and `gptrain validate` read cluster files so."""
    if not hasattr(cluster, "get"):
        return []
    notes = _num_gpus(cluster)
    if "setup" in cluster:
        if cluster.get("setup"):
            notes.append(
                "cluster.setup (NeMo's launcher replaces it with each stage's environment exports, so it"
                " never ran; set variables with env_vars)"
            )
        del cluster["setup"]
    if cluster.get("array") is not None:
        raise ConfigError(
            "cluster.array: gptrain submits each training as one job (an array would run copies of it"
            " into one run directory; the data preparation's array is data_preparation.run.node_array_size);"
            " remove it"
        )
    if _switch("cluster.heterogeneous", cluster.get("heterogeneous")):  # `no`, `off`: dropped, as false
        raise ConfigError(
            "cluster.heterogeneous=true: gptrain submits each stage as one job, every rank in one job step"
            " of training.trainer.num_nodes nodes, not as a heterogeneous job; remove it"
        )
    for key in ("array", "heterogeneous"):
        if key in cluster:
            del cluster[key]
    return notes


def read_slurm_launcher_keys(cluster: Any, where: str) -> None:
    """`slurm_launcher_keys` for a command that reads a cluster file itself (`plan`, `validate`): its
    refusals start with `where` (the file); what it drops goes unsaid, the launch says it."""
    try:
        slurm_launcher_keys(cluster)
    except ConfigError as error:
        raise ConfigError(f"{where}{error}") from None


def _num_gpus(cluster: Any) -> list[str]:
    """num_gpus into gpus_per_node, over it as NeMo's SlurmLauncher takes it ('deprecated, please use
    gpus_per_node instead (overwriting with num_gpus)'); said where it changes a gpus_per_node given."""
    if "num_gpus" not in cluster:
        return []
    value, given = cluster.get("num_gpus"), cluster.get("gpus_per_node")
    del cluster["num_gpus"]
    if value is None:
        return []
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ConfigError(f"cluster.num_gpus: expected a whole number 0 or more, got {value!r}")
    cluster["gpus_per_node"] = int(str(value).strip())
    if given is None or str(given).strip() == str(cluster["gpus_per_node"]):
        return []
    return [
        f"cluster.gpus_per_node={given} (cluster.num_gpus={value}, NeMo's deprecated spelling of it, is"
        " taken over it, as NeMo's SlurmLauncher takes it)"
    ]


def ignore_switches_beside_stages(cfg: Any, given: dict[str, str]) -> list[str]:
    """run_* switches beside a stages list (config.yaml's own, left in from bignlp-scripts 22.x, or
    added by an override, `+run_training=False`): NeMo 23.07+ reads only the list, so the switches
    are dropped, with a note naming each (as the override that set it, where one did)."""
    if cfg.get("stages") is None:  # no list: the switches pick the stages, as in older launchers
        return []
    switches = [key for key in cfg if str(key).startswith("run_") and str(key)[4:] in RUN_SWITCHES]
    for key in switches:
        del cfg[key]
    if not switches:
        return []
    named = ", ".join(given.get(key, key) for key in switches)  # in config.yaml's order
    return [
        f"{named} (NeMo reads no run_* switch beside a stages list: give stages=[...] to choose the stages)"
    ]


def _stages_from_switches(cfg: Any) -> list[str]:
    present = [name for name in RUN_SWITCHES if f"run_{name}" in cfg]
    if not present:
        return []
    chosen = [name for name in present if _switch(f"run_{name}", cfg.get(f"run_{name}"))]
    for name in present:
        del cfg[f"run_{name}"]
    foreign = [n for n in chosen if n not in ("data_preparation", "training")]
    cfg["stages"] = [n for n in chosen if n in ("data_preparation", "training")]
    if not cfg["stages"]:
        raise ConfigError(
            "no stage to run: set run_data_preparation=True or run_training=True"
            + (f" ({', '.join('run_' + n for n in foreign)}: {FOREIGN_STAGE_REASON})" if foreign else "")
        )
    return [f"run_{n}: {FOREIGN_STAGE_REASON}" for n in foreign]


def _switch(key: str, value: Any) -> bool:
    """A NeMo switch as OmegaConf reads a bool field (on/off, y/n, 1/0 too: only true/1/yes were on,
    so `run_training=on` dropped the stage unseen); null is off, anything else a ConfigError."""
    switch = False if value is None else as_switch(value)
    if switch is None:
        raise ConfigError(f"{key}: expected true or false, got {value!r} ({type(value).__name__})")
    return switch


def is_pile_download(section: Any) -> bool:
    """NeMo's data_preparation/gpt3/download_gpt3_pile.yaml (or a copy of it)."""
    return hasattr(section, "get") and "file_numbers" in section and "shards" not in section


def adapt_pile_download(
    section: dict[str, Any], data_dir: str, results_dir: str = "results"
) -> tuple[dict[str, Any], list[str]]:
    """NeMo's Pile download keys -> gptrain's data_preparation section (resolved values).

    Shards are `<the_pile_url>/NN.jsonl.zst` for each number of `file_numbers` ("0-29", "0,3,5-7");
    they become `${data_dir}/my-gpt3_NN_text_document`, the names NeMo's training configs list.
    """
    url = str(section.get("the_pile_url") or "").rstrip("/")
    if not url:
        raise ConfigError("data_preparation.the_pile_url: empty; give the URL of the Pile's train/ directory")
    numbers = parse_file_numbers(str(section.get("file_numbers")))
    notes: list[str] = []
    run = dict(section.get("run") or _bignlp_run(section, results_dir, notes))
    for key in ("array", "bcp_preproc_npernode"):  # node_array_size is kept: tasks at once
        if run.pop(key, None) is not None:
            notes.append(f"data_preparation.run.{key} (one array task per shard)")
    adapted = {
        "run": run,
        "shards": [f"{url}/{n:02d}.jsonl.zst" for n in numbers],
        "download_dir": data_dir,
        "output_dir": data_dir,
        "output_name_prefix": "my-gpt3_",
        "extract": True,
        "keep_compressed": not _switch("data_preparation.rm_downloaded", section.get("rm_downloaded", True)),
        "keep_extracted": not _switch("data_preparation.rm_extracted", section.get("rm_extracted", True)),
        "tokenizer": {
            "type": str(section.get("tokenizer_type") or "GPT2BPETokenizer"),
            "vocab_file": f"{section.get('vocab_save_dir') or data_dir + '/bpe'}/vocab.json",
            "merge_file": f"{section.get('merges_save_dir') or data_dir + '/bpe'}/merges.txt",
            "model": None,
            "vocab_url": section.get("download_vocab_url") or None,  # fetched when missing
            "merge_url": section.get("download_merges_url") or None,
        },
        "blend": {"file": f"{data_dir}/blend.yaml", "weights": "tokens"},
        "workers": section.get("workers", "auto"),  # NeMo tokenizes with --workers $SLURM_CPUS_ON_NODE
    }
    if not all(_switch(f"data_preparation.{key}", section.get(key, True)) for key in PILE_STEPS):
        notes.append("data_preparation.download_the_pile/preprocess_data=False (the stage always does both)")
    return adapted, notes


PILE_STEPS = ("download_the_pile", "preprocess_data")  # NeMo's switches; gptrain's stage does both


def _bignlp_run(section: dict[str, Any], results_dir: str, notes: list[str]) -> dict[str, Any]:
    """bignlp-scripts 22.x's file has no run section: its jobs logged to `log_dir` with `time_limit`,
    over `nodes` nodes (gptrain: one array task per shard). The run NeMo's later file names."""
    notes += [
        f"data_preparation.{key} (one array task per shard)"
        for key in ("nodes", "bcp_preproc_npernode")
        if section.get(key) is not None
    ]
    name = "download_gpt3_pile"
    return {
        "name": name,
        "results_dir": section.get("log_dir") or f"{results_dir}/{name}",
        "time_limit": section.get("time_limit"),
    }


def parse_file_numbers(text: str) -> list[int]:
    """NeMo's `file_numbers`: "0-29", "3", "0,2,5-7" -> sorted shard numbers."""
    numbers: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, sep, high = part.partition("-")
        try:
            start, end = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ConfigError(
                f"data_preparation.file_numbers: '{text}' is not a list of numbers and ranges like '0-29'"
            ) from None
        if start > end or start < 0:
            raise ConfigError(f"data_preparation.file_numbers: '{part}' is not an increasing range")
        numbers.update(range(start, end + 1))
    return sorted(numbers)


def report(notes: list[str]) -> None:
    """One stderr line for everything of the NeMo tree that gptrain ignores."""
    if notes:
        print(f"gptrain launch: ignoring {'; '.join(notes)}", file=sys.stderr)
