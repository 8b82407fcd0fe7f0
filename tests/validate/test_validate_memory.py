"""The collectives sweep skips the sizes the fullest rank cannot hold, says so, and compares in chunks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gloo_ranks import run_ranks

from gptrain.errors import ConfigError
from gptrain.validate import memory
from gptrain.validate.bandwidth import OPS, element_count
from gptrain.validate.collectives import PLACEMENTS, make_buffers, wrong_elements
from gptrain.validate.main import Outcome, fitting_sizes

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
WORKER = Path(__file__).with_name("memory_worker.py")


@pytest.mark.parametrize(
    "op, nbytes, in_place, world, need",
    [
        # 2 ranks, 1 MiB: count 256Ki elements (1 MiB), chunk 128Ki (0.5 MiB); the mask is a byte per element
        ("all_reduce", MIB, True, 2, 2 * MIB + 256 * KIB),  # out, expected
        ("broadcast", MIB, True, 2, 2 * MIB + 256 * KIB),
        ("all_gather", MIB, False, 2, 2 * MIB + MIB // 2 + 256 * KIB),  # out, expected, inp (a chunk)
        ("all_gather", MIB, True, 2, 2 * MIB + 256 * KIB),  # inp is a view of out
        ("reduce_scatter", MIB, False, 2, MIB + MIB + 128 * KIB),  # inp; out, expected a chunk each
        ("reduce_scatter", MIB, True, 2, MIB + MIB // 2 + 128 * KIB),  # out is a view of inp
        ("all_to_all", MIB, False, 2, 3 * MIB + 256 * KIB),
        # 4 ranks, 8 GiB: the gathered output and the expected one, a 2 GiB input, a 16 MiB mask
        ("all_gather", 8 * GIB, False, 4, 18 * GIB + 16 * MIB),
        ("all_to_all", 8 * GIB, False, 4, 24 * GIB + 16 * MIB),
        # 3 ranks, 1000 B: 249 elements (a multiple of 3)
        ("all_to_all", 1000, False, 3, 3 * 249 * 4 + 249),
        ("reduce_scatter", 1000, False, 3, (249 + 2 * 83) * 4 + 83),
    ],
)
def test_bytes_needed_matches_hand_figures(op, nbytes, in_place, world, need):
    assert memory.bytes_needed(op, nbytes, in_place, world) == need


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_buffer_elements_are_what_make_buffers_allocates(world):
    for op in OPS:
        for in_place in PLACEMENTS[op]:
            count = element_count(op, 4800, world)
            for rank in range(world):
                ctx = SimpleNamespace(size=world, rank=rank, device=torch.device("cpu"))
                buf = make_buffers(op, count, in_place, ctx)
                storages = {
                    t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in vars(buf).values()
                }
                assert sum(storages.values()) == memory.buffer_elements(op, count, in_place, world) * 4, (
                    op,
                    in_place,
                )


def fake_ctx(world: int = 2, ranks_on_node: int = 1) -> SimpleNamespace:
    nodes = ["n1"] * ranks_on_node + [f"m{i}" for i in range(world - ranks_on_node)]
    return SimpleNamespace(
        rank=0, size=world, is_gpu=False, node="n1", nodes=nodes, device=torch.device("cpu")
    )


def fake_memory(monkeypatch, free: int, total: int = 10 * GIB) -> None:
    """This process sees `free` of `total` bytes; it is alone, so the minimum over ranks is its own."""
    monkeypatch.setattr(memory, "local_memory", lambda ctx: (free, total))
    monkeypatch.setattr(memory, "min_over_ranks", lambda values, ctx: values)


def test_sizes_that_do_not_fit_are_skipped_and_said_once_per_op(monkeypatch, capsys):
    margin = GIB + GIB  # 10% of the 10 GiB total, and the fixed 1 GiB
    fake_memory(monkeypatch, free=margin + 2 * 40 * MIB)  # two ranks share it: 40 MiB each
    args = argparse.Namespace(min_bytes=MIB, max_bytes=64 * MIB)
    out = Outcome()
    sizes = fitting_sizes(fake_ctx(ranks_on_node=2), args, out)
    # at S MiB on 2 ranks: all_reduce/broadcast 2.25 S, all_gather 2.75 S, reduce_scatter 2.125 S, all_to_all 3.25 S
    up_to = {"all_reduce": 16, "all_gather": 8, "reduce_scatter": 16, "all_to_all": 8, "broadcast": 16}
    assert sizes == {op: [s * MIB for s in (1, 2, 4, 8, 16) if s <= last] for op, last in up_to.items()}
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "collectives: all_reduce: sizes above 16 MiB skipped: 32 MiB needs 0.07 GiB per process, "
        "0.04 GiB usable of 2.08 GiB free",
        "collectives: all_gather: sizes above 8 MiB skipped: 16 MiB needs 0.04 GiB per process, "
        "0.04 GiB usable of 2.08 GiB free",
        "collectives: reduce_scatter: sizes above 16 MiB skipped: 32 MiB needs 0.07 GiB per process, "
        "0.04 GiB usable of 2.08 GiB free",
        "collectives: all_to_all: sizes above 8 MiB skipped: 16 MiB needs 0.05 GiB per process, "
        "0.04 GiB usable of 2.08 GiB free",
        "collectives: broadcast: sizes above 16 MiB skipped: 32 MiB needs 0.07 GiB per process, "
        "0.04 GiB usable of 2.08 GiB free",
    ]
    skipped = {s["op"]: s for s in out.summary["collectives_skipped"]}
    assert skipped["all_gather"]["sizes"] == [16 * MIB, 32 * MIB, 64 * MIB]
    assert (
        skipped["all_gather"]["need_bytes"] == 44 * MIB and skipped["all_gather"]["usable_bytes"] == 40 * MIB
    )
    json.dumps(out.summary)  # validation.json takes it as it is


def test_everything_fits_skips_nothing_and_says_nothing(monkeypatch, capsys):
    fake_memory(monkeypatch, free=8 * GIB)
    out = Outcome()
    sizes = fitting_sizes(fake_ctx(), argparse.Namespace(min_bytes=None, max_bytes=MIB), out)
    assert sizes == {op: [8 << i for i in range(18)] for op in OPS}
    assert capsys.readouterr().out == "" and out.summary["collectives_skipped"] == []


def test_no_size_fits_is_one_line_naming_free_memory_and_the_flags(monkeypatch):
    fake_memory(monkeypatch, free=GIB + 512 * MIB)  # below the margin of 2 GiB
    with pytest.raises(ConfigError) as error:
        fitting_sizes(fake_ctx(), argparse.Namespace(min_bytes=None, max_bytes=MIB), Outcome())
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(
        "collectives: all_reduce at the smallest size, 8 B, needs 18 B per process and 0 B"
    )  # 2 elements, twice, and a 2-byte mask
    assert "(1.50 GiB free, less a margin of 10% of the total + 1 GiB)" in text and "--min-bytes" in text


def test_usable_memory_leaves_the_margin_and_is_shared_by_the_ranks_of_a_host():
    assert memory.usable_bytes(20 * GIB, 10 * GIB, 1) == 18 * GIB
    assert memory.usable_bytes(20 * GIB, 10 * GIB, 4) == 18 * GIB // 4
    assert memory.usable_bytes(GIB, 10 * GIB, 1) == 0


def test_host_memory_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    8192 kB\n")
    assert memory.host_memory(meminfo) == (8192 * 1024, 16384 * 1024)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 1 << 20])
def test_chunked_count_equals_the_whole_tensor_comparison(chunk):
    out = torch.arange(1000, dtype=torch.float32)
    expected = out.clone()
    for i in (0, 6, 7, 63, 64, 500, 999):  # chunk boundaries for 7 and 64, the ends
        out[i] += 1
    out[300] = float("nan")  # NaN is never equal, as in the whole-tensor check
    expected[301] = float("inf")
    reference = int((out != expected).sum())
    assert reference == 9
    assert int(wrong_elements(out, expected, chunk)) == reference
    assert int(wrong_elements(expected, expected.clone(), chunk)) == 0  # inf equals inf


def test_chunked_count_allocates_no_message_sized_temporary():
    out, expected = torch.zeros(1 << 20), torch.ones(1 << 20)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        wrong = wrong_elements(out, expected, 1 << 16)
    assert int(wrong) == 1 << 20
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert 0 < largest <= 1 << 16  # one chunk's bool mask; the whole one would be 1 MiB


@pytest.mark.distributed
def test_two_ranks_seeing_different_free_memory_skip_the_same_sizes(tmp_path):
    run_ranks(WORKER, tmp_path)
    ranks = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["sizes"] == ranks[1]["sizes"]
    # the lesser rank's 40 KiB (rank 1) decides: at S KiB all_reduce needs 2.25 S, all_to_all 3.25 S
    assert ranks[0]["sizes"]["all_reduce"] == [1024 << i for i in range(5)]
    assert ranks[0]["sizes"]["all_to_all"] == [1024 << i for i in range(4)]
    assert (
        ranks[0]["rows"]
        == ranks[1]["rows"]
        == sum(len(s) * len(PLACEMENTS[op]) for op, s in ranks[0]["sizes"].items())
    )
    assert ranks[0]["printed"][0].startswith(
        "collectives: all_reduce: sizes above 16 KiB skipped: 32 KiB needs"
    )
    assert ranks[1]["printed"] == []  # rank 0 says it
