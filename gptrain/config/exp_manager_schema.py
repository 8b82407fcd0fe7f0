"""The exp_manager section's dataclasses: run directory, resume, loggers, checkpoint saves."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class CheckpointCallbackParams:
    dirpath: str | None = None
    """The directory checkpoints are saved to and resumed from (NeMo's, PyTorch Lightning's); null:
    explicit_log_dir/checkpoints. A relative path is made absolute against the working directory it
    is given in, as Lightning resolves it; hparams.yaml records it, and a copy of hparams.yaml in it
    leads eval, export and generate back to the run."""
    filepath: str | None = None
    """NeMo's deprecated spelling of dirpath and filename: where dirpath is null, its directory is
    dirpath, as NeMo's exp_manager reads it (the file name has no use: gptrain names step_<N>)."""
    every_n_train_steps: int | None = None
    """Save a checkpoint every N steps (and at the end, on max_time and on SIGTERM/SIGUSR1); null (the
    default, as NeMo's CallbackParams): at each validation, every trainer.val_check_interval steps, as
    PyTorch Lightning saves without it; 0, as Lightning: no saves by step, every_n_epochs then 0 where
    null (only the last checkpoint, at each validation). gptrain's presets set it."""
    every_n_epochs: int | None = None
    """PyTorch Lightning's top-k saves at each validation, which it makes only while every_n_train_steps
    is null and this is null or 1 (a NeMo GPT run is one epoch long, so 2 or more is the same as 0).
    0: no top-k checkpoints, only Lightning's last one, at each validation and at the end: saved on
    the same steps, and only the newest is kept (save_top_k counts as 0; needs save_last). 1 or more
    beside an every_n_train_steps of 1 or more is refused, as Lightning refuses the pair."""
    save_top_k: int = 10
    """Keep K complete checkpoints, and always the newest: the K best by `monitor`, or without one the K
    newest; the others are deleted (-1 keeps every one; 0 only the newest, Lightning's last.ckpt, and
    needs save_last: Lightning saves nothing with both off)."""
    monitor: str | None = None
    """The metric the kept checkpoints are the best by: val_loss (the validation loss each save at a
    validated step records), step (the iteration, as Lightning offers it: with mode max the newest),
    or null to keep the newest. NeMo's default is val_loss; gptrain's
    presets leave it null, so their retention stays the K newest (a NeMo config setting
    `monitor: val_loss` keeps the best)."""
    mode: str = "min"
    """Best by `monitor`: min (lowest, for a loss) or max."""
    save_last: bool | str = True
    """Save a checkpoint when training ends (false: only on the interval; a stop for a requeue
    always saves). Lightning's `link` is true."""
    async_save: bool = False
    """Save checkpoints in a background thread (torch.distributed.checkpoint async_save)."""
    direct_io: bool | None = None
    """gptrain extension: write checkpoint shards around the page cache (Linux O_DIRECT), which
    halves the writer's CPU time and keeps the training data's pages cached; null: on local disk
    file systems (ext4, xfs, btrfs, f2fs) only, buffered on network ones (NFS, Lustre, GPFS...)."""


@dataclass
class WandbLoggerKwargs:
    """What NeMo hands to Lightning's WandbLogger (and so to `wandb.init`)."""

    project: str | None = None
    """W&B project (Megatron: --wandb-project); null: W&B's default project."""
    name: str | None = None
    """Name of the W&B run (Megatron: --wandb-exp-name); null: run.name."""
    save_dir: str | None = None
    """Where W&B keeps its local files (`<save_dir>/wandb/`); null: explicit_log_dir (NeMo's choice).
    Megatron's --wandb-save-dir, which defaults to `<--save>/wandb`."""
    offline: bool = False
    """Write the run to save_dir only, for a later `wandb sync` (also WANDB_MODE=offline)."""
    id: str | None = None
    """W&B run id; with `resume`, a restarted job continues that W&B run instead of starting another."""
    resume: bool | str | None = None
    """`wandb.init`'s resume (`allow`, `must`, `never`, true); used with `id`."""
    entity: str | None = None
    """W&B team or user the run belongs to; null: the API key's default."""
    group: str | None = None
    """W&B group, to show several runs (e.g. the jobs of one requeued run) together."""
    job_type: str | None = None
    """W&B job type, a label to filter runs by."""
    tags: list[str] | None = None
    """W&B tags."""
    notes: str | None = None
    """A description of the run shown in W&B."""


@dataclass
class ExpManagerConfig:
    explicit_log_dir: str = "results/gpt3_126m/results"
    """Where everything of a training run goes (NeMo: `${training.run.results_dir}/results`)."""
    resume_if_exists: bool = True
    """Resume from the newest complete checkpoint in the run's checkpoint directory
    (checkpoint_callback_params.dirpath, else explicit_log_dir/checkpoints) if any."""
    resume_from_checkpoint: str | None = None
    """A checkpoint to start from while explicit_log_dir has none of its own (Megatron: --load with
    another --save): a step directory, a checkpoints/ directory or a run directory (its newest complete
    checkpoint). Once the run has saved, a restart resumes from its own checkpoints, not this one."""
    load_optimizer: bool = True
    """gptrain extension (Megatron: --no-load-optim): take the optimizer state, the learning-rate
    schedule's position and the fp16 loss scale from resume_from_checkpoint too."""
    load_rng: bool = True
    """gptrain extension (Megatron: --no-load-rng): take the random streams from resume_from_checkpoint."""
    load_data_position: bool = True
    """gptrain extension: take the consumed samples from resume_from_checkpoint; false: the data
    starts at its first sample while the iteration, optimizer and schedule go on, as NeMo's
    model.restore_from_ckpt does (continual pretraining on another blend)."""
    finetune: bool = False
    """gptrain extension (Megatron: --finetune): take only the weights from resume_from_checkpoint;
    iteration and consumed samples start at 0, with a fresh optimizer and schedule."""
    allow_tokenizer_change: bool = False
    """gptrain extension: load a checkpoint (resume, resume_from_checkpoint, eval, generate, export)
    whose recorded tokenizer is not model.tokenizer's, with a warning; false refuses it (its ids
    would mean other tokens than the trained embeddings). A tokenizer that only adds tokens after
    the recorded ones loads either way."""
    create_tensorboard_logger: bool = True
    """Write TensorBoard events (to tensorboard_dir, else explicit_log_dir)."""
    tensorboard_dir: str | None = None
    """gptrain extension (Megatron: --tensorboard-dir; NeMo has no key for it): the directory the
    TensorBoard events go to; null: explicit_log_dir. A relative path is made absolute against the
    working directory it is given in, as Megatron's writer resolves it (hparams.yaml records it)."""
    create_wandb_logger: bool = False
    """Send the TensorBoard series to Weights & Biases too, from the logging rank (needs
    `pip install 'gptrain[wandb]'`; WANDB_MODE=offline or wandb_logger_kwargs.offline without network)."""
    wandb_logger_kwargs: WandbLoggerKwargs = field(default_factory=WandbLoggerKwargs)
    move_aside_earlier_run: bool = False
    """gptrain extension: with resume_if_exists=false and an earlier run's checkpoints in
    checkpoint_callback_params.dirpath or explicit_log_dir/checkpoints, move the earlier run's files to
    `<explicit_log_dir>.earlier-<time>` and a dirpath's to `<dirpath>.earlier-<time>/` (never deleted)
    instead of refusing."""
    max_time_per_run: str | None = None
    """NeMo's wall-clock limit per job `DD:HH:MM:SS`: sets trainer.max_time (gptrain's is per job too),
    over trainer.max_time where both are set, as in NeMo."""
    create_checkpoint_callback: bool = True
    """Save checkpoints (checkpoint_callback_params). false, as NeMo's benchmark scripts set it (and
    Megatron without --save): none at all, not even on a stop signal or max_time, where the run
    then ends with exit 0 instead of being requeued (a requeue would start it over)."""
    checkpoint_callback_params: CheckpointCallbackParams = field(default_factory=CheckpointCallbackParams)

    @property
    def async_save(self) -> bool:
        return self.checkpoint_callback_params.async_save

    @property
    def checkpoints_dir(self) -> str:
        """Where the run's checkpoints go: checkpoint_callback_params.dirpath, else explicit_log_dir/checkpoints."""
        return self.checkpoint_callback_params.dirpath or os.path.join(self.explicit_log_dir, "checkpoints")

    @property
    def events_dir(self) -> str:
        """Where the run's TensorBoard events go."""
        return self.tensorboard_dir or self.explicit_log_dir
