"""Fixtures shared by several test folders."""

import pytest


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """The test machine has 2 shared cores: extra intra-op threads only add contention.

    Module scope, so that module-scoped runs use the same thread count as the tests that
    compare against them (float reductions depend on it, and resume tests compare bits).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
