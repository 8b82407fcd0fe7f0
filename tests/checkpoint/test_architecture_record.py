"""The architecture record of a checkpoint: settings as the model computes with them, compared by key."""

from gptrain.checkpoint.architecture import changes, record
from gptrain.models.config import GPTConfig


def config(**settings) -> GPTConfig:
    return GPTConfig(
        vocab_size=128, seq_length=8, num_layers=1, hidden_size=16, num_attention_heads=2, **settings
    )


def test_spellings_of_one_function_are_one_record():
    assert record(config(activation="fast-swiglu")) == record(config(activation="swiglu"))
    assert record(config()) == record(config(num_query_groups=2, kv_channels=8, ffn_hidden_size=64))


def test_rope_settings_count_only_with_rope():
    assert changes(record(config()), record(config(rotary_base=500000))) == []
    rope = record(config(position_embedding_type="rope"))
    assert changes(rope, record(config(position_embedding_type="rope", rotary_base=500000))) == [
        "model.rotary_base 10000 -> 500000"
    ]


def test_settings_a_resume_may_change_are_not_recorded():
    assert record(config()) == record(
        config(hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.01, max_position_embeddings=64)
    )


def test_a_key_one_record_lacks_is_not_compared_and_a_bool_is_not_a_number():
    saved = record(config())
    assert changes(None, saved) == [] and changes({"model.num_layers": 1}, saved) == []
    assert changes({"model.bias": 1}, {"model.bias": True}) == ["model.bias 1 -> true"]
    assert changes({"model.rotary_percentage": 1}, {"model.rotary_percentage": 1.0}) == []


def test_a_checkpoint_of_the_erf_gelu_names_the_key_that_keeps_it():
    """A run of a GELU preset saved before gptrain honoured bias_activation_fusion (erf) resumes under the
    fused tanh GELU: "set the old values" alone would send the user to openai_gelu=false, which the
    fusion overrides, so the line names model.bias_activation_fusion=false."""
    (line,) = changes(record(config()), record(config(openai_gelu=True)))
    assert line.startswith("model.openai_gelu false -> true") and "model.bias_activation_fusion=false" in line
    assert changes(record(config(openai_gelu=True)), record(config())) == ["model.openai_gelu true -> false"]
