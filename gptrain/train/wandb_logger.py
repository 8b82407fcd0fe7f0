"""Weights & Biases: the series of the logging rank's TensorBoard events, sent to a W&B run too.

Configured by NeMo's `exp_manager.create_wandb_logger` and `wandb_logger_kwargs` (what NeMo hands
to Lightning's WandbLogger), or by Megatron's `--wandb-project/--wandb-exp-name/--wandb-save-dir`.
wandb is an optional extra: it is imported here only, and only when a run asks for it, so the CLI
and a run without W&B never load it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError

# The x axis of every series: the iteration, logged as a value (Lightning's name, so NeMo's W&B
# dashboards plot as before). Not W&B's own step (`_step`), which refuses a step lower than the run's
# last: a requeued job resuming a W&B run (wandb_logger_kwargs.id and resume) re-logs the iterations
# between its checkpoint and the stop, and W&B dropped them and every later one up to the old last.
STEP_AXIS = "trainer/global_step"
# The x axis of the series TensorBoard writes against consumed samples (NeMo's tag).
SAMPLES_AXIS = "consumed_samples"


def require_wandb(cfg: TrainingConfig) -> None:
    """A one-line error on every rank, before any work, when W&B is asked for but not installed."""
    if cfg.exp_manager.create_wandb_logger and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "exp_manager.create_wandb_logger=true needs wandb, which is not installed: "
            "pip install 'gptrain[wandb]' (or set exp_manager.create_wandb_logger=false)"
        )


def init_kwargs(cfg: TrainingConfig, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """`wandb.init` arguments from wandb_logger_kwargs, with NeMo's defaults (name: run.name,
    local files under explicit_log_dir) and the resolved config (`record`, as hparams.yaml keeps it)
    as the run's config."""
    kw = cfg.exp_manager.wandb_logger_kwargs
    save_dir = kw.save_dir or cfg.exp_manager.explicit_log_dir
    args: dict[str, Any] = {
        "project": kw.project,
        "name": kw.name or cfg.run.name,
        "dir": save_dir,
        "id": kw.id,
        "resume": kw.resume,
        "entity": kw.entity,
        "group": kw.group,
        "job_type": kw.job_type,
        "tags": kw.tags,
        "notes": kw.notes,
        "config": cfg.to_dict() if record is None else record,
    }
    if kw.offline:
        args["mode"] = "offline"
    return {key: value for key, value in args.items() if value is not None}


class WandbRun:
    """One W&B run, fed the same values as TensorBoard.

    Every row carries its iteration as STEP_AXIS, the x axis of every series (define_metric), and
    W&B's own step just counts rows: an iteration logged again after a resume from an earlier
    checkpoint, or a value reported late for an earlier one (a background checkpoint's cost), is
    kept at its own iteration. Series TensorBoard plots against consumed samples are plotted here
    against `consumed_samples`, logged beside them.
    """

    def __init__(self, run: Any) -> None:
        self._run = run
        self._sample_series: set[str] = set()
        run.define_metric(STEP_AXIS)
        run.define_metric("*", step_metric=STEP_AXIS)

    @classmethod
    def start(cls, cfg: TrainingConfig, record: dict[str, Any] | None = None) -> WandbRun:
        require_wandb(cfg)
        import wandb

        args = init_kwargs(cfg, record)
        os.makedirs(args["dir"], exist_ok=True)
        try:
            return cls(wandb.init(**args))
        except Exception as error:  # wandb's own errors (no API key, no network) as one line
            reason = " ".join(str(error).split()) or type(error).__name__
            raise ConfigError(
                f"Weights & Biases did not start ({reason}): log in (wandb login, or WANDB_API_KEY), "
                "or run offline (WANDB_MODE=offline or exp_manager.wandb_logger_kwargs.offline=true)"
            ) from None

    def log(self, values: dict[str, float | None], step: int) -> None:
        """One row at iteration `step` (no `step=` to W&B: see STEP_AXIS)."""
        present = {tag: value for tag, value in values.items() if value is not None}
        if present:
            self._run.log({**present, STEP_AXIS: step})

    def log_vs_samples(self, values: dict[str, float | None], samples: int, step: int) -> None:
        for tag in values.keys() - self._sample_series:
            self._run.define_metric(tag, step_metric=SAMPLES_AXIS)
            self._sample_series.add(tag)
        self.log({**values, SAMPLES_AXIS: samples}, step)

    def close(self) -> None:
        """Finish the run (failed, exit code 1, when an exception is on its way out) and wait until W&B's
        service has written all of it: finish() may return before the run's file is on disk."""
        import wandb

        self._run.finish(exit_code=1 if sys.exc_info()[0] is not None else 0)
        wandb.teardown()
