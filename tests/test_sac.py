"""SAC: the maths by hand, target critics, gradient isolation, save/load, SB3 argument semantics, logs, errors."""

import csv
import io
import pathlib
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import SpaceEnv
from gymnasium import spaces
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.noise import VectorizedActionNoise
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.vec_env import DummyVecEnv
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

import covey
from covey import SAC
from covey.agents.sac import (
    actor_loss,
    critic_loss,
    discrete_actor_loss,
    discrete_soft_q_target,
    polyak_update,
    q_diagnostics,
    soft_q_target,
    temperature_loss,
)
from covey.networks.distributions import SquashedGaussianHead

SMALL = dict(learning_starts=50, batch_size=32, seed=0, policy_kwargs=dict(net_arch=[32, 32]))


def sac(env, **kwargs) -> SAC:
    return SAC("MlpPolicy", env, **{**SMALL, **kwargs})


class CounterEnv(gym.Env):
    """Observation ``[t]`` (steps since reset); episodes of ``length`` steps that end terminated, or truncated
    (a time limit) with ``truncate=True``. Reward: Box ``-|a - 0.5|``, Discrete ``1`` for action 1."""

    observation_space = spaces.Box(-100.0, 100.0, (1,), np.float32)

    def __init__(self, length: int = 5, discrete: bool = False, truncate: bool = False) -> None:
        self.length, self.truncate = length, truncate
        self.action_space = spaces.Discrete(2) if discrete else spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        if isinstance(self.action_space, spaces.Discrete):
            reward = float(int(action) == 1)
        else:
            reward = -float(np.abs(np.asarray(action) - 0.5).sum())
        done = self.t >= self.length
        return np.array([float(self.t)], np.float32), reward, done and not self.truncate, done and self.truncate, {}


class ActionEnv(gym.Env):
    """An env with a given action space (only its construction matters)."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, action_space: spaces.Space) -> None:
        self.action_space = action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def params_of(*modules: torch.nn.Module) -> list[torch.Tensor]:
    return [p for m in modules for p in m.parameters()]


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


# ---------------------------------------------------------------------------- the maths by hand
def test_polyak_update_by_hand():
    target, source = [torch.tensor([1.0, 2.0]), torch.tensor([10.0])], [torch.tensor([3.0, 6.0]), torch.tensor([0.0])]
    polyak_update(target, source, 0.1)
    # 0.9 * 1 + 0.1 * 3 = 1.2; 0.9 * 2 + 0.1 * 6 = 2.4; 0.9 * 10 + 0.1 * 0 = 9.0
    torch.testing.assert_close(target[0], torch.tensor([1.2, 2.4]))
    torch.testing.assert_close(target[1], torch.tensor([9.0]))
    assert source[0].tolist() == [3.0, 6.0]  # the source is not touched
    polyak_update(target, source, 1.0)  # tau = 1 copies
    assert target[0].tolist() == [3.0, 6.0] and target[1].tolist() == [0.0]


def test_soft_q_target_by_hand():
    next_q = torch.tensor([[1.0, 5.0], [2.0, 4.0]])  # (n_critics=2, B=2): min over critics = [1.0, 4.0]
    next_log_prob = torch.tensor([-0.5, 0.2])
    rewards = torch.tensor([1.0, 1.0])
    # next V = min Q - alpha * log pi = [1.0 - 0.1 * (-0.5), 4.0 - 0.1 * 0.2] = [1.05, 3.98]
    # target = r + gamma * (1 - terminated) * V = [1 + 0.9 * 1.05, 1 + 0] = [1.945, 1.0]
    target = soft_q_target(rewards, torch.tensor([0.0, 1.0]), next_q, next_log_prob, 0.1, 0.9)
    torch.testing.assert_close(target, torch.tensor([1.945, 1.0]))
    # A truncated transition is stored with terminated = 0, so it bootstraps: 1 + 0.9 * 3.98 = 4.582.
    target = soft_q_target(rewards, torch.tensor([0.0, 0.0]), next_q, next_log_prob, 0.1, 0.9)
    torch.testing.assert_close(target, torch.tensor([1.945, 4.582]))
    # alpha as a (1,)-tensor, as the agent passes it, gives the same.
    target = soft_q_target(rewards, torch.tensor([0.0, 1.0]), next_q, next_log_prob, torch.tensor([0.1]), 0.9)
    torch.testing.assert_close(target, torch.tensor([1.945, 1.0]))


def _discrete_example():
    # (n_critics=2, B=2, n_actions=2); min over critics: state 0 -> [1, 2], state 1 -> [0, 4]
    q = torch.tensor([[[1.0, 3.0], [0.0, 5.0]], [[2.0, 2.0], [1.0, 4.0]]])
    # pi(.|s0) = [0.25, 0.75]: log = [-1.3862944, -0.2876821]; pi(.|s1) = [0.5, 0.5]: log = [-0.6931472] * 2
    log_probs = torch.tensor([[0.25, 0.75], [0.5, 0.5]]).log()
    return q, log_probs


def test_discrete_soft_q_target_by_hand():
    q, log_probs = _discrete_example()
    # alpha = 0.5. V(s0) = sum_a p(a) (min Q(a) - alpha log p(a))
    #   = 0.25 * (1 + 0.5 * 1.3862944) + 0.75 * (2 + 0.5 * 0.2876821) = 0.4232868 + 1.6078808 = 2.0311676
    # target(s0) = 0.5 + 0.9 * 2.0311676 = 2.3280508; s1 is terminated: target = r = 0.5
    rewards, terminated = torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0])
    target = discrete_soft_q_target(rewards, terminated, q, log_probs, 0.5, 0.9)
    torch.testing.assert_close(target, torch.tensor([2.3280508, 0.5]))
    # Not terminated, V(s1) = 0.5 * (0 + 0.5 * 0.6931472) + 0.5 * (4 + 0.5 * 0.6931472) = 2.3465736
    # target(s1) = 0.5 + 0.9 * 2.3465736 = 2.6119162
    target = discrete_soft_q_target(rewards, torch.zeros(2), q, log_probs, 0.5, 0.9)
    torch.testing.assert_close(target, torch.tensor([2.3280508, 2.6119162]))


def test_critic_loss_by_hand_and_target_is_detached():
    current_q = torch.tensor([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)  # (n_critics=2, B=2)
    target = torch.tensor([2.0, 2.0], requires_grad=True)
    # critic 0: errors [-1, 0] -> mse 0.5; critic 1: errors [1, -2] -> mse 2.5; 0.5 * (0.5 + 2.5) = 1.5
    loss = critic_loss(current_q, target)
    torch.testing.assert_close(loss, torch.tensor(1.5))
    loss.backward()
    # d/dQ_ib of 0.5 * mean_b (Q_ib - y_b)^2 = (Q_ib - y_b) / B
    torch.testing.assert_close(current_q.grad, torch.tensor([[-0.5, 0.0], [0.5, -1.0]]))
    assert target.grad is None


def test_actor_loss_by_hand():
    q_pi = torch.tensor([[1.0, 4.0], [2.0, 3.0]])  # min over critics = [1, 3]
    log_prob = torch.tensor([-1.0, 0.5])
    # alpha = 0.2: [0.2 * -1 - 1, 0.2 * 0.5 - 3] = [-1.2, -2.9]; mean = -2.05
    torch.testing.assert_close(actor_loss(q_pi, log_prob, 0.2), torch.tensor(-2.05))


def test_discrete_actor_loss_by_hand():
    q, log_probs = _discrete_example()
    # alpha = 0.5. s0: 0.25 * (0.5 * -1.3862944 - 1) + 0.75 * (0.5 * -0.2876821 - 2) = -2.0311676
    #              s1: 0.5 * (0.5 * -0.6931472 - 0) + 0.5 * (0.5 * -0.6931472 - 4) = -2.3465736
    # mean = -2.1888706
    torch.testing.assert_close(discrete_actor_loss(q, log_probs, 0.5), torch.tensor(-2.1888706))


def test_temperature_loss_sign():
    target_entropy = -1.0
    log_alpha = torch.tensor([0.3], requires_grad=True)
    # Entropy estimate -log pi = [-2, -1], below the target -1: log pi + target = [1, 0] (mean 0.5 > 0).
    log_prob = torch.tensor([2.0, 1.0], requires_grad=True)
    loss = temperature_loss(log_alpha, log_prob, target_entropy)
    torch.testing.assert_close(loss, torch.tensor(-0.15))  # -(0.3 * 0.5)
    loss.backward()
    torch.testing.assert_close(log_alpha.grad, torch.tensor([-0.5]))  # d loss / d log_alpha < 0
    assert log_prob.grad is None  # the policy's log-prob enters detached
    optimizer = torch.optim.SGD([log_alpha], lr=0.1)
    optimizer.step()
    torch.testing.assert_close(log_alpha.detach(), torch.tensor([0.35]))  # 0.3 + 0.1 * 0.5: alpha grows
    # Entropy above target: log pi + target = [-4, -3] (mean -3.5) -> gradient +3.5, alpha shrinks.
    log_alpha.grad = None
    temperature_loss(log_alpha, torch.tensor([-3.0, -2.0]), target_entropy).backward()
    torch.testing.assert_close(log_alpha.grad, torch.tensor([3.5]))


@pytest.mark.parametrize("spread", [1.0, 8.0], ids=["inside", "saturating"])
def test_squashed_gaussian_rsample_is_sb3s(spread):
    """The sample and its log-probability as SB3's SquashedDiagGaussianDistribution gives them, tanh's
    correction ``log(1 - a^2 + 1e-6)`` included; inside the saturation that is torch's exact density."""
    from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution

    head = SquashedGaussianHead(in_dim=4, action_dim=3)
    gen = torch.Generator().manual_seed(0)
    mean = torch.empty(64, 3).uniform_(-spread, spread, generator=gen)
    log_std = torch.empty(64, 3).uniform_(-2.0, 0.0, generator=gen)
    params = torch.cat([mean, log_std], dim=-1).requires_grad_(True)
    torch.manual_seed(1)
    actions, log_prob = head.rsample(params)
    torch.manual_seed(1)
    u = mean + log_std.exp() * torch.randn_like(mean)  # the same pre-squash sample
    tanh = TanhTransform(cache_size=1)
    y = tanh(u)
    torch.testing.assert_close(actions.detach(), y)
    assert log_prob.shape == (64,)
    sb3 = SquashedDiagGaussianDistribution(3).proba_distribution(mean, log_std)
    torch.testing.assert_close(log_prob.detach(), sb3.log_prob(y, gaussian_actions=u), atol=1e-5, rtol=1e-6)
    exact = TransformedDistribution(Normal(mean, log_std.exp()), [tanh]).log_prob(y).sum(-1)
    if spread == 1.0:
        torch.testing.assert_close(log_prob.detach(), exact, atol=1e-3, rtol=0)
    else:  # where 1 - a^2 nears 1e-6, SB3's correction bounds the density
        assert (exact - log_prob.detach()).max() > 0.1
    assert bool((actions.abs() <= 1).all())
    # Reparameterized: gradients reach the distribution parameters.
    (log_prob.sum() + actions.sum()).backward()
    assert params.grad is not None and bool((params.grad != 0).any())


def test_squashed_gaussian_clamps_log_std_and_stays_finite():
    head = SquashedGaussianHead(in_dim=4, action_dim=1)
    params = torch.tensor([[0.0, 5.0], [30.0, -1.0], [-30.0, -1.0]])  # log_std 5 is clamped to 2
    torch.manual_seed(3)
    actions, log_prob = head.rsample(params)
    torch.manual_seed(3)
    noise = torch.randn(3, 1)
    torch.testing.assert_close(actions[0], torch.tanh(np.exp(2.0) * noise[0]))
    assert bool(torch.isfinite(log_prob).all())  # tanh(+-30) rounds to +-1 in float32: still finite
    assert head.sample(params, deterministic=True).tolist() == torch.tanh(params[:, :1]).tolist()


# ---------------------------------------------------------------------------- target critics
def test_train_updates_target_by_polyak_with_tau():
    model = sac("Pendulum-v1", tau=0.5).learn(100)
    old_target, old_critic = snapshot(model.critic_target), snapshot(model.critic)
    assert any(not torch.equal(t, c) for t, c in zip(old_target, old_critic))
    model.train(gradient_steps=1, batch_size=32)
    new_critic = snapshot(model.critic)
    assert any(not torch.equal(a, b) for a, b in zip(old_critic, new_critic))
    for t_old, t_new, c_new in zip(old_target, model.critic_target.parameters(), new_critic):
        torch.testing.assert_close(t_new.detach(), 0.5 * t_old + 0.5 * c_new, atol=1e-6, rtol=0)


def test_target_update_interval_skips_then_updates():
    """target_update_interval=2: the target moves on every second gradient step (counted over the run)."""
    model = sac("Pendulum-v1", tau=0.5, target_update_interval=2).learn(60)
    assert model._n_updates == 10
    old_target = snapshot(model.critic_target)
    model.train(gradient_steps=1, batch_size=32)  # gradient step 11: no update
    assert all(torch.equal(a, b) for a, b in zip(old_target, model.critic_target.parameters()))
    model.train(gradient_steps=1, batch_size=32)  # gradient step 12: update
    for t_old, t_new, c_new in zip(old_target, model.critic_target.parameters(), model.critic.parameters()):
        torch.testing.assert_close(t_new.detach(), 0.5 * t_old + 0.5 * c_new.detach(), atol=1e-6, rtol=0)


def test_target_update_interval_within_one_train_call():
    model = sac("Pendulum-v1", tau=0.5, target_update_interval=2).learn(60)
    old_target = snapshot(model.critic_target)
    model.train(gradient_steps=2, batch_size=32)  # gradient steps 11 and 12: one update, after the second
    for t_old, t_new, c_new in zip(old_target, model.critic_target.parameters(), model.critic.parameters()):
        torch.testing.assert_close(t_new.detach(), 0.5 * t_old + 0.5 * c_new.detach(), atol=1e-6, rtol=0)


def test_target_critics_move_during_learn_with_update_interval():
    """With the default gradient_steps=1 (one gradient step per train() call) an interval > 1 still updates."""
    model = sac("Pendulum-v1", tau=0.5, target_update_interval=2)
    initial = snapshot(model.critic_target)
    model.learn(100)  # 50 gradient steps: 25 target updates
    assert model._n_updates == 50
    assert any(not torch.equal(a, b) for a, b in zip(initial, model.critic_target.parameters()))


@pytest.mark.parametrize("n_steps", [1, 3])
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_critic_objective_regresses_taken_actions_on_target_critics(env_id, n_steps):
    model = sac(env_id, n_steps=n_steps).learn(100)
    with torch.no_grad():  # make the target critics clearly differ from the online ones
        for p in model.critic_target.parameters():
            p.add_(0.1)
    np.random.seed(0)
    b = model.replay_buffer.sample_batch(32)
    gamma = model.gamma
    if n_steps > 1:  # n-step returns bootstrap with gamma ** (steps summed), 1 to 3
        gamma = b.discounts
        assert set(np.round(gamma.tolist(), 5)) <= {0.99, 0.9801, 0.9703} and (gamma < 0.98).any()
    else:
        assert b.discounts is None
    alpha = model._ent_coef()
    torch.manual_seed(5)
    loss, _, (q, q_target) = model._critic_objective(b, alpha)
    torch.manual_seed(5)  # the same next-action noise
    with torch.no_grad():
        next_params = model.actor.distribution_params(b.next_observations)
        if model.discrete:
            q_all = model.critic.values(b.observations)  # (2, B, n_actions): Q of the taken actions
            expected_q = q_all[:, torch.arange(32), b.actions]
            next_q = model.critic_target.values(b.next_observations)
            target = discrete_soft_q_target(b.rewards, b.terminated, next_q, next_params.log_softmax(-1), alpha, gamma)
        else:
            expected_q = model.critic.values(b.observations, b.actions)
            next_actions, next_log_prob = model.actor.head.rsample(next_params)
            next_q = model.critic_target.values(b.next_observations, next_actions)
            target = soft_q_target(b.rewards, b.terminated, next_q, next_log_prob, alpha, gamma)
    assert expected_q.shape == (2, 32)
    torch.testing.assert_close(q, expected_q)
    torch.testing.assert_close(q_target, target)
    torch.testing.assert_close(loss.detach(), critic_loss(expected_q, target))


# ---------------------------------------------------------------------------- gradient isolation
@pytest.fixture(params=["Pendulum-v1", "CartPole-v1"])
def learned(request):
    model = sac(request.param).learn(100)
    np.random.seed(0)
    return model, model.replay_buffer.sample_batch(32)


def clear_grads(model: SAC) -> None:
    for p in [*params_of(model.actor, model.critic, model.critic_target), model.log_ent_coef]:
        p.grad = None


def has_grad(params) -> bool:
    return any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params)


def no_grad(params) -> bool:
    return all(p.grad is None or bool(p.grad.abs().sum() == 0) for p in params)


def test_temperature_objective_reaches_only_log_alpha(learned):
    model, b = learned
    clear_grads(model)
    model._temperature_objective(model._policy_sample(b.observations)).backward()
    assert has_grad([model.log_ent_coef])
    assert no_grad(params_of(model.actor, model.critic, model.critic_target))


def test_critic_objective_reaches_only_the_critics(learned):
    model, b = learned
    clear_grads(model)
    model._critic_objective(b, model._ent_coef())[0].backward()
    assert has_grad(params_of(model.critic))
    assert no_grad(params_of(model.actor))
    assert model.log_ent_coef.grad is None
    assert all(p.grad is None for p in model.critic_target.parameters())


def test_actor_objective_reaches_only_the_actor(learned):
    model, b = learned
    clear_grads(model)
    loss = model._actor_objective(b, model._policy_sample(b.observations), model._ent_coef())
    loss.backward()
    assert has_grad(params_of(model.actor))
    assert all(p.grad is None for p in model.critic.parameters())
    assert all(p.grad is None for p in model.critic_target.parameters())
    assert model.log_ent_coef.grad is None
    assert all(p.requires_grad for p in model.critic.parameters())  # restored after the actor pass


def test_gradient_step_critic_update_does_not_move_the_actor(learned):
    model, b = learned
    for opt in (model.actor_optimizer, model.ent_coef_optimizer):
        for group in opt.param_groups:
            group["lr"] = 0.0
    actor, critic, log_alpha = snapshot(model.actor), snapshot(model.critic), model.log_ent_coef.detach().clone()
    model._gradient_step(b)
    assert all(torch.equal(a, p) for a, p in zip(actor, model.actor.parameters()))
    assert torch.equal(log_alpha, model.log_ent_coef.detach())
    assert any(not torch.equal(c, p) for c, p in zip(critic, model.critic.parameters()))


def test_gradient_step_actor_update_does_not_move_the_critics(learned):
    model, b = learned
    for group in model.critic_optimizer.param_groups:
        group["lr"] = 0.0
    actor, critic, target = snapshot(model.actor), snapshot(model.critic), snapshot(model.critic_target)
    model._gradient_step(b)
    assert all(torch.equal(c, p) for c, p in zip(critic, model.critic.parameters()))
    assert all(torch.equal(c, p) for c, p in zip(target, model.critic_target.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(actor, model.actor.parameters()))


# ---------------------------------------------------------------------------- save / load
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_save_load_predicts_identically(tmp_path, env_id):
    model = sac(env_id).learn(100)
    model.save(tmp_path / "sac")
    loaded = SAC.load(tmp_path / "sac")
    obs = model.replay_buffer.observations[:100, 0]
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    with torch.no_grad():
        t = torch.as_tensor(obs, device=model.device)
        assert torch.equal(model.actor.distribution_params(t), loaded.actor.distribution_params(t))
    for name in ("critic", "critic_target"):
        ours, theirs = getattr(model, name).state_dict(), getattr(loaded, name).state_dict()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # The learned temperature survives, still attached to its optimizer.
    assert model.log_ent_coef.item() != 0.0  # moved from log(1) by training
    assert torch.equal(loaded.log_ent_coef, model.log_ent_coef)
    assert loaded.ent_coef_optimizer.param_groups[0]["params"][0] is loaded.log_ent_coef
    assert loaded.target_entropy == model.target_entropy


def test_replay_buffer_files_are_named_and_placed_as_sb3_names_them(tmp_path):
    """A path without a suffix gets .pkl (the file is still an npz of plain arrays), missing folders are made,
    and loading takes the path as given to save or the file's own name; a suffix is kept; open files work."""
    model = sac("Pendulum-v1", buffer_size=200).learn(60)
    target = tmp_path / "new" / "folder" / "buffer"
    model.save_replay_buffer(target)
    assert [p.name for p in target.parent.iterdir()] == ["buffer.pkl"]  # and no temporary file left behind
    with np.load(target.parent / "buffer.pkl", allow_pickle=False) as data:
        assert "meta" in data.files
    model.save_replay_buffer(tmp_path / "buffer.v2")
    stream = io.BytesIO()
    model.save_replay_buffer(stream)
    stream.seek(0)
    for path in (target, str(target), target.parent / "buffer.pkl", tmp_path / "buffer.v2", stream):
        fresh = sac("Pendulum-v1", buffer_size=200)
        fresh.load_replay_buffer(path)
        assert fresh.replay_buffer.size() == 60
        np.testing.assert_array_equal(fresh.replay_buffer.actions, model.replay_buffer.actions)
    with pytest.raises(FileNotFoundError):
        fresh.load_replay_buffer(tmp_path / "missing")


@pytest.mark.parametrize("n_envs", [1, 2])
def test_a_replay_buffer_file_of_another_size_replaces_the_buffer_as_in_sb3(tmp_path, n_envs):
    """SB3's load_replay_buffer replaces the model's buffer with the file's, whatever buffer_size the model was
    built with: covey's gives the model a buffer of the file's size, filled from it, and training goes on. A
    file of other spaces is refused, and the model keeps its buffer."""
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env

    def env():
        return make_vec_env("Pendulum-v1", n_envs=n_envs)

    for lib in (stable_baselines3, covey):
        source = lib.SAC("MlpPolicy", env(), buffer_size=400, learning_starts=20, seed=0).learn(40 * n_envs)
        model = lib.SAC("MlpPolicy", env(), learning_starts=20, seed=0)  # SB3's default buffer_size: 1,000,000
        if lib is covey:
            source.save_replay_buffer(tmp_path / "buffer")
            model.load_replay_buffer(tmp_path / "buffer")
            np.testing.assert_array_equal(model.replay_buffer.actions, source.replay_buffer.actions)
            assert model.buffer_size == 400 and model.replay_buffer.size() == 40 and not model.replay_buffer.full
            kept = model.replay_buffer
            with pytest.raises(ValueError, match="shape"):  # a file of another env's spaces
                model.load_replay_buffer(make_cartpole_buffer(tmp_path, n_envs))
            assert model.replay_buffer is kept and model.buffer_size == 400
        else:
            source.save_replay_buffer(tmp_path / "sb3_buffer")
            model.load_replay_buffer(tmp_path / "sb3_buffer")
        assert (model.replay_buffer.buffer_size, model.replay_buffer.size()) == (400 // n_envs, 40)
        model.learn(10, reset_num_timesteps=False)
        assert model.replay_buffer.size() == 40 + -(-10 // n_envs)


def test_a_replay_buffer_file_brings_its_returns_settings_as_sb3s_does(tmp_path):
    """SB3's buffer file is its buffer, n-step length and time-limit handling included; covey's file keeps them
    too, and a model given it goes on with the file's (its n_steps and saved settings follow), where it kept its
    own and trained on other targets without a word. A file of hindsight replay warns where the model
    has a plain buffer; a file written before covey kept them leaves the model's settings."""
    from stable_baselines3.common.envs import BitFlippingEnv
    from stable_baselines3.her import HerReplayBuffer

    small = dict(buffer_size=200, learning_starts=5, batch_size=16, seed=0)
    sac("Pendulum-v1", n_steps=3, **small).learn(30).save_replay_buffer(tmp_path / "nstep")
    model = sac("Pendulum-v1", **small)
    model.load_replay_buffer(tmp_path / "nstep")
    assert model.n_steps == 3 and model.replay_buffer.n_steps == 3
    assert model.replay_buffer.sample(8).discounts is not None
    model.learn(5, reset_num_timesteps=False)
    timeouts = dict(replay_buffer_kwargs=dict(handle_timeout_termination=False), optimize_memory_usage=True)
    sac("Pendulum-v1", **timeouts, **small).learn(30).save_replay_buffer(tmp_path / "memory")
    model = sac("Pendulum-v1", n_steps=3, **small)  # SB3 refuses n-step returns beside memory saving
    model.load_replay_buffer(tmp_path / "memory")
    buffer = model.replay_buffer
    assert (model.n_steps, buffer.n_steps, buffer.optimize_memory_usage, buffer.handle_timeout_termination) == (
        1,
        1,
        True,
        False,
    )
    model.save(tmp_path / "model")
    assert SAC.load(tmp_path / "model").replay_buffer.handle_timeout_termination is False
    # a file of an earlier covey holds no returns settings: the model's stay
    with np.load(tmp_path / "nstep.pkl") as archive:
        older = {name: archive[name] for name in archive.files if name != "returns"}
    with open(tmp_path / "older.pkl", "wb") as f:
        np.savez(f, **older)
    model = sac("Pendulum-v1", **small)
    model.load_replay_buffer(tmp_path / "older.pkl")
    assert model.n_steps == 1 and model.replay_buffer.n_steps == 1
    env = BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)
    her = SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer, **small).learn(12)
    her.save_replay_buffer(tmp_path / "her")
    plain = SAC("MultiInputPolicy", env, **small)
    with pytest.warns(UserWarning, match="saved by a hindsight replay buffer .* no goal is relabelled"):
        plain.load_replay_buffer(tmp_path / "her")
    assert plain.replay_buffer.size() == 12


def test_warm_up_actions_reach_the_env_as_sb3s_do():
    """Before learning_starts SB3 steps the env with the random sample scaled into [-1, 1] and back, which may
    differ from the sample in its last bit; covey's env gets the same actions, so a seeded run follows SB3's
    trajectory bit for bit (the env got the raw sample)."""
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback

    class Actions(BaseCallback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def _on_step(self) -> bool:
            self.seen.append(np.array(self.locals["actions"]))
            self.seen.append(np.array(self.locals["new_obs"]))
            return True

    runs = []
    for lib in (stable_baselines3, covey):
        actions = Actions()
        lib.SAC("MlpPolicy", "Pendulum-v1", learning_starts=1_000, seed=0).learn(100, callback=actions)
        runs.append(np.concatenate([x.ravel() for x in actions.seen]))
    np.testing.assert_array_equal(runs[1], runs[0])


def test_each_collected_step_moves_progress_and_calls_the_models_on_step_as_in_sb3():
    """SB3's off-policy loop updates the schedules' progress and calls the model's ``_on_step`` hook after every
    stored step (DQN-style subclasses move their targets there); covey's did neither (the progress moved only when
    training ran, and a subclass's ``_on_step`` was never called)."""
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback

    class Progress(BaseCallback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def _on_step(self) -> bool:
            assert self.locals["continue_training"] is True
            return True

        def _on_rollout_end(self) -> None:
            self.seen.append(self.model._current_progress_remaining)

    seen = {}
    for lib in (stable_baselines3, covey):

        class Counting(lib.SAC):
            hooks = 0

            def _on_step(self) -> None:
                super()._on_step()
                self.hooks += 1

        progress = Progress()
        model = Counting("MlpPolicy", "Pendulum-v1", learning_starts=60, train_freq=8, buffer_size=500, seed=0)
        model.learn(100, callback=progress)
        seen[lib.__name__] = (model.hooks, progress.seen)
    assert seen["covey"] == seen["stable_baselines3"]
    assert seen["covey"][0] == 104 and seen["covey"][1][0] == pytest.approx(0.92)


def make_cartpole_buffer(tmp_path, n_envs: int) -> pathlib.Path:
    """A replay buffer file of SAC on CartPole (other observations and actions than Pendulum's), of 100 rows."""
    from stable_baselines3.common.env_util import make_vec_env

    path = tmp_path / "cartpole_buffer.npz"
    env = make_vec_env("CartPole-v1", n_envs=n_envs)
    model = covey.SAC("MlpPolicy", env, buffer_size=100 * n_envs, learning_starts=10, seed=0)
    model.learn(10).save_replay_buffer(path)
    return path


def test_an_sb3_replay_buffer_file_is_refused_without_being_unpickled(tmp_path):
    """SB3's save_replay_buffer pickles the buffer; covey names that and the way out, and runs nothing."""
    import stable_baselines3

    sb3 = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", buffer_size=200, learning_starts=100, seed=0).learn(20)
    sb3.save_replay_buffer(tmp_path / "sb3_buffer")
    model = sac("Pendulum-v1", buffer_size=200)
    with pytest.raises(ValueError, match=r"holds pickled data, as SB3's save_replay_buffer writes it.*covey's save"):
        model.load_replay_buffer(tmp_path / "sb3_buffer")
    assert model.replay_buffer.size() == 0


def test_a_failed_replay_buffer_save_keeps_the_previous_file(tmp_path, monkeypatch):
    model = sac("Pendulum-v1", buffer_size=200).learn(60)
    model.save_replay_buffer(tmp_path / "replay.npz")
    before = (tmp_path / "replay.npz").read_bytes()

    def full_disk(file, **arrays):
        file.write(b"half a buffer")
        raise OSError("No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        model.save_replay_buffer(tmp_path / "replay.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]
    assert (tmp_path / "replay.npz").read_bytes() == before


def test_sb3_replay_buffer_arguments_that_match_covey_are_accepted_and_the_rest_refused():
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer

    for cls in (None, ReplayBuffer, DictReplayBuffer):
        model = sac("Pendulum-v1", replay_buffer_class=cls, replay_buffer_kwargs=dict(handle_timeout_termination=True))
        assert model.replay_buffer is not None

    class Prioritized(ReplayBuffer):
        pass

    with pytest.raises(ValueError, match="HerReplayBuffer needs a goal-conditioned env"):  # tests/test_her.py
        sac("Pendulum-v1", replay_buffer_class=HerReplayBuffer)
    with pytest.raises(NotImplementedError, match="Prioritized \\(a custom replay buffer\\).*Remove"):
        sac("Pendulum-v1", replay_buffer_class=Prioritized)
    with pytest.raises(ValueError, match="handle_timeout_termination='no' is invalid"):
        sac("Pendulum-v1", replay_buffer_kwargs=dict(handle_timeout_termination="no"))
    with pytest.raises(NotImplementedError, match="\\['n_sampled_goal'\\] are not supported"):
        sac("Pendulum-v1", replay_buffer_kwargs=dict(n_sampled_goal=4))


def test_n_step_returns_from_sacs_argument_or_sb3s_n_step_buffer(tmp_path):
    from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer

    model = sac("Pendulum-v1", n_steps=3, gamma=0.9)
    assert (model.n_steps, model.replay_buffer.n_steps, model.replay_buffer.gamma) == (3, 3, 0.9)
    model.learn(60).save(tmp_path / "nstep")
    assert SAC.load(tmp_path / "nstep").replay_buffer.n_steps == 3
    # SB3's NStepReplayBuffer brings its own n_steps (default 3) and gamma (default 0.99).
    kwargs = dict(n_steps=5, gamma=0.99)
    assert sac("Pendulum-v1", replay_buffer_class=NStepReplayBuffer, replay_buffer_kwargs=kwargs).n_steps == 5
    assert sac("Pendulum-v1", replay_buffer_class=NStepReplayBuffer).replay_buffer.n_steps == 3
    # SB3 discounts with the buffer's gamma, which covey's returns do not take: the error names where it came from
    own = r"NStepReplayBuffer's own gamma=0.99 \(.*\) differs from SAC's gamma=0.9.*Pass n_steps=3 and the gamma"
    with pytest.raises(NotImplementedError, match=own):
        sac("Pendulum-v1", gamma=0.9, replay_buffer_class=NStepReplayBuffer)
    given = r"replay_buffer_kwargs gamma=0.95 \(.*\) differs from SAC's gamma=0.99.*Pass n_steps=2 and the gamma"
    with pytest.raises(NotImplementedError, match=given):
        sac("Pendulum-v1", replay_buffer_class=NStepReplayBuffer, replay_buffer_kwargs=dict(n_steps=2, gamma=0.95))
    with pytest.warns(UserWarning, match="n_steps=3 is ignored because replay_buffer_class=ReplayBuffer"):
        assert sac("Pendulum-v1", n_steps=3, replay_buffer_class=ReplayBuffer).replay_buffer.n_steps == 1
    with pytest.raises(ValueError, match="n_steps=0 is invalid"):
        sac("Pendulum-v1", n_steps=0)
    with pytest.raises(ValueError, match="optimize_memory_usage=False"):
        sac("Pendulum-v1", n_steps=3, optimize_memory_usage=True)


def test_save_load_keeps_a_fixed_ent_coef(tmp_path):
    model = sac("Pendulum-v1", ent_coef=0.2, learning_starts=10).learn(20)
    model.save(tmp_path / "fixed")
    loaded = SAC.load(tmp_path / "fixed")
    assert loaded.log_ent_coef is None and loaded.ent_coef_optimizer is None
    assert loaded._ent_coef().item() == pytest.approx(0.2)


def test_a_learned_temperature_loads_as_a_fixed_one_when_ent_coef_is_given(tmp_path):
    """``load(path, ent_coef=0.1)`` of a model that learned its temperature: the given value holds (the file's
    temperature and its optimizer are left out, with a warning) and training goes on with it."""
    sac("Pendulum-v1", learning_starts=10).learn(20).save(tmp_path / "learned")
    with pytest.warns(UserWarning, match=r"learned temperature \(ent_coef, ent_coef_optimizer\).*fixed at 0.1"):
        loaded = SAC.load(tmp_path / "learned", env="Pendulum-v1", ent_coef=0.1)
    assert loaded.log_ent_coef is None and loaded.ent_coef_optimizer is None
    loaded.learn(20, reset_num_timesteps=False)
    assert loaded._ent_coef().item() == pytest.approx(0.1)
    assert loaded.logger.name_to_value["train/ent_coef"] == pytest.approx(0.1)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_replay_buffer_round_trip_and_continued_training(tmp_path, env_id):
    model = sac(env_id, buffer_size=1000).learn(100)
    model.save(tmp_path / "sac")
    model.save_replay_buffer(tmp_path / "replay.npz")
    loaded = SAC.load(tmp_path / "sac", env=gym.make(env_id))
    assert loaded.replay_buffer.size() == 0
    loaded.load_replay_buffer(tmp_path / "replay.npz")
    ours, theirs = model.replay_buffer, loaded.replay_buffer
    assert theirs.size() == ours.size() == 100
    assert (theirs.pos, theirs.full) == (ours.pos, ours.full)
    np.testing.assert_array_equal(theirs.observations, ours.observations)
    np.testing.assert_array_equal(theirs.next_observations, ours.next_observations)
    for name in ("actions", "rewards", "terminated", "dones"):
        np.testing.assert_array_equal(getattr(theirs, name), getattr(ours, name))
    updates = loaded._n_updates
    assert loaded.num_timesteps == 100 and updates == 50
    loaded.learn(100, reset_num_timesteps=False)
    assert loaded.num_timesteps == 200
    assert loaded.replay_buffer.size() == 200
    assert loaded._n_updates == updates + 100


# ---------------------------------------------------------------------------- SB3 argument semantics
def _start(model: SAC, total: int = 1000):
    _, callback = model._setup_learn(total, None, True, "test", False)
    return callback


def collect(model, callback):
    """One collection as SB3's learn asks for it (SB3's collect_rollouts signature)."""
    cfg = (model.train_freq, model.replay_buffer, model.action_noise, model.learning_starts)
    return model.collect_rollouts(model.env, callback, *cfg, log_interval=None)


@pytest.mark.parametrize(
    "train_freq", [(2, "episode"), TrainFreq(2, TrainFrequencyUnit.EPISODE), (np.int64(2), TrainFrequencyUnit.EPISODE)]
)
def test_train_freq_in_episodes(train_freq):
    model = sac(CounterEnv(length=5), train_freq=train_freq, learning_starts=0, gradient_steps=1)
    assert model.train_freq == TrainFreq(2, TrainFrequencyUnit.EPISODE)  # SB3's own type, as SB3 keeps it
    assert model.train_freq.unit == TrainFrequencyUnit.EPISODE and type(model.train_freq.frequency) is int
    callback = _start(model)
    assert collect(model, callback) == RolloutReturn(10, 2, True)  # two episodes of 5 steps
    assert model.num_timesteps == 10 and model._episode_num == 2
    assert collect(model, callback) == RolloutReturn(10, 2, True)
    model = sac(CounterEnv(length=5), train_freq=(2, "episode"), learning_starts=0, gradient_steps=1).learn(30)
    assert model._n_updates == 3  # one train() after each pair of episodes


def test_train_freq_in_steps():
    model = sac(CounterEnv(length=5), train_freq=(3, "step"), learning_starts=0, gradient_steps=2)
    assert collect(model, _start(model)) == RolloutReturn(3, 0, True)
    model = sac(CounterEnv(length=5), train_freq=TrainFreq(3, TrainFrequencyUnit.STEP), learning_starts=0)
    assert model.train_freq == TrainFreq(3, TrainFrequencyUnit.STEP)
    assert collect(model, _start(model)) == RolloutReturn(3, 0, True)
    model = sac(CounterEnv(length=5), train_freq=3, learning_starts=0, gradient_steps=2).learn(30)
    assert model._n_updates == 20  # 10 collections of 3 steps, 2 gradient steps each


@pytest.mark.parametrize("negative", [-1, -2])
def test_gradient_steps_minus_one_matches_collected_steps(negative):
    """Any negative gradient_steps means as many as env steps collected, as in SB3 (-2 was refused)."""
    model = sac(CounterEnv(length=5), train_freq=4, gradient_steps=negative, learning_starts=0).learn(40)
    assert model._n_updates == 40  # 10 collections of 4 env steps, 4 gradient steps each
    # learning_starts=10: collections end at 4, 8, 12, ..., 40; training starts once past 10: 8 x 4.
    model = sac(CounterEnv(length=5), train_freq=4, gradient_steps=-1, learning_starts=10).learn(40)
    assert model._n_updates == 32


def test_gradient_steps_minus_one_counts_steps_of_all_envs():
    env = DummyVecEnv([lambda: Monitor(CounterEnv(length=5)) for _ in range(2)])
    model = sac(env, train_freq=4, gradient_steps=-1, learning_starts=0).learn(40)
    # 5 collections of 4 vector steps = 8 env steps each: 8 gradient steps per collection.
    assert model.num_timesteps == 40
    assert model._n_updates == 40


def test_fixed_ent_coef():
    model = sac("Pendulum-v1", ent_coef=0.2)
    assert model.ent_coef_optimizer is None and model.log_ent_coef is None
    assert "ent_coef_optimizer" not in model.get_parameters()
    assert model._ent_coef().item() == pytest.approx(0.2)
    model.learn(100)
    assert model._ent_coef().item() == pytest.approx(0.2)


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
def test_a_fixed_temperature_annealed_through_ent_coef_tensor_as_in_sb3(monkeypatch, tmp_path, manual):
    """SB3's way to change a fixed temperature during training, model.ent_coef_tensor = ..., is the temperature
    the updates use and log: a run that sets 0.0 at its start trains as a model built with ent_coef=0.0."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Anneal(BaseCallback):
        def _on_training_start(self) -> None:
            self.model.ent_coef_tensor = torch.tensor(0.0)

        def _on_step(self) -> bool:
            return True

    monkeypatch.setattr(SAC, "manual_gradients", manual)
    annealed = sac("Pendulum-v1", ent_coef=0.5, learning_starts=20, seed=3)  # each built, then trained, in turn:
    assert annealed.ent_coef_tensor.item() == 0.5
    annealed.learn(60, callback=Anneal())  # the seed sets the global generators the run draws from
    plain = sac("Pendulum-v1", ent_coef=0.0, learning_starts=20, seed=3).learn(60)
    assert annealed.logger.name_to_value["train/ent_coef"] == 0.0
    for p, q in zip(annealed.policy.parameters(), plain.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    annealed.ent_coef_tensor = 0.25  # a plain number, too
    annealed.learn(10, reset_num_timesteps=False)
    assert annealed.logger.name_to_value["train/ent_coef"] == 0.25
    # the temperature in force is what the file keeps, as SB3's file keeps its ent_coef_tensor
    annealed.save(tmp_path / "annealed.zip")
    assert SAC.load(tmp_path / "annealed.zip").ent_coef_tensor.item() == 0.25


def test_a_fixed_temperature_given_comes_back_from_a_file_as_given(tmp_path):
    """The file kept the float32 tensor's value, so ent_coef=0.005 loaded as 0.004999999888241291 (SB3's
    loads 0.005): the number given is kept where the tensor in force still holds it."""
    for given in (0.005, 0.1):
        sac("Pendulum-v1", ent_coef=given).save(tmp_path / "m.zip")
        loaded = SAC.load(tmp_path / "m.zip")
        assert loaded.ent_coef == given and loaded.ent_coef_tensor.item() == float(np.float32(given))


def test_auto_ent_coef_initial_value():
    model = sac("Pendulum-v1", ent_coef="auto_0.1")
    assert model._ent_coef().item() == pytest.approx(0.1)
    assert model.ent_coef_optimizer is not None
    assert sac("Pendulum-v1")._ent_coef().item() == pytest.approx(1.0)  # "auto" starts at 1


def test_auto_target_entropy():
    assert sac("Pendulum-v1").target_entropy == -1.0  # -dim(A) = -1
    assert sac(ActionEnv(spaces.Box(-1.0, 1.0, (2, 3), np.float32))).target_entropy == -6.0
    assert sac("CartPole-v1").target_entropy == pytest.approx(0.34657359)  # 0.5 * log(2)
    assert sac(ActionEnv(spaces.Discrete(5))).target_entropy == pytest.approx(0.80471896)  # 0.5 * log(5)
    assert sac("Pendulum-v1", target_entropy=-3).target_entropy == -3.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_entropy": -np.prod((2,))},  # SB3's own expression: a NumPy int
        {"target_entropy": np.float32(-0.5)},
        {"ent_coef": np.float32(0.1)},
        {"ent_coef": np.int64(0)},
        {"ent_coef": "0.1", "target_entropy": "-1.5"},  # SB3 takes float() of both
    ],
    ids=["np.int64 target", "np.float32 target", "np.float32 ent_coef", "np.int64 ent_coef", "strings"],
)
def test_numpy_and_text_numbers_for_the_temperature_are_taken_as_sb3_takes_them(kwargs):
    import stable_baselines3 as sb3

    theirs = sb3.SAC("MlpPolicy", "Pendulum-v1", **kwargs)
    ours = sac("Pendulum-v1", **kwargs)
    assert ours.target_entropy == theirs.target_entropy and type(ours.target_entropy) is float
    if "ent_coef" in kwargs:
        assert ours.log_ent_coef is None and ours.ent_coef_tensor.item() == theirs.ent_coef_tensor.item()
    ours.learn(ours.learning_starts + 2)
    assert ours._n_updates == 2


@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
def test_agent_stores_terminated_only_for_true_terminals(truncate):
    model = sac(CounterEnv(length=5, truncate=truncate), learning_starts=100).learn(12)
    rb = model.replay_buffer
    assert rb.dones[:12, 0].tolist() == [t % 5 == 4 for t in range(12)]
    assert rb.terminated[:12, 0].tolist() == [float(t % 5 == 4 and not truncate) for t in range(12)]
    assert rb.timeouts[:12, 0].tolist() == [float(t % 5 == 4 and truncate) for t in range(12)]  # SB3's array
    assert rb.next_observations[4, 0, 0] == 5.0  # the true final observation ...
    assert rb.observations[5, 0, 0] == 0.0  # ... not the reset one, which starts the next row
    assert rb.next_observations[5, 0, 0] == 1.0


@pytest.mark.parametrize("optimize_memory_usage", [False, True])
def test_handle_timeout_termination_false_makes_truncations_terminal(optimize_memory_usage, tmp_path):
    # SB3 takes optimize_memory_usage=True only with handle_timeout_termination=False: that script runs as is.
    kwargs = dict(replay_buffer_kwargs=dict(handle_timeout_termination=False), learning_starts=100)
    model = sac(CounterEnv(length=5, truncate=True), optimize_memory_usage=optimize_memory_usage, **kwargs).learn(12)
    rb = model.replay_buffer
    assert rb.dones[:12, 0].tolist() == [t % 5 == 4 for t in range(12)]
    assert rb.terminated[:12, 0].tolist() == [float(t % 5 == 4) for t in range(12)]  # as SB3 stores them
    assert not rb.timeouts.any()  # SB3 records no time limits without handle_timeout_termination
    assert model.replay_buffer_kwargs == dict(handle_timeout_termination=False)
    model.save(tmp_path / "m.zip")
    loaded = SAC.load(tmp_path / "m.zip", env=CounterEnv(length=5, truncate=True)).learn(12)
    assert loaded.replay_buffer.terminated[:12, 0].tolist() == [float(t % 5 == 4) for t in range(12)]
    assert SAC.load(tmp_path / "m.zip").replay_buffer_kwargs == dict(handle_timeout_termination=False)


# ---------------------------------------------------------------------------- logging
def test_progress_csv_has_sac_keys(tmp_path):
    model = sac(CounterEnv(length=20), learning_starts=30)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(120, log_interval=1)
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6  # one row per episode of 20 steps
    keys = [
        "train/actor_loss",
        "train/critic_loss",
        "train/ent_coef",
        "train/ent_coef_loss",
        "train/q_mean",
        "time/fps",
        "rollout/ep_rew_mean",
    ]
    assert set(keys) <= set(rows[0])
    last = rows[-1]
    assert all(last[k] != "" for k in keys)
    assert float(last["rollout/ep_rew_mean"]) < 0  # Box reward -|a - 0.5| summed over an episode
    assert float(last["train/ent_coef"]) > 0


def test_q_diagnostics_average_each_steps_statistics():
    torch.manual_seed(0)
    current_q, target = torch.randn(3, 2, 5), torch.randn(3, 5)
    out = q_diagnostics(current_q, target)
    # each gradient step's statistics over its batch and both critics, then their mean over the steps
    per_step = [
        (q.mean(), q.std(), (q - t).abs().mean(), 1.0 - (t - q).var() / t.var()) for q, t in zip(current_q, target)
    ]
    for i, key in enumerate(("q_mean", "q_std", "td_error_abs", "explained_variance")):
        torch.testing.assert_close(out[key], torch.stack([step[i] for step in per_step]).mean())


def test_q_diagnostics_are_logged_for_the_last_train_call_when_a_row_is_written():
    model = sac("Pendulum-v1").learn(60, log_interval=None)
    written = []

    def dump(step: int = 0) -> None:  # the logger's row, then cleared as SB3's logger does
        written.append(dict(model.logger.name_to_value))
        model.logger.name_to_value.clear()

    model.logger.dump = dump
    model.train(3, 32)
    q, target = (torch.stack(x) for x in zip(*model._q_and_targets))
    assert q.shape == (3, 2, 32) and target.shape == (3, 32)
    expected = q_diagnostics(q, target)
    model._dump_logs(1, "time/episodes")
    model._dump_logs(2, "time/episodes")  # no gradient step since the last row: no diagnostics either
    for key, value in expected.items():
        assert written[0][f"train/{key}"] == pytest.approx(value.item())
        assert f"train/{key}" not in written[1]
    assert written[0]["train/critic_loss"] > 0


# ---------------------------------------------------------------------------- bad input
def test_infinite_box_bounds_are_refused():
    with pytest.raises(ValueError, match="SAC needs finite Box action bounds.*TransformAction"):
        sac(ActionEnv(spaces.Box(-np.inf, np.inf, (1,), np.float32)))
    with pytest.raises(ValueError, match="SAC needs finite Box action bounds"):
        sac(ActionEnv(spaces.Box(np.array([-1.0], np.float32), np.array([np.inf], np.float32))))


@pytest.mark.parametrize("space", [spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(3)], ids=["md", "mb"])
def test_unsupported_action_spaces_are_refused(space):
    with pytest.raises(NotImplementedError, match="Box") as err:
        sac(ActionEnv(space))
    assert "Discrete" in str(err.value)


def test_use_sde_is_refused_for_discrete_actions():
    with pytest.raises(ValueError, match="use_sde=True applies to Box actions"):
        sac("CartPole-v1", use_sde=True)


@pytest.mark.parametrize("ent_coef", ["autox", "auto_", "auto_abc", "auto_0", -1, -0.5, "0.1x", True, float("inf")])
def test_invalid_ent_coef_is_refused(ent_coef):
    with pytest.raises(ValueError, match="ent_coef"):
        sac("Pendulum-v1", ent_coef=ent_coef)


@pytest.mark.parametrize("target_entropy", ["autox", "-1x", float("nan"), None])
def test_invalid_target_entropy_is_refused(target_entropy):
    with pytest.raises(ValueError, match='target_entropy=.* is invalid: it must be "auto" or a finite float'):
        sac("Pendulum-v1", target_entropy=target_entropy)


@pytest.mark.parametrize("train_freq", [(1, "minute"), 0, (0, "step"), (1, 2, "step"), True, (1.5, "step")])
def test_invalid_train_freq_is_refused(train_freq):
    with pytest.raises(ValueError, match="train_freq"):
        sac("Pendulum-v1", train_freq=train_freq)


@pytest.mark.parametrize("tau", [0.0, -0.1, 1.5])
def test_invalid_tau_is_refused(tau):
    with pytest.raises(ValueError, match="tau"):
        sac("Pendulum-v1", tau=tau)


class _RecordRaw(gym.Wrapper):
    """Keeps what the env itself returns (before any VecNormalize): ("reset", obs, None) and ("step", obs, r)."""

    def __init__(self, env: gym.Env, log: list) -> None:
        super().__init__(env)
        self.log = log

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.log.append(("reset", obs.copy(), None))
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.log.append(("step", obs.copy(), float(reward)))
        return obs, reward, terminated, truncated, info


@pytest.mark.cpu
def test_sac_behind_vecnormalize_stores_original_data_and_samples_it_normalized():
    """As SB3 does: behind a VecNormalize the buffer holds the env's original observations and rewards (stored
    normalized ones would go stale as the statistics move), and sample(env=...) normalizes them with the
    statistics as they are when sampled. Episodes of 20 steps: the final observations of the time limits too."""
    from stable_baselines3.common.vec_env import VecNormalize

    log: list = []
    venv = VecNormalize(DummyVecEnv([lambda: _RecordRaw(gym.make("Pendulum-v1", max_episode_steps=20), log)]))
    model = SAC("MlpPolicy", venv, learning_starts=1000, seed=0).learn(50)  # random actions, no update yet
    obs, next_obs, rewards = [], [], []
    current = None
    for kind, o, r in log:
        if kind == "reset":
            current = o
            continue
        obs.append(current)
        next_obs.append(o)
        rewards.append(r)
        current = o
    buf = model.replay_buffer
    n = buf.size()
    assert n == 50 == len(obs)
    np.testing.assert_array_equal(buf.observations[:n, 0], np.array(obs))
    np.testing.assert_array_equal(buf.rewards[:n, 0], np.array(rewards, dtype=np.float32))
    # a final observation comes normalized in the info; unnormalized back it is the original up to rounding
    np.testing.assert_allclose(buf.next_observations[:n, 0], np.array(next_obs), rtol=1e-5, atol=1e-5)
    assert buf.terminated[:n].sum() == 0 and buf.dones[:n, 0].sum() == 2  # two time limits, no terminal

    np.random.seed(3)
    batch = buf.sample_batch(16, env=venv)
    np.random.seed(3)
    rows = np.random.randint(0, n, size=16)  # the draws sample() makes: rows, then envs (all 0 here)
    expect = {
        "observations": venv.normalize_obs(buf.observations[rows, 0]),
        "next_observations": venv.normalize_obs(buf.next_observations[rows, 0]),
        "rewards": venv.normalize_reward(buf.rewards[rows, 0]),
    }
    for name, value in expect.items():
        torch.testing.assert_close(getattr(batch, name), torch.as_tensor(value, dtype=torch.float32))
    assert not np.allclose(expect["observations"], buf.observations[rows, 0])  # normalization did something
    # and training samples that way: gradient steps run behind the VecNormalize
    model.learning_starts = 40
    model.config.learning_starts = 40
    model.learn(20, reset_num_timesteps=False)
    assert model._n_updates > 0


def _recording_noise(value: np.ndarray):
    """An SB3 ActionNoise that adds a fixed vector and counts its resets."""
    from stable_baselines3.common.noise import ActionNoise

    class RecordingNoise(ActionNoise):
        def __init__(self) -> None:
            super().__init__()
            self.resets = 0

        def __call__(self) -> np.ndarray:
            return value

        def reset(self) -> None:
            self.resets += 1

    return RecordingNoise()


@pytest.mark.parametrize("learning_starts", [100, 0])  # random warm-up actions, then the policy's
def test_sac_action_noise_as_sb3(learning_starts):
    """SB3's action_noise: added to the actions in [-1, 1] and clipped there (the buffer stores the noisy ones,
    the env gets them rescaled), also during warm-up; each env's noise is reset when its episode ends."""
    from stable_baselines3.common.env_util import make_vec_env

    def run(noise):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, env_kwargs=dict(max_episode_steps=10))
        kwargs = dict(learning_starts=learning_starts, gradient_steps=0, seed=0)  # no updates: same policy
        return SAC("MlpPolicy", env, action_noise=noise, **kwargs).learn(40)

    shift = np.array([0.3], dtype=np.float32)
    plain, model = run(None).replay_buffer, run(_recording_noise(shift))
    noisy = model.replay_buffer
    assert plain.pos == noisy.pos == 20
    # Random warm-up actions do not depend on the observations, so every step compares; the policy's do, and
    # the noisy actions lead elsewhere: its first step compares (same observation, same random draws).
    n = 20 if learning_starts else 1
    np.testing.assert_allclose(noisy.actions[:n], np.clip(plain.actions[:n] + shift, -1, 1), rtol=0, atol=1e-6)
    if learning_starts:
        assert (noisy.actions[:n] == 1.0).any() and not (plain.actions[:n] == 1.0).any()  # clipped
    # two envs: one noise process each (SB3's VectorizedActionNoise), reset as SB3's SAC resets them: when it
    # is made, when learn starts, and at each of its two 10-step episodes' ends
    import stable_baselines3

    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, env_kwargs=dict(max_episode_steps=10))
    sb3 = stable_baselines3.SAC("MlpPolicy", env, action_noise=_recording_noise(shift), gradient_steps=0, seed=0)
    sb3.learn(40)
    assert isinstance(model.action_noise, VectorizedActionNoise)
    resets = [process.resets for process in model.action_noise.noises]
    assert resets == [process.resets for process in sb3.action_noise.noises] == [4, 4]


def test_sac_action_noise_is_refused_for_discrete_actions():
    from stable_baselines3.common.noise import NormalActionNoise

    with pytest.raises(ValueError, match="action_noise applies to Box actions"):
        SAC("MlpPolicy", "CartPole-v1", action_noise=NormalActionNoise(np.zeros(1), np.ones(1)))


def test_discrete_actions_with_a_start_train_as_from_zero():
    """Discrete(n, start): the buffer keeps the env's actions (start + index) and the critics' loss reads the Q
    value at the index. With a start of 5 the run is the run with a start of 0, weight for weight."""
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    models = []
    for start in (0, 5):
        env = SpaceEnv(obs_space, spaces.Discrete(3, start=start))
        model = SAC("MlpPolicy", env, learning_starts=20, batch_size=16, seed=0).learn(60)
        assert set(np.unique(model.replay_buffer.actions[:60])) <= {start, start + 1, start + 2}
        models.append(model)
    for a, b in zip(models[0].critic.parameters(), models[1].critic.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(models[0].actor.parameters(), models[1].actor.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("policy", ["MlpLstmPolicy", "CnnLstmPolicy", "MultiInputLstmPolicy"])
def test_sac_refuses_recurrent_policies_and_memory_by_name(policy):
    """SAC has no recurrent memory: a *LstmPolicy name or policy_kwargs memory is refused, not trained as a
    feed-forward policy; SAC's unknown-policy error does not offer the recurrent names."""
    with pytest.raises(ValueError, match=f"SAC has no recurrent memory, so {policy} is not one of its policies"):
        SAC(policy, "Pendulum-v1")
    with pytest.raises(ValueError, match="policy_kwargs memory is not a SAC setting"):
        SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(memory=dict(hidden_size=8)))
    # sb3-contrib's RecurrentPPO keys are named as given (SB3's SAC raises a TypeError for them), not as covey's
    with pytest.raises(ValueError, match="policy_kwargs lstm_hidden_size is not a SAC setting"):
        SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(lstm_hidden_size=8))
    with pytest.raises(ValueError, match="policy_kwargs n_lstm_layers, enable_critic_lstm are not SAC settings"):
        SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(n_lstm_layers=1, enable_critic_lstm=True))
    with pytest.raises(ValueError, match="Unknown policy 'MlpPolcy'") as error:
        SAC("MlpPolcy", "Pendulum-v1")
    assert "Lstm" not in str(error.value)


def test_training_waits_for_a_buffer_it_can_sample(tmp_path):
    """learning_starts=0 with optimize_memory_usage (whose newest step has no next observation yet), and a
    loaded model going on (the buffer starts empty, the step count does not): the first gradient step comes
    with the first minibatch the buffer can give, where the first sample failed."""
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=0, optimize_memory_usage=True, batch_size=4, seed=0)
    model.learn(5)
    assert model.replay_buffer.pos == 5 and model._n_updates == 4  # after steps 2, 3, 4 and 5
    model.save(tmp_path / "sac")
    loaded = SAC.load(tmp_path / "sac", env="Pendulum-v1")
    assert loaded.replay_buffer.size() == 0 and loaded.num_timesteps == 5
    loaded.learn(3, reset_num_timesteps=False)
    assert loaded._n_updates == 4 + 2
    # Hindsight replay samples finished episodes only: nothing to train on before the first one ends.
    from stable_baselines3.common.envs import BitFlippingEnv
    from stable_baselines3.her import HerReplayBuffer

    env = BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)
    her = SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer, learning_starts=0, batch_size=4, seed=0)
    her.learn(3)
    assert her._n_updates == 0
    her.learn(8, reset_num_timesteps=False)
    assert her._n_updates > 0 and her.replay_buffer.can_sample()


@pytest.mark.parametrize(
    "action_space, message",
    [
        (spaces.Box(-3, 3, (1,), np.int64), r"SAC's Box actions are continuous, the action space is int64"),
        (
            spaces.Box(np.array([-1.0, 0.5], np.float32), np.array([1.0, 0.5], np.float32)),
            r"high <= low at \(flat\) index \[1\]",
        ),
        (spaces.Discrete(1), r"Discrete\(1\): a single action"),
    ],
    ids=["integer-box", "zero-width-box", "one-action"],
)
def test_sac_refuses_action_spaces_it_cannot_act_in_at_the_constructor(action_space, message):
    """Integer Box actions (they were truncated toward zero), a Box dimension of zero width (NaN actions) and a
    single Discrete action (an IndexError in the first gradient step) are named when the model is built."""
    with pytest.raises(ValueError, match=message):
        SAC("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (2,), np.float32), action_space))


def test_an_sb3_sac_file_of_integer_box_actions_is_refused_at_load_as_at_the_constructor(tmp_path):
    """SB3's SAC builds on an int64 Box (its replay buffer then stores the actions cut to integers); covey's
    constructor refuses it, and its load without an env took the file and acted in integers cut toward zero."""
    import stable_baselines3

    env = SpaceEnv(spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-3, 3, (2,), np.int64))
    stable_baselines3.SAC("MlpPolicy", env, buffer_size=100, seed=0).save(tmp_path / "sb3_sac")
    for kwargs in ({}, {"env": env}):
        with pytest.raises(ValueError, match=r"SAC's Box actions are continuous, the action space is int64"):
            SAC.load(tmp_path / "sb3_sac", **kwargs)


def test_sacs_advice_for_a_composite_action_space_names_spaces_it_takes():
    """SAC's refusal of a Tuple of actions advised "Discrete parts as one MultiDiscrete", which SAC refuses next."""
    tuple_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (1,), np.float32)))
    with pytest.raises(ValueError, match=r"Unsupported action space Tuple.*This agent supports: Box, Discrete") as err:
        SAC("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (2,), np.float32), tuple_space))
    assert "Box parts as one Box (this agent takes one Box or one Discrete; PPO takes Discrete parts as one" in str(
        err.value
    )
    assert "Discrete parts as one MultiDiscrete, Box parts" not in str(err.value)


def test_the_temperature_steps_with_sb3s_adam_whatever_optimizer_the_networks_take():
    """SB3 steps ``log_ent_coef`` with ``Adam(lr=learning_rate)`` and its defaults; ``policy_kwargs``' optimizer
    is the networks'. (covey took policy_kwargs' class and arguments for the temperature too.)"""
    import stable_baselines3

    kwargs = dict(
        learning_rate=0.01,
        policy_kwargs=dict(optimizer_class=torch.optim.SGD, optimizer_kwargs=dict(momentum=0.9, weight_decay=0.1)),
    )
    ours = SAC("MlpPolicy", "Pendulum-v1", seed=0, **kwargs)
    theirs = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", seed=0, **kwargs)
    assert isinstance(ours.actor.optimizer, torch.optim.SGD)
    assert type(ours.ent_coef_optimizer) is type(theirs.ent_coef_optimizer) is torch.optim.Adam
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
        assert ours.ent_coef_optimizer.param_groups[0][key] == theirs.ent_coef_optimizer.param_groups[0][key], key
    # one Adam step from a fresh state moves the log-temperature by the learning rate
    ours.learning_starts = 0
    before = ours.log_ent_coef.item()
    ours.learn(ours.batch_size + 1)
    assert ours._n_updates >= 1
    assert abs(ours.log_ent_coef.item() - before) == pytest.approx(0.01 * ours._n_updates, rel=0.05)


def test_a_temperature_state_of_another_optimizer_starts_adam_afresh_with_a_warning():
    """Earlier covey files hold the temperature's optimizer state in policy_kwargs' class (here SGD's)."""
    kwargs = dict(learning_starts=0, batch_size=16, policy_kwargs=dict(optimizer_class=torch.optim.SGD))
    model = SAC("MlpPolicy", "Pendulum-v1", seed=0, **kwargs)
    params = model.get_parameters()
    params["ent_coef_optimizer"] = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-4).state_dict()
    with pytest.warns(UserWarning, match="not an Adam state.*fresh Adam state"):
        model.set_parameters(params)
    assert model.ent_coef_optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    model.learn(32)
    assert model._n_updates > 0 and np.isfinite(model.log_ent_coef.item())


class EpisodeClock(gym.Env):
    """Observations ``[episode, t]``, episodes that never end by themselves: a reset is what cuts one."""

    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self):
        self.episode = -1

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return np.array([self.episode, 0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.episode, self.t], np.float32), float(self.t), False, False, {}


@pytest.mark.parametrize(
    "kwargs",
    [dict(optimize_memory_usage=True), dict(n_steps=3), dict()],
    ids=["memory-saving", "n-step", "plain"],
)
def test_a_new_learn_ends_the_buffers_running_episodes_where_its_reset_cuts_them(kwargs):
    """learn() resets the env (reset_num_timesteps=True): the newest stored step ends its episode, keeping its
    bootstrap from its true next observation; no transition and no n-step return runs on into the next episode
    (with memory saving, the next row's observation is the new episode's)."""
    model = SAC("MlpPolicy", EpisodeClock(), buffer_size=100, learning_starts=1000, gamma=0.5, seed=0, **kwargs)
    model.learn(5)
    model.learn(5)
    buffer = model.replay_buffer
    assert buffer.pos == 10 and buffer.dones[:, 0].tolist()[:10] == [False] * 4 + [True] + [False] * 5
    assert not buffer.terminated[:10].any()  # a cut episode keeps its bootstrap, as a time limit does
    np.random.seed(0)
    batch = buffer.sample(256)
    obs, next_obs = batch.observations.numpy(), batch.next_observations.numpy()
    if "n_steps" in kwargs:
        steps = np.log(batch.discounts.numpy()[:, 0]) / np.log(0.5)  # discounts are gamma ** steps summed
    else:
        steps = np.ones(len(obs))
    assert (next_obs[:, 0] == obs[:, 0]).all()  # the same episode
    np.testing.assert_allclose(next_obs[:, 1], obs[:, 1] + steps, atol=1e-4)  # and its next step(s)
    assert (obs[:, 0] == 0).any() and ((obs[:, 0] == 0) & (obs[:, 1] == 4)).any()  # the cut step is sampled


@pytest.mark.parametrize("memory", [True, False], ids=["memory-saving", "plain"])
def test_set_env_ends_the_running_episodes_from_their_own_next_observations(memory):
    """set_env lets go of the last observations, so the new env's first reset found none and a memory-saving
    buffer made the newest step terminal (its bootstrap lost); it now ends the episodes with the observations
    after that step, as a new learn() does."""
    model = SAC(
        "MlpPolicy", EpisodeClock(), buffer_size=100, learning_starts=1000, optimize_memory_usage=memory, seed=0
    )
    model.learn(5)
    model.set_env(EpisodeClock())
    model.learn(3, reset_num_timesteps=False)
    buffer = model.replay_buffer
    assert buffer.dones[:8, 0].tolist() == [False] * 4 + [True] + [False] * 3
    assert not buffer.terminated[:8].any()  # the cut keeps its bootstrap, as a time limit does
    np.random.seed(0)
    batch = buffer.sample(256)
    obs, next_obs = batch.observations.numpy(), batch.next_observations.numpy()
    cut = (obs[:, 0] == 0) & (obs[:, 1] == 4)
    assert cut.any() and (next_obs[:, 0] == obs[:, 0]).all()
    np.testing.assert_allclose(next_obs[:, 1], obs[:, 1] + 1)  # the cut step's next observation is its episode's


def test_a_buffer_loaded_from_a_file_ends_its_episodes_without_the_models_last_observations(tmp_path):
    """The file's newest step is another run's: the model's last observations do not follow it. set_env (or a
    new learn) after load_replay_buffer made them that step's next observation, with its bootstrap; the step is
    now terminal, as for a model loaded without its last observations."""
    source = SAC("MlpPolicy", EpisodeClock(), buffer_size=100, learning_starts=1000, optimize_memory_usage=True)
    source.learn(5)
    source.save_replay_buffer(tmp_path / "buffer")
    for how in ("set_env", "learn"):
        model = SAC("MlpPolicy", EpisodeClock(), buffer_size=100, learning_starts=1000, optimize_memory_usage=True)
        model.learn(12)  # its last observation: step 12 of its episode
        model.load_replay_buffer(tmp_path / "buffer")
        if how == "set_env":
            model.set_env(EpisodeClock())
        model.learn(2, reset_num_timesteps=how == "learn")
        buffer = model.replay_buffer
        assert buffer.dones[4, 0] and buffer.terminated[4, 0] == 1.0, how
        np.testing.assert_array_equal(buffer.final_observations[(4, 0)][None], buffer.observations[4, 0])


def test_a_loaded_memory_saving_buffer_ends_its_running_episodes_and_goes_on(tmp_path):
    """A resumed run (model and buffer loaded, learn(reset_num_timesteps=False)) whose newest stored step is
    mid-episode: the model's file has no last observation, so the step ends terminal (as SB3 makes it); sampling
    it failed with a KeyError for its missing final observation, on the first gradient step."""
    model = SAC("MlpPolicy", EpisodeClock(), buffer_size=100, learning_starts=1000, optimize_memory_usage=True, seed=0)
    model.learn(5)
    model.save(tmp_path / "sac")
    model.save_replay_buffer(tmp_path / "buffer")
    loaded = SAC.load(tmp_path / "sac", env=EpisodeClock(), learning_starts=0, batch_size=64)
    loaded.load_replay_buffer(tmp_path / "buffer")
    loaded.learn(3, reset_num_timesteps=False)
    buffer = loaded.replay_buffer
    assert loaded._n_updates == 3 and buffer.pos == 8
    assert buffer.dones[:8, 0].tolist() == [False] * 4 + [True] + [False] * 3
    assert buffer.terminated[:8, 0].tolist() == [0.0] * 4 + [1.0] + [0.0] * 3  # no next observation to bootstrap from
    np.random.seed(0)
    batch = buffer.sample(256)
    obs, next_obs, ended = batch.observations.numpy(), batch.next_observations.numpy(), batch.dones.numpy()[:, 0]
    cut = (obs[:, 0] == 0) & (obs[:, 1] == 4)
    assert cut.any() and (ended[cut] == 1.0).all() and (ended[~cut] == 0.0).all()
    assert (next_obs[~cut, 0] == obs[~cut, 0]).all()  # no other transition runs into the next episode
    np.testing.assert_allclose(next_obs[~cut, 1], obs[~cut, 1] + 1)


def test_an_assigned_target_entropy_is_kept_by_save_load_and_copies(tmp_path):
    """As SB3 keeps ``model.target_entropy`` (the number in force) in its file."""
    import copy

    model = SAC("MlpPolicy", "Pendulum-v1", seed=0)
    assert model.target_entropy == -1.0  # "auto": -dim(A)
    model.target_entropy = -3
    model.save(tmp_path / "model")
    assert SAC.load(tmp_path / "model").target_entropy == -3.0
    assert copy.deepcopy(model).target_entropy == -3.0


def test_load_takes_the_constructors_arguments_such_as_action_noise(tmp_path):
    """SB3's load takes any keyword (RL Zoo passes action_noise when it continues a trained agent)."""
    from stable_baselines3.common.noise import NormalActionNoise

    SAC("MlpPolicy", "Pendulum-v1", seed=0).save(tmp_path / "model")
    noise = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
    assert SAC.load(tmp_path / "model", env="Pendulum-v1", action_noise=noise).action_noise is noise
    with pytest.raises(ValueError, match=r"Unknown keyword arguments \['actoin_noise'\]"):
        SAC.load(tmp_path / "model", actoin_noise=noise)


def _noise_settings(noise) -> dict:
    """A noise's class and settings, its base noise's for a VectorizedActionNoise (arrays as lists)."""
    out = {"class": type(noise).__name__}
    if isinstance(noise, VectorizedActionNoise):
        return {**out, "n_envs": noise.n_envs, "base": _noise_settings(noise.base_noise)}
    names = ("_mu", "_sigma", "_dtype", "_theta", "_dt", "initial_noise")
    return {**out, **{k: np.asarray(getattr(noise, k)).tolist() for k in names if hasattr(noise, k)}}


def _sb3_noises():
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    return [
        NormalActionNoise(np.zeros(2), np.array([0.1, 0.2])),
        OrnsteinUhlenbeckActionNoise(
            np.full(2, 0.5), np.full(2, 0.3), theta=0.25, dt=0.05, initial_noise=np.ones(2), dtype=np.float64
        ),
        VectorizedActionNoise(NormalActionNoise(np.zeros(2), np.full(2, 0.4)), n_envs=2),
    ]


@pytest.mark.parametrize("noise", _sb3_noises(), ids=["normal", "ornstein_uhlenbeck", "vectorized"])
def test_sb3s_action_noises_are_kept_in_the_model_file(tmp_path, noise):
    """SB3's file keeps action_noise (a pickle), so a run continued from it explores as before: covey's keeps the
    settings of SB3's noises. custom_objects and load's keyword set it as SB3's load does; exclude leaves it out."""
    from stable_baselines3.common.noise import NormalActionNoise

    env = SpaceEnv(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,)))
    SAC("MlpPolicy", env, action_noise=noise).save(tmp_path / "model")
    loaded = SAC.load(tmp_path / "model")
    assert loaded.action_noise is not noise and _noise_settings(loaded.action_noise) == _noise_settings(noise)
    other = NormalActionNoise(np.zeros(2), np.ones(2))
    assert SAC.load(tmp_path / "model", custom_objects={"action_noise": other}).action_noise is other
    assert SAC.load(tmp_path / "model", action_noise=None).action_noise is None
    SAC("MlpPolicy", env, action_noise=noise).save(tmp_path / "excluded", exclude=["action_noise"])
    assert SAC.load(tmp_path / "excluded").action_noise is None


def test_a_damaged_noise_entry_is_named_and_can_be_passed_again(tmp_path):
    """A file whose action_noise entry cannot be read: load names it and the way out, which works (the file's
    entry is not read where the noise is given)."""
    import json
    import zipfile

    from stable_baselines3.common.noise import NormalActionNoise

    SAC("MlpPolicy", "Pendulum-v1", action_noise=NormalActionNoise(np.zeros(1), np.ones(1))).save(tmp_path / "model")
    with zipfile.ZipFile(tmp_path / "model.zip") as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    for damaged in ([1, 2], {"class": "NormalActionNoise", "mean": "x"}, {"class": "Mystery"}):
        settings = json.loads(entries["covey.json"])
        settings["action_noise"] = damaged
        with zipfile.ZipFile(tmp_path / "damaged.zip", "w") as zf:
            for name, value in {**entries, "covey.json": json.dumps(settings).encode()}.items():
                zf.writestr(name, value)
        with pytest.raises(covey.serialization.ModelFileError, match=r"action_noise covey cannot read.*action_noise="):
            SAC.load(tmp_path / "damaged.zip")
        assert SAC.load(tmp_path / "damaged.zip", action_noise=None).action_noise is None
        assert SAC.load(tmp_path / "damaged.zip", custom_objects={"action_noise": None}).action_noise is None


def test_a_noise_of_another_action_size_is_refused_at_the_constructor():
    """A noise of 2 numbers for 1-dimensional actions broadcast the env's actions to 2 numbers at the first step;
    the constructor names the sizes. One mean for all dimensions is SB3's (one draw for them all), as is one per
    dimension."""
    from stable_baselines3.common.noise import NormalActionNoise

    env = SpaceEnv(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,)))
    with pytest.raises(ValueError, match=r"action_noise's mean has shape \(3,\), the env's actions 2 numbers"):
        SAC("MlpPolicy", env, action_noise=NormalActionNoise(np.zeros(3), np.ones(3)))
    with pytest.raises(ValueError, match=r"mean has shape \(3,\)"):
        SAC("MlpPolicy", env, action_noise=VectorizedActionNoise(NormalActionNoise(np.zeros(3), np.ones(3)), 2))
    with pytest.raises(ValueError, match=r"action_noise's sigma has shape \(3,\)"):
        SAC("MlpPolicy", env, action_noise=NormalActionNoise(np.zeros(2), np.ones(3)))
    for size in [(), (1,), (2,)]:
        SAC("MlpPolicy", env, action_noise=NormalActionNoise(np.zeros(size), np.ones(size)))
    # a noise shaped as a 2x2 action space, which SB3 trains with: each action gets its own number
    square = SpaceEnv(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2, 2)))
    shift = np.array([[0.5, -0.5], [0.25, 0.0]])
    kwargs = dict(learning_starts=10, gradient_steps=0, seed=0)
    plain = SAC("MlpPolicy", square, **kwargs).learn(4).replay_buffer.actions[:4, 0]
    noisy = SAC("MlpPolicy", square, action_noise=_recording_noise(shift), **kwargs).learn(4).replay_buffer.actions
    np.testing.assert_allclose(noisy[:4, 0], np.clip(plain + shift.reshape(-1), -1, 1), atol=1e-6)


def test_a_noise_covey_cannot_keep_is_named_at_save_and_load(tmp_path):
    """A user's own noise class is code, which covey's file never holds: save and load say so, and how to give
    it back."""
    from stable_baselines3.common.noise import NormalActionNoise

    class MyNoise(NormalActionNoise):
        pass

    noise = MyNoise(np.zeros(1), np.ones(1))
    with pytest.warns(UserWarning, match=r"save: action_noise is not in the file: .*MyNoise is not one of SB3's"):
        SAC("MlpPolicy", "Pendulum-v1", action_noise=noise).save(tmp_path / "model")
    with pytest.warns(UserWarning, match=r"The file does not hold action_noise.*custom_objects"):
        assert SAC.load(tmp_path / "model").action_noise is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SAC.load(tmp_path / "model", action_noise=noise).action_noise is noise  # given again: no warning
        # left out on purpose: nothing to warn of, at save or at load
        SAC("MlpPolicy", "Pendulum-v1", action_noise=noise).save(tmp_path / "excluded", exclude=["action_noise"])
        assert SAC.load(tmp_path / "excluded").action_noise is None


def test_a_vectorized_noise_follows_the_env_it_learns_in(tmp_path):
    """A model saved with 2 envs' noise processes, loaded with 1 env (or 3), learns with one process per env."""
    from stable_baselines3.common.env_util import make_vec_env

    noise = _sb3_noises()[2]
    env = SpaceEnv(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,)))
    SAC("MlpPolicy", env, action_noise=noise).save(tmp_path / "model")
    one = SAC.load(tmp_path / "model", env=env, learning_starts=0, batch_size=4).learn(8)
    assert _noise_settings(one.action_noise) == _noise_settings(noise.base_noise)
    three = make_vec_env(lambda: SpaceEnv(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,))), n_envs=3)
    model = SAC.load(tmp_path / "model", env=three, learning_starts=0, batch_size=4).learn(9)
    assert model.action_noise.n_envs == 3 and model.replay_buffer.actions[:3].shape == (3, 3, 2)


def test_train_called_by_hand_takes_sb3s_default_batch_size():
    """SB3's SAC.train(gradient_steps, batch_size=64): a script that calls it by hand (offline pretraining from a
    filled buffer) gets minibatches of 64, whatever the model's batch_size; learn passes the model's."""
    model = SAC("MlpPolicy", "Pendulum-v1", batch_size=128, learning_starts=0, seed=0)
    model.learn(130)
    sizes = []
    sample = model.replay_buffer.sample_batch
    model.replay_buffer.sample_batch = lambda n, *args, **kwargs: sizes.append(n) or sample(n, *args, **kwargs)
    model.train(2)
    model.train(1, batch_size=16)
    model.learn(2, reset_num_timesteps=False)
    assert sizes == [64, 64, 16, 128, 128]


def test_a_replay_buffer_of_another_library_is_refused_at_learn():
    """An SB3 ReplayBuffer assigned to model.replay_buffer made learn fail inside covey (no end_episodes): learn
    now refuses it, naming the buffer's add and load_replay_buffer."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=0, batch_size=8)
    model.replay_buffer = SB3ReplayBuffer(100, model.observation_space, model.action_space)
    with pytest.raises(TypeError, match=r"replay_buffer is a stable_baselines3.*ReplayBuffer.*replay_buffer\.add\("):
        model.learn(10)


def test_sb3s_names_for_the_replay_buffer_critics_and_learning_rate():
    """SB3 attributes scripts read on a SAC model (AttributeErrors or a TypeError before): the replay buffer's
    obs_shape, action_dim and reset(), the critics as qf0/qf1, _vec_normalize_env, and
    _update_learning_rate(optimizer), which sets that optimizer's step size only."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    from stable_baselines3.common.vec_env import VecNormalize

    for env_id in ("Pendulum-v1", "CartPole-v1"):  # SB3's buffer of the same spaces (its SAC takes Box actions)
        ours = sac(env_id)
        theirs = SB3ReplayBuffer(16, ours.observation_space, ours.action_space)
        assert (ours.replay_buffer.obs_shape, ours.replay_buffer.action_dim) == (theirs.obs_shape, theirs.action_dim)

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    model = sac(venv, learning_starts=10, learning_rate=lambda progress: 1e-3 * progress).learn(30)
    assert model._vec_normalize_env is venv and sac("Pendulum-v1")._vec_normalize_env is None

    rb = model.replay_buffer
    assert rb.size() == 30
    rb.reset()
    assert (rb.size(), rb.pos, rb.full) == (0, 0, False)
    model.learn(12, reset_num_timesteps=False)
    assert rb.size() == 12 and rb.observations[0, 0].tolist() != [0.0, 0.0, 0.0]  # refilled from row 0

    obs, actions = torch.zeros(4, 3), torch.zeros(4, 1)
    x = torch.cat([obs, actions], dim=1)
    with torch.no_grad():
        for i, q in enumerate(model.critic(obs, actions)):
            torch.testing.assert_close(getattr(model.critic, f"qf{i}")(x), q)
    with pytest.raises(AttributeError, match="qf2"):
        model.critic.qf2  # noqa: B018

    for group in (*model.actor.optimizer.param_groups, *model.critic.optimizer.param_groups):
        group["lr"] = 0.5
    model._current_progress_remaining = 0.25
    model._update_learning_rate(model.actor.optimizer)  # SB3's signature: these optimizers only
    assert [g["lr"] for g in model.actor.optimizer.param_groups] == [pytest.approx(2.5e-4)]
    assert [g["lr"] for g in model.critic.optimizer.param_groups] == [0.5]
    model._update_learning_rate([model.critic.optimizer])
    assert [g["lr"] for g in model.critic.optimizer.param_groups] == [pytest.approx(2.5e-4)]


def _hook_calls(lib, target: str, **kwargs) -> tuple[int, list]:
    """Calls of a forward hook on ``model.<target>`` of ``lib``'s SAC over a short run, and the shapes it saw."""
    model = lib.SAC(
        "MlpPolicy",
        kwargs.pop("env", "Pendulum-v1"),
        learning_starts=10,
        batch_size=16,
        buffer_size=1000,
        seed=0,
        policy_kwargs=dict(net_arch=[16]),
        **kwargs,
    )
    shapes = []
    module = model.critic_target if target == "critic_target" else getattr(model, target)
    module.register_forward_hook(
        lambda m, i, out: shapes.append([tuple(o.shape) for o in out] if isinstance(out, tuple) else tuple(out.shape))
    )
    obs = model.observation_space.sample()
    model.predict(obs)  # acting outside training: SB3's policy calls its actor
    model.policy.predict(obs, deterministic=True)
    model.learn(20)
    return len(shapes), shapes


@pytest.mark.parametrize("target", ["actor", "critic", "critic_target"])
def test_a_forward_hook_on_sacs_networks_runs_as_in_sb3(target):
    """A forward hook on model.critic (to log Q-values, say), model.critic_target or model.actor runs where SB3's
    SAC calls those modules, as often, and sees SB3's shapes (the critic's tuple of (B, 1) Q-values); the
    hand-written update calls no module and the critics' update called their values, not their forward, so these
    hooks never ran."""
    import stable_baselines3

    calls, shapes = _hook_calls(covey, target)
    expected_calls, expected_shapes = _hook_calls(stable_baselines3, target)
    assert calls == expected_calls > 0
    assert shapes == expected_shapes


def test_a_forward_hook_on_discrete_sacs_critic_sees_every_actions_values():
    calls, shapes = _hook_calls(covey, "critic", env="CartPole-v1")
    assert calls == 20 and shapes[0] == [(16, 2), (16, 2)]  # 10 gradient steps: the critic's loss, the actor's


def test_a_forward_hook_on_a_two_hot_critic_warns_with_the_layers_to_hook():
    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, policy_kwargs=dict(value_head="twohot"))
    with pytest.warns(UserWarning, match=r"two-hot critic runs only where your code calls it.*qs\[i\]\.trunk"):
        model.critic.register_forward_hook(lambda m, i, out: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SAC("MlpPolicy", "Pendulum-v1", buffer_size=100).critic.register_forward_hook(lambda m, i, out: None)


def test_a_forward_hook_on_a_module_made_on_each_access_warns_with_the_layer_to_hook():
    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, learning_starts=0)
    for module, name in ((model.actor.mu, "mu"), (model.actor.log_std, "log_std"), (model.critic.q_networks[0], "q_")):
        with pytest.warns(UserWarning, match=f"A forward hook on model.*{name}.* runs only where your code calls it"):
            module.register_forward_hook(lambda m, i, out: None)
    calls = []
    model.actor.head.proj.register_forward_hook(lambda m, i, out: calls.append(out.shape))
    model.learn(5)
    assert calls  # the layer the warning names runs in acting


def test_the_parameters_of_sb3s_mu_and_log_std_layers_warn_that_they_are_one_layer():
    """SB3's actor has a layer for the means and one for the log-stds; covey's has one for both, whose rows
    model.actor.mu and model.actor.log_std show. Their parameters are that whole layer's, so freezing mu's froze the
    log-stds too, silently; it warns, and the way it names holds the means' rows alone."""
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=0, batch_size=16, policy_kwargs=dict(net_arch=[16]), seed=0)
    for view, rows in ((model.actor.mu, "rows \\(0 to 0\\)"), (model.actor.log_std, "rows \\(1 to 1\\)")):
        with pytest.warns(UserWarning, match=f"one layer of the means and the log-stds.*{rows}"):
            assert [p.shape for p in view.parameters()] == [(2, 16), (2,)]
    layer = model.actor.head.proj
    masks = [torch.ones_like(layer.weight), torch.ones_like(layer.bias)]
    for mask, parameter in zip(masks, (layer.weight, layer.bias)):
        mask[0] = 0.0
        parameter.register_hook(lambda grad, mask=mask: grad * mask)
    before = layer.weight.detach().clone()
    model.learn(40)
    assert torch.equal(layer.weight[0], before[0]) and not torch.equal(layer.weight[1], before[1])
