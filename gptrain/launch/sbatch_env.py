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


# srun's input variables (man srun, INPUT ENVIRONMENT VARIABLES) that place the job's ranks or set
# what they run with, and the option each is read as. A batch job keeps one the launching shell had
# (left there by an enclosing job or step; measured on Slurm 22.05, where SLURM_NTASKS is reset from the
# job's own options and these are not), and its srun takes it as that option: they are left out of
# sbatch's environment. SLURM_EXPORT_ENV and SLURM_DISTRIBUTION the srun lines give themselves
# (sbatch.SRUN_PINNED); SLURM_HINT is sbatch's too (sbatch_option_names).
SRUN_VARIABLES = {
    "SLURM_CPU_BIND": "cpu-bind", "SLURM_MEM_BIND": "mem-bind", "SLURM_GPU_BIND": "gpu-bind",
    "SLURM_NTASKS_PER_CORE": "ntasks-per-core",
    "SLURM_NTASKS_PER_SOCKET": "ntasks-per-socket", "SLURM_NTASKS_PER_GPU": "ntasks-per-gpu",
    "SLURM_THREADS_PER_CORE": "threads-per-core", "SLURM_OVERCOMMIT": "overcommit",
    "SLURM_EXACT": "exact", "SLURM_SPREAD_JOB": "spread-job", "SLURM_USE_MIN_NODES": "use-min-nodes",
    "SLURM_MPI_TYPE": "mpi", "SLURM_WORKING_DIR": "chdir", "SLURM_UMASK": "umask",
    "SLURM_TASK_PROLOG": "task-prolog", "SLURM_TASK_EPILOG": "task-epilog",
}  # fmt: skip


def sbatch_environment(script_lines: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to run sbatch with for this script: without the variables that override it,
    nor srun's that the job's srun would read as its options."""
    environ = os.environ if environ is None else environ
    left_out = overriding_variables(rendered_options(script_lines), environ)
    return {
        name: value for name, value in environ.items() if name not in left_out and name not in SRUN_VARIABLES
    }


def srun_variables_note(environ: Mapping[str, str] | None = None) -> str | None:
    """One line on srun's variables set here, which sbatch_environment leaves out."""
    environ = os.environ if environ is None else environ
    found = [f"{name} (--{SRUN_VARIABLES[name]})" for name in sorted(environ) if name in SRUN_VARIABLES]
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
