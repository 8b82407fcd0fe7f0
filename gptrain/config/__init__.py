"""Typed training config with NeMo key names; YAML presets and dotted overrides. No torch."""

from gptrain.config.build import all_keys
from gptrain.config.loader import list_presets, load_training_config, preset_path
from gptrain.config.schema import TrainingConfig

__all__ = ["TrainingConfig", "all_keys", "list_presets", "load_training_config", "preset_path"]
