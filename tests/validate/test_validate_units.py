"""Bandwidth formulas, sweeps, host lists, pair schedules and verdicts on known inputs (no processes)."""

from __future__ import annotations

import itertools
import json

import pytest

from gptrain.errors import ConfigError
from gptrain.launch.cluster_profiles import CLUSTER_DIR
from gptrain.validate import bandwidth as bw
from gptrain.validate import report
from gptrain.validate.pairwise import PairResult, bisection, find_slow, round_robin, schedule
from gptrain.validate.thresholds import load_thresholds


@pytest.mark.parametrize(
    ("op", "n", "nbytes", "seconds", "algbw", "busbw"),
    [
        # worked by hand from nccl-tests' PERFORMANCE.md definitions
        ("all_reduce", 8, 1 << 30, 0.010, 107.3741824, 107.3741824 * 14 / 8),
        ("all_reduce", 2, 4_000_000, 0.001, 4.0, 4.0),  # 2(n-1)/n = 1 for two ranks
        ("all_gather", 4, 8_000_000, 0.002, 4.0, 3.0),
        ("reduce_scatter", 16, 1_000_000_000, 0.5, 2.0, 2.0 * 15 / 16),
        ("all_to_all", 8, 800, 1e-6, 0.8, 0.7),
        ("broadcast", 8, 1_000_000, 0.0001, 10.0, 10.0),
        ("all_reduce", 1, 1024, 1e-6, 1.024, 0.0),  # one rank moves nothing
    ],
)
def test_bandwidths_match_nccl_tests_definitions(op, n, nbytes, seconds, algbw, busbw):
    assert bw.algbw_GBps(nbytes, seconds) == pytest.approx(algbw)
    assert bw.busbw_GBps(op, nbytes, seconds, n) == pytest.approx(busbw)


def test_element_counts_split_evenly_and_sweep_doubles():
    assert bw.element_count("all_reduce", 8, 8) == 2
    assert bw.element_count("all_gather", 8, 8) == 8  # at least one element per rank
    assert bw.element_count("reduce_scatter", 1000, 3) == 249  # 250 rounded down to a multiple of 3
    assert bw.size_sweep(8, 64) == [8, 16, 32, 64]
    assert bw.size_sweep(8, 100) == [8, 16, 32, 64, 100]
    assert (
        bw.parse_bytes("8G") == 8 << 30
        and bw.parse_bytes("64KiB") == 65536
        and bw.parse_bytes("512MB") == 512 << 20
    )
    with pytest.raises(ValueError, match="not a size"):
        bw.parse_bytes("lots")
    with pytest.raises(ValueError):
        bw.size_sweep(64, 8)


def test_exclude_line_is_quoted_for_the_shell():
    """The --exclude= line is pasted into a shell: its brackets are quoted (zsh's nomatch refused
    `--exclude=n[1-2]`, bash globbed it against the files of the directory)."""
    import shlex

    line = report.exclude_line(["n1", "n2", "gpu07"])
    assert line == "--exclude='gpu07,n[1-2]'"
    assert shlex.split(line) == ["--exclude=gpu07,n[1-2]"]
    assert report.exclude_line(["n1", "n2"], quoted=False) == "--exclude=n[1-2]"  # validation.json's


def test_hostlist_is_slurm_syntax():
    assert report.compress_hostlist(["n3", "n1", "n2", "n7"]) == "n[1-3,7]"
    assert report.compress_hostlist(["gpu-01", "gpu-02", "login"]) == "login,gpu-[01-02]"
    assert report.exclude_line(["n5"]) == "--exclude=n5"
    from gptrain.utils.hostlist import expand_hostlist

    hosts = ["a1", "a2", "a4", "b09", "b10", "c"]
    assert sorted(expand_hostlist(report.compress_hostlist(hosts))) == sorted(hosts)


def test_an_exclude_file_with_blank_lines_and_repeated_hosts_merges_into_one_host_list(tmp_path):
    from gptrain.validate.main import add_to_exclude_file

    path = tmp_path / "exclude_nodes.txt"
    path.write_text("n2\n\n   \nn2\nn[1-2]\n")
    add_to_exclude_file(path, {"n3", "n1"})
    assert path.read_text() == "n[1-3]\n"


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_round_robin_meets_every_pair_once(n):
    members = [f"n{i}" for i in range(n)]
    rounds = round_robin(members)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == sorted(tuple(sorted(p)) for p in itertools.combinations(members, 2))
    for r in rounds:  # nobody plays twice in a round
        seen = [m for p in r for m in p]
        assert len(seen) == len(set(seen))
    assert len(rounds) == (n if n % 2 else n - 1)  # odd: one member sits out each round


def test_bisection_pairs_halves_with_new_partners():
    members = [f"n{i}" for i in range(8)]
    rounds = bisection(members, 3)
    assert len(rounds) == 3 and all(len(r) == 4 for r in rounds)
    for r in rounds:
        assert all((int(a[1:]) < 4) != (int(b[1:]) < 4) for a, b in r)
    assert len({p for r in rounds for p in r}) == 12


@pytest.mark.parametrize("max_all_pairs", [16, 1])
def test_every_member_is_paired_whatever_the_count(max_all_pairs):
    for n in range(2, 40):
        members = [f"n{i:02d}" for i in range(n)]
        rounds = schedule(members, max_all_pairs, 3)
        assert {m for r in rounds for p in r for m in p} == set(members), n
        for r in rounds:  # nobody is in two pairs of one round
            seen = [m for p in r for m in p]
            assert len(seen) == len(set(seen)), n


def pair(a, b, busbw):
    return PairResult("node", a, b, [], 1, 1.0, busbw)


def test_find_slow_names_the_member_that_slows_every_pair():
    results = [pair("n1", "n2", 100), pair("n1", "n3", 20), pair("n2", "n3", 21), pair("n1", "n4", 98)]
    results += [pair("n2", "n4", 101), pair("n3", "n4", 19)]
    verdict = find_slow("node", results, slow_pct=10)
    assert list(verdict.flagged) == ["n3"]
    assert verdict.scores["n3"] == 21 and verdict.median == pytest.approx(100.5)  # scores 100, 101, 21, 101


def test_two_members_are_only_judged_by_the_absolute_threshold():
    assert find_slow("node", [pair("n1", "n2", 5)], slow_pct=10).flagged == {}
    verdict = find_slow("node", [pair("n1", "n2", 5)], slow_pct=10, min_busbw=30)
    assert sorted(verdict.flagged) == ["n1", "n2"]


def test_the_inter_node_threshold_is_a_whole_nodes_and_scales_with_the_ranks_a_node(capsys):
    """aws_p5's 240 GB/s is 8 GPUs' NICs together: `srun -N2 -n2` (one rank a node) failed healthy
    nodes at about a quarter of it; the threshold now takes the ranks' share of the node's NICs."""
    from types import SimpleNamespace

    from gptrain.validate.main import Outcome, busbw_threshold

    p5 = load_thresholds("aws_p5")
    assert p5.gpus_per_node == 8 and p5.busbw_threshold(True) == 240
    rows = [{"op": "all_reduce", "bytes": 1 << 30, "busbw_GBps": 40.0}]
    for nodes, threshold, failed in ((["a", "b"], 30.0, False), (["a"] * 8 + ["b"] * 8, 240.0, True)):
        ctx = SimpleNamespace(rank=0, size=len(nodes), nodes=nodes, multi_node=True)
        out = Outcome()
        busbw_threshold(rows, p5, ctx, out)
        assert out.summary["busbw_threshold_GBps"] == pytest.approx(threshold)
        assert bool(out.failures) is failed
    assert "1 rank(s) a node of the profile's 8" in capsys.readouterr().out
    uneven = SimpleNamespace(rank=0, size=3, nodes=["a", "b", "b"], multi_node=True)
    out = Outcome()
    busbw_threshold(rows, p5, uneven, out)  # the node with one rank drives one GPU's NICs
    assert out.summary["busbw_threshold_GBps"] == pytest.approx(30.0)
    pinned = load_thresholds("aws_p5", 100.0)  # --min-busbw-GBps is taken as given
    ctx = SimpleNamespace(rank=0, size=2, nodes=["a", "b"], multi_node=True)
    out = Outcome()
    busbw_threshold(rows, pinned, ctx, out)
    assert out.summary["busbw_threshold_GBps"] == 100.0 and out.failures


def test_node_pairs_are_judged_by_the_share_of_the_node_their_ranks_drive(monkeypatch, tmp_path):
    """`srun -N2 -n2` on p5: collectives held the node pair to one GPU's share of the 240 GB/s
    (30 GB/s), but pairwise held it to the whole 240 and blamed both healthy nodes."""
    import argparse
    from types import SimpleNamespace

    from gptrain.validate import pairwise
    from gptrain.validate.main import Outcome, check_pairwise

    p5 = load_thresholds("aws_p5")
    monkeypatch.setattr(pairwise, "node_rounds", lambda ctx, most, rounds: [[("a", "b")]])
    monkeypatch.setattr(pairwise, "rank_rounds", lambda ctx, most, rounds: [])
    measured = {"a": 40.0}

    def run_round(ctx, level, pairs, nbytes, iters, warmup):
        return [pairwise.PairResult("node", "a", "b", [0, 1], nbytes, 1.0, measured["a"])]

    monkeypatch.setattr(pairwise, "run_round", run_round)
    args = argparse.Namespace(pair_bytes=None, max_all_pairs=16, iters=1, warmup=0, output_dir=str(tmp_path))
    for nodes, busbw, failed in (
        (["a", "b"], 40.0, False),
        (["a", "b"], 20.0, True),
        (["a"] * 8 + ["b"] * 8, 40.0, True),
    ):
        measured["a"] = busbw
        ctx = SimpleNamespace(rank=0, size=len(nodes), nodes=nodes, is_gpu=True)
        out = Outcome()
        check_pairwise(ctx, args, p5, out)
        assert bool(out.failures) is failed, out.failures
        if failed:
            threshold = "30" if len(nodes) == 2 else "240"
            assert out.failures[0] == (
                f"pairwise: node a: best pair {busbw:.3g} GB/s is below the threshold {threshold} GB/s"
            )


def test_a_launched_validation_knows_the_node_its_threshold_is_set_for(tmp_path):
    """The launch stage's job yaml held the thresholds but not the cluster's gpus_per_node, so a
    launched validation with fewer ranks a node than the profile's held them to the whole node's."""
    from gptrain.config.yamlio import load_file
    from gptrain.launch.validation_stage import stage_config

    cluster = load_file(CLUSTER_DIR / "aws_p5.yaml")
    job = tmp_path / "job_hydra.yaml"
    job.write_text(json.dumps(stage_config({"checks": "all"}, cluster)))
    limits = load_thresholds(str(job))
    assert limits.gpus_per_node == 8 and limits.partial_node_share(4) == 0.5


def test_a_cluster_file_asking_for_gpus_by_gres_sets_the_node_its_threshold_is_for(tmp_path):
    """A cluster file with gres: gpu:8 and gpus_per_node: null (how a site asks by gres only) gave
    no node size, so `srun -N2 -n2` held two GPUs' NICs to the whole node's 240 GB/s and failed
    healthy nodes; launched, the stage's yaml carried the null on."""
    from gptrain.launch.validation_stage import stage_config

    site = tmp_path / "site.yaml"
    site.write_text("gpus_per_node: null\ngres: gpu:h100:8\nvalidation:\n  inter_node_busbw_GBps: 240\n")
    assert load_thresholds(str(site)).partial_node_share(2) == 0.25
    cluster = {"gpus_per_node": None, "gres": "gpu:8", "validation": {"inter_node_busbw_GBps": 240}}
    job = tmp_path / "job_hydra.yaml"
    job.write_text(json.dumps(stage_config({"checks": "all"}, cluster)))
    assert load_thresholds(str(job)).partial_node_share(2) == 0.25
    site.write_text("gpus_per_node: null\ngres: null\nvalidation:\n  inter_node_busbw_GBps: 240\n")
    assert load_thresholds(str(site)).partial_node_share(2) == 1.0  # a CPU cluster: no node size


def test_a_cluster_files_gpus_per_node_is_read_as_the_launcher_reads_it(tmp_path):
    """gpus_per_node: "8" (text, which the launcher reads as 8) or a value it refuses was taken for no
    node size: `srun -N2 -n2` was held to the whole node's 240 GB/s and both healthy nodes failed."""
    site = tmp_path / "site.yaml"
    site.write_text('gpus_per_node: "8"\nvalidation:\n  inter_node_busbw_GBps: 240\n')
    assert load_thresholds(str(site)).partial_node_share(2) == 0.25
    site.write_text("gpus_per_node: 0\ngres: gpu:8\nvalidation:\n  inter_node_busbw_GBps: 240\n")
    assert load_thresholds(str(site)).partial_node_share(2) == 0.25  # 0 asks for none: the gres's 8
    for value, shown in (("eight", "'eight' (str)"), ("true", "True (bool)"), ("-8", "-8")):
        site.write_text(f"gpus_per_node: {value}\nvalidation:\n  inter_node_busbw_GBps: 240\n")
        with pytest.raises(ConfigError) as error:
            load_thresholds(str(site))
        assert str(error.value).startswith(f"{site}: gpus_per_node: expected a whole number")
        assert str(error.value).endswith(f"got {shown}")


def test_profiles_load_with_sources_and_bad_ones_say_what_to_do(tmp_path):
    p5 = load_thresholds("aws_p5")
    assert p5.matmul_tflops and p5.copy_GBps and p5.busbw_threshold(True) < p5.busbw_threshold(False)
    assert load_thresholds("aws_p5", 12.5).busbw_threshold(True) == 12.5
    assert load_thresholds(None).busbw_threshold(False) is None
    with pytest.raises(ConfigError, match="no bundled profile of that name; give a bundled profile.*aws_p5"):
        load_thresholds("aws_p6")
    bad = tmp_path / "c.yaml"
    bad.write_text("validation:\n  matmul_tflop: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown key validation.matmul_tflop"):
        load_thresholds(str(bad))
    bad.write_text("validation:\n  thresholds:\n    copy_GBps: fast\n")
    with pytest.raises(ConfigError, match="copy_GBps must be a number"):
        load_thresholds(str(bad))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("slow_pct: -5", "validation.slow_pct must be a percentage between 0 and 100, got -5"),
        ("slow_pct: 100", "validation.slow_pct must be a percentage between 0 and 100, got 100"),
        (
            "large_message_bytes: 0",
            "validation.large_message_bytes: size must be a positive finite number of bytes: '0'",
        ),
        ("matmul_tflops: .nan", "validation.matmul_tflops must be a positive finite number, got nan"),
        ("copy_GBps: -1", "validation.copy_GBps must be a positive finite number, got -1"),
        # infinite: every node failed and excluded, Infinity (no JSON) in validation.json
        ("copy_GBps: .inf", "validation.copy_GBps must be a positive finite number, got inf"),
        (
            "inter_node_busbw_GBps: 1e400",
            "validation.inter_node_busbw_GBps must be a positive finite number, got inf",
        ),
        # int(inf) raised OverflowError: a traceback instead of this line
        (
            "large_message_bytes: .inf",
            "validation.large_message_bytes: size must be a positive finite number of bytes: 'inf'",
        ),
    ],
)
def test_a_threshold_that_would_turn_its_check_off_is_refused(tmp_path, line, message):
    """A nan or negative rate never fails a comparison, and slow_pct outside (0, 100) flags every
    GPU or none: each would pass a sick node as healthy, or blame a healthy one, in silence."""
    profile = tmp_path / "c.yaml"
    profile.write_text(f"validation:\n  {line}\n")
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(profile))
    assert str(error.value) == f"{profile}: {message}"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # YAML's true/yes/on read as 1.0: a 1 TFLOP/s floor nothing misses, GPUs flagged 1% below the median
        ("matmul_tflops: true", "validation.matmul_tflops must be a number, got True"),
        ("slow_pct: yes", "validation.slow_pct must be a number, got True"),
        ("intra_node_busbw_GBps: on", "validation.intra_node_busbw_GBps must be a number, got True"),
        # int() cut 1.5 GiB written as 1610612736.5 bytes to a size nobody wrote
        (
            "large_message_bytes: 1610612736.5",
            "validation.large_message_bytes: size must be a whole number of bytes: '1610612736.5'",
        ),
    ],
)
def test_a_threshold_of_the_wrong_type_is_refused(tmp_path, line, message):
    profile = tmp_path / "c.yaml"
    profile.write_text(f"validation:\n  {line}\n")
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(profile))
    assert str(error.value) == f"{profile}: {message}"


def test_a_whole_message_size_written_as_a_float_is_read_as_bytes(tmp_path):
    profile = tmp_path / "c.yaml"
    profile.write_text("validation:\n  large_message_bytes: 1.0e9\n")
    assert load_thresholds(str(profile)).large_message_bytes == 1_000_000_000


@pytest.mark.parametrize(("written", "size"), [("1GiB", 1 << 30), ("512M", 512 << 20), ("1.5G", 3 << 29)])
def test_a_message_size_is_read_as_the_cli_reads_sizes(tmp_path, written, size):
    """`large_message_bytes: 1GiB` was 'must be a number' while `--max-bytes 1GiB` was taken."""
    profile = tmp_path / "c.yaml"
    profile.write_text(f"validation:\n  large_message_bytes: {written}\n")
    assert load_thresholds(str(profile)).large_message_bytes == size == bw.parse_bytes(written)


def test_a_message_size_that_is_none_is_the_cli_options_error_after_its_key(tmp_path, capsys):
    from gptrain.cli import build_parser

    profile = tmp_path / "c.yaml"
    profile.write_text("validation:\n  large_message_bytes: huge\n")
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(profile))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["validate", "collectives", "--output-dir", "x", "--max-bytes", "huge"])
    said = "not a size: 'huge' (e.g. 8, 64K, 1M, 8G)"
    assert str(error.value) == f"{profile}: validation.large_message_bytes: {said}"
    assert capsys.readouterr().err.strip().endswith(f"argument --max-bytes: {said}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # the thresholds written flat, as the --profile help's "a YAML path" invites
        (
            "inter_node_busbw_GBps: 240\n",
            "inter_node_busbw_GBps is a key of the validation block; put it under validation:"
            " (validation.inter_node_busbw_GBps)",
        ),
        (
            "gpus_per_node: 8\nvalidaton:\n  inter_node_busbw_GBps: 240\n",
            "cluster.validaton: unknown cluster key; did you mean 'cluster.validation'?",
        ),
    ],
)
def test_a_cluster_file_whose_thresholds_are_not_under_validation_is_refused(tmp_path, text, message):
    """Thresholds beside `validation:`, or under a misspelt one, were ignored: the profile loaded
    with no threshold at all, so a cluster far below its rates passed."""
    profile = tmp_path / "site.yaml"
    profile.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(profile))
    assert str(error.value) == f"{profile}: {message}"


def test_a_threshold_beside_a_thresholds_block_is_refused(tmp_path):
    """validation: {thresholds: {...}, slow_pct: 5}: the thresholds were read from the inner block
    alone, and the slow_pct beside it was dropped without a word (10% applied)."""
    profile = tmp_path / "site.yaml"
    profile.write_text("validation:\n  thresholds:\n    copy_GBps: 5\n  slow_pct: 5\n")
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(profile))
    assert str(error.value) == (
        f"{profile}: validation.slow_pct is beside validation.thresholds, where the thresholds are read"
        " from then; move it under thresholds (validation.thresholds.slow_pct)"
    )
    profile.write_text("validation:\n  thresholds:\n    copy_GBps: 5\n    slow_pct: 5\n")
    assert load_thresholds(str(profile)).slow_pct == 5


def test_every_bundled_cluster_file_passes_the_key_check():
    for path in sorted(CLUSTER_DIR.glob("*.yaml")):
        assert load_thresholds(str(path)).slow_pct == 10


def test_table_has_nccl_tests_columns_and_na_for_missing_placements():
    rows = [
        dict(
            op="all_gather",
            bytes=64,
            count=8,  # per rank, as nccl-tests prints it
            dtype="float",
            redop="none",
            root=-1,
            in_place=ip,
            world_size=2,
            nodes=1,
            backend="gloo",
            time_us=10.0 + ip,
            algbw_GBps=0.5,
            busbw_GBps=0.25,
            wrong=0,
        )
        for ip in (False, True)
    ]
    rows.append({**rows[0], "op": "all_to_all"})
    text = report.table(rows)
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("64") and "N/A" not in x)
    assert line.split() == [
        "64",
        "8",
        "float",
        "none",
        "-1",
        "10.0",
        "0.50",
        "0.25",
        "0",
        "11.0",
        "0.50",
        "0.25",
        "0",
    ]
    assert any(x.split()[-4:] == ["N/A"] * 4 for x in text.splitlines() if x.strip().startswith("64"))
    json.dumps(rows)


def test_every_node_below_the_threshold_alike_is_the_fabric_not_a_node():
    """EFA not in use, a wrong NCCL transport: excluding every node would block every launch."""
    results = [pair("n1", "n2", 5), pair("n1", "n3", 5.2), pair("n2", "n3", 4.9), pair("n3", "n4", 5.1)]
    verdict = find_slow("node", results, slow_pct=10, min_busbw=30)
    assert verdict.flagged == {} and verdict.fabric.startswith("every node pair is below the threshold 30")
    one_slow = results + [pair("n1", "n4", 40), pair("n2", "n4", 41)]  # n3 slows every pair it is in
    verdict = find_slow("node", one_slow, slow_pct=10, min_busbw=30)
    assert verdict.fabric is None and list(verdict.flagged) == ["n3"]


def test_a_slow_fabric_with_one_node_slower_still_excludes_only_that_node():
    """Every pair below the threshold (TCP instead of EFA) and one node far below the others: the
    others were flagged by the threshold and every node went to the exclude file, which the fabric
    verdict is there to prevent; now the fabric is named and only the slower node flagged."""
    results = [pair("n1", "n2", 5), pair("n1", "n3", 2), pair("n2", "n3", 1.9), pair("n1", "n4", 5.2)]
    results += [pair("n2", "n4", 5.1), pair("n3", "n4", 2.1)]
    verdict = find_slow("node", results, slow_pct=10, min_busbw=30)
    assert verdict.fabric is not None and verdict.fabric.startswith(
        "every node pair is below the threshold 30"
    )
    assert list(verdict.flagged) == ["n3"] and "below the median" in verdict.flagged["n3"]


@pytest.mark.parametrize(
    ("check", "advice"),
    [
        (
            "collectives",
            "no single node is to blame; run `gptrain validate pairwise` across the nodes to find it",
        ),
        (
            "all",
            "no single node is to blame: pairwise found none slower than its peers (see the lines above)",
        ),
    ],
)
def test_a_failure_blaming_no_node_says_to_run_pairwise_only_where_it_did_not_run(
    monkeypatch, tmp_path, capsys, check, advice
):
    """A slow fabric under `validate all`: the collectives and pairwise failed, pairwise named the
    fabric and no node, and the verdict still said to run pairwise, which had just run."""
    import argparse
    from types import SimpleNamespace

    import torch.distributed as dist

    from gptrain.validate import main as validate_main

    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: None)
    ctx = SimpleNamespace(rank=0, size=3, nodes=["n1", "n2", "n3"])
    args = argparse.Namespace(check=check, exclude_file=None, output_dir=str(tmp_path))
    out = validate_main.Outcome(
        failures=["collectives: all_reduce busbw 5 GB/s is below the threshold 240 GB/s"]
    )
    assert validate_main.conclude(ctx, args, out) == 1
    assert advice in capsys.readouterr().out.splitlines()


def test_validation_json_keeps_the_bare_exclude_line_the_shell_gets_quoted(monkeypatch, tmp_path, capsys):
    """The printed --exclude= line is quoted for a shell (`n[1-2]` would glob); validation.json is read
    by programs, which would take the quotes as part of the host list: it keeps the bare one, and the
    exclude file the host list alone."""
    import argparse
    import json
    from types import SimpleNamespace

    import torch.distributed as dist

    from gptrain.validate import main as validate_main

    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: None)
    ctx = SimpleNamespace(rank=0, size=3, nodes=["n1", "n2", "gpu07"])
    exclude_file = tmp_path / "exclude_nodes.txt"
    args = argparse.Namespace(check="gpus", exclude_file=str(exclude_file), output_dir=str(tmp_path))
    out = validate_main.Outcome(failures=["gpus: n1, n2 slow"], bad_nodes={"n1", "n2", "gpu07"})
    assert validate_main.conclude(ctx, args, out) == 1
    assert "--exclude='gpu07,n[1-2]'" in capsys.readouterr().out.splitlines()
    summary = json.loads((tmp_path / "validation.json").read_text())
    assert summary["exclude"] == "--exclude=gpu07,n[1-2]"
    assert summary["passed"] is False and summary["nodes"] == ["gpu07", "n1", "n2"]
    assert exclude_file.read_text() == "gpu07,n[1-2]\n"


def test_a_hang_line_comes_out_when_the_exclude_file_cannot_be_written(monkeypatch, tmp_path):
    """The first rank that timed out merges the hung nodes into --exclude-file inside the timeout's
    handler; a file that failed there (full disk, garbled since the early check) was a traceback
    in place of the line naming the hung rank."""
    from types import SimpleNamespace

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    monkeypatch.setattr(runtime, "is_timeout", lambda error: True)
    monkeypatch.setattr(runtime, "unanswered_ranks", lambda ctx, wait, cut_off_s=None: ([1], True))

    def full_disk(path, nodes):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(validate_main, "add_to_exclude_file", full_disk)
    ctx = SimpleNamespace(rank=0, size=2, nodes=["n1", "n2"])
    line, listed = validate_main.hung_peers(ctx, RuntimeError("timed out"), 5.0, str(tmp_path / "exclude"))
    assert listed
    assert "rank 1 on n2" in line and "--exclude=n2" in line
    assert "not added to" in line and "No space left on device" in line


def test_the_hang_and_rank_failure_lines_quote_their_exclude(monkeypatch):
    """The --exclude= in the hang line and a failed rank's hint is pasted into a shell too."""
    from types import SimpleNamespace

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    monkeypatch.setattr(runtime, "is_timeout", lambda error: True)
    monkeypatch.setattr(runtime, "unanswered_ranks", lambda ctx, wait, cut_off_s=None: ([1, 2], True))
    ctx = SimpleNamespace(rank=0, size=3, nodes=["n0", "n1", "n2"])
    line, _ = validate_main.hung_peers(ctx, RuntimeError("timed out"), 5.0)
    assert "(--exclude='n[1-2]')" in line, line
    monkeypatch.undo()  # a CUDA error, not a timeout
    ctx = SimpleNamespace(rank=0, node="gpu[7]", is_gpu=False)
    failed = validate_main.rank_failure(ctx, "collectives", RuntimeError("CUDA error: unknown"))
    assert "(--exclude='gpu[7]')" in failed, failed


def test_a_rank_cut_off_by_a_peer_does_not_fix_the_list_of_hung_ranks(monkeypatch):
    """A rank whose collective ended with "Connection closed by peer" joins the list of the ranks
    that waited, but leaves fixing it to one that timed out: after a crash, its neighbours are cut
    off at once while the other ranks still wait out --timeout, and a list fixed then would name
    every one of those healthy ranks."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from gptrain.validate import runtime

    store = dist.HashStore()
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    assert runtime.is_peer_gone(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:9387"))
    assert not runtime.is_peer_gone(RuntimeError("Timed out waiting 3000ms for recv operation to complete"))
    monkeypatch.setattr(runtime, "CUT_OFF_QUIET_S", 0.3)  # no rank timed out by then: a crash
    cut_off = runtime.unanswered_ranks(SimpleNamespace(rank=1, size=4), 0.2, cut_off_s=600.0)
    assert cut_off == ([], False) and not store.check([runtime.TIMED_OUT_FINAL_KEY])  # names no one
    timed_out = runtime.unanswered_ranks(SimpleNamespace(rank=3, size=4), 0.2)
    assert timed_out == ([0, 2], True)  # rank 1 was heard from; rank 3 writes --exclude-file
    late = runtime.unanswered_ranks(SimpleNamespace(rank=0, size=4), 0.2, cut_off_s=5.0)
    assert late == ([2], False)  # the list as fixed, less itself


def test_a_ranks_error_line_is_one_write_with_its_newline(monkeypatch, tmp_path):
    """Under torchrun the ranks that waited for a hung one print their lines at the same moment
    into one stderr; print wrote the line and its newline apart (unbuffered, PYTHONUNBUFFERED=1),
    and another rank's line came in between: two lines glued into one."""
    import argparse

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    writes = []

    class Recording:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    def no_group(timeout_s):
        raise RuntimeError("Timed out after 4 seconds waiting for clients. 1/3 clients joined.")

    monkeypatch.setattr(runtime, "start", no_group)
    monkeypatch.setattr(validate_main.sys, "stderr", Recording())
    monkeypatch.delenv("GPTRAIN_DEBUG", raising=False)
    args = argparse.Namespace(
        profile=None,
        min_busbw_GBps=None,
        check="gpus",
        output_dir=str(tmp_path),
        exclude_file=None,
        timeout=3.0,
    )
    assert validate_main.validate(args) == 1
    [line] = writes
    assert line.startswith("gptrain: error: validate: rank ") and line.endswith(" output\n")
    assert "could not start the process group" in line and line.count("\n") == 1


def test_a_cluster_file_given_without_its_yaml_is_found_as_the_launcher_names_it(tmp_path, monkeypatch):
    """`--profile conf/cluster/site` (NeMo's cluster=<name> leaves .yaml off) was looked up as a
    bundled profile's name: 'unknown cluster profile'. A bare name stays a bundled profile."""
    site = tmp_path / "conf" / "cluster" / "site.yaml"
    site.parent.mkdir(parents=True)
    site.write_text("validation:\n  thresholds:\n    copy_GBps: 7\n")
    monkeypatch.chdir(tmp_path)
    assert load_thresholds("conf/cluster/site").copy_GBps == 7
    (tmp_path / "aws_p5.yaml").write_text("validation:\n  thresholds:\n    copy_GBps: 7\n")
    assert load_thresholds("aws_p5").copy_GBps != 7


@pytest.mark.parametrize("given", ["aws_p5.yaml", "cluster=aws_p5", "aws_p5"])
def test_profile_is_named_as_plan_cluster_names_it(tmp_path, monkeypatch, given):
    """`--profile aws_p5.yaml` and `--profile cluster=aws_p5` were 'no such file' and 'unknown cluster
    profile' while `plan --cluster` took both: two resolvers. Both commands now resolve alike."""
    from gptrain.plan.hardware import cluster_profile

    monkeypatch.chdir(tmp_path)
    assert load_thresholds(given).copy_GBps == load_thresholds(str(CLUSTER_DIR / "aws_p5.yaml")).copy_GBps
    assert cluster_profile(given)["gpus_per_node"] == 8


def test_an_unknown_profile_is_the_same_line_for_validate_and_plan(tmp_path, monkeypatch):
    from gptrain.plan.hardware import cluster_profile

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as validate_error:
        load_thresholds("aws_p9.yaml")
    with pytest.raises(ConfigError) as plan_error:
        cluster_profile("aws_p9.yaml")
    said = (
        "{} aws_p9.yaml: no file aws_p9.yaml and no bundled profile of that name; give a bundled profile ({})"
    )
    known = "aws_p4d, aws_p5, azure_nd_a100_v4, bcm"
    assert str(validate_error.value) == said.format("--profile", known) + " or the path of a cluster file"
    assert str(plan_error.value) == said.format("--cluster", known) + " or the path of a cluster file"


def test_a_profile_under_a_directory_that_cannot_be_searched_is_one_line(unsearchable_dir):
    """Path.is_file raises PermissionError (Python 3.11) where a directory above cannot be searched."""
    locked = unsearchable_dir
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(locked / "site.yaml"))
    assert str(error.value) == (
        f"--profile {locked}/site.yaml: {locked}/site.yaml cannot be looked up (Permission denied); check the"
        f" permissions of {locked} and the directories above it"
    )


def test_a_profile_deeper_under_a_directory_that_cannot_be_searched_names_that_directory(unsearchable_dir):
    """Named the directory holding the file (locked/sub), not the one that refused the lookup."""
    locked = unsearchable_dir
    (locked / "sub").mkdir()
    with pytest.raises(ConfigError) as error:
        load_thresholds(str(locked / "sub" / "site.yaml"))
    assert str(error.value).endswith(f"check the permissions of {locked} and the directories above it")


def test_a_wrong_result_fails_naming_its_placement():
    """nccl-tests' #wrong: any wrong element fails the check. all_gather runs out of place and in
    place; each failure said 'all_gather at 1024 B', and two such lines could not say which."""
    from gptrain.validate.main import wrong_result_lines

    row = {"op": "all_gather", "bytes": 1024}
    rows = [
        row | {"in_place": False, "wrong": 3},
        row | {"in_place": True, "wrong": 256},
        {"op": "all_reduce", "bytes": 1024, "in_place": True, "wrong": 0},
    ]
    assert wrong_result_lines(rows) == [
        "collectives: all_gather (out-of-place) at 1024 B gave 3 wrong element(s)",
        "collectives: all_gather (in-place) at 1024 B gave 256 wrong element(s)",
    ]


def test_an_exclude_file_under_a_directory_that_cannot_be_searched_is_one_line(tmp_path, unsearchable_dir):
    """Path.is_dir raised PermissionError (Python 3.11) before the sweep: a bare '<path>: Permission denied'."""
    import argparse

    from gptrain.validate.main import check_paths_early

    locked = unsearchable_dir
    args = argparse.Namespace(output_dir=str(tmp_path / "v"), exclude_file=str(locked / "ex"))
    with pytest.raises(ConfigError) as error:
        check_paths_early(args)
    assert str(error.value) == (
        f"--exclude-file {locked}/ex: cannot be looked up (Permission denied); check the permissions of"
        f" {locked} and the directories above it"
    )


def test_a_profile_threshold_does_not_judge_a_sweep_that_stopped_below_large_messages(capsys):
    """`--profile aws_p5 --max-bytes 256M` on one healthy node: all_reduce at 256 MiB was held to the
    270 GB/s set for 1 GiB and up, failed, and the node was blamed (and excluded); the threshold is
    now not applied, in one line. --min-busbw-GBps is still taken as given at any size."""
    from types import SimpleNamespace

    from gptrain.validate.main import Outcome, busbw_threshold

    node = SimpleNamespace(rank=0, size=8, nodes=["a"] * 8, multi_node=False)
    small = [{"op": "all_reduce", "bytes": 256 << 20, "busbw_GBps": 200.0}]
    large = [{"op": "all_reduce", "bytes": 1 << 30, "busbw_GBps": 200.0}]
    out = Outcome()
    busbw_threshold(small, load_thresholds("aws_p5"), node, out)
    assert out.failures == [] and out.summary["busbw_threshold_GBps"] is None
    assert capsys.readouterr().out.splitlines() == [
        "collectives: busbw threshold not applied: 256 MiB is below the 1 GiB the profile's threshold is set"
        " for (large_message_bytes); raise --max-bytes, or give --min-busbw-GBps"
    ]
    for rows, limits in ((large, load_thresholds("aws_p5")), (small, load_thresholds("aws_p5", 250.0))):
        out = Outcome()
        busbw_threshold(rows, limits, node, out)
        assert len(out.failures) == 1 and out.failures[0].startswith("collectives: all_reduce busbw 200 GB/s")


def test_a_world_of_one_is_told_only_that_it_moves_no_data(capsys):
    """One rank, `--profile aws_p5 --max-bytes 256M`: the line advised raising --max-bytes or giving
    --min-busbw-GBps, and whoever followed it was then told a world of 1 moves no data."""
    from types import SimpleNamespace

    from gptrain.validate.main import Outcome, busbw_threshold

    one = SimpleNamespace(rank=0, size=1, nodes=["a"], multi_node=False)
    for nbytes, override in ((256 << 20, None), (1 << 30, None), (256 << 20, 250.0)):
        out = Outcome()
        rows = [{"op": "all_reduce", "bytes": nbytes, "busbw_GBps": 0.0}]
        busbw_threshold(rows, load_thresholds("aws_p5", override), one, out)
        assert out.failures == [] and out.summary["busbw_threshold_GBps"] is None
        assert capsys.readouterr().out.splitlines() == [
            "collectives: busbw threshold not applied: a world of 1 moves no data between ranks"
        ]


def test_node_pairs_of_a_small_pair_bytes_are_not_held_to_the_large_message_threshold(
    monkeypatch, tmp_path, capsys
):
    """`--pair-bytes 64M` with a profile: two healthy nodes measured at 64 MiB were both flagged
    below the threshold set for 1 GiB and up, and excluded."""
    import argparse
    from types import SimpleNamespace

    from gptrain.validate import pairwise
    from gptrain.validate.main import Outcome, check_pairwise

    monkeypatch.setattr(pairwise, "node_rounds", lambda ctx, most, rounds: [[("a", "b")]])
    monkeypatch.setattr(pairwise, "rank_rounds", lambda ctx, most, rounds: [])
    monkeypatch.setattr(
        pairwise,
        "run_round",
        lambda ctx, level, pairs, nbytes, iters, warmup: [
            pairwise.PairResult("node", "a", "b", [0, 1], nbytes, 1.0, 20.0)
        ],
    )
    ctx = SimpleNamespace(rank=0, size=16, nodes=["a"] * 8 + ["b"] * 8, is_gpu=True)
    for pair_bytes, failed in ((64 << 20, False), (1 << 30, True)):
        args = argparse.Namespace(
            pair_bytes=pair_bytes, max_all_pairs=16, iters=1, warmup=0, output_dir=str(tmp_path)
        )
        out = Outcome()
        check_pairwise(ctx, args, load_thresholds("aws_p5"), out)
        assert bool(out.failures) is failed and (out.bad_nodes == {"a", "b"}) is failed
    assert (
        "pairwise: node pairs not held to the busbw threshold: 64 MiB is below the 1 GiB the profile's threshold"
        " is set for (large_message_bytes); raise --pair-bytes, or give --min-busbw-GBps"
    ) in capsys.readouterr().out.splitlines()


# torch's DistBackendError texts: NCCL's ncclGetErrorString for ncclRemoteError, torch's line after it,
# NCCL's socket wording, and ProcessGroupNCCL's watchdog timeout (TORCH_NCCL_BLOCKING_WAIT=1)
NCCL_REMOTE = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there"
    " was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network"
    " error or a remote process exiting prematurely.\nLast error:\nNET/IB : Got completion from peer"
    " 10.5.0.34<33956> with error 5, opcode 0, len 1, vendor err 244"
)
NCCL_CLOSED = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, internal error, NCCL version"
    " 2.20.5\nncclInternalError: Internal check failed.\nLast error:\nNet : Connection closed by remote peer"
    " gpu03<50260>"
)
NCCL_WATCHDOG = (
    "[Rank 9] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE,"
    " NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600088 milliseconds before timing out."
)


@pytest.mark.parametrize("text", [NCCL_REMOTE, NCCL_CLOSED])
def test_a_peer_gone_under_nccl_is_not_blamed_on_this_node(text):
    """is_peer_gone knew gloo's wording only: a rank whose NCCL peer exited (ncclRemoteError, or
    NCCL's "Connection closed by remote peer") got "a GPU or network error there is the node's:
    leave it out (--exclude=<its own node>)" for the peer's failure."""
    from types import SimpleNamespace

    from torch.distributed import DistBackendError

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    error = DistBackendError(text)
    assert runtime.is_peer_gone(error) and not runtime.is_timeout(error)
    ctx = SimpleNamespace(rank=3, node="gpu02", is_gpu=False)
    line = validate_main.rank_failure(ctx, "collectives", error)
    assert "--exclude" not in line and "a peer" in line, line
    assert "--exclude=gpu02" in validate_main.rank_failure(ctx, "gpus", RuntimeError("CUDA error: unknown"))


def test_every_rank_timing_out_together_is_said_once_and_blames_no_node(monkeypatch):
    """With every rank timed out (a hung fabric under TORCH_NCCL_BLOCKING_WAIT=1) no rank is named,
    and each rank's line told it to leave out its own node (WorkNCCL in the text): every node. The
    rank that fixed the list says that every rank timed out, once; no line has an --exclude=."""
    from types import SimpleNamespace

    from torch.distributed import DistBackendError

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    error = DistBackendError(NCCL_WATCHDOG)
    lines = []
    for rank, writer in enumerate([False, True, False]):
        monkeypatch.setattr(runtime, "unanswered_ranks", lambda ctx, wait, cut_off_s=None, w=writer: ([], w))
        ctx = SimpleNamespace(rank=rank, size=3, node=f"n{rank}", nodes=["n0", "n1", "n2"], is_gpu=False)
        hint, listed = validate_main.hung_peers(ctx, error, 600.0)
        assert listed
        lines.append(validate_main.rank_failure(ctx, "collectives", error, hint))
    assert not any("--exclude" in line for line in lines), lines
    assert ["every rank timed out" in line for line in lines] == [False, True, False], lines


def test_a_time_is_the_mean_over_the_ranks_of_its_group(monkeypatch):
    """Nothing held that a collective's time is averaged over its ranks (review V: returning the
    sum under-reported every busbw by the rank count and passed every unit test). Two ranks that
    timed 1 s and 3 s: 2 s. The collective is stood in for by its sum, with the other rank's 3 s."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from gptrain.validate import runtime

    pair = object()

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None):
        assert op == dist.ReduceOp.SUM and group is pair and tensor.dtype == torch.float64
        tensor += 3.0

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2 if group is pair else 8)
    ctx = SimpleNamespace(device=torch.device("cpu"))
    assert runtime.mean_over_ranks(1.0, ctx, pair) == 2.0


def test_two_pairs_are_not_judged_against_their_own_median():
    """Two nodes of two ranks give one rank pair each: four scores from two measurements, the
    median their mean, and the slower pair's node was failed and excluded whenever it was 18%
    below the other, with no threshold behind it (review V F4). The median needs three pairs;
    with three or more, one pair far below the rest still flags its ranks."""
    results = [pair("0", "1", 0.0162), pair("2", "3", 0.0311)]
    verdict = find_slow("rank", results, slow_pct=10)
    assert verdict.flagged == {} and verdict.scores == {"0": 0.0162, "1": 0.0162, "2": 0.0311, "3": 0.0311}
    results.append(pair("4", "5", 0.0305))
    assert sorted(find_slow("rank", results, slow_pct=10).flagged) == ["0", "1"]


def test_a_gpu_whose_kernel_launch_timed_out_is_its_own_nodes_not_a_collective_timeout():
    """CUDA's cudaErrorLaunchTimeout ("the launch timed out and was terminated", Xid 8: a kernel
    the GPU's watchdog killed) read as a collective's timeout ("timed out" in it): the rank's
    line lost the --exclude= of its own node, which a GPU error is."""
    from types import SimpleNamespace

    from gptrain.validate import main as validate_main
    from gptrain.validate import runtime

    error = RuntimeError("CUDA error: the launch timed out and was terminated")
    assert not runtime.is_timeout(error)
    assert runtime.is_timeout(
        RuntimeError("[../gloo/transport/tcp/pair.cc:534] Timed out waiting 3000ms for recv")
    )
    ctx = SimpleNamespace(rank=1, node="gpu07", is_gpu=False)
    assert "leave it out (--exclude=gpu07)" in validate_main.rank_failure(ctx, "gpus", error)
