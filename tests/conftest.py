"""Shared test settings."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Every test runs torch on one thread: the small networks here run fastest that way and do not thrash
    a busy 2-core machine. The caller's setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
