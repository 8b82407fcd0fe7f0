"""NeMo's model.data.validation_drop_last is Megatron-core's drop_last_partial_validation_sequence
(megatron_gpt_model.py passes one as the other): false gives the validation split ceil rather than floor
samples, a padded last one, so its shuffle, and every validation sample, differ. gptrain builds the floor
only: the key was ignored as a dataloader option, and such a run validated on other samples than NeMo's."""

from __future__ import annotations

import pytest

from gptrain.config import load_training_config
from gptrain.errors import ConfigError


def test_validation_drop_last_true_is_nemos_default_and_accepted():
    cfg = load_training_config("gpt3/126m", ["model.data.validation_drop_last=true"])
    assert "model.data.validation_drop_last" in cfg.ignored_keys


def test_validation_drop_last_false_is_refused_naming_what_it_changes():
    with pytest.raises(ConfigError) as error:
        load_training_config("gpt3/126m", ["model.data.validation_drop_last=false"])
    text = str(error.value)
    assert (
        "'model.data.validation_drop_last: False' asks for the validation split's last partial sample" in text
    )
    assert "set it to True (NeMo's default) or leave it out" in text
    # NeMo's megatron_gpt_model.py also turns the validation dataloader's drop_last off and weights the
    # validation loss by tokens with it: the line named only the dataset's change.
    assert "its last partial global batch validated" in text
    assert "turns the validation dataloader's drop_last off and weights the validation loss by tokens" in text


def test_validation_drop_last_is_not_said_to_be_a_dataloader_option_that_does_not_apply():
    """Its reason, logged among the ignored keys, said 'these do not apply' of a key whose other value is refused."""
    from gptrain.config.nemo_keys import ignored_reason

    reason = ignored_reason("model.data.validation_drop_last")
    assert "do not apply" not in reason and "default true gptrain follows" in reason
