"""docs/architecture.md's module map is where a new contributor looks a module up: it names every one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_map() -> str:
    """The fenced block under '## Module map'."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return text.split("## Module map", 1)[1].split("```", 2)[1]


def is_named(module: Path, text: str) -> bool:
    """`dir/name.py`, `name.py` in its package's entry, or `name` inside a `{a,b,...}.py` group."""
    name = module.stem
    return (
        f"{module.parent.name}/{name}.py" in text
        or f"{name}.py" in text
        or re.search(r"\{[\w,]*\b" + re.escape(name) + r"\b[\w,]*\}\.py", text) is not None
    )


def test_the_module_map_names_every_module():
    text = module_map()
    modules = sorted((ROOT / "gptrain").rglob("*.py"))
    missing = [str(m.relative_to(ROOT)) for m in modules if m.name != "__init__.py" and not is_named(m, text)]
    assert not missing, f"docs/architecture.md's module map does not name {missing}: add a line for each"


def test_the_module_map_names_every_group_of_bundled_configs():
    text = module_map()
    groups = sorted(p.name for p in (ROOT / "gptrain" / "configs").iterdir() if p.is_dir())
    assert all(f"{group}/" in map_entry(text, "configs/") for group in groups), groups


def map_entry(text: str, name: str) -> str:
    """The map's entry for `name`: its line and the indented lines that continue it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}"))
    rest = lines[start + 1 :]
    ends = next((i for i, line in enumerate(rest) if not line.startswith("   ")), len(rest))
    return "\n".join(lines[start : start + 1 + ends])
