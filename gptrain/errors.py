"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""


class GptrainError(Exception):
    """Base class: the message names the file, line or key and what to do."""


class ConfigError(GptrainError):
    """A config key, value or file is wrong."""


class DataError(GptrainError):
    """Input data or a dataset file is wrong."""


class LaunchError(GptrainError):
    """A launch request cannot be satisfied (cluster, Slurm, paths)."""


# Exit code of a training run that saved a checkpoint because of a time limit or a signal
# (SIGTERM/SIGUSR1, trainer.max_time) and wants to be requeued; 75 is EX_TEMPFAIL.
EXIT_REQUEUE = 75
