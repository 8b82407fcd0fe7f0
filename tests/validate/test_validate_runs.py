"""`gptrain validate` on real gloo process groups: report files, exit status, the slow node found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from validate_helpers import FAST, REPO, end, free_port, start_ranks

from gptrain.validate.bandwidth import OPS, bus_factor
from gptrain.validate.runtime import DELAY_ENV

pytestmark = pytest.mark.distributed
REQUIRED = {"op", "bytes", "in_place", "world_size", "time_us", "algbw_GBps", "busbw_GBps"}
# ranks that start together: --timeout 3 is also the rendezvous's wait for them (see the worker)
SYNCED = str(REPO / "tests" / "validate" / "synced_start_worker.py")


def synced(envs: list[dict[str, str]], tmp_path) -> list[dict[str, str]]:
    return [{**env, "GPTRAIN_TEST_START_DIR": str(tmp_path / "start")} for env in envs]


IN_TURN = str(REPO / "tests" / "validate" / "validate_runs_worker.py")
SMALL = ["--max-bytes", "64", "--iters", "1", "--warmup", "0", "--timeout", "60"]


def in_turn(root, world: int, runs: dict[str, tuple[list[str], list[dict[str, str]] | None]]) -> dict:
    """name: (codes, logs) of each `gptrain validate ARGV` run of `runs` (name: (ARGV, each rank's
    variables)), all in one launch of `world` ranks that run them in turn (one start-up); each run
    writes its reports into root/NAME (ARGV's {out})."""
    spec = []
    for name, (argv, envs) in runs.items():
        argv = [arg.replace("{out}", str(root / name)) for arg in argv]
        spec.append(
            {"argv": argv, "port": free_port(), "envs": envs or [{}] * world, "log": str(root / name)}
        )
    procs, launch_logs = start_ranks([IN_TURN, json.dumps(spec)], world, root)
    try:
        launched = [p.wait(timeout=90 * len(runs)) for p in procs]
    finally:
        end(procs)
    assert launched == [0] * world, launch_logs[0].read_text()[-3000:]
    results = {}
    for name in runs:
        logs = [root / f"{name}.rank{r}" for r in range(world)]
        codes = [int(Path(f"{log}.code").read_text()) for log in logs]
        results[name] = codes, [log.read_text() for log in logs]
    return results


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict]:
    """The plain two-rank runs below, in one launch."""
    root = tmp_path_factory.mktemp("two_ranks")
    runs = {
        "every_report": (["all", "--output-dir", "{out}", *FAST, "--min-busbw-GBps", "1e6"], None),
        "count": (["collectives", "--output-dir", "{out}", *SMALL], None),
    }
    return root, in_turn(root, 2, runs)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> tuple[Path, dict]:
    """The plain three-rank runs below, in one launch; n7 is in the exclude file beforehand."""
    root = tmp_path_factory.mktemp("three_ranks")
    (root / "exclude.txt").write_text("n7\n")  # from an earlier validation: merged, not replaced
    slow = [{"SLURMD_NODENAME": f"n{r + 1}", "GPTRAIN_VALIDATE_TEST_DELAY": "2:0.02"} for r in range(3)]
    runs = {
        "sizes_once": (["collectives", "--output-dir", "{out}", *SMALL], None),
        "slow_rank": (
            ["pairwise", "--output-dir", "{out}", *FAST, "--exclude-file", str(root / "exclude.txt")],
            slow,
        ),
    }
    return root, in_turn(root, 3, runs)


def test_two_ranks_write_every_report_and_fail_a_missed_threshold(two_ranks):
    root, results = two_ranks
    out = root / "every_report"  # all --output-dir OUT FAST --min-busbw-GBps 1e6
    codes, logs = results["every_report"]
    assert codes == [1, 1], logs[0]  # every rank exits with the verdict
    assert "FAILED collectives: all_reduce busbw" in logs[0] and "below the threshold 1e+06 GB/s" in logs[0]
    # every rank ran on this one machine: it is the node to blame (was "no single node is to blame")
    assert "no single node is to blame" not in logs[0] and "--exclude=" in logs[0]
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" in logs[0]
    rows = json.loads((out / "collectives.json").read_text())
    assert {r["op"] for r in rows} == set(OPS) and all(set(r) >= REQUIRED for r in rows)
    assert {(r["op"], r["in_place"]) for r in rows} >= {("all_gather", False), ("all_gather", True)}
    for r in rows:
        assert r["world_size"] == 2 and r["wrong"] == 0 and r["time_us"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9, rel=1e-9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * bus_factor(r["op"], 2), rel=1e-9)
    assert sorted({r["bytes"] for r in rows if r["op"] == "all_reduce"}) == [8 << i for i in range(10)]
    assert (out / "collectives.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pairs = json.loads((out / "pairwise.json").read_text())
    assert pairs["node"]["pairs"] == [] and [p["ranks"] for p in pairs["rank"]["pairs"]] == [[0, 1]]
    summary = json.loads((out / "validation.json").read_text())
    assert summary["passed"] is False and summary["world_size"] == 2
    gpus = json.loads((out / "gpus.json").read_text())
    assert gpus["gpus"] == [] if not torch.cuda.is_available() else gpus["gpus"]


def test_sizes_that_round_to_one_message_are_measured_once(three_ranks):
    """On 3 ranks all_gather's 8 B and 16 B are both one 12 B message (3 elements, one a rank):
    it was measured twice, written twice to the JSON, and the table showed one of the two."""
    root, results = three_ranks
    out = root / "sizes_once"  # collectives --output-dir OUT SMALL
    codes, logs = results["sizes_once"]
    assert codes == [0, 0, 0], logs[0]
    rows = json.loads((out / "collectives.json").read_text())
    keys = [(r["op"], r["bytes"], r["in_place"]) for r in rows]
    assert len(keys) == len(set(keys))
    gathered = sorted(r["bytes"] for r in rows if r["op"] == "all_gather" and not r["in_place"])
    assert gathered == [12, 24, 60]  # 8 and 16 B -> 3 elements, 32 B -> 6, 64 B -> 15
    table_lines = [line for line in logs[0].splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(table_lines) == len({(op, size) for op, size, _ in keys})


def test_count_is_the_calls_count_per_rank_as_nccl_tests_prints_it(two_ranks):
    """nccl-tests prints the size of the whole message and the count of the NCCL call: for
    all_gather, reduce_scatter and all_to_all one rank's chunk. The count printed and written was
    the whole message's, n times nccl-tests' on n ranks."""
    root, results = two_ranks
    out = root / "count"  # collectives --output-dir OUT SMALL
    codes, logs = results["count"]
    assert codes == [0, 0], logs[0]
    rows = json.loads((out / "collectives.json").read_text())
    for r in rows:
        per_rank = r["op"] in ("all_gather", "reduce_scatter", "all_to_all")
        assert r["count"] * 4 * (2 if per_rank else 1) == r["bytes"], r
    lines = [line.split() for line in logs[0].splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert ["64", "8", "float", "none"] in [line[:4] for line in lines]  # all_gather's 64 B, 8 a rank
    assert ["64", "16", "float", "sum"] in [line[:4] for line in lines]  # all_reduce's 64 B


def test_torchrun_two_processes_pass_when_thresholds_hold(tmp_path):
    out = tmp_path / "report"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "gptrain", "validate", "collectives", "--output-dir", str(out), *FAST]
    done = subprocess.run(
        command + ["--min-busbw-GBps", "1e-9"], capture_output=True, text=True, env=env, timeout=90
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validation passed" in done.stdout
    assert json.loads((out / "validation.json").read_text())["passed"] is True


def test_slow_rank_makes_its_node_the_one_to_exclude(three_ranks):
    """Three one-rank 'nodes'; the test hook delays every collective of rank 2 (node n3)."""
    root, results = three_ranks
    out, exclude = root / "slow_rank", root / "exclude.txt"  # n7 in it before
    codes, logs = results["slow_rank"]
    assert codes == [1, 1, 1], logs[0]
    assert "FAILED pairwise: node n3: best pair" in logs[0] and "--exclude=n3\n" in logs[0]
    assert "node n1" not in logs[0] and "node n2" not in logs[0]
    assert exclude.read_text() == "n[3,7]\n"
    data = json.loads((out / "pairwise.json").read_text())
    assert data["node"]["rounds"] == 3 and len(data["node"]["pairs"]) == 3
    assert list(data["node"]["verdict"]["flagged"]) == ["n3"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> tuple[Path, dict]:
    """The one-rank `gpus` runs on a machine without a GPU below, in one launch."""
    root = tmp_path_factory.mktemp("one_rank")
    node = {"SLURMD_NODENAME": "gpu-node-7"}
    runs = {
        "no_gpu": (["gpus", "--output-dir", "{out}"], None),
        "no_gpu_profile": (["gpus", "--output-dir", "{out}", "--profile", "aws_p5"], [node]),
    }
    return root, in_turn(root, 1, runs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_world_of_one_without_gpu_says_so_in_one_line(one_rank):
    codes, logs = one_rank[1]["no_gpu"]
    assert codes == [0]
    assert [line for line in logs[0].splitlines() if line.startswith("gpus:")] == [
        line for line in logs[0].splitlines() if "no CUDA GPU" in line
    ]
    [line] = [line for line in logs[0].splitlines() if "no CUDA GPU" in line]
    # what runs without one, not a bare "skipped" followed by "validation passed"
    assert "nothing was checked; `gptrain validate collectives` and `pairwise` run on CPUs (gloo)" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_no_gpu_fails_and_names_the_node_when_the_profile_expects_gpus(one_rank):
    root, results = one_rank
    out = root / "no_gpu_profile"
    codes, logs = results["no_gpu_profile"]
    assert codes == [1], logs[0]
    assert (
        "FAILED gpus: no CUDA GPU visible on gpu-node-7, but the profile aws_p5 sets GPU thresholds"
        in logs[0]
    )
    assert (
        "validation FAILED" in logs[0]
        and "gpu-node-7" in json.loads((out / "validation.json").read_text())["exclude"]
    )


def test_a_rank_whose_gpu_fails_leaves_at_once_in_one_line_naming_its_node(tmp_path):
    """Rank 1 raises a CUDA error in its pairwise check while rank 0 waits for it there. It went
    into the closing barrier, sat the whole --timeout and printed a gloo timeout traceback (the
    CUDA error buried above it): its exit is what lets torchrun or srun end rank 0."""
    worker = str(REPO / "tests" / "validate" / "failing_rank_worker.py")
    args = ["validate", "pairwise", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "600"]
    envs = [{"SLURMD_NODENAME": f"n{r + 1}"} for r in range(2)]
    procs, logs = start_ranks([worker, *args], 2, tmp_path, envs)
    try:
        code = procs[1].wait(timeout=60)
    finally:
        end(procs)  # rank 0 still waits for rank 1: the launcher's part
    text = logs[1].read_text()
    assert code == 1 and "Traceback" not in text, text
    assert text.strip().splitlines()[-1] == (
        "gptrain: error: validate: rank 1 on n2 stopped during pairwise: RuntimeError: CUDA error: "
        "unspecified launch failure; a GPU or network error there is the node's: leave it out "
        "(--exclude=n2) (GPTRAIN_DEBUG=1 shows where)"
    )


def test_a_sweep_that_stops_leaves_the_rows_it_measured(tmp_path):
    """Rank 1's GPU fails at the third measurement of the sweep (rank 0 then waits --timeout for
    it): collectives.json was written only after the whole sweep, so the two rows measured, the
    bandwidth up to the failure, were lost with it."""
    worker = str(REPO / "tests" / "validate" / "stopping_sweep_worker.py")
    out = tmp_path / "r"
    args = ["validate", "collectives", "--output-dir", str(out), *FAST[:-1], "3"]
    envs = synced([{"SLURMD_NODENAME": f"n{r + 1}"} for r in range(2)], tmp_path)
    procs, logs = start_ranks([worker, *args], 2, tmp_path, envs)
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        end(procs)
    assert codes == [1, 1], [log.read_text() for log in logs]
    rows = json.loads((out / "collectives.json").read_text())
    assert [(r["op"], r["bytes"]) for r in rows] == [("all_reduce", 8), ("all_reduce", 16)]
    assert all(r["world_size"] == 2 and r["wrong"] == 0 and r["time_us"] > 0 for r in rows)
    assert json.loads((out / "validation.json").read_text())["state"] == "stopped"


def test_pairs_that_stop_leave_the_node_pairs_measured_before(tmp_path):
    """Ranks 0 and 1 on n1, rank 2 on n2: the node pair n1-n2 runs, then rank 1's GPU fails in its
    pair with rank 0. pairwise.json was written after both levels only, and the node pairs, the
    ones that find a slow node, were lost with the failure."""
    worker = str(REPO / "tests" / "validate" / "stopping_pairs_worker.py")
    out = tmp_path / "r"
    args = ["validate", "pairwise", "--output-dir", str(out), *FAST[:-1], "3"]
    envs = synced([{"SLURMD_NODENAME": node} for node in ("n1", "n1", "n2")], tmp_path)
    procs, logs = start_ranks([worker, *args], 3, tmp_path, envs)
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        end(procs)
    assert codes == [1, 1, 1], [log.read_text() for log in logs]
    data = json.loads((out / "pairwise.json").read_text())
    assert list(data) == ["node"] and [p["ranks"] for p in data["node"]["pairs"]] == [[0, 1, 2]]
    assert data["node"]["pairs"][0]["busbw_GBps"] > 0
    assert json.loads((out / "validation.json").read_text())["state"] == "stopped"


def test_a_pair_whose_partner_hangs_gives_up_after_the_timeout(tmp_path):
    """Rank 1 stops (the test hook sleeps 600 s before its pair's all_reduce). The pair groups
    were made with torch's default timeout, 30 minutes for gloo, whatever --timeout said: rank 0
    waited that long. Now it gives up after --timeout 3 s, in one line."""
    args = ["validate", "pairwise", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "3"]
    envs = [{"SLURMD_NODENAME": "n1"}, {"SLURMD_NODENAME": "n2", "GPTRAIN_VALIDATE_TEST_DELAY": "1:600"}]
    procs, logs = start_ranks(["-m", "gptrain", *args], 2, tmp_path, envs)
    try:
        code = procs[0].wait(timeout=120)  # start-up, 3 s and the exit; 30 minutes before
    finally:
        end(procs)
    text = logs[0].read_text()
    assert code == 1 and "Traceback" not in text, text
    assert "gptrain: error: validate: rank 0 on n1 stopped during pairwise: " in text
    assert "Timed out" in text


@pytest.mark.parametrize("late", [None, "1:1.5", "0:1.5"], ids=["together", "rank-1-late", "rank-0-late"])
def test_a_rank_that_hangs_is_named_with_its_node_by_every_rank_that_waited(tmp_path, late):
    """Rank 2 (node n3) stops before its first timed collective. Ranks 0 and 1 timed out saying
    only gloo's "Timed out waiting 3000ms for recv" and their own rank and node, so the user left
    out n1 and n2; now each names rank 2 on n3 and its --exclude. Rank 0 hosts the store the
    names are found in: it left as soon as it had its own answer, and a rank that timed out later
    (rank 1 entering the collective 1.5 s after rank 0) lost the store and named no one. The first
    rank to time out drops its connections: a neighbour still waiting (rank 0 entering 1.5 s after
    rank 1) saw gloo's "Connection closed by peer" instead of its timeout and named no one."""
    args = ["validate", "collectives", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "3"]
    envs = [{"SLURMD_NODENAME": f"n{r + 1}"} for r in range(3)]
    envs[2][DELAY_ENV] = "2:600"
    if late:
        envs[int(late[0])][DELAY_ENV] = late
    procs, logs = start_ranks([SYNCED, *args], 3, tmp_path, synced(envs, tmp_path))
    try:
        codes = [procs[r].wait(timeout=120) for r in (0, 1)]
    finally:
        end(procs)
    for rank, code in zip((0, 1), codes, strict=True):
        text = logs[rank].read_text()
        assert code == 1 and "Traceback" not in text, text
        line = text.strip().splitlines()[-1]  # last: no warning from a store left too early after it
        assert line.startswith(
            f"gptrain: error: validate: rank {rank} on n{rank + 1} stopped during collectives:"
        ), text
        # "its peers": cut off by the other's timeout before its own (rank 0 when it is late)
        named = [
            f"; {who} waited --timeout 3 s for rank 2 on n3, which did not answer"
            for who in ("it", "its peers")
        ]
        assert any(words in line for words in named), line
        assert "leave it out (--exclude=n3)" in line and "--exclude=n1" not in line, line
        assert "--exclude=n2" not in line, line


def test_under_torchrun_every_rank_that_waited_names_the_hung_one(tmp_path):
    """torchrun ends every rank once one exits with an error: each rank that waited for the hung
    one stays until all of them have printed their line, then they leave."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    env.update({"SLURMD_NODENAME": "n1", DELAY_ENV: "2:600", "GPTRAIN_TEST_START_DIR": str(tmp_path / "s")})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", SYNCED]
    command += ["validate", "collectives", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "3"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=150)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("gptrain: error: validate: rank ")]
    assert sorted(line.split(" on ")[0] for line in lines) == [
        "gptrain: error: validate: rank 0",
        "gptrain: error: validate: rank 1",
    ], done.stderr
    for line in lines:  # the later rank may see the first one's timeout close its connection
        assert "waited --timeout 3 s for rank 2 on n1, which did not answer" in line, line


def test_the_node_of_a_rank_that_hangs_goes_to_the_exclude_file(tmp_path):
    """The launcher's validation stage passes --exclude-file so that the next launch leaves the
    blamed nodes out; a hung rank's node was named on stderr only, and the next launch could land
    on it again. The first rank that timed out merges it into the file (once)."""
    exclude = tmp_path / "exclude_nodes.txt"
    exclude.write_text("n7\n")
    args = ["validate", "collectives", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "3"]
    args += ["--exclude-file", str(exclude)]
    envs = [{"SLURMD_NODENAME": f"n{r + 1}"} for r in range(3)]
    envs[2][DELAY_ENV] = "2:600"
    procs, logs = start_ranks([SYNCED, *args], 3, tmp_path, synced(envs, tmp_path))
    try:
        codes = [procs[r].wait(timeout=120) for r in (0, 1)]
    finally:
        end(procs)
    assert codes == [1, 1], logs[0].read_text()
    assert exclude.read_text() == "n[3,7]\n"
    texts = [logs[r].read_text() for r in (0, 1)]
    assert sum(f"(--exclude=n3, added to {exclude})" in t for t in texts) == 1, texts
    assert sum("(--exclude=n3)" in t for t in texts) == 1, texts


def test_a_rank_that_never_starts_is_one_line_not_a_traceback(tmp_path):
    """Rank 2 of 3 never starts (its node down): ranks 0 and 1 printed torch's rendezvous
    traceback ('Timed out after 6 seconds waiting for clients. 2/3 clients joined.'); each now
    prints one line saying the group did not form and why that happens."""
    args = ["validate", "collectives", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "3"]
    envs = [{"SLURMD_NODENAME": f"n{r + 1}"} for r in range(3)]
    procs, logs = start_ranks(["-m", "gptrain", *args], 3, tmp_path, envs)
    procs[2].kill()
    try:
        codes = [procs[r].wait(timeout=120) for r in (0, 1)]
    finally:
        end(procs)
    for rank, code in zip((0, 1), codes, strict=True):
        text = logs[rank].read_text()
        assert code == 1 and "Traceback" not in text, text
        line = text.strip().splitlines()[-1]
        assert line.startswith(
            f"gptrain: error: validate: rank {rank} on n{rank + 1} could not start the process group of 3"
            " ranks at 127.0.0.1:"
        ), line
        assert "within --timeout 3 s: DistStoreError: " in line and "a rank that never started" in line


def test_dcgmi_starts_once_every_gpu_of_its_node_is_measured(tmp_path):
    """dcgmi diag ran as soon as the node's first rank had timed its own GPU: a level 2 or more
    loads every GPU of the node, and the ranks still timing theirs measured it (and were flagged
    slow). dcgmi now waits for every rank's measurements."""
    worker = str(REPO / "tests" / "validate" / "dcgm_overlap_worker.py")
    times = tmp_path / "times"
    times.mkdir()
    args = ["validate", "gpus", "--output-dir", str(tmp_path / "r"), *FAST, "--dcgm-level", "2"]
    env = {"SLURMD_NODENAME": "n1", "GPTRAIN_TEST_TIMES_DIR": str(times), "GPTRAIN_TEST_MATMUL_S": "3"}
    procs, logs = start_ranks([worker, *args], 2, tmp_path, synced([env, env], tmp_path))
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        end(procs)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], texts
    dcgm_start = json.loads((times / "dcgm0.json").read_text())[0]
    matmul_end = json.loads((times / "matmul1.json").read_text())[1]
    assert dcgm_start >= matmul_end


def test_ranks_wait_past_the_timeout_for_a_node_running_dcgmi(tmp_path):
    """dcgmi diag runs on one rank a node while the others wait in the gather of the GPU records.
    They waited --timeout only (600 s by default, less than a level 3 takes), then named the rank
    running dcgmi as hung; now they wait --timeout plus dcgmi's own limit for its level."""
    worker = str(REPO / "tests" / "validate" / "slow_gpu_check_worker.py")
    args = ["validate", "gpus", "--output-dir", str(tmp_path / "r"), *FAST[:-1], "2", "--dcgm-level", "1"]
    envs = synced(
        [{"SLURMD_NODENAME": f"n{r + 1}", "GPTRAIN_TEST_GPU_CHECK_S": "5"} for r in range(2)], tmp_path
    )
    procs, logs = start_ranks([worker, *args], 2, tmp_path, envs)
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        end(procs)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], texts
    assert "validation passed" in texts[0] and "stopped during gpus" not in texts[1], texts
    records = json.loads((tmp_path / "r" / "gpus.json").read_text())["gpus"]
    assert [r["rank"] for r in records] == [0, 1]
