"""Command-line parsers for this group (light: no torch at module level)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this group's subcommands (filled in by the group's owner)."""
