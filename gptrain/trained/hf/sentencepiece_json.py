"""A SentencePiece tokenizer.model as a tokenizer.json that encodes the ids gptrain trained with (no torch).

transformers' own reading of a tokenizer.model (LlamaTokenizer, converted on load; `legacy` either
way) encodes other ids than the sentencepiece library: a literal <s> in the text becomes id 1 (the
library spells it out), the model's normalizer is left out (its NFKC map, the removal of extra
spaces, newlines as spaces), characters a model without byte fallback lacks are dropped instead of
<unk>, and a Unigram model is read as BPE. So the export writes the model's own rules out in
`tokenizers` terms: its normalizer, the dummy prefix before each text, its pieces (BPE merges
ranked by the merged piece's score, as the library merges; Unigram scores, control and byte
pieces never matched in text, user-defined ones scored as the library scores them), byte fallback
or one <unk> per run of unknown characters, and the ids Megatron's wrapper adds (Llama2Tokenizer's
bos first; SentencePieceTokenizer's specials, a literal one in the text its id). Properties with no
such equivalent are refused, naming them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from gptrain.data.tokenizer_wrappers import SentencePieceTokenizer
from gptrain.errors import ConfigError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE = 1, 2
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
# a Unigram score below any path through known characters: control pieces, which the library
# never matches in text, are then never chosen (unknown characters are words of their own)
NEVER = -1e9


def load_proto(model: str) -> Any:
    """The ModelProto of `model` (protobuf comes with tensorboard, a gptrain dependency)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model).read_bytes())
    return proto


def unexportable(proto: Any) -> str | None:
    """The property of the model that no tokenizer.json reproduces (None when there is none)."""
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    if trainer.model_type not in (UNIGRAM, BPE):
        return f"trainer_spec.model_type={MODEL_TYPES.get(trainer.model_type, trainer.model_type)}"
    if trainer.treat_whitespace_as_suffix:
        return "trainer_spec.treat_whitespace_as_suffix=true"
    if not normalizer.escape_whitespaces:
        return "normalizer_spec.escape_whitespaces=false"
    if any(piece.type == UNUSED for piece in proto.pieces):
        return "pieces of type UNUSED"
    if trainer.model_type == BPE and any(piece.type == USER_DEFINED for piece in proto.pieces):
        # kept whole only where `tokenizers` takes any word that is a piece whole: a '<s>' after one too
        return "trainer_spec.model_type=bpe with user_defined_symbols"
    if trainer.model_type == UNIGRAM and (changed := _normalized_user_defined(proto)):
        return f"a user-defined piece {changed!r} that its normalizer changes"
    if trainer.model_type == UNIGRAM and (control := _control_of_unknown_characters(proto)):
        return f"a control piece {control!r} of characters the model has no pieces for"
    return None


def _control_of_unknown_characters(proto: Any) -> str | None:
    """A control piece a word of unknown characters could hold whole (see `_pre_tokenizer`)."""
    known = _known_chars(proto)
    for piece in proto.pieces:
        if piece.type in (UNKNOWN, CONTROL) and not set(piece.piece) & known:
            return piece.piece
    return None


def _normalized_user_defined(proto: Any) -> str | None:
    """A user-defined piece the normalizer changes (nmt_nfkc_cf lowercases '<EOD>'): the library
    matches it in the text as given, `tokenizers` in the normalized text."""
    normalizer = _normalizer(proto, prefix=False)
    for piece in proto.pieces:
        escaped = piece.piece.replace(" ", "▁")
        if piece.type == USER_DEFINED and normalizer.normalize_str(piece.piece) != escaped:
            return piece.piece
    return None


def sentencepiece_tokenizer_json(model: str, tokenizer: SentencePieceTokenizer, kind: str) -> str:
    """tokenizer.json encoding every text as gptrain's `tokenizer` of `model` (Megatron's `kind`)."""
    from tokenizers import Tokenizer

    proto = load_proto(model)
    if (problem := unexportable(proto)) is not None:
        raise ConfigError(f"{model}: {problem}")
    built = Tokenizer(_model(proto))
    built.normalizer = _normalizer(proto)
    if (pre_tokenizer := _pre_tokenizer(proto)) is not None:
        built.pre_tokenizer = pre_tokenizer
    built.decoder = _decoder(proto)
    config = json.loads(built.to_str())
    config["added_tokens"] = _added_tokens(proto, tokenizer, kind)
    if kind == "llama2" and tokenizer.bos_id is not None:
        config["post_processor"] = _bos_first(proto.pieces[tokenizer.bos_id].piece, tokenizer.bos_id)
    return json.dumps(config, ensure_ascii=False)


def _model(proto: Any) -> Any:
    from tokenizers import models

    trainer = proto.trainer_spec
    if trainer.model_type == UNIGRAM:
        best = max((p.score for p in proto.pieces if p.type == NORMAL), default=0.0)
        best = max(best, float(np.finfo(np.float32).tiny))
        vocab = [(p.piece, _unigram_score(p, best)) for p in proto.pieces]
        return models.Unigram(vocab, unk_id=trainer.unk_id, byte_fallback=trainer.byte_fallback)
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    return models.BPE(
        vocab,
        _merges(proto),
        unk_token=trainer.unk_piece,
        fuse_unk=True,
        byte_fallback=trainer.byte_fallback,
    )


def _unigram_score(piece: Any, best: float) -> float:
    """The library's lattice never holds control, unknown or byte pieces, and scores a user-defined
    one as its length times the best normal piece's score (at least float's smallest positive),
    less 0.1, in float32: almost always above its letters."""
    if piece.type in (UNKNOWN, CONTROL, BYTE):
        return NEVER
    if piece.type != USER_DEFINED:
        return piece.score
    return float(np.float32(len(piece.piece)) * np.float32(best) - np.float32(0.1))


def _merges(proto: Any) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, the highest-scored result first (the
    library merges the best-scored pair; among equals, the lower id)."""
    normal = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces) if p.type == NORMAL}
    ranked = []
    for piece, (score, index) in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-score, index, left, right))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def _normalizer(proto: Any, prefix: bool = True) -> Any:
    """The library's normalization, in its order (the dummy prefix with `prefix`)."""
    from tokenizers import Regex, normalizers

    spec = proto.normalizer_spec
    steps = _precompiled(spec.precompiled_charsmap) if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:  # spaces only: newlines and tabs stay as the map left them
        # the library trims the end after spaces became ▁, so a literal ▁ there goes too
        ends = r"\A +|[ ▁]+\z" if spec.escape_whitespaces else r"\A +| +\z"
        steps += [normalizers.Replace(Regex(ends), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    steps.append(normalizers.Replace(" ", "▁"))
    if (
        spec.add_dummy_prefix and prefix
    ):  # before each stretch between special tokens, as Megatron encodes them
        steps.append(normalizers.Prepend("▁"))
    return normalizers.Sequence(steps)


def _precompiled(charsmap: bytes) -> list[Any]:
    """The charsmap, \r first rewritten as the map rewrites it alone: sentencepiece maps \r\n
    character by character (nmt_nfkc: two spaces), tokenizers' Precompiled as one grapheme (one
    space). Only where the rewrite is a fixed point of the map, so mapping it again changes nothing."""
    from tokenizers import normalizers

    precompiled = normalizers.Precompiled(charsmap)
    carriage_return = precompiled.normalize_str("\r")
    if carriage_return == "\r" or precompiled.normalize_str(carriage_return) != carriage_return:
        return [precompiled]
    return [normalizers.Replace("\r", carriage_return), precompiled]


def _pre_tokenizer(proto: Any) -> Any:
    """For Unigram, the characters no piece is as words of their own, each one with byte fallback
    (its bytes), else each run of them (one <unk>, as the library covers it); a user-defined piece
    holding one is a word too (whole: its score beats the <unk> any other path takes). The control
    and byte pieces' NEVER then meets no <unk> in a word to lose to (a '<' the model lacks in '<s>')."""
    from tokenizers import Regex, pre_tokenizers

    if proto.trainer_spec.model_type != UNIGRAM:
        return None
    known = _known_chars(proto)
    with_unknown = [p.piece for p in proto.pieces if p.type == USER_DEFINED and not set(p.piece) <= known]
    whole = "|".join(re.escape(piece) for piece in sorted(with_unknown, key=len, reverse=True))
    char = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in sorted(known)) + "]"
    run = f"(?:(?!{whole}){char})+" if whole else f"{char}+"  # never into a user-defined piece
    unknown = char if proto.trainer_spec.byte_fallback else run
    return pre_tokenizers.Split(Regex(f"{whole}|{unknown}" if whole else unknown), behavior="isolated")


def _known_chars(proto: Any) -> set[str]:
    return {p.piece for p in proto.pieces if p.type in (NORMAL, USER_DEFINED) and len(p.piece) == 1}


def _decoder(proto: Any) -> Any:
    from tokenizers import decoders

    steps = [decoders.Replace("▁", " ")]
    if proto.trainer_spec.byte_fallback:
        steps.append(decoders.ByteFallback())
    steps.append(decoders.Fuse())
    if proto.normalizer_spec.add_dummy_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    return decoders.Sequence(steps)


def _added_tokens(proto: Any, tokenizer: SentencePieceTokenizer, kind: str) -> list[dict[str, Any]]:
    """The model's control pieces, or for Megatron's SentencePieceTokenizer its specials (some past
    the pieces, each stretch between them normalized apart as Megatron encodes it), as special
    tokens with their ids. Only the latter are matched in text: the tokenizer_config.json of the
    others sets split_special_tokens."""
    tokens = {i: p.piece for i, p in enumerate(proto.pieces) if p.type in (UNKNOWN, CONTROL)}
    if kind == "sentencepiece":
        tokens = {token_id: token for token, token_id in tokenizer.specials.items()}
    return [
        {
            "id": token_id,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token_id, token in sorted(tokens.items())
    ]


def _bos_first(token: str, token_id: int) -> dict[str, Any]:
    """Llama2Tokenizer's bos before every text (a pair: before each)."""
    bos = {"SpecialToken": {"id": token, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {token: {"id": token, "ids": [token_id], "tokens": [token]}},
    }


def sentencepiece_tokenizer_config(
    tokenizer: SentencePieceTokenizer, kind: str, context: int, token_ids: dict[str, Any]
) -> dict[str, Any]:
    """tokenizer_config.json: the bos/eos/pad the configs give by their ids, <unk>, and
    split_special_tokens where the run kept their text as text (all kinds but SentencePieceTokenizer)."""
    names = {i: t for t, i in tokenizer.specials.items()}
    processor = tokenizer.processor
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context}
    for name in ("bos", "eos", "pad"):
        token_id = token_ids.get(f"{name}_token_id")
        if isinstance(token_id, list):
            token_id = token_id[0] if token_id else None
        if token_id is not None:
            config[f"{name}_token"] = names.get(token_id) or processor.id_to_piece(token_id)
    if kind != "sentencepiece":
        config["unk_token"] = processor.id_to_piece(processor.unk_id())
        config["split_special_tokens"] = True
    return config


def sentencepiece_problem(tokenizer: SentencePieceTokenizer) -> str | None:
    """What keeps the run's tokenizer.model from export as a tokenizer.json (None: nothing)."""
    return unexportable(load_proto(tokenizer.source))


def unigram_rounding_note(tokenizer: SentencePieceTokenizer) -> str | None:
    """The one difference left for a Unigram model (None for BPE): a text whose best segmentations
    are the same pieces in another order ('www' as w + ww or ww + w) has them score exactly alike,
    and sentencepiece and `tokenizers` break that tie each their own way. Measured (7000 snippets):
    0.3-0.8% of mixed text, up to 1% of code (20 in 2000) where runs of spaces are kept."""
    if load_proto(tokenizer.source).trainer_spec.model_type != UNIGRAM:
        return None
    return (
        f"{tokenizer.source} is a Unigram model: where two segmentations are the same pieces in another "
        "order (a run like 'www' as w + ww or ww + w), their scores tie exactly and transformers may pick "
        "the other one, so such a text gets other ids (measured: under 1% of texts, up to 1% of code "
        "snippets for a model keeping runs of spaces)"
    )


def write_sentencepiece_files(
    tokenizer: SentencePieceTokenizer, kind: str, output: Path, context: int, token_ids: dict[str, Any]
) -> list[str]:
    """tokenizer.json and tokenizer_config.json in `output` (and the tokenizer.model, for tools that
    read SentencePiece itself); the names written."""
    model = tokenizer.source
    (output / "tokenizer.json").write_text(
        sentencepiece_tokenizer_json(model, tokenizer, kind), encoding="utf-8"
    )
    config = sentencepiece_tokenizer_config(tokenizer, kind, context, token_ids)
    (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    shutil.copyfile(model, output / "tokenizer.model")
    return ["tokenizer.json", "tokenizer_config.json", "tokenizer.model"]
