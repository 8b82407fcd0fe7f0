"""What happens to a model once it is trained: load a checkpoint, generate, plot the run.

Kept apart from `gptrain.train` (the training loop) so that tools working on a finished
checkpoint never depend on the loop's state, and the loop never on them.
"""
