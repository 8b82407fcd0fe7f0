"""Launch layer: compose configs, render scripts, run locally or on Slurm. Never imports torch."""
