"""A cooperative PettingZoo env where credit for leaving early decides everything.

Three agents wait in a room with a switch. An agent that presses the switch leaves the episode at once:
it is terminated, pays a small cost for pressing and gets nothing more. From the next step on, every
agent still in the room receives the group's reward each step: the number of agents still in the room.
The best the team can do is to let exactly one agent leave at the first step. The leaver's own reward is
negative, so only a learner that credits it with what the group it leaves behind earns (MA-POCA's
posthumous credit) finds that. Learners that end a leaver's trajectory with a value of zero (or keep it
as a zero-filled "dead" agent) learn that nobody should press.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class EarlyExitEnv(ParallelEnv):
    """PettingZoo ParallelEnv: ``n_agents`` agents, ``episode_length`` steps (truncated at the end).

    Observation (float32): one-hot agent index, whether the switch was pressed, time left (1 -> 0).
    Actions: 0 wait, 1 press the switch (and leave, paying ``press_cost``). Best group return:
    ``(n - 1) ** 2 * (episode_length - 1) - press_cost``: 27.5 for the defaults.

    >>> env = EarlyExitEnv()
    >>> obs, _ = env.reset(seed=0)
    >>> sorted(obs)
    ['agent_0', 'agent_1', 'agent_2']
    """

    metadata = {"name": "early_exit_v0", "render_modes": []}

    def __init__(self, n_agents: int = 3, episode_length: int = 8, press_cost: float = 0.5) -> None:
        self.n_agents, self.episode_length, self.press_cost = n_agents, episode_length, press_cost
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self.render_mode = None

    @functools.cache  # noqa: B019 - one space object per agent, as PettingZoo recommends
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (self.n_agents + 2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    @property
    def best_group_return(self) -> float:
        return float((self.n_agents - 1) ** 2 * (self.episode_length - 1)) - self.press_cost

    def _obs(self, agent: str) -> np.ndarray:
        obs = np.zeros(self.n_agents + 2, np.float32)
        obs[self.possible_agents.index(agent)] = 1.0
        obs[-2] = float(self.pressed)
        obs[-1] = 1.0 - self.t / self.episode_length
        return obs

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        self.t = 0
        self.pressed = False
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict):
        was_open = self.pressed
        pressers = [a for a in self.agents if int(actions[a]) == 1]
        self.t += 1
        # The switch pays the agents that stay from the step after it opens: each gets the group's size.
        pay = float(len(self.agents)) if was_open else 0.0
        rewards = {a: (-self.press_cost if a in pressers else pay) for a in self.agents}
        self.pressed = self.pressed or bool(pressers)
        time_up = self.t >= self.episode_length
        terminations = {a: a in pressers for a in self.agents}
        truncations = {a: time_up and a not in pressers for a in self.agents}
        observations = {a: self._obs(a) for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass
