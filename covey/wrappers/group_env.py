"""A vector of PettingZoo parallel envs seen as one group of agent slots: arrays ``(n_envs, n_slots, ...)``.

Every possible agent owns a slot. A boolean presence mask says which slots hold a live agent; absent
slots (dead, not yet spawned) hold zeros and are masked, never treated as absorbing states. An env copy is
reset as soon as all its agents are gone.
"""

from __future__ import annotations

import copy
import itertools
import re
import signal
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import tile_images

from covey.networks.encoders import FlatDict
from covey.networks.obs import discrete_range_problem
from covey.spaces import check_action_space, check_observation_space
from covey.warning import warn_user
from covey.wrappers.vec_env import not_a_scalar, own_info, returned, shape_words

PETTINGZOO_API = (
    "covey's POCA steps PettingZoo parallel envs (the API of PettingZoo 1.22 and newer): reset(seed=None, "
    "options=None) returns (observations, infos) and step(actions) returns (observations, rewards, terminations, "
    "truncations, infos), each a dict keyed by agent, with observations of env.observation_space(agent). "
    "pettingzoo.test.parallel_api_test(env) checks an env against it."
)


def _api_error(call: str, problem: str) -> ValueError:
    return ValueError(f"The env's {call} {problem}. {PETTINGZOO_API}")


def check_possible_agents(env: Any, agent_ids: list[Any]) -> None:
    """After a reset: ``env.possible_agents`` is still ``agent_ids``, its list when it was made (PettingZoo's
    possible_agents never change); else an error, which names the usual cause where it is the cause."""
    now = env.possible_agents
    if list(now) == agent_ids:
        return
    if env.agents is now:
        cause = (
            "self.agents is the same list as self.possible_agents (self.agents = self.possible_agents in reset), "
            "so the agents taken out of self.agents were taken out of possible_agents too. Give reset() a copy: "
            "self.agents = self.possible_agents[:]"
        )
    else:
        cause = "possible_agents lists every agent that may ever act, fixed when the env is made"
    raise _api_error("reset()", f"left possible_agents {list(now)}, where the env was made with {agent_ids}: {cause}")


class GroupStep(NamedTuple):
    """What one step of every env copy returns (arrays ``(n_envs, n_slots, ...)`` unless said)."""

    observations: np.ndarray
    """Observations after the step (after auto-reset for finished copies)."""
    mask: np.ndarray
    """Which slots hold a live agent after the step."""
    rewards: np.ndarray
    """Rewards of the agents that acted (0 elsewhere)."""
    terminated: np.ndarray
    truncated: np.ndarray
    """Truncated and not terminated (an agent the env reports both ways has terminated, as in Gymnasium)."""
    left: np.ndarray
    """Agents that acted and are gone after the step: their trajectory ends here."""
    final_observations: np.ndarray
    """The last observation of every agent that left (zeros elsewhere)."""
    env_done: np.ndarray
    """``(n_envs,)``: the copy's episode ended (all agents gone) and the copy was reset."""
    infos: list[dict[str, Any]]
    """Per copy: ``{"agents": the infos dict its step returned, keyed by agent}``, and at an episode's end
    ``"episode": {"r": group return, "l": length, "r_agent": mean per-agent return}``."""


def is_parallel_env(env: Any) -> bool:
    """An env instance (a class, even one with class-level ``possible_agents``, is a way to make one)."""
    return not isinstance(env, type) and all(hasattr(env, k) for k in ("possible_agents", "step", "reset"))


def is_aec_env(env: Any) -> bool:
    """An AEC env instance, told by its class: PettingZoo's parallel wrappers pass attribute reads through to the
    env they wrap, so a parallel wrapper around an AEC env has the AEC env's ``agent_iter`` too."""
    return not isinstance(env, type) and hasattr(type(env), "agent_iter")


def as_parallel(env: Any) -> Any:
    """A PettingZoo ParallelEnv as it is; an AEC env converted to parallel."""
    if is_aec_env(env):
        from pettingzoo.utils.conversions import aec_to_parallel

        metadata = getattr(env, "metadata", {})
        if not metadata.get("is_parallelizable", False):
            # PettingZoo's converter refuses these with an assertion about its own wrapper; say what it means here
            name = metadata.get("name") or type(env).__name__
            raise ValueError(
                f"POCA steps all agents of a group at once (a PettingZoo parallel env), but {name!r} is an AEC env "
                "that does not declare metadata['is_parallelizable'] = True: its agents take turns (a board game "
                "such as tic-tac-toe), so it has no parallel form. Pass the package's parallel_env where it has one; "
                "an env of your own whose agents do act together each cycle can set that metadata key."
            )
        return aec_to_parallel(env)
    if isinstance(env, str):
        raise TypeError(
            f"POCA takes a PettingZoo env, or a function returning one, not a name ({env!r}): pass e.g. "
            "simple_spread_v3.parallel_env or lambda: simple_spread_v3.parallel_env(N=3). (A config file's "
            "module:name form is for `covey train`.)"
        )
    if not is_parallel_env(env) and hasattr(env, "num_envs"):  # an SB3 or Gymnasium vector env
        raise TypeError(
            f"POCA takes the PettingZoo env itself, or a function returning one, not a vector env "
            f"({type(env).__name__}): it keeps each agent's id to group them, which SuperSuit's "
            "pettingzoo_env_to_vec_env_v1 / concat_vec_envs_v1 drop. Pass the env function and the number of "
            "copies, e.g. POCA('MlpPolicy', lambda: simple_spread_v3.parallel_env(), n_envs=8)."
        )
    if not is_parallel_env(env):
        raise TypeError(
            f"Expected a PettingZoo ParallelEnv (or AEC env), or a function returning one; got {type(env).__name__}"
            f"{_not_parallel_because(env)}"
        )
    return env


def _not_parallel_because(env: Any) -> str:
    """What ``env``, which is no ParallelEnv, is instead and what to pass: the end of :func:`as_parallel`'s error."""
    if isinstance(env, types.ModuleType):
        name = env.__name__.rsplit(".", 1)[-1]
        return f" (the module {env.__name__}): pass its env function, e.g. {name}.parallel_env, or an env it made."
    if isinstance(env, gym.Env) or isinstance(getattr(env, "observation_space", None), spaces.Space):
        return (
            ", a Gymnasium env: POCA trains the agents of a PettingZoo env as a team; a Gymnasium env's one agent "
            "trains with covey's PPO or SAC."
        )
    if all(hasattr(env, k) for k in ("step", "reset")):
        return (
            ", which has step() and reset() but no possible_agents after it was made: a PettingZoo ParallelEnv lists "
            "every agent that may ever act in self.possible_agents, set in __init__ (before reset)."
        )
    return "."


class MixedSpacesError(ValueError):
    """Agents of one group with different observation or action spaces; ``wrappers`` names the SuperSuit wrappers
    that make them equal, ``side`` the team :func:`covey.wrappers.one_side` would train instead."""

    def __init__(self, message: str, wrappers: list[str], side: str | None, problems: str = "") -> None:
        super().__init__(message)
        self.problems = problems  # which spaces differ, in words
        self.wrappers = wrappers
        self.side = side  # the team one_side would take in the message's example (None: the env is one side)


SAME_AGENTS = "All env copies must have the same possible_agents, in the same order"


def check_group_spaces(env: Any) -> tuple[spaces.Space, spaces.Space]:
    """The single observation and action space shared by all agents of ``env``, or a clear error."""
    agents = list(env.possible_agents)
    if not agents:
        raise ValueError("The env has no possible_agents: a group needs at least one agent.")
    obs_spaces = {a: env.observation_space(a) for a in agents}
    act_spaces = {a: env.action_space(a) for a in agents}
    problems, fixes, padded, unpadded = [], [], [], []
    for kind, by_agent, fix in (
        ("observation", obs_spaces, "pad_observations_v0"),
        ("action", act_spaces, "pad_action_space_v0"),
    ):
        first = by_agent[agents[0]]
        odd = [a for a in agents if by_agent[a] != first]
        if odd:
            problems.append(
                f"one {kind} space, but {agents[0]!r} has {first} and "
                + ", ".join(f"{a!r} has {by_agent[a]}" for a in odd)
            )
            why_not = _padding_problem(kind, fix, [first, *(by_agent[a] for a in odd)])
            if why_not is None:
                fixes.append(fix)
                padded.append(f"make their {kind} spaces equal with SuperSuit's {fix}(env)")
            else:
                unpadded.append(f"make their {kind} spaces equal in a wrapper of your own ({why_not})")
    if problems:
        sides = _name_groups(agents)
        # the largest side (the first of equals) as the example: a team of one is seldom the side to train
        example = max(sides, key=sides.__getitem__) if len(sides) > 1 else str(agents[0])
        named = ", ".join(f"{prefix!r} ({n})" for prefix, n in sides.items()) if len(sides) > 1 else ""
        pad = (
            ", and ".join(padded + unpadded)
            if unpadded
            else f"make their spaces equal, e.g. with SuperSuit's {' and '.join(f + '(env)' for f in fixes)}"
        )
        from covey.wrappers.one_side import OneSideEnv

        one_side = any(isinstance(inner, OneSideEnv) for inner in _wrapped(env))
        if one_side:
            around = "" if unpadded else " around one_side's env (pad_action_space_v0(one_side(env, team)), say)"
            advice = (
                f"The env is one side already (covey.wrappers.one_side): its team's agents differ, so {pad}{around}, "
                "or pass one_side a team whose agents share their spaces."
            )
        else:
            advice = (
                f"If they are one team, {pad}. If they are opposing sides"
                f"{f' (by their ids: {named})' if named else ''}, train one side: covey.wrappers.one_side(env, "
                f"{example!r}) lists that side's agents and acts for the others (at random, or by a model of theirs "
                "you pass as others=); its team may also be a list of agent ids."
            )
        raise MixedSpacesError(
            "Agents of one group must share "
            + "; and ".join(problems)
            + ". POCA trains all of the env's agents as one cooperative group with one shared policy. "
            + advice,
            fixes,
            None if one_side else example,
            "; and ".join(problems),
        )
    check_observation_space(obs_spaces[agents[0]])
    check_action_space(act_spaces[agents[0]])
    return obs_spaces[agents[0]], act_spaces[agents[0]]


def _padding_problem(kind: str, fix: str, differing: list[spaces.Space]) -> str | None:
    """Why SuperSuit's ``fix`` cannot make the ``differing`` spaces one that keeps each agent to its own, or None:
    it pads Box and Discrete spaces of one class only, widens Box bounds to the widest (an agent would be sent
    actions outside its own) and gives a Discrete no start."""
    classes = {type(space) for space in differing}
    if not classes <= {spaces.Box, spaces.Discrete}:
        return f"SuperSuit's {fix} pads Box and Discrete spaces only"
    if len(classes) > 1:
        return f"SuperSuit's {fix} cannot make a Box and a Discrete one space"
    if isinstance(differing[0], spaces.Discrete):
        if kind == "observation":  # SuperSuit 3.11's pad_observations_v0 returns the space as the observation
            return f"SuperSuit's {fix} gives a Discrete observation's space in place of the observation"
        if any(space.start != 0 for space in differing):
            return f"SuperSuit's {fix} makes a Discrete from 0, and these start elsewhere"
        return None
    if len({space.dtype for space in differing}) > 1 or len({len(space.shape) for space in differing}) > 1:
        return f"SuperSuit's {fix} pads Boxes of one dtype and one number of dimensions only"
    if kind == "action":
        low, high = _padded_bounds(differing)
        for space in differing:
            own = tuple(slice(0, n) for n in space.shape)
            if not (np.array_equal(low[own], space.low) and np.array_equal(high[own], space.high)):
                return (
                    f"SuperSuit's {fix} widens the bounds to the widest agent's, so an agent would be sent actions "
                    "outside its own: scale every agent's actions to one set of bounds"
                )
    return None


def _padded_bounds(boxes: list[spaces.Box]) -> tuple[np.ndarray, np.ndarray]:
    """The bounds of the one Box SuperSuit's padding makes of ``boxes`` (of one number of dimensions): each padded
    to the largest shape, its low with min(0, its lowest), its high with max(1e-5, its highest), and the widest
    of them taken."""
    shape = tuple(np.max([box.shape for box in boxes], axis=0))

    def padded(bound: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(bound, [(0, n - m) for n, m in zip(shape, bound.shape)], constant_values=fill)

    low = np.min([padded(box.low, min(0.0, float(box.low.min()))) for box in boxes], axis=0)
    high = np.max([padded(box.high, max(1e-5, float(box.high.max()))) for box in boxes], axis=0)
    return low, high


def _name_groups(agents: list[Any]) -> dict[str, int]:
    """How many agents share each id prefix (the id without a trailing ``_<number>``: mpe2's ``adversary_0``,
    ``agent_0``), in the agents' order."""
    groups: dict[str, int] = {}
    for agent in agents:
        prefix = re.sub(r"_\d+$", "", str(agent))
        groups[prefix] = groups.get(prefix, 0) + 1
    return groups


def warn_of_black_death(env: Any) -> None:
    """Warn where SuperSuit's ``black_death`` wrapper is among ``env``'s wrappers: it keeps agents that died in the
    env, which hides their leaving from POCA."""
    seen: set[int] = set()
    while env is not None and id(env) not in seen:
        seen.add(id(env))
        if type(env).__module__.startswith("supersuit") and type(env).__name__.startswith("black_death"):
            warn_user(
                "The env is wrapped in SuperSuit's black_death_v3, which keeps agents that died in the env with "
                "zero observations and rewards: POCA takes them as present, acts for them and trains on their "
                "zeros, so its masking of agents that left and their posthumous credit no longer apply. POCA "
                "handles agents that leave mid-episode itself: leave black_death_v3 out."
            )
            return
        # the env a PettingZoo or SuperSuit wrapper holds (aec_env: inside PettingZoo's AEC-to-parallel converter)
        env = next((getattr(env, name) for name in ("env", "aec_env") if getattr(env, name, None) is not None), None)


def storage_space(space: spaces.Space) -> spaces.Space:
    """The space of one agent slot's stored observation: a Dict space's flat vector (:class:`FlatDict`), otherwise
    the space itself."""
    return FlatDict(space).flat_space if isinstance(space, spaces.Dict) else space


def _storage_dtype(space: spaces.Space) -> np.dtype:
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return np.dtype(np.float32)
    return np.dtype(space.dtype)


class GroupVecEnv:
    """``n_envs`` copies of a PettingZoo parallel env, stepped in this process.

    >>> from covey.envs import EarlyExitEnv
    >>> venv = GroupVecEnv([EarlyExitEnv, EarlyExitEnv])
    >>> obs, mask = venv.reset(seed=0)
    >>> obs.shape[:2], bool(mask.all())
    ((2, 3), True)
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        if not env_fns:
            raise ValueError("GroupVecEnv needs at least one env function.")
        self.envs = [as_parallel(fn()) for fn in env_fns]
        if len({id(env) for env in self.envs}) < len(self.envs):
            raise ValueError(
                "Some env functions returned the same env object, which would then be stepped as several copies "
                "at once: each function must make a new env (e.g. lambda: simple_spread_v3.parallel_env(), not "
                "lambda: env)."
            )
        first = self.envs[0]
        self.observation_space, self.action_space = check_group_spaces(first)
        self.render_mode = getattr(first, "render_mode", None)  # SB3's VecEnv attribute, from the first env
        warn_of_black_death(first)
        self.agent_ids: list[str] = list(first.possible_agents)
        for env in self.envs[1:]:
            if list(env.possible_agents) != self.agent_ids:
                raise ValueError(f"{SAME_AGENTS}: {self.agent_ids} and {list(env.possible_agents)}.")
        self.slot = {agent: i for i, agent in enumerate(self.agent_ids)}
        self.n_envs, self.n_slots = len(self.envs), len(self.agent_ids)
        # Dict observations are stored flat, one float32 vector per slot (the networks unflatten them)
        self.flat_dict = FlatDict(self.observation_space) if isinstance(self.observation_space, spaces.Dict) else None
        self._discrete = _has_discrete(self.observation_space)  # observations one-hot encoded: checked for range
        self._warned_unused_rewards = self._warned_missing_reward = self._warned_info_mask = False  # each once
        self._live = [LiveAgents() for _ in self.envs]
        stored = self.observation_space if self.flat_dict is None else self.flat_dict.flat_space
        self.obs_shape, self.obs_dtype = tuple(stored.shape), _storage_dtype(stored)
        lead = (self.n_envs, self.n_slots)
        self._obs = np.zeros((*lead, *self.obs_shape), dtype=self.obs_dtype)
        self._mask = np.zeros(lead, dtype=bool)
        self._ep_return = np.zeros(lead)
        self._ep_other_return = np.zeros(self.n_envs)  # rewards the env paid under keys that are not agents
        self._ep_seen = np.zeros(lead, dtype=bool)
        self._ep_length = np.zeros(self.n_envs, dtype=np.int64)
        # Copies whose last reset or step was cut short (an exception or an interrupt inside it), so that their
        # observations and mask may not be the env's: the next step ends the episode the caller saw, and resets.
        self._unsettled = np.zeros(self.n_envs, dtype=bool)
        self._given: tuple[np.ndarray, np.ndarray] | None = None  # the observations and mask last returned
        self._t0 = time.time()
        self._seed: int | None = None

    @property
    def num_envs(self) -> int:
        """SB3's name for the number of env copies (callbacks read it)."""
        return self.n_envs

    # ------------------------------------------------------------------ reset and step
    def seed(self, seed: int | None = None) -> None:
        """Seeds for the next reset: copy ``i`` gets ``seed + i``."""
        self._seed = seed

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Reset every copy; returns ``(observations, mask)``."""
        seed = self._seed if seed is None else seed
        self._seed = None
        try:
            for e in range(self.n_envs):
                self._reset_env(e, None if seed is None else seed + e)
        except BaseException:  # the copies reset before it hold episodes the caller never saw: each is unsettled
            self._unsettled[: e + 1] = True
            raise
        self._given = (self._obs.copy(), self._mask.copy())
        return self._given

    def _reset_env(self, e: int, seed: int | None) -> None:
        self._unsettled[e] = True
        try:
            out = self.envs[e].reset(seed=seed)
        except TypeError as exc:
            if "seed" in str(exc):
                raise _api_error("reset()", f"takes no seed argument ({exc})") from exc
            raise
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict)):
            raise _api_error("reset()", f"returned {returned(out)}, not (observations, infos)")
        observations = out[0]
        check_possible_agents(self.envs[e], self.agent_ids)
        if not self.envs[e].agents:
            raise ValueError(
                "The env has no agents after reset(): a group needs at least one live agent to act. "
                "Check the env's reset (and its wrappers)."
            )
        self._obs[e] = 0
        self._mask[e] = False
        self._live[e].reset()
        self._put_all(e, self.envs[e].agents, observations, "reset()")
        self._ep_return[e] = 0.0
        self._ep_other_return[e] = 0.0
        self._ep_seen[e] = self._mask[e]
        self._ep_length[e] = 0
        self._unsettled[e] = False

    def _put(self, e: int, agent: str, obs: Any) -> None:
        s = self.slot.get(agent)
        if s is None:
            raise _api_error(
                "reset() or step()",
                f"lists agent {agent!r}, which is not one of possible_agents {self.agent_ids}. Every agent that "
                "may act must be in possible_agents",
            )
        if isinstance(obs, dict) and self.flat_dict is None:
            raise _api_error(
                "reset() or step()",
                f"gave agent {agent!r} a dict observation (keys {list(obs)}), but observation_space({agent!r}) = "
                f"{self.observation_space} is no spaces.Dict: declare it as a gymnasium.spaces.Dict of those keys "
                "(e.g. the observation and an action mask), or return the observation alone",
            )
        self._fit(obs, agent, self._obs, (e, s))
        self._mask[e, s] = True

    def _put_all(self, e: int, agents: Sequence[str], observations: dict, call: str) -> None:
        try:
            for agent in agents:
                self._put(e, agent, observations[agent])
        except KeyError as exc:
            missing = [a for a in agents if a not in observations]
            if not missing:
                raise
            raise _api_error(
                call,
                f"gave no observation for {', '.join(map(repr, missing))}, which env.agents lists as live "
                f"(observations for {list(observations)}). Every agent in env.agents needs one",
            ) from exc

    def _fit(self, obs: Any, agent: str, into: np.ndarray, index: tuple[int, int], final: bool = False) -> None:
        """Store ``agent``'s observation at ``into[index]`` as a slot holds it (a Dict's flattened); an error that
        names the agent where it does not fit the observation space (``final``: the last observation of an agent
        that left)."""
        try:
            stored = obs if self.flat_dict is None else self.flat_dict.flatten(obs, repr(agent))
            if np.shape(stored) != self._obs.shape[2:]:  # NumPy would broadcast a (1,) observation, silently
                raise ValueError(f"shape {np.shape(stored)}, not {self._obs.shape[2:]}")
            if self._discrete:  # a one-hot encoding would read a value outside the space as the nearest one
                problem = discrete_range_problem(obs, self.observation_space)
                if problem is not None:
                    raise ValueError(problem)
            into[index] = stored  # NumPy's error for what is no number, named below
        except ValueError as exc:
            shape = "" if self.flat_dict is not None else f" of shape {np.shape(obs)}"
            which = "a final observation (in the step that ended it)" if final else "an observation"
            raise _api_error(
                "step()" if final else "reset() or step()",
                f"gave agent {agent!r} {which}{shape} that does not fit "
                f"observation_space({agent!r}) = {self.observation_space} ({exc})",
            ) from exc

    def step(self, actions: np.ndarray) -> GroupStep:
        """Step every copy with ``actions`` ``(n_envs, n_slots, ...)`` (entries of absent slots are ignored)."""
        lead = (self.n_envs, self.n_slots)
        rewards = np.zeros(lead, dtype=np.float32)
        terminated = np.zeros(lead, dtype=bool)
        truncated = np.zeros(lead, dtype=bool)
        left = np.zeros(lead, dtype=bool)
        final_obs = np.zeros_like(self._obs)
        env_done = np.zeros(self.n_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.n_envs)]
        self._reached = 0  # the copies this call has begun to step (or settle)
        try:
            self._step_copies(actions, rewards, terminated, truncated, left, final_obs, env_done, infos)
        except BaseException:  # the copies stepped before the one cut short moved on too, unseen by the caller
            self._unsettled[: self._reached] = True
            raise
        self._given = (self._obs.copy(), self._mask.copy())
        return GroupStep(*self._given, rewards, terminated, truncated, left, final_obs, env_done, infos)

    def _step_copies(
        self,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        left: np.ndarray,
        final_obs: np.ndarray,
        env_done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """:meth:`step`'s work, copy by copy, into the arrays it returns."""
        for e, env in enumerate(self.envs):
            self._reached = e + 1
            if self._unsettled[e]:
                self._settle(e, left, truncated, final_obs, env_done)
                continue
            acting = [agent for agent in env.agents if self._mask[e, self.slot[agent]]]  # live after the last step
            action_dict = {agent: actions[e, self.slot[agent]] for agent in acting}
            self._unsettled[e] = True  # until its observations and mask are the env's again
            try:
                out = env.step(action_dict)
            except KeyError as exc:  # an env reading the action of an agent it ended, most likely
                # the agents of this episode that have ended (the mask is still the last step's)
                ended = [self.agent_ids[s] for s in np.flatnonzero(self._ep_seen[e] & ~self._mask[e])]
                key = exc.args[0] if len(exc.args) == 1 else None
                if any(agent is key or (type(agent) is type(key) and agent == key) for agent in ended):
                    raise _api_error(
                        "step()",
                        f"raised KeyError({key!r}), for an agent that terminated or truncated in an earlier step of "
                        "this episode (reading its action, most likely, as an env that still lists it in "
                        "env.agents does): covey sends actions to the live agents only, as PettingZoo's API has "
                        "them. Take an agent out of self.agents in the step that ends it (or read actions with "
                        "actions.get(agent))",
                    ) from exc
                raise
            if len(out) != 5:
                raise _api_error("step()", f"returned {len(out)} values, not 5")
            observations, rew, term, trunc, agent_infos = out
            _check_step_dicts(observations, rew, term, trunc, agent_infos, acting)
            # the env's, keyed by agent, copied as SB3's DummyVecEnv copies infos: an env may update them in place
            infos[e]["agents"] = {
                agent: own_info(info) if isinstance(info, dict) else copy.deepcopy(info)
                for agent, info in agent_infos.items()
            }
            if (  # looked for in each episode's first step
                not self._warned_info_mask
                and self._ep_length[e] == 0
                and any(isinstance(info, dict) and "action_mask" in info for info in agent_infos.values())
            ):
                self._warned_info_mask = True
                warn_user(
                    "The env's infos hold an 'action_mask', but covey's policies do not mask actions: actions it "
                    "forbids can be chosen. Make forbidden actions harmless in the env (e.g. a no-op)."
                )
            self._ep_length[e] += 1
            # Read once: on wrapped PettingZoo envs every read walks the wrapper chain. An agent the step
            # terminated or truncated is gone even where the env still lists it (PettingZoo's API removes it).
            after = self._live[e].after_step(env.agents, term, trunc)
            still = set(after)
            for agent in acting:
                s = self.slot[agent]
                reward = rew.get(agent, 0.0)
                if agent not in rew and not self._warned_missing_reward:
                    self._warned_missing_reward = True
                    warn_user(
                        f"The env's step() gave no reward for {agent!r}, which acted in this step: it trains on 0 "
                        "there. PettingZoo's API gives every agent that acted a reward (0.0 where it earned none)."
                    )
                rewards[e, s] = _reward_number(agent, reward)
                terminated[e, s] = bool(term[agent])
                truncated[e, s] = bool(trunc[agent]) and not terminated[e, s]
                if agent not in still:
                    if not (terminated[e, s] or truncated[e, s]):
                        raise _api_error(
                            "step()",
                            f"took agent {agent!r} out of env.agents with its terminations and truncations flags "
                            "both False. An agent leaves with one of them True: terminations for a true end (no "
                            "bootstrap), truncations for a time limit or other cut (its return bootstraps from the "
                            "group's value)",
                        )
                    # The agent is gone: keep its last observation for the (posthumous) bootstrap.
                    left[e, s] = True
                    last = observations.get(agent)
                    if last is None:
                        final_obs[e, s] = self._obs[e, s]
                    else:
                        self._fit(last, agent, final_obs, (e, s), final=True)
            self._ep_return[e] += rewards[e]
            if not rew.keys() <= action_dict.keys():  # rewards of agents that did not act (one that just joined)
                for agent, r in rew.items():
                    if agent not in action_dict:
                        r = _reward_number(agent, r)
                        if agent in self.slot:
                            self._ep_return[e, self.slot[agent]] += r
                        else:  # a key that is no agent's: the group return still counts what the env paid
                            self._ep_other_return[e] += r
                        if r and not self._warned_unused_rewards:
                            self._warned_unused_rewards = True
                            warn_user(
                                f"The env paid a reward of {r!r} under {agent!r}, which did not act in this step (an "
                                "agent that had already ended, one not yet in the episode, or a key that is no "
                                "agent's, such as a shared 'team' reward). The logged group return "
                                "(rollout/ep_rew_mean) counts it, but no agent trains on it: pay shared rewards to "
                                "every agent that acted (POCA trains on the group's rewards summed)."
                            )
            self._obs[e] = 0
            self._mask[e] = False
            self._put_all(e, after, observations, "step()")  # live agents, including ones that just appeared
            self._ep_seen[e] |= self._mask[e]
            if not after:
                env_done[e] = True
                seen = max(int(self._ep_seen[e].sum()), 1)
                group_return = float(self._ep_return[e].sum() + self._ep_other_return[e])
                infos[e]["episode"] = {
                    "r": group_return,
                    "l": int(self._ep_length[e]),
                    "r_agent": group_return / seen,
                    "t": round(time.time() - self._t0, 6),
                }
                self._reset_env(e, None)
            self._unsettled[e] = False

    def _settle(self, e: int, left: np.ndarray, truncated: np.ndarray, final_obs: np.ndarray, done: np.ndarray) -> None:
        """Copy ``e``'s last reset or step was cut short: end the episode the caller last saw (its agents leave,
        truncated, with the observations it was given) and reset the copy, without stepping it."""
        if self._given is not None:
            given_obs, given_mask = self._given
            left[e] = truncated[e] = given_mask[e]
            final_obs[e] = given_obs[e]
        done[e] = True
        self._reset_env(e, None)

    def played_elsewhere(self, env: Any) -> bool:
        """Mark the copies that are ``env`` itself (an instance given to POCA and then to an evaluation, which
        reset and stepped it) as unsettled, as after a step cut short: :meth:`restart_unsettled` restarts them,
        or else their next step ends the episode the caller last saw. Returns whether ``env`` is a copy."""
        copies = [e for e, own in enumerate(self.envs) if _same_env(own, env)]
        self._unsettled[copies] = True
        return bool(copies)

    def _unsettle(self, indices: None | int | Sequence[int] = None) -> None:
        """Mark copies (default: all) as unsettled, as after a step cut short: their last step's results did not
        reach the caller (:class:`SubprocGroupVecEnv` drops a block's answer where another block raised)."""
        self._unsettled[self._indices(indices)] = True

    def _restart(self, indices: None | int | Sequence[int] = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Reset copies (default: all) now, as unsettled ones; returns :meth:`restart_unsettled`'s."""
        self._unsettle(indices)
        return self.restart_unsettled()

    def restart_unsettled(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Reset the unsettled copies now; returns each one's new ``(observations, mask)`` by copy index. Where a
        reset fails, the copies restarted before it stay unsettled: the caller never got their observations."""
        restarted = {}
        try:
            for e in np.flatnonzero(self._unsettled):
                self._reset_env(int(e), None)
                restarted[int(e)] = (self._obs[e].copy(), self._mask[e].copy())
        except BaseException:
            self._unsettled[list(restarted)] = True
            raise
        if restarted and self._given is not None:  # new arrays: the caller holds the old ones as the last step's
            self._given = (self._obs.copy(), self._mask.copy())
        return restarted

    # SB3's VecEnv calls on the env copies, for callbacks (e.g. a curriculum that sets an env attribute)
    def _indices(self, indices: None | int | Sequence[int]) -> list[int]:
        if indices is None:
            return list(range(self.n_envs))
        return [int(indices)] if np.isscalar(indices) else [int(i) for i in indices]

    def get_attr(self, attr_name: str, indices: None | int | Sequence[int] = None) -> list[Any]:
        """SB3's ``get_attr``: the attribute of each env copy (all, or those of ``indices``), looked up through
        the copy's wrappers as SB3 looks through Gymnasium's (:func:`wrapper_attr`)."""
        return [wrapper_attr(self.envs[i], attr_name) for i in self._indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: None | int | Sequence[int] = None) -> None:
        """SB3's ``set_attr``: set the attribute on each env copy (all, or those of ``indices``), on the outermost
        of the copy's wrapped envs that has it (the copy itself where none does), as Gymnasium's
        ``set_wrapper_attr``: a curriculum's ``set_attr("max_cycles", n)`` reaches the env under PettingZoo's
        ``parallel_env()`` wrapper, which reads it."""
        for i in self._indices(indices):
            setattr(_holder(self.envs[i], attr_name), attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: None | int | Sequence[int] = None, **method_kwargs):
        """SB3's ``env_method``: call the method of each env copy (all, or those of ``indices``), looked up as
        :meth:`get_attr` looks; their results."""
        return [wrapper_attr(self.envs[i], method_name)(*method_args, **method_kwargs) for i in self._indices(indices)]

    def get_images(self) -> list[np.ndarray | None]:
        """SB3's ``get_images``: each copy's frame, from its ``render()`` (None for a copy that renders none)."""
        return self.env_method("render")

    def render(self, mode: str | None = None) -> np.ndarray | None:
        """SB3's ``VecEnv.render``: the copies' frames tiled into one image, for copies made with
        ``render_mode="rgb_array"``; None, with a warning that says how to get frames, where they render none."""
        if mode not in (None, "rgb_array"):
            raise ValueError(
                f"render(mode={mode!r}): a group of PettingZoo envs renders as each copy was made to, so pass no mode "
                "(or 'rgb_array' for copies made with render_mode='rgb_array')."
            )
        frames = self.get_images()
        if any(frame is None for frame in frames):
            warn_user(
                "The env copies rendered no frames: make them with render_mode='rgb_array' (e.g. lambda: "
                "simple_spread_v3.parallel_env(render_mode='rgb_array')) for render() to return an image."
            )
            return None
        return tile_images(frames)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _HeldInterrupts:
    """Ctrl-C held back while a message crosses a pipe, and raised once it has (in the main thread, where Python
    handles signals): a KeyboardInterrupt in the middle of one left part of it on the pipe, so the next read took
    the rest for a message, and the worker was reported lost while it ran on."""

    def __enter__(self) -> _HeldInterrupts:
        self.held = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None:  # None: a handler from outside Python, which could not be put back
                signal.signal(signal.SIGINT, self._hold)
                self.previous = previous
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        self.held = True

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            if self.held:
                signal.raise_signal(signal.SIGINT)  # to the handler in force again: a KeyboardInterrupt by default


def _has_discrete(space: spaces.Space) -> bool:
    """Whether ``space`` is, or a Dict space holds, a Discrete or MultiDiscrete space."""
    if isinstance(space, spaces.Dict):
        return any(_has_discrete(sub) for sub in space.spaces.values())
    return isinstance(space, (spaces.Discrete, spaces.MultiDiscrete))


def _check_step_dicts(observations: Any, rewards: Any, terminations: Any, truncations: Any, infos: Any, acting) -> None:
    """Raise where a step's five returns are not dicts keyed by agent, or where the terminations or truncations
    leave out an agent that acted, or give one a string (``"False"`` is true): a missing truncation made a time
    limit a true end of the group's episode, silently. (A missing reward counts 0, with a warning, as PettingZoo's
    API test warns of it.) A step that keeps to the API takes one pass over the agents that acted."""
    if (
        type(observations) is dict
        and type(rewards) is dict
        and type(terminations) is dict
        and type(truncations) is dict
        and type(infos) is dict
    ):
        for agent in acting:
            if (
                agent not in terminations
                or agent not in truncations
                or isinstance(terminations[agent], (str, bytes))
                or isinstance(truncations[agent], (str, bytes))
            ):
                break
        else:
            return
    named = {
        "observations": observations,
        "rewards": rewards,
        "terminations": terminations,
        "truncations": truncations,
        "infos": infos,
    }
    for name, value in named.items():
        if not isinstance(value, dict):
            raise _api_error("step()", f"returned its {name} as {type(value).__name__}, not a dict keyed by agent")
    for name in ("terminations", "truncations"):
        flags = named[name]
        missing = [agent for agent in acting if agent not in flags]
        if missing:
            raise _api_error(
                "step()",
                f"gave no {name} entry for {', '.join(map(repr, missing))}, which acted in this step. Every agent "
                f"that acted needs its termination and truncation flags (a time limit that leaves them out would "
                "read as the end of the episode, not as a truncation)",
            )
        text = next((agent for agent in acting if isinstance(flags[agent], (str, bytes))), None)
        if text is not None:
            flag = flags[text]
            raise _api_error("step()", f"gave agent {text!r} the {name} flag {flag!r}: a string, not a bool")


def _reward_number(agent: Any, reward: Any) -> float:
    """``reward`` as a float, or the error that names ``agent`` and a reward that is no number."""
    if type(reward) is float:  # most envs' (a step's cost: once per agent)
        return reward
    try:
        if reward is None or not_a_scalar(reward):
            raise TypeError("no number")  # NumPy before 2.4 reads an array of one element as its number, silently
        return float(reward)
    except (TypeError, ValueError) as exc:
        raise _api_error("step()", _not_a_reward(agent, reward)) from exc


def _not_a_reward(agent: Any, reward: Any) -> str:
    """The problem :func:`_api_error` names for a reward that is no number."""
    return (
        f"gave agent {agent!r} the reward {reward!r}{shape_words(reward)}, which is not a number: a PettingZoo env's "
        "rewards are one float per agent (for an array of one element, float(reward) or reward.item() in the env or "
        "a wrapper)"
    )


def _same_env(a: Any, b: Any) -> bool:
    """Whether two ParallelEnvs are one env: the same object, or PettingZoo's parallel views of one AEC env."""
    return a is b or getattr(a, "aec_env", a) is getattr(b, "aec_env", b)


def _wrapped(env: Any) -> list[Any]:
    """``env`` and the envs under it, outermost first: PettingZoo's and SuperSuit's wrappers hold theirs in
    ``env``, the ``parallel_env()`` conversion of an AEC env in ``aec_env``."""
    chain = [env]
    while True:
        own = getattr(chain[-1], "__dict__", {})  # its own attributes, not what a wrapper forwards
        inner = next((own[name] for name in ("env", "aec_env") if name in own), None)
        if inner is None or any(inner is e for e in chain):
            return chain
        chain.append(inner)


def _holder(env: Any, name: str) -> Any:
    """The outermost of ``env``'s wrapped envs that holds attribute ``name`` itself, in its own ``__dict__`` or
    its class (not through a wrapper's forwarding ``__getattr__``); ``env`` where none does."""
    return next((e for e in _wrapped(env) if name in getattr(e, "__dict__", {}) or hasattr(type(e), name)), env)


def wrapper_attr(env: Any, name: str) -> Any:
    """Attribute ``name`` of ``env`` or of the outermost env under it that has it, as Gymnasium's
    ``get_wrapper_attr`` (which SB3's ``get_attr`` and ``env_method`` call) looks through its wrappers."""
    holder = next((e for e in _wrapped(env) if hasattr(e, name)), None)
    if holder is None:
        raise AttributeError(f"{type(env).__name__} and the envs it wraps have no attribute {name!r}.")
    return getattr(holder, name)


class LiveAgents:
    """Who is still in one env copy's episode. PettingZoo's API removes an agent from ``env.agents`` once a step
    terminates or truncates it; an env that keeps listing it (reporting the end once) has it gone all the same,
    until the env stops listing it. An agent that leaves the list and comes back later has joined again.

    >>> live = LiveAgents()
    >>> live.after_step(["a", "b"], {"a": True}, {})
    ['b']
    >>> live.after_step(["a", "b"], {}, {})  # "a" still listed, not reported again: still gone
    ['b']
    >>> live.after_step(["b"], {}, {}), live.after_step(["a", "b"], {}, {})  # "a" left the list, then joined
    (['b'], ['a', 'b'])
    """

    def __init__(self) -> None:
        self.ended: set[str] = set()  # reported terminated or truncated, and listed ever since

    def reset(self) -> None:
        self.ended.clear()

    def after_step(self, agents: Sequence[str], terminations: dict, truncations: dict) -> list[str]:
        """The agents of ``agents`` (the env's list after a step) that are still in the episode."""
        now = {a for a in agents if terminations.get(a, False) or truncations.get(a, False)}
        if self.ended:
            now |= self.ended.intersection(agents)
        self.ended = now
        return [a for a in agents if a not in now]


def make_group_env(env: Any, n_envs: int | None) -> GroupVecEnv:
    """What a user passes as ``env`` to POCA, as a :class:`GroupVecEnv` of ``n_envs`` copies (None: one, or a
    GroupVecEnv's own).

    A function returning a ParallelEnv (or AEC env) is called once per copy; an env instance can only
    make one copy (pass a function for more); a GroupVecEnv is used as it is.
    """
    if isinstance(env, GroupVecEnv):
        return env
    n_envs = 1 if n_envs is None else n_envs
    if isinstance(env, str):
        as_parallel(env)  # raises: a name is not an env
    if is_env_maker(env):
        return GroupVecEnv([env] * n_envs)
    if n_envs != 1:
        raise ValueError(
            f"n_envs={n_envs} copies need a function that makes the env, e.g. "
            "POCA('MlpPolicy', lambda: simple_spread_v3.parallel_env(N=3), n_envs=8); an env instance can "
            "only be one copy (n_envs=1)."
        )
    return GroupVecEnv([lambda: env])


def is_env_maker(env: Any) -> bool:
    """Whether ``env`` makes envs (a function or a class) rather than being one (a ParallelEnv or AEC instance)."""
    return isinstance(env, type) or (callable(env) and not is_parallel_env(env) and not is_aec_env(env))


def make_one_env(env: Any) -> tuple[Any, bool]:
    """One ParallelEnv (AEC envs converted) from a function or class, which is called, or an instance, used as it
    is; and whether it was made here (and is the caller's to close)."""
    if isinstance(env, GroupVecEnv):
        raise TypeError(
            f"An evaluation plays one PettingZoo env, not POCA's env copies ({type(env).__name__}, what "
            "model.get_env() returns): pass the env function the model was given, or a new env, e.g. "
            "evaluate_group(model, lambda: simple_spread_v3.parallel_env(N=3))."
        )
    made = is_env_maker(env)
    return as_parallel(env() if made else env), made


def _worker(remote, parent_remote, env_fns_wrapper) -> None:
    """Runs a block of env copies in a worker process, answering ("reset", seed), ("step", actions),
    ("call", (method, args, kwargs, indices)), ("echo", mark) and ("close", None) with (True, result), or
    (False, the exception, its traceback in a note) where the copies raised one."""
    import traceback

    # Ctrl-C in a terminal reaches every process of the group: the training process decides (a run that catches
    # the KeyboardInterrupt goes on with these copies; one that ends takes its daemon workers with it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_remote.close()

    def fail(exc: Exception) -> None:
        note = "Raised in an env worker process:\n" + traceback.format_exc()
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:  # Python 3.10 keeps the note (and pickles it) but does not print it
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]
        try:
            remote.send((False, exc))
        except Exception:  # an exception that does not pickle
            remote.send((False, RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))

    try:
        try:
            venv = GroupVecEnv(env_fns_wrapper.var)
        except Exception as exc:  # the main process says why, at once
            fail(exc)
            return
        remote.send((True, venv.agent_ids))  # the main process checks that every block has the same agents
        while True:
            command, data = remote.recv()
            if command == "close":
                try:
                    venv.close()
                finally:
                    remote.send((True, None))
                break
            try:
                if command == "echo":  # resynchronizing after a command cut short (SubprocGroupVecEnv._resync)
                    result = data
                elif command == "reset":
                    result = venv.reset(seed=data)
                elif command == "step":
                    result = venv.step(data)
                else:  # "call": get_attr, set_attr or env_method on some of the block's copies
                    method, args, kwargs, indices = data
                    result = getattr(venv, method)(*args, indices=indices, **kwargs)
            except Exception as exc:
                fail(exc)
            else:
                remote.send((True, result))
    except (KeyboardInterrupt, EOFError):
        pass
    finally:
        remote.close()


class _Echo(NamedTuple):
    """A worker's answer to ("echo", _Echo(n)): the mark after which its answers are the next command's."""

    n: int


class WorkerLost(RuntimeError):
    """A worker process of a :class:`SubprocGroupVecEnv` ended without answering; the vector env is closed.
    ``copies`` names the env copies it stepped ("copy 2", "copies 4-7"), ``how`` how it ended."""

    def __init__(self, message: str, copies: str, how: str) -> None:
        super().__init__(message)
        self.copies, self.how = copies, how


class SubprocGroupVecEnv(GroupVecEnv):
    """Like :class:`GroupVecEnv`, with the env copies stepped in several processes at once (for slow envs).

    By default each copy has a worker process of its own. With ``n_processes=k`` the copies are split into ``k``
    blocks of consecutive copies: this process steps the first block itself while ``k - 1`` worker processes
    step the others (as SuperSuit's ``concat_vec_envs_v1(..., num_cpus=...)`` blocks copies, but without leaving
    this process idle meanwhile). On a few cores that beats one worker per copy, whose messages cost more than a
    fast env's step. Copy ``i`` is seeded ``seed + i`` either way, so the copies step as :class:`GroupVecEnv`'s do.
    Worker processes start with ``start_method`` (default forkserver where available, else spawn, as SB3's
    ``SubprocVecEnv``), which needs the script's top level under ``if __name__ == "__main__":``.

    >>> venv = SubprocGroupVecEnv([EarlyExitEnv] * 8, n_processes=2)  # doctest: +SKIP
    """

    def __init__(
        self, env_fns: Sequence[Callable[[], Any]], start_method: str | None = None, n_processes: int | None = None
    ) -> None:
        import multiprocessing as mp

        from stable_baselines3.common.vec_env.base_vec_env import CloudpickleWrapper

        if not env_fns:
            raise ValueError("SubprocGroupVecEnv needs at least one env function.")
        n = len(env_fns)
        if n_processes is not None and (not isinstance(n_processes, (int, np.integer)) or not 1 <= n_processes <= n):
            raise ValueError(
                f"n_processes must be a whole number from 1 to the number of env copies ({n}), got {n_processes!r} "
                "(or None: one worker process per copy)."
            )
        # Blocks of consecutive copies, as even as they go: block b holds copies starts[b] to starts[b + 1] - 1
        sizes = [1] * n if n_processes is None else [len(b) for b in np.array_split(np.arange(n), n_processes)]
        self.starts = [0, *np.cumsum(sizes).tolist()]
        # The first block steps here, unless every copy has a worker of its own
        self.local = None if n_processes is None else GroupVecEnv(env_fns[: self.starts[1]])
        probe = self.local.envs[0] if self.local is not None else as_parallel(env_fns[0]())
        self.observation_space, self.action_space = check_group_spaces(probe)
        self.render_mode = getattr(probe, "render_mode", None)
        if self.local is None:  # the local block's GroupVecEnv looked already
            warn_of_black_death(probe)
        self.agent_ids = list(probe.possible_agents)
        if self.local is None:
            probe.close()
        self.slot = {agent: i for i, agent in enumerate(self.agent_ids)}
        self.n_envs, self.n_slots = n, len(self.agent_ids)
        stored = storage_space(self.observation_space)  # the workers store Dicts flat
        self.obs_shape, self.obs_dtype = tuple(stored.shape), _storage_dtype(stored)
        self._seed = None
        ctx = mp.get_context(start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"))
        self.start_method = ctx.get_start_method()
        self._started = False  # whether every worker has answered once (a worker lost before that: see _lost)
        first_remote = 0 if self.local is None else 1  # the block of remotes[0]
        self.remotes: list[Any] = []
        self.processes = []
        self._owed: dict[Any, int] = {}  # per worker, the answers not yet read (a worker first sends its agent ids)
        self._unsure: set[Any] = set()  # workers whose count a KeyboardInterrupt may have left wrong (_resync)
        self._unseen = False  # whether a reset or step cut short left the workers' copies unseen by the caller
        self._given: tuple[np.ndarray, np.ndarray] | None = None  # the observations and mask last returned
        self._marks = itertools.count()
        for b in range(first_remote, len(sizes)):
            remote, work_remote = ctx.Pipe()
            fns = CloudpickleWrapper(list(env_fns[self.starts[b] : self.starts[b + 1]]))
            process = ctx.Process(target=_worker, args=(work_remote, remote, fns), daemon=True)
            process.start()
            work_remote.close()
            self._owed[remote] = 1
            self.remotes.append(remote)
            self.processes.append(process)
        # Per block: None for the one stepped here, else its worker's end of the pipe
        self.handlers = ([] if self.local is None else [None]) + self.remotes
        self.closed = False
        try:
            # every worker has built its copies (or says why it could not), of the same agents as this process's
            if any(agents != self.agent_ids for agents in self._gather(self.remotes)):
                raise ValueError(
                    SAME_AGENTS + " (the copies of another process list theirs otherwise: an env that "
                    "builds possible_agents from a set orders them by each process's string hashes; sort them)."
                )
        except Exception:
            self.close()
            raise
        self._started = True

    def _gather(self, remotes: Sequence[Any]) -> list[Any]:
        """Every worker's answer, in order; a worker's exception raised here, once all have answered."""
        answers = [self._receive(remote) for remote in remotes]
        for ok, result in answers:
            if not ok:
                raise result
        return [result for _, result in answers]

    def _receive(self, remote: Any) -> tuple[bool, Any]:
        """The next answer of the worker at ``remote``, or :class:`WorkerLost` where it ended without one. The wait
        for it can be interrupted (Ctrl-C); reading it cannot (:class:`_HeldInterrupts`)."""
        try:
            remote.poll(None)  # until the answer (or the end of the pipe) is there: nothing read yet
            with _HeldInterrupts():
                answer = remote.recv()
                self._owed[remote] -= 1
        except (EOFError, ConnectionError) as exc:
            raise self._lost(remote) from exc
        except BaseException:  # a KeyboardInterrupt, maybe after the answer left the pipe and before its count
            self._unsure.add(remote)
            raise
        return answer

    def _send(self, remote: Any, message: tuple[str, Any]) -> None:
        """Sends a command to the worker at ``remote``, once the answers of a command cut short have been read
        and dropped (a KeyboardInterrupt here between sending and reading), so that its answer is the next read."""
        if remote in self._unsure:
            self._resync(remote)
        while self._owed[remote]:
            self._receive(remote)
        try:
            with _HeldInterrupts():
                remote.send(message)
                self._owed[remote] += 1
        except ConnectionError as exc:  # the worker has ended
            raise self._lost(remote) from exc
        except BaseException:  # a KeyboardInterrupt, maybe after the command went and before its count
            self._unsure.add(remote)
            raise

    def _resync(self, remote: Any) -> None:
        """After a KeyboardInterrupt between a message on the pipe and its count (which would leave the next read
        waiting for an answer already read, or reading a stale one): sends a mark and drops every answer up to its
        echo, so that the worker owes none. Interrupted, it is redone with a new mark."""
        mark = _Echo(next(self._marks))
        try:
            with _HeldInterrupts():
                remote.send(("echo", mark))
            while True:
                remote.poll(None)
                with _HeldInterrupts():
                    ok, answer = remote.recv()
                if ok and type(answer) is _Echo and answer == mark:
                    break
        except (EOFError, ConnectionError) as exc:
            raise self._lost(remote) from exc
        self._owed[remote] = 0
        self._unsure.discard(remote)

    def _lost(self, remote: Any) -> WorkerLost:
        """Closes this env, whose worker at ``remote`` has ended; the error that says how it ended and what to do."""
        index = self.remotes.index(remote)
        process = self.processes[index]
        process.join(timeout=5)
        block = index + (self.local is not None)
        first, last = self.starts[block], self.starts[block + 1] - 1
        copies = f"copy {first}" if first == last else f"copies {first}-{last}"
        code = process.exitcode
        if code is None:
            how = "it closed its end of the pipe"
        elif code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        elif code == 255 and self.start_method == "forkserver":
            # forkserver reports 255 too where it has ended itself and lost the status (a signal to the whole group)
            how = "exit code 255, which forkserver also gives for a status it lost by ending itself"
        else:
            how = f"exit code {code}"
        self.close()
        if not self._started and self.start_method != "fork":
            message = (
                f"An env worker process of SubprocGroupVecEnv (env {copies}) ended before it answered ({how}). "
                f"Worker processes start with {self.start_method!r}, which runs the main script's top level again "
                'in each worker: put the code that makes the env and trains under `if __name__ == "__main__":` '
                '(or, on Linux, pass start_method="fork"). A traceback the worker printed, if any, is above.'
            )
        else:
            message = (
                f"An env worker process of SubprocGroupVecEnv (env {copies}) ended without answering ({how}): its "
                "env copies are lost, and this SubprocGroupVecEnv is closed. A crash in an env's compiled code, the "
                "system running out of memory (SIGKILL) or an env calling sys.exit ends a process so. Make a new "
                "SubprocGroupVecEnv to go on (model.set_env(env))."
            )
        return WorkerLost(message, copies, how)

    def _open(self) -> None:
        if self.closed:
            raise RuntimeError(
                "This SubprocGroupVecEnv is closed: its worker processes have ended. Make a new one (and give it to "
                "the model with model.set_env(env))."
            )

    def __reduce_ex__(self, protocol):
        # A copy of the pipes would close the workers' ends of the original's when collected, breaking it.
        raise TypeError(
            "A SubprocGroupVecEnv cannot be copied or pickled: its env copies live in worker processes. To copy a "
            "model trained on one, save it and load it with an env of its own: POCA.load(path, env=...)."
        )

    def _run(self, command: str, data_of_block: Callable[[int], Any], here: Callable[[Any], Any]) -> list[Any]:
        """``command`` on every block, the workers' and this process's at once; each block's result, in order.
        ``data_of_block(b)`` is block b's message data, ``here(data)`` runs the command on the local block."""
        self._open()
        for b, remote in enumerate(self.handlers):
            if remote is not None:
                self._send(remote, (command, data_of_block(b)))
        return self._here_and_gathered(lambda: [] if self.local is None else [here(data_of_block(0))], self.remotes)

    def _here_and_gathered(self, here: Callable[[], list[Any]], remotes: Sequence[Any]) -> list[Any]:
        """``here()``'s results, then the answers of ``remotes`` (asked already), read even where ``here()`` raises,
        so that no answer is left in a pipe for the next command to read."""
        try:
            mine = here()
        except Exception:
            self._gather(remotes)
            raise
        return mine + self._gather(remotes)

    def played_elsewhere(self, env: Any) -> bool:
        """As :meth:`GroupVecEnv.played_elsewhere`: only the block stepped in this process can hold ``env``."""
        return self.local is not None and self.local.played_elsewhere(env)

    def restart_unsettled(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """As :meth:`GroupVecEnv.restart_unsettled`, for the block stepped in this process (its copies come first),
        and for every worker's copy after a reset or step cut short (their answers never reached the caller); a
        worker's copy is otherwise restarted by its next step, as an unsettled copy is."""
        restarted = {} if self.local is None else self.local.restart_unsettled()
        if self._unseen:
            try:
                answers = self._on_workers("_restart")
            except BaseException:  # the copies restarted here never reached the caller either
                if restarted:
                    self.local._unsettle(list(restarted))
                    self._give_local_block_back()
                raise
            for b, answer in answers.items():
                restarted.update({self.starts[b] + e: copy for e, copy in answer.items()})
            self._unseen = False
        if self._given is not None:  # what the caller holds from here on
            for e, (obs, mask) in restarted.items():
                self._given[0][e], self._given[1][e] = obs, mask
        return restarted

    def _on_workers(self, method: str) -> dict[int, Any]:
        """``method`` of every worker's GroupVecEnv (on all its copies); the answers by block."""
        self._open()
        blocks = [b for b, remote in enumerate(self.handlers) if remote is not None]
        for b in blocks:
            self._send(self.handlers[b], ("call", (method, (), {}, None)))
        return dict(zip(blocks, self._here_and_gathered(list, [self.handlers[b] for b in blocks])))

    def _unseen_on_failure(self, command: str, data_of_block: Callable[[int], Any], here: Callable[[Any], Any]):
        """:meth:`_run`, where a failure (an env's exception, a KeyboardInterrupt, a lost worker) leaves no block's
        answer with the caller: this process's copies are unsettled where its block had finished (else its own
        step marked those it reached), and every worker's copy is (:meth:`restart_unsettled`, or the next step)."""
        finished = []

        def here_marked(data: Any) -> Any:
            out = here(data)
            finished.append(True)
            return out

        try:
            return self._run(command, data_of_block, here_marked)
        except BaseException:
            if finished:  # its copies end the episode the caller saw, with what it was given
                self.local._unsettle()
                self._give_local_block_back()
            self._unseen = True
            raise

    def _give_local_block_back(self) -> None:
        """This process's block holds what the caller was last given (its own record moved on unseen)."""
        if self._given is not None:
            local = slice(0, self.starts[1])
            self.local._given = (self._given[0][local].copy(), self._given[1][local].copy())

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        seed = self._seed if seed is None else seed
        self._seed = None
        results = self._unseen_on_failure(
            "reset", lambda b: None if seed is None else seed + self.starts[b], lambda s: self.local.reset(seed=s)
        )
        self._unseen = False  # every copy was reset, as the caller sees it
        obs, mask = np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
        self._given = (obs.copy(), mask.copy())
        return obs, mask

    def step(self, actions: np.ndarray) -> GroupStep:
        unseen = self._unseen
        if unseen:  # the workers' copies end the episode the caller saw, as unsettled ones
            self._on_workers("_unsettle")
            self._unseen = False
        steps = self._unseen_on_failure(
            "step", lambda b: actions[self.starts[b] : self.starts[b + 1]], lambda a: self.local.step(a)
        )
        step = GroupStep(
            *[np.concatenate([getattr(s, name) for s in steps]) for name in GroupStep._fields[:-1]],
            [info for s in steps for info in s.infos],
        )
        if unseen and self._given is not None:  # their agents leave with what the caller was given, not with what
            given_obs, given_mask = self._given  # the workers' copies held after the step it never saw
            workers = slice(self.starts[1] if self.local is not None else 0, self.n_envs)
            step.left[workers] = step.truncated[workers] = given_mask[workers]
            step.final_observations[workers] = given_obs[workers]
        self._given = (step.observations.copy(), step.mask.copy())
        return step

    def _call(self, method: str, indices, *args, **kwargs) -> list[Any]:
        """``method`` on the copies of ``indices``, each asked of its block; their results in ``indices``' order."""
        self._open()
        asked = self._indices(indices)
        blocks: dict[int, list[int]] = {}  # block -> the asked copies it holds
        for i in asked:
            blocks.setdefault(int(np.searchsorted(self.starts, i, side="right")) - 1, []).append(i)
        for b, copies in blocks.items():
            if self.handlers[b] is not None:
                self._send(self.handlers[b], ("call", (method, args, kwargs, [i - self.starts[b] for i in copies])))
        here = [b for b in blocks if self.handlers[b] is None]  # the local block, if asked
        there = [b for b in blocks if self.handlers[b] is not None]

        def call_here() -> list[Any]:
            return [getattr(self.local, method)(*args, indices=blocks[b], **kwargs) for b in here]  # starts[0] = 0

        results = dict(zip(here + there, self._here_and_gathered(call_here, [self.handlers[b] for b in there])))
        by_copy = {}
        for b, copies in blocks.items():
            by_copy.update(zip(copies, results[b] or ()))  # set_attr's are None
        return [by_copy[i] for i in asked] if method != "set_attr" else []

    def get_attr(self, attr_name: str, indices: None | int | Sequence[int] = None) -> list[Any]:
        return self._call("get_attr", indices, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: None | int | Sequence[int] = None) -> None:
        self._call("set_attr", indices, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: None | int | Sequence[int] = None, **method_kwargs):
        return self._call("env_method", indices, method_name, *method_args, **method_kwargs)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for remote in self.remotes:
            try:
                remote.send(("close", None))
            except OSError:  # a worker that is already gone
                pass
        if self.local is not None:
            self.local.close()
        for remote in self.remotes:
            try:
                remote.recv()
            except (EOFError, OSError):  # a worker that is already gone
                pass
        for process in self.processes:
            process.join()
        for remote in self.remotes:
            remote.close()
