"""PPO's use_sde=True: generalized state-dependent exploration, checked against SB3's own
StateDependentNoiseDistribution (log-probabilities, entropies, noise) and SB3's sampling schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from envs import SpaceEnv
from gymnasium import spaces
from stable_baselines3.common.distributions import StateDependentNoiseDistribution

from covey import PPO
from covey.networks.distributions import StateDependentGaussianHead

FAST = dict(n_steps=16, batch_size=16, n_epochs=1, seed=0)
BOX_OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)


@pytest.mark.parametrize("full_std", [True, False])
@pytest.mark.parametrize("use_expln", [False, True])
def test_head_matches_sb3s_state_dependent_noise_distribution(full_std, use_expln):
    torch.manual_seed(0)
    latent_dim, action_dim, batch = 5, 2, 7
    head = StateDependentGaussianHead(latent_dim, action_dim, -0.5, full_std=full_std, use_expln=use_expln)
    with torch.no_grad():
        head.log_std.uniform_(-1.5, 1.5)  # both sides of 0, where expln changes form
    latent = torch.randn(batch, latent_dim)
    params = head(latent)
    mean = params[:, :action_dim]
    sb3 = StateDependentNoiseDistribution(action_dim, full_std=full_std, use_expln=use_expln)
    sb3.latent_sde_dim = latent_dim
    sb3.proba_distribution(mean, head.log_std, latent)
    actions = torch.randn(batch, action_dim)
    torch.testing.assert_close(head.log_prob(params, actions), sb3.log_prob(actions))
    torch.testing.assert_close(head.entropy(params), sb3.entropy())
    # The noise with SB3's exploration matrices: one matrix per row of a batch of that size, else the single one.
    sb3.sample_weights(head.log_std, batch_size=batch)
    head.exploration, head.explorations = sb3.exploration_mat, sb3.exploration_matrices
    torch.testing.assert_close(head.sample(params) - mean, sb3.get_noise(latent))
    torch.testing.assert_close(head.sample(params[:3]) - mean[:3], latent[:3] @ sb3.exploration_mat)
    assert torch.equal(head.sample(params, deterministic=True), mean)
    # The variance takes no gradient into the latent (SB3's learn_features=False): d log p / d latent is the
    # mean's path alone, (a - mean) / scale^2 @ W.
    latent.requires_grad_(True)
    grad = torch.autograd.grad(head.log_prob(head(latent), actions).sum(), latent)[0]
    scale = head._scale(latent.detach())
    with torch.no_grad():
        expected = ((actions - head.proj(latent)) / scale.square()) @ head.proj.weight
    torch.testing.assert_close(grad, expected)


def test_reset_noise_draws_matrices_with_the_heads_std():
    torch.manual_seed(0)
    head = StateDependentGaussianHead(4, 3, log_std_init=-1.0)
    head.reset_noise(20_000)
    assert head.exploration.shape == (4, 3) and head.explorations.shape == (20_000, 4, 3)
    torch.testing.assert_close(head.explorations.std(0), torch.full((4, 3), float(np.exp(-1.0))), atol=0.01, rtol=0)
    torch.testing.assert_close(head.explorations.mean(0), torch.zeros(4, 3), atol=0.01, rtol=0)


@pytest.mark.parametrize("freq, per_rollout", [(-1, 1), (4, 1 + 4)])
def test_ppo_draws_exploration_matrices_as_sb3_schedules_them(freq, per_rollout, monkeypatch):
    """At the start of each rollout, and every sde_sample_freq steps within it (SB3's schedule, including the
    draw at step 0): 16 steps with freq 4 -> 1 + 4 draws per rollout; freq -1 -> 1."""
    model = PPO("MlpPolicy", SpaceEnv(BOX_OBS, spaces.Box(-1, 1, (2,))), use_sde=True, sde_sample_freq=freq, **FAST)
    calls = []
    draw = model.actor.head.reset_noise
    monkeypatch.setattr(model.actor.head, "reset_noise", lambda n=1: (calls.append(n), draw(n)))
    model.learn(32)  # two rollouts of 16 steps, one env
    assert calls == [1] * (2 * per_rollout)


def test_ppo_with_sde_keeps_the_noise_between_draws():
    """Between two draws the same observation gets the same action: the noise is a function of the state."""
    model = PPO("MlpPolicy", SpaceEnv(BOX_OBS, spaces.Box(-1, 1, (2,))), use_sde=True, **FAST).learn(16)
    obs = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)
    model.policy.reset_noise(4)
    first, again = model.predict(obs)[0], model.predict(obs)[0]
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, model.predict(obs, deterministic=True)[0])  # there is noise
    model.policy.reset_noise(4)
    assert not np.allclose(model.predict(obs)[0], first)  # new matrices, new noise


def test_ppo_with_sde_saves_loads_and_copies_sb3_weights(tmp_path):
    import stable_baselines3

    kwargs = dict(use_sde=True, sde_sample_freq=4, policy_kwargs=dict(log_std_init=-2.0, net_arch=[16]))
    model = PPO("MlpPolicy", "Pendulum-v1", **kwargs, **FAST).learn(32)
    assert model.policy.log_std.shape == (16, 1) and model.use_sde and model.sde_sample_freq == 4
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m")
    assert isinstance(loaded.actor.head, StateDependentGaussianHead) and loaded.sde_sample_freq == 4
    obs = torch.randn(5, 3)
    torch.testing.assert_close(loaded.actor.distribution_params(obs), model.actor.distribution_params(obs))
    # SB3's gSDE policy, weights copied: the same distribution
    sb3 = stable_baselines3.PPO("MlpPolicy", "Pendulum-v1", **kwargs, **FAST)
    model.set_parameters(sb3.get_parameters(), exact_match=False)
    actions = torch.randn(5, 1)
    with torch.no_grad():
        values, log_prob, entropy = sb3.policy.evaluate_actions(obs, actions)
        ours = model.policy.evaluate_actions(obs, actions)
    torch.testing.assert_close(ours[1], log_prob)
    torch.testing.assert_close(ours[2], entropy)
    torch.testing.assert_close(ours[0], values)


def test_use_sde_errors_are_clear():
    with pytest.raises(ValueError, match="use_sde=True applies to Box actions"):
        PPO("MlpPolicy", "CartPole-v1", use_sde=True)
    with pytest.raises(NotImplementedError, match="pass use_sde=True to PPO instead"):
        PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(use_sde=True))
    with pytest.raises(ValueError, match="sde_sample_freq"):
        PPO("MlpPolicy", "Pendulum-v1", use_sde=True, sde_sample_freq=2.5)
    model = PPO("MlpPolicy", "Pendulum-v1", **FAST)
    with pytest.raises(ValueError, match="only available with state-dependent exploration"):
        model.policy.reset_noise()


def test_recurrent_ppo_with_sde_explores_with_its_latent():
    """sb3-contrib's RecurrentPPO takes use_sde too: the memory's output is the latent of the noise."""
    env = SpaceEnv(BOX_OBS, spaces.Box(-1, 1, (2,)))
    model = PPO("MlpLstmPolicy", env, use_sde=True, sde_sample_freq=4, **FAST).learn(32)
    head = model.actor.head
    assert isinstance(head, StateDependentGaussianHead) and head.explorations.shape == (1, 64, 2)
    obs = np.zeros((1, 3), np.float32)
    first, state = model.predict(obs, episode_start=np.ones(1, bool))
    again, _ = model.predict(obs, episode_start=np.ones(1, bool))
    np.testing.assert_array_equal(first, again)  # same state, same matrices: same action
    assert not np.allclose(first, model.predict(obs, episode_start=np.ones(1, bool), deterministic=True)[0])
