"""exp_manager.checkpoint_callback_params as Lightning's ModelCheckpoint reads them: dirpath, saves, retention."""

from __future__ import annotations

import os
from typing import Any

from gptrain.config.exp_manager_schema import ExpManagerConfig
from gptrain.config.schema import TrainingConfig
from gptrain.errors import ConfigError


def dirpath_apart_from_log_dir(dirpath: str, log_dir: str) -> None:
    """Checkpoints in the log dir itself, or in a directory above it, mix with the run's files: moving
    an earlier run aside would move the live run's lock too. Inside the log dir is its own directory.
    Compared resolved (as Lightning resolves dirpath): a symlink to the log dir is the log dir."""
    log_dir = os.path.abspath(log_dir)
    real_dirpath, real_log_dir = os.path.realpath(dirpath), os.path.realpath(log_dir)
    if os.path.commonpath([real_dirpath, real_log_dir]) == real_dirpath:
        what = (
            "explicit_log_dir" if real_dirpath == real_log_dir else f"explicit_log_dir {log_dir} or above it"
        )
        through = f" (resolved: {real_dirpath})" if real_dirpath != dirpath else ""
        raise ConfigError(
            f"exp_manager.checkpoint_callback_params.dirpath={dirpath} is the run's {what}{through}; give "
            f"the checkpoints a directory of their own (such as {os.path.join(log_dir, 'checkpoints')}, "
            "or null for that)"
        )


def save_interval(cfg: TrainingConfig) -> list[str]:
    """`every_n_train_steps: null` is PyTorch Lightning's save at each validation (NeMo's default, with
    every_n_epochs 1): every trainer.val_check_interval steps, so that each save records its val_loss.
    Without validation (limit_val_batches=0) Lightning saves none before the end; gptrain still saves
    on that interval, which a requeued run resumes from. 0 is Lightning's "no saves by step": null, its
    every_n_epochs then 0 where not given. Returns the note of _last_only."""
    params, key = cfg.exp_manager.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    _save_last_link(params, key)
    if cfg.exp_manager.create_checkpoint_callback and (params.every_n_epochs or 0) < 0:  # as Lightning
        raise ConfigError(
            f"{key}.every_n_epochs={params.every_n_epochs}: must be >= 0 (PyTorch Lightning refuses it); "
            "give 0 for no saves by epoch, 1 or null for a save at each validation"
        )
    if cfg.exp_manager.create_checkpoint_callback:
        _one_save_trigger(params, key)
    if params.every_n_train_steps == 0:
        given = f"{key}.every_n_train_steps=0" + (
            f" with every_n_epochs={params.every_n_epochs}" if params.every_n_epochs is not None else ""
        )
        params.every_n_epochs = 0 if params.every_n_epochs is None else params.every_n_epochs
    elif params.every_n_train_steps is None:
        given = f"{key}.every_n_epochs={params.every_n_epochs} with every_n_train_steps=null"
    else:
        return []
    params.every_n_train_steps = cfg.trainer.val_check_interval
    return _last_only(cfg.exp_manager, given)


def _one_save_trigger(params: Any, key: str) -> None:
    """Lightning's ModelCheckpoint takes one trigger: every_n_train_steps and every_n_epochs both
    above 0 raise its MisconfigurationException (train_time_interval, the third, is refused as not
    implemented). Here every_n_epochs was dropped without a word."""
    steps, epochs = params.every_n_train_steps or 0, params.every_n_epochs or 0
    if steps >= 1 and epochs >= 1:
        raise ConfigError(
            f"{key}.every_n_train_steps={steps} and every_n_epochs={epochs}: PyTorch Lightning refuses both "
            "(they are mutually exclusive); keep every_n_train_steps for a save every N steps and set "
            "every_n_epochs=null, or set every_n_train_steps=null for a save at each validation"
        )


def _save_last_link(params: Any, key: str) -> None:
    """Lightning's save_last `link` (last.ckpt a link to the newest checkpoint) saves the last one too."""
    if isinstance(params.save_last, str):
        if params.save_last.lower() != "link":
            raise ConfigError(f"{key}.save_last: '{params.save_last}' is not true, false or link")
        params.save_last = True


def _last_only(em: ExpManagerConfig, given: str) -> list[str]:
    """every_n_epochs other than null or 1 beside a null every_n_train_steps: Lightning saves no top-k
    checkpoint at a validation (a NeMo run's single epoch never reaches a second), only its `last`
    one, overwritten at each validation (the save still made): the newest alone is kept. Without
    save_last Lightning saves nothing, which a requeued run could not resume: refused."""
    params, key = em.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    if params.every_n_epochs in (None, 1) or not em.create_checkpoint_callback:
        return []
    if not params.save_last:
        raise ConfigError(
            f"{given} and save_last=false: PyTorch Lightning saves no checkpoint at all (no top-k at "
            "validation, no last one); for none set exp_manager.create_checkpoint_callback=false, else "
            f"set {key}.every_n_train_steps=N or save_last=true"
        )
    kept, params.save_top_k = params.save_top_k, 0
    return [
        f"{given}: as PyTorch Lightning, only the last checkpoint, saved at each validation (every "
        f"{params.every_n_train_steps} steps) and at the end; the newest alone is kept (not save_top_k={kept})"
    ]


MONITORED = ("val_loss", "step")
"""The metrics retention can rank by: val_loss, which a save at a validated step records in its
COMPLETE marker, and step (the iteration the marker records), which Lightning offers every save."""


def check_monitor(monitor: object) -> None:
    """Lightning fails a save whose monitored metric was never logged; here a name no save records
    would rank no checkpoint, silently keeping the newest: refused at load instead."""
    if monitor is not None and monitor not in MONITORED:
        raise ConfigError(
            f"exp_manager.checkpoint_callback_params.monitor: '{monitor}' is not recorded with a checkpoint; "
            "use val_loss to keep the best by validation loss, step (with mode=max) or null to keep the newest"
        )


def check_retention(em: ExpManagerConfig) -> None:
    """save_top_k as PyTorch Lightning's ModelCheckpoint takes it: -1 keeps every checkpoint (as
    Megatron does), 0 no best ones, only `last` (save_last, which NeMo's launcher sets): here the
    newest alone, which a requeue resumes from. 0 with save_last=false saves nothing in Lightning;
    a run that keeps no checkpoint cannot be requeued, so it is refused, naming both ways out."""
    key = "exp_manager.checkpoint_callback_params"
    params = em.checkpoint_callback_params
    if params.save_top_k < -1:
        raise ConfigError(
            f"{key}.save_top_k: must be 0 or more (0 keeps only the newest), or -1 to keep every "
            f"checkpoint, got {params.save_top_k}"
        )
    if params.save_top_k == 0 and not params.save_last and em.create_checkpoint_callback:
        raise ConfigError(
            f"{key}.save_top_k: 0 with save_last=false keeps no checkpoint (PyTorch Lightning saves none), "
            f"so a stopped run could not resume; set {key}.save_last=true to keep only the newest, or "
            "exp_manager.create_checkpoint_callback=false to save none"
        )
