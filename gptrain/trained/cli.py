"""Command-line parsers for working with a trained run (light: no torch at module level)."""

from __future__ import annotations

import argparse

from gptrain.trained.eval import add_eval_parser
from gptrain.trained.generate import add_generate_parser
from gptrain.trained.hf.cli import add_export_parser, add_import_parser
from gptrain.trained.plot import add_plot_parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `generate`, `eval`, `plot`, `export` and `import`, each from its own module."""
    add_generate_parser(subparsers)
    add_eval_parser(subparsers)
    add_plot_parser(subparsers)
    add_export_parser(subparsers)
    add_import_parser(subparsers)
