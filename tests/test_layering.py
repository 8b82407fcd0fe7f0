"""The package layering of docs/architecture.md, read from every module's imports, lazy ones too.

An import inside a function still makes the lower package depend on the higher one (and, on a
login node, can pull torch into a command that must not import it), so every import statement of a
module counts, wherever it stands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gptrain

PACKAGE_DIR = Path(gptrain.__file__).parent

BOTTOM = {"gptrain", "errors"}  # gptrain/__init__.py holds the version only
"""Importable from anywhere; they import nothing of gptrain."""

ALLOWED = {
    "utils": set(),
    "config": {"utils"},
    "models": {"utils"},  # never the job config
    "data": {"utils", "config"},  # never models or parallel
    "checkpoint": {"utils", "models", "data"},
    "parallel": {"utils", "config", "models", "checkpoint"},
    "train": {"utils", "config", "models", "data", "checkpoint", "parallel"},  # trained/ never imported
    "quickstart": {"utils"},
    # launch's imports of data, parallel and train reach only their torch-free modules
    # (tests/launch/test_launch_no_torch.py runs the commands and checks).
    "launch": {"utils", "config", "data", "parallel", "train"},
    "validate": {"utils", "config", "parallel", "launch"},
    "megatron": {"utils", "config", "data", "parallel", "train"},
    "plan": {"utils", "config", "models", "parallel", "train", "launch"},  # sits above launch
    "trained": {"utils", "config", "models", "data", "checkpoint", "parallel", "train"},
}
"""Which packages each package may import besides BOTTOM and itself (docs/architecture.md, Layering)."""

TOP = {"cli", "__main__"}
"""The `gptrain` command: it may import everything, and nothing imports it."""

KNOWN_UPWARD_IMPORTS = {
    ("gptrain.checkpoint.rewind", "gptrain.train.run_lock"): "the run lock guards a rewind",
    ("gptrain.parallel.compile", "gptrain.train.step"): "the compiled loss is train's",
    ("gptrain.parallel.runtime", "gptrain.train.step"): "the loss-token count is train's",
    ("gptrain.parallel.training", "gptrain.train.step"): "the loss-token count is train's",
    ("gptrain.parallel.layout", "gptrain.train.rampup"): "the batch ramp's divisibility check",
    ("gptrain.train.builders", "gptrain.plan.sizes"): "Megatron's parameter lines at start",
    ("gptrain.train.memory_check", "gptrain.plan.memory"): "the memory estimate before training",
    ("gptrain.train.memory_check", "gptrain.plan.spec"): "the memory estimate before training",
    ("gptrain.launch.validation_stage", "gptrain.validate.thresholds"): "the validation stage's config",
    ("gptrain.launch.validation_stage", "gptrain.validate.bandwidth"): "the validation stage's config",
    ("gptrain.launch.validation_stage", "gptrain.validate.cli"): "the validation stage's options",
    ("gptrain.plan.cli", "gptrain.cli"): "refuse_empty_option_values",
    ("gptrain.plan.trial", "gptrain.cli"): "a trial rank runs `gptrain train` in its process",
}
"""Imports against the layering that predate this test (each a cycle between two packages), to be
moved to the lower package; listed so that no new one comes in unnoticed."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every gptrain module `path` imports, at any depth of its code; `from a import b` counts as
    a.b when a.b is a module, else as a."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            found.update(submodule_or(base, alias.name) for alias in node.names)
    return {name for name in found if name == "gptrain" or name.startswith("gptrain.")}


def absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def submodule_or(base: str, name: str) -> str:
    candidate = PACKAGE_DIR.parent.joinpath(*f"{base}.{name}".split("."))
    return f"{base}.{name}" if candidate.with_suffix(".py").is_file() or candidate.is_dir() else base


def layer(module: str) -> str:
    """The package a module belongs to: gptrain.data.builder -> data, gptrain.cli -> cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gptrain"


def all_imports() -> list[tuple[str, str]]:
    edges = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        importer = module_name(path)
        edges += [(importer, imported) for imported in sorted(imported_modules(path))]
    return edges


def forbidden(importer: str, imported: str) -> bool:
    source, target = layer(importer), layer(imported)
    if source == target or source in TOP:
        return False
    if target in TOP:
        return True
    if source in BOTTOM:
        return target != "gptrain"
    return target not in BOTTOM and target not in ALLOWED[source]


def test_every_package_is_in_the_layering():
    packages = {layer(module_name(path)) for path in PACKAGE_DIR.rglob("*.py")}
    assert packages == BOTTOM | TOP | set(ALLOWED)


def test_no_module_imports_a_higher_layer():
    edges = all_imports()
    wrong = [f"{a} imports {b}" for a, b in edges if forbidden(a, b) and (a, b) not in KNOWN_UPWARD_IMPORTS]
    assert not wrong, "imports against docs/architecture.md's layering:\n" + "\n".join(wrong)


def test_the_known_upward_imports_are_still_there():
    """One that is moved to its place comes off the list, so that it cannot come back unnoticed."""
    edges = set(all_imports())
    gone = [f"{a} -> {b}" for a, b in KNOWN_UPWARD_IMPORTS if (a, b) not in edges]
    assert not gone, "no longer imported (remove from KNOWN_UPWARD_IMPORTS):\n" + "\n".join(gone)


def test_the_scan_sees_imports_inside_functions():
    imported = imported_modules(PACKAGE_DIR / "launch" / "preflight.py")
    assert "gptrain.parallel.layout" in imported  # imported inside a function only
