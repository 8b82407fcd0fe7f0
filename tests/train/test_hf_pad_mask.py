"""A HuggingFaceTokenizer's pad token leaves the loss, as in Megatron: its GPT dataset masks the
labels of the tokenizer's `pad` (since core 0.7; the legacy _HuggingFaceTokenizer's pad_token_id from
core 0.15, core 0.18's HuggingFaceTokenizer's pad_id) and reads it as id 0; since core 0.16 it masks
nothing where that is the end of document unless --allow-ambiguous-pad-tokens."""

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


@pytest.mark.parametrize(
    "config, special_map, pad, eod",
    [  # ids as transformers 5.24's AutoTokenizer gives them for these files
        ({"eos_token": "</s>"}, {"pad_token": "<pad>"}, 2, 3),
        ({"eos_token": "</s>"}, {"pad_token": {"content": "<pad>", "special": True}}, 2, 3),
        (None, {"pad_token": "<pad>", "eos_token": "</s>"}, 2, 3),
        ({"eos_token": "</s>", "pad_token": "b"}, {"pad_token": "<pad>", "eos_token": "a"}, 2, 0),
        (
            {"eos_token": "</s>", "added_tokens_decoder": {}},
            {"pad_token": "<pad>", "eos_token": "a"},
            None,
            3,
        ),
    ],
)
def test_special_tokens_map_json_names_the_pad_and_eos_as_autotokenizer_reads_it(
    tmp_path, config, special_map, pad, eod
):
    """Before: a pad_token only in special_tokens_map.json (which AutoTokenizer, and so Megatron's
    HF tokenizer, reads) trained; now it is read as transformers does: it overrides
    tokenizer_config.json, which has it read not at all where it holds added_tokens_decoder."""
    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.train.builders import batch_pad

    directory = Path(hf_dir(tmp_path, config or {}))
    if config is None:
        (directory / "tokenizer_config.json").unlink()
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map))
    tokenizer = load_huggingface(str(directory))
    assert (batch_pad(tokenizer), tokenizer.eod) == (pad, eod)


def test_a_pad_named_by_special_tokens_map_json_is_the_file_its_warning_names(tmp_path):
    from types import SimpleNamespace

    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.train.tokenizer_setup import ambiguous_pad_warning

    directory = Path(hf_dir(tmp_path, {"eos_token": "</s>"}))
    (directory / "special_tokens_map.json").write_text(json.dumps({"pad_token": "</s>"}))
    cfg = SimpleNamespace(model=SimpleNamespace(data=SimpleNamespace(allow_ambiguous_pad_tokens=False)))
    warning = ambiguous_pad_warning(cfg, load_huggingface(str(directory)))  # type: ignore[arg-type]
    assert warning is not None
    assert warning.startswith(f"gptrain: warning: {directory}/special_tokens_map.json: its pad_token (id 3)")


def test_a_special_tokens_map_json_that_is_not_an_object_is_one_line_naming_it(tmp_path):
    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.errors import DataError

    directory = Path(hf_dir(tmp_path, {"eos_token": "</s>"}))
    (directory / "special_tokens_map.json").write_text("[1]")
    with pytest.raises(DataError, match=rf"^{directory}/special_tokens_map.json: not a JSON object"):
        load_huggingface(str(directory))


def test_a_resume_under_another_pad_token_says_the_loss_masks_other_labels(tmp_path):
    """Before: the checkpoint's tokenizer record kept `pad` for NullTokenizer only, so a pad_token
    added or removed between save and resume (or a run saved before gptrain masked it) changed the
    loss silently. Now an HF record keeps it and the resume says the change in one line."""
    from gptrain.data.tokenizer_identity import TokenizerCheck
    from gptrain.data.tokenizer_loaders import load_huggingface

    def check_of(config: dict, name: str) -> TokenizerCheck:
        (tmp_path / name).mkdir()
        return TokenizerCheck.of(
            load_huggingface(hf_dir(tmp_path / name, config)), "HuggingFaceTokenizer", "t"
        )

    plain = check_of({"eos_token": "</s>"}, "plain")
    padded = check_of({"eos_token": "</s>", "pad_token": "<pad>"}, "padded")
    assert padded.record["pad"] == 2 and plain.record["pad"] == -1

    def note(saved: dict, live: TokenizerCheck) -> str | None:
        error, note = live.check(saved, "checkpoint c/step_4", "this run's model.tokenizer", "fix")
        assert error is None
        return note

    changed = "the loss leaves out other labels as padding than the checkpoint's run did"
    assert note(padded.record, padded) is None and note(plain.record, plain) is None
    assert note(plain.record, padded) == (
        f"checkpoint c/step_4 was trained with its pad_token's id none, this run's model.tokenizer has 2: {changed}"
    )
    assert note(padded.record, plain) == (
        f"checkpoint c/step_4 was trained with its pad_token's id 2, this run's model.tokenizer has none: {changed}"
    )
    before = {k: v for k, v in plain.record.items() if k != "pad"}  # saved before the key was kept
    assert note(before, padded) == (
        "checkpoint c/step_4 records no padding id (saved by a gptrain before it recorded one; one before it "
        "masked a pad_token masked none); this run's model.tokenizer masks its pad_token's id 2 as Megatron's "
        "GPT dataset does: where the checkpoint's run masked none, the loss leaves out other labels as padding "
        "than it did"
    )
    assert note(before, plain) is None
