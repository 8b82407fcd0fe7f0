"""Executors run a LaunchPlan: `local` (torchrun on this machine) or `slurm` (sbatch)."""
