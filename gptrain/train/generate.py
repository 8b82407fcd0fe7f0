"""`gptrain generate` (filled in by its owner)."""

from __future__ import annotations

import argparse


def add_generate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `generate` (stub)."""
