"""A mock-data run records its vocabulary as its tokenizer (type mock): a resume between mock and real
data, or onto a smaller mock vocabulary, is refused as a change of tokenizer is (the escape:
exp_manager.allow_tokenizer_change=true), so a mock run cannot cut a trained vocabulary's rows."""

import json
import shutil

import pytest
from test_resume_tokenizer import SHORT, word_corpus
from train_e2e_helpers import log_lines, run_recording, tiny_config

from gptrain.checkpoint.errors import TokenizerMismatchError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

ALLOW = "exp_manager.allow_tokenizer_change=true"


def mock(size: int) -> list[str]:
    """Mock data of `size` tokens, padded to a multiple of 8 (rows the real run's 128 do not fit)."""
    return [
        "model.data.data_impl=mock",
        f"model.data.mock_vocab_size={size}",
        "model.data.data_prefix=null",
        "model.make_vocab_size_divisible_by=8",
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run on a word corpus (61 tokens, padded to 128) and a mock run (40 tokens, padded to 40),
    each with a checkpoint at step 2."""
    root = tmp_path_factory.mktemp("mock_tokenizer")
    real = word_corpus(root)
    with pytest.MonkeyPatch.context() as mp:
        assert run_recording(mp, tiny_config(root / "real", *SHORT, *real))[0] == 0
        assert run_recording(mp, tiny_config(root / "mock", *SHORT, *mock(40)))[0] == 0
    return root, real


def copied(runs, tmp_path, name: str):
    root, real = runs
    shutil.copytree(root / name, tmp_path / name)
    return tmp_path / name, real


def complete(log_dir, step: int) -> dict:
    return json.loads((log_dir / "checkpoints" / f"step_{step}" / "COMPLETE").read_text())


def test_a_mock_run_records_its_vocabulary_as_its_tokenizer(runs, tmp_path):
    log_dir, _ = copied(runs, tmp_path, "mock")
    assert complete(log_dir, 2)["tokenizer"] == {"type": "mock", "vocab_size": 40}


def test_a_mock_run_resuming_a_real_runs_checkpoint_is_refused(runs, tmp_path, monkeypatch):
    """The review's case: the mock run would cut the trained 128 rows to 40 and save them so."""
    log_dir, _ = copied(runs, tmp_path, "real")
    with pytest.raises(TokenizerMismatchError) as refused:
        run_recording(monkeypatch, tiny_config(log_dir, *SHORT, *mock(40), "trainer.max_steps=3"))
    message = str(refused.value)
    assert "\n" not in message
    assert (
        f"checkpoint {log_dir / 'checkpoints' / 'step_2'} was trained with tokenizer HuggingFaceTokenizer"
        in message
    )
    assert "this run's model.tokenizer is mock data (model.data.mock_vocab_size 40)" in message
    assert "start this run in its own directory (another run.name or exp_manager.explicit_log_dir)" in message
    assert ALLOW in message
    assert (log_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert not (log_dir / "checkpoints" / "step_3").exists()


def test_a_real_run_resuming_a_mock_runs_checkpoint_is_refused(runs, tmp_path, monkeypatch):
    log_dir, real = copied(runs, tmp_path, "mock")
    config = tiny_config(
        log_dir, *SHORT, *real, "model.make_vocab_size_divisible_by=8", "trainer.max_steps=3"
    )
    with pytest.raises(TokenizerMismatchError) as refused:
        run_recording(monkeypatch, config)
    message = str(refused.value)
    assert "was trained with tokenizer mock data (model.data.mock_vocab_size 40)" in message
    assert "this run's model.tokenizer is HuggingFaceTokenizer" in message and ALLOW in message


def test_a_smaller_mock_vocabulary_is_refused_and_a_larger_one_said(runs, tmp_path, monkeypatch):
    log_dir, _ = copied(runs, tmp_path, "mock")
    with pytest.raises(
        TokenizerMismatchError,
        match=r"mock_vocab_size 40\), this run's model.tokenizer is mock data \(model.data.mock_vocab_size 16\)",
    ):
        run_recording(monkeypatch, tiny_config(log_dir, *SHORT, *mock(16), "trainer.max_steps=3"))
    code, losses = run_recording(monkeypatch, tiny_config(log_dir, *SHORT, *mock(40), "trainer.max_steps=3"))
    assert code == 0 and sorted(losses) == [3]
    code, losses = run_recording(monkeypatch, tiny_config(log_dir, *SHORT, *mock(48), "trainer.max_steps=4"))
    assert code == 0 and sorted(losses) == [4]
    notes = [line for line in log_lines(log_dir) if "extends the tokenizer" in line]
    assert len(notes) == 1 and "ids 40-47 added" in notes[0], notes
    assert complete(log_dir, 4)["tokenizer"] == {"type": "mock", "vocab_size": 48}


def test_allow_tokenizer_change_lets_a_mock_run_cut_the_rows_with_a_warning(runs, tmp_path, monkeypatch):
    log_dir, _ = copied(runs, tmp_path, "real")
    config = tiny_config(log_dir, *SHORT, *mock(40), "trainer.max_steps=3", ALLOW)
    code, losses = run_recording(monkeypatch, config)
    assert code == 0 and sorted(losses) == [3]
    lines = log_lines(log_dir)
    assert sum("loaded anyway (exp_manager.allow_tokenizer_change=true)" in line for line in lines) == 1
    dropped = [line for line in lines if "tok_embeddings.weight: the checkpoint has 128 rows" in line]
    assert (
        len(dropped) == 1
        and "rows 40-127 (of them 40-60: tokens the checkpoint was trained on)" in dropped[0]
    )


def saved_vocabulary(root, trained: int, rows: int = 64):
    """A checkpoint of one embedding of `rows` rows whose tokenizer record says `trained` tokens."""
    import torch

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.data.tokenizer_identity import TokenizerCheck

    manager = CheckpointManager(root, keep_last=None, tokenizer=TokenizerCheck.mock(trained))
    return manager.save(1, {"model": {"tok_embeddings.weight": torch.arange(rows * 2.0).view(rows, 2)}}, {})


def load_into(path, rows: int, tokenizer=None):
    import torch

    from gptrain.checkpoint.manager import CheckpointManager

    reader = CheckpointManager(path.parent, keep_last=None, tokenizer=tokenizer)
    state = {"model": {"tok_embeddings.weight": torch.zeros(rows, 2)}}
    reader.load_verified(path, lambda saved: state, lambda loaded: None)
    return reader, state["model"]["tok_embeddings.weight"]


def test_a_load_that_would_drop_rows_of_recorded_tokens_is_refused(tmp_path):
    """Without a tokenizer check (eval's reader) the rows below the recorded vocabulary are still kept."""
    path = saved_vocabulary(tmp_path, trained=50)
    with pytest.raises(TokenizerMismatchError) as refused:
        load_into(path, 40)
    message = str(refused.value)
    assert "was trained on 50 tokens" in message and "the trained rows 40-49 would be cut off" in message
    assert ALLOW in message and "\n" not in message


def test_rows_past_the_recorded_tokens_are_padding_and_allow_cuts_trained_ones_with_a_note(tmp_path):
    from gptrain.data.tokenizer_identity import TokenizerCheck

    path = saved_vocabulary(tmp_path / "a", trained=32)
    reader, rows = load_into(path, 40)
    assert rows[39].tolist() == [78.0, 79.0]
    assert any(
        "rows 40-63 (padding past the 32 tokens the checkpoint was trained on)" in n for n in reader.notes
    )
    path = saved_vocabulary(tmp_path / "b", trained=50)
    reader, rows = load_into(path, 40, TokenizerCheck.mock(40, allow_change=True))
    assert any("rows 40-63 (of them 40-49: tokens the checkpoint was trained on)" in n for n in reader.notes)
