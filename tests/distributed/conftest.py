"""The session's shared layout launches (parallel_harness.SharedLaunches): which modules have a test
selected, where their files go."""

from __future__ import annotations

from pathlib import Path

import pytest
from parallel_harness import SharedLaunches

SELECTED_MODULES = pytest.StashKey[set[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[SELECTED_MODULES] = {item.module.__name__ for item in items if getattr(item, "module", None)}


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared_launch")


@pytest.fixture(scope="session")
def shared_launches(request: pytest.FixtureRequest, shared_root: Path) -> SharedLaunches:
    return SharedLaunches(shared_root, request.config.stash[SELECTED_MODULES])
