"""Parallel layouts applied from outside the model: mesh, TP/SP, AC, compile, FSDP2/DDP, pipeline.

Entry points: `parallelize.parallelize` (a GPT -> this rank's `runtime.ParallelGPT`),
`runtime.forward_backward`, `layout.check_layout` (no torch), `mesh.world_from_env`,
`state_dict` (layout-independent checkpoints), `training` (the training loop's seams).
"""
