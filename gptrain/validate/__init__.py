"""`gptrain validate`: is every GPU and link healthy before a long run, and which node is not.

collectives.py  bandwidth sweep of the torch.distributed collectives (nccl-tests' numbers)
pairwise.py     node pairs / bisection and rank pairs inside a node: which member is slow
gpus.py         per-GPU health from NVML, a bf16 matmul rate, a copy bandwidth, `dcgmi diag`
thresholds.py   expected rates per cluster profile (configs/cluster/*.yaml, `validation:`)
report.py       nccl-tests style table, JSON, PNG, the `--exclude=` line
Only cli.py, main.py (torch once its arguments are checked), bandwidth.py, thresholds.py and
report.py are safe to import without torch.
"""
