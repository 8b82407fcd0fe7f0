"""What export and import refuse, each in one line naming the option or file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gptrain.errors import ConfigError, DataError
from gptrain.models.config import GPTConfig
from gptrain.trained.hf.architectures import GPT2, LLAMA, STABLELM, architecture_of, choose_architecture

BASE = {"vocab_size": 128, "seq_length": 16, "num_layers": 1, "hidden_size": 32, "num_attention_heads": 4}
ROPE = {**BASE, "position_embedding_type": "rope", "activation": "swiglu", "bias": False}


def test_each_architecture_is_chosen_by_its_options() -> None:
    assert choose_architecture(GPTConfig(**BASE)) == GPT2
    assert choose_architecture(GPTConfig(**ROPE, rotary_percentage=0.5, num_query_groups=2)) == STABLELM
    assert choose_architecture(GPTConfig(**{**ROPE, "bias": True}, normalization="rmsnorm")) == LLAMA


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({**BASE, "activation": "swiglu"}, "model.activation=swiglu"),
        ({**BASE, "normalization": "rmsnorm"}, "model.normalization=rmsnorm"),
        ({**BASE, "num_query_groups": 2}, "model.num_query_groups=2"),
        ({**BASE, "kv_channels": 16}, "model.kv_channels=16"),
        ({**ROPE, "activation": "gelu"}, "model.activation=gelu"),
        ({**ROPE, "bias": True}, "model.bias=True"),
        ({**ROPE, "normalization": "rmsnorm", "rotary_percentage": 0.5}, "model.rotary_percentage=0.5"),
    ],
)
def test_inexpressible_combinations_are_one_line_errors(options: dict, named: str) -> None:
    with pytest.raises(ConfigError, match="cannot export " + named.replace(".", r"\.")) as error:
        choose_architecture(GPTConfig(**options))
    assert "\n" not in str(error.value)


def gptrain(args: list[str], extra_code: str = "") -> subprocess.CompletedProcess:
    code = f"import sys\n{extra_code}\nfrom gptrain.cli import main\nsys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_transformers_says_how_to_install(tmp_path: Path) -> None:
    hide = "sys.modules['transformers'] = None  # import fails as if not installed"
    for args in (
        ["export", str(tmp_path), "--to", "hf", str(tmp_path / "out")],
        ["import", str(tmp_path), "--output", str(tmp_path / "run")],
    ):
        done = gptrain(args, hide)
        assert done.returncode != 0
        assert done.stderr.strip().splitlines() == [
            "gptrain: error: Hugging Face export/import needs the transformers package: pip install 'gptrain[hf]'"
        ]


def test_help_of_export_and_import_imports_neither_torch_nor_transformers() -> None:
    check = "import atexit\natexit.register(lambda: print('heavy', [m for m in ('torch', 'transformers') if m in sys.modules]))"
    for command in ("export", "import"):
        done = gptrain([command, "--help"], check)
        assert done.returncode == 0 and "heavy []" in done.stdout, done.stdout[-500:] + done.stderr[-500:]


def test_import_of_a_directory_without_a_model_names_what_is_missing(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    done = gptrain(["import", str(tmp_path), "--output", str(tmp_path / "run")])
    assert done.returncode != 0
    assert (
        done.stderr.strip()
        == f"gptrain: error: {tmp_path}: no config.json; pass a transformers model directory"
    )
    assert not (tmp_path / "run").exists()


def test_import_names_the_damaged_tokenizer_file_it_was_given(tmp_path: Path) -> None:
    """It named the copy under the output directory, which the failed import leaves nowhere."""
    pytest.importorskip("transformers")
    from hf_helpers import run_cli, tiny_run

    from gptrain.errors import DataError

    run, _ = tiny_run("gpt2", tmp_path)
    hf = tmp_path / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(hf), "--no-verify"]) == 0
    (hf / "vocab.json").write_text("garbage")
    (hf / "tokenizer.json").unlink(missing_ok=True)
    with pytest.raises(DataError, match=rf"^{hf / 'vocab.json'}: not a JSON vocab"):
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported"), "--no-verify"])
    assert not (tmp_path / "imported").exists()


def test_building_a_transformers_model_prints_no_torchao_start_up_warnings() -> None:
    """transformers imports torchao (installed with the fp8 extra) when it builds a model; torchao's
    start-up lines (kernels a CPU build cannot load, a pytree deprecation) would sit in export's and
    import's output as if something had gone wrong."""
    pytest.importorskip("torchao")
    build = (
        "from gptrain.trained.hf.transformers_api import require_transformers\n"
        "transformers = require_transformers()\n"
        "config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)\n"
        "transformers.GPT2LMHeadModel(config)\n"
        "import sys\n"
        "print('torchao imported' if 'torchao' in sys.modules else 'torchao not imported')\n"
    )
    unguarded = "import gptrain.utils.quiet_imports as q\nq.import_torchao_quietly = lambda: None\n"
    for code, quiet in ((build, True), (unguarded + build, False)):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-1000:]
        assert "torchao imported" in done.stdout  # transformers imports it even when gptrain does not
        assert (done.stderr.strip() == "") == quiet, done.stderr[-1000:]


def test_an_unsupported_model_type_is_named_beside_the_model_types_that_import() -> None:
    """The message listed class names (GPT2LMHeadModel, ...) as the supported model_type values."""
    from types import SimpleNamespace

    with pytest.raises(DataError) as refused:
        architecture_of(SimpleNamespace(model_type="qwen2"), "hf/config.json")
    assert str(refused.value) == (
        "hf/config.json: model_type 'qwen2' cannot be imported; supported model_type: gpt2 (GPT2LMHeadModel),"
        " stablelm (StableLmForCausalLM), llama (LlamaForCausalLM)"
    )


def test_import_of_weights_another_config_json_describes_names_the_tensor(tmp_path: Path) -> None:
    """config.json edited (or copied from another size) to a hidden size the weights do not have:
    the embeddings were a torch RuntimeError traceback ("The expanded size of the tensor ...")."""
    pytest.importorskip("transformers")
    import json

    from hf_helpers import run_cli, tiny_run

    run, _ = tiny_run("gpt2", tmp_path)
    hf = tmp_path / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(hf), "--no-verify"]) == 0
    config = json.loads((hf / "config.json").read_text())
    width = config["n_embd"]
    (hf / "config.json").write_text(json.dumps({**config, "n_embd": 2 * width}))
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported"), "--no-verify"])
    message = str(error.value)
    assert message.startswith(f"{hf}: tok_embeddings.weight has shape (")
    assert f", {width}), config.json gives (" in message and f", {2 * width})" in message
    assert message.endswith("give the config.json these weights were saved with")
    assert not (tmp_path / "imported").exists()


def test_paths_that_safetensors_cannot_take_are_refused_first(tmp_path: Path) -> None:
    """A Latin-1 directory name (its byte 0xe9 a surrogate in Python): export with verification
    failed after the work with "free space or fix permissions", import said the tokenizer.json was
    not one, or named an override (run.name=...) the user never gave."""
    pytest.importorskip("transformers")
    from hf_helpers import run_cli, tiny_run

    run, _ = tiny_run("gpt2", tmp_path)
    latin1 = f"{tmp_path}/caf\udce9"
    shown = f"{tmp_path}/caf\\xe9"
    hf = tmp_path / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(hf), "--no-verify"]) == 0
    for argv, named in (
        (["export", str(run), "--to", "hf", latin1], "OUTPUT_DIR"),
        (["import", latin1, "--output", str(tmp_path / "imported")], "HF_DIR"),
        (["import", str(hf), "--output", latin1, "--no-verify"], "--output"),
    ):
        with pytest.raises(ConfigError) as error:
            run_cli(argv)
        assert str(error.value) == (
            f"{named} {shown}: byte 0xe9 is not UTF-8, and safetensors, tokenizers and the run's config "
            "take UTF-8 paths only; rename it (or link it from a UTF-8 path)"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run_gpt2"]  # nothing else written


def test_a_failed_export_or_import_removes_the_parents_it_made(tmp_path: Path, monkeypatch) -> None:
    """OUTPUT_DIR's missing parents were made before the work started, so a failure (here a full disk
    for export, weights another config.json describes for import) left them behind, empty, though
    the error said nothing was left there."""
    pytest.importorskip("transformers")
    import json

    import safetensors.torch
    from hf_helpers import run_cli, tiny_run
    from safetensors import SafetensorError

    run, _ = tiny_run("gpt2", tmp_path)
    hf = tmp_path / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(hf), "--no-verify"]) == 0
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "n_embd": 2 * config["n_embd"]}))
    with pytest.raises(DataError, match="config.json gives"):
        run_cli(["import", str(hf), "--output", str(tmp_path / "new" / "deeper" / "imported")])

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(DataError, match="No space left on device"):
        run_cli(["export", str(run), "--to", "hf", str(tmp_path / "made" / "deeper" / "out")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run_gpt2"]


@pytest.mark.parametrize("size", ["inf", "nan", "0", "-1"])
def test_a_shard_size_that_is_no_size_is_one_line(tmp_path: Path, size: str) -> None:
    """--max-shard-size-gb inf passed the > 0 check and was an OverflowError traceback converting it to bytes."""
    from hf_helpers import run_cli

    with pytest.raises(ConfigError) as error:
        run_cli(
            [
                "export",
                str(tmp_path / "run"),
                "--to",
                "hf",
                str(tmp_path / "out"),
                "--max-shard-size-gb",
                size,
            ]
        )
    assert str(error.value) == (
        f"--max-shard-size-gb={float(size)} must be a finite number > 0 "
        "(a size above the model's writes one file)"
    )
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_cannot_be_made_is_refused_before_reading_the_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    """OUTPUT_DIR under a file (or a read-only directory) failed only after the CRC-32 pass over the
    whole checkpoint, as 'export ... failed (Not a directory)'."""
    pytest.importorskip("transformers")
    import gptrain.trained.hf.export as export

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(export, "open_run", never)
    (tmp_path / "afile").write_text("")
    with pytest.raises(DataError) as error:
        export.export_hf(tmp_path / "run", tmp_path / "afile" / "out")
    assert str(error.value) == (
        f"{tmp_path / 'afile' / 'out'}: {tmp_path / 'afile'} is not a directory; "
        "choose an OUTPUT_DIR that can be written"
    )


def test_an_export_into_the_empty_working_directory_is_refused_before_reading_the_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    """`gptrain export RUN --to hf .` in a new empty directory replaced it with the staging directory:
    the shell was left in a removed one, which listed nothing until entered again. Refused, the
    directory untouched."""
    pytest.importorskip("transformers")
    import os

    import gptrain.trained.hf.export as export

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(export, "open_run", never)
    here = tmp_path / "here"
    here.mkdir()
    before = os.stat(here)
    monkeypatch.chdir(here)
    with pytest.raises(DataError) as error:
        export.export_hf(tmp_path / "run", ".")
    assert str(error.value) == (
        f"{here}: is the working directory, which the output would replace (the shell would be left in a "
        "removed directory); give a new directory's name, such as ./model"
    )
    assert (os.stat(".").st_ino, os.stat(here).st_ino) == (before.st_ino, before.st_ino)
    assert os.listdir(tmp_path) == ["here"] and os.listdir(here) == []


def test_a_transformers_directory_given_as_a_checkpoint_says_to_import_it(tmp_path: Path) -> None:
    """export, generate and eval named only the run layouts they read; the model to continue from
    or sample is often a transformers directory, which `gptrain import` turns into a run."""
    from gptrain.trained.load import resolve_checkpoint

    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        (hf / name).write_text("{}")
    with pytest.raises(DataError) as refused:
        resolve_checkpoint(hf)
    assert str(refused.value) == (
        f"{hf}: a transformers model directory (config.json), not a gptrain checkpoint: import it with "
        f"`gptrain import {hf} --output RUN_DIR` and give RUN_DIR"
    )


def test_the_import_command_for_a_transformers_directory_is_quoted(tmp_path: Path) -> None:
    """The command is pasted into a shell: a directory named with a space or brackets was two words
    or a glob there."""
    import shlex

    from gptrain.trained.load import resolve_checkpoint

    hf = tmp_path / "hf [v2]"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        (hf / name).write_text("{}")
    with pytest.raises(DataError) as refused:
        resolve_checkpoint(hf)
    command = str(refused.value).split("`")[1]
    assert shlex.split(command) == ["gptrain", "import", str(hf), "--output", "RUN_DIR"]


@pytest.mark.parametrize("command", ["export", "import"])
def test_export_and_import_remove_what_a_killed_one_left_never_a_live_ones(
    tmp_path: Path, command: str
) -> None:
    """A SIGKILLed export or import left its model-sized `.NAME.XXXXXXXX.tmp` staging directory, which
    nothing removed. The next one of that output removes those no live writer holds (atomic_directory
    keeps a lock file in its own locked) and untouched for an hour, with a line; a live or younger one
    stays."""
    pytest.importorskip("transformers")
    import io
    import os
    import time

    from gptrain.errors import GptrainError
    from gptrain.trained.hf.export import export_hf
    from gptrain.trained.hf.import_ import import_hf
    from gptrain.utils.atomic import hold_directory, release_directory

    output = tmp_path / "out"
    dead, live, young = (tmp_path / f".out.{tag}.tmp" for tag in ("dead1234", "live5678", "young901"))
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "model.safetensors").write_bytes(b"x" * 2_000_000)
    live.mkdir()
    young.mkdir()
    two_hours_ago = time.time() - 7200
    for directory in (dead, live):
        os.utime(directory, (two_hours_ago, two_hours_ago))
    holder = hold_directory(live)  # as the live export's atomic_directory holds its staging
    stream = io.StringIO()
    try:
        with pytest.raises(GptrainError):  # nothing to export or import: the removal came first
            if command == "export":
                export_hf(tmp_path / "no-run", output, stream=stream)
            else:
                import_hf(tmp_path / "no-model", output, stream=stream)
    finally:
        release_directory(live, holder)
    assert not dead.exists() and live.is_dir() and young.is_dir()
    assert stream.getvalue() == (
        f"gptrain: removed .out.dead1234.tmp beside {output} (0.0 GB): left unfinished by a killed export or import\n"
    )


@pytest.mark.parametrize("arch", [LLAMA, STABLELM])
def test_hidden_act_swish_imports_as_silu_as_transformers_runs_it(arch: str) -> None:
    """transformers' ACT2FN maps "swish" to the SiLU its "silu" is; the import refused it by name."""
    transformers = pytest.importorskip("transformers")
    import torch
    from transformers.activations import ACT2FN

    from gptrain.trained.hf.architectures import model_overrides

    probe = torch.linspace(-6.0, 6.0, 97, dtype=torch.float64)
    assert ACT2FN["swish"](probe).equal(ACT2FN["silu"](probe))  # the premise, in transformers itself
    kind = transformers.LlamaConfig if arch == LLAMA else transformers.StableLmConfig
    small = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}
    swish = model_overrides(kind(hidden_act="swish", **small), arch, "config.json")
    assert swish == model_overrides(kind(hidden_act="silu", **small), arch, "config.json")
    assert swish["activation"] == "swiglu"
    with pytest.raises(DataError, match=r"config.json: hidden_act='gelu' cannot be imported"):
        model_overrides(kind(hidden_act="gelu", **small), arch, "config.json")


SMALL_ROPE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}
LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def rope(rope_type: str, **scaling: float) -> dict:
    return {"rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, **scaling}}


@pytest.mark.parametrize(
    ("arch", "options", "key", "value", "expected"),
    [
        (GPT2, {"scale_attn_weights": False}, "scale_attn_weights", False, True),
        (GPT2, {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx", True, False),
        (GPT2, {"add_cross_attention": True}, "add_cross_attention", True, False),
        (STABLELM, {"use_qkv_bias": True}, "use_qkv_bias", True, False),
        (STABLELM, {"qk_layernorm": True}, "qk_layernorm", True, False),
        (STABLELM, {"use_parallel_residual": True}, "use_parallel_residual", True, False),
        (LLAMA, {"mlp_bias": True, "attention_bias": False}, "mlp_bias", True, False),
        (LLAMA, {"mlp_bias": False, "attention_bias": True}, "mlp_bias", False, True),
        (
            LLAMA,
            rope("default", partial_rotary_factor=0.5),
            "rope_parameters.partial_rotary_factor",
            0.5,
            1.0,
        ),
        (LLAMA, rope("linear", factor=2.0), "rope_parameters.rope_type", "linear", "default"),
        (LLAMA, rope("dynamic", factor=2.0), "rope_parameters.rope_type", "dynamic", "default"),
        (LLAMA, rope("llama3", **LLAMA3_SCALING), "rope_parameters.rope_type", "llama3", "default"),
        (LLAMA, rope("yarn", factor=4.0), "rope_parameters.rope_type", "yarn", "default"),
        (STABLELM, rope("linear", factor=2.0), "rope_parameters.rope_type", "linear", "default"),
        (LLAMA, {"rope_parameters": {"rope_theta": 10000.5}}, "rope_parameters.rope_theta", 10000.5, 10000.0),
    ],
)
def test_each_config_json_value_gptrain_cannot_compute_is_refused_naming_the_key(
    arch: str, options: dict, key: str, value: object, expected: object
) -> None:
    """Each is a model gptrain would compute otherwise: without the refusal, --no-verify imported it
    unchecked, and verification alone may miss a small difference (rope_theta 10000.5 read as 10000
    moved a tiny model's logits by 3e-3 of the largest). Before any weights are read: configs only."""
    transformers = pytest.importorskip("transformers")
    from gptrain.trained.hf.architectures import model_overrides

    if arch == GPT2:
        config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, **options)
    else:
        kind = transformers.LlamaConfig if arch == LLAMA else transformers.StableLmConfig
        config = kind(**SMALL_ROPE, **options)
    with pytest.raises(DataError) as error:
        model_overrides(config, arch, "config.json")
    message = str(error.value)
    assert message.startswith(f"config.json: {key}={value!r} cannot be imported (")
    assert message.endswith(f"; gptrain needs {expected!r}") and "\n" not in message


@pytest.mark.parametrize(("factor", "rotary"), [(0.4, 3), (0.2, 1)])
def test_a_stablelm_rotary_width_gptrain_cannot_rotate_names_partial_rotary_factor(
    tmp_path: Path, factor: float, rotary: int
) -> None:
    """StableLM rotates int(head dim x partial_rotary_factor) dims of each head, in pairs: 0.4 of
    head dim 8 is 3, which transformers cannot run either. The refusal named gptrain's
    model.rotary_percentage, which the user never wrote, after the weights and the tokenizer were
    read; now config.json's key, before them (this directory holds no weights)."""
    transformers = pytest.importorskip("transformers")
    from hf_helpers import run_cli

    hf = tmp_path / "hf"
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor}
    transformers.StableLmConfig(**SMALL_ROPE, rope_parameters=rope).save_pretrained(str(hf))
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported")])
    assert str(error.value) == (
        f"{hf / 'config.json'}: rope_parameters.partial_rotary_factor={factor} of head dim 8 gives {rotary} "
        "rotary dims, which cannot be imported (rotary dims turn in pairs); gptrain needs an even number "
        "from 2 to 8"
    )
    assert not (tmp_path / "imported").exists()


def test_an_export_beaten_to_its_output_by_another_says_so_not_free_space(
    tmp_path: Path, monkeypatch
) -> None:
    """Two exports into one OUTPUT_DIR at once: the second found it filled at its rename and said
    "(Directory not empty); nothing was left there: free space or fix permissions ...". The other's
    output is kept, this one's staging removed."""
    pytest.importorskip("transformers")
    from hf_helpers import run_cli, tiny_run

    import gptrain.trained.hf.export as export

    run, _ = tiny_run("gpt2", tmp_path)
    out = tmp_path / "out"
    write_weights = export.write_weights

    def other_export_finishes_first(*args, **kwargs):
        out.mkdir()
        (out / "config.json").write_text("{}")  # the other export's, renamed into place meanwhile
        return write_weights(*args, **kwargs)

    monkeypatch.setattr(export, "write_weights", other_export_finishes_first)
    with pytest.raises(DataError) as error:
        run_cli(["export", str(run), "--to", "hf", str(out), "--no-verify"])
    assert str(error.value) == (
        f"{out}: another process wrote it while this one ran (two exports or imports into one directory "
        "at once?); nothing of this one was left there: keep that output, or remove it (or choose another "
        "directory) and run again"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run_gpt2"]  # no staging directory left
    assert [p.name for p in out.iterdir()] == ["config.json"]


def test_an_export_into_the_runs_checkpoint_directory_is_refused_before_reading_it(
    tmp_path: Path, monkeypatch
) -> None:
    """OUTPUT_DIR run/checkpoints/step_N/hf was written, and retention's removal of step_N (save_top_k)
    deleted the export with it. Refused for any OUTPUT_DIR in the checkpoint root, named by a run, its
    checkpoints dir or a step dir, before the checkpoint is read; nothing is written."""
    pytest.importorskip("transformers")
    from hf_helpers import tiny_run

    import gptrain.trained.hf.export as export

    run, _ = tiny_run("gpt2", tmp_path)
    root = run / "checkpoints"

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(export, "open_run", never)
    before = sorted(str(p) for p in run.rglob("*"))
    for source, output in (
        (run, root / "step_3" / "hf"),
        (root, root / "hf"),
        (root / "step_3", root / "step_3" / "hf"),
        (run, root),
    ):
        with pytest.raises(DataError) as error:
            export.export_hf(source, output)
        assert str(error.value) == (
            f"{output}: inside the run's checkpoint directory {root}, whose step directories are removed "
            f"as newer checkpoints replace them (and the export with them); choose an OUTPUT_DIR outside "
            f"it, e.g. {run / 'hf'}"
        )
    assert sorted(str(p) for p in run.rglob("*")) == before


def test_the_verify_command_for_a_damaged_checkpoint_is_quoted(tmp_path: Path) -> None:
    """A checkpoint that does not load names `gptrain checkpoint verify RUN`, pasted into a shell:
    a run directory named with a space was two words there."""
    import shlex

    from gptrain.checkpoint.integrity import COMPLETE
    from gptrain.trained.load import unreadable

    step = tmp_path / "my run" / "checkpoints" / "step_10"
    step.mkdir(parents=True)
    (step / COMPLETE).write_text("{}")
    command = str(unreadable(step, RuntimeError("bad shard"))).split("`")[1]
    assert shlex.split(command) == ["gptrain", "checkpoint", "verify", str(step.parent)]


@pytest.mark.parametrize("rows", [50000, 50300], ids=["fewer", "more"])
@pytest.mark.parametrize("flags", [[], ["--no-verify"]], ids=["verified", "unverified"])
def test_import_of_a_config_json_whose_vocab_size_is_not_the_embeddings_rows_names_both(
    tmp_path: Path, rows: int, flags: list[str]
) -> None:
    """config.json's vocab_size edited (tokens added to the tokenizer, the embeddings never resized):
    gptrain fitted the 50257 rows to it (more: mean rows appended; fewer: refused as a tokenizer with
    more tokens than rows), and verification then died in transformers' load with a RuntimeError
    traceback; under --no-verify the run imported rows that are no token's."""
    pytest.importorskip("transformers")
    import json

    from hf_helpers import run_cli, tiny_run

    run, _ = tiny_run("gpt2", tmp_path)
    hf = tmp_path / "hf"
    assert run_cli(["export", str(run), "--to", "hf", str(hf), "--no-verify"]) == 0
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "vocab_size": rows}))
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported"), *flags])
    assert str(error.value) == (
        f"{hf}: transformer.wte.weight has 50257 rows but config.json gives vocab_size {rows}; give the "
        "config.json these weights were saved with (or resize the embeddings in transformers and save the model)"
    )
    assert not (tmp_path / "imported").exists()


def llama_config_dir(directory: Path, **edits: object) -> Path:
    """A directory holding a tiny Llama's config.json alone, with `edits` written over its keys."""
    import json

    import transformers

    directory.mkdir()
    transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4
    ).save_pretrained(str(directory))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **edits}))
    return directory


def test_a_config_json_value_of_the_wrong_type_is_one_line_naming_the_field(tmp_path: Path) -> None:
    """transformers 5 validates config fields by type: rms_norm_eps written as an integer raised
    huggingface_hub's StrictDataclassFieldValidationError, which is none of the errors caught, as
    a traceback."""
    pytest.importorskip("transformers")
    from hf_helpers import run_cli

    hf = llama_config_dir(tmp_path / "hf", rms_norm_eps=0)
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported")])
    message = str(error.value)
    assert message.startswith(f"{hf}/config.json: transformers cannot read it (")
    assert "'rms_norm_eps' expected float, got int" in message and "\n" not in message
    assert not (tmp_path / "imported").exists()


def test_a_config_json_value_transformers_fails_on_is_one_line_naming_the_cause(tmp_path: Path) -> None:
    """transformers' own check of a config (num_attention_heads 0: hidden_size % 0) raised a
    ZeroDivisionError, none of the errors caught: a traceback. Any error of reading config.json is
    now the one line, with the error's kind and the line of transformers that raised it."""
    pytest.importorskip("transformers")
    from hf_helpers import run_cli

    hf = llama_config_dir(tmp_path / "hf", num_attention_heads=0)
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported")])
    message = str(error.value)
    assert message.startswith(f"{hf}/config.json: transformers cannot read it (ZeroDivisionError: ")
    assert "self.num_attention_heads" in message and "\n" not in message
    assert not (tmp_path / "imported").exists()


@pytest.mark.parametrize("flags", [[], ["--no-verify"]], ids=["verified", "unverified"])
def test_a_quantized_model_is_refused_before_its_weights_are_read(tmp_path: Path, flags: list[str]) -> None:
    """A GPTQ/AWQ/bitsandbytes checkpoint is model_type llama with packed integer weights: it was
    refused as a missing q_proj.weight or a shape config.json does not give (GPTQ, AWQ; bitsandbytes'
    uint8 blocks), or, with float weights beside the quantization_config, died in transformers' load
    at verification ("Loading a GPTQ quantized model requires optimum") as an ImportError traceback."""
    pytest.importorskip("transformers")
    from hf_helpers import run_cli

    hf = llama_config_dir(tmp_path / "hf", quantization_config={"quant_method": "gptq", "bits": 4})
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported"), *flags])
    assert str(error.value) == (
        f"{hf / 'config.json'}: quantization_config (quant_method gptq): a quantized model cannot be "
        "imported (gptrain trains floating-point weights); import the model it was quantized from"
    )
    assert not (tmp_path / "imported").exists()
