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


@pytest.fixture(autouse=True)
def cpu_for_auto(request, monkeypatch):
    """Tests marked ``cpu`` compare with results computed on the CPU (SB3's, NumPy's, torch's own on CPU
    tensors), exercise a CPU-only path (NumPy acting, oneDNN, the CPU's bfloat16 check), or learn from seeds
    measured on the CPU. On a machine with CUDA, ``device="auto"`` means the CPU inside them, for covey and SB3
    alike: both ask ``torch.cuda.is_available()``. tests/test_cuda.py covers the agents on CUDA."""
    if request.node.get_closest_marker("cpu") is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
