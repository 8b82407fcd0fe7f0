"""NullTokenizer data too large to read at the start: an id past vocab_size in a sample that one
data-parallel rank alone reads stops the run on every rank, the reading rank saying it in one line."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from reliability_helpers import TINY, finish_ranks, start_ranks

from gptrain.config import load_training_config
from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

VOCAB = 300  # padded to 384 rows: id 350 has a row, and only NullTokenizer's check refuses it
# every rank reads no .bin at the start, as past token_bound.SCAN_LIMIT_BYTES
NOTHING_READ_AT_START = """
import sys
from gptrain.data import token_bound
token_bound.SCAN_LIMIT_BYTES = 0
def refuse(dataset):
    raise SystemExit(f"{dataset.bin_path} was read at the start")
token_bound._scan = refuse
from gptrain.cli import main
sys.exit(main(sys.argv[1:]))
"""


def write_documents(prefix: str) -> None:
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for start in range(32):
            writer.add_document(np.append(np.arange(start, start + 20) % 250, VOCAB - 1).astype(np.uint16))


def null_overrides(prefix: str, index_dir: str) -> list[str]:
    return [
        "model.data.data_impl=mmap",
        "model.data.mock_vocab_size=null",
        f"model.data.data_prefix=[{prefix}]",
        "model.data.splits_string=100,0,0",
        f"model.data.index_mapping_dir={index_dir}",
        "model.tokenizer.type=NullTokenizer",
        f"model.tokenizer.vocab_size={VOCAB}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]


def rank_one_sample(cfg) -> tuple[int, int, int]:
    """(sample, document, offset) of a token only one sample holds, in a sample rank 1 reads at
    iteration 2 or later (global batch 2 of micro-batches of 1: rank 1 reads the odd samples)."""
    from gptrain.train.builders import _build_datasets
    from gptrain.train.tokenizer_setup import build_tokenizer

    samples = _build_datasets(cfg, VOCAB, build_tokenizer(cfg))[0].samples
    for index in (3, 5, 7):
        where = samples.locate(index)
        length = int(samples.dataset.sequence_lengths[where.documents[0]])
        if where.first_offset + 3 < length and (len(where.documents) > 1 or where.last_length > 3):
            return index, where.documents[0], where.first_offset + 3
    raise AssertionError("no odd sample starts 3 tokens inside a document")


@pytest.mark.distributed
def test_an_id_past_the_vocabulary_read_by_one_rank_stops_every_rank(tmp_path, monkeypatch):
    from gptrain.data import token_bound

    monkeypatch.setattr(token_bound, "SCAN_LIMIT_BYTES", 0)  # as in the ranks: no scan, nothing kept
    prefix, log_dir = str(tmp_path / "pretokenized"), tmp_path / "run"
    write_documents(prefix)
    overrides = [*null_overrides(prefix, str(tmp_path / "index")), "trainer.hang_timeout_minutes=0"]
    cfg = load_training_config(
        "gpt3/126m", [*TINY, "trainer.devices=2", f"exp_manager.explicit_log_dir={log_dir}", *overrides]
    )
    sample, document, offset = rank_one_sample(cfg)  # the ranks load these indices from the cache
    dataset = IndexedDataset(prefix)
    tokens = np.memmap(dataset.bin_path, dtype=dataset.dtype, mode="r+")
    tokens[int(np.sum(dataset.sequence_lengths[:document])) + offset] = 350
    tokens.flush()
    ranks = start_ranks(log_dir, overrides, program=[sys.executable, "-c", NOTHING_READ_AT_START])
    outputs = finish_ranks(ranks)
    codes = [rank.returncode for rank in ranks]
    assert codes[1] == 2 and codes[0] != 0, (codes, outputs[0][1][-2000:], outputs[1][1][-2000:])
    error = [line for line in outputs[1][1].splitlines() if line.startswith("gptrain: error: ")]
    assert error == [
        f"gptrain: error: model.data.data_prefix: {prefix}.bin holds token id 350 (document {document}, "
        f"token {offset}; sample {sample}), but NullTokenizer's model.tokenizer.vocab_size=300 has ids 0 to "
        "299: give the vocab_size of the tokenizer the data was made with (more than 350; Megatron's "
        "--vocab-size)"
    ], outputs[1][1][-3000:]
    step = sample // 2 + 1  # rank 0 waits in that step's gradient all-reduce, and learns its peer ended
    assert f"gptrain: error: rank 0: a collective lost its peer at iteration {step}: " in outputs[0][1]
