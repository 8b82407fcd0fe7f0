"""Whether a dataset prefix names a Megatron .bin/.idx pair, and if not, why, in one line that says
what to do. Standard library only: every command that opens a dataset asks it (through
IndexedDataset and the builder), and a login-node check can ask it without numpy.
"""

from __future__ import annotations

import os
import re

from gptrain.data.blend_spec import is_number, strip_suffix, text_document_hint
from gptrain.utils.paths import look_up

_PREFIX_EXAMPLE = "data/corpus_text_document for data/corpus_text_document.bin/.idx"
_VARIABLE = re.compile(r"\$\{?(\w+)")


def pair_problem(path_prefix: str) -> str | None:
    """Why `path_prefix` names no Megatron .bin/.idx pair, in one line that says what to do; None
    where both are files. Every command that opens a dataset says the same (inspect, merge, sample,
    training): only the builder used to tell half a pair, a directory or an unreachable file from
    a prefix that is not there."""
    base = strip_suffix(str(path_prefix))
    kinds = {}
    for suffix in (".bin", ".idx"):
        found = look_up(base + suffix)
        if found.kind == "unreachable":
            return f"{base}{suffix}: {found.why}"
        kinds[suffix] = found.kind
    for suffix, kind in kinds.items():
        if kind == "directory":
            return (
                f"{base}{suffix}: is a directory, not a Megatron {suffix} file; pass the prefix of a "
                f".bin/.idx pair ({_PREFIX_EXAMPLE})"
            )
        if kind == "other":
            return f"{base}{suffix}: not a regular file (a pipe or a device); a Megatron {suffix} file is one"
    present = [suffix for suffix, kind in kinds.items() if kind == "file"]
    if len(present) == 2:
        return None
    if present:
        missing = ".idx" if present == [".bin"] else ".bin"
        return (
            f"{base}{missing} not found beside {base}{present[0]} (a copy not finished, or a file "
            "removed); copy it as well, or prepare the dataset again"
        )
    return _no_pair_problem(base)


def _no_pair_problem(base: str) -> str:
    """Neither file is there: the prefix may name a directory of datasets or a file (the jsonl)."""
    if os.path.isdir(base):
        return _directory_problem(base)
    if os.path.isfile(base):
        return (
            f"{base}: a file, not the prefix of a .bin/.idx pair; give the prefix ({_PREFIX_EXAMPLE}), "
            "or, for jsonl, make the pair first with gptrain data prepare"
        )
    hint = text_document_hint(base) or _home_hint(base) or _variable_hint(base) or _blend_string_hint(base)
    return f"{base}.bin/.idx not found; " + (
        hint or "check the path, or make the pair with gptrain data prepare"
    )


def _home_hint(base: str) -> str:
    """A leading ~ is the shell's to expand, and nothing expands it in a config file or a quoted
    argument: the question that says so where the expanded prefix names a pair. Else ''."""
    home = os.path.expanduser(base)
    if home == base or not all(os.path.isfile(home + suffix) for suffix in (".bin", ".idx")):
        return ""
    return f"did you mean {home}? (~ is expanded by a shell, not in a config file or a quoted argument)"


def _variable_hint(base: str) -> str:
    """Likewise a $VAR or ${VAR} (a prefix in single quotes, or in a YAML file, where OmegaConf
    reads ${oc.env:VAR}): the question that says so where the expanded prefix names a pair. Else ''."""
    expanded = os.path.expanduser(os.path.expandvars(base))
    if expanded == base or not all(os.path.isfile(expanded + suffix) for suffix in (".bin", ".idx")):
        return ""
    name = next((n for n in _VARIABLE.findall(base) if n in os.environ), "VAR")
    return (
        f"did you mean {expanded}? (${name} is expanded by a shell, not in a config file or a quoted "
        f"argument; a config can write ${{oc.env:{name}}})"
    )


def _blend_string_hint(prefix: str) -> str:
    """Megatron's `--data-path W1 P1 W2 P2` copied into one string ("$DATA_PATH" quoted, a config's
    data_prefix: "0.3 a 0.7 b") is one prefix, to Megatron as to gptrain: say how to write the blend."""
    words = prefix.split()
    if len(words) < 2 or len(words) % 2 or not all(is_number(word) for word in words[0::2]):
        return ""
    return (
        "a blend written as one string is one prefix, as Megatron reads one word; give its weights and "
        f"prefixes as separate entries: [{','.join(words)}] in a config, unquoted words on a command line"
    )


def _directory_problem(directory: str) -> str:
    """A directory given as a prefix (Megatron's tools take directories in some places): name a
    dataset in it, or say that it holds none."""
    try:
        names = set(os.listdir(directory))
    except OSError as error:
        return (
            f"{directory}: a directory, not a dataset prefix (it cannot be listed: {error.strerror or error});"
            f" pass the prefix of a .bin/.idx pair ({_PREFIX_EXAMPLE})"
        )
    prefixes = sorted(name[:-4] for name in names if name.endswith(".idx") and name[:-4] + ".bin" in names)
    if not prefixes:
        return (
            f"{directory}: a directory, not a dataset prefix, and it holds no .bin/.idx pair; pass the "
            f"prefix of a pair ({_PREFIX_EXAMPLE})"
        )
    more = f" (one of its {len(prefixes)} datasets)" if len(prefixes) > 1 else ""
    example = os.path.join(directory, prefixes[0])
    return f"{directory}: a directory, not a dataset prefix; name a dataset in it by its prefix, e.g. {example}{more}"
