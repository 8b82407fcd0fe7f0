"""A tied model under pipeline parallelism refuses a checkpoint saved untied, as one process does.

The first stage holds the embedding and the last stage the output layer's copy of it, so neither
rank holds both: the last stage loads the saved embedding beside the output layer and compares."""

import json
from pathlib import Path

import gloo_ranks
import pytest

from gptrain.checkpoint import compat

WORKER = Path(__file__).with_name("tied_pp_worker.py")
UNTIED = compat.untied_problem("model.tok_embeddings.weight", "model.output.weight")


def load(tmp_path: Path, kind: str, tied: bool, saved_rows: int = 8) -> list[dict]:
    gloo_ranks.run_ranks(WORKER, tmp_path / "checkpoints", tmp_path, kind, int(tied), saved_rows)
    return [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("saved_rows", [8, 10])
def test_a_tied_pipeline_refuses_an_untied_checkpoint_on_every_rank(tmp_path, saved_rows):
    """Each stage loaded its own tensor and the untied output layer went on silently as the tied
    copy (a later resume in one process then refused the run's own checkpoint). 10 saved rows: the
    output layer is loaded by rows (another TP's vocabulary padding), the check still holds."""
    path = tmp_path / "checkpoints" / "step_2"
    for result in load(tmp_path, "untied", tied=True, saved_rows=saved_rows):
        assert result == {"error": f"CheckpointMismatchError: {compat.mismatch_error(path, UNTIED)}"}


@pytest.mark.distributed
def test_a_tied_pipeline_loads_a_tied_checkpoint(tmp_path):
    """Values from float32 arange: the embedding's and its copy's rows, exactly as saved."""
    expected = [[float(3 * row + col) for col in range(3)] for row in range(8)]
    assert load(tmp_path, "tied", tied=True) == [{"loaded": expected}, {"loaded": expected}]


@pytest.mark.distributed
def test_an_untied_pipeline_loads_an_untied_checkpoint(tmp_path):
    embedding = [[float(3 * row + col) for col in range(3)] for row in range(8)]
    output = [[value + 0.5 for value in row] for row in embedding]
    assert load(tmp_path, "untied", tied=False) == [{"loaded": embedding}, {"loaded": output}]
