"""Megatron's NullTokenizer on data already tokenized: model.tokenizer.type=NullTokenizer with
model.tokenizer.vocab_size, no tokenizer files (Megatron core 0.18: N ids, end of document N - 1)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from train_e2e_helpers import run_recording, tiny_config

from gptrain.data.indexed import IndexedDatasetWriter
from gptrain.errors import ConfigError, DataError, GptrainError, error_text

VOCAB = 300  # past uint8, under uint16's bound; padded to 384


def write_pretokenized(prefix, documents: int = 64, vocab: int = VOCAB, dtype=np.uint16) -> None:
    """Documents of a repeating pattern of ids below `vocab` (learnable in a few steps), each ended
    by the NullTokenizer's end of document vocab - 1."""
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(str(prefix), dtype) as writer:
        for _ in range(documents):
            start = int(rng.integers(0, 8))
            body = (np.arange(start, start + 40) % 8) * 7 + 200  # ids 200..249
            writer.add_document(np.append(body, vocab - 1).astype(dtype))


def null_config(tmp_path, *extra: str):
    prefix = tmp_path / "pretokenized"
    write_pretokenized(prefix)
    return tiny_config(
        tmp_path / "run",
        "model.tokenizer.type=NullTokenizer",
        f"model.tokenizer.vocab_size={VOCAB}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
        f"model.data.data_prefix=[{prefix}]",
        "model.data.splits_string=90,10,0",
        "model.data.eod_mask_loss=true",
        "model.optim.lr=3e-3",
        "trainer.max_steps=8",
        "trainer.limit_test_batches=0",
        *extra,
    )


def test_pretokenized_data_trains_with_a_null_tokenizer_and_its_loss_goes_down(tmp_path, monkeypatch):
    """Before: NullTokenizer was no model.tokenizer.type (refused as unknown)."""
    cfg = null_config(tmp_path)
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0
    steps = sorted(losses)
    assert steps == list(range(1, 9))
    # log(300) = 5.7 at the start; 8 steps of the 8-periodic pattern take it down by ~0.9
    assert losses[steps[-1]] < losses[steps[0]] - 0.5, losses
    hparams = (tmp_path / "run" / "hparams.yaml").read_text()
    assert "type: NullTokenizer" in hparams and "vocab_size: 300" in hparams


def test_the_null_tokenizer_is_megatrons_of_core_0_18():
    from gptrain.data.tokenizers import build_tokenizer
    from gptrain.train.tokenizer_setup import null_options

    class Tok:
        vocab_size, null_eod_id, null_pad_id = 128256, None, None

    tokenizer = build_tokenizer("NullTokenizer", null=null_options(Tok))
    assert (tokenizer.vocab_size, tokenizer.eod, tokenizer.pad) == (128256, 128255, -1)
    assert tokenizer.encode("17 4  2051\n") == [17, 4, 2051] and tokenizer.decode([17, 4]) == "17 4"
    with pytest.raises(ConfigError, match="'hello' is not a token id"):
        tokenizer.encode("hello")
    with pytest.raises(ConfigError, match="token id 128256 is not in NullTokenizer's vocabulary"):
        tokenizer.encode("128256")


def test_the_padded_vocabulary_is_megatrons(tmp_path):
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    cfg = null_config(tmp_path, "model.tokenizer.vocab_size=128256", "model.tensor_model_parallel_size=1")
    assert padded_vocab_size(cfg, build_tokenizer(cfg)) == (128256, 128256)
    cfg = null_config(tmp_path, "model.tokenizer.vocab_size=50257")
    assert padded_vocab_size(cfg, build_tokenizer(cfg)) == (50257, 50304)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["model.tokenizer.vocab_size=null"],
            "NullTokenizer needs its vocabulary size: model.tokenizer.vocab_size",
        ),
        (
            ["model.tokenizer.null_eod_id=300"],
            "model.tokenizer.null_eod_id: 300 is not an id of the vocabulary",
        ),
        (["model.tokenizer.null_pad_id=-2"], "model.tokenizer.null_pad_id: -2"),
        (["model.tokenizer.tiktoken_pattern=v2"], "model.tokenizer.tiktoken_pattern"),
    ],
)
def test_null_tokenizer_settings_are_checked_as_the_config_loads(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        null_config(tmp_path, *extra)


def test_null_ids_beside_another_tokenizer_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="model.tokenizer.null_eod_id: read only by NullTokenizer"):
        tiny_config(tmp_path, "model.tokenizer.null_eod_id=3")


def test_the_scan_limit_beside_another_tokenizer_is_refused(tmp_path):
    """Before: model.data.token_scan_limit_gb beside another type was taken silently (only
    NullTokenizer's data is scanned), where null_eod_id and null_pad_id are refused."""
    message = (
        "model.data.token_scan_limit_gb: read only with NullTokenizer (whose data's ids nothing else "
        "checks), not GPT2BPETokenizer; drop it"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        tiny_config(tmp_path, "model.data.token_scan_limit_gb=1")
    tiny_config(tmp_path, "model.data.token_scan_limit_gb=null")


def test_eod_mask_and_padding_are_megatrons():
    """--eod-mask-loss masks inputs that are the end of document; --null-tokenizer-pad-id masks
    labels that are padding and reads it as id 0 (Megatron's GPT dataset)."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.train.batches import GPTBatchDataset
    from gptrain.train.builders import batch_pad

    sample = np.array([5, 9, 0, 5, 7, 9, 9])
    tokenizer = NullTokenizer(10, pad_id=7)
    batch = GPTBatchDataset([sample], tokenizer.eod, True, 128, "x", batch_pad(tokenizer))[0]
    assert batch["tokens"].tolist() == [5, 9, 0, 5, 0, 9]
    assert batch["labels"].tolist() == [9, 0, 5, 0, 9, 9]
    assert batch["loss_mask"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert batch_pad(NullTokenizer(10)) is None
    unpadded = GPTBatchDataset([sample], 9, True, 128, "x", batch_pad(NullTokenizer(10)))[0]
    assert torch.equal(unpadded["tokens"], torch.tensor([5, 9, 0, 5, 7, 9]))


def test_ids_past_the_vocabulary_are_refused_before_the_first_step(tmp_path, monkeypatch, capsys):
    """Before: an id past vocab_size but under the padded rows (384) trained on a padding row
    without a word; now one line naming the .bin and its largest id, before any step."""
    from gptrain.data import token_bound
    from gptrain.train import step_loop

    cfg = null_config(tmp_path, "model.tokenizer.vocab_size=290")  # the data's EOD is 299
    # a .bin of the start's read limit is still read (the limit is inclusive)
    monkeypatch.setattr(token_bound, "SCAN_LIMIT_BYTES", (tmp_path / "pretokenized.bin").stat().st_size)
    monkeypatch.setattr(step_loop, "record", lambda *args: pytest.fail("a step ran"))
    with pytest.raises(DataError) as raised:
        run_recording(monkeypatch, cfg)
    message = str(raised.value)
    assert "\n" not in message
    assert f"{tmp_path / 'pretokenized.bin'} holds token id 299, but NullTokenizer's " in message
    assert "model.tokenizer.vocab_size=290 has ids 0 to 289" in message
    assert "for its largest token id" in capsys.readouterr().err


def test_the_dtype_bound_spares_the_scan_and_a_scan_is_kept(tmp_path, monkeypatch):
    from gptrain.data import token_bound

    write_pretokenized(tmp_path / "small", vocab=300)
    write_pretokenized(tmp_path / "wide", vocab=300, dtype=np.int32)
    real_scan, scanned = token_bound._scan, []

    def scan(dataset):
        scanned.append(str(dataset.bin_path))
        return real_scan(dataset)

    monkeypatch.setattr(token_bound, "_scan", scan)
    memo = str(tmp_path / "memo")
    # uint16 holds at most 65535: a vocabulary of 65536 ids needs no reading
    token_bound.check_ids_fit([str(tmp_path / "small")], 65536, lambda _: memo, "x")
    assert scanned == []
    for _ in range(2):  # int32: read once, then the kept number
        token_bound.check_ids_fit([str(tmp_path / "wide")], 300, lambda _: memo, "x")
    assert scanned == [str(tmp_path / "wide.bin")]
    with pytest.raises(DataError, match="wide.bin holds token id 299, but NullTokenizer's"):
        token_bound.check_ids_fit([str(tmp_path / "wide")], 299, lambda _: memo, "x")
    assert len(scanned) == 1
    # past the start's read limit a kept scan still tells (one number), and nothing is read
    monkeypatch.setattr(token_bound, "SCAN_LIMIT_BYTES", 0)
    with pytest.raises(DataError, match="wide.bin holds token id 299, but NullTokenizer's"):
        token_bound.check_ids_fit([str(tmp_path / "wide")], 299, lambda _: memo, "x")
    assert len(scanned) == 1


def poke(prefix, document: int, offset: int, token_id: int) -> None:
    """Token `offset` of `document` in the .bin at `prefix` set to `token_id` (the .idx unchanged, so
    the cached sample indices still fit)."""
    from gptrain.data.indexed import IndexedDataset

    dataset = IndexedDataset(str(prefix))
    position = int(np.sum(dataset.sequence_lengths[:document], dtype=np.int64)) + offset
    tokens = np.memmap(dataset.bin_path, dtype=dataset.dtype, mode="r+")
    tokens[position] = token_id
    tokens.flush()


def a_token_only_sample_reads(samples, indices) -> tuple[int, int, int]:
    """(sample, document, offset) of a token 3 into one of `indices`' samples, inside its first
    document and past the token it shares with the sample before it."""
    for index in indices:
        where = samples.locate(index)
        length = int(samples.dataset.sequence_lengths[where.documents[0]])
        if where.first_offset + 3 < length and (len(where.documents) > 1 or where.last_length > 3):
            return index, where.documents[0], where.first_offset + 3
    raise AssertionError(f"no sample of {indices} starts 3 tokens inside a document")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_corpus_past_the_read_limit_is_checked_as_samples_are_read_and_stops_at_that_step(
    tmp_path, monkeypatch, capsys, workers
):
    """Before: a .bin whose dtype can hold ids past vocab_size was read whole on rank 0 at the start
    (a multi-TB corpus: tens of minutes while the other ranks waited in the dataset-building turns).
    Now no .bin past SCAN_LIMIT_BYTES is read at the start; an id 300 <= 350 < 384 rows (no per-sample
    check caught it) stops the run at the step that reads it, in one line naming the .bin, document
    and token."""
    from gptrain.data import token_bound
    from gptrain.train import step_loop
    from gptrain.train.builders import _build_datasets
    from gptrain.train.tokenizer_setup import build_tokenizer

    cfg = null_config(tmp_path, f"model.data.num_workers={workers}")  # 1: raised in a loader worker
    prefix, bin_path = tmp_path / "pretokenized", tmp_path / "pretokenized.bin"
    monkeypatch.setattr(token_bound, "SCAN_LIMIT_BYTES", bin_path.stat().st_size - 1)
    monkeypatch.setattr(token_bound, "_scan", lambda dataset: pytest.fail(f"{dataset.bin_path} was read"))
    train = _build_datasets(cfg, VOCAB, build_tokenizer(cfg))[0]  # the run's indices, cached
    sample, document, offset = a_token_only_sample_reads(train.samples, range(8, 12))  # iteration 3's
    poke(prefix, document, offset, 350)
    recorded, record = [], step_loop.record
    monkeypatch.setattr(step_loop, "record", lambda s, *a: (record(s, *a), recorded.append(s.state.step)))
    with pytest.raises(DataError) as raised:
        run_recording(monkeypatch, cfg)
    assert recorded == [1, 2]
    message = error_text(raised.value)  # what the CLI prints after "gptrain: error: "
    assert message == (
        f"model.data.data_prefix: {bin_path} holds token id 350 (document {document}, token {offset}; "
        f"sample {sample}), but NullTokenizer's model.tokenizer.vocab_size=300 has ids 0 to 299: give the "
        "vocab_size of the tokenizer the data was made with (more than 350; Megatron's --vocab-size)"
    )
    err = capsys.readouterr().err
    assert (
        "gptrain: note: model.data.data_prefix: 1 .bin file(s) of 0.0 GiB whose token dtype holds ids past "
        "NullTokenizer's model.tokenizer.vocab_size=300 are not read at the start" in err
    )


def test_the_per_sample_check_is_null_tokenizers_alone(tmp_path, monkeypatch, indexed_corpus):
    """Another tokenizer's files bound its data's ids: its samples keep the one max against the
    embedding's rows they had, and the NullTokenizer check is never reached."""

    from gptrain.data import token_bound
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.train.batches import GPTBatchDataset
    from gptrain.train.builders import _build_datasets, null_vocab
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    cfg = tiny_config(tmp_path / "run", *indexed_corpus)
    tokenizer = build_tokenizer(cfg)
    vocab, rows = padded_vocab_size(cfg, tokenizer)
    monkeypatch.setattr(token_bound, "check_ids_fit", lambda *a: pytest.fail("ids checked at the start"))
    monkeypatch.setattr(
        token_bound, "sample_past_vocabulary", lambda *a: pytest.fail("NullTokenizer's check")
    )
    train = _build_datasets(cfg, vocab, tokenizer)[0]
    assert (null_vocab(tokenizer), train.null_vocab, train.id_limit) == (None, None, rows)
    assert null_vocab(NullTokenizer(VOCAB)) == VOCAB
    beyond = np.array([1, vocab, rows - 1, 2])  # past the tokenizer, within the rows: as before
    assert GPTBatchDataset([beyond], 0, True, rows, "x")[0]["labels"].tolist() == [vocab, rows - 1, 2]
    with pytest.raises(
        DataError, match=f"sample 0 holds token id {rows}, but the model's vocabulary has {rows} rows"
    ):
        GPTBatchDataset([np.array([1, rows])], 0, True, rows, "x")[0]


def test_data_prepared_with_legacy_gpt2_trains_under_a_null_tokenizer(tmp_path):
    """NullTokenizer encodes no text, so how GPT-2 BPE encoded a literal <|endoftext|> (the data's
    recorded --legacy-tokenizer) changes nothing in a NullTokenizer run; before, it was refused as
    'a literal <|endoftext|> in text is encoded otherwise' (generate, eval and export encode none)."""
    from gptrain.data.tokenizer_record import legacy_conflict, write_tokenizer_record

    prefix = str(tmp_path / "pretokenized")
    write_pretokenized(prefix)
    write_tokenizer_record(prefix, "GPT2BPETokenizer", legacy=True)
    assert legacy_conflict([prefix], False, "NullTokenizer") is None
    assert legacy_conflict([prefix], False, "HuggingFaceTokenizer") is not None  # text encoders still


def test_a_null_tokenizer_run_resumes_and_another_end_of_document_is_refused(tmp_path, monkeypatch):
    """The checkpoint records NullTokenizer as any tokenizer (its ids written out, its end of
    document): the same settings resume; another end of document changes what the loss masks."""
    code, _ = run_recording(monkeypatch, null_config(tmp_path, "trainer.max_steps=4"))
    assert code == 0
    code, losses = run_recording(monkeypatch, null_config(tmp_path, "trainer.max_steps=6"))
    assert code == 0 and sorted(losses) == [5, 6]
    with pytest.raises(GptrainError, match="end-of-document id 7, not 299"):
        run_recording(
            monkeypatch, null_config(tmp_path, "trainer.max_steps=8", "model.tokenizer.null_eod_id=7")
        )


def test_the_id_check_comes_before_the_index_builds(tmp_path, monkeypatch):
    """The sample and shuffle indices of a large corpus take minutes on a cache miss; ids past
    vocab_size are said before any is built."""
    from gptrain.data import builder
    from gptrain.train.builders import _build_datasets
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size

    cfg = null_config(tmp_path, "model.tokenizer.vocab_size=290")
    monkeypatch.setattr(builder, "build_gpt_datasets", lambda *a, **k: pytest.fail("indices built first"))
    tokenizer = build_tokenizer(cfg)
    with pytest.raises(DataError, match="holds token id 299"):
        _build_datasets(cfg, padded_vocab_size(cfg, tokenizer)[0], tokenizer)


def fingerprinted(prefix: str, eod: int = VOCAB - 1) -> None:
    """A record as data prepare writes it with a real tokenizer of VOCAB tokens: with a fingerprint."""
    from gptrain.data.tokenizer_record import write_tokenizer_record

    files = ["/data/vocab.json", "/data/merges.txt"]
    vocabulary = {"files": files, "size": VOCAB, "tokens": "a" * 64, "encodes": "b" * 64, "eod": eod}
    write_tokenizer_record(prefix, "GPT2BPETokenizer", legacy=False, vocabulary=vocabulary)


def test_data_prepared_with_a_fingerprinted_tokenizer_trains_and_is_inspected_under_a_null_tokenizer(
    tmp_path, capsys
):
    """NullTokenizer is for data tokenized by another tokenizer: its vocabulary was compared with the
    record's fingerprint and refused ('model.tokenizer is NullTokenizer None: the same size, other
    tokens at the same ids'), and data inspect/sample warned of another vocabulary. Its ids are
    checked against vocab_size instead (token_bound)."""
    from gptrain.cli import main
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    cfg = null_config(tmp_path)
    prefix = str(tmp_path / "pretokenized")
    fingerprinted(prefix)
    check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
    check_data_tokenizer(cfg, [prefix], "--data-prefix", build_tokenizer(cfg))  # eval's
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB)]
    capsys.readouterr()
    assert main(["data", "inspect", prefix, *null]) == 0
    assert "warning" not in capsys.readouterr().err
    sample = ["data", "sample", "--data-prefix", prefix, "--seq-length", "8", "--num-samples", "2,0,0"]
    assert main([*sample, "--cache-dir", str(tmp_path / "cache"), *null]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_recorded_end_of_document_other_than_the_null_tokenizers_is_a_warning_under_eod_mask_loss(
    tmp_path, capsys
):
    """--append-eod ended the data's documents with its tokenizer's eod (recorded); NullTokenizer masks
    its own (vocab_size - 1 unless null_eod_id): the documents' ends would stay in the loss. Megatron
    takes the run and the ids fit, so a warning naming the setting, not a refusal; without
    eod_mask_loss no id is masked, so nothing to say."""
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    prefix = str(tmp_path / "pretokenized")

    def warning(*extra: str) -> str:
        cfg = null_config(tmp_path, *extra)
        fingerprinted(prefix, eod=7)
        capsys.readouterr()
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
        return capsys.readouterr().err

    assert warning() == (
        f"gptrain: warning: model.data.data_prefix: {prefix} was tokenized with GPT2BPETokenizer "
        f"/data/vocab.json + /data/merges.txt ({prefix}.tokenizer), whose end-of-document id is 7; "
        "NullTokenizer's is 299, which model.data.eod_mask_loss masks: the data's document ends stay in the "
        "loss; set model.tokenizer.null_eod_id=7 to mask them\n"
    )
    assert warning("model.tokenizer.null_eod_id=7") == ""
    assert warning("model.data.eod_mask_loss=false") == ""


def test_a_padding_id_that_is_the_end_of_document_masks_nothing_as_megatron_unless_allowed(tmp_path, capsys):
    """Before: null_pad_id equal to the end of document (--null-tokenizer-pad-id 299 with eod 299)
    took every end-of-document label out of the loss and read every input one as id 0, silently.
    Megatron core 0.18's GPT dataset then resets the padding to none, with a warning, unless
    --allow-ambiguous-pad-tokens keeps it (model.data.allow_ambiguous_pad_tokens): so does gptrain."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.train.batches import GPTBatchDataset
    from gptrain.train.builders import batch_eod, batch_pad
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    tokenizer = NullTokenizer(300, None, 299)
    sample = [np.array([5, 6, 299, 7, 8, 299, 9])]
    assert batch_pad(tokenizer) is None
    kept = GPTBatchDataset(sample, batch_eod(tokenizer, False), False, 384, "x", batch_pad(tokenizer))[0]
    assert kept["tokens"].tolist() == [5, 6, 299, 7, 8, 299]
    assert kept["labels"].tolist() == [6, 299, 7, 8, 299, 9]
    assert kept["loss_mask"].tolist() == [1.0] * 6
    assert batch_pad(tokenizer, allow_ambiguous=True) == 299
    padded = GPTBatchDataset(sample, None, False, 384, "x", batch_pad(tokenizer, allow_ambiguous=True))[0]
    assert padded["tokens"].tolist() == [5, 6, 0, 7, 8, 0]
    assert padded["loss_mask"].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert batch_pad(NullTokenizer(300, None, 7)) == 7  # a padding id of its own

    def warning(*extra: str) -> str:
        cfg = null_config(tmp_path, *extra)
        capsys.readouterr()
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
        return capsys.readouterr().err

    assert warning("model.tokenizer.null_pad_id=299") == (
        "gptrain: warning: model.tokenizer.null_pad_id=299 is NullTokenizer's end of document too: as "
        "Megatron's GPT dataset, gptrain masks nothing as padding (Megatron's warning: the pad token id "
        "collides with another special token id); give a padding id of its own, or set "
        "model.data.allow_ambiguous_pad_tokens=true (Megatron's --allow-ambiguous-pad-tokens) to mask "
        "the end of document's labels and read it as id 0\n"
    )
    assert warning("model.tokenizer.null_pad_id=299", "model.data.allow_ambiguous_pad_tokens=true") == ""
    assert warning("model.tokenizer.null_pad_id=7") == ""


def test_a_resume_under_another_padding_id_says_the_loss_masks_other_labels():
    """Before: a checkpoint trained with null_pad_id 7 resumed under 5 (or none) silently, though the
    loss then masks other labels; another end of document is refused. Now the checkpoint records the
    padding id and the load says the change (a note beside the resume line, not a refusal: the ids
    keep their meaning). Checkpoints recorded before, without it, load as before."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_identity import TokenizerCheck

    def check(saved: NullTokenizer, live: NullTokenizer, drop_pad: bool = False):
        record = TokenizerCheck.of(saved, "NullTokenizer", "(vocab_size 300)").record
        if drop_pad:
            record.pop("pad")
        return TokenizerCheck.of(live, "NullTokenizer", "(vocab_size 300)").check(
            record, "checkpoint c/step_4", "this run's model.tokenizer", "fix"
        )

    assert check(NullTokenizer(300, None, 7), NullTokenizer(300, None, 7)) == (None, None)
    assert check(NullTokenizer(300, None, 7), NullTokenizer(300, None, 5)) == (
        None,
        "checkpoint c/step_4 was trained with NullTokenizer's padding id 7 (model.tokenizer.null_pad_id), "
        "this run's model.tokenizer has 5: the loss leaves out other labels as padding than the checkpoint's run did",
    )
    assert check(NullTokenizer(300, None, 7), NullTokenizer(300)) == (
        None,
        "checkpoint c/step_4 was trained with NullTokenizer's padding id 7 (model.tokenizer.null_pad_id), "
        "this run's model.tokenizer has none: the loss leaves out other labels as padding than the checkpoint's "
        "run did",
    )
    assert check(NullTokenizer(300, None, 7), NullTokenizer(300), drop_pad=True) == (None, None)


def test_a_blend_prepared_with_and_without_eod_is_said_at_the_start(tmp_path, capsys):
    """Before: the records held no --append-eod, and nothing compared the blend's datasets."""
    from gptrain.data.tokenizer_record import write_tokenizer_record
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    with_eod, without = (str(tmp_path / name) for name in ("with_eod", "without"))
    for prefix, append_eod in ((with_eod, True), (without, False)):
        write_pretokenized(prefix)
        write_tokenizer_record(prefix, "NullTokenizer", False, append_eod=append_eod)
    blend = f"model.data.data_prefix=[0.5,{with_eod},0.5,{without}]"
    cfg = null_config(tmp_path, blend, "model.data.eod_mask_loss=false")
    capsys.readouterr()
    check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gptrain: warning: model.data.data_prefix: {with_eod} was prepared with --append-eod, {without} without"
    )
    cfg = null_config(tmp_path, blend)  # eod_mask_loss: the data without EOD is named
    check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{without} was prepared without --append-eod" in err


def test_the_job_and_the_preflight_read_the_records_of_the_built_splits_alone(tmp_path, capsys):
    """Before: the job compared the records of every split's prefixes, the launch preflight those of
    the splits built: a test split not built (trainer.limit_test_batches=0) prepared without
    --append-eod was warned of in the job's log, not before the queue. Now both read the built splits."""
    from gptrain.data.tokenizer_record import write_tokenizer_record
    from gptrain.launch.preflight import check_training_files
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    with_eod, without = (str(tmp_path / name) for name in ("with_eod", "without"))
    for prefix, append_eod in ((with_eod, True), (without, False)):
        write_pretokenized(prefix)
        write_tokenizer_record(prefix, "NullTokenizer", False, append_eod=append_eod)
    splits = f"model.data.data_prefix={{train:[{with_eod}],validation:[{with_eod}],test:[{without}]}}"

    def job_and_preflight_lines(*more: str) -> tuple[list[str], list[str]]:
        cfg = null_config(tmp_path, splits, "model.data.eod_mask_loss=false", *more)
        capsys.readouterr()
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
        job = capsys.readouterr().err.splitlines()
        preflight = [line for line in check_training_files(cfg, False) if line.startswith("warning")]
        return [line.replace("gptrain: warning: ", "warning  training.") for line in job], preflight

    assert job_and_preflight_lines() == ([], [])  # limit_test_batches=0: the test split is not built
    job, preflight = job_and_preflight_lines("trainer.limit_test_batches=1")
    assert len(job) == 1 and job == preflight and f"{with_eod} was prepared with --append-eod" in job[0]


def test_the_starts_scan_limit_is_a_setting(tmp_path, monkeypatch, capsys):
    """Before: 4 GiB, fixed: a larger corpus with an id past vocab_size ran until a batch held it
    (hours in, perhaps), and a slow file system could not skip the read. Now
    model.data.token_scan_limit_gb: 0 reads nothing at the start, more reads a larger corpus once."""
    from gptrain.data import token_bound
    from gptrain.train.tokenizer_setup import build_tokenizer, check_token_ids

    cfg = null_config(tmp_path, "model.tokenizer.vocab_size=290", "model.data.token_scan_limit_gb=0")
    capsys.readouterr()
    check_token_ids(cfg, build_tokenizer(cfg))  # nothing read: left to the per-sample check
    err = capsys.readouterr().err
    assert "are not read at the start (model.data.token_scan_limit_gb=0)" in err and err.count("\n") == 1
    monkeypatch.setattr(token_bound, "SCAN_LIMIT_BYTES", 0)  # the default is not what decides
    cfg = null_config(tmp_path, "model.tokenizer.vocab_size=290", "model.data.token_scan_limit_gb=0.001")
    with pytest.raises(DataError, match="pretokenized.bin holds token id 299"):
        check_token_ids(cfg, build_tokenizer(cfg))
    with pytest.raises(ConfigError, match="model.data.token_scan_limit_gb: -1"):
        null_config(tmp_path, "model.data.token_scan_limit_gb=-1")
