"""Scoring a trained group: the multi-agent counterpart of SB3's ``evaluate_policy``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from covey.wrappers.group_env import (
    LiveAgents,
    _reward_number,
    check_group_spaces,
    check_possible_agents,
    make_one_env,
)


def evaluate_group(
    model: Any | None,
    make_env: Callable[[], Any] | Any,
    n_eval_episodes: int = 10,
    deterministic: bool = True,
    seed: int = 0,
) -> dict[str, float]:
    """Play ``n_eval_episodes`` episodes of a PettingZoo env with ``model.predict`` on a dict of agent
    observations (or uniformly random actions when ``model`` is None). ``make_env`` is a function returning the
    env (closed at the end) or an env instance (left open).

    ``model.predict`` has SB3's signature, ``predict(observation, state, episode_start, deterministic)``
    (as SB3's ``evaluate_policy`` calls it): the state it returns is passed back at the next step, a fresh
    one (None) starts each episode, and ``episode_start`` is ``{agent: True}`` for agents acting for the
    first time in the episode, so a recurrent policy carries its memory.

    Returns the mean and standard deviation of the group return (sum over agents) and the mean per-agent
    return (group return / agents that took part), and the mean episode length.

    >>> from covey.envs import EarlyExitEnv
    >>> sorted(evaluate_group(None, EarlyExitEnv, n_eval_episodes=2))
    ['agent_return', 'episode_length', 'group_return', 'group_return_std']
    """
    env, owned = make_one_env(make_env)
    try:
        group, per_agent, lengths = group_episodes(model, env, n_eval_episodes, deterministic, seed)
    finally:
        if owned:
            env.close()
    return {
        "group_return": np.mean(group),
        "group_return_std": np.std(group),
        "agent_return": np.mean(per_agent),
        "episode_length": np.mean(lengths),
    }


def group_episodes(
    model: Any | None,
    env: Any,
    n_episodes: int,
    deterministic: bool = True,
    seed: int = 0,
    on_step: Callable[[Any], bool] | None = None,
) -> tuple[list[float], list[float], list[int]]:
    """The episodes :func:`evaluate_group` plays on a ParallelEnv ``env``, episode ``i`` reset with seed
    ``seed + i``: per episode the group return, the per-agent return and the length. ``on_step(env)``, if
    given, is called after each reset and each step; returning False ends the episode there."""
    if model is not None and hasattr(model, "_check_spaces"):  # a covey model: the env it was trained on
        model._check_spaces(*check_group_spaces(env))
    try:
        return _play(model, env, n_episodes, deterministic, seed, on_step)
    finally:
        # The env a model trains on, evaluated here (SB3's habit with one env object): training's next step on
        # it starts a new episode, where it would step the episode this left behind as if it were its own.
        training = getattr(model, "env", None)
        if hasattr(training, "played_elsewhere"):
            training.played_elsewhere(env)


def _play(
    model: Any | None,
    env: Any,
    n_episodes: int,
    deterministic: bool,
    seed: int,
    on_step: Callable[[Any], bool] | None,
) -> tuple[list[float], list[float], list[int]]:
    group, per_agent, lengths = [], [], []
    agent_ids = list(env.possible_agents)
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=seed + episode)
        check_possible_agents(env, agent_ids)
        for i, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(seed + 1000 * episode + i)
        agents, live = list(env.agents), LiveAgents()
        seen, total, length = set(agents), 0.0, 0
        state, previous = None, set()  # a recurrent model's memories; agents that acted last step
        going = on_step is None or on_step(env)
        while agents and going:
            if model is None:
                actions = {a: env.action_space(a).sample() for a in agents}
            else:
                starts = {a: a not in previous for a in agents}  # new episode or a newly joined agent
                actions, state = model.predict(
                    {a: obs[a] for a in agents}, state=state, episode_start=starts, deterministic=deterministic
                )
            previous = set(agents)
            obs, rewards, terminations, truncations, _ = env.step(actions)
            total += _reward_sum(rewards)
            agents = live.after_step(env.agents, terminations, truncations)  # done agents are gone, listed or not
            seen |= set(agents)
            length += 1
            going = on_step is None or on_step(env)
        group.append(total)
        per_agent.append(total / max(len(seen), 1))
        lengths.append(length)
    return group, per_agent, lengths


def _reward_sum(rewards: dict) -> float:
    """The step's rewards summed over agents (an error that names the first reward that is no number)."""
    return float(sum(_reward_number(agent, reward) for agent, reward in rewards.items()))
