"""The validate command line: fast help without torch, one-line errors before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from validate_helpers import REPO


def test_help_does_not_import_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gptrain.cli import build_parser; build_parser(); print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "gptrain", "validate", "all", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    ).stdout
    for option in (
        "--output-dir",
        "--min-bytes",
        "--max-bytes",
        "--iters",
        "--warmup",
        "--profile",
        "--min-busbw-GBps",
    ):
        assert option in help_text


def test_profile_help_names_every_bundled_profile():
    """--profile's help listed three of the four profiles --profile takes (bcm was left out)."""
    from gptrain.launch.cluster_profiles import profile_names
    from gptrain.validate.cli import common_options

    profile = next(a for a in common_options()._actions if "--profile" in a.option_strings)
    for name in profile_names():
        assert name in profile.help, name


def test_unknown_profile_is_one_line_and_starts_no_process_group(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gptrain",
            "validate",
            "gpus",
            "--output-dir",
            str(tmp_path),
            "--profile",
            "aws_p9",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gptrain: error: --profile aws_p9: no file aws_p9.yaml and no bundled profile of that name; give a bundled"
        " profile (aws_p4d, aws_p5, azure_nd_a100_v4, bcm) or the path of a cluster file"
    ]
    bad_size = subprocess.run(
        [
            sys.executable,
            "-m",
            "gptrain",
            "validate",
            "all",
            "--output-dir",
            str(tmp_path),
            "--max-bytes",
            "huge",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert bad_size.returncode == 2 and "not a size: 'huge'" in bad_size.stderr


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--iters", "0", "argument --iters: must be >= 1, got 0"),
        ("--timeout", "0", "argument --timeout: must be a number of seconds > 0, got 0"),
        ("--timeout", "nan", "argument --timeout: must be a number of seconds > 0, got nan"),
        ("--min-bytes", "inf", "size must be a positive finite number of bytes: 'inf'"),
        ("--min-bytes", "1e400", "size must be a positive finite number of bytes: '1e400'"),
        ("--max-bytes", "nan", "size must be a positive finite number of bytes: 'nan'"),
        # int() made 0.5 no bytes at all, and 1.5 one byte
        ("--min-bytes", "0.5", "size must be a whole number of bytes: '0.5'"),
        # not argparse's "invalid _at_least_one value", which names a function of ours
        ("--iters", "x", "argument --iters: not a whole number: 'x'"),
        ("--warmup", "-1", "argument --warmup: must be >= 0, got -1"),
        ("--timeout", "soon", "argument --timeout: must be a number of seconds > 0, got soon"),
        # dcgmi diag fails on another level, and that failure would blame a healthy node
        ("--dcgm-level", "9", "argument --dcgm-level: must be 0 (skip) to 4 (dcgmi diag -r), got 9"),
        ("--dcgm-level", "-1", "argument --dcgm-level: must be >= 0, got -1"),
        ("--max-all-pairs", "-1", "argument --max-all-pairs: must be >= 0, got -1"),
        # nan fails no comparison: the threshold would be silently off
        ("--min-busbw-GBps", "nan", "argument --min-busbw-GBps: must be a number of GB/s >= 0, got nan"),
        ("--min-busbw-GBps", "-5", "argument --min-busbw-GBps: must be a number of GB/s >= 0, got -5"),
    ],
)
def test_options_that_would_time_nothing_or_overflow_are_refused(capsys, option, value, message):
    from gptrain.cli import build_parser

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["validate", "collectives", "--output-dir", "x", option, value])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


NO_TORCH = """
import sys
from gptrain.cli import main
code = main(sys.argv[1:])
print(code, 'torch' in sys.modules, 'torch.distributed' in sys.modules)
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["gpus", "--profile", "aws_p9"],
            "gptrain: error: --profile aws_p9: no file aws_p9.yaml and no bundled profile of that name; give a bundled"
            " profile (aws_p4d, aws_p5, azure_nd_a100_v4, bcm) or the path of a cluster file",
        ),
        (
            ["collectives", "--min-bytes", "1M", "--max-bytes", "4K"],
            "gptrain: error: --min-bytes/--max-bytes: need 0 < min_bytes <= max_bytes, got 1048576 and 4096",
        ),
        (
            ["all", "--min-bytes", "16G"],
            "gptrain: error: --min-bytes 17179869184 is above the default --max-bytes (8589934592 on GPUs, "
            "1048576 on CPUs); pass a --max-bytes",
        ),
    ],
)
def test_usage_errors_are_one_line_exit_2_without_importing_torch(tmp_path, args, message):
    """docs/validation.md: exit 2 before any process group starts; torch is not even imported, so
    the line comes at once (and min > max is not found only inside the collectives sweep)."""
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "validate", *args, "--output-dir", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.stdout.split() == ["2", "False", "False"], out.stderr
    assert out.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (
            lambda tmp: (tmp / "v").write_text("a file"),
            [],
            "--output-dir {tmp}/v: cannot write the reports there ({tmp}/v is not a directory); give a directory",
        ),
        (
            lambda tmp: (tmp / "ex").mkdir(),
            ["--exclude-file", "{tmp}/ex"],
            "--exclude-file {tmp}/ex: is a directory; give a file name (one host list line)",
        ),
        (
            lambda tmp: (tmp / "ex.txt").write_text("node[1-\n"),
            ["--exclude-file", "{tmp}/ex.txt"],
            "--exclude-file {tmp}/ex.txt:1: cannot parse host list item 'node[1-' (Slurm's form: "
            "n[1-3,7],gpu-[01-04]); fix the file or delete it",
        ),
        (  # a comment was read as a host name, and merged back into the file as one
            lambda tmp: (tmp / "ex.txt").write_text("n1\n\n# drained by ops\n"),
            ["--exclude-file", "{tmp}/ex.txt"],
            "--exclude-file {tmp}/ex.txt:3: '# drained by ops' is not a host name (one Slurm host list a "
            "line, n[1-3,7],gpu07; no comments, no spaces); fix the file or delete it",
        ),
        (
            lambda tmp: (tmp / "profiles").mkdir(),
            ["--profile", "{tmp}/profiles"],
            "--profile {tmp}/profiles: is a directory; give a cluster file (YAML) or a profile name "
            "(aws_p4d, aws_p5, azure_nd_a100_v4, bcm)",
        ),
    ],
)
def test_bad_output_exclude_or_profile_path_is_one_line_before_torch(tmp_path, make, args, message):
    """Found only after the sweep, an --output-dir that is a file was 'File exists' from deep inside,
    and an exclude file that does not parse lost validation.json and named no file."""
    make(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in args]
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "validate", "gpus", *argv, "--output-dir", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.stdout.split() == ["2", "False", "False"], out.stderr
    assert out.stderr.strip().splitlines() == [f"gptrain: error: {message.format(tmp=tmp_path)}"]


def read_only_dir(tmp_path):
    """A directory this user cannot write, where chmod binds (not for root)."""
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes a mode 0o500 directory")
    path = tmp_path / "ro"
    path.mkdir(mode=0o500)
    return path


@pytest.mark.parametrize(
    ("directory", "blocked"),
    [
        (lambda tmp: "/proc", "/proc"),  # root passes its permission bits, and creates nothing there
        (lambda tmp: str(read_only_dir(tmp)), "{tmp}/ro"),
    ],
)
def test_an_output_dir_no_file_can_be_created_in_is_one_line_before_torch(tmp_path, directory, blocked):
    """`--output-dir /proc/x` as root passed the up-front check (os.access says yes to root) and
    failed after torch started, exit 1; the check now creates a file there (or in the nearest
    existing parent) and says why it cannot, exit 2."""
    output_dir = f"{directory(tmp_path)}/gptrain-validate-test/v"
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "validate", "gpus", "--output-dir", output_dir],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.stdout.split() == ["2", "False", "False"], out.stderr
    prefix = f"gptrain: error: --output-dir {output_dir}: cannot write the reports there ("
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(prefix) and line.endswith("); give a directory"), line
    assert blocked.format(tmp=tmp_path) in line
