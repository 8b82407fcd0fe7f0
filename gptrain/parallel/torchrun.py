"""torchrun that ends with its workers' requeue (75) or hang (76) exit code.

torchrun ends with 1 whatever its workers exited with, so a local launch (`cluster_type=local`)
whose ranks stopped at a checkpoint to be requeued, or after a hang, reported a failure, and a
wrapper that relaunches on 75 stopped instead. The code of the first worker to exit is passed
on when it is one of gptrain's own; anything else is 1, as torchrun says.
"""

from __future__ import annotations

import sys

from gptrain.errors import EXIT_HUNG, EXIT_REQUEUE


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as error:
        _, first = error.get_first_failure()  # the others are stopped after it: their codes follow from it
        return first.exitcode if first.exitcode in (EXIT_REQUEUE, EXIT_HUNG) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
