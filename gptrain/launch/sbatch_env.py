"""sbatch's input variables (SBATCH_PARTITION, SBATCH_TIMELIMIT, SLURM_HINT, ...) in the launching
shell: sbatch takes each over the script's #SBATCH line (only its command line beats them), so one
left from other work changed a job away from what preflight checked. gptrain's keys are the launch's
command line: a variable for an option the script renders is left out of the sbatch call, said once;
one for an option it does not render applies, as it does to the user's own sbatch (a site's
SBATCH_ACCOUNT). Variables and lines are matched by the options sbatch reads them as
(sbatch_option_names: SBATCH_BURST_BUFFER is --bb, a `--cluster` line is --clusters)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gptrain.launch.additional_parameters import (
    SBATCH_OWNED,
    SBATCH_REFUSED,
    SBATCH_RESERVED,
    keeps_the_environment,
)
from gptrain.launch.sbatch_option_names import options_meant, variable_option

# Options sbatch takes as one request: a variable for one of a group clashes with a line of another.
RELATED_OPTIONS = (
    ("gres", "gpus", "gpus-per-node"),  # Slurm refuses --gres with --gpus-per-node
    ("mem", "mem-per-cpu", "mem-per-gpu"),  # sbatch: mutually exclusive
    ("cpus-per-task", "cpus-per-gpu"),  # sbatch: mutually exclusive
    ("requeue", "no-requeue"),
)
# One-way clashes: SBATCH_ERROR sends stderr away from the log `gptrain logs` and status read.
ALSO_OVERRIDES = {"error": ("output",)}


def clashing_options(option: str) -> tuple[str, ...]:
    """The options a variable for `option` would override or contradict: itself, those sbatch
    takes with it as one request, and ALSO_OVERRIDES'."""
    related = next((group for group in RELATED_OPTIONS if option in group), ())
    return (option, *(other for other in related if other != option), *ALSO_OVERRIDES.get(option, ()))


def rendered_options(script_lines: list[str]) -> set[str]:
    """The options of a script's #SBATCH lines, as sbatch reads them: an abbreviation or another name
    (`--gpu-b`, `--cluster`, from cluster.additional_parameters) is the option it stands for."""
    prefix = "#SBATCH --"
    written = {line[len(prefix) :].split("=", 1)[0] for line in script_lines if line.startswith(prefix)}
    return {meant[0] if len(meant := options_meant(option)) == 1 else option for option in written}


def overriding_variables(rendered: set[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The SBATCH_* variables set in `environ` that would override an option of the script (or one
    gptrain owns, --wait, --export), each with that option."""
    owned = rendered | set(SBATCH_RESERVED) | set(SBATCH_REFUSED)
    found = {}
    for name in sorted(environ):
        option = variable_option(name)
        if option is None or (option == "export" and keeps_the_environment("export", environ[name])):
            continue
        hit = next((other for other in clashing_options(option) if other in owned), None)
        if hit:
            found[name] = hit
    return found


# srun's input variables (man srun 22.05, INPUT ENVIRONMENT VARIABLES, "Same as" an option) and the
# option each is read as, for the note. A batch job keeps one the launching shell had (left there by an
# enclosing job or step; measured on Slurm 22.05: SLURM_NTASKS is reset from the job's own options,
# SLURM_GPUS_PER_TASK is not, and the job's srun was refused its gres), and its srun takes it as that
# option. As a list misses some (newer Slurm adds more), every SLURM_*/SRUN_* variable is left out of
# sbatch's environment (sbatch sets the job's own) but SBATCH_READS and those sbatch reads as its
# options (SLURM_HINT, SLURM_CLUSTERS: sbatch_option_names).
SRUN_VARIABLES = {
    "SLURM_ACCOUNT": "account", "SLURM_ACCTG_FREQ": "acctg-freq", "SLURM_BCAST": "bcast",
    "SLURM_BCAST_EXCLUDE": "bcast-exclude", "SLURM_BURST_BUFFER": "bb", "SLURM_COMPRESS": "compress",
    "SLURM_CONSTRAINT": "constraint", "SLURM_CORE_SPEC": "core-spec", "SLURM_CPU_BIND": "cpu-bind",
    "SLURM_CPU_FREQ_REQ": "cpu-freq", "SLURM_CPUS_PER_GPU": "cpus-per-gpu",
    "SRUN_CPUS_PER_TASK": "cpus-per-task", "SLURM_DEBUG": "verbose", "SLURM_DELAY_BOOT": "delay-boot",
    "SLURM_DEPENDENCY": "dependency", "SLURM_DISABLE_STATUS": "disable-status",
    "SLURM_DISTRIBUTION": "distribution", "SLURM_EPILOG": "epilog", "SLURM_EXACT": "exact",
    "SLURM_EXCLUSIVE": "exclusive", "SLURM_EXPORT_ENV": "export", "SLURM_GPU_BIND": "gpu-bind",
    "SLURM_GPU_FREQ": "gpu-freq", "SLURM_GPUS": "gpus", "SLURM_GPUS_PER_NODE": "gpus-per-node",
    "SLURM_GPUS_PER_TASK": "gpus-per-task", "SLURM_GRES": "gres", "SLURM_GRES_FLAGS": "gres-flags",
    "SLURM_IMMEDIATE": "immediate", "SLURM_JOB_ID": "jobid", "SLURM_JOB_NAME": "job-name",
    "SLURM_JOB_NUM_NODES": "nodes", "SLURM_KILL_BAD_EXIT": "kill-on-bad-exit", "SLURM_LABELIO": "label",
    "SLURM_MEM_BIND": "mem-bind", "SLURM_MEM_PER_CPU": "mem-per-cpu", "SLURM_MEM_PER_GPU": "mem-per-gpu",
    "SLURM_MEM_PER_NODE": "mem", "SLURM_MPI_TYPE": "mpi", "SLURM_NETWORK": "network",
    "SLURM_NNODES": "nodes", "SLURM_NO_KILL": "no-kill", "SLURM_NPROCS": "ntasks", "SLURM_NTASKS": "ntasks",
    "SLURM_NTASKS_PER_CORE": "ntasks-per-core", "SLURM_NTASKS_PER_GPU": "ntasks-per-gpu",
    "SLURM_NTASKS_PER_NODE": "ntasks-per-node", "SLURM_NTASKS_PER_SOCKET": "ntasks-per-socket",
    "SLURM_OPEN_MODE": "open-mode", "SLURM_OVERCOMMIT": "overcommit", "SLURM_OVERLAP": "overlap",
    "SLURM_PARTITION": "partition", "SLURM_POWER": "power", "SLURM_PROFILE": "profile",
    "SLURM_PROLOG": "prolog", "SLURM_QOS": "qos", "SLURM_REMOTE_CWD": "chdir",
    "SLURM_RESERVATION": "reservation", "SLURM_RESV_PORTS": "resv-ports", "SLURM_SEND_LIBS": "send-libs",
    "SLURM_SIGNAL": "signal", "SLURM_SPREAD_JOB": "spread-job", "SLURM_STDERRMODE": "error",
    "SLURM_STDINMODE": "input", "SLURM_STDOUTMODE": "output", "SLURM_STEP_GRES": "gres",
    "SLURM_TASK_EPILOG": "task-epilog", "SLURM_TASK_PROLOG": "task-prolog",
    "SLURM_THREAD_SPEC": "thread-spec", "SLURM_THREADS": "threads",
    "SLURM_THREADS_PER_CORE": "threads-per-core", "SLURM_TIMELIMIT": "time",
    "SLURM_UNBUFFEREDIO": "unbuffered", "SLURM_USE_MIN_NODES": "use-min-nodes", "SLURM_WAIT": "wait",
    "SLURM_WCKEY": "wckey", "SLURM_WORKING_DIR": "chdir", "SRUN_CONTAINER": "container",
    "SRUN_EXPORT_ENV": "export",
}  # fmt: skip
# SLURM_* variables sbatch reads itself (man sbatch 22.05) that are no option: kept.
SBATCH_READS = ("SLURM_CONF", "SLURM_DEBUG_FLAGS", "SLURM_EXIT_ERROR", "SLURM_STEP_KILLED_MSG_NODE_ID")


def srun_may_read(name: str) -> bool:
    """Whether a variable is left out of sbatch's environment as one the job's srun may read."""
    return name.startswith(("SLURM_", "SRUN_")) and name not in SBATCH_READS and variable_option(name) is None


def sbatch_environment(script_lines: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to run sbatch with for this script: without the variables that override it,
    nor srun's that the job's srun would read as its options."""
    environ = os.environ if environ is None else environ
    left_out = overriding_variables(rendered_options(script_lines), environ)
    return {
        name: value for name, value in environ.items() if name not in left_out and not srun_may_read(name)
    }


NAMED_AT_MOST = 8  # srun options named in the note; the rest are counted


def srun_variables_note(environ: Mapping[str, str] | None = None) -> str | None:
    """One line on srun's variables set here, which sbatch_environment leaves out: those man srun
    names with their options, the others by name."""
    environ = os.environ if environ is None else environ
    dropped = sorted(name for name in environ if srun_may_read(name))
    options = [name for name in dropped if name in SRUN_VARIABLES]
    found = [f"{name} (--{SRUN_VARIABLES[name]})" for name in options[:NAMED_AT_MOST]]
    others = options[NAMED_AT_MOST:] + [name for name in dropped if name not in SRUN_VARIABLES]
    if others:  # inside salloc some 30 describe the allocation: counted, not listed, past a few
        many = "s" if len(others) > 1 else ""
        listed = f" ({', '.join(others)})" if len(others) <= NAMED_AT_MOST // 2 else ""
        found.append(f"and {len(others)} other SLURM_*/SRUN_* variable{many}{listed}")
    if not found:
        return None
    return (
        "note  srun's variables set in this shell, left out of the sbatch calls (the job's srun would read"
        f" them as its options): {', '.join(found)}; give such an option in cluster.srun_args"
    )


def option_keys(option: str, stage: str) -> str:
    """The config key behind a rendered (or owned) option, for the note."""
    if option in SBATCH_OWNED:
        return SBATCH_OWNED[option].replace("<stage>", stage)
    if option in SBATCH_RESERVED or option in SBATCH_REFUSED:
        return f"--{option}, which gptrain keeps as it is"
    return f"cluster.additional_parameters' --{option}"


def sbatch_variables_note(
    scripts: list[tuple[str, list[str]]], environ: Mapping[str, str] | None = None
) -> str | None:
    """One line on the SBATCH_* variables set here, for (stage, #SBATCH lines) of each job: those
    left out of the sbatch calls, with the keys they would override, and those that apply."""
    environ = os.environ if environ is None else environ
    overrides: dict[str, list[str]] = {}
    for stage, lines in scripts:
        for name, option in overriding_variables(rendered_options(lines), environ).items():
            keys = overrides.setdefault(name, [])
            if option_keys(option, stage) not in keys:
                keys.append(option_keys(option, stage))
    applying = sorted(name for name in environ if variable_option(name) and name not in overrides)
    parts = []
    if overrides:
        named = "; ".join(f"{name} over {', '.join(keys)}" for name, keys in sorted(overrides.items()))
        parts.append(
            f"left out of the sbatch calls, as sbatch would take them over the #SBATCH lines preflight"
            f" checked ({named}): set those keys to change them"
        )
    if applying:
        one = len(applying) == 1
        parts.append(
            f"{', '.join(applying)} {'applies' if one else 'apply'}, as no key of this launch sets"
            f" {'its option' if one else 'their options'}"
        )
    return f"note  SBATCH_* variables set in this shell: {'; '.join(parts)}" if parts else None
