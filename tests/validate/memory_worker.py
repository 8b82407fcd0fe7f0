"""One gloo rank for tests/validate/test_validate_memory.py: the rank sees 100 KiB usable (rank 0)
or 40 KiB (rank 1), picks the collectives' sizes from 1 KiB to 64 KiB that fit, runs that sweep
(a mismatch would hang it), and writes the sizes, its row count and what it printed to
OUT/rank_<r>.json. Argument: OUT."""

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

from gptrain.validate import memory
from gptrain.validate.collectives import sweep
from gptrain.validate.main import Outcome, fitting_sizes
from gptrain.validate.runtime import finish, start

KIB, GIB = 1 << 10, 1 << 30


def main() -> None:
    out = Path(sys.argv[1])
    ctx = start(60)
    usable = 100 * KIB if ctx.rank == 0 else 40 * KIB
    # 10 GiB total: a 2 GiB margin; both ranks share this host's memory
    memory.local_memory = lambda ctx: (2 * GIB + ctx.size * usable, 10 * GIB)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        sizes = fitting_sizes(ctx, argparse.Namespace(min_bytes=KIB, max_bytes=64 * KIB), Outcome())
    rows = sweep(ctx, sizes, iters=1, warmup=0)
    result = {"sizes": sizes, "rows": len(rows), "printed": printed.getvalue().splitlines()}
    (out / f"rank_{ctx.rank}.json").write_text(json.dumps(result))
    finish()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
