"""Every use of the transformers package goes through here: an optional extra, imported late."""

from __future__ import annotations

import traceback
from contextlib import suppress
from pathlib import Path
from typing import Any

from gptrain.errors import GptrainError
from gptrain.utils.quiet_imports import import_torchao_quietly

INSTALL_HINT = "pip install 'gptrain[hf]'"


class MissingTransformersError(GptrainError):
    """transformers is not installed."""


def require_transformers() -> Any:
    with suppress(ImportError):  # transformers imports torchao (if installed) when it builds a model
        import_torchao_quietly()
    try:
        import transformers
    except ImportError:
        raise MissingTransformersError(
            f"Hugging Face export/import needs the transformers package: {INSTALL_HINT}"
        ) from None
    # gptrain prints its own progress and verdicts; transformers' bars and notices would bury them.
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def config_class(arch: str) -> Any:
    transformers = require_transformers()
    from gptrain.trained.hf.architectures import GPT2, STABLELM

    names = {GPT2: "GPT2Config", STABLELM: "StableLmConfig"}
    return getattr(transformers, names.get(arch, "LlamaConfig"))


def load_config(directory: Path) -> Any:
    """The transformers config of a local model directory (never the network)."""
    transformers = require_transformers()
    from gptrain.errors import DataError

    if not (directory / "config.json").is_file():
        raise DataError(f"{directory}: no config.json; pass a transformers model directory")
    try:
        return transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except Exception as error:  # it parses a local JSON file: whatever fails is the file's values
        message = " ".join(_cause(error).split())[:300]
        raise DataError(f"{directory}/config.json: transformers cannot read it ({message})") from None


def _cause(error: Exception) -> str:
    """The error's text; for another kind than those of a bad value (ValueError, KeyError, OSError,
    TypeError, huggingface_hub's StrictDataclassError for a field of the wrong type), its kind and
    the source line that raised it: a validator's `hidden_size % num_attention_heads` with 0 heads
    says only 'integer modulo by zero'."""
    if isinstance(error, (ValueError, KeyError, OSError, TypeError)) or any(
        kind.__name__ == "StrictDataclassError" for kind in type(error).__mro__
    ):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    where = (
        f", at '{frames[-1].line}' in {Path(frames[-1].filename).name}" if frames and frames[-1].line else ""
    )
    return f"{type(error).__name__}: {error}{where}"


def load_model(directory: Path, config_file: Path | None = None) -> Any:
    """The causal LM of a local directory in float32 on the CPU, eval mode; its config read from
    `config_file` when given (an export's config.json before it takes that name), else config.json."""
    import torch

    transformers = require_transformers()
    config = None
    if config_file is not None:
        config = transformers.AutoConfig.from_pretrained(str(config_file), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), config=config, dtype=torch.float32, local_files_only=True
    )
    return model.eval()
