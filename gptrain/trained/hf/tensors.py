"""Per-tensor names and layouts between gptrain and transformers, both directions.

gptrain keys are those of `GPT.state_dict()` (`layers.<i>.attention.wq.weight`, ...). GPT-2 keeps
q, k and v in one `c_attn` and stores every linear as `Conv1D`, whose weight is [in, out]: the
transpose of an `nn.Linear`'s. StableLM and Llama use `nn.Linear` with one name per gptrain
tensor, and gptrain's q/k/v heads are contiguous blocks of rows exactly as theirs are, so their
weights copy unchanged. Embedding rows beyond the real vocabulary (padding) are dropped on export.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import torch

from gptrain.errors import DataError
from gptrain.trained.hf.architectures import GPT2

if TYPE_CHECKING:
    from gptrain.trained.hf.storage import SafetensorsTensors

Tensors = dict[str, torch.Tensor]

# gptrain name inside a block -> transformers name inside a block (StableLM, Llama).
LINEAR_LAYER_NAMES = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention_norm.bias": "input_layernorm.bias",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.wo.bias": "self_attn.o_proj.bias",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp_norm.bias": "post_attention_layernorm.bias",
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w1.bias": "mlp.gate_proj.bias",
    "mlp.w3.weight": "mlp.up_proj.weight",
    "mlp.w3.bias": "mlp.up_proj.bias",
    "mlp.w2.weight": "mlp.down_proj.weight",
    "mlp.w2.bias": "mlp.down_proj.bias",
}
# gptrain name inside a block -> (GPT-2 name inside a block, stored transposed); q/k/v go to c_attn.
GPT2_LAYER_NAMES = {
    "attention_norm.weight": ("ln_1.weight", False),
    "attention_norm.bias": ("ln_1.bias", False),
    "attention.wo.weight": ("attn.c_proj.weight", True),
    "attention.wo.bias": ("attn.c_proj.bias", False),
    "mlp_norm.weight": ("ln_2.weight", False),
    "mlp_norm.bias": ("ln_2.bias", False),
    "mlp.w1.weight": ("mlp.c_fc.weight", True),
    "mlp.w1.bias": ("mlp.c_fc.bias", False),
    "mlp.w2.weight": ("mlp.c_proj.weight", True),
    "mlp.w2.bias": ("mlp.c_proj.bias", False),
}
QKV = ("attention.wq", "attention.wk", "attention.wv")


def hf_layer_prefix(arch: str, index: int) -> str:
    return f"transformer.h.{index}." if arch == GPT2 else f"model.layers.{index}."


def hf_global_names(arch: str) -> dict[str, str]:
    """gptrain name -> transformers name of the tensors outside the blocks."""
    if arch == GPT2:
        return {
            "tok_embeddings.weight": "transformer.wte.weight",
            "pos_embeddings.weight": "transformer.wpe.weight",
            "norm.weight": "transformer.ln_f.weight",
            "norm.bias": "transformer.ln_f.bias",
            "output.weight": "lm_head.weight",
        }
    return {
        "tok_embeddings.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
        "norm.bias": "model.norm.bias",
        "output.weight": "lm_head.weight",
    }


def layer_to_hf(arch: str, index: int, layer: Tensors) -> Tensors:
    """One block's gptrain tensors (names relative to the block) -> transformers tensors (full names).

    GPT-2 has biases everywhere: a gptrain model without them gets zeros, which computes the same.
    """
    prefix = hf_layer_prefix(arch, index)
    if arch != GPT2:
        return {prefix + LINEAR_LAYER_NAMES[name]: tensor for name, tensor in layer.items()}
    out: Tensors = {}
    for name, (hf_name, transposed) in GPT2_LAYER_NAMES.items():
        if name in layer:
            out[prefix + hf_name] = layer[name].t().contiguous() if transposed else layer[name]
        elif name.endswith(".bias"):
            weight = layer[name.removesuffix(".bias") + ".weight"]
            out[prefix + hf_name] = weight.new_zeros(weight.shape[0])
    weight = torch.cat([layer[f"{qkv}.weight"] for qkv in QKV])
    out[prefix + "attn.c_attn.weight"] = weight.t().contiguous()
    biases = [layer.get(f"{qkv}.bias") for qkv in QKV]
    out[prefix + "attn.c_attn.bias"] = (
        torch.cat(biases) if all(b is not None for b in biases) else weight.new_zeros(weight.shape[0])
    )
    return out


def layer_from_hf(arch: str, index: int, read: Callable[[str], torch.Tensor], names: list[str]) -> Tensors:
    """One block's gptrain tensors (relative names) from transformers tensors read by full name.

    `names` are the gptrain names the block needs (from a gptrain model of the imported shape).
    """
    prefix = hf_layer_prefix(arch, index)
    if arch != GPT2:
        return {name: read(prefix + LINEAR_LAYER_NAMES[name]) for name in names}
    out: Tensors = {}
    for name, (hf_name, transposed) in GPT2_LAYER_NAMES.items():
        tensor = read(prefix + hf_name)
        out[name] = tensor.t().contiguous() if transposed else tensor
    weight, bias = read(prefix + "attn.c_attn.weight"), read(prefix + "attn.c_attn.bias")
    for qkv, w, b in zip(QKV, weight.t().chunk(3), bias.chunk(3), strict=True):
        out[f"{qkv}.weight"], out[f"{qkv}.bias"] = w.contiguous(), b.contiguous()
    return out


def globals_to_hf(arch: str, tensors: Tensors, vocab_size: int, tied: bool) -> Tensors:
    """Embeddings, final norm and (untied) output, padding rows dropped."""
    names = hf_global_names(arch)
    out: Tensors = {}
    for name, tensor in tensors.items():
        if name == "output.weight" and tied:
            continue  # transformers ties lm_head to the embedding itself
        if name in ("tok_embeddings.weight", "output.weight"):
            tensor = tensor[:vocab_size].contiguous()
        out[names[name]] = tensor
    return out


def globals_from_hf(
    arch: str, read: Callable[[str], torch.Tensor], live: Tensors, tied: bool, embedding: str | None = None
) -> Tensors:
    """gptrain's global tensors shaped like `live` (padding rows: the mean row) from transformers
    tensors; the embedding (and a tied output layer) from `embedding` (None: the embedding's name)."""
    names = hf_global_names(arch)
    embedding = embedding or names["tok_embeddings.weight"]
    out: Tensors = {}
    for name, template in live.items():
        shared = name == "tok_embeddings.weight" or (name == "output.weight" and tied)
        tensor = read(embedding if shared else names[name])
        # rows are fitted to the padded vocabulary; other widths are left for the caller to refuse
        if name in ("tok_embeddings.weight", "output.weight") and tensor.shape[1:] == template.shape[1:]:
            tensor = _fit_rows(tensor, template)
        out[name] = tensor
    return out


def _fit_rows(tensor: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """`tensor`'s rows in a tensor of `template`'s shape; the padding rows past them (tokens the
    tokenizer never emits) take the mean of its rows. The loss is a softmax over the padded
    vocabulary: a zero row's logit is 0, which for a model whose logits are all negative (GPT-2's)
    takes most of the probability; the mean row's logit is the mean logit, far below the top."""
    fitted = torch.empty(template.shape, dtype=tensor.dtype)
    rows = min(tensor.shape[0], template.shape[0])
    fitted[:rows] = tensor[:rows]
    if template.shape[0] > rows:
        fitted[rows:] = tensor.to(torch.float64).mean(dim=0).to(tensor.dtype)
    return fitted


def embedding_name(arch: str, has: Callable[[str], bool], tied: bool) -> str:
    """The transformers tensor the embedding is read from: its own, or, for a tied pair whose
    weights hold lm_head.weight alone, that one (transformers 5 ties a pair to whichever is stored)."""
    names = hf_global_names(arch)
    embedding, output = names["tok_embeddings.weight"], names["output.weight"]
    return output if tied and not has(embedding) and has(output) else embedding


def output_layer_tied(weights: SafetensorsTensors, arch: str, hf_config: Any, stream: TextIO) -> bool:
    """Whether the import ties the output layer to the embedding, as transformers 5 loads the weights:
    config.json's tie_word_embeddings, except that a stored lm_head.weight differing from the
    embedding is left untied (a stale config.json: PretrainedConfig and GPT2Config default it to
    true), said in a note. Each stored one has config.json's vocab_size rows, which transformers
    requires to load it: an edited vocab_size was a RuntimeError traceback from transformers' load at
    verification (under --no-verify mean rows were appended to the weights), or a tokenizer said to
    outgrow the rows."""
    tied = bool(hf_config.tie_word_embeddings)
    embedding, output = embedding_name(arch, weights.has, tied), hf_global_names(arch)["output.weight"]
    stored = [embedding] if embedding == output or (tied and not weights.has(output)) else [embedding, output]
    rows = int(hf_config.vocab_size)
    for name in stored:
        if (found := weights.stored_shape(name)[0]) != rows:
            raise DataError(
                f"{weights.directory}: {name} has {found} rows but config.json gives vocab_size {rows}; give "
                "the config.json these weights were saved with (or resize the embeddings in transformers "
                "and save the model)"
            )
    if len(stored) == 1 or not tied or _same_values(weights.read(embedding), weights.read(output)):
        return tied
    print(
        f"gptrain: note: {weights.directory / 'config.json'} says tie_word_embeddings=true but the weights' "
        f"{output} differs from {embedding}: imported untied, as transformers loads it (set "
        "tie_word_embeddings to false there to say so)",
        file=stream,
    )
    return False


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """As transformers compares a stored pair once loaded: torch.equal, in one dtype."""
    if a.dtype != b.dtype:
        a, b = a.float(), b.float()
    return torch.equal(a, b)
