"""PPO's use_sde=True: generalized state-dependent exploration, checked against SB3's own
StateDependentNoiseDistribution (log-probabilities, entropies, noise) and SB3's sampling schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from envs import SpaceEnv
from gymnasium import spaces
from stable_baselines3.common.distributions import StateDependentNoiseDistribution

from covey import PPO, SAC
from covey.envs import EarlyExitEnv
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


def test_expln_std_has_sb3s_slope_at_zero():
    """expln's std (exp below 0, log1p(x) + 1 above) has slope 1 at log_std = 0 from both sides, as SB3's
    ``get_std`` gives it: 0 is PPO's default ``log_std_init``, and a std built on ``clamp`` (whose gradient at the
    bound itself is 0 from PyTorch 2.14 on) would leave log_std there for good."""
    head = StateDependentGaussianHead(3, 2, 0.0, use_expln=True)
    head.std().sum().backward()
    sb3 = StateDependentNoiseDistribution(2, use_expln=True)
    log_std = torch.zeros(3, 2, requires_grad=True)
    sb3.get_std(log_std).sum().backward()
    assert torch.equal(head.log_std.grad, log_std.grad) and bool((log_std.grad == 1).all())


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written gradients", "autograd"])
def test_ppo_with_expln_moves_log_std_from_its_default(manual, monkeypatch):
    """use_sde with use_expln from log_std_init=0, in both of PPO's update paths: one rollout's epochs move every
    log-std."""
    monkeypatch.setattr(PPO, "manual_gradients", manual)
    model = PPO("MlpPolicy", "Pendulum-v1", use_sde=True, policy_kwargs=dict(use_expln=True), **FAST)
    assert (model._manual is not None) == manual
    log_std = model.policy.actor.head.log_std
    assert bool((log_std == 0).all())
    model.learn(16)
    assert bool((log_std != 0).all())


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


@pytest.mark.cpu
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


def test_squashed_ppo_head_matches_sb3s_squashed_noise_without_learned_features():
    """PPO's use_sde with squash_output=True against SB3's StateDependentNoiseDistribution(squash_output=True,
    learn_features=False): the same samples from the same exploration matrix, log-probabilities and mode; the
    entropy estimate is minus the log-probability (SB3's PPO uses -log_prob when entropy() is None); the latent
    takes gradients through the mean alone."""
    from covey.networks.distributions import SquashedStateDependentHead

    torch.manual_seed(0)
    latent_dim, action_dim, batch = 5, 2, 8
    head = SquashedStateDependentHead(latent_dim, action_dim, -0.5, clip_mean=0.0, learn_features=False)
    with torch.no_grad():
        head.log_std.uniform_(-1.5, 0.5)
        head.proj.weight.mul_(5.0)  # means beyond 2, which a clipped mean (SAC's) would change
    latent = torch.randn(batch, latent_dim, requires_grad=True)
    params = head(latent)
    mean = params[:, :action_dim]
    assert mean.abs().max() > 2.0
    sb3 = StateDependentNoiseDistribution(action_dim, squash_output=True, learn_features=False)
    sb3.latent_sde_dim = latent_dim
    sb3.proba_distribution(mean, head.log_std, latent)
    assert sb3.entropy() is None
    sb3.sample_weights(head.log_std, batch_size=batch)
    head.exploration, head.explorations = sb3.exploration_mat, sb3.exploration_matrices
    with torch.no_grad():
        actions = head.sample(params)
        torch.testing.assert_close(actions, sb3.sample())
        torch.testing.assert_close(head.sample(params, deterministic=True), sb3.mode())
    inside = actions.clamp(-0.999, 0.999)  # away from +-1, where the two implementations clip differently
    log_prob, entropy = head.log_prob_entropy(params, inside)
    torch.testing.assert_close(log_prob, sb3.log_prob(inside))
    torch.testing.assert_close(entropy, -log_prob)
    # learn_features=False: d log p / d latent only through the mean layer (the variance's latent is detached)
    grad = torch.autograd.grad(head.log_prob(head(latent), inside).sum(), latent)[0]
    detached = head(latent.detach())
    mean_only = detached[:, :action_dim].detach().requires_grad_(True)
    lp = head.log_prob(torch.cat([mean_only, detached[:, action_dim:]], dim=-1), inside).sum()
    torch.testing.assert_close(grad, torch.autograd.grad(lp, mean_only)[0] @ head.proj.weight)


class _RecordActions(SpaceEnv):
    """SpaceEnv that keeps every action it is given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[np.ndarray] = []

    def step(self, action):
        self.received.append(np.array(action, dtype=np.float64))
        return super().step(action)


@pytest.mark.cpu
def test_ppo_squash_output_stores_squashed_actions_and_rescales_them_for_the_env():
    """With squash_output=True the rollout keeps actions in [-1, 1] and the env gets them rescaled to its bounds
    (SB3's unscale_action), not clipped; predict rescales too. The entropy loss is the mean log-probability of the
    rollout's actions (learning rate 0: the policy that collected them is the one evaluated)."""
    box = spaces.Box(np.array([-3.0, 0.0], np.float32), np.array([5.0, 0.5], np.float32))
    env = _RecordActions(BOX_OBS, box)
    kwargs = dict(n_steps=32, batch_size=32, n_epochs=1, seed=0, learning_rate=0.0, use_sde=True)
    model = PPO("MlpPolicy", env, **kwargs, policy_kwargs=dict(squash_output=True, log_std_init=1.0))
    assert (
        model.policy.squash_output is True
        and model.policy.evaluate_actions(torch.zeros(2, 3), torch.zeros(2, 2))[2] is None
    )
    model.learn(32)
    stored = model.rollout_buffer.actions.reshape(32, 2)
    assert np.all(np.abs(stored) <= 1.0) and np.abs(stored).max() > 0.5
    expected = box.low + 0.5 * (stored + 1.0) * (box.high - box.low)
    np.testing.assert_allclose(np.stack(env.received[-32:]), expected, rtol=1e-5, atol=1e-6)
    log_probs = model.rollout_buffer.log_probs.reshape(-1)
    assert model.logger.name_to_value["train/entropy_loss"] == pytest.approx(log_probs.mean(), rel=1e-4)
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 3)).astype(np.float32)
    with torch.no_grad():
        squashed = model.actor.act(torch.as_tensor(obs), deterministic=True).numpy()
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], box.low + 0.5 * (squashed + 1.0) * (box.high - box.low), rtol=1e-6
    )


@pytest.mark.cpu
def test_ppo_squash_output_copies_sb3_weights_saves_and_loads(tmp_path):
    import stable_baselines3

    kwargs = dict(use_sde=True, sde_sample_freq=4, policy_kwargs=dict(squash_output=True, net_arch=[16]))
    model = PPO("MlpPolicy", "Pendulum-v1", **kwargs, **FAST).learn(32)
    assert model._manual is None  # the hand-written update does not cover the squashed head
    sb3 = stable_baselines3.PPO("MlpPolicy", "Pendulum-v1", **kwargs, **FAST)
    model.set_parameters(sb3.get_parameters(), exact_match=False)
    obs, actions = torch.randn(5, 3), torch.rand(5, 1) * 1.8 - 0.9
    with torch.no_grad():
        theirs, ours = sb3.policy.evaluate_actions(obs, actions), model.policy.evaluate_actions(obs, actions)
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])
    assert ours[2] is None and theirs[2] is None
    batch = obs.numpy()
    np.testing.assert_allclose(
        model.predict(batch, deterministic=True)[0], sb3.predict(batch, deterministic=True)[0], rtol=1e-5, atol=1e-6
    )
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m")
    assert loaded.policy.squash_output and type(loaded.actor.head) is type(model.actor.head)
    np.testing.assert_array_equal(
        loaded.predict(batch, deterministic=True)[0], model.predict(batch, deterministic=True)[0]
    )


def test_squash_output_errors_are_clear():
    from covey import POCA, SAC

    with pytest.raises(ValueError, match="needs use_sde=True"):
        PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(squash_output=True))
    with pytest.raises(ValueError, match="SAC always squashes"):
        SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(squash_output=True))
    with pytest.raises(ValueError, match="POCA has no state-dependent exploration"):
        POCA("MlpPolicy", EarlyExitEnv, policy_kwargs=dict(squash_output=True))


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


# ============================================================================================ SAC


def test_squashed_head_matches_sb3s_squashed_state_dependent_noise():
    """SAC's gSDE head against SB3's StateDependentNoiseDistribution(learn_features=True, squash_output=True):
    the same sample and log-probability from the same exploration matrix, and the same gradients into log_std
    (through the matrix drawn as std * N(0, 1)) and into the latent (through noise and variance)."""
    from covey.networks.distributions import SquashedStateDependentHead

    torch.manual_seed(0)
    latent_dim, action_dim, batch = 6, 2, 9
    head = SquashedStateDependentHead(latent_dim, action_dim, clip_mean=2.0)
    with torch.no_grad():
        head.log_std.uniform_(-2.0, 0.0)
        head.proj.weight.mul_(10.0)  # means beyond clip_mean, which the head clips
    latent = torch.randn(batch, latent_dim, requires_grad=True)
    params = head(latent)
    assert params[:, :action_dim].abs().max() == 2.0
    head.reset_noise(1, differentiable=True)
    actions, log_prob = head.rsample(params)
    sb3 = StateDependentNoiseDistribution(action_dim, learn_features=True, squash_output=True)
    sb3.latent_sde_dim = latent_dim
    sb3.proba_distribution(params[:, :action_dim], head.log_std, latent)
    sb3.exploration_mat, sb3.exploration_matrices = head.exploration, head.explorations
    sb3_actions = sb3.sample()
    sb3_log_prob = sb3.log_prob(sb3_actions)
    torch.testing.assert_close(actions, sb3_actions)
    torch.testing.assert_close(log_prob, sb3_log_prob)
    ours = torch.autograd.grad(log_prob.sum() + actions.sum(), [head.log_std, latent], retain_graph=True)
    theirs = torch.autograd.grad(sb3_log_prob.sum() + sb3_actions.sum(), [head.log_std, latent])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    assert ours[0].abs().sum() > 0
    torch.testing.assert_close(head.log_prob(params, actions), log_prob, atol=1e-3, rtol=1e-4)
    assert torch.equal(head.sample(params, deterministic=True), torch.tanh(params[:, :action_dim]))


def _count_reset_noise(model, calls: list) -> None:
    """Record every reset_noise call of the model's actor (SB3's or covey's) as (n, kind)."""
    actor = model.actor
    original = actor.reset_noise

    def record(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("batch_size", kwargs.get("n_envs", 1)))
        return original(*args, **kwargs)

    actor.reset_noise = record


def test_sac_draws_exploration_matrices_as_sb3_does():
    """SB3's SAC draws one matrix per env at every collection (every step with train_freq=1) and a new one
    before every gradient step; covey's the same, and the gradient steps draw it differentiably."""
    import stable_baselines3

    from covey import SAC

    def kwargs():  # a fresh dict each time: SB3 writes use_sde into the policy_kwargs it is given
        return dict(use_sde=True, learning_starts=8, batch_size=8, seed=0, policy_kwargs=dict(net_arch=[16]))

    calls = {"sb3": [], "covey": []}
    sb3 = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", **kwargs())
    _count_reset_noise(sb3, calls["sb3"])
    sb3.learn(24)
    model = SAC("MlpPolicy", "Pendulum-v1", **kwargs())
    _count_reset_noise(model, calls["covey"])
    steps = []
    draw = model.actor.head.reset_noise

    def record(n=1, differentiable=False):
        steps.append(differentiable)
        draw(n, differentiable)

    model.actor.head.reset_noise = record
    model.learn(24)
    collections = 24
    assert len(calls["sb3"]) == len(calls["covey"]) + model._n_updates  # SB3's gradient steps go through actor
    assert calls["covey"] == [1] * collections and steps.count(True) == model._n_updates == 16


def test_sac_use_sde_at_warmup_acts_with_the_policy():
    """Before learning_starts SAC acts uniformly at random (the action space's samples), or with the policy's
    gSDE noise with use_sde_at_warmup."""
    from covey import SAC

    def counted(method, calls: list):
        def call(*args, **kwargs):
            calls.append(1)
            return method(*args, **kwargs)

        return call

    for at_warmup in (False, True):
        model = SAC("MlpPolicy", "Pendulum-v1", use_sde=True, use_sde_at_warmup=at_warmup, learning_starts=100)
        draws, acts = [], []
        model.action_space.sample = counted(model.action_space.sample, draws)
        model.actor.act = counted(model.actor.act, acts)
        model.learn(20)
        assert (len(draws), len(acts)) == ((0, 20) if at_warmup else (20, 0))


@pytest.mark.cpu
def test_sac_with_sde_saves_loads_and_copies_sb3_weights(tmp_path):
    import warnings

    import stable_baselines3

    from covey import SAC
    from covey.networks.distributions import SquashedStateDependentHead

    kwargs = dict(use_sde=True, learning_starts=8, batch_size=8, seed=0, policy_kwargs=dict(net_arch=[16, 16]))
    model = SAC("MlpPolicy", "Pendulum-v1", **kwargs)
    assert isinstance(model.actor.head, SquashedStateDependentHead)
    torch.testing.assert_close(model.actor.head.log_std.detach(), torch.full((16, 1), -3.0))  # SB3's SAC default
    model.learn(16)
    model.save(tmp_path / "m")
    loaded = SAC.load(tmp_path / "m")
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    sb3 = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", **kwargs).learn(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # weights and optimizer states are copied
        model.set_parameters(sb3.get_parameters(), exact_match=False)
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], sb3.predict(obs, deterministic=True)[0], rtol=0, atol=1e-6
    )
    torch.testing.assert_close(model.actor.head.log_std, sb3.actor.log_std)


def test_sac_with_sde_logs_the_exploration_std_as_sb3(tmp_path):
    """SB3's off-policy logs record train/std, the mean of actor.get_std(), with use_sde: with SB3's weights
    copied in, covey logs the same number."""
    import stable_baselines3
    from stable_baselines3.common.logger import configure

    model = SAC("MlpPolicy", "Pendulum-v1", use_sde=True, learning_starts=20, batch_size=8, seed=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(40, log_interval=None)
    sb3 = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", use_sde=True, seed=1)
    with torch.no_grad():
        sb3.actor.log_std.uniform_(-2.0, 1.0)  # away from the initial value, every entry its own
    model.set_parameters({"policy": sb3.policy.state_dict()}, exact_match=False)
    model.dump_logs()
    model.logger.close()
    import csv

    (row,) = csv.DictReader((tmp_path / "progress.csv").read_text().splitlines())
    assert float(row["train/std"]) == pytest.approx(sb3.actor.get_std().mean().item(), rel=1e-6)
