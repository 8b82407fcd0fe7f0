"""The rendezvous port of a Slurm job's ranks where no one chose it: each rank computes it alone.

`gptrain launch`'s batch script chooses MASTER_PORT once on the first node (a free port;
gptrain.launch.rendezvous) and every rank inherits it. Ranks started by a plain `srun gptrain ...`
have no such script: they agree on a port without talking, from what Slurm gives every task of
the step alike. A fixed port (torch's 29500) collides with any other job, or other step of the
same job, whose rank 0 shares the node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Ports [PORT_LOW, PORT_LOW + PORT_SPAN): below Linux's default ephemeral range (32768-60999),
# where any outgoing connection on the node may take a port.
PORT_LOW, PORT_SPAN = 20000, 12768
# Steps of one job move the port by this many (a prime: no two steps below PORT_SPAN apart meet).
STEP_STRIDE = 9973


def slurm_rendezvous_port(env: Mapping[str, str]) -> int | None:
    """The first port Slurm reserved for the step (srun --resv-ports: the same on every node, no
    other step's), else one derived from the job and step ids; None outside a Slurm job."""
    reserved = env.get("SLURM_STEP_RESV_PORTS")
    if reserved:
        return int(re.split("[-,]", reserved)[0])
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    step = env.get("SLURM_STEP_ID", "")
    offset = STEP_STRIDE * int(step) if step.isdigit() else 0
    return PORT_LOW + (int(job) + offset) % PORT_SPAN
