"""Slurm tests need a running Slurm (bash scripts/slurm-local.sh up).

Without one they are skipped with the reason, except when GPTRAIN_REQUIRE_SLURM=1 (CI):
then a missing Slurm fails every test here instead of hiding them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from slurm_helpers import TINY, job_ids, slurm_missing


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(autouse=True)
def require_slurm():
    reason = slurm_missing()
    if reason is None:
        return
    if os.environ.get("GPTRAIN_REQUIRE_SLURM") == "1":
        pytest.fail(f"GPTRAIN_REQUIRE_SLURM=1 but Slurm is not usable: {reason}")
    pytest.skip(f"no Slurm: {reason}")


@pytest.fixture
def workdir(tmp_path):
    """A launch directory whose Slurm jobs are all cancelled at teardown, whatever happened."""
    yield tmp_path
    ids = job_ids(tmp_path)
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


@pytest.fixture
def tiny() -> list[str]:
    """Overrides for a tiny CPU training job (real `gptrain train`, mock data)."""
    return list(TINY)
