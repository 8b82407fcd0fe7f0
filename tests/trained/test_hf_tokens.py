"""What a round trip through gptrain keeps of a transformers model besides its weights: BOS/EOS
ids, embedding rows beyond the tokenizer; and the tokenizers export cannot write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import hf_logits, max_relative_difference, run_cli, tiny_config  # noqa: E402

from gptrain.errors import ConfigError  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>"]
CHARS = [chr(c) for c in range(32, 127)]  # 3 + 95 = 98 tokens, padded to 128 by gptrain
ROWS = 160  # embedding rows beyond the tokenizer's (as Phi-2 and Qwen2 are shaped)
FP32_REL = 1e-5


def llama_dir(directory: Path, tokenizer: bool) -> Path:
    """A tiny Llama with bos=1, eos=2, 160 embedding rows and (maybe) a 98-token tokenizer."""
    import transformers
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    directory.mkdir()
    if tokenizer:
        words = {w: i for i, w in enumerate(SPECIALS + CHARS)}
        tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        tok.add_special_tokens([AddedToken(w, special=True) for w in SPECIALS])
        tok.save(str(directory / "tokenizer.json"))
        names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **names})
        )
    config = transformers.LlamaConfig(
        vocab_size=ROWS,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize("tokenizer", [True, False], ids=["tokenizer", "no-tokenizer"])
def test_import_then_export_keeps_bos_eos_and_every_embedding_row(tmp_path, tokenizer) -> None:
    source = llama_dir(tmp_path / "src", tokenizer)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (ROWS, 1, 2)
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
    ids = torch.randint(0, ROWS, (2, 16), generator=torch.Generator().manual_seed(1))
    before, after = hf_logits(source, ids), hf_logits(tmp_path / "out", ids)
    assert before.shape == after.shape == (2, 16, ROWS)
    assert max_relative_difference(before, after) < FP32_REL


def test_gpt2_bpe_run_exports_its_end_of_document_as_bos_and_eos(tmp_path) -> None:
    from hf_helpers import tiny_run

    run, _ = tiny_run("gpt2", tmp_path)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (50257, 50256, 50256)


def tiktoken_run(tmp_path: Path, monkeypatch) -> Path:
    """A run trained with TikTokenizer r50k_base (offline: GPT-2's own files stand in for it)."""
    import tiktoken
    from hf_helpers import gpt2_files

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.data.tokenizers import load_gpt2_bpe
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.train.builders import build_model, build_model_config, build_tokenizer, padded_vocab_size

    encoding = load_gpt2_bpe(*gpt2_files(), backend="tiktoken").encoding
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: ["r50k_base"])
    run = tmp_path / "run"
    tok = ["model.tokenizer.type=TikTokenizer", "model.tokenizer.model=r50k_base"]
    cfg = tiny_config("gpt2", run, *tok, "model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null")
    run.mkdir()
    (run / "hparams.yaml").write_text(cfg.to_yaml())
    _, padded = padded_vocab_size(cfg, build_tokenizer(cfg))
    model = build_model(build_model_config(cfg, padded), torch.device("cpu"), seed=7)
    CheckpointManager(run / "checkpoints", keep_last=None).save(1, {"model": model_state_dict(model)}, {})
    return run


def test_tiktoken_run_is_refused_before_writing_or_exported_without_tokenizer(
    tmp_path, monkeypatch, capsys
) -> None:
    run = tiktoken_run(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"model.tokenizer.type=TikTokenizer .*--no-verify"):
        run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    assert "the export has no tokenizer files" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_without_an_import_record_bos_and_eos_come_from_tokenizer_config(tmp_path) -> None:
    from types import SimpleNamespace

    from gptrain.data.tokenizers import load_huggingface
    from gptrain.trained.hf.record import special_token_ids

    source = llama_dir(tmp_path / "src", tokenizer=True)
    tok = SimpleNamespace(type="HuggingFaceTokenizer", model=str(source))
    cfg = SimpleNamespace(model=SimpleNamespace(tokenizer=tok))
    ids = special_token_ids(cfg, load_huggingface(str(source)), {})
    assert ids == {"bos_token_id": 1, "eos_token_id": 2}
