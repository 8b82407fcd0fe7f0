"""Data tokenized with a larger tokenizer than the run's: one line naming the data, never an
index error inside the model (a CUDA device assert on a GPU), and never a hang at exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from reliability_helpers import PYTHON_GPTRAIN, subprocess_env, train_args

from gptrain.cli import main

# ids up to 5000 from a tokenizer of 61 words: the model has 128 embedding rows
FOREIGN_DOCUMENTS = [np.array([1, 2, 3, 5000, 4] * 6) for _ in range(40)]


def test_training_names_token_ids_beyond_the_vocabulary(tmp_path, corpus_writer, capsys):
    corpus = corpus_writer(tmp_path / "data", FOREIGN_DOCUMENTS)
    assert main(train_args(tmp_path / "run", *corpus)) == 2
    err = capsys.readouterr().err
    assert "model.data.data_prefix: sample" in err and "token id 5000" in err and "128 rows" in err
    assert "Traceback" not in err


def test_a_failing_run_with_loader_workers_exits_with_one_line(tmp_path, corpus_writer):
    """A DataLoader worker's error was printed with the worker's traceback, and the run then hung at
    exit: multiprocessing terminates the workers, which ignore SIGTERM, and waits for them."""
    corpus = corpus_writer(tmp_path / "data", FOREIGN_DOCUMENTS)
    args = train_args(tmp_path / "run", *corpus, "model.data.num_workers=2")
    try:
        done = subprocess.run(
            [*PYTHON_GPTRAIN, *args], env=subprocess_env(), capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not exit after its error (DataLoader workers left waiting)")
    assert done.returncode == 2, done.stderr
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("gptrain: error:")]
    assert len(error_lines) == 1 and "token id 5000" in error_lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_eval_names_token_ids_beyond_the_vocabulary(tmp_path, corpus_writer, capsys):
    good = corpus_writer(tmp_path / "good", [np.arange(1, 30) for _ in range(40)])
    assert main(train_args(tmp_path / "run", *good)) == 0
    foreign = corpus_writer(tmp_path / "foreign", FOREIGN_DOCUMENTS)
    prefix = next(o for o in foreign if o.startswith("model.data.data_prefix=")).split("=", 1)[1]
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data-prefix", prefix]) == 2
    err = capsys.readouterr().err
    assert f"--data-prefix {prefix}: sample" in err and "token id 5000" in err


def test_training_names_a_negative_token_id(tmp_path, corpus_writer, capsys):
    """A .idx whose dtype code says int16 over uint16 tokens (a damaged or foreign .idx): id 65535
    reads as -1, which only the upper bound was checked against, so the embedding failed deep in
    the model (a device-side assert on a GPU)."""
    overrides = corpus_writer(tmp_path / "data", [np.array([1, 2, 65535, 4] * 6) for _ in range(40)])
    prefix = next(o for o in overrides if o.startswith("model.data.data_prefix=")).split("=", 1)[1]
    idx = Path(f"{prefix}.idx")
    header = bytearray(idx.read_bytes())
    assert header[17] == 8  # uint16: the dtype code follows the 9-byte magic and the u64 version
    header[17] = 3  # int16
    idx.write_bytes(bytes(header))
    assert main(train_args(tmp_path / "run", *overrides)) == 2
    err = capsys.readouterr().err
    assert "model.data.data_prefix: sample" in err and "token id -1" in err and "negative" in err
    assert "Traceback" not in err
