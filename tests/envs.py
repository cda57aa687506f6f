"""Tiny test envs: any observation space, any action space, a reward that depends on the action."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def image_space(shape: tuple[int, ...]) -> spaces.Box:
    """A uint8 image space with pixels in [0, 255] (channels first or last, as ``shape`` says)."""
    return spaces.Box(0, 255, shape, np.uint8)


def _first(action: Any) -> float:
    """The first component of an action (a scalar for Discrete, element 0 otherwise)."""
    return float(np.asarray(action).reshape(-1)[0])


class SpaceEnv(gym.Env):
    """Random observations from ``observation_space``; episodes of ``episode_length`` steps.

    Observations are ``observation_space.sample()`` drawn from a private copy of the space that is
    seeded from ``self.np_random``, so ``reset(seed=s)`` makes the whole episode reproducible and
    copies of the env (which may share one space object) do not share a random stream.

    Reward (so that the policy gradient is not zero):

    * Discrete: 1.0 when the action is the highest value (``start + n - 1``), else 0.0.
    * MultiDiscrete: 1.0 when the first component is its highest value, else 0.0.
    * MultiBinary: 1.0 when the first bit is 1, else 0.0.
    * Box: ``-sum(|a - 0.5|)`` (best at 0.5 in every dimension).

    The last step of an episode reports ``terminated=True``, or ``truncated=True`` instead when the env
    was built with ``truncate=True`` (a time limit, which PPO bootstraps from).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        episode_length: int = 10,
        truncate: bool = False,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.episode_length = episode_length
        self.truncate = truncate
        self._sampler: spaces.Space | None = None  # seeded copy of observation_space
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)  # (re)seeds self.np_random when seed is given
        if seed is not None or self._sampler is None:
            self._sampler = copy.deepcopy(self.observation_space)
            self._sampler.seed(int(self.np_random.integers(2**31 - 1)))
        self._t = 0
        return self._sampler.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self._sampler is not None, "call reset() before step()"
        self._t += 1
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            reward = float(_first(action) == space.start + space.n - 1)
        elif isinstance(space, spaces.MultiDiscrete):
            reward = float(_first(action) == space.start.flat[0] + space.nvec.flat[0] - 1)
        elif isinstance(space, spaces.MultiBinary):
            reward = float(_first(action) == 1)
        else:  # Box
            reward = -float(np.abs(np.asarray(action, dtype=np.float64) - 0.5).sum())
        done = self._t >= self.episode_length
        terminated, truncated = (done and not self.truncate), (done and self.truncate)
        return self._sampler.sample(), reward, terminated, truncated, {}
