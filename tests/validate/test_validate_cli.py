"""The validate command line: fast help without torch, one-line errors before anything starts."""

from __future__ import annotations

import subprocess
import sys

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
        "gptrain: error: --profile aws_p9: unknown cluster profile; known: aws_p4d, aws_p5, azure_nd_a100_v4, bcm"
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
