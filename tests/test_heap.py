"""covey.heap: the freed block that keeps glibc's heap from being trimmed after every update."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from covey import heap
from covey.heap import GLIBC

# Eight 2 MiB blocks written and freed, over and over: page faults per round after three rounds, in a new
# process that imports neither torch nor covey (whose imports may free large blocks and move the thresholds
# themselves), with covey/heap.py loaded on its own (loading it moves nothing; the call does).
CYCLES = f"""
import ctypes, importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("heap", {heap.__file__!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
libc = module.c_library()
if sys.argv[1] == "raise":
    assert module.raise_heap_thresholds() and not module.raise_heap_thresholds()
assert "torch" not in sys.modules
def cycle():
    blocks = [libc.malloc(2 << 20) for _ in range(8)]
    for block in blocks:
        ctypes.memset(block, 1, 2 << 20)
    for block in blocks:
        libc.free(block)
for _ in range(3):
    cycle()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 5)
"""


def faults_per_round(mode: str) -> float:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    result = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return float(result.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's heap thresholds: Linux with glibc only")
def test_raised_thresholds_keep_freed_megabytes_in_the_heap():
    # 16 MiB freed per round is more than twice the largest block freed before (2 MiB): glibc trims it and every
    # round faults its pages back in (4,096 of them); after the call glibc keeps up to 60 MiB and none fault.
    assert faults_per_round("default") > 2000
    assert faults_per_round("raise") < 100


def test_raise_heap_thresholds_runs_once_per_process(monkeypatch):
    monkeypatch.setattr(heap, "_raised", False)
    assert heap.raise_heap_thresholds() is GLIBC
    assert heap.raise_heap_thresholds() is False


@pytest.mark.skipif(not GLIBC, reason="glibc's heap thresholds: Linux with glibc only")
def test_learn_raises_the_thresholds(monkeypatch):
    from stable_baselines3.common.env_util import make_vec_env

    from covey import PPO

    monkeypatch.setattr(heap, "_raised", False)
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", 1, seed=0), n_steps=16, batch_size=16, seed=0)
    model.learn(16)
    assert heap._raised
