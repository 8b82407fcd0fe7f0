"""Every rank stops at the same step: a request is read at once on logged steps, one step late
on the others (no second wait for the device per step)."""

import json
from pathlib import Path

import pytest
from gloo_ranks import run_ranks

from gptrain.train.stop_agreement import OTHER_RANK, StopAgreement

WORKER = Path(__file__).with_name("stop_agreement_worker.py")


def test_alone_a_request_stops_at_once_whether_logged_or_not():
    agreement = StopAgreement()
    assert agreement.exchange(None, False) is None
    assert agreement.exchange("received SIGTERM", False) == "received SIGTERM"


@pytest.mark.distributed
def test_two_ranks_stop_at_the_same_step_one_late_when_unlogged(tmp_path):
    run_ranks(WORKER, tmp_path)
    ranks = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    asked = "received SIGUSR1"
    assert ranks[0]["unlogged request"] == [3, OTHER_RANK]  # asked at step 2, unlogged: read at 3
    assert ranks[1]["unlogged request"] == [3, asked]
    assert ranks[0]["logged request"] == [5, asked]  # step 5 is logged: read at once
    assert ranks[1]["logged request"] == [5, OTHER_RANK]
    # asked at unlogged step 3; step 4 is logged but the flag posted at 3 is what stops it
    assert ranks[0]["request at a boundary after an unlogged one"] == [4, OTHER_RANK]
    assert ranks[1]["request at a boundary after an unlogged one"] == [4, asked]
    assert ranks[0]["no request"] == ranks[1]["no request"] == [None, None]
