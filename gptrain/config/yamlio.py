"""YAML and command-line values read the way Hydra users expect, not the way YAML 1.1 does.

Two surprises of plain YAML are removed here, for config files and `key=value` overrides alike:
- `10:00:00` is a base-60 integer (36000) in YAML 1.1; Slurm reads `--time=36000` as 25 days.
  Colon-separated numbers stay strings (`time_limit: 10:00:00` is the time it looks like).
- `[0.5,${data_dir}/a,0.5,${data_dir}/b]` is not valid YAML (`{` opens a mapping); Hydra's
  override grammar reads it as a list of four items. So do we: a bracketed value is split at
  its top-level commas, and each item is read on its own.
Override values are otherwise typed as Hydra types them (`0x10` and `no` are text, `TrUe` is true),
file values as OmegaConf's loader reads them (`0x10` is 16, `no` is false, `1e-4` a float).

Only yaml is imported: this runs in `gptrain launch` on login nodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gptrain.errors import ConfigError, printable
from gptrain.utils.overrides import QUOTED, OverrideForm
from gptrain.utils.paths import look_up

_INT = re.compile(
    r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$""", re.X
)
# The floats OmegaConf's loader reads (NeMo's): YAML 1.1's, which need a dot and a signed exponent,
# and OmegaConf's additions, which take `1e-4` and `1.5e3`; base-60 floats are left out (see above).
_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""",
    re.X,
)


# Override values are typed as Hydra's override grammar types them (NeMo's scripts read their
# command lines with it), not as YAML: a value is an int, float, bool or null only when it is one
# such token, and is otherwise the text as typed: `0x10`, `0755`, `no`, `exp #2`, `a: b` are text.
_HYDRA_DIGITS = r"(?:0|[1-9](?:_?[0-9])*)"  # no leading zero; one `_` between digits
_HYDRA_POINT = rf"(?:{_HYDRA_DIGITS}\.|{_HYDRA_DIGITS}?\.[0-9](?:_?[0-9])*)"
_HYDRA_INT = re.compile(rf"[-+]?{_HYDRA_DIGITS}")
_HYDRA_FLOAT = re.compile(
    rf"[-+]?(?:{_HYDRA_POINT}|(?:{_HYDRA_DIGITS}|{_HYDRA_POINT})[eE][-+]?[0-9](?:_?[0-9])*|(?i:inf|nan))"
)


# OmegaConf parses with libyaml's CSafeLoader where PyYAML has it, which takes a tab between a value
# and its comment (`max_steps: 5\t# c`) or after a colon; the pure-Python parser refuses both, and
# refused NeMo files that NeMo reads.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# Keys whose value names a file or directory (a run's `name` ends its default results_dir): an int
# read from them must be spelled as written, as `2024_11_29` (20241129) and `0123` (83) are not.
NAME_KEYS = frozenset(
    ("name", "results_dir", "base_results_dir", "data_dir", "download_dir", "output_dir", "exclude_file",
     "wandb_api_key_file")
)  # fmt: skip
_RESPELLED = "which names another path than the one written; quote it"


class RespelledName(yaml.constructor.ConstructorError):
    """A name key's int whose digits are not the text written (NAME_KEYS)."""


class ConfigLoader(_SAFE_LOADER):  # type: ignore[misc,valid-type]
    """SafeLoader without YAML 1.1's sexagesimal numbers; `1e-4` is a float (as in OmegaConf), and
    a key given twice in one mapping is an error (as in OmegaConf), not silently the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_duplicate_keys(node)
        _refuse_respelled_names(self, node)
        return super().construct_mapping(node, deep=deep)


def _refuse_respelled_names(loader: ConfigLoader, node: yaml.MappingNode) -> None:
    for key_node, value_node in node.value:
        if not (isinstance(key_node, yaml.ScalarNode) and key_node.value in NAME_KEYS):
            continue
        if not isinstance(value_node, yaml.ScalarNode) or value_node.tag != "tag:yaml.org,2002:int":
            continue
        number = _number(loader, value_node, yaml.SafeLoader.construct_yaml_int)
        if str(number) != value_node.value:
            raise RespelledName(
                None,
                None,
                f"{key_node.value}: {value_node.value} is read as the number {number} (YAML drops `_` and a"
                f" sign, reads a leading 0 as octal, 0x as hex), {_RESPELLED}: {key_node.value}:"
                f" '{value_node.value}'",
                value_node.start_mark,
            )


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
    """`num_nodes: 1` ... `num_nodes: 2` in one mapping: an edit that left the old line behind.
    Keys a `<<: *base` merge brings in may be given again (that is what a merge is for)."""
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in first_line:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"'{key_node.value}' is given twice in one mapping (lines {first_line[key_node.value]} "
                f"and {line}): keep one",
                key_node.start_mark,
            )
        first_line[key_node.value] = line


def _number(loader: ConfigLoader, node: yaml.ScalarNode, construct: Any) -> Any:
    """An int or float, or a one-line error at its line where the text has no digits (`0x_`,
    `!!float abc`): PyYAML (and OmegaConf with it) would stop with a ValueError traceback."""
    try:
        return construct(loader, node)
    except ValueError:
        kind = node.tag.rpartition(":")[2]
        raise yaml.constructor.ConstructorError(
            None, None, f"'{node.value}' is not a valid {kind}; quote it for text", node.start_mark
        ) from None


ConfigLoader.add_constructor(
    "tag:yaml.org,2002:int", lambda loader, node: _number(loader, node, yaml.SafeLoader.construct_yaml_int)
)
ConfigLoader.add_constructor(
    "tag:yaml.org,2002:float",
    lambda loader, node: _number(loader, node, yaml.SafeLoader.construct_yaml_float),
)


ConfigLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        # a date stays the text it is (OmegaConf cannot hold a datetime: `name: 2024-01-05`)
        if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


class ConfigDumper(yaml.SafeDumper):
    """SafeDumper that quotes a string ConfigLoader would read as another type: PyYAML's own
    resolvers (YAML 1.1) write `1e3` and `1e-4` plain, which ConfigLoader and OmegaConf read back as
    floats, so a quoted `run.name='1e3'` reached the training as `1000.0`."""


ConfigDumper.yaml_implicit_resolvers = {
    first: [
        *yaml.SafeDumper.yaml_implicit_resolvers.get(first, []),
        *ConfigLoader.yaml_implicit_resolvers.get(first, []),
    ]
    for first in {*yaml.SafeDumper.yaml_implicit_resolvers, *ConfigLoader.yaml_implicit_resolvers}
}


def dump_config(data: Any) -> str:
    """YAML text of `data` that ConfigLoader reads back as the same values, in the given key order."""
    return yaml.dump(data, Dumper=ConfigDumper, sort_keys=False)


def load_text(text: str, where: str) -> Any:
    """Parse YAML text; a syntax error names `where` and the line."""
    try:
        data = yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = str(getattr(error, "problem", None) or error)
        hint = "" if "tab" in problem else _tab_hint(text, mark)
        invalid = "" if isinstance(error, RespelledName) else "invalid YAML: "
        raise ConfigError(f"{where}{line}: {invalid}{problem}{hint}") from None
    check_not_recursive(data, where)
    return data


def _tab_hint(text: str, mark: Any) -> str:
    """libyaml's refusal of a tab that indents a line names no tab ("found character that cannot
    start any token"): say so where the line is indented with one."""
    lines = text.splitlines()
    if mark is None or mark.line >= len(lines):
        return ""
    indent = lines[mark.line][: len(lines[mark.line]) - len(lines[mark.line].lstrip())]
    return "; the line is indented with a tab: YAML indents with spaces" if "\t" in indent else ""


def check_not_recursive(data: Any, where: str) -> None:
    """An alias inside its own anchor (`a: &x [*x]`) makes a value that contains itself;
    OmegaConf would recurse until the interpreter stops it. Shared aliases elsewhere are fine."""
    on_path: set[int] = set()

    def visit(node: Any, key: str) -> None:
        if not isinstance(node, dict | list):
            return
        if id(node) in on_path:
            raise ConfigError(
                f"{where}: '{key}' is an alias of a node that contains it (like a: &x [*x]);"
                " a config value cannot contain itself"
            )
        on_path.add(id(node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for sub, item in items:
            visit(item, f"{key}.{sub}" if key else str(sub))
        on_path.discard(id(node))

    visit(data, "")


def read_config_text(path: str | Path) -> str:
    """The text of a config file; a missing, unreadable or non-UTF-8 file is a one-line ConfigError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; give the YAML file in it") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start});"
            " save the file as UTF-8"
        ) from None
    except OSError as error:
        if (found := look_up(path)).kind == "unreachable":  # not the file's own permissions: a directory's
            raise ConfigError(f"{path}: {found.why}") from None
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from None


def load_file(path: str | Path) -> Any:
    """Read and parse one YAML file; a missing or unreadable file is a one-line ConfigError."""
    return load_text(read_config_text(path), str(path))


def parse_value(text: str) -> Any:
    """One override value as Hydra reads it: `2`, `null`, `1e-4`, `10:00:00` (a string), `0x10` (a
    string: YAML's 16 made `run.name=0x10` a directory `16`), `[0.5,${d}/a]` (a list)."""
    text = text.strip()
    if text == "":
        return ""
    if QUOTED.fullmatch(text):
        return _unquote(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        raise ConfigError(
            f"{text} is not one quoted value: inside quotes a backslash escapes the quote after it, so write"
            f" \\{text[0]} for a quote in the value and double a backslash before the closing quote"
            f" ({text[0]}C:\\\\{text[0]} is C:\\), as Hydra's override grammar reads it"
        )
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [parse_value(item) for item in split_top_level(inner)] if inner else []
    if text.startswith("{") and text.endswith("}"):
        mapping = _hydra_mapping(text[1:-1].strip())
        if mapping is not None:
            return mapping
    call = _HYDRA_CALL.fullmatch(text)
    if call and call["name"] in HYDRA_FUNCTIONS and _closes_at_its_end(call["args"]):
        return _hydra_function(text, call["name"], call["args"].strip())
    return _hydra_scalar(text)


# Hydra's override functions (`training.run.name=str(126)`): a value of that form is a call of one.
_HYDRA_CALL = re.compile(r"(?P<name>[A-Za-z_]\w*)\((?P<args>.*)\)", re.S)
HYDRA_SWEEPS = ("choice", "range", "interval", "glob", "tag")
HYDRA_FUNCTIONS = ("int", "float", "str", "bool", "json_str", "extend_list", "sort", "shuffle", *HYDRA_SWEEPS)


def _closes_at_its_end(args: str) -> bool:
    """`args` (between a call's first `(` and the value's last `)`) closes nothing it did not open:
    `str(a)(b)` and `str(a)_str(b)` are no calls (their `(` closes before the end), but text."""
    return all(depth >= 0 for _, _, depth in _unquoted(args))


def _hydra_function(text: str, name: str, args: str) -> Any:
    """A cast (`str(126)` is "126", `int(5.0)` 5) converts its one value as Hydra does; a sweep or
    shuffle, which Hydra runs under --multirun, and extend_list are refused: taken as text, they
    named a run `choice(a,b)` or gave srun the word `extend_list(--label)`."""
    values = [parse_value(arg) for arg in split_top_level(args)] if args else []
    if name in ("sort", "shuffle"):
        raise ConfigError(f"{text}: Hydra's {name}() is not read here; give the values in the order to use")
    if name in HYDRA_SWEEPS or (name in HYDRA_CASTS and len(values) > 1):
        raise ConfigError(
            f"{text} is Hydra's {name} sweep, which runs one job per value under --multirun; gptrain"
            " composes one config: launch once per value"
        )
    if name == "extend_list":
        raise ConfigError(
            f"{text} appends to the list there in Hydra; gptrain does not: give the whole list, [a,b,...]"
        )
    if not values:
        raise ConfigError(f"{text}: {name}() casts one value; give it, e.g. {name}(1)")
    try:
        return _cast(HYDRA_CASTS[name], values[0])
    except (TypeError, ValueError):
        raise ConfigError(f"{text}: cannot cast {values[0]!r} with {name}()") from None


def _cast_bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(value)
        return value.lower() == "true"
    return bool(value)


def _cast_str(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


HYDRA_CASTS: dict[str, Any] = {
    "int": int, "float": float, "str": _cast_str, "bool": _cast_bool, "json_str": json.dumps,
}  # fmt: skip


def _cast(function: Any, value: Any) -> Any:
    """Hydra applies a cast to each item of a list and each value of a mapping (json_str to the whole)."""
    if function is json.dumps:
        return function(value)
    if isinstance(value, list):
        return [_cast(function, item) for item in value]
    if isinstance(value, dict):
        return {key: _cast(function, item) for key, item in value.items()}
    if value is None:
        raise TypeError("null")
    return function(value)


def override_value(form: OverrideForm) -> Any:
    """The value of a `key=value` override (parse_value); an error names the override as typed."""
    try:
        value = parse_value(form.text)
    except ConfigError as error:
        raise ConfigError(f"override '{printable(form.argument)}': {error}") from None
    text = form.text.strip()
    if form.key.rpartition(".")[2] in NAME_KEYS and type(value) is int and str(value) != text:
        raise ConfigError(
            f"override '{printable(form.argument)}': {text} is read as the number {value} (Hydra drops `_`"
            f" and a sign), {_RESPELLED}: \"{form.key}='{text}'\""
        )
    return value


def _unquote(text: str) -> str:
    """A quoted value's text, unescaped as Hydra does (`'It\\'s'` is It's, `'C:\\\\'` is C:\\): each
    run of backslashes before its quote (an escaped inner quote, or the closing one) is halved; any
    other backslash is itself (`'a\\b'` is a\\b)."""
    quote, body = text[0], text[1:]  # the closing quote kept: backslashes before it are halved too
    parts, position = [], 0
    for match in re.finditer(rf"\\+{quote}", body):
        parts += [body[position : match.start()], body[match.start() + 1 : match.end() : 2]]
        position = match.end()
    parts.append(body[position:-1])
    return "".join(parts)


def _hydra_scalar(text: str) -> Any:
    """`null` and `true`/`false` in any case, Hydra's ints and floats, else the text."""
    if text.lower() == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _HYDRA_INT.fullmatch(text):
        return int(text)
    if _HYDRA_FLOAT.fullmatch(text):
        return float(text)
    return text


def _hydra_mapping(inner: str) -> dict[str, Any] | None:
    """Hydra's dict override `{train:a,validation:b}` (no space needed after a colon, where YAML's
    flow mapping reads `train:a` as one key); None when an item has no colon."""
    mapping: dict[str, Any] = {}
    for item in split_top_level(inner) if inner else []:
        key, sep, value = item.partition(":")
        key = key.strip().strip("'\"")
        if not sep or not key:
            return None
        mapping[key] = parse_value(value)
    return mapping


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets, braces (`${...}`) and quotes."""
    items, start = [], 0
    for position, char, depth in _unquoted(text):
        if char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    items.append(text[start:])
    return [item.strip() for item in items]


def _unquoted(text: str) -> Iterator[tuple[int, str, int]]:
    """Each character outside quotes, its position, and the depth of brackets, braces and parentheses
    open after it (a closing one ends one: the depth falls below 0 where it closes none)."""
    depth, quote, escaped = 0, "", False
    for position, char in enumerate(text):
        if escaped:
            escaped = False
        elif quote:
            escaped = char == "\\"  # `\\'` inside quotes does not end them
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        else:
            depth += (char in "[{(") - (char in "]})")
            yield position, char, depth


# OmegaConf's words for a bool field's text (nodes.BooleanNode), besides an integer's text.
SWITCH_WORDS = {
    "yes": True,
    "y": True,
    "on": True,
    "true": True,
    "no": False,
    "n": False,
    "off": False,
    "false": False,
}


def as_int(value: Any) -> int | None:
    """An int, or text that is one (`"2"`, `" 2"`, `"1_000"`), as OmegaConf's typed configs read an
    int field (NeMo's): `${oc.env:NODES}` resolves to text. `"2.5"`, `"0x10"` and a bool are not.
    None: no int."""
    if type(value) is int:
        return value
    if type(value) is str:
        try:
            return int(value)
        except ValueError:
            return None
    return None


def as_switch(value: Any) -> bool | None:
    """A switch as OmegaConf reads one for a typed bool field (NeMo's exp_manager): a bool, an
    integer (0 is false: NeMo's mlperf presets write `resume_if_exists: 0`), or text of either, or
    yes/no, on/off, y/n, true/false in any case (an override's `yes`, which Hydra leaves text, or
    `${oc.env:X}`). None: no switch (`0.0`, `maybe`)."""
    if isinstance(value, bool):
        return value
    number = as_int(value)
    if number is not None:
        return number != 0
    if isinstance(value, str) and value.lower() in SWITCH_WORDS:
        return SWITCH_WORDS[value.lower()]
    return None
