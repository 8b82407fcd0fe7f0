"""`gptrain plot NAME` said "not a directory" though status, logs and cancel take a run name: a name
that is no path here is looked up under --results-dir (default: results), as they look it up."""

from pathlib import Path

import pytest
from test_generate_plot import synthetic_log

from gptrain.cli import main


def logged_run(base: Path, name: str) -> Path:
    run = base / name / "results"
    run.mkdir(parents=True)
    (run / "rank_0.log").write_text("\n".join(synthetic_log()) + "\n")
    return base / name


@pytest.mark.parametrize("given", [[], ["--results-dir", "elsewhere"]])
def test_plot_takes_a_run_name_under_the_results_dir(tmp_path, monkeypatch, capsys, given):
    monkeypatch.chdir(tmp_path)
    run = logged_run(tmp_path / (given[1] if given else "results"), "slurmtiny")
    assert main(["plot", "slurmtiny", *given]) == 0
    assert (
        f"wrote {Path(*given[1:] or ['results']) / 'slurmtiny' / 'plots' / 'loss.png'}"
        in capsys.readouterr().out
    )
    assert (run / "plots" / "curves.png").is_file()


def test_a_name_found_nowhere_names_both_places(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "nothere"]) == 2
    assert capsys.readouterr().err == (
        "gptrain: error: nothere: not a directory, nor a run under results; pass a run's results "
        "directory or its name (--results-dir: where the runs are)\n"
    )
