"""The scripts under bench/ still run: nothing else runs them, and a changed option or output of
gptrain leaves them dead until someone measures on a GPU (a smoke run at the smallest shape)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gptrain.config import load_training_config
from gptrain.models.config import GPTConfig
from gptrain.models.flops import count_parameters

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
TINY = ["model.num_layers=1", "model.hidden_size=32", "model.num_attention_heads=2"]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    sys.path.insert(0, str(BENCH))  # profile_step imports train_step as a sibling
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def run_bench(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A bench script run as a user runs it, from the repository, on one intra-op thread."""
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def train_step_output() -> str:
    """bench/train_step.py's stdout at the smallest shape: gptrain, separate GEMMs, eager reference."""
    args = ["--preset", "quickstart/cpu", "--micro-batch-size", "2", "--global-batch-size", "4"]
    args += ["--seq-length", "16", "--precision", "32", "--steps", "1", "--warmup", "0"]
    args += ["--reference", "eager", "--separate-projections", *TINY]
    done = run_bench("train_step.py", *args, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_train_step_reports_every_loop_and_ratios_against_gptrain(train_step_output):
    result = json.loads(train_step_output.splitlines()[-1])
    names = [row["name"] for row in result["results"]]
    assert names == ["gptrain", "gptrain, separate q/k/v GEMMs", "plain PyTorch (eager)"]
    gptrain_seconds = result["results"][0]["seconds_per_step"]
    for row in result["results"][1:]:  # throughput ratio: the other loop's step time over gptrain's
        assert result["speedup_vs"][row["name"]] == pytest.approx(row["seconds_per_step"] / gptrain_seconds)
    assert result["global_batch_size"] == 4 and result["seq_length"] == 16


def test_plan_memory_reads_the_peak_not_another_number(train_step_output, monkeypatch):
    """Off CUDA train_step has no peak: the measurement is missing, not the last loss read as GiB."""
    plan_memory = load("plan_memory_gpu")
    on_gpu = train_step_output.replace('"peak_memory_gib": null', '"peak_memory_gib": 3.25')

    def run(args, **_):
        assert Path(args[1]) == BENCH / "train_step.py"  # found from any working directory
        return subprocess.CompletedProcess(args, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(plan_memory.subprocess, "run", run)
    stdout = train_step_output
    assert plan_memory.measure(plan_memory.CASES["gpt3/126m mbs8 seq2048"], False, False) is None
    stdout = on_gpu
    assert plan_memory.measure(plan_memory.CASES["gpt3/126m mbs8 seq2048"], False, False) == 3.25


@pytest.mark.parametrize("steps, every", [(1, 2), (4, 0)])
def test_checkpoint_refuses_a_run_without_saves_in_one_line(steps, every, capsys):
    checkpoint = load("checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        checkpoint.parse_args(["--steps", str(steps), "--every", str(every)])
    assert exit_info.value.code == 2
    assert f"--every {every} saves nothing in --steps {steps}" in capsys.readouterr().err


def test_checkpoint_times_each_mode_and_ratios_async_against_sync(tmp_path, capsys):
    checkpoint = load("checkpoint")
    args = ["--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "256", "--seq-length", "16"]
    args += ["--steps", "2", "--every", "1", "--modes", "none,sync,async", "--dir", str(tmp_path)]
    assert checkpoint.main(args) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    rows = {row["mode"]: row for row in result["rounds"][0]["rows"]}
    assert [rows[mode]["saves"] for mode in ("none", "sync", "async")] == [0, 2, 2]
    stall = rows["async"]["stall_ms_median"] / rows["sync"]["stall_ms_median"]
    assert result["async_stall_over_sync"] == pytest.approx(stall)


def test_save_plan_and_index_build_run_at_a_small_size(monkeypatch, capsys):
    save_plan = load("save_plan")
    monkeypatch.setattr(
        sys, "argv", ["save_plan.py", "--ranks", "2", "--layers", "1", "--hidden", "32", "--heads", "2"]
    )
    save_plan.main()
    row = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"][0]
    assert row["uncached"]["items_per_rank"] > 0 and row["cached"]["items_per_rank"] == 0
    index_build = load("index_build")
    lengths = np.random.default_rng(0).integers(1, 100, size=200).astype(np.int32)
    _, built = index_build.time_gpt_case(lengths, 32, 50, 5)
    assert built >= 50
    index_build.time_blend(3, 1000)


def gpu_suite_commands(tmp_path: Path, part: str = "all") -> list[list[str]]:
    """Every command line bench/gpu_suite.sh runs (the part's, FP8_ROWWISE=1), as the interpreter
    gets it: the suite is run with a recording stand-in for python. Its set-up (the wheels' install,
    the import check read from stdin) is left out."""
    record, fake = tmp_path / "commands.jsonl", tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "FP8_ROWWISE": "1"}
    subprocess.run(
        ["bash", str(BENCH / "gpu_suite.sh"), str(tmp_path / "out"), part], env=env, cwd=REPO, check=True
    )
    commands = [json.loads(line) for line in record.read_text().splitlines()]
    return [argv for argv in commands if argv[:1] != ["-"] and argv[:2] != ["-m", "pip"]]


@pytest.mark.parametrize(
    "part, expected",
    [
        ("all", {"train_step", "profile_step", "fp8_curve", "checkpoint"}),
        ("quick", {"train_step", "checkpoint", "suite_summary"}),
    ],
)
def test_every_gpu_suite_command_parses_with_its_script(tmp_path, part, expected):
    """The options and config keys of each item still exist (a renamed one fails on the GPU only)."""
    commands = gpu_suite_commands(tmp_path, part)
    scripts = [Path(argv[0]).stem for argv in commands if argv[0].startswith("bench/")]
    assert set(scripts) == expected
    train_step = load("train_step")
    for argv in commands:
        if argv[:2] == ["-m", "pytest"]:
            assert all((REPO / a).is_dir() for a in argv if a.startswith("tests/"))  # the GPU tests
            continue
        name, options = Path(argv[0]).stem, argv[1:]
        if name in ("train_step", "profile_step"):  # profile_step: train_step's options (and its own)
            train_step.bench_config(train_step.parse_args(options))  # key.sub=value still config keys
        else:
            args = load(name).parse_args(options)
            if name == "fp8_curve":
                load_training_config("quickstart/gpu", [f"data_dir={tmp_path}", *args.overrides])


def test_a_bad_override_is_one_line_before_any_data_is_built_or_run_started(tmp_path):
    data = tmp_path / "data"
    done = run_bench(
        "fp8_curve.py",
        "--out",
        str(tmp_path / "out"),
        "--data",
        str(data),
        "--emulate",
        "model.fp8_recipee=rowwise",
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "fp8_curve.py: override 'model.fp8_recipee=rowwise': unknown key 'model.fp8_recipee'; "
        "did you mean 'model.fp8_recipe'?"
    ]
    assert not data.exists()


@pytest.mark.parametrize(
    "shape",
    [
        {},
        {"share_embeddings_and_output_weights": False},
        {"position_embedding_type": "rope", "rotary_percentage": 0.5},
        {"position_embedding_type": "rope", "activation": "swiglu", "normalization": "rmsnorm", "bias": False}
        | {"num_query_groups": 2, "share_embeddings_and_output_weights": False},
    ],
)
def test_the_reference_loop_has_the_shape_of_gptrains_model(shape):
    """train_step's baseline is the same model as gptrain's: its parameter count is Megatron's."""
    train_step = load("train_step")
    config = GPTConfig(
        vocab_size=96, seq_length=8, num_layers=2, hidden_size=32, num_attention_heads=4, **shape
    )
    reference = train_step.ReferenceGPT(config)
    assert sum(p.numel() for p in reference.parameters()) == count_parameters(config)
    logits = reference(torch.randint(0, 96, (2, 8)))
    assert logits.shape == (2, 8, 96)


def test_the_reference_rope_rotates_channel_pairs_by_position_times_frequency():
    """Rotate-half rope against the complex product in float64: channel i pairs with i + d/2."""
    train_step = load("train_step")
    x = torch.randn(2, 3, 5, 16, generator=torch.Generator().manual_seed(0))
    rotary_dim, base = 8, 10000.0
    out = train_step.rope(x, rotary_dim, base).double()
    half = rotary_dim // 2
    theta = torch.arange(5, dtype=torch.float64)[:, None] * base ** (-2 * torch.arange(half) / rotary_dim)
    pairs = torch.complex(x[..., :half].double(), x[..., half:rotary_dim].double()) * torch.polar(
        torch.ones_like(theta), theta
    )
    expected = torch.cat((pairs.real, pairs.imag, x[..., rotary_dim:].double()), dim=-1)
    # float32 sin/cos of angles up to 4 rad and one multiply-add: a few ulp of values ~|x|
    torch.testing.assert_close(out, expected, rtol=0, atol=8 * 2**-23 * float(x.abs().max()))


def test_index_build_with_too_few_documents_is_one_line():
    done = run_bench("index_build.py", "--documents", "10", "--repeat", "1")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "index_build.py: a split of 0 sequences holds 0 tokens; it needs more data or a different split string"
    ]


@pytest.mark.parametrize("ranks", ["0", "8,x", "8,,64"])
def test_save_plan_refuses_rank_counts_that_are_not_positive_integers(ranks, monkeypatch, capsys):
    save_plan = load("save_plan")
    monkeypatch.setattr(sys, "argv", ["save_plan.py", "--ranks", ranks])
    with pytest.raises(SystemExit) as exit_info:
        save_plan.main()
    assert exit_info.value.code == 2
    assert f"--ranks '{ranks}': give positive rank counts" in capsys.readouterr().err


def test_parallel_overhead_ratios_every_layout_against_the_single_process(monkeypatch, capsys):
    """--layouts ddp_dp2,tp2_sp (the docstring's example) still gets its ratios: single runs first."""
    parallel = load("parallel_overhead")
    seconds = {"single": 0.08, "ddp_dp2": 0.1, "tp2_sp": 0.5}
    ran = []
    monkeypatch.setattr(parallel, "run", lambda name, steps, tmp: ran.append(name) or seconds[name])
    monkeypatch.setattr(sys, "argv", ["parallel_overhead.py", "--layouts", "ddp_dp2,tp2_sp,single"])
    parallel.main()
    assert ran == ["single", "ddp_dp2", "tp2_sp"]
    rows = [
        line.split(" | ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and "x |" in line
    ]
    assert {row[0][2:]: float(row[3].partition("x")[0]) for row in rows} == {
        name: pytest.approx(value / seconds["single"], abs=0.005) for name, value in seconds.items()
    }


def test_parallel_overhead_refuses_an_unknown_layout(monkeypatch, capsys):
    parallel = load("parallel_overhead")
    monkeypatch.setattr(sys, "argv", ["parallel_overhead.py", "--layouts", "ddp_dp2,tp3"])
    with pytest.raises(SystemExit) as exit_info:
        parallel.main()
    assert exit_info.value.code == 2
    assert "--layouts: unknown tp3; known: single, ddp_dp2" in capsys.readouterr().err


def test_checkpoint_refuses_an_unknown_mode_rather_than_timing_it_as_sync(capsys):
    checkpoint = load("checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        checkpoint.parse_args(["--modes", "none,sync,asycn"])
    assert exit_info.value.code == 2
    assert "--modes: unknown asycn; known: none, sync, sync_buffered, async," in capsys.readouterr().err


def test_train_step_and_profile_step_refuse_zero_timed_steps(capsys):
    train_step, profile_step = load("train_step"), load("profile_step")
    with pytest.raises(SystemExit) as exit_info:
        train_step.parse_args(["--steps", "0"])
    assert exit_info.value.code == 2 and "--steps 0 --warmup 3: give --steps >= 1" in capsys.readouterr().err
    assert profile_step.profile_steps(["--compile", "--profile-steps", "2", "model.fp8=true"]) == (
        2,
        ["--compile", "model.fp8=true"],
    )
    for bad in (["--profile-steps", "0"], ["--profile-steps", "x"], ["--profile-steps"]):
        with pytest.raises(SystemExit) as exit_info:
            profile_step.profile_steps(bad)
        assert exit_info.value.code == 2 and "--profile-steps" in capsys.readouterr().err


def test_fp8_curve_takes_options_after_overrides():
    """As gpu_suite.sh's dry run gives them (GPU_SUITE_TINY=1 appends options after the overrides)."""
    args = load("fp8_curve").parse_args(
        ["--out", "o", "model.compile=true", "--steps", "2", "--corpus-mb", "1", "model.num_layers=1"]
    )
    assert args.overrides == ["model.compile=true", "model.num_layers=1"]
    assert (args.steps, args.corpus_mb) == (2, 1.0)


def test_generate_times_the_cache_against_the_whole_context_with_the_same_tokens(capsys):
    generate = load("generate")
    args = ["--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "97", "--seq-length", "32"]
    result = generate.main([*args, "--prompt", "8", "--new", "6", "--dtype", "fp64"])
    # the ratio is printed to 2 decimals (0.005), the seconds to 6 (milliseconds here: 3e-4 of each)
    assert result["same_tokens"] and result["speedup"] == pytest.approx(
        result["full_s"] / result["cached_s"], abs=0.005 + 1e-3 * result["speedup"]
    )
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[-1]) == result and "ms per new token" in lines[0]
    with pytest.raises(SystemExit):
        generate.main([*args, "--prompt", "30", "--new", "6"])  # past the context: refused


def test_generate_times_prompts_batched_against_alone_with_the_same_tokens(capsys):
    generate = load("generate")
    args = ["--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "97", "--seq-length", "32"]
    result = generate.main([*args, "--prompt", "12", "--new", "5", "--prompts", "4", "--dtype", "fp64"])
    assert result["same_tokens"] and result["prompts"] == [3, 6, 9, 12]
    assert result["speedup"] == pytest.approx(
        result["alone_s"] / result["batched_s"], abs=0.005 + 1e-3 * result["speedup"]
    )
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == result
    with pytest.raises(SystemExit):
        generate.main([*args, "--prompts", "-1"])
