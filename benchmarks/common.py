"""Pieces every benchmark script uses: the raw stepping speed of an env and the median-with-spread cell."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np
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
