"""The tokenizer files that travel with a converted model, both directions (no torch).

Export: GPT-2 BPE runs ship their vocab.json + merges.txt, the same as a
tokenizer.json, and a tokenizer_config.json naming `GPT2Tokenizer` and `<|endoftext|>`; Hugging Face tokenizer runs ship their tokenizer.json (and
its tokenizer_config.json / special_tokens_map.json when present). Import copies them into the
run directory and returns the `model.tokenizer.*` values that point at the copies.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gptrain.data.tokenizers import ENDOFTEXT, canonical_type, gpt2_tokenizer_json

HF_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")


def export_tokenizer(cfg: Any, output: Path, seq_length: int) -> list[str]:
    """Copy the run's tokenizer files into `output`; the names written (empty for mock data/tiktoken)."""
    tok = cfg.model.tokenizer
    kind = canonical_type(tok.type)
    if kind == "gpt2" and tok.vocab_file and tok.merge_file:
        shutil.copyfile(tok.vocab_file, output / "vocab.json")
        shutil.copyfile(tok.merge_file, output / "merges.txt")
        # tokenizer.json too: transformers' AutoTokenizer then needs no slow-to-fast conversion
        (output / "tokenizer.json").write_text(gpt2_tokenizer_json(tok.vocab_file, tok.merge_file))
        config = {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": ENDOFTEXT,
            "eos_token": ENDOFTEXT,
            "unk_token": ENDOFTEXT,
            "add_prefix_space": False,
            "model_max_length": seq_length,
        }
        (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return ["vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"]
    if kind == "huggingface" and tok.model:
        source = Path(tok.model)
        file = source / "tokenizer.json" if source.is_dir() else source
        shutil.copyfile(file, output / "tokenizer.json")
        extras = [name for name in HF_EXTRAS if (file.parent / name).is_file()]
        for name in extras:
            shutil.copyfile(file.parent / name, output / name)
        return ["tokenizer.json", *extras]
    return []


def import_tokenizer(hf_dir: Path, run_tokenizer_dir: Path, final_dir: Path) -> dict[str, Any] | None:
    """Copy `hf_dir`'s tokenizer into `run_tokenizer_dir`; `model.tokenizer` values naming `final_dir`.

    vocab.json + merges.txt (GPT-2 BPE, gptrain's fast path) win over tokenizer.json; None when
    the directory has neither.
    """
    if (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():
        run_tokenizer_dir.mkdir(parents=True, exist_ok=True)
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(hf_dir / name, run_tokenizer_dir / name)
        return {
            "type": "GPT2BPETokenizer",
            "vocab_file": str(final_dir / "vocab.json"),
            "merge_file": str(final_dir / "merges.txt"),
            "model": None,
        }
    if (hf_dir / "tokenizer.json").is_file():
        run_tokenizer_dir.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", *HF_EXTRAS):
            if (hf_dir / name).is_file():
                shutil.copyfile(hf_dir / name, run_tokenizer_dir / name)
        return {
            "type": "HuggingFaceTokenizer",
            "vocab_file": None,
            "merge_file": None,
            "model": str(final_dir),
        }
    return None
