"""GPUs in a Slurm gres string, read as Slurm reads one; the one reader for the launcher's checks,
its #SBATCH lines, `gptrain plan`'s trials and `gptrain validate`'s thresholds.

A gres is comma-separated `name[:type][:count]` entries: sbatch's --gres also takes them as TRES
(`gres/gpu:8`, `gres/gpu=8`: it prepends `gres/` itself), sinfo's %G appends a socket note
(`gpu:h100:8(S:0-1)`), and an entry without a count (`gpu`, `gpu:h100`) is one (Slurm's
slurm_get_next_tres: a last field that is no number is the type).
"""

from __future__ import annotations

import re

GRES_NOTE = re.compile(r"\([^)]*\)")  # sinfo's '(S:0-1)', squeue's '(IDX:0-7)'


def gres_entry(item: str) -> tuple[str, int]:
    """One entry as (name[:type], count): 'gres/gpu=8' -> ('gpu', 8), 'gpu:h100' -> ('gpu:h100', 1)."""
    item = GRES_NOTE.sub("", item).strip().removeprefix("gres/")
    body, separator, count = item.rpartition("=") if "=" in item else item.rpartition(":")
    return (body, int(count)) if separator and count.isdigit() else (item, 1)


def gres_items(gres: object) -> list[str]:
    """The entries of a gres string as written; none for '(null)' or an empty one."""
    return [item.strip() for item in GRES_NOTE.sub("", str(gres or "")).split(",") if item.strip()]


def is_gpu(body: str) -> bool:
    return body.split(":")[0] == "gpu"


def gres_gpus(gres: object) -> int | None:
    """GPUs per node a gres asks for (or a node has): every gpu entry counts ('gpu:a100:4,gpu:v100:2'
    is 6, 'gpu:8,shard:8' is 8); None where no entry is a GPU ('(null)', 'shard:8', null)."""
    counts = [count for body, count in map(gres_entry, gres_items(gres)) if is_gpu(body)]
    return sum(counts) if counts else None


def gres_with_gpus(gres: object, gpus: int) -> str:
    """`gres` asking for `gpus` GPUs: its first gpu entry with that count (its type kept), its other
    gpu entries left out, every other entry as written."""
    items, asked = [], False
    for item in gres_items(gres):
        body, _ = gres_entry(item)
        if not is_gpu(body):
            items.append(item)
        elif not asked:
            items.append(f"{body}:{gpus}")
            asked = True
    return ",".join(items)
