"""The start of a run's log says what each split holds and how many epochs of it the run takes,
as Megatron logs "total number of samples" and "total number of epochs": a small corpus read
several times over was not said anywhere."""

import math
import re

import numpy as np
import pytest
from train_e2e_helpers import log_lines, run_recording, tiny_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SEQ = 16  # train_e2e_helpers.TINY: encoder_seq_length 16, global batch 4, 6 steps, validation every 3


def expected_split(tokens: int, asked: int, sequences: int) -> tuple[int, int, int]:
    """(samples, epochs, sequences): Megatron's fewest whole epochs holding `asked` samples of SEQ + 1
    tokens (one shared with the next sample), and all the samples those epochs hold."""
    epochs = max(1, math.ceil((asked * SEQ + 1) / tokens))
    return (epochs * tokens - 1) // SEQ, epochs, sequences


def test_log_names_samples_and_epochs_of_each_split(tmp_path, monkeypatch, corpus_writer):
    rng = np.random.default_rng(0)
    documents = [rng.integers(1, 61, size=30) for _ in range(40)]  # 31 tokens each with the EOD
    overrides = corpus_writer(tmp_path / "data", documents)  # split 90,10,0: 36 and 4 documents
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path / "run", *overrides))
    assert code == 0
    found = {}
    for line in log_lines(tmp_path / "run"):
        match = re.fullmatch(
            r" > (\w+) split: (\d+) samples of 16 tokens, (\d+) epochs? of its (\d+) sequences of "
            r"(\S+) \(indices built in \S+\)",
            line,
        )
        if match:
            found[match[1]] = (int(match[2]), int(match[3]), int(match[4]))
            assert match[5] == str(tmp_path / "data" / "corpus_text_document")
    assert found == {
        "train": expected_split(36 * 31, 6 * 4, 36),  # 24 samples: one epoch
        "valid": expected_split(4 * 31, 3 * 1 * 4, 4),  # 3 validations of 1 batch: two epochs
    }
    assert found["valid"][1] == 2
