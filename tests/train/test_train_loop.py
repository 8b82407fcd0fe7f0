"""End-to-end training on a tiny GPT (CPU, fp32, dropout on): resume, stop, results layout."""

import math

import pytest
import torch
import yaml
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.checkpoint.manager import complete_steps
from gptrain.errors import EXIT_REQUEUE
from gptrain.train import builders, loop
from gptrain.train.step import StepOptions, masked_lm_loss

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def final_weights(log_dir, step):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = log_dir / f"weights_{step}.pt"
    dcp_to_torch_save(log_dir / "checkpoints" / f"step_{step}", target)
    return torch.load(target, weights_only=False)["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One full 6-step run shared by the tests below."""
    log_dir = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        code, losses = run_recording(mp, tiny_config(log_dir, *MOCK))
    return log_dir, code, losses


def test_full_run_exits_zero_with_final_checkpoint(uninterrupted):
    log_dir, code, losses = uninterrupted
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(v) for v in losses.values())
    assert complete_steps(log_dir / "checkpoints") == [4, 6]  # save_top_k=2
    assert (log_dir / "checkpoints" / "latest").read_text().strip() == "step_6"


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_resume_after_sigusr1_is_bit_exact(uninterrupted, tmp_path, monkeypatch, async_save):
    full_dir, _, full_losses = uninterrupted
    saving = f"exp_manager.checkpoint_callback_params.async_save={async_save}"
    code, first = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, saving), signal_at=3)
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert complete_steps(tmp_path / "checkpoints")[-1] == 3
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, saving))
    assert code == 0 and sorted(second) == [4, 5, 6]
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step  # bit for bit, not approx
    lines = log_lines(tmp_path)
    assert any(line.startswith("resuming from ") and "step_3 at iteration 3" in line for line in lines)
    assert run_recording(monkeypatch, tiny_config(tmp_path, *MOCK)) == (0, {})  # already done: no-op
    assert "already at trainer.max_steps=6: nothing to do" in log_lines(tmp_path)[-1]
    resumed, full = final_weights(tmp_path, 6), final_weights(full_dir, 6)
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_results_layout(uninterrupted):
    log_dir, _, _ = uninterrupted
    hparams = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert hparams["trainer"]["max_steps"] == 6 and hparams["exp_manager"]["explicit_log_dir"] == str(log_dir)
    assert (log_dir / "cmd-args.log").read_text().strip()
    git = (log_dir / "git-info.log").read_text()
    assert git.startswith("commit hash: ") or git.strip() == "not a git checkout"
    lines = log_lines(log_dir)
    assert lines[0].startswith("gptrain: ") and "parameters" in lines[0] and str(log_dir) in lines[0]
    assert "no complete checkpoint" in lines[1]
    # Megatron's start-of-run lines (issue 11): the padding, then one line per (TP, PP) rank
    assert " > padded vocab (size: 100) with 28 dummy tokens (new size: 128)" in lines
    assert any(
        line.startswith(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): ")
        for line in lines
    )
    iteration_lines = [line for line in lines if " iteration " in line and "consumed samples" in line]
    assert (
        len(iteration_lines) == 6
        and "iteration        6/       6 | consumed samples:           24 |" in iteration_lines[-1]
    )
    validation = [line for line in lines if line.startswith(" validation loss at iteration ")]
    assert [line.split(" | ")[0] for line in validation] == [
        " validation loss at iteration 3",
        " validation loss at iteration 6",  # at the end
        " validation loss at iteration 6 on test set",
    ]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "lm loss",
        "val loss",
        "learning rate",
        "grad norm",
        "loss scale",
        "train_step_timing in s",
    } <= tags
    assert {"consumed samples", "tokens per second", "TFLOP/s/GPU"} <= tags
    assert [e.step for e in events.Scalars("val loss")] == [3, 6]


def test_nan_iterations_are_skipped_counted_and_stop_the_run(tmp_path, monkeypatch):
    def nan_from_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        return loss * float("nan") if calls.append(1) or len(calls) > 2 * 2 else loss  # 2 microbatches/step

    calls: list[int] = []
    real = builders.build_step_options
    monkeypatch.setattr(
        builders,
        "build_step_options",
        lambda cfg, dp: StepOptions(**{**vars(real(cfg, dp)), "loss_fn": nan_from_step_3}),
    )
    cfg = tiny_config(tmp_path, *MOCK, "trainer.max_consecutive_nonfinite=3", "trainer.max_steps=20")
    with pytest.raises(
        loop.TrainingDivergedError, match=r"3 iterations in a row \(last at iteration 5\)"
    ) as info:
        run_recording(monkeypatch, cfg)
    assert f"last good checkpoint: {tmp_path / 'checkpoints' / 'step_2'};" in str(info.value)
    assert complete_steps(tmp_path / "checkpoints") == [2]  # no save during the streak
    lines = [line for line in log_lines(tmp_path) if "number of nan iterations" in line]
    counts = [line.split("number of nan iterations:")[1].split("|")[0].strip() for line in lines]
    assert counts == ["0", "0", "1", "1", "1"]
    assert "lm loss" not in lines[3] and "grad norm" not in lines[3]  # Megatron omits both when skipped


def write_indexed_corpus(directory):
    """A real Megatron .bin/.idx corpus (EOD-terminated documents) and a tiny HF tokenizer."""
    import numpy as np
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from gptrain.data.indexed import IndexedDatasetWriter

    vocab = {"<|endoftext|>": 0} | {f"w{i}": i + 1 for i in range(60)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    rng = np.random.default_rng(0)
    prefix = str(directory / "corpus_text_document")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(80):
            doc = rng.integers(1, 61, size=int(rng.integers(5, 40)))
            writer.add_document(np.append(doc, 0).astype(np.uint16))
    return [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix}",
        "model.data.splits_string=90,10,0",
        f"model.data.index_mapping_dir={directory / 'index'}",
        "model.data.eod_mask_loss=true",
        "model.tokenizer.library=huggingface",
        "model.tokenizer.type=HuggingFaceTokenizer",
        f"model.tokenizer.model={directory / 'tokenizer.json'}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]


def test_resume_on_indexed_dataset_is_bit_exact(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    data = write_indexed_corpus(tmp_path / "data")
    code, full = run_recording(monkeypatch, tiny_config(tmp_path / "full", *data))
    assert code == 0 and sorted(full) == [1, 2, 3, 4, 5, 6]
    first_cfg = tiny_config(tmp_path / "split", *data, "trainer.max_time=00:00:00:00")
    code, first = run_recording(monkeypatch, first_cfg)  # max_time 0: stops after iteration 1
    assert code == EXIT_REQUEUE and sorted(first) == [1]
    code, second = run_recording(monkeypatch, tiny_config(tmp_path / "split", *data))
    assert code == 0 and sorted(second) == [2, 3, 4, 5, 6]
    assert first | second == full  # every loss bit for bit
