"""Which saved rank's random streams a rank of a resumed run takes when only the data-parallel size
changed: the saved rank at its own (pipeline, tensor) position, data-parallel rank 0, as Megatron
restores the same (pp, tp) rank's (review C25 F2: every stream restarted from the seed instead)."""

import pytest
import torch

from gptrain.checkpoint.manager import CheckpointManager
from gptrain.checkpoint.rank_state import read_rank_state
from gptrain.train.state import restore_rng_state, rng_state


def layout(world_size: int, tp: int = 1, pp: int = 1) -> dict:
    return {
        "world_size": world_size,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "sequence_parallel": False,
    }


def saved_by(tmp_path, saved: dict) -> tuple:
    """A checkpoint whose ranks each saved a stream of their own (rank r's: seeded 1000 + r)."""
    step_dir = CheckpointManager(tmp_path, keep_last=1).save(4, {"model": {"w": torch.zeros(2)}}, {})
    streams = {}
    for rank in range(saved["world_size"]):
        torch.manual_seed(1000 + rank)
        streams[rank] = rng_state()
        torch.save({"rng": streams[rank], "rng_layout": saved, "rank": rank}, step_dir / f"rank_{rank}.pt")
    return step_dir, streams


@pytest.mark.parametrize(
    ("saved", "world", "expected"),
    [
        (layout(1), 2, [0, 0]),  # one process to two data-parallel ranks
        (layout(4, pp=2), 2, [0, 2]),  # pp x dp 2 x 2 to 2 x 1: rank 1 is stage 1, saved by rank 2
        (layout(2, pp=2), 8, [0, 0, 0, 0, 1, 1, 1, 1]),  # 2 x 1 to 2 x 4
        (layout(2, tp=2), 4, [0, 1, 0, 1]),  # dp 1 to 2 under TP 2: the tensor rank's own
        (layout(8, tp=2, pp=2), 4, [0, 1, 4, 5]),  # dp 2 to 1 under TP 2 x PP 2
    ],
)
def test_a_rank_of_another_data_parallel_size_takes_its_positions_streams(tmp_path, saved, world, expected):
    step_dir, streams = saved_by(tmp_path, saved)
    now = {**saved, "world_size": world}
    for rank in range(world):
        extra = read_rank_state(step_dir, rank, world)
        source = expected[rank]
        assert torch.equal(extra["rng"]["torch"], streams[source]["torch"]), (rank, source)
        lines: list[str] = []
        assert restore_rng_state(extra, now, lines.append) and lines == []
        assert torch.equal(torch.get_rng_state(), streams[source]["torch"])


def test_the_same_world_reads_its_own_file_and_other_tp_or_pp_sizes_restore_nothing(tmp_path):
    step_dir, streams = saved_by(tmp_path, layout(4, pp=2))
    for rank in range(4):
        assert read_rank_state(step_dir, rank, 4)["rank"] == rank
        assert torch.equal(read_rank_state(step_dir, rank, 4)["rng"]["torch"], streams[rank]["torch"])
    lines: list[str] = []
    assert not restore_rng_state(read_rank_state(step_dir, 1, 2), layout(2, tp=2), lines.append)
    assert lines[0].startswith("random streams not restored: saved under 4 ranks, TP 1, PP 2")
