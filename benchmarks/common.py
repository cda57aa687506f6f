"""Pieces every benchmark script uses: the raw stepping speed of an env, the median-with-spread cell and the
CPU a run measured."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Sequence

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecEnv


def random_stepping_speed(venv: VecEnv, env_steps_per_step: int, seconds: float, seed: int = 0) -> float:
    """Env steps per second of ``venv`` stepped with random actions for ``seconds`` (``env_steps_per_step``
    counted per vector step); closes ``venv``."""
    venv.action_space.seed(seed)
    venv.reset()
    steps = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        venv.step(np.array([venv.action_space.sample() for _ in range(venv.num_envs)]))
        steps += env_steps_per_step
    venv.close()
    return steps / elapsed


def median_range(values: Sequence[float], fmt: str) -> str:
    """``median [min, max]``, or just the value when there is one."""
    median = format(statistics.median(values), fmt)
    if len(values) == 1:
        return median
    return f"{median} [{format(min(values), fmt)}, {format(max(values), fmt)}]"


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU a run measured: its model name, family and model numbers, whether it has AVX-512 and bfloat16
    products, and the vector code PyTorch chose. Matrix-multiply speed, and with it most of SAC's and POCA's
    time, differs between CPUs that ``os.cpu_count()`` and the platform string do not tell apart.

    ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when left out; elsewhere only PyTorch's choice is known).
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as file:
                cpuinfo = file.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    parts = [name]
    if "cpu family" in fields and "model" in fields:
        parts.append(f"family {fields['cpu family']} model {fields['model']}")
    if flags:
        parts.append("AVX-512: " + ("yes" if "avx512f" in flags else "no"))
        parts.append("AVX-512 BF16: " + ("yes" if "avx512_bf16" in flags else "no"))
    parts.append(f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}")
    return ", ".join(parts)
