"""The ending every gloo worker script of tests/checkpoint shares (they run as scripts, with this
folder first on sys.path)."""

import os
import sys
import traceback
from collections.abc import Callable

import torch.distributed as dist


def run_as_rank(main: Callable[[], int]) -> None:
    """`main()`'s code as the process's exit status, a traceback printed for anything it raises;
    the process group destroyed and the process ended with os._exit, since gloo may abort at
    interpreter exit otherwise (/work/shared/torch-distributed-cpu.md)."""
    code = 1
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
