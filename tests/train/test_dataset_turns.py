"""Ranks build the datasets in turns: rank 0, then one rank per node, then the rest, so that a
cache on each node's own disk is filled once per node, not by all of a node's ranks at once."""

import json
from pathlib import Path

import pytest
from gloo_ranks import free_port, run_ranks

from gptrain.train.builders import build_turn

WORKER = Path(__file__).with_name("dataset_turns_worker.py")


def test_the_turns_are_rank_0_then_each_nodes_first_rank_then_the_rest():
    assert [build_turn(rank, rank % 8) for rank in (0, 1, 7, 8, 9, 16)] == [0, 2, 2, 1, 2, 1]


def entered(out: Path) -> dict[int, list[int]]:
    return {rank: json.loads((out / f"entered_{rank}.json").read_text()) for rank in range(4)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Both scenarios (no failure: ROOT/none; rank 2's build fails: ROOT/2) in one launch of four
    ranks that run them in turn (one start-up)."""
    root = tmp_path_factory.mktemp("dataset_turns")
    specs = []
    for failing in ("none", "2"):
        (root / failing).mkdir()
        specs.append(f"{root / failing},{failing},{free_port()}")
    run_ranks(WORKER, *specs, world=4)
    return root


@pytest.mark.distributed
def test_each_node_builds_once_before_its_other_ranks(runs):
    tmp_path = runs / "none"
    assert entered(tmp_path) == {0: [], 2: [0], 1: [0, 2], 3: [0, 2]}
    assert all((tmp_path / f"raised_{rank}.txt").read_text() == "built train" for rank in range(4))


@pytest.mark.distributed
def test_a_node_leaders_failure_stops_every_rank_naming_it(runs):
    tmp_path = runs / "2"
    assert not (tmp_path / "entered_1.json").exists() and not (tmp_path / "entered_3.json").exists()
    raised = {rank: (tmp_path / f"raised_{rank}.txt").read_text() for rank in range(4)}
    assert raised[2] == "index cache of rank 2 unwritable"
    for rank in (0, 1, 3):
        assert raised[rank] == "rank 2 could not build the datasets: index cache of rank 2 unwritable"
