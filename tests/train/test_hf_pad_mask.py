"""A HuggingFaceTokenizer's pad token leaves the loss, as in Megatron core 0.16 on: its GPT dataset
masks the labels of the tokenizer's `pad` (the legacy _HuggingFaceTokenizer's pad_token_id, core
0.18's HuggingFaceTokenizer's pad_id), reads it as id 0, and masks nothing where it is the end of
document unless --allow-ambiguous-pad-tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

VOCAB = {"a": 0, "b": 1, "<pad>": 2, "</s>": 3, "[UNK]": 4}


def hf_dir(tmp_path: Path, config: dict, vocab: dict[str, int] = VOCAB) -> str:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    directory = tmp_path / "tok"
    directory.mkdir(exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.mark.parametrize("pad", ["<pad>", {"content": "<pad>", "special": True}])
def test_the_pad_tokens_labels_leave_the_loss(tmp_path, pad):
    """Before: only NullTokenizer's padding was masked; a tokenizer_config.json pad_token trained."""
    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.train.batches import GPTBatchDataset
    from gptrain.train.builders import batch_pad

    tokenizer = load_huggingface(hf_dir(tmp_path, {"eos_token": "</s>", "pad_token": pad}))
    assert batch_pad(tokenizer) == 2
    sample = np.array([0, 1, 2, 3, 2, 2, 0])
    batch = GPTBatchDataset([sample], tokenizer.eod, False, 128, "x", batch_pad(tokenizer))[0]
    assert batch["tokens"].tolist() == [0, 1, 0, 3, 0, 0]
    assert batch["labels"].tolist() == [1, 0, 3, 0, 0, 0]
    assert batch["loss_mask"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]


def test_no_pad_token_or_one_that_ends_documents_masks_nothing(tmp_path):
    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.train.builders import batch_pad

    assert batch_pad(load_huggingface(hf_dir(tmp_path, {"eos_token": "</s>"}))) is None
    same = load_huggingface(hf_dir(tmp_path, {"eos_token": "</s>", "pad_token": "</s>"}))
    assert batch_pad(same) is None
    assert batch_pad(same, allow_ambiguous=True) == 3
    unheld = load_huggingface(hf_dir(tmp_path, {"eos_token": "</s>", "pad_token": "<PAD>"}))
    assert batch_pad(unheld) is None  # transformers would add it as a new id: no id of the data


def test_a_pad_token_that_ends_documents_is_warned_of_in_one_line(tmp_path):
    from types import SimpleNamespace

    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.train.tokenizer_setup import ambiguous_pad_warning

    directory = hf_dir(tmp_path, {"eos_token": "</s>", "pad_token": "</s>"})
    tokenizer = load_huggingface(directory)
    cfg = SimpleNamespace(model=SimpleNamespace(data=SimpleNamespace(allow_ambiguous_pad_tokens=False)))
    warning = ambiguous_pad_warning(cfg, tokenizer)  # type: ignore[arg-type]
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"gptrain: warning: {directory}/tokenizer_config.json: its pad_token (id 3)")
    cfg.model.data.allow_ambiguous_pad_tokens = True
    assert ambiguous_pad_warning(cfg, tokenizer) is None  # type: ignore[arg-type]


def test_a_pad_token_without_an_end_of_document_still_trains(tmp_path):
    """An imported tokenizer.json without an end of document trains (batch_eod); its pad_token must
    not ask for one."""
    from types import SimpleNamespace

    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.train.builders import batch_pad
    from gptrain.train.tokenizer_setup import ambiguous_pad_warning

    no_end = {"a": 0, "b": 1, "<pad>": 2, "[UNK]": 3}
    tokenizer = load_huggingface(hf_dir(tmp_path, {"pad_token": "<pad>"}, no_end))  # no eos, no candidate
    assert batch_pad(tokenizer) == 2
    cfg = SimpleNamespace(model=SimpleNamespace(data=SimpleNamespace(allow_ambiguous_pad_tokens=False)))
    assert ambiguous_pad_warning(cfg, tokenizer) is None  # type: ignore[arg-type]
