"""Parser for `gptrain data sample` (light: no torch or numpy at module level)."""

from __future__ import annotations

import argparse


def add_sample_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `data sample` (filled in by the sampling owner)."""
