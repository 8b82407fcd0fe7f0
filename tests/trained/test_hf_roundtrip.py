"""`gptrain export --to hf` and `gptrain import` round trips on tiny random models of each architecture."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import (  # noqa: E402
    CLASSES,
    batch,
    gpt2_files,
    hf_logits,
    max_relative_difference,
    rms_norm_in_float64,
    run_cli,
    tiny_run,
)

from gptrain.errors import DataError  # noqa: E402

GPT2_VOCAB = 50257
# float32: unit roundoff 6e-8, dot products of at most 64 terms, two layers: 1e-5 is a wide bound
# for the same arithmetic in another order, and far below what a wrong layout produces.
FP32_REL = 1e-5


@pytest.fixture(scope="module", params=sorted(CLASSES))
def exported(request, tmp_path_factory) -> tuple[str, Path, torch.nn.Module, Path]:
    arch = request.param
    tmp = tmp_path_factory.mktemp(arch)
    run, model = tiny_run(arch, tmp)
    assert run_cli(["export", str(run), "--to", "hf", str(tmp / "hf")]) == 0
    return arch, run, model, tmp / "hf"


def test_export_writes_a_transformers_directory(exported, capsys) -> None:
    arch, _, _, out = exported
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt"} <= names
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [CLASSES[arch]]
    assert config["vocab_size"] == GPT2_VOCAB  # padding rows (50304 in the checkpoint) removed
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 50256
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.encode("Hello world<|endoftext|>") == [15496, 995, 50256]


def test_the_export_is_readable_as_the_umask_allows(exported) -> None:
    """Not 0700/0600 (mkdtemp, safetensors): a model directory on a shared filesystem is for the group."""
    from gptrain.utils.atomic import current_umask

    out, mask = exported[3], current_umask()
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~mask


def test_transformers_logits_match_gptrain(exported) -> None:
    _, _, model, out = exported
    ids = batch(GPT2_VOCAB)
    with torch.no_grad():
        ours = model(ids)[..., :GPT2_VOCAB]
    theirs = hf_logits(out, ids)
    assert theirs.shape == ours.shape
    assert max_relative_difference(ours, theirs) < FP32_REL
    assert float(ours.abs().max()) > 1.0  # logits of a real spread, not a near-zero model


def test_import_gives_a_run_that_generate_loads_and_export_reproduces(exported, tmp_path, capsys) -> None:
    from safetensors.torch import load_file

    from gptrain.trained.load import load_run
    from gptrain.utils.atomic import current_umask

    arch, _, model, out = exported
    run_dir = tmp_path / "imported"
    assert run_cli(["import", str(out), "--output", str(run_dir)]) == 0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_0"
    assert (run_dir / "checkpoints" / "step_0" / "COMPLETE").is_file()
    # the import records the tokenizer it copied in, as training does: GPT-2's, in any of its forms
    from gptrain.data.gpt2_bpe import load_gpt2_bpe
    from gptrain.data.tokenizer_identity import record

    recorded = json.loads((run_dir / "checkpoints" / "step_0" / "COMPLETE").read_text())["tokenizer"]
    assert recorded["tokens"] == record(load_gpt2_bpe(*gpt2_files()), "", "")["tokens"]
    assert recorded["source"].startswith(str(run_dir / "tokenizer"))
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o777 & ~current_umask()  # not mkdtemp's 0700
    loaded = load_run(run_dir, torch.device("cpu"))
    ids = batch(GPT2_VOCAB, seed=2)
    with torch.no_grad():
        again, original = loaded.model(ids)[..., :GPT2_VOCAB], model(ids)[..., :GPT2_VOCAB]
    assert torch.equal(again, original) or max_relative_difference(original, again) < FP32_REL
    capsys.readouterr()
    assert run_cli(["generate", str(run_dir), "--prompt", "Hello", "--greedy", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("Hello")

    # `gptrain eval` takes the imported run as it is, on any indexed dataset
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter

    writer = IndexedDatasetWriter(str(tmp_path / "held_out"), np.uint16)
    writer.add_document(np.random.default_rng(0).integers(0, GPT2_VOCAB, size=4 * 16 + 1).astype(np.uint16))
    writer.finalize()
    result = tmp_path / "eval.json"
    argv = ["eval", str(run_dir), "model.micro_batch_size=1", "model.global_batch_size=1"]
    argv += ["--data-prefix", str(tmp_path / "held_out"), "--json", str(result)]
    assert run_cli(argv) == 0
    evaluated = json.loads(result.read_text())
    assert evaluated["tokens"] == 4 * 16 and evaluated["iteration"] == 0
    assert 0 < evaluated["loss"] < 100

    assert run_cli(["export", str(run_dir), "--to", "hf", str(tmp_path / "again")]) == 0
    first, second = load_file(out / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first), arch


def test_sharded_export_has_an_index_transformers_loads(tmp_path) -> None:
    from gptrain.trained.hf.export import export_hf

    run, model = tiny_run("stablelm", tmp_path)
    report = export_hf(run, tmp_path / "hf", max_shard_bytes=2_000_000)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == report.tensor_bytes
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    assert report.verification is not None and report.verification.relative < FP32_REL


def test_streaming_the_weights_unpickles_the_checkpoint_metadata_once(
    exported, tmp_path, monkeypatch
) -> None:
    """DCP's .metadata of a large FSDP checkpoint takes ~50 s to unpickle (gptrain.checkpoint.compat):
    each layer's read unpickled it again, once per layer plus once for the embeddings."""
    from gptrain.trained.hf.export import open_run, write_weights

    arch, run, _, _ = exported
    source = open_run(run)
    reads = count_metadata_reads(monkeypatch)
    (tmp_path / "out").mkdir()
    write_weights(tmp_path / "out", source, arch, 10**9, io.StringIO())
    assert len(reads) == 1


def count_metadata_reads(monkeypatch) -> list:
    """The checkpoint paths whose DCP .metadata is read from now on (one entry a read)."""
    import torch.distributed.checkpoint as dcp

    reads = []
    original = dcp.FileSystemReader.read_metadata

    def counted(self, *args, **kwargs):
        reads.append(self.path)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(dcp.FileSystemReader, "read_metadata", counted)
    return reads


def test_opening_a_run_unpickles_the_checkpoint_metadata_once(exported, monkeypatch) -> None:
    """generate, eval and export open a run by the saved shapes of the embedding and the position
    table: each was a reading of .metadata of its own (~50 s apiece for a large FSDP checkpoint)."""
    from gptrain.trained.load import open_run

    reads = count_metadata_reads(monkeypatch)
    run = open_run(exported[1])
    assert len(reads) == 1 and run.saved_rows == 50304


def test_wrong_semantics_fail_verification(exported, tmp_path) -> None:
    """The check is sensitive: one changed fact in config.json (GELU flavour, rope base, norm eps)."""
    from gptrain.trained.hf.export import HELD_CONFIG, open_run, verify_export
    from gptrain.trained.hf.verify import VerificationError

    arch, run, _, out = exported
    broken = tmp_path / "broken"  # as export's staging directory: config.json not yet under its name
    broken.mkdir()
    for path in out.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").unlink()
    if arch == "gpt2":
        config["activation_function"] = "gelu_new"  # GPT-2's tanh approximation instead of erf
    else:
        config["rope_parameters"]["rope_theta"] *= 2
    (broken / HELD_CONFIG).write_text(json.dumps(config))
    with pytest.raises(VerificationError, match=r"logits differ by up to [0-9.e+-]+"):
        verify_export(open_run(run), broken)


def test_rope_settings_are_also_where_older_readers_look(exported) -> None:
    """transformers 4 and serving stacks read config.json's top-level rope_theta (and StableLM's
    partial_rotary_factor); with only transformers 5's rope_parameters they fell back to their
    defaults (10000, 0.25) and ran another model without a word."""
    from transformers import AutoConfig

    arch, _, _, out = exported
    config = json.loads((out / "config.json").read_text())
    if arch == "gpt2":
        assert "rope_theta" not in config and "rope_parameters" not in config
        return
    rope = config.pop("rope_parameters")
    assert config["rope_theta"] == rope["rope_theta"]
    assert config.get("partial_rotary_factor") == rope.get("partial_rotary_factor")
    legacy_only = AutoConfig.for_model(**config)  # what a reader of the top-level keys builds
    assert legacy_only.rope_parameters == rope


def test_export_refuses_an_existing_output_and_leaves_no_partial_files(exported, tmp_path) -> None:
    from gptrain.trained.hf.export import export_hf

    _, run, _, _ = exported
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep")
    with pytest.raises(DataError, match="already exists"):
        export_hf(run, tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["x"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_export_names_the_checkpoint_it_exported(tmp_path, capsys) -> None:
    """A run's newest save killed before its COMPLETE marker: export takes the newest complete one,
    as it should, but its one line named no step, so nothing told the user that the model in
    OUTPUT_DIR was step_1's and not the step_3 they saw in the directory (generate names it)."""
    import shutil

    from hf_helpers import saved_run

    run, _ = saved_run(tmp_path / "run", "gpt2", "model.num_layers=1")
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step_1", checkpoints / "step_3")
    (checkpoints / "step_3" / "COMPLETE").unlink()
    assert run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"]) == 0
    line = capsys.readouterr().out
    assert f"from {checkpoints / 'step_1'} " in line, line
    assert "step_3" not in line


def test_an_export_killed_outright_leaves_nothing_transformers_loads(exported, tmp_path, monkeypatch) -> None:
    """SIGKILL (the OOM killer while verification holds two models, a lost node) runs no cleanup:
    the staging directory stays as the kill found it. It held config.json beside a complete
    model.safetensors, which transformers loaded, unverified; config.json now comes last."""
    import shutil

    from transformers import AutoModelForCausalLM

    from gptrain.trained.hf import export

    _, run, _, _ = exported
    left = tmp_path / "left_by_a_kill"
    verify = export.verify_export

    def killed_while_verifying(source, directory, *args):
        shutil.copytree(directory, left)
        return verify(source, directory, *args)

    monkeypatch.setattr(export, "verify_export", killed_while_verifying)
    export.export_hf(run, tmp_path / "out")
    assert (left / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="config.json"):
        AutoModelForCausalLM.from_pretrained(str(left), local_files_only=True)
    assert export.HELD_CONFIG not in {p.name for p in (tmp_path / "out").iterdir()}
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), local_files_only=True) is not None


def test_an_import_killed_outright_leaves_no_run_gptrain_opens(tmp_path, monkeypatch) -> None:
    """The same for import: its staging directory held hparams.yaml beside a COMPLETE step_0, a run
    that generate, eval, export and training opened, unverified; hparams.yaml now comes last."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    from gptrain.errors import GptrainError
    from gptrain.trained.hf import import_
    from gptrain.trained.load import open_run

    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(str(tmp_path / "hf"))
    left = tmp_path / "left_by_a_kill"
    verify = import_.verify_import

    def killed_while_verifying(cfg, staging, *args):
        shutil.copytree(staging, left)
        return verify(cfg, staging, *args)

    monkeypatch.setattr(import_, "verify_import", killed_while_verifying)
    import_.import_hf(tmp_path / "hf", tmp_path / "imported")
    assert (left / "checkpoints" / "step_0" / "COMPLETE").exists()
    with pytest.raises(GptrainError, match="no hparams.yaml"):
        open_run(left)
    assert open_run(tmp_path / "imported").step_dir.name == "step_0"


@pytest.mark.parametrize(
    ("saved", "edited", "named"),
    [
        (
            "hidden_size: 32",
            "hidden_size: 64",
            "model.tok_embeddings.weight: the checkpoint has shape [50304, 32]",
        ),
        ("num_layers: 2", "num_layers: 1", "model.layers.1."),
    ],
    ids=["wider", "fewer-layers"],
)
def test_an_unverified_export_of_a_checkpoint_its_hparams_do_not_describe_is_refused(
    tmp_path, saved: str, edited: str, named: str
) -> None:
    """--no-verify skips the logit check, not the shapes: an hparams.yaml of another width wrote a
    config.json transformers refuses to load beside the checkpoint's weights, and one of fewer layers
    exported the model without its last layer, both with exit 0."""
    from hf_helpers import saved_run

    from gptrain.checkpoint.compat import CheckpointMismatchError

    run, _ = saved_run(tmp_path / "run", "llama")
    hparams = run / "hparams.yaml"
    assert saved in hparams.read_text()
    hparams.write_text(hparams.read_text().replace(saved, edited))
    with pytest.raises(CheckpointMismatchError, match="does not fit the config") as error:
        run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), "--no-verify"])
    assert named in str(error.value) and "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_checkpoint_trained_with_other_settings_than_its_hparams_give_is_refused(tmp_path) -> None:
    """hparams.yaml with another rope base than the checkpoint recorded (hand-edited, or a default
    changed since): every shape fits, and verification compares two models built from the same
    settings, so the export passed, verified, computing another function than the trained model
    (generate too). An override that changes it on purpose (eval) loads."""
    from hf_helpers import saved_run

    from gptrain.checkpoint import architecture
    from gptrain.checkpoint.compat import CheckpointMismatchError
    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.trained.load import open_run

    run, model = saved_run(tmp_path / "run", "llama")
    recorded = architecture.record(model.config)
    CheckpointManager(run / "checkpoints", keep_last=None, architecture=recorded).save(
        2, {"model": model_state_dict(model)}, {}
    )
    hparams = run / "hparams.yaml"
    assert "rotary_base: 500000" in hparams.read_text()
    hparams.write_text(hparams.read_text().replace("rotary_base: 500000", "rotary_base: 10000"))
    for argv in (
        ["export", str(run), "--to", "hf", str(tmp_path / "out")],
        ["generate", str(run), "--prompt", "a"],
    ):
        with pytest.raises(
            CheckpointMismatchError, match=r"\(model\.rotary_base 500000(\.0)? -> 10000(\.0)?\)"
        ):
            run_cli(argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert open_run(run, ["model.rotary_base=10000"]).step_dir.name == "step_2"


def test_an_override_changes_the_settings_it_moves_and_only_hparams_differences_are_refused(tmp_path) -> None:
    """`gptrain eval RUN model.num_attention_heads=8` was refused: the heads' width and the query
    groups (null: one per head) moved with it, and only the typed key counted as asked. Those load
    now; a difference of hparams.yaml from the checkpoint stays refused, and alone in the line."""
    from hf_helpers import saved_run

    from gptrain.checkpoint import architecture
    from gptrain.checkpoint.compat import CheckpointMismatchError
    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.trained.load import open_run

    run, model = saved_run(tmp_path / "run", "gpt2")
    CheckpointManager(
        run / "checkpoints", keep_last=None, architecture=architecture.record(model.config)
    ).save(2, {"model": model_state_dict(model)}, {})
    assert open_run(run, ["model.num_attention_heads=8"]).cfg.model.num_attention_heads == 8
    hparams = run / "hparams.yaml"
    assert "layernorm_epsilon: 0.001" in hparams.read_text()
    hparams.write_text(hparams.read_text().replace("layernorm_epsilon: 0.001", "layernorm_epsilon: 0.002"))
    with pytest.raises(CheckpointMismatchError) as refused:
        open_run(run, ["model.num_attention_heads=8"])
    assert "(model.layernorm_epsilon 0.001 -> 0.002): " in str(refused.value)
    assert str(refused.value).endswith("set the old values there")


def test_the_check_reads_hparams_under_the_overrides_that_make_it_load(tmp_path) -> None:
    """`gptrain eval RUN ~model.retired_option` (a key this gptrain no longer knows) loaded the run's
    config, then the architecture check read hparams.yaml again without the overrides and stopped
    with 'unknown key'. It now reads it under every override but the architecture ones: those still
    count as asked with what they move, and hparams.yaml's own differences are still refused. Where
    hparams.yaml's architecture itself does not load (6 heads do not divide 32), the override that
    mends it is what the command builds, and the checkpoint's."""
    from hf_helpers import saved_run

    from gptrain.checkpoint import architecture
    from gptrain.checkpoint.compat import CheckpointMismatchError
    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict
    from gptrain.trained.load import open_run

    run, model = saved_run(tmp_path / "run", "gpt2")
    CheckpointManager(
        run / "checkpoints", keep_last=None, architecture=architecture.record(model.config)
    ).save(2, {"model": model_state_dict(model)}, {})
    hparams = run / "hparams.yaml"
    text = hparams.read_text()
    hparams.write_text(text.replace("model:\n", "model:\n  retired_option: 1\n", 1))
    assert open_run(run, ["~model.retired_option"]).cfg.model.num_attention_heads == 4
    assert (
        open_run(run, ["~model.retired_option", "model.num_attention_heads=8"]).cfg.model.num_attention_heads
        == 8
    )
    edited = text.replace("model:\n", "model:\n  retired_option: 1\n", 1).replace(
        "layernorm_epsilon: 0.001", "layernorm_epsilon: 0.002"
    )
    hparams.write_text(edited)
    with pytest.raises(CheckpointMismatchError, match=r"\(model\.layernorm_epsilon 0\.001 -> 0\.002\): "):
        open_run(run, ["~model.retired_option"])

    assert "num_attention_heads: 4\n" in text
    hparams.write_text(text.replace("num_attention_heads: 4\n", "num_attention_heads: 6\n"))
    assert open_run(run, ["model.num_attention_heads=4"]).cfg.model.num_attention_heads == 4


def test_an_export_of_a_checkpoint_changed_on_disk_is_refused(exported, tmp_path) -> None:
    """The logit check compares two readings of the same weights: a byte changed since the save
    would pass it. The CRC-32s recorded at the save are read first."""
    import shutil

    from gptrain.checkpoint.directory import CheckpointLoadError
    from gptrain.trained.hf.export import export_hf

    _, run, _, _ = exported
    shutil.copytree(run, tmp_path / "run")
    for shard in (tmp_path / "run").rglob("*.distcp"):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointLoadError, match="has CRC-32 .*changed on disk"):
        export_hf(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(exported, tmp_path, monkeypatch) -> None:
    import safetensors.torch
    from safetensors import SafetensorError

    from gptrain.trained.hf.export import export_hf

    def full(*args, **kwargs):
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    _, run, _, _ = exported
    with pytest.raises(DataError, match=r"failed \(Error while serializing: .*No space left") as error:
        export_hf(run, tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_gpt2_with_the_tanh_gelu_imports_as_openai_gelu_and_exports_back(tmp_path) -> None:
    """OpenAI's GPT-2 checkpoints use `gelu_new`: import maps it to model.openai_gelu, export back."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        n_positions=16,
        vocab_size=96,
        activation_function="gelu_new",
        bos_token_id=95,
        eos_token_id=95,
    )
    original = tmp_path / "gpt2_tanh"
    GPT2LMHeadModel(config).save_pretrained(original)
    run_dir = tmp_path / "imported"
    assert run_cli(["import", str(original), "--output", str(run_dir)]) == 0  # verifies the logits itself
    assert "openai_gelu: true" in (run_dir / "hparams.yaml").read_text()

    assert run_cli(["export", str(run_dir), "--to", "hf", str(tmp_path / "again")]) == 0
    # the same tanh GELU under the name of the kernel gptrain runs (see the test below)
    assert json.loads((tmp_path / "again" / "config.json").read_text())["activation_function"] == (
        "gelu_pytorch_tanh"
    )
    ids = batch(96)
    assert max_relative_difference(hf_logits(original, ids), hf_logits(tmp_path / "again", ids)) < FP32_REL


@pytest.mark.parametrize("openai_gelu", [False, True], ids=["erf", "tanh"])
def test_the_exported_gpt2_activation_is_gptrains_gelu_bit_for_bit_in_every_dtype(openai_gelu) -> None:
    """transformers' `gelu_new` is the tanh formula as separate ops, each rounding in the model's
    dtype: in bfloat16 it differs from gptrain's F.gelu(approximate="tanh") (one rounding) on most
    inputs, with ~1.5x its mean error, so a bf16 export computed something slightly else than
    the model trained. `gelu_pytorch_tanh` is that very kernel, equal in every dtype."""
    from transformers.activations import ACT2FN

    from gptrain.models.config import GPTConfig
    from gptrain.models.gpt import MLP
    from gptrain.trained.hf.architectures import GPT2, hf_config_kwargs

    shape = {"vocab_size": 96, "seq_length": 16, "num_layers": 1, "hidden_size": 32, "num_attention_heads": 4}
    config = GPTConfig(**shape, openai_gelu=openai_gelu)
    theirs = ACT2FN[hf_config_kwargs(config, GPT2, 96, {})["activation_function"]]
    approximation = MLP(config).gelu_approximation
    x = 4 * torch.randn(1 << 16, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ours = torch.nn.functional.gelu(x.to(dtype), approximate=approximation)
        assert torch.equal(theirs(x.to(dtype)), ours), dtype


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrower_dtype_export_rounds_each_weight_and_is_verified(exported, tmp_path, dtype, capsys) -> None:
    """--dtype writes every tensor of the float32 export rounded to nearest, half the bytes; the
    check compares transformers with gptrain's weights rounded alike, and reports the rounding."""
    from safetensors.torch import load_file

    arch, run, _, full = exported
    capsys.readouterr()
    assert run_cli(["export", str(run), "--to", "hf", "--dtype", dtype, str(tmp_path / "narrow")]) == 0
    line = capsys.readouterr().out
    assert f"rounding the weights to {dtype} moves the logits by up to " in line
    assert float(line.split("moves the logits by up to ")[1].split()[0]) > 0  # it did round something
    wide, narrow = load_file(full / "model.safetensors"), load_file(tmp_path / "narrow" / "model.safetensors")
    assert wide.keys() == narrow.keys()
    for name, tensor in wide.items():
        assert narrow[name].dtype == getattr(torch, dtype), name
        assert torch.equal(narrow[name], tensor.to(getattr(torch, dtype))), name
    config = json.loads((tmp_path / "narrow" / "config.json").read_text())
    assert config["dtype"] == dtype
    # transformers 4 and serving stacks read torch_dtype (without it: float32, "pick a 16-bit type")
    assert config["torch_dtype"] == dtype
    from transformers import AutoConfig, AutoModelForCausalLM

    assert AutoConfig.for_model(**{k: v for k, v in config.items() if k != "dtype"}).dtype == getattr(
        torch, dtype
    )
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "narrow"), dtype="auto").dtype == getattr(
        torch, dtype
    )
    wide_bytes = (full / "model.safetensors").stat().st_size
    assert (tmp_path / "narrow" / "model.safetensors").stat().st_size < 0.55 * wide_bytes


def test_float16_export_refuses_weights_it_would_write_as_inf(tmp_path) -> None:
    """float16 rounds |x| < 65520 to at most 65504 and anything larger to inf: values in between were
    refused though they round to a finite weight, and the refusal did not say how large they were."""
    from gptrain.trained.hf.export import _in_dtype

    edge = torch.tensor([1.0, 65519.0, -65510.0])  # round to 65504: finite, kept
    assert torch.equal(
        _in_dtype({"edge": edge}, torch.float16, Path("run/step_3"))["edge"],
        torch.tensor([1.0, 65504.0, -65504.0], dtype=torch.float16),
    )
    tensors = {"fine": torch.ones(3), "wide": torch.tensor([1.0, -65520.0, 3.0e4])}
    with pytest.raises(DataError) as error:
        _in_dtype(tensors, torch.float16, Path("run/step_3"))
    assert str(error.value) == (
        "run/step_3: wide has values up to |x| = 65520, which float16 rounds to inf (its largest finite "
        "value is 65504); export with --dtype bfloat16 or float32"
    )
    assert _in_dtype(tensors, torch.bfloat16, Path("run/step_3"))["wide"].dtype == torch.bfloat16


def test_imported_padding_rows_never_outscore_the_real_vocabulary() -> None:
    """The loss is a softmax over the padded vocabulary. Zero rows scored 0, above every real logit
    of a model whose logits are all negative (GPT-2's), and took most of the probability; the mean
    row scores the mean real logit, never above the best."""
    from gptrain.trained.hf.tensors import _fit_rows

    generator = torch.Generator().manual_seed(0)
    real = -torch.randn(96, 32, generator=generator).abs() - 0.1
    fitted = _fit_rows(real, torch.empty(128, 32))
    assert torch.equal(fitted[:96], real)
    assert torch.equal(fitted[96:], real.double().mean(dim=0).float().expand(32, 32))
    hidden = torch.randn(32, 200, generator=generator).abs()  # logits of `real` all negative
    logits = fitted @ hidden
    assert (logits[:96] < 0).all()
    assert (logits[96:].max(dim=0).values <= logits[:96].max(dim=0).values + 1e-5).all()


def test_weights_that_are_not_finite_are_refused_naming_the_tensor(tmp_path) -> None:
    """A checkpoint of a run that diverged: verification said 'logits differ by up to nan ... the
    conversion is wrong', and --no-verify exported the NaN weights without a word."""
    from hf_helpers import saved_run

    from gptrain.checkpoint.manager import CheckpointManager
    from gptrain.parallel.state_dict import model_state_dict

    run, model = saved_run(tmp_path / "run", "llama")
    with torch.no_grad():
        model.layers["1"].mlp.w2.weight[0, :3] = torch.tensor([float("nan"), float("inf"), float("nan")])
    CheckpointManager(run / "checkpoints", keep_last=None).save(2, {"model": model_state_dict(model)}, {})
    for flags in ([], ["--no-verify"]):
        with pytest.raises(DataError) as error:
            run_cli(["export", str(run), "--to", "hf", str(tmp_path / "out"), *flags])
        assert str(error.value) == (
            f"{run / 'checkpoints' / 'step_2'}: model.layers.1.mlp.down_proj.weight holds 2 NaN and 1 infinite "
            "weights (the run diverged before this checkpoint?); export an earlier one (pass its step_<N> directory)"
        )
        assert not (tmp_path / "out").exists()
    assert run_cli(["export", str(run / "checkpoints" / "step_1"), "--to", "hf", str(tmp_path / "out")]) == 0


def test_the_export_computes_gptrains_function_to_float64_precision(exported) -> None:
    """Both models in float64 on the same batch. transformers computes rotary angles in float32
    whatever the model's dtype (gptrain in float64: they differ by ~1e-7 of the largest logit here),
    so gptrain is handed transformers' own cos/sin tables; and Llama's RMSNorm rounds to float32
    inside, so it runs its own formula (with its own epsilon) in float64. What is compared is the
    mapping alone: an epsilon, a GELU flavour, a head order or a rotary fraction off by any amount shows.
    Bound: every logit is the end of a few chains of dot products of at most 4 x 48 terms, each
    rounding by at most n u with u = 1.1e-16, so the two orders of summation agree to about
    10 x 192 x 1.1e-16 ~ 2e-13 of the largest logit; 1e-12 leaves room."""
    import copy

    from transformers import AutoModelForCausalLM

    arch, _, model, out = exported
    ours = copy.deepcopy(model).double().eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float64).eval()
    ids = batch(GPT2_VOCAB)
    if arch != "gpt2":
        positions = torch.arange(ids.shape[1])[None]
        cos, sin = theirs.model.rotary_emb(torch.zeros(1, dtype=torch.float64), positions)
        assert cos.dtype == torch.float64 and cos.shape[-1] == ours.freqs_cos.shape[-1]
        ours.freqs_cos, ours.freqs_sin = cos[0], sin[0]
    for module in theirs.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = rms_norm_in_float64(module)
    with torch.no_grad():
        a, b = ours(ids)[..., :GPT2_VOCAB], theirs(input_ids=ids).logits
    assert float(a.abs().max()) > 1.0
    assert max_relative_difference(a, b) < 1e-12
