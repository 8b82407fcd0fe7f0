"""docs/migrating.md lists every Megatron flag and NeMo key gptrain knows, and those of the upstream files."""

from pathlib import Path

import yaml

from gptrain.config.build import all_keys
from gptrain.config.loader import DROPPED_TOP_KEYS
from gptrain.config.nemo_keys import IGNORED_NEMO_KEYS, IGNORED_NEMO_PREFIXES
from gptrain.megatron.defaults import MEGATRON_DEFAULTS
from gptrain.megatron.flags import NO_EFFECT, REFUSED, SPECIAL, SWITCH, VALUE

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "migrating.md").read_text()


def test_every_megatron_flag_is_in_the_table():
    for flag in [*VALUE, *SWITCH, *NO_EFFECT, *REFUSED, *SPECIAL]:
        assert f"| `{flag}`" in DOC, flag


def test_the_defaults_table_is_megatron_defaults_as_gptrain_megatron_applies_them():
    """The table a user reads to learn what an absent flag means: every default, with its value, and
    no row the code does not apply (save_top_k=-1, Megatron keeping every checkpoint, was missing)."""
    header = "| gptrain key | Megatron default |\n|---|---|\n"
    rows = DOC.split(header, 1)[1].split("\n\n", 1)[0].splitlines()
    documented = {row.split("`")[1]: row.split("|")[2].strip() for row in rows}
    assert sorted(documented) == sorted(MEGATRON_DEFAULTS)
    for key, value in MEGATRON_DEFAULTS.items():
        assert documented[key].startswith(f"`{value}`"), (key, documented[key])


def test_every_nemo_key_of_gptrain_and_of_the_upstream_126m_files_is_in_the_table():
    for key in [*all_keys(), *IGNORED_NEMO_KEYS]:
        assert f"| `{key}` |" in DOC, key

    def leaves(data, prefix=""):
        for key, value in data.items():
            dotted = f"{prefix}{key}"
            if (
                isinstance(value, dict)
                and value
                and not any(f"{dotted}.".startswith(p) for p in IGNORED_NEMO_PREFIXES)
            ):
                yield from leaves(value, f"{dotted}.")
            else:
                yield dotted

    trees = ROOT / "tests" / "config" / "nemo_launcher"
    nemo_own = ROOT / "tests" / "config" / "nemo_training" / "megatron_gpt_config.yaml"
    for path in [*trees.glob("*/launcher_scripts/conf/training/gpt3/126m.yaml"), nemo_own]:
        for key in leaves(yaml.safe_load(path.read_text())):
            if key.split(".")[0] in DROPPED_TOP_KEYS:  # Hydra's own keys, dropped on load
                continue
            documented = f"| `{key}` |" in DOC or any(f"{key}.".startswith(p) for p in IGNORED_NEMO_PREFIXES)
            assert documented, (path, key)


def test_each_value_flags_row_names_the_key_the_flag_sets():
    """The --log-interval row said trainer.exit_interval (a row of the NeMo-key table, put in the
    flag table), telling users their log interval would stop the run; the flag sets
    trainer.log_every_n_steps."""
    for flag, (keys, _) in VALUE.items():
        row = next(line for line in DOC.splitlines() if line.startswith(f"| `{flag}`"))
        assert any(f"`{key}`" in row.split("|")[2] for key in keys), (flag, keys, row)


def test_the_ignored_checkpoint_keys_rows_say_where_checkpoints_go_as_gptrain_says_it():
    """The rows said checkpoints go to explicit_log_dir/checkpoints after dirpath was honoured."""
    from gptrain.config.nemo_keys import _CKPT, _WANDB_MODEL

    rows = [
        line
        for line in DOC.splitlines()
        if "gptrain writes DCP checkpoints" in line or "gptrain keeps them" in line
    ]
    assert len(rows) == 20 and all(_CKPT in row or _WANDB_MODEL in row for row in rows)
