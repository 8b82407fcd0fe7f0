import subprocess
import sys

import pytest

from gptrain import __version__
from gptrain.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_help_does_not_import_torch():
    code = (
        "import sys, contextlib, io\n"
        "from gptrain.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
        "heavy = [m for m in ('torch', 'numpy', 'tiktoken', 'tokenizers') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_subcommand_has_help():
    from gptrain.cli import build_parser

    parser = build_parser()
    subparsers = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, sub in subparsers[0].choices.items():
        assert sub.format_help(), name
