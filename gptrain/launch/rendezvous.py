"""Where a Slurm job's ranks meet: MASTER_ADDR and MASTER_PORT, chosen once by the batch script.

The batch script runs on the allocation's first node, where rank 0 listens, so it can look at
that node: the port starts from the job id and moves on past every port a socket there holds.
srun hands the one value to every rank; a step with ports Slurm reserved uses the first of them;
a MASTER_ADDR or MASTER_PORT the user set in env_vars is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptrain.utils.ports import PORT_LOW, PORT_SPAN

# Per-task environment for torch.distributed's env:// init, from Slurm's variables.
RANK_EXPORTS = (
    "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS"
    " LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE;"
)
# A step Slurm reserved ports for (srun --resv-ports, MpiParams=ports=...) rendezvous on the
# first of them: the same on every node of the step, and given to no other step there.
RESERVED_PORT = '[ -z "$SLURM_STEP_RESV_PORTS" ] || export MASTER_PORT=${SLURM_STEP_RESV_PORTS%%[-,]*};'


def task_wrapper(exports: str, name: str) -> str:
    """`bash -c '<exports> exec "$@"' <name>`: per-task variables set where each task starts."""
    return f"bash -c '{exports} exec \"$@\"' {name}"


RANK_WRAPPER = task_wrapper(f"{RANK_EXPORTS} {RESERVED_PORT}", "gptrain-rank")


ADDR_LINES = """\
# Rendezvous: the first node of the allocation, where this script runs and rank 0 listens.
first_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
MASTER_ADDR=$(scontrol show node "$first_host" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
export MASTER_ADDR=${MASTER_ADDR:-$first_host}"""

PORT_LINES = f"""\
# The rendezvous port: derived from the job id, then moved on past every port a TCP socket of
# this node holds (/proc/net/tcp*: another job sharing the node, whose id may map to the same
# port) and past the kernel's ephemeral range; srun gives every rank this one value.
declare -A held=()
while read -r _ address _; do
  [[ $address == *:* ]] && held[$((16#${{address##*:}}))]=1
done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)
read -r ephemeral_low ephemeral_high 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range || ephemeral_low=1 ephemeral_high=0
MASTER_PORT=$(({PORT_LOW} + SLURM_JOB_ID % {PORT_SPAN}))
for ((i = 0; i < 2 * {PORT_SPAN}; i++)); do  # the second round may use the ephemeral range
  port=$(({PORT_LOW} + (SLURM_JOB_ID + i) % {PORT_SPAN}))
  [ -n "${{held[$port]-}}" ] && continue
  ((i < {PORT_SPAN} && port >= ephemeral_low && port <= ephemeral_high)) && continue
  MASTER_PORT=$port && break
done
export MASTER_PORT"""

MASTER_LINES = f"{ADDR_LINES}\n{PORT_LINES}"


@dataclass
class Rendezvous:
    """The batch script's lines that set MASTER_ADDR/MASTER_PORT, and what each task runs under."""

    lines: list[str]
    wrapper: str  # per task: RANK and friends (training), the reserved port


def rendezvous(env_vars: dict[str, object] | None, ranks: bool) -> Rendezvous:
    """MASTER_ADDR and MASTER_PORT as above, except one env_vars sets: the user's choice (a port a
    firewall lets through, `$SLURMD_NODENAME-ib`), exported before and kept, as NeMo's jobs keep it
    (Lightning reads MASTER_PORT when set). `ranks`: the task also gets RANK, LOCAL_RANK, ...."""
    given = {name for name, value in (env_vars or {}).items() if value is not None}
    lines = [ADDR_LINES] if "MASTER_ADDR" not in given else ["# Rendezvous: MASTER_ADDR from env_vars."]
    lines.append(
        PORT_LINES if "MASTER_PORT" not in given else "# The rendezvous port: MASTER_PORT from env_vars."
    )
    exports = (RANK_EXPORTS if ranks else "") + ("" if "MASTER_PORT" in given else f" {RESERVED_PORT}")
    wrapper = task_wrapper(exports.strip(), "gptrain-rank" if ranks else "gptrain-port") if exports else ""
    return Rendezvous(lines, wrapper)
