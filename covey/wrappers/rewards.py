"""The rewards a PettingZoo env itself pays, under wrappers that change them (SuperSuit's clip_reward_v0): what
``covey train``'s evaluations of a team score, as a Gymnasium env's Monitor gives PPO's and SAC's."""

from __future__ import annotations

from typing import Any

from pettingzoo.utils.wrappers import BaseParallelWrapper

from covey.wrappers.group_env import _reward_number


class RewardTap(BaseParallelWrapper):
    """Adds up the rewards the env under it pays, per agent, until :meth:`take` (a wrapper above it may step it
    several times for one step of its own, as SuperSuit's frame_skip does)."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.paid: dict[Any, float] = {}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.paid = {}
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        out = self.env.step(actions)
        for agent, reward in out[1].items():
            self.paid[agent] = self.paid.get(agent, 0.0) + _reward_number(agent, reward)
        return out

    def take(self) -> dict[Any, float]:
        paid, self.paid = self.paid, {}
        return paid


class OwnRewards(BaseParallelWrapper):
    """The wrapped env, with each step's rewards replaced by those its :class:`RewardTap` saw the env pay to the
    same agents: what the run's evaluations score, so a reward wrapper (clip_reward_v0) changes what trains, not
    the scores. Agents a wrapper leaves out (the other side, under ``one_side``) stay out; one it adds that the
    env paid nothing (a dead agent kept by black_death) gets 0."""

    def __init__(self, env: Any, tap: RewardTap) -> None:
        super().__init__(env)
        self.tap = tap

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        paid = self.tap.take()
        return observations, {agent: paid.get(agent, 0.0) for agent in rewards}, terminations, truncations, infos
