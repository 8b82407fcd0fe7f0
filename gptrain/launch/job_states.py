"""The states `gptrain status`, `cancel`, `logs -f` and a launch read a job in: Slurm's words, and
the reasons gptrain gives where Slurm cannot tell (it did not answer, or is not on this machine)."""

from __future__ import annotations

from dataclasses import dataclass

# Slurm states of a job that may still run (or run again, after a requeue). squeue and scontrol name
# a state flag before the base state: a running job is SIGNALING while a SIGSTOP/SIGCONT is on its way
# (suspension, gang scheduling, a preemption's grace), a requeued one EXPEDITING (Slurm 25.11) or
# REQUEUE_HOLD/SPECIAL_EXIT/RESV_DEL_HOLD (held), a finished one STAGE_OUT until its burst buffer is out.
ACTIVE_STATES = (
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUE",
    "SUSPENDED",
    "RESIZING",
    "STOPPED",
    "SIGNALING",
    "EXPEDITING",
    "SPECIAL_EXIT",
    "RESV_DEL_HOLD",
    "STAGE_OUT",
)


# The reason of a job pending on a stage that failed (afterok): it stays PENDING and never starts.
NEVER_SATISFIED = "DependencyNeverSatisfied"


# The reason of a job whose state Slurm could not be asked for (controller down, squeue timed out).
NO_ANSWER = "Slurm did not answer"


# The reason of a Slurm job looked at from a machine without Slurm's commands (a run dir seen from
# outside the cluster): nothing here can ask about it or cancel it.
NO_SLURM_HERE = "no Slurm commands on this machine: run gptrain status/cancel on the cluster"


# Slurm's reasons a job waits in the queue (scontrol's Reason=, squeue's %r): Slurm keeps the last
# one on a job cancelled while pending, where 'CANCELLED (Resources)' reads as cancelled for want of
# resources. DependencyNeverSatisfied is kept: it says why the job never ran.
WAITING_REASONS = frozenset(
    (
        "Priority", "Dependency", "Resources", "BeginTime", "Licenses", "Reservation", "ReqNodeNotAvail",
        "JobHeldUser", "JobHeldAdmin", "PartitionNodeLimit", "PartitionTimeLimit", "PartitionDown",
        "PartitionInactive", "PartitionConfig", "FrontEndDown", "Cleaning", "SchedDefer",
        "BurstBufferResources", "BurstBufferStageIn", "PowerNotAvail", "PowerReserved",
    )
)  # fmt: skip
# The families of limits a job waits on: AssocGrpCpuLimit, QOSMaxJobsPerUserLimit, MaxMemPerLimit ...
WAITING_PREFIXES = ("Assoc", "QOS", "Max")


def from_slurm(state: str, reason: str = "", exit_code: str = "") -> JobState:
    """A job's state as Slurm gives it, less the reason it waited in the queue once it has ended."""
    waited = reason in WAITING_REASONS or reason.startswith(WAITING_PREFIXES)
    ended = not any(word in state for word in ACTIVE_STATES)
    return JobState(state, "" if ended and waited else reason, exit_code)


@dataclass
class JobState:
    state: str
    reason: str = ""
    exit_code: str = ""

    @property
    def active(self) -> bool:
        """Queued or running (for an array: any task still is)."""
        return any(word in self.state for word in ACTIVE_STATES)

    @property
    def may_run(self) -> bool:
        """Active and able to start, or perhaps so (Slurm did not answer: `gptrain logs -f` keeps
        following). A job pending on a failed stage stays PENDING for ever, so nothing (a
        relaunch, `gptrain logs -f`) should wait for it."""
        return (self.active and self.reason != NEVER_SATISFIED) or self.unanswered

    @property
    def unanswered(self) -> bool:
        """Slurm could not be asked: the job may still be queued or running."""
        return self.state == "UNKNOWN" and self.reason.startswith(NO_ANSWER)

    @property
    def slurm_absent(self) -> bool:
        """Slurm's commands are not on this machine: nothing here can ask about the job or cancel it."""
        return self.state == "UNKNOWN" and self.reason.startswith(NO_SLURM_HERE)

    def describe(self) -> str:
        text = self.state
        if self.reason and self.reason not in ("None", "(null)"):
            text += f" ({self.reason})"
        if self.exit_code and self.exit_code not in ("0:0", "0"):
            text += f" exit {self.exit_code}"
        return text


def summarize(states: list[JobState]) -> JobState:
    if len(states) == 1:
        return states[0]
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    text = ", ".join(f"{n} {state}" for state, n in counts.items())
    failed = [s for s in states if s.state not in ("COMPLETED", "RUNNING", "PENDING")]
    return JobState(
        f"ARRAY[{text}]", failed[0].reason if failed else "", failed[0].exit_code if failed else ""
    )
