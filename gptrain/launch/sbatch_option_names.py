"""sbatch's option names, to read a cluster.additional_parameters key the way sbatch will.

sbatch parses `#SBATCH --name=value` with getopt_long: a unique prefix is the option it starts
(`--mail-t` is --mail-type), an ambiguous one is refused when the job is submitted, and a
one-letter key renders `--N`, which is no long option at all (-N is --nodes). Reading keys here
lets the launcher refuse a second --mail-type or a --mem-per-c beside --mem before anything is
written, instead of sbatch silently taking the last one or refusing the job at submission.
"""

from __future__ import annotations

# sbatch's long options (its option table), those of every version from Slurm 22.05 to 26.05: a prefix
# that is ambiguous on some version is then never read here as one option.
SBATCH_LONG_OPTIONS = frozenset((
    "account", "acctg-freq", "array", "autocomplete", "batch", "bb", "bbf", "begin", "chdir", "cluster",
    "cluster-constraint", "clusters", "comment", "consolidate-segments", "constraint", "container",
    "container-id", "container-type", "context",
    "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu", "cpus-per-task",
    "deadline", "delay-boot", "dependency", "distribution", "error", "exclude", "exclusive", "export",
    "export-file", "external", "extra", "extra-node-info", "get-user-env", "gid", "gpu-bind", "gpu-freq",
    "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "help", "hint",
    "hold", "ignore-pbs", "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type",
    "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network",
    "nice", "no-kill", "no-requeue", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core",
    "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres", "oom-kill-step",
    "open-mode", "output", "overcommit", "oversubscribe", "parsable", "partition", "power", "prefer",
    "priority", "profile", "propagate", "qos", "quiet", "reboot", "requeue", "reservation", "resources",
    "resv-ports", "segment", "signal", "sockets-per-node", "spread-job", "spread-segments", "stepmgr", "switches", "tasks-per-node",
    "test-only", "thread-spec", "threads-per-core", "time", "time-min", "tmp", "tres-bind",
    "tres-per-task", "uid", "usage", "use-min-nodes", "verbose", "version", "wait", "wait-all-nodes",
    "wckey", "wrap",
))  # fmt: skip

# sbatch's options that are another name of one above: sbatch sets the same thing from either.
SBATCH_OPTION_ALIASES = {"tasks-per-node": "ntasks-per-node", "cluster": "clusters"}

# sbatch's one-letter options and the long option each is.
SBATCH_SHORT_OPTIONS = {
    "A": "account", "a": "array", "B": "extra-node-info", "b": "begin", "C": "constraint",
    "c": "cpus-per-task", "D": "chdir", "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus",
    "H": "hold", "h": "help", "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses",
    "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks", "O": "overcommit", "o": "output",
    "p": "partition", "Q": "quiet", "q": "qos", "S": "core-spec", "s": "oversubscribe", "t": "time",
    "V": "version", "v": "verbose", "W": "wait", "w": "nodelist", "x": "exclude",
}  # fmt: skip

# sbatch's input variables (its env_vars table, Slurm 22.05 to 26.05) and the long option each sets,
# as sbatch sets it from the variable before the #SBATCH lines are read: those not named after their
# option (SBATCH_TIMELIMIT is --time, SBATCH_BURST_BUFFER --bb) and those not named SBATCH_ too.
SBATCH_VARIABLE_OPTIONS = {
    "SBATCH_ARRAY_INX": "array", "SBATCH_BURST_BUFFER": "bb", "SBATCH_CPU_FREQ_REQ": "cpu-freq",
    "SBATCH_DEBUG": "verbose", "SBATCH_MEM_PER_NODE": "mem", "SBATCH_SEGMENT_SIZE": "segment",
    "SBATCH_TIMELIMIT": "time", "SLURM_CLUSTERS": "clusters", "SLURM_HINT": "hint",
    # no option of their own: the two halves of --switches=<count>@<max-time>
    "SBATCH_REQ_SWITCH": "switches", "SBATCH_WAIT4SWITCH": "switches",
}  # fmt: skip


def variable_option(name: str) -> str | None:
    """The sbatch option an input variable sets (SBATCH_WCKEY: --wckey, SBATCH_TIMELIMIT: --time);
    None for a variable sbatch does not read as an option (not SBATCH_*, or PATH)."""
    if name in SBATCH_VARIABLE_OPTIONS:
        return SBATCH_VARIABLE_OPTIONS[name]
    if not name.startswith("SBATCH_"):
        return None
    option = name.removeprefix("SBATCH_").lower().replace("_", "-")  # as sbatch names the rest
    return SBATCH_OPTION_ALIASES.get(option, option)


def options_meant(option: str) -> list[str]:
    """The sbatch options `--option` may be, as getopt_long reads it: itself where it is a full name
    (or one not known here: sbatch will say), else every option it is a prefix of (one: the option
    it abbreviates; several: ambiguous, which sbatch refuses). An alias is read as the option it
    names (--tasks-per-node is --ntasks-per-node), so that it is checked as that option."""
    if option in SBATCH_LONG_OPTIONS:
        return [SBATCH_OPTION_ALIASES.get(option, option)]
    prefixed = sorted(name for name in SBATCH_LONG_OPTIONS if name.startswith(option))
    # getopt_long counts two names of one option as one match (no prefix is of --cluster and --clusters alone)
    meant = {SBATCH_OPTION_ALIASES.get(name, name) for name in prefixed}
    return list(meant) if len(meant) == 1 else prefixed or [option]
