"""A job sbatch accepted whose launcher.log line cannot be written (a full disk, a quota, a run dir made
read-only) is withdrawn with the rest of the launch, as when sbatch refuses a stage: unrecorded,
`gptrain status` and `cancel` never see it, and the relaunch the error invites would chase the same
run directory with a second job."""

from __future__ import annotations

import errno

import pytest
from test_launch_jobs import two_stage_launch

from gptrain.errors import LaunchError
from gptrain.launch.executors import slurm


def stub_slurm(tmp_path, monkeypatch, scancel_exit: int) -> object:
    sbatch = 'echo "sbatch $*" >> "$CALLS"\nif grep -q afterok "$CALLS"; then echo 501; else echo 500; fi\n'
    scancel = f'echo "scancel $*" >> "$CALLS"\nexit {scancel_exit}\n'
    plan = two_stage_launch(tmp_path, monkeypatch, sbatch, scancel)
    append_record = slurm.append_record

    def full_for_501(run_dir, event, **fields):
        if fields.get("job_id") == "501":
            raise OSError(errno.ENOSPC, "No space left on device")
        return append_record(run_dir, event, **fields)

    monkeypatch.setattr(slurm, "append_record", full_for_501)
    return plan


@pytest.mark.parametrize("scancel_exit", [0, 1])
def test_a_job_whose_record_cannot_be_written_is_withdrawn_with_the_launch(
    tmp_path, monkeypatch, scancel_exit
):
    """The OSError escaped submit(): 'gptrain: error: No space left on device', job 501 (training)
    queued, in no launcher.log, and job 500 left to prepare data for it."""
    plan = stub_slurm(tmp_path, monkeypatch, scancel_exit)
    with pytest.raises(LaunchError) as error:
        slurm.submit(plan)
    log = plan.jobs[1].run_dir / "launcher.log"
    head = f"{log}: cannot record Slurm job 501 (training), which sbatch accepted (No space left on device)"
    tail = (
        "; cancelled jobs 500 (data_preparation), 501 (training), which this launch had submitted"
        if scancel_exit == 0
        else "; jobs 500 (data_preparation), 501 (training) of this launch may still be queued, 501 "
        "unrecorded: scancel 500 501"
    )
    assert str(error.value) == head + tail
    assert (tmp_path / "calls").read_text().splitlines()[2:] == ["scancel 500 501"]
