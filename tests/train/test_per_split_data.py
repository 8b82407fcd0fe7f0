"""Per-split data (NeMo's data_prefix {train, validation}; Megatron's --train/--valid-data-path):
a held-out corpus validates a run trained on another."""

import json
import re

import numpy as np
import pytest
from train_e2e_helpers import log_lines, run_recording, tiny_config

from gptrain.data.index_cache import hash_file

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_training_validates_on_its_own_held_out_corpus(tmp_path, monkeypatch, corpus_writer):
    rng = np.random.default_rng(0)
    train = corpus_writer(tmp_path / "train", [rng.integers(1, 61, size=30) for _ in range(40)])
    held_out = corpus_writer(tmp_path / "held_out", [rng.integers(1, 61, size=30) for _ in range(10)])
    train_prefix = next(o for o in train if o.startswith("model.data.data_prefix="))
    held_out_prefix = next(o for o in held_out if o.startswith("model.data.data_prefix=")).split("=", 1)[1]
    overrides = [o for o in train if not o.startswith("model.data.data_prefix=")]
    per_split = (
        f"model.data.data_prefix={{train: {train_prefix.split('=', 1)[1]}, validation: {held_out_prefix}}}"
    )
    config = tiny_config(tmp_path / "run", *overrides, per_split)
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and len(losses) == 6
    validations = [line for line in log_lines(tmp_path / "run") if "validation loss at iteration" in line]
    assert len(validations) == 3  # every 3 steps of 6, and at 6 on validation set (after training)
    # each split's sample index was built from its own corpus (named by its .idx's digest), all of its documents
    corpora = {hash_file(idx): idx.parent.name for idx in tmp_path.glob("*/corpus_text_document.idx")}
    built = {}
    for description in (tmp_path / "train").glob("corpus_text_document-index/*-description.txt"):
        info = json.loads(description.read_text())
        built[info["index_split"]] = (corpora[info["idx_blake2b"]], info["indices"][:2])
    assert built == {"train": ("train", [0, 40]), "valid": ("held_out", [0, 10])}
    assert re.search(r"lm loss value: [0-9.E+-]+", validations[0])
