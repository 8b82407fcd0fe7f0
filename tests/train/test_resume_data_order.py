"""A resume with a larger trainer.max_steps may shuffle the train split anew (its shuffle spans the
epochs the run asks for, as Megatron's): the run keeps that order rule and says so, once."""

import numpy as np
import pytest
from train_e2e_helpers import log_lines, run_recording, tiny_config

from gptrain.checkpoint.rank_state import read_rank_state
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
    record = read_rank_state(log_dir / "checkpoints" / "step_4", 0)["train_order"]
    assert record["train_built_for"] == 4 * BATCH  # the size the split was built for, kept to compare
    assert (record["global_batch_size"], record["rampup_batch_size"]) == (BATCH, None)  # and the batch
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
        train_built_for=None,
        valid_split=None,
        logging_rank=False,
        world=SimpleNamespace(rank=0),
        state=SimpleNamespace(consumed_samples=8),
        cfg=SimpleNamespace(
            trainer=SimpleNamespace(**{**vars(trainer), "max_steps": 8}),
            model=SimpleNamespace(global_batch_size=4, rampup_batch_size=None),
        ),
        log=lines.append,
    )
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1 and "trainer.max_steps 4 -> 8" in lines[0]
    session.world.rank = 1  # neither rank 0 nor the logging rank: silent
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1


def ramp_session(tmp_path, built_for, global_batch_size=128, train_samples=1000, ramp=(32, 32, 1000)):
    """A run of `gptrain megatron --train-samples 1000` under a ramp (20 steps reading 1,056 samples)
    resumed at iteration 10 (320 consumed), its split built for `built_for` samples of a real corpus
    (299 documents of 30 tokens: 560 samples of 16 an epoch)."""
    from types import SimpleNamespace

    from gptrain.data.gpt_dataset import GPTDataset
    from gptrain.data.indexed import IndexedDatasetWriter

    prefix = str(tmp_path / "d30")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for doc in range(299):
            writer.add_document(np.array([(doc * 31 + j) % 1000 for j in range(30)], dtype=np.int64))

    def split(samples):
        return GPTDataset(IndexedDataset(prefix), range(299), samples, 16, 1234, "train", use_cache=False)

    trainer = SimpleNamespace(
        max_steps=20, train_samples=train_samples, val_check_interval=1000, limit_val_batches=0
    )
    lines: list[str] = []
    session = SimpleNamespace(
        train_split=split(built_for),
        train_built_for=built_for,
        valid_split=None,
        logging_rank=True,
        world=SimpleNamespace(rank=0),
        state=SimpleNamespace(consumed_samples=320),
        cfg=SimpleNamespace(
            trainer=trainer,
            model=SimpleNamespace(
                rampup_batch_size=list(ramp) if ramp else None, global_batch_size=global_batch_size
            ),
        ),
        log=lines.append,
    )
    return session, split, lines


def test_a_resume_across_the_train_samples_sizing_change_names_it(tmp_path):
    """gptrain before 2026-11-30 built this split for the 1,056 samples the steps read; it is built
    for 1,000 now (Megatron's): a checkpoint saved before (its record without the size) resumes in a
    new order with no setting changed, and the warning says so, not that the data settings changed."""
    from gptrain.train.data_order import order_record
    from gptrain.train.resuming import warn_if_the_order_changed

    session, split, lines = ramp_session(tmp_path, 1000)
    before = split(1056)  # the reference: the old sizing's order differs at 320
    assert not all(np.array_equal(before[i], session.train_split[i]) for i in range(320, 324))
    saved = order_record(before, None, 320, session.cfg.trainer)
    saved.pop("train_built_for", None)  # the old gptrain's record had no size
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1, lines
    assert "data settings" not in lines[0] and "\n" not in lines[0]
    assert lines[0].startswith(
        "warning: the train samples from 320 on are not the ones the checkpoint's run would have read next:"
        " gptrain before 2026-11-30 built the train split for the 1,056 samples trainer.max_steps=20 read"
        " under the batch ramp, and builds it for trainer.train_samples=1,000 now, as Megatron does (no trainer"
    )
    assert "reads samples 320 to 1,055 of the split built for 1,000 (Megatron's order)" in lines[0]
    assert "to keep the checkpoint's order, resume with trainer.train_samples=1056 (" in lines[0]


def test_a_recorded_split_size_tells_a_batch_change_from_a_data_change(tmp_path):
    """A checkpoint that records the size its split was built for and the global batch: a size the same
    settings no longer give is the data's; a record without the batch names the batch and its ramp
    too, which could have changed unseen. Neither is called gptrain's own sizing (review X5)."""
    from gptrain.train.data_order import order_record
    from gptrain.train.resuming import warn_if_the_order_changed

    session, split, lines = ramp_session(tmp_path, 1000)
    model = session.cfg.model
    saved = order_record(split(1056), None, 320, session.cfg.trainer, built_for=1056, model=model)
    assert (saved["train_built_for"], saved["global_batch_size"], saved["rampup_batch_size"]) == (
        1056,
        128,
        [32, 32, 1000],
    )
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1 and "gptrain sized" not in lines[0] and "train_samples=" not in lines[0]
    assert (
        "the checkpoint's run built the train split for 1,056 samples and this one for 1,000 with the same"
        " trainer settings and global batch: the data settings changed (" in lines[0]
    )
    assert lines[0].endswith("; resume with the data settings the run had to keep its order")
    lines.clear()
    saved = order_record(split(1056), None, 320, session.cfg.trainer, built_for=1056)  # no batch kept
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1 and "gptrain sized" not in lines[0]
    assert (
        "with the same trainer settings: the data settings changed (data_prefix, splits_string, seq_length,"
        " mid_level_dataset_surplus or seed), or model.global_batch_size or rampup_batch_size did (the"
        " checkpoint does not record them)" in lines[0]
    )
    assert lines[0].endswith(
        "; resume with the global batch, ramp and data settings the run had to keep its order"
    )
    for recorded in (1000, None):  # the size it has (as if the data changed), or none recorded
        lines.clear()
        saved = order_record(split(1056), None, 320, session.cfg.trainer, built_for=recorded, model=model)
        warn_if_the_order_changed(session, {"train_order": saved})
        assert len(lines) == 1 and "the data settings changed" in lines[0] and "global_batch" not in lines[0]


def test_a_resume_with_a_larger_global_batch_names_it_not_gptrains_sizing(tmp_path):
    """Review X5's case: the checkpoint's run read 1,056 samples at a global batch of 128, which the
    split built for train_samples=1,000 holds (1,121); resumed at 160 the steps read 1,536, and the split
    is built for those, in another order. The line names the batch, and as the remedy the batch the
    checkpoint had (under which the split is the one built for 1,000 again), not train_samples=1000,
    the value already set."""
    from gptrain.train.data_order import next_samples, order_record
    from gptrain.train.resuming import warn_if_the_order_changed
    from gptrain.train.target_sizes import samples_max_steps_read

    session, split, lines = ramp_session(tmp_path, 1536, global_batch_size=160)
    checkpoints = split(1000)
    assert samples_max_steps_read(session.cfg) == 1536 > len(checkpoints) == 1121  # so it is rebuilt
    assert next_samples(checkpoints, 320) != next_samples(session.train_split, 320)  # another order
    old = ramp_session(tmp_path / "old", 1000)[0]  # the checkpoint's run, at 128: 1,056 read, fits
    assert samples_max_steps_read(old.cfg) == 1056 <= len(checkpoints)
    saved = order_record(checkpoints, None, 320, old.cfg.trainer, built_for=1000, model=old.cfg.model)
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1, lines
    assert "gptrain sized" not in lines[0] and "train_samples=1000" not in lines[0]
    assert lines[0].startswith(
        "warning: the train samples from 320 on are not the ones the checkpoint's run would have read next:"
        " model.global_batch_size 128 -> 160: the checkpoint's run built the train split for 1,000 samples"
        " and this one for 1,536, and "
    )
    assert lines[0].endswith("; to keep the checkpoint's order, resume with its model.global_batch_size=128")


def test_a_resume_with_a_smaller_global_batch_is_told_the_train_samples_that_keep_the_order(tmp_path):
    """Without trainer.train_samples the split is built for trainer.max_steps x the global batch: 20 x 64
    = 1,280 samples (3 epochs), resumed at 32 for 640 (2 epochs), in another order. The split built for
    trainer.train_samples=1280 is the checkpoint's again (its 20 steps at 32 read 640 of it), so that is
    offered. A ramp, which sizes nothing without trainer.train_samples, is not named."""
    from gptrain.config import TrainingConfig
    from gptrain.train.data_order import next_samples, order_record
    from gptrain.train.resuming import warn_if_the_order_changed
    from gptrain.train.target_sizes import dataset_target_sizes, train_samples_read

    session, split, lines = ramp_session(tmp_path, 640, global_batch_size=32, train_samples=None, ramp=None)
    old = ramp_session(tmp_path / "old", 1280, global_batch_size=64, train_samples=None, ramp=None)[0]
    saved = order_record(old.train_split, None, 320, old.cfg.trainer, built_for=1280, model=old.cfg.model)
    assert next_samples(split(1280), 320) == saved["next"] != next_samples(session.train_split, 320)
    remedied = TrainingConfig()  # the remedy, as the builder sizes it: for 1,280, of which 640 are read
    remedied.trainer.max_steps, remedied.trainer.train_samples = 20, 1280
    remedied.model.global_batch_size, remedied.model.micro_batch_size = 32, 32
    assert dataset_target_sizes(remedied)[0] == 1280 and train_samples_read(remedied) == 640
    warn_if_the_order_changed(session, {"train_order": saved})
    assert len(lines) == 1, lines
    assert (
        "have read next: model.global_batch_size 64 -> 32: the checkpoint's run built the train split for 1,280"
        " samples and this one for 640, and " in lines[0]
    )
    assert lines[0].endswith(
        "; it reads from sample 320 on of the split built for 640; to keep the checkpoint's order, resume"
        " with trainer.train_samples=1280 (which also sets the length of a weight-decay increment)"
    )
    lines.clear()
    ramped = {**saved, "rampup_batch_size": [16, 16, 300]}
    warn_if_the_order_changed(session, {"train_order": ramped})
    assert len(lines) == 1 and "rampup" not in lines[0]
