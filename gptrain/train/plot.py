"""`gptrain plot` (filled in by its owner)."""

from __future__ import annotations

import argparse


def add_plot_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `plot` (stub)."""
