"""A task that needs memory: remember a cue shown at the start and report it at the end."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


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
