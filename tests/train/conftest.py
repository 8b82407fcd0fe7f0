import pytest


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread(one_torch_thread_per_module):
    yield
