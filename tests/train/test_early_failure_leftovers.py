"""A run that fails before it saves or logs anything leaves no empty checkpoints/ directory and no
TensorBoard file without events behind; a directory the user made, or one with files, stays."""

import pytest
from train_e2e_helpers import MOCK, run_recording, tiny_config

from gptrain.errors import ConfigError
from gptrain.train import loop, step_loop

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

LOG = "nemo_log_globalrank-0_localrank-0.txt"


def missing_tokenizer(tmp_path):
    for suffix in (".bin", ".idx"):  # the data is there (train looks for it first); the tokenizer is not
        (tmp_path / f"corpus_text_document{suffix}").write_bytes(b"")
    return [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={tmp_path}/corpus_text_document",
        f"model.tokenizer.vocab_file={tmp_path}/vocab.json",
        f"model.tokenizer.merge_file={tmp_path}/merges.txt",
    ]


def test_a_config_error_found_after_the_results_directory_is_made_leaves_no_empty_folders(tmp_path):
    log_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="model.tokenizer.vocab_file: .* not found"):
        loop.train(tiny_config(log_dir, *missing_tokenizer(tmp_path)))
    assert sorted(p.name for p in log_dir.iterdir()) == [LOG]
    lines = (log_dir / LOG).read_text().splitlines()  # the log says why the run ended, as the console does
    assert len(lines) == 1 and lines[0].startswith("gptrain: error: model.tokenizer.vocab_file: ")


def test_a_crash_in_the_first_step_leaves_no_empty_folders(tmp_path, monkeypatch):
    log_dir = tmp_path / "run"

    def crash(*args):
        raise RuntimeError("a crash in the first step")

    monkeypatch.setattr(step_loop, "record", crash)
    with pytest.raises(RuntimeError, match="a crash in the first step"):
        loop.train(tiny_config(log_dir, *MOCK))
    left = sorted(p.name for p in log_dir.iterdir())
    assert left == ["cmd-args.log", "git-info.log", "hparams.yaml", LOG]  # what the run did write


def test_folders_the_run_did_not_make_or_that_hold_files_stay(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)  # the user's own, empty
    with pytest.raises(ConfigError):
        loop.train(tiny_config(mine, *missing_tokenizer(tmp_path)))
    assert (mine / "checkpoints").is_dir()

    saved = tmp_path / "saved"  # a checkpoint at step 2, then a crash at step 3

    def crash_at_3(session, result, *args):
        if session.state.step == 2:
            raise RuntimeError("a crash at step 3")
        real_record(session, result, *args)

    real_record = step_loop.record
    monkeypatch.setattr(step_loop, "record", crash_at_3)
    with pytest.raises(RuntimeError, match="a crash at step 3"):
        loop.train(tiny_config(saved, *MOCK, "trainer.val_check_interval=1000"))
    monkeypatch.setattr(step_loop, "record", real_record)
    assert sorted(p.name for p in (saved / "checkpoints").iterdir()) == ["latest", "step_2"]
    assert any(p.name.startswith("events.out.tfevents.") for p in saved.iterdir())
    assert run_recording(monkeypatch, tiny_config(saved, *MOCK, "trainer.val_check_interval=1000"))[0] == 0


def test_the_step_times_folder_of_a_multi_rank_run_is_made_at_its_first_line(tmp_path):
    """Each rank of a multi-rank run opens its step-times file as the loop starts; the folder made
    then stayed empty after a run that failed in its first step."""
    from gptrain.train.step_times import StepTimes

    times = StepTimes.open(tmp_path, rank=1, world_size=2)
    assert list(tmp_path.iterdir()) == []
    assert times.timed_sync(1, False, lambda: None) is None  # an iteration without a log line: nothing
    assert list(tmp_path.iterdir()) == []
    times.timed_sync(2, True, lambda: None)  # the process's first logged step: start-up, no line
    assert list(tmp_path.iterdir()) == []
    times.timed_sync(3, True, lambda: None)
    assert [p.name for p in (tmp_path / "step_times").iterdir()] == ["rank-1.jsonl"]
