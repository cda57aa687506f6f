"""One side of a PettingZoo env of opposing sides as an env of its own, for POCA, which trains every listed agent
as one cooperative group: :func:`one_side` lists one team's agents and acts for the others itself."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from pettingzoo.utils.wrappers import BaseParallelWrapper


class OneSideEnv(BaseParallelWrapper):
    """A PettingZoo parallel env that lists only ``team``'s agents; the env's other agents act by ``others``. An AEC
    env is taken in its parallel form (PettingZoo's ``aec_to_parallel``), as POCA takes one.

    ``others`` is None (uniformly random actions, drawn from a generator that ``reset(seed=...)`` seeds), a
    model with SB3's ``predict`` that takes ``{agent: observation}`` (a trained POCA model of the other side,
    acting deterministically unless ``deterministic=False``), or a function of ``{agent: observation}`` giving
    ``{agent: action}``. Observations, rewards, terminations, truncations and infos are the team's; the others'
    are kept for their next action.

    >>> from mpe2 import simple_tag_v3
    >>> env = one_side(simple_tag_v3.parallel_env(num_good=1, num_adversaries=3), "adversary")
    >>> env.possible_agents
    ['adversary_0', 'adversary_1', 'adversary_2']
    >>> sorted(env.reset(seed=0)[0])
    ['adversary_0', 'adversary_1', 'adversary_2']
    """

    def __init__(self, env: Any, team: str | Iterable[Any], others: Any = None, deterministic: bool = True) -> None:
        from covey.wrappers.group_env import as_parallel

        env = as_parallel(env)  # an AEC env (simple_tag_v3.env()) as its parallel form, as POCA takes it
        super().__init__(env)
        every = list(env.possible_agents)
        if isinstance(team, str) and team in every:  # one agent's id: that agent, not those it prefixes
            chosen, how = [team], ""
        elif isinstance(team, str):
            chosen = [agent for agent in every if str(agent).startswith(team)]
            how = f"whose ids start with {team!r}"
        else:
            listed = list(team)
            unknown = [agent for agent in listed if agent not in every]
            if unknown:
                raise ValueError(f"one_side: {unknown} are not agents of the env; its possible_agents are {every}.")
            chosen = [agent for agent in every if agent in listed]
            how = f"among {listed}"
        if not chosen:
            raise ValueError(
                f"one_side: the env has no agents {how}; its possible_agents are {every}. Pass the team's ids, or "
                "the prefix they share (e.g. 'adversary')."
            )
        if len(chosen) == len(every):
            raise ValueError(
                f"one_side: the team {chosen} is every agent of the env, which leaves no other side to act for."
            )
        if others is not None and not (hasattr(others, "predict") or callable(others)):
            raise ValueError(
                f"one_side: others={others!r} is invalid: pass None (random actions), a model with predict (e.g. a "
                "trained POCA model of the other side), or a function of {agent: observation} -> {agent: action}."
            )
        self.possible_agents = chosen
        self.team = frozenset(chosen)
        self.others = others
        self.deterministic = deterministic
        self._spaces = {a: copy.deepcopy(env.action_space(a)) for a in every if a not in self.team}
        self._others_obs: dict[Any, Any] = {}

    @property
    def agents(self) -> list[Any]:
        return [agent for agent in self.env.agents if agent in self.team]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        observations, infos = self.env.reset(seed=seed, options=options)
        if seed is not None:
            for i, space in enumerate(self._spaces.values()):
                space.seed(seed + 1 + i)
        self._others_obs = self._theirs(observations)
        return self._ours(observations), self._ours(infos)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        stray = [agent for agent in actions if agent not in self.team]
        if stray:
            raise ValueError(f"one_side: actions for {stray}, which are not the team's agents {sorted(self.team)}.")
        observations, rewards, terminations, truncations, infos = self.env.step({**actions, **self._act_others()})
        self._others_obs = self._theirs(observations)
        return tuple(self._ours(d) for d in (observations, rewards, terminations, truncations, infos))

    def _act_others(self) -> dict:
        present = {agent: obs for agent, obs in self._others_obs.items() if agent in self.env.agents}
        if not present:
            return {}
        if self.others is None:
            return {agent: self._spaces[agent].sample() for agent in present}
        if hasattr(self.others, "predict"):
            return dict(self.others.predict(present, deterministic=self.deterministic)[0])
        return dict(self.others(present))

    def _ours(self, by_agent: dict) -> dict:
        return {agent: value for agent, value in by_agent.items() if agent in self.team}

    def _theirs(self, by_agent: dict) -> dict:
        return {agent: value for agent, value in by_agent.items() if agent not in self.team}


def one_side(env: Any, team: str | Iterable[Any], others: Any = None, deterministic: bool = True) -> OneSideEnv:
    """``env`` (a PettingZoo parallel or AEC env of opposing sides, such as mpe2's simple_tag) as one side's env:
    ``team`` (agent ids, one agent's id, or the prefix they share, e.g. ``"adversary"``) is what POCA trains as a
    group, and the other agents act by ``others`` (None: at random; a model with ``predict``; a function): see
    :class:`OneSideEnv`."""
    return OneSideEnv(env, team, others, deterministic)
