"""Every warning about a user's input or call names the user's line (here: this file), from every call path.

Each case below calls covey as a script would and gives the text of the warning it must raise; the test checks
that the warning is raised and that Python attributes it to this file, not to a line inside covey.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import stable_baselines3
import torch
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.envs import BitFlippingEnv
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import DummyVecEnv

from covey import POCA, PPO, SAC
from covey.envs import EarlyExitEnv


def ppo_batch_larger_than_rollout(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=64)


def ppo_batch_not_dividing_rollout(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=48, batch_size=32)


def poca_batch_larger_than_rollout(tmp_path):
    POCA("MlpPolicy", EarlyExitEnv(), n_envs=1, n_steps=8, batch_size=64)


def batch_warning_at_load(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64).save(tmp_path / "m")
    PPO.load(tmp_path / "m.zip", env="CartPole-v1", batch_size=48)


def old_net_arch_ppo(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, policy_kwargs=dict(net_arch=[dict(pi=[8], vf=[8])]))


def old_net_arch_sac(tmp_path):
    SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[dict(pi=[8], qf=[8])]))


def sac_n_steps_beside_a_buffer_class(tmp_path):
    SAC("MlpPolicy", "Pendulum-v1", n_steps=3, replay_buffer_class=ReplayBuffer)


def sac_use_sde_in_policy_kwargs(tmp_path):
    model = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(use_sde=True))
    assert not model.use_sde  # as SB3: the agent's argument decides


def cuda_asked_for(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, device="cuda:0")


def cuda_asked_for_at_load(tmp_path):
    SAC("MlpPolicy", "Pendulum-v1", device="cpu").save(tmp_path / "m")
    SAC.load(tmp_path / "m.zip", device="cuda:0")


def go_on_without_a_place(tmp_path):
    PPO("MlpLstmPolicy", "CartPole-v1", n_steps=64, batch_size=64).save(tmp_path / "m")
    PPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"), force_reset=False)


class MaskedEnv(gym.Env):
    observation_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,)), "action_mask": gym.spaces.MultiBinary(2)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def action_mask_in_observations(tmp_path):
    PPO("MultiInputPolicy", MaskedEnv(), n_steps=64, batch_size=64)


class MaskingWrapper(gym.Wrapper):
    """sb3_contrib's ActionMasker's interface: the env answers action_masks(), which MaskablePPO reads."""

    def action_masks(self):
        return np.array([True, False])


def action_masks_method_in_env(tmp_path):
    PPO("MlpPolicy", MaskingWrapper(gym.make("CartPole-v1")), n_steps=64, batch_size=64)


def sb3_weights_copied(tmp_path):
    # SB3's optimizer is another than covey's: its state cannot go into covey's Adam
    theirs = stable_baselines3.PPO(
        "MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, policy_kwargs=dict(optimizer_class=torch.optim.SGD)
    )
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64).set_parameters(
        theirs.get_parameters(), exact_match=False
    )


def learned_temperature_loaded_fixed(tmp_path):
    SAC("MlpPolicy", "Pendulum-v1", learning_starts=10).learn(20).save(tmp_path / "learned")
    SAC.load(tmp_path / "learned", ent_coef=0.1)


def sb3_file_with_a_function(tmp_path):
    stable_baselines3.PPO("MlpPolicy", "CartPole-v1", learning_rate=lambda p: 1e-3 * p).save(tmp_path / "sb3")
    PPO.load(tmp_path / "sb3.zip")


class Scaled(ActorCriticPolicy):
    def __init__(self, *args, scale=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale


def policy_kwargs_the_file_cannot_hold(tmp_path):
    model = PPO(Scaled, "CartPole-v1", n_steps=64, batch_size=64, policy_kwargs=dict(scale=np.ones(2)))
    model.save(tmp_path / "m")


class Unseedable(DummyVecEnv):
    def seed(self, seed=None):
        raise NotImplementedError


def seed_not_applied(tmp_path):
    PPO("MlpPolicy", Unseedable([lambda: gym.make("CartPole-v1")]), n_steps=16, batch_size=16, seed=5).learn(16)


def temperature_state_of_another_optimizer(tmp_path):
    model = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(optimizer_class=torch.optim.SGD))
    params = model.get_parameters()
    params["ent_coef_optimizer"] = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-4).state_dict()
    model.set_parameters(params)


def her_buffer_with_running_episodes(tmp_path):
    env = BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)
    model = SAC(
        "MultiInputPolicy",
        env,
        replay_buffer_class=stable_baselines3.HerReplayBuffer,
        learning_starts=20,
        batch_size=16,
        seed=0,
    ).learn(23)
    assert (model.replay_buffer._current_ep_start != model.replay_buffer.pos).any()  # an episode runs
    model.save_replay_buffer(tmp_path / "buffer")
    model.load_replay_buffer(tmp_path / "buffer")


def schedule_function_after_load(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, learning_rate=lambda p: 1e-3 * p).save(tmp_path / "m")
    PPO.load(tmp_path / "m.zip", env="CartPole-v1").learn(64)


CASES = {
    ppo_batch_larger_than_rollout: "is larger than the rollout",
    ppo_batch_not_dividing_rollout: "does not divide the rollout",
    poca_batch_larger_than_rollout: "is larger than the rollout",
    batch_warning_at_load: "does not divide the rollout",
    old_net_arch_ppo: "SB3's form from before version 1.8",
    old_net_arch_sac: "SB3's form from before version 1.8",
    sac_n_steps_beside_a_buffer_class: "n_steps=3 is ignored",
    sac_use_sde_in_policy_kwargs: "policy_kwargs use_sde=True is not read",
    cuda_asked_for: "CUDA is not available",
    cuda_asked_for_at_load: "CUDA is not available",
    go_on_without_a_place: "force_reset=False",
    action_mask_in_observations: "covey's policies do not mask actions",
    action_masks_method_in_env: "action_masks() method (sb3_contrib's ActionMasker), but covey's policies do not",
    sb3_weights_copied: "policy.optimizer: the optimizers are of different kinds",
    learned_temperature_loaded_fixed: "which this model does not use",
    sb3_file_with_a_function: "which covey never unpickles",
    policy_kwargs_the_file_cannot_hold: "is not in the model file",
    seed_not_applied: "was not applied to the env",
    temperature_state_of_another_optimizer: "not an Adam state",
    her_buffer_with_running_episodes: "ends in running episodes",
    schedule_function_after_load: "schedules that are functions",
}


@pytest.mark.parametrize("case", list(CASES), ids=lambda case: case.__name__)
def test_a_warning_names_the_users_line(case, tmp_path):
    if "cuda" in case.__name__ and torch.cuda.is_available():
        pytest.skip("the warning is for machines without CUDA")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        case(tmp_path)
    raised = [w for w in caught if CASES[case] in str(w.message)]
    assert raised, f"no warning saying {CASES[case]!r}; got {[str(w.message) for w in caught]}"
    for warning in raised:
        assert (warning.filename, warning.lineno) != ("", 0)
        assert warning.filename == __file__, f"attributed to {warning.filename}:{warning.lineno}"


def test_sac_reads_use_sde_from_its_own_argument_and_warns_only_where_policy_kwargs_says_otherwise():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        on = SAC("MlpPolicy", "Pendulum-v1", use_sde=True, policy_kwargs=dict(use_sde=True))
        off = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(use_sde=False))
    assert on.use_sde and not off.use_sde
    assert type(on.actor.head).__name__ != type(off.actor.head).__name__  # gSDE's head against the Gaussian
