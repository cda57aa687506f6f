"""NaN and infinities from an env stop training with an error, before an update turns the weights into NaN."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import SpaceEnv
from gymnasium import spaces
from pettingzoo import ParallelEnv
from stable_baselines3.common.callbacks import BaseCallback

from covey import POCA, PPO, SAC

BAD = {"nan-reward": ("reward", np.nan), "inf-observation": ("obs", np.inf), "nan-observation": ("obs", np.nan)}


class BadEnv(gym.Env):
    """Zeros, until step ``at`` of an episode, whose reward or observation is ``value`` (when ``what`` is set)."""

    def __init__(self, what=None, value=0.0, continuous=False, at=4, dict_obs=False):
        self.what, self.value, self.at, self.dict_obs = what, value, at, dict_obs
        box = spaces.Box(-1, 1, (3,), np.float32)
        self.observation_space = spaces.Dict({"x": box}) if dict_obs else box
        self.action_space = spaces.Box(-1, 1, (1,), np.float32) if continuous else spaces.Discrete(2)

    def _obs(self):
        obs = np.zeros(3, np.float32)
        if self.what == "obs" and self.t == self.at:
            obs[0] = self.value
        return {"x": obs} if self.dict_obs else obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = self.value if self.what == "reward" and self.t == self.at else 0.0
        return self._obs(), float(reward), False, self.t >= 10, {}


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_ppo_and_sac_refuse_nan_and_infinite_env_output_before_any_update(agent, bad):
    what, value = BAD[bad]
    if agent == "ppo":
        model = PPO("MlpPolicy", BadEnv(what, value), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    else:
        model = SAC("MlpPolicy", BadEnv(what, value, continuous=True), learning_starts=0, batch_size=4, seed=0)
    before = _weights(model)
    with pytest.raises(ValueError, match=f"NaN or infinite {'rewards' if what == 'reward' else 'observations'}") as err:
        model.learn(32)
    assert "VecCheckNan(env, raise_exception=True)" in str(err.value)  # a VecEnv's way to find the step
    if agent == "ppo":  # the rollout holding it was not trained on
        assert all(torch.equal(a, b) for a, b in zip(before, _weights(model), strict=True))
    else:  # SAC trained after each of the 3 steps before it, which alone are in its buffer
        assert model.replay_buffer.size() == 3
        assert all(bool(torch.isfinite(w).all()) for w in _weights(model))
    # The same env without the bad value trains.
    good = BadEnv(continuous=agent == "sac")
    (PPO("MlpPolicy", good, n_steps=16, batch_size=16, seed=0) if agent == "ppo" else SAC("MlpPolicy", good)).learn(32)


def test_ppo_refuses_a_time_limits_nan_final_observation_and_a_nan_dict_key():
    # Step 10 ends the episode by its time limit: the final observation, kept for the bootstrap, is the bad one.
    model = PPO("MlpPolicy", BadEnv("obs", np.nan, at=10), n_steps=16, batch_size=16, seed=0)
    with pytest.raises(ValueError, match="NaN or infinite observations"):
        model.learn(16)
    model = PPO("MultiInputPolicy", BadEnv("obs", -np.inf, dict_obs=True), n_steps=16, batch_size=16, seed=0)
    with pytest.raises(ValueError, match="NaN or infinite observations"):
        model.learn(16)


class BadTeam(ParallelEnv):
    metadata = {"name": "bad_team_v0"}

    def __init__(self, what=None, value=0.0):
        self.possible_agents = ["a0", "a1"]
        self.what, self.value = what, value

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self):
        return np.array([self.value if self.what == "obs" and self.t == 4 else 0.0, 0, 0], np.float32)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        done = self.t >= 8
        reward = self.value if self.what == "reward" and self.t == 4 else 0.0
        agents = self.agents
        self.agents = [] if done else agents
        return (
            {a: self._obs() for a in agents},
            {a: reward for a in agents},
            {a: done for a in agents},
            {a: False for a in agents},
            {a: {} for a in agents},
        )


@pytest.mark.parametrize("bad", list(BAD))
def test_poca_refuses_nan_and_infinite_env_output_before_any_update(bad):
    what, value = BAD[bad]
    model = POCA("MlpPolicy", lambda: BadTeam(what, value), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    before = [p.detach().clone() for net in (model.actor, model.critic) for p in net.parameters()]
    with pytest.raises(ValueError, match=f"NaN or infinite {'rewards' if what == 'reward' else 'observations'}") as err:
        model.learn(16)
    # where: step 4's reward is stored with the observation before it (rollout step 3), its observation at step 4;
    # the advice is a team env's (SB3's VecCheckNan takes a VecEnv, which a PettingZoo env is not)
    at = 3 if what == "reward" else 4
    assert f"first at step {at} of the rollout, env copy 0, agent 'a0'" in str(err.value)
    assert "BaseParallelWrapper" in str(err.value) and "VecCheckNan" not in str(err.value)
    after = [p.detach() for net in (model.actor, model.critic) for p in net.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    POCA("MlpPolicy", BadTeam, n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16)


# ---------------------------------------------------------------------------- discrete observations out of range
class OutOfRangeEnv(BadEnv):
    """Observations of Discrete(3, start=1) (or a Dict holding one): 1, 2, 3, ..., then ``bad`` at step 4."""

    def __init__(self, bad=7, continuous=False, dict_obs=False):
        self.bad, self.dict_obs, self.what = bad, dict_obs, None
        space = spaces.Discrete(3, start=1)
        self.observation_space = spaces.Dict({"d": space, "x": spaces.Box(-1, 1, (2,))}) if dict_obs else space
        self.action_space = spaces.Box(-1, 1, (1,), np.float32) if continuous else spaces.Discrete(2)

    def _obs(self):
        value = self.bad if self.t == 4 else 1 + self.t % 3
        return {"d": value, "x": np.zeros(2, np.float32)} if self.dict_obs else value


@pytest.mark.parametrize("dict_obs", [False, True], ids=["discrete", "dict"])
@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_discrete_observations_outside_their_space_are_refused_from_the_env_and_in_predict(agent, dict_obs):
    """A Discrete observation outside its space (7, or 0 below start=1) was one-hot encoded as the nearest value,
    silently: training and predict now name it."""
    policy = "MultiInputPolicy" if dict_obs else "MlpPolicy"
    key = " of key 'd'" if dict_obs else ""
    for bad in (7, 0):
        env = OutOfRangeEnv(bad, continuous=agent == "sac", dict_obs=dict_obs)
        if agent == "ppo":
            model = PPO(policy, env, n_steps=16, batch_size=16, n_epochs=1, seed=0)
        else:
            model = SAC(policy, env, learning_starts=100, seed=0)
        with pytest.raises(
            ValueError, match=rf"The env returned an observation.*value {bad}{key} outside Discrete\(3, start=1\)"
        ):
            model.learn(16)
    good = OutOfRangeEnv(2, continuous=agent == "sac", dict_obs=dict_obs)
    model = (PPO(policy, good, n_steps=16, batch_size=16, seed=0) if agent == "ppo" else SAC(policy, good)).learn(16)
    for obs in (3, 4, 2.5, -1):
        given = {"d": np.array(obs), "x": np.zeros(2, np.float32)} if dict_obs else np.array(obs)
        if obs == 3:
            model.predict(given)
            continue
        with pytest.raises(ValueError, match=rf"Observation has a value {obs}{key} outside Discrete\(3, start=1\)"):
            model.predict(given)


def test_multidiscrete_observations_are_checked_entry_by_entry():
    model = PPO("MlpPolicy", SpaceEnv(spaces.MultiDiscrete([2, 5]), spaces.Discrete(2)), n_steps=16, batch_size=16)
    model.predict(np.array([1, 4]))
    with pytest.raises(ValueError, match=r"value 2 outside MultiDiscrete\(\[2 5\]\)"):
        model.predict(np.array([2, 4]))
    with pytest.raises(ValueError, match=r"value 5 outside"):
        model.predict(np.array([[0, 1], [1, 5]]))


class _PoisonBeforeUpdate(BaseCallback):
    """Writes NaN into one weight at the end of a rollout, before the update, as a diverging update would."""

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        with torch.no_grad():
            next(self.model.policy.parameters()).view(-1)[0] = float("nan")


def test_a_model_whose_update_leaves_nan_weights_stops_with_divergence_advice():
    """A Discrete policy with NaN weights acted silently on (always the first action), where SB3 fails at its next
    step; an update that leaves a NaN or an infinity in the weights now stops learn, saying training diverged."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0)
    with pytest.raises(ValueError, match=r"Training diverged: after 1 updates .*Lower learning_rate"):
        model.learn(256, callback=_PoisonBeforeUpdate())
    assert model.num_timesteps == 32


@pytest.mark.parametrize("agent", ["ppo", "sac", "poca"])
def test_diverging_learning_rates_are_named_as_divergence_not_as_the_envs_nan(agent):
    """With a learning rate that diverges, the NaN weights' NaN actions made the env return NaN observations, and
    the error blamed the env; learn now stops after the update that diverged."""
    from covey.envs import EarlyExitEnv

    if agent == "ppo":
        model = PPO("MlpPolicy", "Pendulum-v1", learning_rate=1e6, max_grad_norm=1e12, n_steps=64, batch_size=32)
    elif agent == "sac":
        model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e6, learning_starts=50, batch_size=32, seed=0)
    else:
        model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, learning_rate=1e6, max_grad_norm=1e12, seed=0)
    with pytest.raises(ValueError, match=r"Training diverged: after \d+ updates \(train/n_updates\), \d+ of this"):
        model.learn(1500)


def test_learn_refuses_nan_weights_before_training():
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10, seed=0)
    with torch.no_grad():
        dict(model.critic_target.named_parameters())["qs.0.trunk.0.bias"][0] = float("inf")
    with pytest.raises(
        ValueError, match=r"1 of this model's weights hold NaN or infinite values \(critic_target\..*before"
    ):
        model.learn(20)
