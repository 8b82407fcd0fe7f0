"""Resuming when the padded vocabulary grew (TP 1 -> 2 pads it to a multiple of 2 x
make_vocab_size_divisible_by): the new padding rows must not take the softmax mass that training
had taken from the old ones, or the loss jumps at the resume."""

import numpy as np
import pytest
from train_e2e_helpers import run_recording, tiny_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

WORDS = 60


@pytest.fixture
def counting_corpus(tmp_path):
    """Overrides training on documents that count through 60 words (learnable in a few dozen
    steps, so the model grows confident and its padding rows are pushed down)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from gptrain.data.indexed import IndexedDatasetWriter

    directory = tmp_path / "data"
    directory.mkdir()
    tokenizer = Tokenizer(WordLevel({"<|endoftext|>": 0} | {f"w{i}": i + 1 for i in range(WORDS)}, "w0"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    rng = np.random.default_rng(0)
    prefix = str(directory / "counting_text_document")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(80):
            start, length = int(rng.integers(0, WORDS)), int(rng.integers(20, 60))
            writer.add_document(np.append((start + np.arange(length)) % WORDS + 1, 0).astype(np.uint16))
    return [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix}",
        "model.data.splits_string=90,10,0",
        f"model.data.index_mapping_dir={prefix}-index",
        "model.tokenizer.library=huggingface",
        "model.tokenizer.type=HuggingFaceTokenizer",
        f"model.tokenizer.model={directory / 'tokenizer.json'}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
        "trainer.limit_val_batches=0",
        "model.hidden_dropout=0",
        "model.attention_dropout=0",
        "model.optim.lr=0.01",
        "model.optim.sched.min_lr=0.01",
        "model.optim.sched.warmup_steps=1",
        "model.optim.sched.max_steps=100",
    ]


def test_resume_under_a_larger_padded_vocabulary_keeps_the_loss(tmp_path, monkeypatch, counting_corpus):
    """61 words padded to 72 rows (11 padding), resumed padded to 96 (35): GPT-2's 50,257 words go
    from 47 to 175 padding rows under TP 2. With the new rows drawn at random the first resumed loss
    rose by 0.021 on a 0.46 loss; filled with the mean of the trained padding rows, by 0.006."""

    def config(log_dir, steps, divisible_by, every):
        return tiny_config(
            log_dir,
            *counting_corpus,
            f"trainer.max_steps={steps}",
            f"model.make_vocab_size_divisible_by={divisible_by}",
            f"exp_manager.checkpoint_callback_params.every_n_train_steps={every}",
            "trainer.val_check_interval=1000",
        )

    code, uninterrupted = run_recording(monkeypatch, config(tmp_path / "whole", 41, 24, 1000))
    assert code == 0 and uninterrupted[41] < 1.0  # confident: the case where padding mass matters
    assert run_recording(monkeypatch, config(tmp_path / "resumed", 40, 24, 40))[0] == 0
    code, resumed = run_recording(monkeypatch, config(tmp_path / "resumed", 41, 48, 1000))
    assert code == 0 and sorted(resumed) == [41]
    assert resumed[41] - uninterrupted[41] < 0.012
