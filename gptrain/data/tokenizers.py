"""Tokenizers for data preparation, training and generation (no torch).

GPT-2 BPE (`vocab.json` + `merges.txt`) runs on tiktoken, whose Rust BPE is several
times faster than HF `tokenizers`: the byte-level vocab maps one to one onto tiktoken's
byte ranks whenever merge results have increasing ids in merge order (true for GPT-2 and
its derivatives); otherwise the exact HF `tokenizers` BPE is used. Like Megatron (whose
GPT2BPETokenizer is HF's fast GPT-2 tokenizer since core 0.15), a literal "<|endoftext|>" in the
text becomes the single end-of-document id; with `legacy` (its --legacy-tokenizer, and the default
up to core 0.14) it stays ordinary text. A SentencePiece `tokenizer.model` is read by the
`sentencepiece` package (an optional dependency, imported only when one is built).

build_tokenizer here picks the loader: gpt2_bpe.py, tokenizer_loaders.py (tokenizer.model,
tokenizer.json, tiktoken encodings) or tiktoken_file.py; the classes are in tokenizer_wrappers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gptrain.data.gpt2_bpe import load_gpt2_bpe
from gptrain.data.null_tokenizer import NullOptions, build_null_tokenizer
from gptrain.data.tiktoken_file import TiktokenFileOptions, load_tiktoken_file
from gptrain.data.tokenizer_args import canonical_type
from gptrain.data.tokenizer_loaders import load_huggingface, load_sentencepiece, load_tiktoken
from gptrain.data.tokenizer_wrappers import Tokenizer
from gptrain.errors import ConfigError, DataError
from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import is_tiktoken_vocabulary_file as is_vocabulary_file

SENTENCEPIECE_KINDS = ("sentencepiece", "gptsentencepiece", "llama2")


def drops_runs_of_spaces(tokenizer_type: str, model: str | None) -> bool:
    """Whether the SentencePiece model of `tokenizer_type` folds a run of spaces into one in its
    normalizer (sentencepiece's default), tested as Megatron's wrapper tests it."""
    processor = build_tokenizer(tokenizer_type, model=model).processor  # type: ignore[attr-defined]
    return bool(processor.encode_as_pieces("x  y") == processor.encode_as_pieces("x y"))


def _is_directory(model: str) -> bool:
    """Whether --tokenizer-model names a directory (of a GPT-2 vocab.json and merges.txt); one the
    user may not look up is a DataError (Path.is_dir raised PermissionError there)."""
    found = look_up(model)
    if found.kind == "unreachable":
        raise DataError(
            f"tokenizer model {model} {found.why} (pass --vocab-file and --merge-file, or their directory)"
        )
    return found.kind == "directory"


def build_tokenizer(
    tokenizer_type: str,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    model: str | None = None,
    tiktoken: TiktokenFileOptions | None = None,
    legacy: bool = False,
    null: NullOptions | None = None,
) -> Tokenizer:
    """Build a tokenizer by its NeMo/Megatron type name (aliases: gpt2bpe, huggingface, tiktoken, llama2);
    `tiktoken` is read only for TikTokenizer with a vocabulary file (Megatron's); `legacy` (Megatron's
    --legacy-tokenizer) only for GPT-2 BPE, the one type whose legacy ids gptrain's others do not already
    give; `null` only for NullTokenizer, which reads no files."""
    kind = canonical_type(tokenizer_type)
    if kind == "null":
        return build_null_tokenizer(null)
    if kind == "gpt2":
        if vocab_file is None and merge_file is None and model and _is_directory(model):
            vocab_file, merge_file = str(Path(model) / "vocab.json"), str(Path(model) / "merges.txt")
        if not vocab_file or not merge_file:
            raise ConfigError("GPT2BPETokenizer needs --vocab-file vocab.json and --merge-file merges.txt")
        return load_gpt2_bpe(vocab_file, merge_file, legacy=legacy)
    if not model:
        examples = {
            "huggingface": "path/to/tokenizer.json",
            "tiktoken": "Megatron's tiktoken vocabulary path/to/tokenizer.json, or an encoding name such as cl100k_base",
        }
        example = examples.get(kind, "path/to/tokenizer.model")
        raise ConfigError(f"{tokenizer_type} needs --tokenizer-model ({example})")
    if kind in SENTENCEPIECE_KINDS:
        return load_sentencepiece(model, kind)
    if kind == "huggingface":
        return load_huggingface(model)
    if is_vocabulary_file(model):
        return load_tiktoken_file(model, tiktoken)
    if tiktoken is not None and (given := tiktoken.settings_given()):
        raise ConfigError(
            f"{', '.join(given)}: read only with Megatron's tiktoken vocabulary file; the tiktoken encoding "
            f"{model!r} has its own split, vocabulary and special tokens: drop the setting"
        )
    return load_tiktoken(model)


@dataclass(frozen=True)
class TokenizerSpec:
    """What a worker process needs to build the same tokenizer (picklable)."""

    tokenizer_type: str
    vocab_file: str | None = None
    merge_file: str | None = None
    model: str | None = None
    tiktoken: TiktokenFileOptions | None = None
    legacy: bool = False
    """Megatron's --legacy-tokenizer: GPT-2 BPE keeps a literal <|endoftext|> as text."""
    null: NullOptions | None = None
    """NullTokenizer's --vocab-size and ids (text of ids, as Megatron's preprocess_data.py reads it)."""

    def files(self) -> list[str]:
        """The files it is read from (a tiktoken encoding: its name), as its loader picks them."""
        if canonical_type(self.tokenizer_type) != "gpt2":
            return [self.model] if self.model else []
        if self.vocab_file is None and self.merge_file is None and self.model:
            return [str(Path(self.model) / "vocab.json"), str(Path(self.model) / "merges.txt")]
        return [file for file in (self.vocab_file, self.merge_file) if file]

    def build(self) -> Tokenizer:
        return build_tokenizer(
            self.tokenizer_type,
            self.vocab_file,
            self.merge_file,
            self.model,
            self.tiktoken,
            self.legacy,
            self.null,
        )
