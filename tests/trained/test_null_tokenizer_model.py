"""A run trained with NullTokenizer (ids alone, no files): export writes the model without tokenizer
files and says so, transformers loads it and computes gptrain's logits; generate takes and prints
token ids."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import run_cli, saved_run  # noqa: E402

from gptrain.errors import ConfigError  # noqa: E402

VOCAB = 300  # padded to 384 rows: the export keeps the first 300
NULL = [
    "model.tokenizer.type=NullTokenizer",
    f"model.tokenizer.vocab_size={VOCAB}",
    "model.tokenizer.vocab_file=null",
    "model.tokenizer.merge_file=null",
]


@pytest.fixture(scope="module")
def null_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("null")
    run, model = saved_run(tmp / "run", "gpt2", *NULL, step=2)
    return tmp, run, model


def test_export_writes_no_tokenizer_files_says_so_and_transformers_has_the_logits(null_run, capsys):
    """Before: the export's verification encoded its text prompt with NullTokenizer (one line:
    'The' is not a token id) and wrote nothing. The logits compared in float64 from the same float32
    weights (GPT-2's learned positions: transformers computes rope in float32): only summation order
    differs, ~1e-15 relative over 2 layers of at most 64-term dot products; 1e-12 is a wide bound
    far below any wrong mapping."""
    from transformers import AutoModelForCausalLM

    tmp, run, model = null_run
    out = tmp / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        "model.tokenizer.type=NullTokenizer (token ids alone, model.tokenizer.vocab_size=300): the export "
        in err
    )
    assert "has no tokenizer files" in err
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "generation_config.json", "model.safetensors"}
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == VOCAB and config["eos_token_id"] == VOCAB - 1
    assert config.get("bos_token_id") is None
    theirs = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float64).eval()
    ids = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model.double()(ids)[..., :VOCAB]
        logits = theirs(input_ids=ids).logits
    model.float()
    assert logits.dtype == torch.float64 and logits.shape == ours.shape
    assert float((ours - logits).abs().max() / ours.abs().max()) < 1e-12
    assert float(ours.abs().max()) > 1.0  # a real spread of logits


def test_generate_takes_and_prints_token_ids(null_run, capsys):
    _, run, _ = null_run
    assert run_cli(["generate", str(run), "--prompt", "5 17 200", "--max-new-tokens", "4", "--greedy"]) == 0
    printed = capsys.readouterr().out.strip()
    words = printed.split()
    assert words[:3] == ["5", "17", "200"] and 3 < len(words) <= 7, printed
    assert all(0 <= int(word) < VOCAB for word in words)
    with pytest.raises(ConfigError, match="'hello' is not a token id: NullTokenizer reads text as token ids"):
        run_cli(["generate", str(run), "--prompt", "hello", "--max-new-tokens", "1"])


def test_eval_refuses_data_with_ids_past_the_vocabulary_in_one_line(null_run, capsys):
    """Before: `gptrain eval --data-prefix` of data holding id 350 (under the 384 padded rows)
    evaluated the model on a padding row without a word."""
    import numpy as np

    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDatasetWriter

    tmp, run, _ = null_run
    with IndexedDatasetWriter(str(tmp / "wide"), np.uint16) as writer:
        writer.add_document(np.array([*range(40), 350, 7], dtype=np.uint16))
    assert main(["eval", str(run), "--data-prefix", str(tmp / "wide")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("gptrain: error: --data-prefix: ")
    assert f"{tmp / 'wide.bin'} holds token id 350, but NullTokenizer's model.tokenizer.vocab_size=300" in err


@pytest.mark.parametrize(("pad", "written"), [(350, None), (300, None), (7, 7)])
def test_a_padding_id_past_the_exported_rows_is_left_out_of_config_json_and_said(
    tmp_path, capsys, pad, written
):
    """Before: config.json had pad_token_id 350 (null_pad_id outside the data's ids, as Megatron's
    help suggests) beside vocab_size 300, and transformers' Llama refused to build the model
    ('Padding_idx must be within num_embeddings'): the verified export failed, and --no-verify wrote a
    directory that does not load. Now pad_token_id is written only for an id of the exported rows."""
    from transformers import AutoModelForCausalLM

    run, _ = saved_run(tmp_path / "run", "llama", *NULL, f"model.tokenizer.null_pad_id={pad}", step=1)
    out = tmp_path / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(out)]) == 0
    err = capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config.get("pad_token_id") == written and config["vocab_size"] == VOCAB
    said = f"model.tokenizer.null_pad_id={pad} is not one of the {VOCAB} exported ids"
    assert (said in err) == (written is None), err
    AutoModelForCausalLM.from_pretrained(str(out))


def test_eval_checks_a_data_prefix_past_the_read_limit_as_it_reads_its_samples(null_run, capsys, monkeypatch):
    """Before: the .bin was read whole at the start, however large; now past the read limit its
    samples are checked as they are evaluated, and id 350 (under the 384 rows) stops eval in one line
    naming the .bin, document and token."""
    import numpy as np

    from gptrain.cli import main
    from gptrain.data import token_bound
    from gptrain.data.indexed import IndexedDatasetWriter

    tmp, run, _ = null_run
    with IndexedDatasetWriter(str(tmp / "large"), np.uint16) as writer:
        writer.add_document(np.array([*range(40), 350, 7], dtype=np.uint16))
    monkeypatch.setattr(token_bound, "SCAN_LIMIT_BYTES", 0)
    monkeypatch.setattr(token_bound, "_scan", lambda dataset: pytest.fail(f"{dataset.bin_path} was read"))
    assert main(["eval", str(run), "--data-prefix", str(tmp / "large")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("gptrain: note: --data-prefix: 1 .bin file(s) of 0.0 GiB whose token dtype")
    large = tmp / "large"
    head = f"gptrain: error: --data-prefix {large}: {large}.bin holds token id 350 (document 0, token 40; sample "
    assert err[-1].startswith(head), err
    assert "), but NullTokenizer's model.tokenizer.vocab_size=300 has ids 0 to 299: give " in err[-1], err
