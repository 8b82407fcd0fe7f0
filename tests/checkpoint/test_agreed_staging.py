"""A failed staging copy's error as every rank names it (gptrain.checkpoint.agreed_staging); the agreement
itself runs on two gloo ranks in test_save_failures_ranks.py."""

import errno

from gptrain.checkpoint.agreed_staging import StagingFailed, _portable, _rebuilt
from gptrain.checkpoint.errors import on_rank, root_cause


def test_a_failed_copy_is_named_with_its_rank_and_innermost_cause():
    """The save's line reads the rank and the cause from `failures`, as from DCP's CheckpointException."""
    failed = StagingFailed(3, OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert on_rank(failed, world_size=4) == "on rank 3: "
    assert root_cause(failed) == "OSError: [Errno 12] Cannot allocate memory"
    assert isinstance(failed, Exception)  # DCP's staging callback catches Exception only


def test_a_peer_rebuilds_the_failing_ranks_error_or_its_line():
    """Another rank rebuilds the error where it pickles (the same type and message in the line), else
    it carries the failing rank's line."""
    assert root_cause(_rebuilt(_portable(OSError(errno.ENOSPC, "No space left")))) == (
        "OSError: [Errno 28] No space left"
    )

    class Local(Exception):  # a class defined in a function does not pickle
        pass

    pickled, line = _portable(Local("copy failed"))
    assert pickled is None and line == "Local: copy failed"
    rebuilt = _rebuilt((pickled, line))
    assert isinstance(rebuilt, RuntimeError) and str(rebuilt) == "Local: copy failed"
