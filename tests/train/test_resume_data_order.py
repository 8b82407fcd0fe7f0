"""A resume with a larger trainer.max_steps may shuffle the train split anew (its shuffle spans the
epochs the run asks for, as Megatron's): the run keeps that order rule and says so, once."""

import numpy as np
import pytest
from train_e2e_helpers import log_lines, run_recording, tiny_config

from gptrain.data.gpt_dataset import build_gpt_indices
from gptrain.data.indexed import IndexedDataset
from gptrain.data.splits import split_ranges

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SEQ, BATCH, SEED = 16, 4, 1234


def train_order(prefix: str, steps: int) -> np.ndarray:
    """The train split's samples in order as (document index, sample index) pairs, from Megatron's
    index arrays built here for `steps` x BATCH samples: the reference the warning must agree with."""
    indexed = IndexedDataset(prefix)
    start, stop = split_ranges("90,10,0", len(indexed.sequence_lengths))[0]
    documents, samples, shuffle = build_gpt_indices(
        indexed.sequence_lengths, range(start, stop), steps * BATCH, SEQ, SEED
    )
    return np.stack([samples[shuffle][:, 0], documents[samples[shuffle][:, 0]]], axis=1)


@pytest.mark.parametrize("longer, reshuffled", [(6, False), (40, True)])
def test_a_resume_that_reshuffles_the_train_split_says_so(
    tmp_path, monkeypatch, word_corpus, indexed_corpus, longer, reshuffled
):
    """4 steps of 4 samples fit in one epoch of the ~100-sample split; 6 steps still do, 40 need two
    epochs, shuffled together anew."""
    prefix, _ = word_corpus
    before, after = train_order(prefix, 4), train_order(prefix, longer)
    assert (not np.array_equal(before[16:20], after[16:20])) == reshuffled  # the reference
    log_dir = tmp_path / "run"
    shape = [*indexed_corpus, f"model.seed={SEED}", "trainer.val_check_interval=1000"]
    assert run_recording(monkeypatch, tiny_config(log_dir, *shape, "trainer.max_steps=4"))[0] == 0
    code, losses = run_recording(monkeypatch, tiny_config(log_dir, *shape, f"trainer.max_steps={longer}"))
    assert code == 0 and min(losses) == 5
    warnings = [line for line in log_lines(log_dir) if "are not the ones the checkpoint's run" in line]
    if not reshuffled:
        assert warnings == []
        return
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: the train samples from 16 on are not the ones")
    assert f"trainer.max_steps 4 -> {longer}" in warnings[0]
    assert "give a run its final trainer.max_steps (or train_samples) from the start" in warnings[0]


def test_a_resume_that_reshuffles_the_validation_split_says_so(
    tmp_path, monkeypatch, word_corpus, indexed_corpus
):
    """Validation reads the first batches of its split every time, but the split is sized for every
    validation of the run (Megatron's formula): 6 steps validating 1 batch every 3 ask for 12 samples
    of the ~13-sample split, 12 steps for 20, two epochs shuffled anew. The train split (24 or 48 of
    ~100 samples) keeps its order."""
    from gptrain.data.builder import sample_counts

    prefix, _ = word_corpus
    indexed = IndexedDataset(prefix)
    start, stop = split_ranges("90,10,0", len(indexed.sequence_lengths))[1]

    def first_validation_samples(steps):
        valid = sample_counts(steps, BATCH, 3, 1)[1]
        documents, samples, shuffle = build_gpt_indices(
            indexed.sequence_lengths, range(start, stop), valid, SEQ, SEED
        )
        return samples[shuffle[:BATCH], 0], documents[samples[shuffle[:BATCH], 0]]

    assert not all(
        np.array_equal(a, b)
        for a, b in zip(first_validation_samples(6), first_validation_samples(12), strict=True)
    )
    assert np.array_equal(train_order(prefix, 6)[24:28], train_order(prefix, 12)[24:28])
    log_dir = tmp_path / "run"
    shape = [*indexed_corpus, f"model.seed={SEED}", "trainer.val_check_interval=3"]
    assert run_recording(monkeypatch, tiny_config(log_dir, *shape, "trainer.max_steps=6"))[0] == 0
    code, losses = run_recording(monkeypatch, tiny_config(log_dir, *shape, "trainer.max_steps=12"))
    assert code == 0 and min(losses) == 7
    warnings = [
        line
        for line in log_lines(log_dir)
        if "not the ones the checkpoint's run" in line or "other samples" in line
    ]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "warning: validation now evaluates other samples than the checkpoint's run did: "
    )
    assert "trainer.max_steps 6 -> 12" in warnings[0] and "are not comparable" in warnings[0]


def test_samples_that_cannot_be_read_leave_the_record_out_and_never_fail_a_save():
    """The digest reads samples the run may never train on (those after its last save): a read
    error there (a bad sector, a DataError of a damaged sample) must not fail the checkpoint."""
    from types import SimpleNamespace

    from gptrain.errors import DataError
    from gptrain.train.data_order import next_samples, order_record

    class Unreadable(list):
        def __init__(self, error):
            super().__init__(range(8))
            self.error = error

        def __getitem__(self, index):
            raise self.error

    trainer = SimpleNamespace(max_steps=2, train_samples=None, val_check_interval=1, limit_val_batches=1)
    for error in (
        OSError(5, "Input/output error"),
        DataError("sample 3 is damaged"),
        ValueError("bad dtype"),
    ):
        assert next_samples(Unreadable(error), 2) is None
        assert order_record(Unreadable(error), None, 2, trainer)["next"] is None


def test_rank_0_says_it_when_the_logging_rank_is_another():
    """Under pipeline parallelism the logging rank is the last stage's, which has no rank file of a
    checkpoint saved by a smaller world: rank 0's file always exists, and rank 0 says it too."""
    from types import SimpleNamespace

    from gptrain.train.data_order import order_record
    from gptrain.train.resuming import warn_if_the_order_changed

    trainer = SimpleNamespace(max_steps=4, train_samples=None, val_check_interval=1000, limit_val_batches=1)
    before = [np.full(SEQ + 1, i) for i in range(32)]
    saved = order_record(before, None, 8, trainer)
    lines: list[str] = []
    session = SimpleNamespace(
        train_split=before[::-1],  # another order
        valid_split=None,
        logging_rank=False,
        world=SimpleNamespace(rank=0),
        state=SimpleNamespace(consumed_samples=8),
        cfg=SimpleNamespace(trainer=SimpleNamespace(**{**vars(trainer), "max_steps": 8})),
        log=lines.append,
    )
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1 and "trainer.max_steps 4 -> 8" in lines[0]
    session.world.rank = 1  # neither rank 0 nor the logging rank: silent
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1
