"""Tasks that need memory: remember a cue shown at the start and report it at the end (one agent, or
a group where every agent has its own cue)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class RememberCueEnv(gym.Env):
    """At the first step the observation shows a cue (+1 or -1); then ``delay`` blank steps follow; at the
    last step the observation says "answer now" and the action must name the cue (0 for -1, 1 for +1):
    reward +1 if right, -1 if wrong (0 on the other steps). Episodes last ``delay + 2`` steps.

    Observation: ``[cue shown now, answer now]``. A policy without memory sees the same observation at the
    answer step whatever the cue was, so its expected return is 0; a policy with memory can reach +1.

    >>> env = RememberCueEnv(delay=1)
    >>> obs, _ = env.reset(seed=0)
    >>> obs.shape
    (2,)
    """

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 3) -> None:
        self.delay = delay
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        shown = self.cue if self.t == 0 else 0.0
        answer = 1.0 if self.t == self.delay + 1 else 0.0
        return np.array([shown, answer], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action):
        if self.t == self.delay + 1:  # the answer step
            reward = 1.0 if (int(action) == 1) == (self.cue > 0) else -1.0
            return self._obs(), reward, True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}


class GroupCueEnv(ParallelEnv):
    """The multi-agent version of :class:`RememberCueEnv` (PettingZoo ParallelEnv): every agent is shown its
    own cue (+1 or -1, drawn independently) at the first step, then ``delay`` blank steps follow, and at the
    answer step each agent must name its own cue: +1 if right, -1 if wrong. Episodes last ``delay + 2``
    steps; all agents terminate after answering.

    Observation per agent: ``[own cue shown now, answer now]``. Without memory the answer-step observation
    is the same whatever the cue was (expected return 0 per agent); with one memory per agent, +1. The cues
    are independent, so an agent cannot read its cue off its groupmates either.

    >>> env = GroupCueEnv(n_agents=2)
    >>> obs, _ = env.reset(seed=0)
    >>> sorted(obs), obs["agent_0"].shape
    (['agent_0', 'agent_1'], (2,))
    """

    metadata = {"name": "group_cue_v0", "render_modes": []}

    def __init__(self, n_agents: int = 3, delay: int = 3) -> None:
        self.n_agents, self.delay = n_agents, delay
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self.render_mode = None
        self._rng = np.random.default_rng()

    @functools.cache  # noqa: B019 - one space object per agent, as PettingZoo recommends
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        answer = 1.0 if self.t == self.delay + 1 else 0.0
        return {a: np.array([self.cues[a] if self.t == 0 else 0.0, answer], np.float32) for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        self.cues = {a: float(self._rng.choice([-1.0, 1.0])) for a in self.agents}
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        done = self.t == self.delay + 1
        if done:
            rewards = {a: 1.0 if (int(actions[a]) == 1) == (self.cues[a] > 0) else -1.0 for a in self.agents}
        else:
            rewards = {a: 0.0 for a in self.agents}
            self.t += 1
        observations = self._obs()
        terminations = {a: done for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass
