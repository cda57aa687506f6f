"""GroupVecEnv: PettingZoo parallel envs as arrays ``(n_envs, n_slots, ...)`` with presence masks.

Real PettingZoo envs (MPE simple_spread, SISL multiwalker, butterfly KAZ) are checked against separately
stepped copies of the same env with the same seeds and actions; a scripted env checks agents that join
and leave at known steps exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import supersuit
from gymnasium import spaces
from mpe2 import simple_adversary_v3, simple_speaker_listener_v4, simple_spread_v3
from pettingzoo import ParallelEnv
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.sisl import multiwalker_v9

from covey.envs import EarlyExitEnv
from covey.evaluation import evaluate_group
from covey.wrappers.group_env import (
    GroupStep,
    GroupVecEnv,
    MixedSpacesError,
    SubprocGroupVecEnv,
    as_parallel,
    check_group_spaces,
    make_group_env,
)


def stack(obs: dict, agents: list[str], shape: tuple[int, ...]) -> np.ndarray:
    """A dict of per-agent observations as one array in slot order (zeros for absent agents)."""
    return np.stack([np.asarray(obs[a], np.float32) if a in obs else np.zeros(shape, np.float32) for a in agents])


class Reference:
    """Separately stepped copies of an env, seeded as GroupVecEnv seeds them (copy ``e`` gets ``seed + e``)."""

    def __init__(self, make, n_envs: int, seed: int):
        self.envs = [make() for _ in range(n_envs)]
        self.obs = [env.reset(seed=seed + e)[0] for e, env in enumerate(self.envs)]

    def step(self, e: int, actions: np.ndarray, slots: dict[str, int]):
        env = self.envs[e]
        return env.step({a: actions[slots[a]] for a in env.agents})


# ---------------------------------------------------------------------------------------------- MPE simple_spread
def test_simple_spread_matches_reference_env_and_auto_resets():
    """Shapes, rewards, truncation at max_cycles, final observations and auto-reset, step for step."""

    def make():
        return simple_spread_v3.parallel_env(N=3, max_cycles=25)

    n_envs, seed = 2, 11
    venv = GroupVecEnv([make] * n_envs)
    assert venv.agent_ids == ["agent_0", "agent_1", "agent_2"] and venv.n_slots == 3
    obs, mask = venv.reset(seed=seed)
    assert obs.shape == (2, 3, 18) and obs.dtype == np.float32
    assert mask.shape == (2, 3) and mask.all()
    ref = Reference(make, n_envs, seed)
    for e in range(n_envs):
        np.testing.assert_array_equal(obs[e], stack(ref.obs[e], venv.agent_ids, (18,)))
    assert not np.array_equal(obs[0], obs[1])  # copies get different seeds

    rng = np.random.default_rng(0)
    returns = np.zeros(n_envs)
    for t in range(1, 26):
        actions = rng.integers(0, 5, (n_envs, 3))
        st = venv.step(actions)
        assert isinstance(st, GroupStep)
        assert st.rewards.shape == (2, 3) and st.terminated.shape == st.truncated.shape == st.left.shape == (2, 3)
        assert st.final_observations.shape == (2, 3, 18) and st.env_done.shape == (2,)
        for e in range(n_envs):
            r_obs, r_rew, r_term, r_trunc, r_info = ref.step(e, actions[e], venv.slot)
            expected_rew = np.array([r_rew[a] for a in venv.agent_ids], np.float32)
            np.testing.assert_allclose(st.rewards[e], expected_rew, rtol=1e-6)
            returns[e] += sum(r_rew.values())
            np.testing.assert_array_equal(st.terminated[e], [r_term[a] for a in venv.agent_ids])
            np.testing.assert_array_equal(st.truncated[e], [r_trunc[a] for a in venv.agent_ids])
            if t < 25:
                assert not st.env_done[e] and not st.left[e].any() and st.infos[e] == {"agents": r_info}
                assert st.mask[e].all()
                np.testing.assert_array_equal(st.observations[e], stack(r_obs, venv.agent_ids, (18,)))
                assert not st.final_observations[e].any()
            else:
                assert st.env_done[e] and st.left[e].all() and st.truncated[e].all() and not st.terminated[e].any()
                np.testing.assert_array_equal(st.final_observations[e], stack(r_obs, venv.agent_ids, (18,)))
                episode = st.infos[e]["episode"]
                assert episode["l"] == 25
                assert episode["r"] == pytest.approx(returns[e], rel=1e-5)
                assert episode["r_agent"] == pytest.approx(returns[e] / 3, rel=1e-5)
                # The copy was reset in the same step: a new episode's observations (the env's own RNG goes on).
                assert st.mask[e].all()
                new_obs, _ = ref.envs[e].reset()
                np.testing.assert_array_equal(st.observations[e], stack(new_obs, venv.agent_ids, (18,)))
                assert not np.array_equal(st.observations[e], st.final_observations[e])
    # The next episode counts from zero again.
    st = venv.step(np.zeros((n_envs, 3), np.int64))
    assert not st.env_done.any() and st.mask.all()
    venv.close()


# ---------------------------------------------------------------------------------------------- SISL multiwalker
def test_multiwalker_walkers_leave_early_when_they_fall():
    """terminate_on_fall=False, remove_on_fall=True: a fallen walker leaves while the others walk on."""

    def make():
        return multiwalker_v9.parallel_env(n_walkers=3, terminate_on_fall=False, remove_on_fall=True)

    n_envs, seed = 2, 0
    venv = GroupVecEnv([make] * n_envs)
    assert isinstance(venv.action_space, spaces.Box) and venv.action_space.shape == (4,)
    obs, mask = venv.reset(seed=seed)
    assert obs.shape == (2, 3, 31) and mask.all()
    ref = Reference(make, n_envs, seed)
    for e in range(n_envs):
        np.testing.assert_array_equal(obs[e], stack(ref.obs[e], venv.agent_ids, (31,)))

    rng = np.random.default_rng(0)
    gone = np.zeros((n_envs, 3), bool)  # left earlier in the current episode
    left_count = np.zeros((n_envs, 3), int)
    early_leaves = 0
    returns = np.zeros(n_envs)
    episodes_done = np.zeros(n_envs, int)
    for _ in range(120):
        actions = rng.uniform(-1, 1, (n_envs, 3, 4)).astype(np.float32)
        st = venv.step(actions)
        for e in range(n_envs):
            r_obs, r_rew, r_term, r_trunc, r_info = ref.step(e, actions[e], venv.slot)
            returns[e] += sum(r_rew.values())
            acting = ~gone[e]
            # Only agents that acted report rewards and flags; absent slots report nothing.
            assert not (st.left[e] & gone[e]).any() and not st.rewards[e][gone[e]].any()
            for a, s in venv.slot.items():
                if a in r_rew:
                    assert st.rewards[e, s] == pytest.approx(r_rew[a], rel=1e-6, abs=1e-6)
                    assert st.terminated[e, s] == r_term[a]
            np.testing.assert_array_equal(st.left[e], acting & ~np.isin(venv.agent_ids, ref.envs[e].agents))
            for s in np.flatnonzero(st.left[e]):
                a = venv.agent_ids[s]
                np.testing.assert_array_equal(st.final_observations[e, s], np.asarray(r_obs[a], np.float32))
                assert np.abs(st.final_observations[e, s]).sum() > 0
                assert st.terminated[e, s]
            assert not st.final_observations[e][~st.left[e]].any()
            left_count[e] += st.left[e]
            gone[e] |= st.left[e]
            if st.env_done[e]:
                assert gone[e].all()
                assert (left_count[e] == 1).all()  # every walker left exactly once in the episode
                assert st.infos[e]["episode"]["r"] == pytest.approx(returns[e], rel=1e-5)
                returns[e], gone[e], left_count[e] = 0.0, False, 0
                episodes_done[e] += 1
                r_obs, _ = ref.envs[e].reset()
                assert st.mask[e].all()
            else:
                early_leaves += int(st.left[e].sum())
                assert st.infos[e] == {"agents": r_info}
                # A walker that left stays masked (and zero) until the copy is reset.
                np.testing.assert_array_equal(st.mask[e], ~gone[e])
                assert not st.observations[e][gone[e]].any()
            live = {a: r_obs[a] for a in ref.envs[e].agents}
            np.testing.assert_array_equal(st.observations[e], stack(live, venv.agent_ids, (31,)))
    assert early_leaves > 0, "no walker fell while the others went on: pick another seed"
    assert episodes_done.sum() > 0, "no episode ended within the budget: raise it"


def test_multiwalker_default_terminates_every_walker_when_one_falls():
    """With the package's defaults one fall ends the episode: all walkers leave in the same step."""
    venv = GroupVecEnv([lambda: multiwalker_v9.parallel_env(n_walkers=3)])
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        st = venv.step(rng.uniform(-1, 1, (1, 3, 4)).astype(np.float32))
        if st.left.any():
            assert st.left.all() and st.terminated.all() and st.env_done[0]
            assert (np.abs(st.final_observations[0]).sum(axis=-1) > 0).all()
            assert st.mask.all()  # already reset
            break
    else:
        pytest.fail("no walker fell within 200 steps")


# ---------------------------------------------------------------------------------------------- butterfly KAZ
def _make_kaz(**kwargs):
    return knights_archers_zombies_v11.parallel_env(
        obs_method="vector", max_cycles=100, spawn_delay=2, line_death=True, **kwargs
    )


def test_knights_archers_zombies_dead_agents_leave():
    """float64 (27, 5) observations stored as float32; masks follow env.agents; dead agents leave."""
    n_envs, seed = 2, 0
    venv = GroupVecEnv([_make_kaz] * n_envs)
    assert venv.agent_ids == ["archer_0", "archer_1", "knight_0", "knight_1"]
    assert venv.observation_space.shape == (27, 5) and venv.observation_space.dtype == np.float64
    obs, mask = venv.reset(seed=seed)
    assert obs.shape == (2, 4, 27, 5) and obs.dtype == np.float32 and mask.all()
    ref = Reference(_make_kaz, n_envs, seed)

    rng = np.random.default_rng(0)
    gone = np.zeros((n_envs, 4), bool)
    deaths = 0
    ends = 0
    for t in range(1, 151):
        actions = rng.integers(0, 6, (n_envs, 4))
        st = venv.step(actions)
        assert st.observations.dtype == np.float32 and st.final_observations.dtype == np.float32
        for e in range(n_envs):
            r_obs, r_rew, _, r_trunc, _ = ref.step(e, actions[e], venv.slot)
            assert not (st.left[e] & gone[e]).any()
            for s in np.flatnonzero(st.left[e]):
                a = venv.agent_ids[s]
                np.testing.assert_allclose(st.final_observations[e, s], r_obs[a], atol=1e-6)
                assert np.abs(st.final_observations[e, s]).sum() > 0
            assert not st.final_observations[e][~st.left[e]].any()
            for a, s in venv.slot.items():
                assert st.rewards[e, s] == r_rew.get(a, 0.0)
            gone[e] |= st.left[e]
            if st.env_done[e]:
                assert t % 100 == 0  # max_cycles: the survivors are truncated
                np.testing.assert_array_equal(st.truncated[e], [bool(r_trunc.get(a)) for a in venv.agent_ids])
                assert st.infos[e]["episode"]["l"] == 100
                gone[e] = False
                r_obs, _ = ref.envs[e].reset()
                ends += 1
            else:
                deaths += int(st.left[e].sum())
                assert st.terminated[e][st.left[e]].all()
            # The mask is exactly the copy's live agents, and masked slots hold zeros.
            np.testing.assert_array_equal(st.mask[e], np.isin(venv.agent_ids, venv.envs[e].agents))
            np.testing.assert_array_equal(st.mask[e], ~gone[e])
            assert not st.observations[e][~st.mask[e]].any()
            live = {a: r_obs[a] for a in ref.envs[e].agents}
            np.testing.assert_allclose(st.observations[e], stack(live, venv.agent_ids, (27, 5)), atol=1e-6)
    assert deaths > 0, "no agent died within the budget: pick another seed"
    assert ends == n_envs


# ---------------------------------------------------------------------------------------------- scripted env
class ScriptedEnv(ParallelEnv):
    """Agents a and b at reset; c appears after step 2; a terminates at step 3; all truncated at ``end``.

    Observation of agent i at time t: ``[i + 1, t, 7]``. Reward: ``10 * (i + 1) + t + action``.
    """

    metadata = {"name": "scripted_v0", "render_modes": []}

    def __init__(self, end: int = 5):
        self.possible_agents = ["a", "b", "c"]
        self.agents: list[str] = []
        self.end = end
        self.render_mode = None

    def observation_space(self, agent):
        return spaces.Box(-100, 100, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent) + 1, self.t, 7], np.float32)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = ["a", "b"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)  # no actions for absent agents
        self.t += 1
        rewards = {a: 10.0 * (self.possible_agents.index(a) + 1) + self.t + int(actions[a]) for a in self.agents}
        terminations = {a: a == "a" and self.t == 3 for a in self.agents}
        truncations = {a: self.t >= self.end for a in self.agents}
        observations = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        if self.t == 2:
            self.agents.append("c")
            observations["c"] = self._obs("c")
        return observations, rewards, terminations, truncations, {a: {"t": self.t} for a in observations}


def test_scripted_agents_join_and_leave_at_known_steps():
    """Mask, flags, rewards, final observations, the env's infos and episode info, exactly, for two copies of
    different lengths."""
    ends = (5, 6)
    venv = GroupVecEnv([lambda end=end: ScriptedEnv(end) for end in ends])
    obs, mask = venv.reset(seed=3)
    np.testing.assert_array_equal(mask, [[1, 1, 0], [1, 1, 0]])
    np.testing.assert_array_equal(obs[0], [[1, 0, 7], [2, 0, 7], [0, 0, 0]])
    live = {0: ["a", "b"], 1: ["a", "b"]}
    returns = [0.0, 0.0]
    for t in range(1, 8):
        actions = np.array([[(e + s + t) % 3 for s in range(3)] for e in range(2)])
        st = venv.step(actions)
        for e, end in enumerate(ends):
            if t > end:  # copy 0's second episode: t - end steps into it
                tt = t - end
                np.testing.assert_array_equal(st.mask[e], [1, 1, tt >= 2])  # c joins again at step 2
                np.testing.assert_array_equal(st.observations[e, :, 1], [tt, tt, tt if tt >= 2 else 0])
                assert not st.left[e].any() and not st.env_done[e]
                continue
            acting = live[e]
            expected_rew = np.zeros(3, np.float32)
            for a in acting:
                s = venv.slot[a]
                expected_rew[s] = 10 * (s + 1) + t + actions[e, s]
            np.testing.assert_array_equal(st.rewards[e], expected_rew)
            returns[e] += float(expected_rew.sum())
            expected_term = [t == 3, False, False]
            np.testing.assert_array_equal(st.terminated[e], expected_term)
            expected_trunc = [t >= end and a in acting for a in "abc"]
            np.testing.assert_array_equal(st.truncated[e], expected_trunc)
            expected_left = np.logical_or(expected_term, expected_trunc)
            np.testing.assert_array_equal(st.left[e], expected_left)
            for s in range(3):
                if expected_left[s]:
                    np.testing.assert_array_equal(st.final_observations[e, s], [s + 1, t, 7])
                else:
                    assert not st.final_observations[e, s].any()
            # The env's infos, as its step returned them (every agent it observed: c from step 2 on).
            observed = acting + (["c"] if t == 2 else [])
            assert st.infos[e]["agents"] == {a: {"t": t} for a in observed}
            live[e] = [a for a in acting if not expected_left["abc".index(a)]] + (["c"] if t == 2 else [])
            if t < end:
                assert not st.env_done[e] and set(st.infos[e]) == {"agents"}
                np.testing.assert_array_equal(st.mask[e], [a in live[e] for a in "abc"])
                for s, a in enumerate("abc"):
                    expected_obs = [s + 1, t, 7] if a in live[e] else [0, 0, 0]
                    np.testing.assert_array_equal(st.observations[e, s], expected_obs)
            else:
                assert st.env_done[e]
                episode = st.infos[e]["episode"]
                assert episode["l"] == end
                assert episode["r"] == pytest.approx(returns[e])
                assert episode["r_agent"] == pytest.approx(returns[e] / 3)  # a, b and c took part
                np.testing.assert_array_equal(st.mask[e], [1, 1, 0])  # reset: a and b again
                np.testing.assert_array_equal(st.observations[e], [[1, 0, 7], [2, 0, 7], [0, 0, 0]])
                live[e] = ["a", "b"]
        if t == 2:  # c's first observation, although c has not acted yet
            np.testing.assert_array_equal(st.observations[:, 2], [[3, 2, 7], [3, 2, 7]])
            assert not st.rewards[:, 2].any()
    # Hand-checked episode return of copy 0 (reward 10 * (i + 1) + t + action, action (s + t) % 3 for e = 0).
    a_return = (10 + 1 + 1) + (10 + 2 + 2) + (10 + 3 + 0)  # steps 1-3, terminated at 3
    b_return = (20 + 1 + 2) + (20 + 2 + 0) + (20 + 3 + 1) + (20 + 4 + 2) + (20 + 5 + 0)  # steps 1-5
    c_return = (30 + 3 + 2) + (30 + 4 + 0) + (30 + 5 + 1)  # steps 3-5
    assert returns[0] == a_return + b_return + c_return == 264


def test_returned_arrays_are_copies():
    """Stepping again does not change arrays returned earlier."""
    venv = GroupVecEnv([ScriptedEnv])
    obs, mask = venv.reset()
    before = obs.copy(), mask.copy()
    st = venv.step(np.zeros((1, 3), np.int64))
    st_obs = st.observations.copy()
    venv.step(np.zeros((1, 3), np.int64))
    np.testing.assert_array_equal(obs, before[0])
    np.testing.assert_array_equal(mask, before[1])
    np.testing.assert_array_equal(st.observations, st_obs)


# ---------------------------------------------------------------------------------------------- errors
def test_heterogeneous_observation_spaces_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match="observation space") as info:
        GroupVecEnv([lambda: simple_adversary_v3.parallel_env()])
    message = str(info.value)
    assert "'adversary_0'" in message and "'agent_0'" in message and "'agent_1'" in message
    assert "(8,)" in message and "(10,)" in message
    assert "pad_observations_v0" in message and "SuperSuit" in message
    # The suggested fix works.
    venv = GroupVecEnv([lambda: supersuit.pad_observations_v0(simple_adversary_v3.parallel_env())])
    obs, mask = venv.reset(seed=0)
    assert obs.shape == (1, 3, 10) and mask.all()


def test_heterogeneous_action_spaces_are_rejected_with_the_fix():
    def padded_obs():
        return supersuit.pad_observations_v0(simple_speaker_listener_v4.parallel_env())

    with pytest.raises(ValueError, match="action space") as info:
        check_group_spaces(padded_obs())
    message = str(info.value)
    assert "'speaker_0'" in message and "Discrete(3)" in message
    assert "'listener_0'" in message and "Discrete(5)" in message
    assert "pad_action_space_v0" in message
    venv = GroupVecEnv([lambda: supersuit.pad_action_space_v0(padded_obs())] * 2)
    assert venv.action_space == spaces.Discrete(5)
    obs, mask = venv.reset(seed=0)
    st = venv.step(np.zeros((2, 2), np.int64))
    assert st.observations.shape == (2, 2, 11) and st.mask.all()


def test_supersuits_black_death_is_named_with_the_masking_it_undoes():
    """black_death_v3 keeps an agent that left in the env with zero observations: the group env would see it as
    present, so POCA's masking and posthumous credit would not apply. The warning names that, at the user's line."""
    with pytest.warns(UserWarning, match="black_death_v3, which keeps agents that died.*leave black_death_v3 out") as w:
        venv = GroupVecEnv([lambda: supersuit.black_death_v3(EarlyExitEnv())])
    assert len(w) == 1 and w[0].filename == __file__
    venv.reset(seed=0)
    step = venv.step(np.array([[1, 0, 0]]))  # agent_0 presses the switch and leaves the episode
    assert not step.left.any() and step.mask.all()  # as the warning says: its leaving is hidden
    venv.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = GroupVecEnv([EarlyExitEnv])
        plain.reset(seed=0)
        step = plain.step(np.array([[1, 0, 0]]))
    assert step.left[0].tolist() == [True, False, False] and step.mask[0].tolist() == [False, True, True]
    # found under other wrappers, and in an AEC env converted to parallel
    for fn in (
        lambda: supersuit.clip_reward_v0(supersuit.black_death_v3(EarlyExitEnv()), -1, 1),
        lambda: supersuit.black_death_v3(knights_archers_zombies_v11.env()),
    ):
        with pytest.warns(UserWarning, match="black_death_v3"):
            GroupVecEnv([fn]).close()
    # copies stepped in worker processes: once, whether the first block steps here or in a worker
    for n_processes in (None, 2):
        with pytest.warns(UserWarning, match="black_death_v3") as w:
            SubprocGroupVecEnv([lambda: supersuit.black_death_v3(EarlyExitEnv())] * 2, n_processes=n_processes).close()
        assert len([x for x in w if "black_death_v3" in str(x.message)]) == 1


class MixedSpacesEnv(ParallelEnv):
    """Two agents of the given action (and observation) spaces; only the spaces are read."""

    metadata = {"name": "mixed_spaces_v0"}

    def __init__(self, actions, observations=None):
        self.possible_agents = [f"a_{i}" for i in range(len(actions))]
        self.actions = actions
        self.observations = observations or [spaces.Box(-1, 1, (3,), np.float32)] * len(actions)

    def observation_space(self, agent):
        return self.observations[self.possible_agents.index(agent)]

    def action_space(self, agent):
        return self.actions[self.possible_agents.index(agent)]


@pytest.mark.parametrize(
    "actions, observations, message",
    [
        (
            [spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32)],
            None,
            r"make their action spaces equal in a wrapper of your own \(SuperSuit's pad_action_space_v0 cannot make a "
            r"Box and a Discrete one space\)",
        ),
        (
            [spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-2, 2, (2,), np.float32)],
            None,
            r"pad_action_space_v0 widens the bounds to the widest agent's, so an agent would be sent actions outside",
        ),
        (
            [spaces.Box(0.5, 1, (2,), np.float32), spaces.Box(0.5, 1, (3,), np.float32)],
            None,
            r"pad_action_space_v0 widens the bounds",  # a_1's third action padded from a_0's side with 0
        ),
        (
            [spaces.Box(-1, 1, (1,)), spaces.Box(np.array([-1, -5]), np.array([1, 5])), spaces.Box(-1, 1, (3,))],
            None,
            r"pad_action_space_v0 widens the bounds",  # a_2's second action, by a_1's, which a_0's does not meet
        ),
        (
            [spaces.Discrete(3, start=1), spaces.Discrete(3)],
            None,
            r"pad_action_space_v0 makes a Discrete from 0, and these start elsewhere",
        ),
        (
            [spaces.Discrete(3)] * 2,
            [spaces.Discrete(3), spaces.Discrete(4)],
            r"pad_observations_v0 gives a Discrete observation's space in place of the observation",
        ),
        (
            [spaces.Discrete(3), spaces.Discrete(4)],
            [spaces.Dict({"x": spaces.Box(-1, 1, (2,))}), spaces.Dict({"x": spaces.Box(-1, 1, (3,))})],
            r"make their action spaces equal with SuperSuit's pad_action_space_v0\(env\), and make their observation "
            r"spaces equal in a wrapper of your own \(SuperSuit's pad_observations_v0 pads Box and Discrete spaces",
        ),
    ],
    ids=["discrete-and-box", "box-bounds", "box-padding", "three-agents", "discrete-start", "discrete-obs", "dict-obs"],
)
def test_supersuits_padding_is_advised_only_where_it_keeps_each_agent_to_its_space(actions, observations, message):
    """The advised pad_action_space_v0 and pad_observations_v0 failed with SuperSuit's AssertionError on a Discrete
    and a Box or on Dict observations, and on Box actions of other bounds or a Discrete with a start padded into
    one space whose actions fall outside an agent's own."""
    with pytest.raises(MixedSpacesError, match=message) as info:
        check_group_spaces(MixedSpacesEnv(actions, observations))
    padded = [w for w in ("pad_observations_v0", "pad_action_space_v0") if f"SuperSuit's {w}(env)" in str(info.value)]
    assert info.value.wrappers == padded
    # where the shapes alone differ, padding keeps each agent to its own: advised as before
    wider = MixedSpacesEnv([spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-1, 1, (3,), np.float32)])
    with pytest.raises(MixedSpacesError, match=r"make their spaces equal, e.g. with SuperSuit's pad_action_space_v0"):
        check_group_spaces(wider)


def test_agents_differing_in_both_spaces_get_both_fixes_in_one_error():
    with pytest.raises(MixedSpacesError) as info:
        GroupVecEnv([simple_speaker_listener_v4.parallel_env])
    message = str(info.value)
    assert "one observation space, but 'speaker_0' has Box(-inf, inf, (3,), float32)" in message
    assert "and one action space, but 'speaker_0' has Discrete(3) and 'listener_0' has Discrete(5)" in message
    assert "pad_observations_v0(env) and pad_action_space_v0(env)" in message
    assert info.value.wrappers == ["pad_observations_v0", "pad_action_space_v0"]
    # Both, in that order, make a group that steps.
    padded = supersuit.pad_observations_v0
    venv = GroupVecEnv([lambda: supersuit.pad_action_space_v0(padded(simple_speaker_listener_v4.parallel_env()))])
    obs, mask = venv.reset(seed=0)
    assert obs.shape == (1, 2, 11) and mask.all()


class DictObsEnv(ScriptedEnv):
    """ScriptedEnv with Dict observations: ``{"pos": [i + 1, t], "tag": t % 3}``."""

    def observation_space(self, agent):
        return spaces.Dict({"pos": spaces.Box(-100, 100, (2,), np.float32), "tag": spaces.Discrete(3)})

    def _obs(self, agent):
        return {"pos": np.array([self.possible_agents.index(agent) + 1, self.t], np.float32), "tag": self.t % 3}


def test_dict_observations_are_stored_flat_per_slot_in_and_out_of_process():
    """Each slot holds its Dict observation as one float32 vector in key order ([pos, tag]), absent slots zeros;
    a leaver's final observation is flattened the same way, and worker processes store exactly the same."""
    venv = GroupVecEnv([DictObsEnv])
    assert venv.observation_space == DictObsEnv().observation_space("a")  # the agents' space, for the networks
    obs, mask = venv.reset(seed=0)
    assert obs.shape == (1, 3, 3) and obs.dtype == np.float32 and mask[0].tolist() == [True, True, False]
    np.testing.assert_array_equal(obs[0], [[1, 0, 0], [2, 0, 0], [0, 0, 0]])
    steps = [venv.step(np.zeros((1, 3), np.int64)) for _ in range(3)]
    np.testing.assert_array_equal(steps[1].observations[0], [[1, 2, 2], [2, 2, 2], [3, 2, 2]])  # c joined at t=2
    assert steps[2].left[0].tolist() == [True, False, False]  # a terminated at t=3: its final observation
    np.testing.assert_array_equal(steps[2].final_observations[0, 0], [1, 3, 0])

    remote = SubprocGroupVecEnv([DictObsEnv])
    try:
        np.testing.assert_array_equal(remote.reset(seed=0)[0], obs)
        for step in steps:
            got = remote.step(np.zeros((1, 3), np.int64))
            np.testing.assert_array_equal(got.observations, step.observations)
            np.testing.assert_array_equal(got.final_observations, step.final_observations)
    finally:
        remote.close()


class ListsEndedAgentsEnv(ScriptedEnv):
    """ScriptedEnv that keeps listing an agent after the step that ended it (against PettingZoo's API), reporting
    its end once, with zero observations (or none, with ``observe_ended=False``). From step ``drop_at`` on it lists
    them no more, and at step ``rejoin_at`` agent a joins again."""

    def __init__(self, end=8, drop_at=5, rejoin_at=6, observe_ended=True):
        super().__init__(end)
        self.drop_at, self.rejoin_at, self.observe_ended = drop_at, rejoin_at, observe_ended

    def reset(self, seed=None, options=None):
        self.stale: set[str] = set()
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        assert not set(actions) & self.stale, f"actions for ended agents {sorted(set(actions) & self.stale)}"
        self.agents = [a for a in self.agents if a not in self.stale]
        observations, rewards, terminations, truncations, infos = super().step(actions)
        self.stale |= {a for a in terminations if terminations[a] or truncations[a]}
        if self.t >= self.drop_at:
            self.stale.clear()
        if self.t == self.rejoin_at:
            self.agents.append("a")
            observations["a"] = self._obs("a")
        for a in sorted(self.stale):
            self.agents.append(a)
            if self.observe_ended:
                observations[a] = np.zeros(3, np.float32)
        return observations, rewards, terminations, truncations, infos


@pytest.mark.parametrize("observe_ended", [True, False])
def test_agents_a_step_ends_are_gone_while_the_env_still_lists_them_and_may_join_again_later(observe_ended):
    """An agent the env keeps listing after its end stays gone (it neither acts nor needs an observation) until the
    env stops listing it; listed again later, it has joined again. The same in evaluate_group."""
    venv = GroupVecEnv([lambda: ListsEndedAgentsEnv(observe_ended=observe_ended)])
    venv.reset(seed=0)
    masks = [venv.step(np.zeros((1, 3), np.int64)).mask[0].tolist() for _ in range(7)]
    # a ends at step 3 (still listed at 3 and 4), is no longer listed from 5, and joins again at 6
    assert masks == [[1, 1, 0], [1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]
    st = venv.step(np.zeros((1, 3), np.int64))  # step 8: all truncated, still listed: the episode ends
    assert st.env_done[0] and st.infos[0]["episode"]["l"] == 8
    result = evaluate_group(None, lambda: ListsEndedAgentsEnv(observe_ended=observe_ended), n_eval_episodes=1)
    assert result["episode_length"] == 8.0


class JoinRewardEnv(ScriptedEnv):
    """ScriptedEnv that pays agent c 5 in the step it joins (before it has acted)."""

    def step(self, actions):
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if self.t == 2:
            rewards["c"], terminations["c"], truncations["c"] = 5.0, False, False
        return observations, rewards, terminations, truncations, infos


def test_the_episode_return_counts_every_reward_the_env_paid_the_group():
    """Training's episode return (rollout/ep_rew_mean) sums what evaluate_group sums: every reward of the step,
    also one paid to an agent that has not acted yet."""
    venv = GroupVecEnv([lambda: JoinRewardEnv(end=5)])
    venv.reset(seed=0)
    steps = [venv.step(np.zeros((1, 3), np.int64)) for _ in range(5)]
    assert not steps[1].rewards[0, 2]  # the buffer's rewards are those of agents that acted
    st = steps[-1]
    assert st.env_done[0]
    # action 0 throughout: a 11 + 12 + 13, b 21 + ... + 25, c 5 on joining, then 33 + 34 + 35
    assert st.infos[0]["episode"]["r"] == 36 + 115 + 5 + 102
    env = JoinRewardEnv(end=5)
    model = type("Zeros", (), {"predict": lambda self, obs, **kw: ({a: 0 for a in obs}, None)})()
    assert evaluate_group(model, env, n_eval_episodes=1)["group_return"] == 36 + 115 + 5 + 102


def test_evaluate_group_takes_an_env_instance_and_leaves_it_open():
    env = ScriptedEnv(end=4)
    closed = []
    env.close = lambda: closed.append(True)
    result = evaluate_group(None, env, n_eval_episodes=2)
    assert result["episode_length"] == 4.0 and not closed
    made = ScriptedEnv(end=4)
    made.close = lambda: closed.append(True)
    evaluate_group(None, lambda: made, n_eval_episodes=1)
    assert closed == [True]  # an env it made is its to close


def test_evaluate_group_names_an_env_whose_spaces_are_not_the_models():
    """As set_env: a model is not played on an env of other spaces (it sent actions 3 and 4 to a Discrete(2) env)."""
    from covey import POCA

    model = POCA("MlpPolicy", ScriptedEnv, n_steps=8, batch_size=8)

    class TwoActions(ScriptedEnv):
        def action_space(self, agent):
            return spaces.Discrete(2)

    with pytest.raises(ValueError, match=r"Action spaces do not match: the model has Discrete\(3\), the env has"):
        evaluate_group(model, TwoActions, n_eval_episodes=1)
    assert evaluate_group(model, ScriptedEnv, n_eval_episodes=1)["episode_length"] == 5.0


class NoAgentsEnv(ScriptedEnv):
    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = []
        return {}, {}


def test_env_without_agents_after_reset_is_rejected():
    venv = GroupVecEnv([NoAgentsEnv])
    with pytest.raises(ValueError, match="no agents after reset"):
        venv.reset()


def test_copies_must_share_possible_agents():
    with pytest.raises(ValueError, match="same possible_agents"):
        GroupVecEnv([lambda: simple_spread_v3.parallel_env(N=3), lambda: simple_spread_v3.parallel_env(N=2)])


def test_not_an_env_is_a_type_error():
    with pytest.raises(TypeError, match="ParallelEnv"):
        GroupVecEnv([lambda: 42])
    with pytest.raises(ValueError, match="at least one"):
        GroupVecEnv([])


def test_make_group_env_needs_a_function_for_several_copies():
    env = simple_spread_v3.parallel_env(N=3)
    with pytest.raises(ValueError, match="function") as info:
        make_group_env(env, n_envs=2)
    assert "n_envs=2" in str(info.value)
    with pytest.raises(ValueError, match="function"):
        make_group_env(simple_spread_v3.env(N=3), n_envs=2)  # an AEC instance too
    one = make_group_env(env, n_envs=1)
    assert one.n_envs == 1 and one.envs[0] is env
    assert make_group_env(one, n_envs=4) is one  # a GroupVecEnv is used as it is
    venv = make_group_env(ScriptedEnv, n_envs=3)  # a class is a function that makes the env
    assert venv.n_envs == 3 and len({id(e) for e in venv.envs}) == 3


class ClassLevelAgentsEnv(ScriptedEnv):
    """possible_agents as a class attribute, as many hand-written PettingZoo envs declare it."""

    possible_agents = ["a", "b", "c"]

    def __init__(self, end: int = 5):
        super().__init__(end)


def test_make_group_env_accepts_a_class_with_class_level_possible_agents():
    venv = make_group_env(ClassLevelAgentsEnv, n_envs=2)
    assert venv.n_envs == 2 and all(isinstance(e, ClassLevelAgentsEnv) for e in venv.envs)


def test_aec_env_is_converted_to_parallel():
    """A function returning an AEC env gives the same steps as the package's parallel version."""
    venv = make_group_env(lambda: simple_spread_v3.env(N=3, max_cycles=5), 2)
    assert venv.n_envs == 2 and not any(hasattr(e, "agent_iter") for e in venv.envs)
    par = GroupVecEnv([lambda: simple_spread_v3.parallel_env(N=3, max_cycles=5)] * 2)
    np.testing.assert_array_equal(venv.reset(seed=4)[0], par.reset(seed=4)[0])
    rng = np.random.default_rng(1)
    for _ in range(6):
        actions = rng.integers(0, 5, (2, 3))
        a, b = venv.step(actions), par.step(actions)
        for x, y in zip(a[:-1], b[:-1]):
            np.testing.assert_array_equal(x, y)
        assert a.env_done.any() == b.env_done.any()
    assert as_parallel(par.envs[0]) is par.envs[0]


def test_a_turn_based_aec_env_is_refused_with_what_it_means():
    """PettingZoo's converter refuses an AEC env not marked parallelizable with an assertion about its wrapper;
    the group env says instead why such an env (its agents take turns) cannot be a group, and what to pass."""
    from pettingzoo.classic import tictactoe_v3

    with pytest.raises(ValueError, match=r"'tictactoe_v3' is an AEC env .*is_parallelizable.*take turns"):
        make_group_env(tictactoe_v3.env, n_envs=2)
    with pytest.raises(ValueError, match="is_parallelizable"):
        as_parallel(tictactoe_v3.env())
    from covey import POCA

    with pytest.raises(ValueError, match="parallel_env where it has one"):
        POCA("MlpPolicy", tictactoe_v3.env)


class OffApiEnv(ScriptedEnv):
    """ScriptedEnv with one way of breaking PettingZoo's parallel API, as custom envs (or ones written for
    PettingZoo before 1.22) often do."""

    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault

    def reset(self, seed=None, options=None):
        observations, infos = super().reset(seed=seed)
        if self.fault == "reset_observations_only":
            return observations
        if self.fault == "wrong_shape":
            observations["b"] = np.zeros(4, np.float32)
        return observations, infos

    def step(self, actions):
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if self.fault == "step_dones":  # one done flag per agent, before terminations and truncations
            dones = {a: terminations[a] or truncations[a] for a in terminations}
            return observations, rewards, dones, infos
        if self.fault == "missing_observation":
            del observations["b"]
        if self.fault == "array_reward":  # passes parallel_api_test
            rewards = {agent: np.array([r], np.float32) for agent, r in rewards.items()}
        return observations, rewards, terminations, truncations, infos


class NoSeedEnv(ScriptedEnv):
    def reset(self):
        return super().reset()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: OffApiEnv("reset_observations_only"), r"reset\(\) returned one dict, not \(observations, infos\)"),
        (lambda: OffApiEnv("step_dones"), r"step\(\) returned 4 values, not 5"),
        (lambda: OffApiEnv("wrong_shape"), r"gave agent 'b' an observation of shape \(4,\) that does not fit"),
        (
            lambda: OffApiEnv("missing_observation"),
            r"step\(\) gave no observation for 'b', which env.agents lists as live \(observations for \['a'\]\)",
        ),
        (NoSeedEnv, r"reset\(\) takes no seed argument"),
        (
            lambda: OffApiEnv("array_reward"),
            r"step\(\) gave agent 'a' the reward array\(\[.*\].*\) of shape \(1,\), which is not a number",
        ),
    ],
)
def test_an_env_off_the_parallel_api_gets_an_error_that_names_the_fault_and_the_api(make, message):
    """Instead of an unpacking, indexing or broadcasting error from inside the group env."""
    venv = GroupVecEnv([make, make])
    with pytest.raises(ValueError, match=message) as info:
        venv.reset(seed=0)
        venv.step(np.zeros((2, 3), dtype=np.int64))
    assert "(observations, rewards, terminations, truncations, infos)" in str(info.value)
    assert "parallel_api_test" in str(info.value)


class LeavesOffApiEnv(ScriptedEnv):
    """ScriptedEnv (a terminates at step 3) whose step breaks the API where agents leave: ``fault``."""

    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault

    def step(self, actions):
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if self.fault == "final observation of shape (1,)" and self.t == 3:
            observations["a"] = np.array([7.0], np.float32)  # NumPy broadcast it into a's slot as [7, 7, 7]
        elif self.fault == "final observation of shape (5,)" and self.t == 3:
            observations["a"] = np.zeros(5, np.float32)  # NumPy's "could not broadcast" came out bare
        elif self.fault == "a reward None to an agent that ended" and self.t == 4:
            rewards["a"] = None  # Python's TypeError from the episode return's sum
        elif self.fault == "a reward array to an agent that ended" and self.t == 4:
            rewards["a"] = np.array([1.0, 2.0])
        elif self.fault == "a final observation of text" and self.t == 3:
            observations["a"] = np.array(["x", "y", "z"])
        elif self.fault == "an observation of text" and self.t == 1:
            observations["b"] = np.array(["x", "y", "z"])
        elif self.fault == "left without flags" and self.t == 2:
            self.agents.remove("b")  # terminations and truncations both False: read as the group's true end
        return observations, rewards, terminations, truncations, infos


@pytest.mark.parametrize(
    "fault, message",
    [
        (
            "final observation of shape (1,)",
            r"step\(\) gave agent 'a' a final observation \(in the step that ended it\) of shape \(1,\) that "
            r"does not fit observation_space\('a'\) = Box\(-100.0, 100.0, \(3,\), float32\)",
        ),
        ("final observation of shape (5,)", r"gave agent 'a' a final observation .* of shape \(5,\) that does not"),
        ("a final observation of text", r"gave agent 'a' a final observation .* of shape \(3,\) that does not fit"),
        ("an observation of text", r"gave agent 'b' an observation of shape \(3,\) that does not fit .*could not"),
        ("a reward None to an agent that ended", r"step\(\) gave agent 'a' the reward None, which is not a number"),
        ("a reward array to an agent that ended", r"gave agent 'a' the reward array\(.*\) of shape \(2,\), which is"),
        (
            "left without flags",
            r"step\(\) took agent 'b' out of env.agents with its terminations and truncations flags both False",
        ),
    ],
)
def test_an_agent_leaving_off_the_api_is_named(fault, message):
    """Where an agent leaves, its final observation, a later reward paid to it and its flags are checked as a live
    agent's are: each trained on silently (a (1,) observation spread over the slot, an agent gone without a flag
    taken for the group's true end) or failed with NumPy's or Python's error from inside the group env."""
    venv = GroupVecEnv([lambda: LeavesOffApiEnv(fault)])
    venv.reset(seed=0)
    with pytest.raises(ValueError, match=message) as info:
        for _ in range(4):
            venv.step(np.zeros((1, 3), np.int64))
    assert "parallel_api_test" in str(info.value)


def test_an_env_keeping_to_the_api_where_agents_leave_steps_on_with_their_final_observations():
    """The checks above refuse nothing that keeps to the API: a's final observation is its own, a later reward
    paid to it as a NumPy number counts in the group return, as the live agents' do."""

    class RewardAfterLeaving(ScriptedEnv):
        def step(self, actions):
            observations, rewards, terminations, truncations, infos = super().step(actions)
            if self.t == 4:
                rewards["a"] = np.float32(2.5)
            return observations, rewards, terminations, truncations, infos

    venv = GroupVecEnv([RewardAfterLeaving])
    venv.reset(seed=0)
    total = 0.0
    for t in range(1, 6):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the reward paid to an agent that ended is warned of
            step = venv.step(np.zeros((1, 3), np.int64))
        total += float(step.rewards.sum())
        if t == 3:
            assert step.left[0].tolist() == [True, False, False]
            np.testing.assert_array_equal(step.final_observations[0, 0], [1, 3, 7])
    assert step.env_done[0]
    assert step.infos[0]["episode"]["r"] == pytest.approx(total + 2.5)


def test_an_action_mask_in_the_infos_is_warned_of_once_and_render_mode_is_the_envs():
    """A mask in the infos was never read, without a word (one in Dict observations is warned of); and SB3's
    VecEnv attribute render_mode was missing (get_attr('render_mode') had it)."""

    class MaskInInfos(ScriptedEnv):
        def step(self, actions):
            out = super().step(actions)
            for info in out[4].values():
                info["action_mask"] = np.array([1, 0, 1], np.int8)
            return out

    venv = GroupVecEnv([MaskInInfos])
    venv.reset(seed=0)
    with pytest.warns(UserWarning, match=r"infos hold an 'action_mask', but covey's policies do not mask") as w:
        venv.step(np.zeros((1, 3), np.int64))
        venv.step(np.zeros((1, 3), np.int64))
    assert len([x for x in w if "action_mask" in str(x.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = GroupVecEnv([ScriptedEnv])
        plain.reset(seed=0)
        plain.step(np.zeros((1, 3), np.int64))
    assert plain.render_mode is None
    drawn = GroupVecEnv([lambda: simple_spread_v3.parallel_env(render_mode="rgb_array")])
    assert drawn.render_mode == "rgb_array" == drawn.get_attr("render_mode")[0]
    subproc = SubprocGroupVecEnv([lambda: simple_spread_v3.parallel_env(render_mode="rgb_array")], n_processes=1)
    assert subproc.render_mode == "rgb_array"
    for env in (drawn, subproc):
        env.close()


def test_evaluate_group_names_a_reward_that_is_no_number():
    with pytest.raises(ValueError, match=r"gave agent 'a' the reward array\(\[.*\].*\) of shape \(1,\)"):
        evaluate_group(None, lambda: OffApiEnv("array_reward"), n_eval_episodes=1)


class PossibleAgentsAtReset(ScriptedEnv):
    def __init__(self):
        pass  # possible_agents only once reset() runs

    def reset(self, seed=None, options=None):
        super().__init__()
        return super().reset(seed=seed)


@pytest.mark.parametrize(
    "env, message",
    [
        (PossibleAgentsAtReset, r"got PossibleAgentsAtReset, which has step\(\) and reset\(\) but no possible_agents"),
        (lambda: __import__("gymnasium").make("CartPole-v1"), r"a Gymnasium env: .* trains with covey's PPO or SAC"),
        (
            lambda: simple_spread_v3,
            r"\(the module mpe2.simple_spread_v3\): pass its env function, e.g. simple_spread_v3",
        ),
    ],
    ids=["possible_agents at reset", "gymnasium env", "module"],
)
def test_what_is_no_parallel_env_is_named_with_what_to_pass(env, message):
    with pytest.raises(TypeError, match=message):
        GroupVecEnv([env])


def test_an_evaluation_given_poca_env_copies_says_to_pass_the_env_function():
    from covey import POCA

    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=8, batch_size=16)
    with pytest.raises(TypeError, match=r"not POCA's env copies \(GroupVecEnv, what model.get_env\(\) returns\)"):
        evaluate_group(model, model.get_env())


# ---------------------------------------------------------------------------------------------- seeding, EarlyExit
def test_early_exit_env_group_return_and_seeding():
    venv = GroupVecEnv([EarlyExitEnv] * 2)
    obs0, mask0 = venv.reset(seed=0)
    obs1, mask1 = venv.reset(seed=0)
    np.testing.assert_array_equal(obs0, obs1)
    np.testing.assert_array_equal(mask0, mask1)
    assert obs0.shape == (2, 3, 5) and mask0.all()
    # Copy 0: agent_0 presses at once (the best play); copy 1: nobody presses.
    actions = np.array([[1, 0, 0], [0, 0, 0]])
    for t in range(1, 9):
        st = venv.step(actions)
        if t == 1:
            np.testing.assert_array_equal(st.left, [[1, 0, 0], [0, 0, 0]])
            np.testing.assert_array_equal(st.terminated, st.left)
            np.testing.assert_array_equal(st.mask, [[0, 1, 1], [1, 1, 1]])
            assert st.final_observations[0, 0, -2] == 1.0  # it saw the switch pressed
        else:  # from the step after the press, each agent still in the room gets the group's size
            np.testing.assert_array_equal(st.rewards, [[0, 2, 2], [0, 0, 0]])
        if t < 8:
            np.testing.assert_array_equal(st.mask, [[0, 1, 1], [1, 1, 1]])
            assert not st.env_done.any()
    assert st.env_done.all()
    np.testing.assert_array_equal(st.truncated, [[0, 1, 1], [1, 1, 1]])
    best = EarlyExitEnv().best_group_return
    episode = st.infos[0]["episode"]
    assert episode["r"] == best == 27.5 and episode["l"] == 8 and episode["r_agent"] == pytest.approx(best / 3)
    assert st.infos[1]["episode"]["r"] == 0.0
    assert st.mask.all()


def test_seed_method_and_reset_seed_on_a_random_env():
    venv = GroupVecEnv([lambda: simple_spread_v3.parallel_env(N=3)] * 2)
    a, _ = venv.reset(seed=5)
    b, _ = venv.reset(seed=5)
    np.testing.assert_array_equal(a, b)
    venv.seed(5)
    c, _ = venv.reset()
    np.testing.assert_array_equal(a, c)
    d, _ = venv.reset()  # the seed is used once
    assert not np.array_equal(a, d)
    e, _ = venv.reset(seed=6)
    np.testing.assert_array_equal(e[0], a[1])  # copy i gets seed + i


# ---------------------------------------------------------------------------------------------- SuperSuit
def test_supersuit_wrappers_keep_working():
    # reward_lambda_v0 on a parallel env: rewards (and the group return) are doubled.
    venv = GroupVecEnv([lambda: supersuit.reward_lambda_v0(EarlyExitEnv(), lambda r: 2 * r)] * 2)
    venv.reset(seed=0)
    for _ in range(8):
        st = venv.step(np.array([[1, 0, 0], [0, 0, 0]]))
    assert st.env_done.all()
    assert st.infos[0]["episode"]["r"] == 2 * EarlyExitEnv().best_group_return
    # normalize_obs_v0 maps KAZ's [-1, 1] observations to [0, 1]: (obs + 1) / 2 for every live agent.
    plain = GroupVecEnv([lambda: _make_kaz()])
    normalized = GroupVecEnv([lambda: supersuit.normalize_obs_v0(_make_kaz())])
    assert normalized.observation_space.low.min() == 0.0
    p_obs, p_mask = plain.reset(seed=2)
    n_obs, n_mask = normalized.reset(seed=2)
    np.testing.assert_allclose(n_obs[p_mask], (p_obs[p_mask] + 1) / 2, atol=1e-6)
    rng = np.random.default_rng(2)
    for _ in range(30):
        actions = rng.integers(0, 6, (1, 4))
        p, n = plain.step(actions), normalized.step(actions)
        np.testing.assert_array_equal(p.mask, n.mask)
        np.testing.assert_allclose(n.observations[p.mask], (p.observations[p.mask] + 1) / 2, atol=1e-6)
    # dtype_v0 to float64: the stored observations stay float32 with the same values.
    f64 = GroupVecEnv([lambda: supersuit.dtype_v0(simple_spread_v3.parallel_env(N=3), np.float64)])
    f32 = GroupVecEnv([lambda: simple_spread_v3.parallel_env(N=3)])
    assert f64.observation_space.dtype == np.float64
    x, _ = f64.reset(seed=1)
    y, _ = f32.reset(seed=1)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "n_copies, n_processes, workers",
    [(2, None, 2), (5, 3, 2), (5, 2, 1), (3, 1, 0)],
    ids=["a-worker-per-copy", "blocks-2-2-1", "blocks-3-2", "all-here"],
)
def test_subprocess_copies_step_exactly_like_in_process_ones(n_copies, n_processes, workers):
    """SubprocGroupVecEnv returns what GroupVecEnv returns, step for step: with a worker process per copy, and
    with ``n_processes`` blocks of copies, the first stepped in this process (copy i seeded seed + i either way)."""

    def make():
        return simple_spread_v3.parallel_env(N=3, max_cycles=5)

    remote, local = SubprocGroupVecEnv([make] * n_copies, n_processes=n_processes), GroupVecEnv([make] * n_copies)
    try:
        assert len(remote.processes) == workers and all(p.is_alive() for p in remote.processes)
        for x, y in zip(remote.reset(seed=3), local.reset(seed=3)):
            np.testing.assert_array_equal(x, y)
        rng = np.random.default_rng(0)
        for _ in range(12):  # crosses two auto-resets
            actions = rng.integers(0, 5, (n_copies, 3))
            a, b = remote.step(actions), local.step(actions)
            for name in a._fields[:-1]:
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
            assert [i.get("episode", {}).get("l") for i in a.infos] == [i.get("episode", {}).get("l") for i in b.infos]
            assert [i["agents"] for i in a.infos] == [i["agents"] for i in b.infos]
        assert remote.num_envs == n_copies and remote.agent_ids == local.agent_ids
    finally:
        remote.close()
    assert not any(p.is_alive() for p in remote.processes)


class FailsAtStepEnv(EarlyExitEnv):
    """EarlyExitEnv whose copies fail at their third step where ``fail`` is set (an attribute SB3's set_attr sets)."""

    fail = False

    def step(self, actions):
        self.steps = getattr(self, "steps", 0) + 1
        if self.fail and self.steps == 3:
            raise RuntimeError(f"the simulator of copy {self.copy} diverged")
        return super().step(actions)


@pytest.mark.parametrize("failing", [0, 2], ids=["in-this-process", "in-a-worker"])
def test_an_env_error_in_any_block_is_raised_here_and_the_copies_stay_usable(failing):
    """A copy's exception reaches the caller, from a worker too (with the worker's traceback in a note), and
    every block's answer is read, so the next calls get their own answers."""

    venv = SubprocGroupVecEnv([FailsAtStepEnv] * 3, n_processes=2)  # copies 0 and 1 here, 2 in a worker
    try:
        venv.set_attr("copy", 0, indices=0)
        venv.set_attr("copy", 1, indices=1)
        venv.set_attr("copy", 2, indices=2)
        venv.set_attr("fail", True, indices=failing)
        venv.reset(seed=0)
        actions = np.zeros((3, 3), np.int64)
        venv.step(actions)
        venv.step(actions)
        with pytest.raises(RuntimeError, match=f"simulator of copy {failing} diverged") as info:
            venv.step(actions)
        in_worker = any("Raised in an env worker process" in note for note in getattr(info.value, "__notes__", []))
        assert in_worker == (failing == 2)
        assert venv.get_attr("copy") == [0, 1, 2] and venv.get_attr("steps", indices=[2, 0]) == [3, 3]
    finally:
        venv.close()


class InterruptedAtStepEnv(EarlyExitEnv):
    """EarlyExitEnv counting its steps, interrupted (Ctrl-C in this process) at a step where ``interrupt`` is set."""

    interrupt = False
    steps = 0

    def step(self, actions):
        if self.interrupt:
            raise KeyboardInterrupt
        self.steps += 1
        return super().step(actions)


def test_ctrl_c_while_this_process_steps_its_block_leaves_no_answer_behind():
    """A KeyboardInterrupt while this process steps its own block (where it spends a step's time) cuts the step
    short before the worker's answer is read. The next calls read their own answers, not that one."""

    venv = SubprocGroupVecEnv([InterruptedAtStepEnv] * 3, n_processes=2)  # copies 0 and 1 here, 2 in a worker
    try:
        before = venv.reset(seed=0)
        actions = np.zeros((3, 3), np.int64)
        venv.set_attr("interrupt", True, indices=0)
        with pytest.raises(KeyboardInterrupt):
            venv.step(actions)
        assert venv.get_attr("steps") == [0, 0, 1]  # the worker's copy stepped; this process's did not
        venv.set_attr("interrupt", False, indices=0)
        step = venv.step(actions)
        # copy 0, cut short, ends its episode and resets without stepping (as GroupVecEnv settles one), and so does
        # copy 2, whose step the caller never saw; copy 1, not reached, steps
        assert step.env_done.tolist() == [True, False, True] and venv.get_attr("steps") == [0, 1, 1]
        assert step.left[2].all() and np.array_equal(step.final_observations[2], before[0][2])  # as the caller saw it
    finally:
        venv.close()


def step_on_after_the_interrupt(venv, actions) -> None:
    """The env steps on after a KeyboardInterrupt (within 20 s): a copy cut short ends its episode at the first
    step, and each answer after it is its call's own."""

    def stuck(signum, frame):
        raise TimeoutError("the env waited 20 s for a worker's answer")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        venv.step(actions)
        before = venv.get_attr("steps")
        for _ in range(2):
            venv.step(actions)
        assert venv.get_attr("steps") == [n + 2 for n in before]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal: a test run started in the background by a
    shell without job control (``pytest ... &``) inherits SIGINT ignored, and Python then keeps it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("raised", [False, True], ids=["sigint", "raised"])
@pytest.mark.parametrize("when", ["reading", "sending"])
def test_ctrl_c_while_a_workers_message_is_read_or_sent_leaves_the_pipe_in_step(
    monkeypatch, when, raised, sigint_raises
):
    """Ctrl-C landing just after a worker's answer was taken off the pipe (while it is unpickled), or just after a
    command was written to it, before the count of answers owed follows: the env resynchronizes with the worker
    at its next command and goes on stepping (it waited for an answer already read, for ever, before). As a
    SIGINT, and as a KeyboardInterrupt raised right there."""
    import multiprocessing.connection

    armed = {"on": False}
    pickler = multiprocessing.connection._ForkingPickler
    original = pickler.loads if when == "reading" else pickler.dumps

    def then_ctrl_c(*args, **kwargs):
        out = original(*args, **kwargs)
        if armed["on"]:
            armed["on"] = False
            if raised:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGINT)
        return out

    venv = SubprocGroupVecEnv([InterruptedAtStepEnv] * 2, n_processes=2)
    try:
        monkeypatch.setattr(pickler, "loads" if when == "reading" else "dumps", staticmethod(then_ctrl_c))
        venv.reset(seed=0)
        actions = np.zeros((2, 3), np.int64)
        armed["on"] = True
        with pytest.raises(KeyboardInterrupt):
            venv.step(actions)
        step_on_after_the_interrupt(venv, actions)
    finally:
        venv.close()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_in_the_middle_of_a_message_waits_for_its_end(monkeypatch, sigint_raises):
    """Ctrl-C landing after an answer's 4-byte length was read and before its body: the KeyboardInterrupt left
    the body on the pipe, the next read took it for a message, and the env reported its worker lost ("ended
    without answering") while it ran on. The answer is now read whole first, then the KeyboardInterrupt is
    raised, and the env goes on stepping."""
    import multiprocessing.connection

    connection = multiprocessing.connection.Connection
    armed = {"on": False}
    original = connection._recv

    def ctrl_c_between_length_and_body(self, size, *args, **kwargs):
        out = original(self, size, *args, **kwargs)
        if armed["on"] and size == 4:
            armed["on"] = False
            os.kill(os.getpid(), signal.SIGINT)
        return out

    venv = SubprocGroupVecEnv([InterruptedAtStepEnv] * 2, n_processes=2)
    try:
        venv.reset(seed=0)
        monkeypatch.setattr(connection, "_recv", ctrl_c_between_length_and_body)
        actions = np.zeros((2, 3), np.int64)
        armed["on"] = True
        with pytest.raises(KeyboardInterrupt):
            venv.step(actions)
        assert not armed["on"]
        step_on_after_the_interrupt(venv, actions)
    finally:
        venv.close()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_reaching_a_worker_leaves_its_copies_running():
    """Ctrl-C in a terminal reaches every process of the group: the workers let the training process decide,
    so a run that catches the KeyboardInterrupt can go on with the same env."""

    venv = SubprocGroupVecEnv([InterruptedAtStepEnv] * 3, n_processes=2)
    try:
        venv.reset(seed=0)
        os.kill(venv.processes[0].pid, signal.SIGINT)
        time.sleep(0.5)
        assert venv.processes[0].is_alive()
        venv.step(np.zeros((3, 3), np.int64))
        assert venv.get_attr("steps") == [1, 1, 1]
    finally:
        venv.close()


class BrokenEnv(EarlyExitEnv):
    def __init__(self):
        raise FileNotFoundError("no map named 'arena_7'")


def test_an_env_that_fails_to_build_in_a_worker_fails_the_constructor_with_its_error():

    with pytest.raises(FileNotFoundError, match="arena_7") as info:
        SubprocGroupVecEnv([EarlyExitEnv, BrokenEnv], n_processes=2)
    assert any("Raised in an env worker process" in note for note in info.value.__notes__)


def test_an_env_off_the_api_in_a_worker_is_named_in_this_process():

    venv = SubprocGroupVecEnv([ScriptedEnv, lambda: OffApiEnv("step_dones")], n_processes=2)
    try:
        venv.reset(seed=0)
        with pytest.raises(ValueError, match=r"step\(\) returned 4 values, not 5"):
            venv.step(np.zeros((2, 3), np.int64))
    finally:
        venv.close()


class DiesAtStepEnv(EarlyExitEnv):
    """EarlyExitEnv whose process is killed (as the system kills one out of memory) at a step once ``die`` is set."""

    die = False

    def step(self, actions):
        if self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(actions)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
@pytest.mark.parametrize("when", ["in-a-step", "between-calls"])
def test_a_worker_killed_mid_run_is_named_with_its_signal_and_the_env_is_closed(when):
    """Killed while it steps (this process waits for its answer) or between calls (this process writes to it)."""
    from covey.wrappers.group_env import WorkerLost

    venv = SubprocGroupVecEnv([DiesAtStepEnv] * 3, n_processes=2)  # copies 0 and 1 here, 2 in a worker
    try:
        venv.reset(seed=0)
        if when == "in-a-step":
            venv.set_attr("die", True, indices=2)
        else:
            os.kill(venv.processes[0].pid, signal.SIGKILL)
            venv.processes[0].join(timeout=10)
        actions = np.zeros((3, 3), np.int64)
        with pytest.raises(
            WorkerLost, match=r"\(env copy 2\) ended without answering \(killed by signal SIGKILL\)"
        ) as lost:
            venv.step(actions)
        assert (lost.value.copies, lost.value.how) == ("copy 2", "killed by signal SIGKILL")
        assert venv.closed and not venv.processes[0].is_alive()
        with pytest.raises(RuntimeError, match="This SubprocGroupVecEnv is closed"):
            venv.step(actions)
    finally:
        venv.close()


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """Worker processes start with forkserver, which runs the script's top level again in each worker; there it
    cannot start processes of its own, and the worker exits. The script's error says what to change."""
    script = tmp_path / "train.py"
    script.write_text(
        "from covey.envs import EarlyExitEnv\n"
        "from covey.wrappers.group_env import SubprocGroupVecEnv\n"
        "SubprocGroupVecEnv([EarlyExitEnv] * 2, n_processes=2)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        "covey.wrappers.group_env.WorkerLost: An env worker process of SubprocGroupVecEnv (env copy 1) "
    )
    assert "before it answered (exit code 1)" in last_line
    assert 'under `if __name__ == "__main__":`' in last_line and 'start_method="fork"' in last_line


@pytest.mark.parametrize("n_processes", [0, 4, 1.5, "2"])
def test_n_processes_out_of_range_is_refused(n_processes):

    with pytest.raises(
        ValueError, match=r"n_processes must be a whole number from 1 to the number of env copies \(3\)"
    ):
        SubprocGroupVecEnv([EarlyExitEnv] * 3, n_processes=n_processes)


class LevelEnv(EarlyExitEnv):
    """EarlyExitEnv with an attribute and a method for SB3's env calls."""

    level = 0

    def bump(self, by: int, times: int = 1) -> int:
        self.level += by * times
        return self.level


@pytest.mark.parametrize("workers", [False, True, 2], ids=["in-process", "subprocess", "blocks-here-and-a-worker"])
def test_sb3s_env_calls_reach_every_copy_or_those_asked(workers):

    if workers is False:
        venv = GroupVecEnv([LevelEnv] * 3)
    else:  # with n_processes=2: copies 0 and 1 in this process, 2 in a worker
        venv = SubprocGroupVecEnv([LevelEnv] * 3, n_processes=None if workers is True else workers)
    try:
        assert venv.get_attr("level") == [0, 0, 0]
        venv.set_attr("level", 4, indices=[0, 2])
        assert venv.get_attr("level") == [4, 0, 4] and venv.get_attr("level", indices=1) == [0]
        assert venv.env_method("bump", 2, times=3) == [10, 6, 10]
        assert venv.env_method("bump", 1, indices=[1]) == [7]
        assert venv.get_attr("possible_agents", indices=0) == [["agent_0", "agent_1", "agent_2"]]
    finally:
        venv.close()


@pytest.mark.parametrize("workers", [False, 2], ids=["in-process", "blocks-here-and-a-worker"])
def test_sb3s_env_calls_reach_the_env_under_pettingzoos_wrappers(workers):
    """mpe2's parallel_env() is a conversion wrapper around an order-enforcing wrapper around the env: get_attr and
    env_method look through them as SB3's look through Gymnasium's wrappers (an AttributeError before), and
    set_attr sets the env's own attribute, which it reads (it landed on the outer wrapper, which nothing reads)."""

    def make():
        return simple_spread_v3.parallel_env(N=3, max_cycles=25)

    venv = GroupVecEnv([make] * 3) if workers is False else SubprocGroupVecEnv([make] * 3, n_processes=workers)
    try:
        assert venv.get_attr("max_cycles") == [25, 25, 25]
        venv.set_attr("max_cycles", 3, indices=[0, 2])
        assert venv.get_attr("max_cycles") == [3, 25, 3]
        venv.reset(seed=0)
        observed = venv.env_method("observe", "agent_1", indices=[2])  # a method of the env itself
        assert len(observed) == 1 and observed[0].shape == (18,)
        actions = np.zeros((3, 3), np.int64)
        ended = [venv.step(actions).env_done.copy() for _ in range(3)]
        np.testing.assert_array_equal(np.array(ended), [[False] * 3, [False] * 3, [True, False, True]])
        with pytest.raises(AttributeError, match="and the envs it wraps have no attribute 'no_such_thing'"):
            venv.get_attr("no_such_thing")
    finally:
        venv.close()


def test_a_callback_changes_the_training_envs_through_set_attr():
    """A curriculum callback as SB3 users write one: ``self.training_env.set_attr`` before training reaches
    the copies POCA steps (pressing the switch then costs 5 instead of 0.5)."""
    from stable_baselines3.common.callbacks import BaseCallback

    from covey import POCA

    class Harder(BaseCallback):
        def _on_training_start(self) -> None:
            self.training_env.set_attr("press_cost", 5.0)

        def _on_step(self) -> bool:
            return True

    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0)
    model.learn(32, callback=Harder())
    rewards = model.rollout_buffer.rewards
    assert model.get_env().get_attr("press_cost") == [5.0, 5.0]
    assert (rewards == -5.0).any() and not (rewards == -0.5).any()


class InPlaceInfosEnv(ParallelEnv):
    """Two agents whose infos are one dict, with an array, that the env updates in place every step."""

    metadata = {"name": "in_place_infos_v0"}

    def __init__(self):
        self.possible_agents = ["a", "b"]
        self.agents = []
        self.infos = {agent: {"t": 0, "position": np.zeros(2)} for agent in self.possible_agents}

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {agent: np.zeros(2, np.float32) for agent in self.agents}, self.infos

    def step(self, actions):
        self.t += 1
        for info in self.infos.values():
            info["t"] = self.t
            info["position"][:] = self.t
        obs = {agent: np.zeros(2, np.float32) for agent in self.agents}
        zeros = {agent: False for agent in self.agents}
        return obs, {agent: 0.0 for agent in self.agents}, zeros, zeros, self.infos


def test_each_steps_agent_infos_are_its_own():
    """A callback that keeps ``infos[e]["agents"]`` keeps each step's, as with SB3's DummyVecEnv's copies."""
    venv = GroupVecEnv([InPlaceInfosEnv])
    venv.reset(seed=0)
    kept = [venv.step(np.zeros((1, 2), np.int64)).infos[0]["agents"] for _ in range(3)]
    assert [info["a"]["t"] for info in kept] == [1, 2, 3]
    assert [info["b"]["position"][0] for info in kept] == [1, 2, 3]


def test_an_agent_reported_terminated_and_truncated_has_terminated():
    """As in Gymnasium (and covey's vector env for single agents): a terminal step at the time limit is a
    terminal. ScriptedEnv(end=3) terminates a at step 3, the step that truncates everyone."""
    venv = GroupVecEnv([lambda: ScriptedEnv(end=3)])
    venv.reset(seed=0)
    for _ in range(3):
        st = venv.step(np.zeros((1, 3), np.int64))
    np.testing.assert_array_equal(st.terminated[0], [True, False, False])
    np.testing.assert_array_equal(st.truncated[0], [False, True, True])


class OneStepTeam(ParallelEnv):
    """Two agents paid 1 each in one-step episodes, ended ``flags`` ("terminated", "truncated" or both); a
    ``stranger`` in the agents' list after reset, or a reward paid to "team" as well."""

    metadata = {"name": "one_step_team_v0"}

    def __init__(self, flags=("terminated",), stranger=False, team_reward=0.0):
        self.possible_agents = ["a", "b"]
        self.agents = []
        self.flags, self.stranger, self.team_reward = flags, stranger, team_reward

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = ["a", "b", "zombie_7"] if self.stranger else ["a", "b"]
        return {agent: np.zeros(2, np.float32) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions):
        agents, self.agents = self.agents, []
        rewards = {agent: 1.0 for agent in agents}
        if self.team_reward:
            rewards["team"] = self.team_reward
        ended = {agent: True for agent in agents}
        never = {agent: False for agent in agents}
        term = ended if "terminated" in self.flags else never
        trunc = ended if "truncated" in self.flags else never
        return {a: np.zeros(2, np.float32) for a in agents}, rewards, term, trunc, {a: {} for a in agents}


@pytest.mark.parametrize("flags", [("terminated",), ("terminated", "truncated"), ("truncated",)])
def test_poca_bootstraps_only_what_was_truncated_and_not_terminated(flags):
    from covey import POCA

    model = POCA("MlpPolicy", lambda: OneStepTeam(flags), n_steps=4, batch_size=4, n_epochs=1, seed=0).learn(4)
    returns = model.rollout_buffer.returns[:, 0, :]
    if "terminated" in flags:  # no future: the return is the reward alone
        np.testing.assert_allclose(returns, 1.0, rtol=0, atol=1e-6)
    else:  # a time limit: bootstrapped from the value of what would come next
        assert np.abs(returns - 1.0).min() > 1e-4


def test_env_copies_that_are_one_object_and_agents_off_possible_agents_are_named():
    env = OneStepTeam()
    with pytest.raises(ValueError, match="returned the same env object"):
        GroupVecEnv([lambda: env, lambda: env])
    with pytest.raises(ValueError, match="lists agent 'zombie_7', which is not one of possible_agents"):
        GroupVecEnv([lambda: OneStepTeam(stranger=True)]).reset(seed=0)


def test_a_reward_paid_under_a_key_that_is_no_agent_counts_in_the_group_return_as_in_evaluate_group():
    venv = GroupVecEnv([lambda: OneStepTeam(team_reward=10.0)])
    venv.reset(seed=0)
    st = venv.step(np.zeros((1, 2), np.int64))
    assert st.infos[0]["episode"]["r"] == 12.0
    np.testing.assert_array_equal(st.rewards[0], [1.0, 1.0])  # what the agents train on is theirs alone

    class Zeros:
        def predict(self, observation, state=None, episode_start=None, deterministic=True):
            return {agent: 0 for agent in observation}, state

    assert evaluate_group(Zeros(), lambda: OneStepTeam(team_reward=10.0), n_eval_episodes=2)["group_return"] == 12.0


class ReversedTeam(OneStepTeam):
    """OneStepTeam with its possible_agents in the other order (as an env listing a set's agents may have them in
    another process)."""

    def __init__(self):
        super().__init__()
        self.possible_agents = ["b", "a"]


@pytest.mark.parametrize("n_processes", [None, 2])
def test_copies_of_other_agents_in_a_worker_are_refused_as_in_one_process(n_processes):
    """Each worker's copies fill the slots in their own possible_agents' order: another order would put their
    observations in other slots, so it is refused, as GroupVecEnv refuses it."""

    with pytest.raises(ValueError, match="same possible_agents"):
        GroupVecEnv([OneStepTeam, ReversedTeam])
    with pytest.raises(ValueError, match="same possible_agents, in the same order"):
        SubprocGroupVecEnv([OneStepTeam, ReversedTeam], n_processes=n_processes)


def test_a_closed_subprocess_env_says_so_and_one_in_use_refuses_copies():
    """After close, calls name the closed env (BrokenPipeError before); copying a model on one is refused before
    any pipe is copied (a half-made copy closed the original's pipes when collected, so it could not train)."""
    import copy
    import pickle

    from covey import POCA

    venv = SubprocGroupVecEnv([EarlyExitEnv] * 2, n_processes=2)
    model = POCA("MlpPolicy", venv, n_steps=8, batch_size=16, seed=0)
    try:
        for copier in (copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="SubprocGroupVecEnv cannot be copied or pickled.*POCA.load"):
                copier(model)
        model.learn(16)  # the original is whole
        assert model.num_timesteps == 16
    finally:
        venv.close()
    venv.close()  # twice is fine
    for call in (lambda: venv.reset(seed=0), lambda: venv.get_attr("n_agents"), lambda: model.learn(16)):
        with pytest.raises(RuntimeError, match="This SubprocGroupVecEnv is closed.*model.set_env"):
            call()


class FlakyResetEnv(EarlyExitEnv):
    """EarlyExitEnv whose reset raises once, when ``fail_at_reset`` resets have been made, after setting agents."""

    fail_at_reset = None

    def __init__(self):
        super().__init__()
        self.resets = self.steps = 0

    def reset(self, seed=None, options=None):
        out = super().reset(seed=seed, options=options)
        self.resets += 1
        if self.resets == self.fail_at_reset:
            raise OSError("transient failure loading the level")
        return out

    def step(self, actions):
        self.steps += 1
        return super().step(actions)


def test_a_copy_whose_reset_or_step_was_cut_short_ends_its_episode_and_resets_at_the_next_step(monkeypatch):
    """An exception (or an interrupt) inside a copy's automatic reset left its mask empty while the env listed agents:
    every later step gave the env no actions, and learn(reset_num_timesteps=False) failed for good. The next step
    now ends the episode the caller saw (its agents leave, truncated) and resets the copy, without stepping it."""
    monkeypatch.setattr(FlakyResetEnv, "fail_at_reset", 2)  # the first automatic reset
    venv = GroupVecEnv([FlakyResetEnv, EarlyExitEnv])
    obs, mask = venv.reset(seed=0)
    everyone_presses = np.ones((2, 3), np.int64)  # every agent leaves: the episode ends, the copy resets
    with pytest.raises(OSError, match="transient failure"):
        venv.step(everyone_presses)
    flaky = venv.envs[0]
    steps = flaky.steps
    out = venv.step(np.zeros((2, 3), np.int64))
    assert flaky.steps == steps and flaky.resets == 3  # reset again, not stepped
    assert out.env_done[0] and out.left[0].all() and out.truncated[0].all()
    np.testing.assert_array_equal(out.final_observations[0], obs[0])  # what the caller last saw of it
    assert out.mask[0].all() and flaky.agents == flaky.possible_agents
    assert not out.env_done[1]
    venv.step(np.zeros((2, 3), np.int64))
    assert flaky.steps == steps + 1  # stepped as usual from there


def test_poca_goes_on_after_an_exception_in_an_envs_reset(monkeypatch):
    from covey import POCA

    monkeypatch.setattr(FlakyResetEnv, "fail_at_reset", 4)
    env = GroupVecEnv([FlakyResetEnv, EarlyExitEnv])  # one copy fails once
    model = POCA("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0)
    with pytest.raises(OSError, match="transient failure"):
        model.learn(64)
    before = model.num_timesteps
    model.learn(64, reset_num_timesteps=False)
    assert model.num_timesteps >= before + 64


def test_copies_stepped_before_one_cut_short_are_unsettled_as_it_is():
    """Copies 0 and 1 stepped inside a call that copy 2 cut short: the caller never got their step. They were
    left settled, so the next step went on from observations the caller never saw (POCA stored their next step
    after the one lost, and an agent that left in it as present). Now they end the episode the caller saw, as
    copy 2 does; a reset cut short likewise leaves the copies it had reset unsettled."""
    venv = GroupVecEnv([FailsAtStepEnv] * 4)
    for e, env in enumerate(venv.envs):
        env.copy, env.fail = e, e == 2
    obs, mask = venv.reset(seed=0)
    actions = np.zeros((4, 3), np.int64)
    given = venv.step(venv.step(actions) and actions)  # the second step: what the caller last saw
    with pytest.raises(RuntimeError, match="simulator of copy 2 diverged"):
        venv.step(actions)
    assert [env.steps for env in venv.envs] == [3, 3, 3, 2]  # copy 3 was not reached
    venv.envs[2].fail = False
    out = venv.step(actions)
    assert out.env_done.tolist() == [True, True, True, False] and [env.steps for env in venv.envs] == [3, 3, 3, 3]
    for e in range(3):  # each ends the episode the caller saw, with what it was given
        assert out.left[e].tolist() == given.mask[e].tolist() == out.truncated[e].tolist()
        np.testing.assert_array_equal(out.final_observations[e], given.observations[e])
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(FlakyResetEnv, "fail_at_reset", 2)
    try:
        flaky = GroupVecEnv([EarlyExitEnv, FlakyResetEnv, EarlyExitEnv])
        flaky.envs[1].resets = 1  # its next reset fails
        with pytest.raises(OSError, match="transient failure"):
            flaky.reset(seed=0)
        assert sorted(flaky.restart_unsettled()) == [0, 1]  # copy 2 was not reached
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize(
    "failing,restart", [(0, False), (2, True), (2, False)], ids=["in-this-process", "in-a-worker", "worker-then-step"]
)
def test_a_subprocess_step_cut_short_leaves_every_copy_it_did_not_report_unsettled(failing, restart):
    """Where one block's step raises, the other blocks' answers are dropped: their copies stepped unseen. Each is
    restarted by restart_unsettled (POCA calls it as a rollout starts), or ends the episode the caller saw at the
    next step, with what the caller was given; a copy the failing block had not reached steps on."""
    venv = SubprocGroupVecEnv([FailsAtStepEnv] * 3, n_processes=2)  # copies 0 and 1 here, 2 in a worker
    try:
        for e in range(3):
            venv.set_attr("copy", e, indices=e)
        venv.set_attr("fail", True, indices=failing)
        venv.reset(seed=0)
        actions = np.zeros((3, 3), np.int64)
        venv.step(actions)
        given = venv.step(actions)
        with pytest.raises(RuntimeError, match=f"simulator of copy {failing} diverged"):
            venv.step(actions)
        venv.set_attr("fail", False)
        if restart:  # this process's block had stepped: both its copies are unseen, as the worker's
            assert sorted(venv.restart_unsettled()) == [0, 1, 2]
            assert venv.get_attr("steps") == [3, 3, 3]
            return
        out = venv.step(actions)
        if failing == 2:  # every copy's step was unseen: each ends with what the caller was given
            assert out.env_done.all() and venv.get_attr("steps") == [3, 3, 3]
            assert out.left.tolist() == given.mask.tolist()
            np.testing.assert_array_equal(out.final_observations, given.observations)
            return
        # copy 0 cut short, copy 1 not reached, copy 2's step (the worker's) unseen
        assert out.env_done.tolist() == [True, False, True] and venv.get_attr("steps") == [3, 3, 3]
        for e in (0, 2):
            assert out.left[e].tolist() == given.mask[e].tolist()
            np.testing.assert_array_equal(out.final_observations[e], given.observations[e])
    finally:
        venv.close()


class FragileEnv(EarlyExitEnv):
    """EarlyExitEnv whose step or reset raises while ``fail_step`` or ``fail_reset`` is set."""

    fail_step = fail_reset = False

    def reset(self, seed=None, options=None):
        if self.fail_reset:
            raise OSError("transient reset failure")
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        if self.fail_step:
            raise OSError("transient step failure")
        return super().step(actions)


def test_a_workers_failed_restart_leaves_this_processs_copies_with_what_the_caller_was_given():
    """restart_unsettled reset this process's copies, then a worker's reset failed: those copies' new episodes
    never reached the caller, and their next step ended them with the restart's observations instead of the ones
    the caller held."""
    venv = SubprocGroupVecEnv([FragileEnv] * 3, n_processes=2)  # copies 0 and 1 here, 2 in a worker
    try:
        venv.reset(seed=0)
        actions = np.zeros((3, 3), np.int64)
        given = venv.step(actions)
        venv.set_attr("fail_step", True, indices=2)
        with pytest.raises(OSError, match="transient step failure"):
            venv.step(actions)
        venv.set_attr("fail_step", False, indices=2)
        venv.set_attr("fail_reset", True, indices=2)
        with pytest.raises(OSError, match="transient reset failure"):
            venv.restart_unsettled()
        venv.set_attr("fail_reset", False, indices=2)
        out = venv.step(actions)
        assert out.env_done.all() and out.left.tolist() == given.mask.tolist()
        np.testing.assert_array_equal(out.final_observations, given.observations)
    finally:
        venv.close()


def test_copies_restarted_before_a_reset_that_fails_are_restarted_again():
    """restart_unsettled reset copy 0, then copy 1's reset failed: copy 0's new observations never reached the
    caller, so it stays unsettled and the next restart gives it again (it was left settled, and the next step went
    on from an episode the caller never saw)."""
    venv = GroupVecEnv([EarlyExitEnv, FlakyResetEnv])
    venv.reset(seed=0)
    venv._unsettle()
    venv.envs[1].fail_at_reset = venv.envs[1].resets + 1
    with pytest.raises(OSError, match="transient failure"):
        venv.restart_unsettled()
    assert sorted(venv.restart_unsettled()) == [0, 1]


def test_poca_counts_start_again_together_where_learns_reset_is_cut_short():
    """learn(reset_num_timesteps=True) sets num_timesteps to 0, then resets the env: a reset cut short left
    agent_steps at the last run's count beside it."""
    from covey import POCA

    model = POCA("MlpPolicy", lambda: FlakyResetEnv(), n_envs=2, n_steps=8, batch_size=16, n_epochs=1, seed=0)
    model.learn(16)
    assert model.agent_steps > 0
    flaky = model.get_env().envs[1]
    flaky.fail_at_reset = flaky.resets + 1  # learn's reset reaches it after copy 0's
    with pytest.raises(OSError, match="transient failure"):
        model.learn(16)
    assert model.num_timesteps == 0 and model.agent_steps == 0
    flaky.fail_at_reset = None
    model.learn(16, reset_num_timesteps=False)
    assert model.num_timesteps == 16 and model.agent_steps == int(model.rollout_buffer.present.sum())


class InterruptingEnv(EarlyExitEnv):
    """EarlyExitEnv interrupted (Ctrl-C) at its step number ``interrupt_at``; its observations' last feature is
    the time left, 1.0 after a reset."""

    interrupt_at = None

    def __init__(self):
        super().__init__()
        self.steps = 0

    def step(self, actions):
        self.steps += 1
        if self.steps == self.interrupt_at:
            raise KeyboardInterrupt
        return super().step(actions)


def test_poca_goes_on_from_the_envs_own_state_after_a_step_cut_short_in_a_later_copy():
    from covey import POCA

    model = POCA("MlpPolicy", InterruptingEnv, n_envs=3, n_steps=4, batch_size=12, n_epochs=1, seed=0)
    model.learn(12)
    copies = model.get_env().envs
    copies[2].interrupt_at = copies[2].steps + 2  # the second step of the next rollout, after copies 0 and 1 stepped
    with pytest.raises(KeyboardInterrupt):
        model.learn(12, reset_num_timesteps=False)
    assert model.num_timesteps == 15 and [env.steps for env in copies] == [6, 6, 6]
    copies[2].interrupt_at = None
    model.learn(12, reset_num_timesteps=False)
    # Every copy starts afresh: its first stored step is a reset's observation (time left 1.0). Copies 0 and 1 went
    # on from their observations before the lost step, which the env had left behind.
    time_left = model.rollout_buffer.observations[0, :, :, -1]
    present = model.rollout_buffer.present[0]
    assert (time_left[present] == 1.0).all() and present.all()


class BrokenStep(OneStepTeam):
    """OneStepTeam whose step breaks PettingZoo's API one way (``bug``), or whose observations are Discrete(4,
    start=10) given from 0 (an env that forgot the start)."""

    def __init__(self, bug):
        super().__init__(("truncated",))
        self.bug = bug

    def observation_space(self, agent):
        return spaces.Discrete(4, start=10) if self.bug == "discrete from 0" else super().observation_space(agent)

    def reset(self, seed=None, options=None):
        observations, infos = super().reset(seed=seed)
        if self.bug == "discrete from 0":
            observations = {agent: 1 for agent in observations}
        return observations, infos

    def step(self, actions):
        observations, rewards, term, trunc, infos = super().step(actions)
        if self.bug == "no truncations":
            trunc = {}
        elif self.bug == "string flag":
            term = {agent: "False" for agent in term}
        elif self.bug == "infos None":
            infos = None
        elif self.bug == "reward None":
            rewards["b"] = None
        elif self.bug == "no reward":
            del rewards["b"]
        return observations, rewards, term, trunc, infos


@pytest.mark.parametrize(
    "bug,message",
    [
        ("discrete from 0", r"gave agent 'a' an observation .*value 1 outside Discrete\(4, start=10\)"),
        ("no truncations", r"gave no truncations entry for 'a', 'b', which acted"),
        ("string flag", r"gave agent 'a' the terminations flag 'False': a string, not a bool"),
        ("infos None", r"returned its infos as NoneType, not a dict keyed by agent"),
        ("reward None", r"gave agent 'b' the reward None, which is not a number"),
    ],
)
def test_a_step_off_pettingzoos_api_is_named(bug, message):
    """Each of these trained silently (a Discrete observation outside its space read as the nearest value, a
    time limit without its truncations as the group's true end, "False" as true) or failed with Python's
    AttributeError, or named None a NaN."""
    venv = GroupVecEnv([lambda: BrokenStep(bug)])
    with pytest.raises(ValueError, match=message):
        venv.reset(seed=0)
        venv.step(np.zeros((1, 2), np.int64))


def test_a_missing_reward_and_a_reward_no_agent_trains_on_are_warned_of_once():
    """A live agent left out of the rewards trains on 0, and a reward under a key that is no acting agent's counts
    in the logged return only: both were silent (PettingZoo's API test warns of them)."""
    venv = GroupVecEnv([lambda: BrokenStep("no reward")])
    venv.reset(seed=0)
    with pytest.warns(UserWarning, match=r"gave no reward for 'b', which acted in this step: it trains on 0"):
        step = venv.step(np.zeros((1, 2), np.int64))
    np.testing.assert_array_equal(step.rewards[0], [1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        venv.step(np.zeros((1, 2), np.int64))  # once
    venv = GroupVecEnv([lambda: OneStepTeam(team_reward=10.0)])
    venv.reset(seed=0)
    with pytest.warns(UserWarning, match=r"reward of 10.0 under 'team', which did not act .* no agent trains on it"):
        venv.step(np.zeros((1, 2), np.int64))


class ReadsEveryListedActionEnv(ScriptedEnv):
    """ScriptedEnv that keeps listing agent a after its end at step 3 and reads an action of every listed agent, as
    an env written against PettingZoo's API may not (an ended agent leaves ``self.agents``)."""

    def step(self, actions):
        [int(actions[a]) for a in self.agents]  # a KeyError for a listed agent without an action
        keep = self.agents
        out = super().step({a: actions[a] for a in keep})
        if "a" in keep and "a" not in self.agents:
            self.agents.insert(0, "a")
        return out


def test_an_env_that_reads_the_action_of_an_agent_it_ended_but_lists_is_named_with_the_fix():
    """covey sends no action to an agent the env ended (as PettingZoo's API has it), even where the env still lists
    it; an env that reads one failed with a bare KeyError from inside the env."""
    venv = GroupVecEnv([ReadsEveryListedActionEnv])
    venv.reset(seed=0)
    for _ in range(3):  # a terminates at step 3
        venv.step(np.zeros((1, 3), np.int64))
    with pytest.raises(ValueError, match=r"raised KeyError\('a'\), for an agent that terminated or truncated") as info:
        venv.step(np.zeros((1, 3), np.int64))
    assert "Take an agent out of self.agents in the step that ends it" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


class KeyErrorEnv(ScriptedEnv):
    def step(self, actions):
        return {}["not an agent"]


class ReadsAJoiningAgentsActionEnv(ScriptedEnv):
    """ScriptedEnv that reads the action of agent c in step 2, where c joins (it lists c only after the step)."""

    def step(self, actions):
        if self.t == 1:
            self.agents.append("c")
            actions["c"]
        return super().step(actions)


@pytest.mark.parametrize("env", [KeyErrorEnv, ReadsAJoiningAgentsActionEnv])
def test_a_key_error_of_the_envs_own_stays_the_envs(env):
    """A KeyError for what is no agent, or for an agent that never ended, is not blamed on an ended agent."""
    venv = GroupVecEnv([env])
    venv.reset(seed=0)
    if env is ReadsAJoiningAgentsActionEnv:
        venv.step(np.zeros((1, 3), np.int64))
    with pytest.raises(KeyError, match="not an agent" if env is KeyErrorEnv else "'c'"):
        venv.step(np.zeros((1, 3), np.int64))


class SharesPossibleAgentsEnv(ScriptedEnv):
    """ScriptedEnv whose reset lists ``self.possible_agents`` itself, not a copy: agents the steps take out of
    ``self.agents`` leave ``possible_agents`` too (a common slip PettingZoo's api test does not catch)."""

    def __init__(self):
        super().__init__(end=3)
        self.possible_agents = ["a", "b"]

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = self.possible_agents
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        done = self.t >= self.end
        observations = {a: self._obs(a) for a in self.agents}
        flags = {a: done for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        for a in list(self.agents) if done else []:
            self.agents.remove(a)
        return observations, rewards, flags, dict(flags), {a: {} for a in observations}


def test_an_env_whose_agents_list_is_its_possible_agents_is_named_at_the_reset_after_it_emptied_them():
    venv = GroupVecEnv([SharesPossibleAgentsEnv])
    venv.reset(seed=0)
    made_with = r"left possible_agents \[\], where the env was made with \['a', 'b'\]: self.agents is the same list"
    with pytest.raises(ValueError, match=made_with) as info:
        for _ in range(3):
            venv.step(np.zeros((1, 2), np.int64))
    assert "self.agents = self.possible_agents[:]" in str(info.value)
    with pytest.raises(ValueError, match=made_with):  # an evaluation scored the later episodes as empty ones
        evaluate_group(None, SharesPossibleAgentsEnv, n_eval_episodes=3)


class DropsAPossibleAgentEnv(SharesPossibleAgentsEnv):
    """Takes agent a out of ``possible_agents`` in its first step and lists a copy in ``reset``: the group shrank
    from its second episode on, silently."""

    def reset(self, seed=None, options=None):
        out = super().reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return out

    def _obs(self, agent):
        return np.array([["a", "b"].index(agent) + 1, self.t, 7], np.float32)

    def step(self, actions):
        out = super().step(actions)
        if "a" in self.possible_agents:
            self.possible_agents.remove("a")
        return out


def test_possible_agents_that_change_are_named_at_the_next_reset():
    venv = GroupVecEnv([DropsAPossibleAgentEnv])
    venv.reset(seed=0)
    changed = r"left possible_agents \['b'\], where the env was made with \['a', 'b'\]: possible_agents lists every"
    with pytest.raises(ValueError, match=changed):
        for _ in range(3):
            venv.step(np.zeros((1, 2), np.int64))


class DictObsUndeclaredEnv(ScriptedEnv):
    """ScriptedEnv whose observations are PettingZoo's newer tutorial's dicts with an action mask, under a declared
    Box space."""

    def _obs(self, agent):
        return {"observation": super()._obs(agent), "action_mask": np.ones(3, np.int8)}


class DictObsUnderDiscreteEnv(DictObsUndeclaredEnv):
    def observation_space(self, agent):
        return spaces.Discrete(5)


@pytest.mark.parametrize("env", [DictObsUndeclaredEnv, DictObsUnderDiscreteEnv])
def test_a_dict_observation_under_a_space_that_is_no_dict_is_named_as_a_dict(env):
    """It was reported as an observation "of shape ()" (NumPy's shape of a dict), or a bare TypeError."""
    venv = GroupVecEnv([env])
    keys = r"gave agent 'a' a dict observation \(keys \['observation', 'action_mask'\]\)"
    with pytest.raises(ValueError, match=keys):
        venv.reset(seed=0)


def test_mixed_spaces_name_the_largest_side_and_inside_one_side_do_not_suggest_it_again():
    from mpe2 import simple_world_comm_v3

    from covey.wrappers import one_side

    with pytest.raises(MixedSpacesError) as info:
        GroupVecEnv([lambda: simple_world_comm_v3.parallel_env(max_cycles=5)])
    message = str(info.value)
    # ids: one lead adversary, three adversaries, two agents; a team of one was the example before
    assert "(by their ids: 'leadadversary' (1), 'adversary' (3), 'agent' (2))" in message
    assert "covey.wrappers.one_side(env, 'adversary')" in message and info.value.side == "adversary"
    assert "its team may also be a list of agent ids" in message
    team = ["leadadversary_0", "adversary_0", "adversary_1", "adversary_2"]
    with pytest.raises(MixedSpacesError) as info:
        GroupVecEnv([lambda: one_side(simple_world_comm_v3.parallel_env(max_cycles=5), team)])
    message = str(info.value)
    assert "The env is one side already (covey.wrappers.one_side)" in message
    assert "covey.wrappers.one_side(env," not in message and info.value.side is None
    # as the message says: padded over one_side's env, that team steps
    padded = GroupVecEnv([lambda: supersuit.pad_action_space_v0(one_side(simple_world_comm_v3.parallel_env(), team))])
    obs, mask = padded.reset(seed=0)
    assert mask.shape == (1, 4) and mask.all()


@pytest.mark.parametrize("reward", [np.array([1.0], np.float32), [1.0, [2.0]]], ids=["array", "ragged"])
def test_a_reward_that_is_no_number_is_named_in_evaluations_and_the_clis_reward_tap(reward):
    """evaluate_group and the CLI's RewardTap (what a run's evaluations score) made an array of one element a
    float (NumPy before 2.4 silently); a ragged list failed inside NumPy."""
    from covey.wrappers.rewards import RewardTap

    class ListReward(ScriptedEnv):
        def step(self, actions):
            observations, rewards, terminations, truncations, infos = super().step(actions)
            return observations, {a: reward for a in rewards}, terminations, truncations, infos

    with pytest.raises(ValueError, match=r"gave agent 'a' the reward .*, which is not a number"):
        evaluate_group(None, ListReward, n_eval_episodes=1)
    tap = RewardTap(ListReward())
    tap.reset(seed=0)
    with pytest.raises(ValueError, match=r"gave agent 'a' the reward .*, which is not a number"):
        tap.step({agent: 0 for agent in tap.agents})
