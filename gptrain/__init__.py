"""gptrain: pretrain GPT models end to end (data, training, parallelism, Slurm launch)."""

__version__ = "0.1.0"
