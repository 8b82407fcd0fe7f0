"""Which tensor an imported model's output layer is: the one transformers 5 computes with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import max_relative_difference, rms_norm_in_float64, run_cli  # noqa: E402

ROWS = 256  # no vocabulary padding: gptrain's logits are transformers' rows


def tied_llama(directory: Path, lm_head: str) -> None:
    """A tiny Llama saved by transformers with tie_word_embeddings true (model.safetensors then holds
    the embedding alone), its weights then edited: `lm_head` "different" adds an lm_head.weight of
    other values (a config.json that wrongly says tied: PretrainedConfig defaults it to true),
    "equal" adds one equal to the embedding (as torch .bin checkpoints store a tied pair), "alone"
    stores the embedding as lm_head.weight only, "short" adds one of 200 rows."""
    import transformers
    from safetensors.torch import load_file, save_file

    config = transformers.LlamaConfig(
        vocab_size=ROWS, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=True, initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(directory))
    tensors = load_file(directory / "model.safetensors")
    assert "lm_head.weight" not in tensors
    embedding = tensors["model.embed_tokens.weight"]
    if lm_head == "different":
        tensors["lm_head.weight"] = 0.3 * torch.randn(
            embedding.shape, generator=torch.Generator().manual_seed(1)
        )
    elif lm_head == "equal":
        tensors["lm_head.weight"] = embedding.clone()
    elif lm_head == "short":
        tensors["lm_head.weight"] = embedding[:200].clone()
    else:
        tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def float64_logits(run_dir: Path, hf_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    """The imported run's logits and transformers' on one batch, both in float64, gptrain handed
    transformers' rotary tables and transformers' RMSNorm run in float64 (as in
    test_the_export_computes_gptrains_function_to_float64_precision); and transformers' model."""
    from transformers import AutoModelForCausalLM

    from gptrain.train.builders import build_model, build_model_config
    from gptrain.trained.load import load_weights, open_run

    run = open_run(run_dir)
    ours = build_model(build_model_config(run.cfg, run.saved_rows), torch.device("cpu"), seed=0)
    load_weights(ours, run.step_dir)
    ours = ours.double().eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float64).eval()
    ids = torch.randint(0, ROWS, (2, 16), generator=torch.Generator().manual_seed(3))
    cos, sin = theirs.model.rotary_emb(torch.zeros(1, dtype=torch.float64), torch.arange(16)[None])
    ours.freqs_cos, ours.freqs_sin = cos[0], sin[0]
    for module in theirs.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = rms_norm_in_float64(module)
    return ours(ids)[..., :ROWS], theirs(input_ids=ids).logits, theirs


@pytest.mark.parametrize("lm_head", ["different", "equal", "alone"])
@pytest.mark.parametrize("flags", [[], ["--no-verify"]], ids=["verified", "unverified"])
def test_the_output_layer_is_imported_as_transformers_loads_it(
    tmp_path: Path, capsys, lm_head: str, flags: list[str]
) -> None:
    """transformers 5 leaves a tied pair untied where the weights hold an lm_head.weight that differs
    from the embedding, and ties both to a stored lm_head.weight alone. gptrain imported the first
    tied (the embedding as the output layer): verification failed saying the conversion was wrong,
    and --no-verify imported it, the trained output layer thrown away; the second was refused as a
    missing model.embed_tokens.weight. Both now import as transformers computes them, to float64
    precision (bound: test_the_export_computes_gptrains_function_to_float64_precision's); the first
    with one note naming tie_word_embeddings and the two tensors."""
    hf, run_dir = tmp_path / "hf", tmp_path / "imported"
    tied_llama(hf, lm_head)
    assert run_cli(["import", str(hf), "--output", str(run_dir), *flags]) == 0
    ours, theirs, model = float64_logits(run_dir, hf)
    untied = lm_head == "different"
    assert model.lm_head.weight.equal(model.model.embed_tokens.weight) is not untied  # the premise
    assert float(theirs.abs().max()) > 1.0
    assert max_relative_difference(theirs, ours) < 1e-12
    notes = [line for line in capsys.readouterr().err.splitlines() if "tie_word_embeddings" in line]
    assert notes == (
        [
            f"gptrain: note: {hf / 'config.json'} says tie_word_embeddings=true but the weights' lm_head.weight "
            "differs from model.embed_tokens.weight: imported untied, as transformers loads it (set "
            "tie_word_embeddings to false there to say so)"
        ]
        if untied
        else []
    )
    hparams = (run_dir / "hparams.yaml").read_text()
    assert f"share_embeddings_and_output_weights: {str(not untied).lower()}" in hparams


@pytest.mark.parametrize("flags", [[], ["--no-verify"]], ids=["verified", "unverified"])
def test_a_stored_lm_head_of_other_rows_than_vocab_size_is_refused_naming_it(tmp_path: Path, flags) -> None:
    """A tied config.json beside an lm_head.weight of 200 rows for vocab_size 256: gptrain never
    looked at it and imported the embedding as the output layer, where transformers cannot load the
    weights at all (a size mismatch)."""
    from gptrain.errors import DataError

    hf = tmp_path / "hf"
    tied_llama(hf, "short")
    with pytest.raises(DataError) as error:
        run_cli(["import", str(hf), "--output", str(tmp_path / "imported"), *flags])
    assert str(error.value) == (
        f"{hf}: lm_head.weight has 200 rows but config.json gives vocab_size 256; give the config.json these "
        "weights were saved with (or resize the embeddings in transformers and save the model)"
    )
    assert not (tmp_path / "imported").exists()
