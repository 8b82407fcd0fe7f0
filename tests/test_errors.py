"""The one line the CLI prints for an error a DataLoader worker raised."""

from __future__ import annotations

import pytest
from torch._utils import ExceptionWrapper

from gptrain.errors import DataError, error_text


def reraised_from_a_worker(error: BaseException) -> BaseException:
    """`error` as torch's DataLoader hands it to the main process: re-created with the worker's
    traceback in its message."""
    try:
        raise error
    except BaseException:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(BaseException) as caught:
        wrapper.reraise()
    return caught.value


def test_a_workers_gptrain_error_is_its_own_message():
    error = reraised_from_a_worker(DataError("data/x: sample 3 holds token id 5000; prepare it again"))
    assert isinstance(error, DataError) and "Original Traceback" in str(error)
    assert error_text(error) == "data/x: sample 3 holds token id 5000; prepare it again"


def test_a_message_without_its_type_gives_the_tracebacks_last_line_without_the_type():
    text = 'Caught X in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  File "w.py"\nsome.module.OtherError: the reason\n'
    assert error_text(DataError(text)) == "the reason"
    assert error_text(DataError("plain one line")) == "plain one line"
