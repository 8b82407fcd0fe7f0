"""Plain scalars (`0x10`, `1e-4`, `~`, `yes`, `1_000`, `017`, `.inf`) read as NeMo reads them.

In a YAML file the reference is OmegaConf's own loader (NeMo loads its configs with it), except
base-60 numbers (`10:00:00` stays a string, docs/migrating.md).
"""

import itertools
import math
import re

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf._yaml import get_yaml_loader
from omegaconf.errors import ValidationError
from omegaconf.nodes import BooleanNode, IntegerNode

from gptrain.config import load_training_config
from gptrain.config.yamlio import ConfigLoader, as_int, as_switch, load_text, parse_value
from gptrain.errors import ConfigError
from gptrain.launch.compose import parse_overrides
from gptrain.megatron.translate import translate

# every scalar of up to four of these characters: digits, signs, dots, exponents, underscores, prefixes
ALPHABET = "01_.e-+xbo"
SCALARS = ["".join(chars) for size in range(1, 5) for chars in itertools.product(ALPHABET, repeat=size)]
NAMED = ["0x10", "1e-4", "1E+4", "~", "null", "Null", "NULL", "yes", "No", "on", "OFF", "1_000", "017",
         "0o17", "08", ".inf", "-.Inf", ".NaN", "1.5e3", ".5e3", "1__0e3", "._5", "2024-01-05", "True"]  # fmt: skip


def _read(text: str, loader: type) -> tuple[str, object]:
    try:
        value = yaml.load(f"k: {text}\n", Loader=loader)["k"]  # noqa: S506 (SafeLoader subclasses)
    except (yaml.YAMLError, ValueError) as error:
        return ("error", type(error).__name__)
    return (type(value).__name__, "nan" if isinstance(value, float) and math.isnan(value) else value)


def test_a_file_reads_every_scalar_as_omegaconf_does():
    omegaconf_loader = get_yaml_loader()
    differ = {}
    for text in SCALARS + NAMED:
        ours, theirs = _read(text, ConfigLoader), _read(text, omegaconf_loader)
        if ours != theirs and theirs != ("error", "ValueError"):
            differ[text] = (ours, theirs)
    assert differ == {}


@pytest.mark.parametrize(
    "text", ["k:\n  a: 5\t# note\n", "k:\n  a:\t5\n", "k: [1,\t2]\n", "k:\n\ta: 5\n", "k:\n  a: 5\n\t\n"]
)
def test_tabs_read_as_omegaconfs_loader_reads_them(text):
    """OmegaConf parses with libyaml, which takes a tab after a colon or before a comment; the pure-Python
    parser refused both ("found character '\\t' that cannot start any token"), refusing NeMo's files."""
    try:
        theirs = yaml.load(text, Loader=get_yaml_loader())  # noqa: S506 (OmegaConf's SafeLoader)
    except yaml.YAMLError:
        with pytest.raises(ConfigError, match=r"^c\.yaml:[23]: invalid YAML: .*tab") as error:
            load_text(text, "c.yaml")
        assert "\n" not in str(error.value)
        return
    assert load_text(text, "c.yaml") == theirs


@pytest.mark.parametrize("text", ["0x_", "-0b_", "!!float abc", "!!int 1.5"])
def test_a_number_without_digits_is_one_line_naming_the_line(text):
    # OmegaConf's loader (and gptrain's before) stopped with a ValueError traceback
    with pytest.raises(ConfigError, match=r"^c\.yaml:2: invalid YAML: '.+' is not a valid (int|float)"):
        load_text(f"a: 1\nb: {text}\n", "c.yaml")


def test_a_string_field_takes_what_omegaconf_leaves_a_string(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  name: .5e3\n")
    cfg = load_training_config(config_file=str(path), overrides=["model.data.data_impl=mock",
                                                                 "model.data.mock_vocab_size=64"])  # fmt: skip
    assert cfg.run.name == ".5e3"


# (override value, Hydra's reading: hydra/grammar/OverrideLexer.g4 of Hydra 1.1-1.3, which NeMo uses):
# one INT, FLOAT, BOOL or NULL token is typed, any other value is its text
HYDRA = [("2", 2), ("-0", 0), ("+5", 5), ("1_000", 1000), ("1__000", "1__000"), ("0x10", "0x10"),
         ("0b101", "0b101"), ("0o17", "0o17"), ("017", "017"), ("1e-4", 1e-4), ("1e-05", 1e-5), ("1E4", 1e4),
         (".5", 0.5), ("-.5", -0.5), ("1.", 1.0), ("1_0.5", 10.5), ("-INF", -math.inf), ("NaN", math.nan), (".inf", ".inf"),
         ("TrUe", True), ("FALSE", False), ("nUll", None), ("NULL", None), ("yes", "yes"), ("Off", "Off"),
         ("a: b", "a: b"), ("- a", "- a"), ("10:00:00", "10:00:00"), ("2024-01-05", "2024-01-05"),
         ("[0x10, TRUE]", ["0x10", True])]  # fmt: skip


# Quoted values, Hydra 1.2+ (OverrideLexer.g4's QUOTED_VALUE examples, overrides_visitor._unescape_quoted_string):
# backslashes before the value's own quote are halved (before: kept, so 'It\'s' was It\'s), others are text
HYDRA += [(r"'It\'s'", "It's"), (r'"say \"hi\""', 'say "hi"'), (r"'C:\\'", "C:\\"), (r"'a\b'", r"a\b"),
          (r'"abc\\\"def\\\'ghi\\\\"', r"abc\"def\\\'ghi\\"), (r'"it\'s"', r"it\'s"), ("''", ""),
          (r"[a,'b\',c',d]", ["a", "b',c", "d"])]  # fmt: skip


@pytest.mark.parametrize(("text", "value"), HYDRA)
def test_an_override_value_reads_as_hydra_reads_it(text, value):
    read = parse_value(text)
    assert (read == value or read != read and value != value) and type(read) is type(value)


@pytest.mark.parametrize("value", [r"'a\'", r'"a\"', r"'C:\dir\'", "'a'b'", r"[x,'b\']"])
def test_a_quoted_override_whose_closing_quote_is_escaped_is_refused_as_hydra_refuses_it(value):
    """Hydra's QUOTED_VALUE ends only at a quote after an even number of backslashes: `'a\'` has no
    end, and Hydra refuses it. gptrain read it as `a'` (a path with a quote in it), in train and launch."""
    override = f"run.name={value}"
    with pytest.raises(ConfigError, match=rf"^override '{re.escape(override)}': .+ is not one quoted value"):
        load_training_config("gpt3/126m", [override], report_ignored=False)
    with pytest.raises(
        ConfigError, match=rf"^override 'training.{re.escape(override)}': .+ is not one quoted"
    ):
        parse_overrides([f"training.{override}"])


def test_a_backslash_in_single_quotes_reads_as_omegaconf_reads_it_in_a_file_and_hydra_on_the_command_line():
    """In a YAML file `'a\'` is a and a backslash (single quotes escape nothing, OmegaConf's loader
    agrees); on the command line a backslash escapes the quote, `'a\\'` is that value."""
    assert load_text("k: 'a\\'\n", "f.yaml")["k"] == OmegaConf.create("k: 'a\\'\n")["k"] == "a\\"
    assert parse_value(r"'a\\'") == "a\\"


def test_a_tilde_inside_quotes_after_an_escaped_quote_is_text():
    """`['x\',~/y']` is one quoted item, x',~/y: the `~` check stopped its quotes at the escaped one,
    and refused the `~` as one the shell had left."""
    override = r"model.data.data_prefix=['x\',~/y']"
    cfg = load_training_config("gpt3/126m", [override], report_ignored=False)
    assert cfg.model.data.data_prefix == ["x',~/y"]
    [parsed] = parse_overrides([f"training.{override}"])
    assert parsed.value == ["x',~/y"]


def test_an_override_that_yaml_would_read_as_a_number_keeps_its_text(tmp_path):
    # before: the run went to <base_results_dir>/16, and `tRUE` was refused for a switch
    cfg = load_training_config("gpt3/126m", ["run.name=0x10", "base_results_dir=/r", "model.data.mock_dataset=tRUE"],
                               report_ignored=False)  # fmt: skip
    assert cfg.run.results_dir == "/r/0x10" and cfg.model.data.mock_dataset is True


@pytest.mark.parametrize(
    "override",
    [
        "model.tokenizer.vocab_file=~/gpt2/vocab.json",
        "model.kv_channels=~",
        "model.data.data_prefix=[1,~/d/a]",
        "model.tokenizer.vocab_file=str(~/gpt2/vocab.json)",
        "model.data.data_prefix=[1,str( ~/d/a)]",
    ],
)
def test_a_tilde_the_shell_left_is_one_line_not_a_path_or_null(override):
    # before: the literal path `~/gpt2/vocab.json`, missing on every node, or YAML's null (Hydra refuses both);
    # inside a cast (`str(~/x)`) it passed, and the job got the path unexpanded
    with pytest.raises(
        ConfigError, match=rf"^override '{re.escape(override)}': the shell did not expand this '~'"
    ):
        load_training_config("gpt3/126m", [override], report_ignored=False)
    with pytest.raises(ConfigError, match="write the path in full"):
        parse_overrides([f"training.{override}"])


def test_a_tilde_after_a_colon_outside_braces_is_text_and_hydras_own_settings_are_ignored(capsys):
    """`host:~/x` is no mapping (only `{key: ~}` is), and `hydra.run.dir=~/x` is Hydra's own
    setting, ignored with the others: both were refused as a '~' the shell left."""
    cfg = load_training_config("gpt3/126m", ["run.name=a:~b"], report_ignored=False)
    assert cfg.run.name == "a:~b"
    load_training_config("gpt3/126m", ["hydra.run.dir=~/x"])
    assert "ignoring hydra.run.dir=~/x" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="the shell did not expand this '~'"):
        load_training_config("gpt3/126m", ["+model.extra={a: ~}"], report_ignored=False)


def test_a_quoted_tilde_is_the_text():
    cfg = load_training_config("gpt3/126m", ["run.name='~x'"], report_ignored=False)
    assert cfg.run.name == "~x"


def test_megatron_paths_with_a_tilde_stay_literal_as_megatron_takes_them():
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
    flags += " --train-iters 4 --mock-data --vocab-size 64 --lr 1e-4 --eval-interval 2 --save ~/ckpt --save-interval 2"
    cfg = load_training_config(None, translate(flags.split(), {}).overrides, report_ignored=False)
    assert cfg.exp_manager.explicit_log_dir == "~/ckpt"


def _omegaconf_field(node: type, value: object) -> object:
    """What OmegaConf's typed config (NeMo's exp_manager, a structured config's field) makes of `value`."""
    try:
        return node(value)._value()
    except ValidationError:
        return "error"


TEXTS = SCALARS + NAMED + [" 2", "2 ", "٣", "+0", "-0", "2.5", "2.0", "", "1" * 5000]


def test_an_int_field_takes_the_text_omegaconf_reads_as_an_int():
    differ = {}
    for text in TEXTS:
        ours = as_int(text)
        theirs = _omegaconf_field(IntegerNode, text)
        if (ours if ours is not None else "error") != theirs:
            differ[text] = (ours, theirs)
    assert differ == {}


def test_a_number_from_the_environment_fills_an_int_field(monkeypatch):
    # before: "'trainer.max_steps' expects int, got '7'" (${oc.env:...} always resolves to text)
    monkeypatch.setenv("STEPS", "7")
    monkeypatch.delenv("NO_SUCH_VARIABLE", raising=False)
    for override, steps in (("${oc.env:STEPS}", 7), ("${oc.env:NO_SUCH_VARIABLE,100}", 100)):
        cfg = load_training_config("gpt3/126m", [f"trainer.max_steps={override}"], report_ignored=False)
        assert cfg.trainer.max_steps == steps and type(cfg.trainer.max_steps) is int
    monkeypatch.setenv("STEPS", "2.5")  # OmegaConf refuses it for an int field: so do we, in one line
    with pytest.raises(ConfigError, match=r"^override '.+': 'trainer.max_steps' expects int, got '2.5'$"):
        load_training_config("gpt3/126m", ["trainer.max_steps=${oc.env:STEPS}"], report_ignored=False)


def test_a_bool_field_takes_what_omegaconf_reads_as_a_bool():
    differ = {}
    words = ["yes", "Y", "oN", "TRUE", "no", "n", "OFF", "False", " yes", "t", "f", "1.0", "nope"]
    for value in [*TEXTS, *words, 0, 1, 2, -1, 0.0, 1.0, True, False, [1]]:
        ours = as_switch(value)
        theirs = _omegaconf_field(BooleanNode, value)
        if (ours if ours is not None else "error") != theirs:
            differ[repr(value)] = (ours, theirs)
    assert differ == {}


@pytest.mark.parametrize(
    ("override", "key", "count"),
    [
        ("trainer.max_steps=1e3", "max_steps", 1000),
        ("trainer.max_steps=2.0", "max_steps", 2),
        ("trainer.limit_val_batches=32.0", "limit_val_batches", 32),  # Lightning: a whole float > 1 counts
        ("trainer.limit_val_batches=0.0", "limit_val_batches", 0),
    ],
)
def test_a_whole_float_in_an_int_field_is_its_whole_number_in_train_and_launch(override, key, count):
    """NeMo's configs are untyped DictConfigs that hand `2.0` to Lightning, which counts with it, and a
    launch before 2026-11-28 wrote `max_steps: 1000.0` into the run's config, which its requeue reads
    again: refusing the float broke both. The launcher keeps the int, so no script says `--nodes=2.0`."""
    from gptrain.launch.key_types import count as launch_count

    cfg = load_training_config("gpt3/126m", [override], report_ignored=False)
    assert getattr(cfg.trainer, key) == count and type(getattr(cfg.trainer, key)) is int
    kept = launch_count("training.trainer.devices", 2.0)
    assert kept == 2 and type(kept) is int
    with pytest.raises(ConfigError, match=r"expected a whole number, got 2\.5"):
        launch_count("training.trainer.devices", 2.5)


@pytest.mark.parametrize(
    ("text", "read"),
    [("2024_11_29", 20241129), ("0123", 83), ("0x10", 16), ("+7", 7), ("0b11", 3), ("!!int 0123", 83)],
)
def test_a_name_yaml_reads_as_a_number_of_other_digits_is_refused_at_its_line(text, read):
    """YAML 1.1 reads `2024_11_29` as 20241129 and `0123` as octal 83: `run.name: 2024_11_29` made
    the run directory 20241129 (results_dir ends in run.name). A name or path key whose int is not
    spelled as written is one line at its line, saying to quote it; an int spelled as written
    (`2024`), a quoted one and other keys' ints (`max_steps: 1_000`) are read as before."""
    with pytest.raises(ConfigError) as error:
        load_text(f"run:\n  time_limit: 10\n  name: {text}\n", "conf/training/x.yaml")
    shown = text.removeprefix("!!int ")
    assert str(error.value) == (
        f"conf/training/x.yaml:3: name: {shown} is read as the number {read} (YAML drops `_` and a sign,"
        " reads a leading 0 as octal, 0x as hex), which names another path than the one written;"
        f" quote it: name: '{shown}'"
    )
    assert load_text("run:\n  name: 2024\n  results_dir: '0123'\nmax_steps: 1_000\n", "x.yaml") == {
        "run": {"name": 2024, "results_dir": "0123"},
        "max_steps": 1000,
    }


@pytest.mark.parametrize("key", ["training.run.name", "base_results_dir", "data_preparation.output_dir"])
def test_a_name_override_hydra_reads_as_a_number_of_other_digits_is_refused(key):
    """Hydra reads `2024_11_29` and `+7` as the ints 20241129 and 7: refused for a name or path key,
    as in a file; `2024` and other keys' `1_000` are kept."""
    with pytest.raises(ConfigError) as error:
        parse_overrides([f"{key}=2024_11_29"])
    assert str(error.value) == (
        f"override '{key}=2024_11_29': 2024_11_29 is read as the number 20241129"
        " (Hydra drops `_` and a sign), which names another path than the one written; quote it:"
        f" \"{key}='2024_11_29'\""
    )
    assert [o.value for o in parse_overrides([f"{key}=2024", "training.trainer.max_steps=1_000"])] == [
        2024,
        1000,
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [("str(126)", "126"), ("str(true)", "true"), ("str(1.5)", "1.5"), ("int(5.0)", 5), ("int('7')", 7),
     ("float(2)", 2.0), ("bool(0)", False), ("bool(true)", True), ("[str(1),int(2.0)]", ["1", 2]),
     ("'str(126)'", "str(126)"), ("gpt(test)", "gpt(test)")],
)  # fmt: skip
def test_hydras_casts_in_an_override_convert_the_value(text, value):
    """`training.run.name=str(126)` named the run `str(126)` where Hydra names it 126; `int(5.0)` in
    an int key was refused. A quoted call, or a name Hydra has no function for, stays the text."""
    read = parse_value(text)
    assert read == value and type(read) is type(value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("str(a)(b)", "str(a)(b)"), ("str(a)_str(b)", "str(a)_str(b)"), ("int(1)x", "int(1)x"),
     ("choice(a)(b)", "choice(a)(b)"), ("str((a))", "(a)"), ("str('a)b')", "a)b")],
)  # fmt: skip
def test_a_value_is_a_hydra_call_only_when_the_first_parenthesis_closes_at_its_end(text, value):
    """The cast's pattern took the text up to the last `)`: `str(a)(b)` read as str("a)(b") gave
    'a)(b'. A value is a call only when the parenthesis the name opens closes last; otherwise it is
    the text as typed, as before casts were read (Hydra's grammar refuses it; gptrain keeps such a
    name, as `/data/run(1)`)."""
    read = parse_value(text)
    assert read == value and type(read) is type(value)


@pytest.mark.parametrize("function", ["choice(1,2)", "range(1,4)", "interval(0,1)", "glob(*)", "tag(a,1)"])
def test_a_hydra_sweep_in_an_override_is_refused_not_taken_as_text(function):
    """`training.run.name=choice(a,b)` named the run `choice(a,b)` (an int key said "expects int");
    Hydra refuses a sweep without --multirun, which gptrain has no counterpart of."""
    [override] = [f"training.run.name={function}"]
    name = function.partition("(")[0]
    with pytest.raises(ConfigError) as error:
        parse_overrides([override])
    assert str(error.value) == (
        f"override '{override}': {function} is Hydra's {name} sweep, which runs one job per value"
        " under --multirun; gptrain composes one config: launch once per value"
    )


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("extend_list(--label)", "extend_list(--label) appends to the list there in Hydra; gptrain does not: give"
         " the whole list, [a,b,...]"),
        ("sort([3,1])", "sort([3,1]): Hydra's sort() is not read here; give the values in the order to use"),
        ("int(abc)", "int(abc): cannot cast 'abc' with int()"),
    ],
)  # fmt: skip
def test_hydras_other_functions_are_refused_in_one_line(function, message):
    """Taken as text, `cluster.srun_args=extend_list(--label)` gave srun the word
    `extend_list(--label)`; a rendered Megatron value of that form is quoted, so it stays text."""
    from gptrain.megatron.translation import render

    with pytest.raises(ConfigError) as error:
        parse_overrides([f"cluster.srun_args={function}"])
    assert str(error.value) == f"override 'cluster.srun_args={function}': {message}"
    assert render(function) in (f"'{function}'", f'"{function}"')
    assert render("str(5)") == "'str(5)'"
