"""Tiny test envs (any observation space, any action space, a reward that depends on the action), and a
features extractor whose output depends on the training mode."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

from covey.envs import EarlyExitEnv


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


class DictTeam(ParallelEnv):
    """EarlyExitEnv whose agents observe a Dict: ``{"obs": the original vector}`` plus, with ``slot=True``, the
    agent's index (Discrete) and, with ``view=True``, a 36x36 uint8 image filled with its first feature."""

    metadata = {"name": "dict_team_v0", "render_modes": []}

    def __init__(self, slot: bool = True, view: bool = False) -> None:
        self.env = EarlyExitEnv()
        self.possible_agents = self.env.possible_agents
        keys = {"obs": self.env.observation_space(self.possible_agents[0])}
        if slot:
            keys["slot"] = spaces.Discrete(len(self.possible_agents), start=1)
        if view:
            keys["view"] = spaces.Box(0, 255, (36, 36, 1), np.uint8)
        self.space = spaces.Dict(keys)

    def observation_space(self, agent):
        return self.space

    def action_space(self, agent):
        return self.env.action_space(agent)

    @property
    def agents(self):
        return self.env.agents

    def _dicts(self, observations):
        out = {}
        for agent, obs in observations.items():
            out[agent] = {"obs": obs}
            if "slot" in self.space.spaces:
                out[agent]["slot"] = self.possible_agents.index(agent) + 1
            if "view" in self.space.spaces:
                out[agent]["view"] = np.full((36, 36, 1), int(255 * obs[0]), np.uint8)
        return out

    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._dicts(observations), infos

    def step(self, actions):
        observations, *rest = self.env.step(actions)
        return (self._dicts(observations), *rest)


def needs_onnx_exporter():
    """pytest's mark that skips a test where covey's export refuses the torch in use as too old (its reason is the
    refusal: tests/test_requirements.py checks it)."""
    import pytest

    from covey.export import _check_torch_for_export

    try:
        _check_torch_for_export()
    except ImportError as refusal:
        return pytest.mark.skip(reason=str(refusal))
    return pytest.mark.skipif(False, reason="torch's ONNX exporter is new enough")


class NormExtractor(BaseFeaturesExtractor):
    """A user-written extractor with batch norm and dropout, which record the training mode of each call."""

    def __init__(self, observation_space: spaces.Box) -> None:
        super().__init__(observation_space, 16)
        n = int(np.prod(observation_space.shape))
        self.net = torch.nn.Sequential(torch.nn.Linear(n, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.5))
        self.calls: list[tuple[int, bool]] = []  # (rows, training) per forward

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        self.calls.append((observations.shape[0], self.training))
        return self.net(observations)


def zoo_schedule(rule):
    """A class as RL-Zoo's ``rl_zoo3.utils.SimpleLinearSchedule`` is named (RL-Zoo is not a test dependency),
    whose call is ``rule(progress_remaining, initial_value)``."""

    class SimpleLinearSchedule:
        def __init__(self, initial_value):
            self.initial_value = float(initial_value)

        def __call__(self, progress_remaining):
            return rule(progress_remaining, self.initial_value)

        def __repr__(self):  # RL-Zoo's, which SB3 writes beside the pickle of a FloatSchedule holding one
            return f"SimpleLinearSchedule(initial_value={self.initial_value})"

    SimpleLinearSchedule.__module__ = "rl_zoo3.utils"
    SimpleLinearSchedule.__qualname__ = "SimpleLinearSchedule"
    return SimpleLinearSchedule
