"""`gptrain train training=gpt3/126m`, the launch's spelling, said "unknown key 'training'": it names
the preset as gptrain train takes it."""

import pytest

from gptrain.cli import main


@pytest.mark.parametrize("words", [["training=gpt3/126m"], ["trainer.max_steps=2", "training=gpt3/126m"]])
def test_the_launchers_training_choice_says_to_give_the_preset_first(words, capsys):
    assert main(["train", *words]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gptrain: error: override 'training=gpt3/126m' chooses the launcher's training group; "
        "gptrain train takes the preset as its first word: gptrain train gpt3/126m\n"
    )
