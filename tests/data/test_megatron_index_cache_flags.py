"""Megatron's switches for loading its index caches faster (core 0.14 on) change no sample: gptrain loads
its own cache, or builds it, so a script carrying them trains on the same samples. They stopped the run
as flags gptrain does not know."""

from __future__ import annotations

import shlex

from gptrain.megatron.translate import translate

BASE = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    " --train-iters 4 --lr 1e-4 --eval-interval 2 --eval-iters 1 --data-path /d/x_text_document"
    " --split 98,2,0 --data-cache-path /d/cache --vocab-file /d/v.json --merge-file /d/m.txt"
)
CACHE_FLAGS = (
    " --dataloader-fast-cache-load --dataloader-defer-npy-index-mmap"
    " --per-dataset-sequences-path /d/sequences.json"
)


def test_megatrons_cache_loading_switches_are_accepted_and_said_to_change_no_sample():
    plain = translate(shlex.split(BASE), {})
    taken = translate(shlex.split(BASE + CACHE_FLAGS), {})
    assert taken.values == plain.values
    added = [note for note in taken.notes if note not in plain.notes]
    why = (
        "gptrain loads its own index cache from model.data.index_mapping_dir, or builds it: the same samples"
    )
    assert added == [
        f"--dataloader-fast-cache-load ({why})",
        f"--dataloader-defer-npy-index-mmap ({why})",
        "--per-dataset-sequences-path (gptrain reads each dataset's sequence count from its .idx)",
    ]
