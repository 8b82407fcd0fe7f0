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


# (kind saved, reader told tied, rows saved): every scenario of this file, in one launch
SCENARIOS = [("untied", True, 8), ("untied", True, 10), ("tied", True, 8), ("untied", False, 8)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, tuple[Path, list[dict]]]:
    """scenario: (its directory, every rank's result), after one launch of two ranks ran them all."""
    bases = {scenario: tmp_path_factory.mktemp("_".join(map(str, scenario))) for scenario in SCENARIOS}
    runs = [
        [str(base / "checkpoints"), str(base), kind, int(tied), rows]
        for (kind, tied, rows), base in bases.items()
    ]
    gloo_ranks.run_ranks(WORKER, json.dumps(runs))
    return {
        scenario: (base, [json.loads((base / f"rank_{rank}.json").read_text()) for rank in range(2)])
        for scenario, base in bases.items()
    }


@pytest.mark.distributed
@pytest.mark.parametrize("saved_rows", [8, 10])
def test_a_tied_pipeline_refuses_an_untied_checkpoint_on_every_rank(loaded, saved_rows):
    """Each stage loaded its own tensor and the untied output layer went on silently as the tied
    copy (a later resume in one process then refused the run's own checkpoint). 10 saved rows: the
    output layer is loaded by rows (another TP's vocabulary padding), the check still holds."""
    base, results = loaded[("untied", True, saved_rows)]
    path = base / "checkpoints" / "step_2"
    for result in results:
        assert result == {"error": f"CheckpointMismatchError: {compat.mismatch_error(path, UNTIED)}"}


@pytest.mark.distributed
def test_a_tied_pipeline_loads_a_tied_checkpoint(loaded):
    """Values from float32 arange: the embedding's and its copy's rows, exactly as saved."""
    expected = [[float(3 * row + col) for col in range(3)] for row in range(8)]
    assert loaded[("tied", True, 8)][1] == [{"loaded": expected}, {"loaded": expected}]


@pytest.mark.distributed
def test_an_untied_pipeline_loads_an_untied_checkpoint(loaded):
    embedding = [[float(3 * row + col) for col in range(3)] for row in range(8)]
    output = [[value + 0.5 for value in row] for row in embedding]
    assert loaded[("untied", False, 8)][1] == [{"loaded": embedding}, {"loaded": output}]
