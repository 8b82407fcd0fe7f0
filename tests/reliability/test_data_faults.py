"""Faults in a run's data and its cached sample indices, met at the start of a run: one line
naming the file or key and what to do, never a traceback."""

from __future__ import annotations

import pytest
from reliability_helpers import train_args

from gptrain.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_an_index_cache_that_cannot_be_written_names_the_key_to_change(tmp_path, capsys, indexed_corpus):
    """The line said `--cache-dir / data.cache_dir`, a flag of `data sample` and a key no config has."""
    (tmp_path / "file").write_text("not a directory")
    args = train_args(
        tmp_path / "run",
        *indexed_corpus,
        "model.data.data_impl=mmap",
        f"model.data.index_mapping_dir={tmp_path / 'file' / 'index'}",
    )
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gptrain: error: cannot write dataset index cache in "), err
    assert "model.data.index_mapping_dir" in err[0] and "data.cache_dir" not in err[0].replace(
        "model.data.index_mapping_dir", ""
    )
