"""Fixtures shared by several test folders."""

import pytest


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """The test machine has 2 shared cores: extra intra-op threads only add contention.

    Module scope, so that module-scoped runs use the same thread count as the tests that
    compare against them (float reductions depend on it, and resume tests compare bits).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def word_corpus(tmp_path):
    """(prefix, tokenizer.json): a real Megatron .bin/.idx corpus of 80 EOD-terminated documents
    of a 61-word vocabulary and its word-level HF tokenizer, under tmp_path/data."""
    import numpy as np
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from gptrain.data.indexed import IndexedDatasetWriter

    directory = tmp_path / "data"
    directory.mkdir()
    vocab = {"<|endoftext|>": 0} | {f"w{i}": i + 1 for i in range(60)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    rng = np.random.default_rng(0)
    prefix = str(directory / "corpus_text_document")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(80):
            doc = rng.integers(1, 61, size=int(rng.integers(5, 40)))
            writer.add_document(np.append(doc, 0).astype(np.uint16))
    return prefix, str(directory / "tokenizer.json")


@pytest.fixture
def indexed_corpus(word_corpus):
    """Overrides that train on `word_corpus` (split 90,10,0, index cache beside it)."""
    prefix, tokenizer = word_corpus
    return [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix}",
        "model.data.splits_string=90,10,0",
        f"model.data.index_mapping_dir={prefix}-index",
        "model.data.eod_mask_loss=true",
        "model.tokenizer.library=huggingface",
        "model.tokenizer.type=HuggingFaceTokenizer",
        f"model.tokenizer.model={tokenizer}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
