"""`gptrain plan`: sizes, memory per GPU and step time of a model under every parallel layout.

Modules, one job each (none imports torch; `measure` starts `gptrain train` in subprocesses):
  hardware.py   GPU specs with sources, cluster defaults from configs/cluster/*.yaml
  spec.py       Workload (model + batch + precision) and Layout (tp, pp, vpp, dp, mbs, sp, sharding, AC)
  sizes.py      total and per-(TP, PP)-rank parameters (Megatron's lines), FLOPs, time to train
  memory.py     weights, gradients, optimizer state, activations and logits per GPU
  activations.py  what one token keeps for the backward in a block, the embedding, the head, the loss
  rank_activations.py  what a pipeline rank holds at its peak (micro batches in flight, checkpointed blocks)
  time.py       step time from compute at an MFU, pipeline bubble and communication over bandwidths
  rank.py       every valid layout, ranked under the memory limit; table and JSON
  build.py      the command's arguments turned into a Plan (config, cluster, requested layout, ranking)
  report.py     what it prints (a rich table) and writes (JSON)
  measure.py    short trials of the top candidates, re-ranked by what they measure
  trial.py      one rank of a trial: `gptrain train`, then what it measured as JSON
  slurm_trials.py  each trial as a Slurm job, through the launcher
  cli.py        the `plan` subcommand
The formulas and their sources are in docs/planning.md.
"""
