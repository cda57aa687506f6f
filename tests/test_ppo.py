"""PPO: gradient isolation of its losses, save/load, determinism, SB3 surface and clear errors."""

import copy
import os
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from covey import PPO
from covey.agents.ppo import clipped_surrogate_loss, ppo_loss, value_loss
from covey.envs import EarlyExitEnv


def collected(model: PPO) -> PPO:
    """Fill the model's rollout buffer once (values, log-probs, returns) without training."""
    _, callback = model._setup_learn(model.n_steps * model.n_envs, None, True, "test", False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def grads_of(module: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor | None]:
    params = [p for p in module.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True))


def nonzero(grads) -> bool:
    return any(g is not None and bool(g.abs().sum() > 0) for g in grads)


# ---------------------------------------------------------------------------- gradient isolation
@pytest.fixture
def image_ppo():
    """A CnnPolicy PPO (the encoder has weights) with a separate critic encoder."""
    env = make_vec_env(lambda: gym.wrappers.TimeLimit(ImageEnv(), 8), n_envs=2, seed=0)
    model = PPO("CnnPolicy", env, n_steps=8, batch_size=16, seed=0, policy_kwargs=dict(share_features_extractor=False))
    return collected(model)


class ImageEnv(gym.Env):
    observation_space = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), float(action), False, False, {}


def test_value_loss_reaches_only_the_critic(image_ppo):
    """Without a shared trunk, the value loss has zero gradient on every actor parameter."""
    batch = next(image_ppo.rollout_buffer.minibatches(16))
    loss = value_loss(image_ppo.critic(batch.observations), batch.old_values, batch.returns + 1.0, 0.2)
    assert nonzero(grads_of(image_ppo.critic, loss))
    assert not nonzero(grads_of(image_ppo.actor, loss))


def test_policy_loss_reaches_only_the_actor(image_ppo):
    """The clipped surrogate and the entropy have zero gradient on every critic parameter."""
    batch = next(image_ppo.rollout_buffer.minibatches(16))
    log_prob, entropy = image_ppo.actor.evaluate(batch.observations, batch.actions)
    advantages = torch.linspace(-1, 1, len(log_prob), device=log_prob.device)
    loss = clipped_surrogate_loss(log_prob, batch.old_log_prob, advantages, 0.2)[0] - 0.01 * entropy.mean()
    assert nonzero(grads_of(image_ppo.actor, loss))
    assert not nonzero(grads_of(image_ppo.critic, loss))


def test_full_loss_with_zero_vf_coef_leaves_critic_untouched(image_ppo):
    """ppo_loss with vf_coef=0: the critic gets no gradient even though advantages came from it."""
    batch = next(image_ppo.rollout_buffer.minibatches(16))
    loss, stats = ppo_loss(batch, image_ppo.actor, image_ppo.critic, 0.2, None, 0.01, 0.0, True)
    assert not nonzero(grads_of(image_ppo.critic, loss))
    assert set(stats) >= {"policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction"}
    assert all(not v.requires_grad for v in stats.values())


def test_advantage_is_detached():
    """An advantage that requires grad receives none from the policy loss."""
    log_prob = torch.zeros(4, requires_grad=True)
    advantages = torch.ones(4, requires_grad=True)
    loss, _, _ = clipped_surrogate_loss(log_prob, torch.zeros(4), advantages, 0.2)
    loss.backward()
    assert advantages.grad is None
    assert log_prob.grad is not None


def test_shared_encoder_receives_both_losses():
    """With share_features_extractor=True (SB3's default) the CNN encoder is one module in both networks."""
    env = make_vec_env(lambda: gym.wrappers.TimeLimit(ImageEnv(), 8), n_envs=2, seed=0)
    model = collected(PPO("CnnPolicy", env, n_steps=8, batch_size=16, seed=0))
    assert model.actor.encoder is model.critic.encoder
    batch = next(model.rollout_buffer.minibatches(16))
    loss = value_loss(model.critic(batch.observations), batch.old_values, batch.returns + 1.0, None)
    assert nonzero(grads_of(model.actor.encoder, loss))
    assert not nonzero(grads_of(model.actor.head, loss))


def count_calls(module: torch.nn.Module) -> list[int]:
    """A counter of ``module``'s forward calls (a one-element list) and the batch size of each."""
    calls: list[int] = []
    module.register_forward_hook(lambda mod, args, out: calls.append(out.shape[0]))
    return calls


@pytest.mark.parametrize("share", [True, False])
def test_cnn_encoders_run_once_per_step_and_minibatch(share):
    """An encoder with weights is the costly part: acting also gives the values and log-probs (no second
    pass over the rollout), and a shared encoder runs once per minibatch for actor and critic together."""
    env = make_vec_env(ImageEnv, n_envs=2, seed=0)  # episodes never end: no bootstraps inside the rollout
    kwargs = dict(n_steps=8, batch_size=8, n_epochs=2, seed=0, policy_kwargs=dict(share_features_extractor=share))
    model = PPO("CnnPolicy", env, **kwargs)
    actor_calls = count_calls(model.actor.encoder)
    critic_calls = actor_calls if share else count_calls(model.critic.encoder)
    collected(model)
    # every step of the 2 envs once, then the critic on the last observations (the rollout's bootstrap)
    if share:
        assert actor_calls == [2] * 9
    else:
        assert actor_calls == [2] * 8 and critic_calls == [2] * 9
    actor_calls.clear()
    critic_calls.clear()
    model.train()
    assert actor_calls == [8] * 4  # 2 epochs of 2 minibatches of 8, each once
    assert critic_calls == [8] * 4


class BeforeUpdate(BaseCallback):
    """Checks at the end of each rollout, before the update, that the stored values and log-probs are what
    a batched pass over the rollout gives."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer, model = self.model.rollout_buffer, self.model
        obs, actions = buffer.flat_observations(), buffer.flat_actions()
        with torch.no_grad():
            values = model.critic(obs)
            log_prob = model.actor.evaluate(obs, actions)[0]
        torch.testing.assert_close(buffer.values_tensor.reshape(-1), values, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(buffer.log_probs_tensor.reshape(-1), log_prob, rtol=1e-4, atol=1e-5)
        self.checked += 1


@pytest.mark.parametrize("value_head", ["scalar", "twohot"])
def test_values_and_log_probs_computed_while_acting_match_a_batched_pass(value_head):
    env = make_vec_env(lambda: gym.wrappers.TimeLimit(ImageEnv(), 5), n_envs=2, seed=0)
    model = PPO(
        "CnnPolicy", env, n_steps=8, batch_size=16, n_epochs=1, seed=0, policy_kwargs=dict(value_head=value_head)
    )
    assert model._evaluate_while_acting
    callback = BeforeUpdate()
    model.learn(32, callback=callback)
    assert callback.checked == 2
    assert (model._value_entropy is not None) == (value_head == "twohot")


def test_value_clipping_takes_the_larger_error():
    """clip_range_vf: the loss is max((R - V)^2, (R - V_clip)^2), computed by hand."""
    values, old, returns = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, -1.0])
    # sample 0: unclipped (2-1)^2 = 1, clipped V=0.5 -> (2-0.5)^2 = 2.25 -> 2.25
    # sample 1: V=0 is inside the clip range: (−1−0)^2 = 1 both ways -> 1
    assert value_loss(values, old, returns, 0.5).item() == pytest.approx((2.25 + 1.0) / 2)
    assert value_loss(values, old, returns, None).item() == pytest.approx((1.0 + 1.0) / 2)


def test_surrogate_clips_by_hand():
    """Ratio e^0.5 with positive advantage is clipped at 1.2; with negative advantage it is not."""
    log_prob, old = torch.tensor([0.5, 0.5]), torch.zeros(2)
    loss, approx_kl, clip_fraction = clipped_surrogate_loss(log_prob, old, torch.tensor([1.0, -1.0]), 0.2)
    ratio = np.exp(0.5)
    # sample 0: min(1.6487*1, 1.2*1) = 1.2; sample 1: min(-1.6487, -1.2) = -1.6487
    assert loss.item() == pytest.approx(-(1.2 - ratio) / 2, rel=1e-6)
    assert clip_fraction.item() == 1.0
    assert approx_kl.item() == pytest.approx((ratio - 1) - 0.5, rel=1e-6)


# ---------------------------------------------------------------------------- save, load, determinism
def test_save_load_predicts_identically(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=3).learn(128)
    obs = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    path = tmp_path / "ppo_cartpole"
    model.save(path)
    assert (tmp_path / "ppo_cartpole.zip").exists()  # suffix added like SB3
    loaded = PPO.load(path)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    for name, tensor in model.critic.state_dict().items():
        torch.testing.assert_close(tensor, loaded.critic.state_dict()[name])
    assert loaded.num_timesteps == 128
    assert loaded.n_steps == 64 and loaded.batch_size == 32


def test_load_with_env_continues_training(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).learn(64)
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"))
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps == 128


def test_schedules_survive_save_as_their_current_value(tmp_path):
    def schedule(p: float) -> float:
        return 1e-3 * (0.5 + 0.5 * p)  # does not decay to 0 (a decayed one loads its initial value)

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=schedule, seed=0)
    model.learn(64)
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", custom_objects={"learning_rate": lambda p: 5e-4})
    assert loaded.lr_schedule(1.0) == 5e-4
    kept = PPO.load(tmp_path / "m.zip")
    assert kept.lr_schedule(1.0) == pytest.approx(schedule(max(model._current_progress_remaining, 0.0)))


def _run(seed: int) -> tuple[np.ndarray, dict]:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=seed).learn(256)
    obs = np.linspace(-1, 1, 40, dtype=np.float32).reshape(10, 4)
    with torch.no_grad():
        logits = model.actor.distribution_params(torch.as_tensor(obs, device=model.device)).cpu().numpy()
    return logits, copy.deepcopy(model.critic.state_dict())


def test_same_seed_gives_identical_results():
    a, critic_a = _run(7)
    b, critic_b = _run(7)
    c, _ = _run(8)
    np.testing.assert_array_equal(a, b)
    for k in critic_a:
        torch.testing.assert_close(critic_a[k], critic_b[k], rtol=0, atol=0)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("wrapper", ["none", "VecMonitor", "VecNormalize"])
def test_seed_reaches_a_supersuit_vector_env_below_vec_env_wrappers(wrapper):
    """SuperSuit's concat_vec_envs_v1 has no seed(): the seed goes to its reset(seed=...), also through the VecEnv
    wrappers a PettingZoo tutorial adds around it (with VecMonitor or VecNormalize it went nowhere before)."""
    import supersuit as ss
    from mpe2 import simple_spread_v3
    from stable_baselines3.common.vec_env import VecMonitor, VecNormalize

    wrap = {"none": lambda v: v, "VecMonitor": VecMonitor, "VecNormalize": VecNormalize}[wrapper]

    def rollout(seed: int) -> np.ndarray:
        team = ss.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env(N=2, max_cycles=5))
        venv = wrap(ss.concat_vec_envs_v1(team, 2, num_cpus=0, base_class="stable_baselines3"))
        model = PPO("MlpPolicy", venv, n_steps=8, batch_size=32, n_epochs=1, seed=seed).learn(32)
        return model.rollout_buffer.observations.copy()

    a, b, c = rollout(3), rollout(3), rollout(4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_a_seed_that_reaches_no_env_is_said():
    """A VecEnv whose seed() fails, with no Gymnasium-style vector env below it, is trained unseeded: with a warning."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    class Unseedable(DummyVecEnv):
        def seed(self, seed=None):
            raise NotImplementedError

    env = Unseedable([lambda: gym.make("CartPole-v1")])
    with pytest.warns(UserWarning, match=r"seed=5 was not applied to the env: Unseedable.seed\(\) failed"):
        PPO("MlpPolicy", env, n_steps=16, batch_size=16, seed=5).learn(16)


# ---------------------------------------------------------------------------- SB3 surface
def test_callbacks_called_at_sb3_points_and_can_stop_training():
    class Recorder(BaseCallback):
        def __init__(self):
            super().__init__()
            self.events = []

        def _on_training_start(self):
            self.events.append("start")

        def _on_rollout_start(self):
            self.events.append("rollout_start")

        def _on_step(self):
            assert {"rewards", "dones", "infos", "new_obs"} <= set(self.locals)
            self.events.append("step")
            return self.n_calls < 5

        def _on_rollout_end(self):
            self.events.append("rollout_end")

        def _on_training_end(self):
            self.events.append("end")

    cb = Recorder()
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, seed=0)
    model.learn(1000, callback=cb)
    assert cb.events == ["start", "rollout_start"] + ["step"] * 5 + ["end"]
    assert model.num_timesteps == 5


def test_logger_writes_sb3_keys(tmp_path):
    from stable_baselines3.common.logger import configure

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(64 * 3)
    with open(os.path.join(tmp_path, "progress.csv")) as f:
        header = f.readline().strip().split(",")
    for key in (
        "rollout/ep_rew_mean",
        "time/fps",
        "train/policy_gradient_loss",
        "train/value_loss",
        "train/entropy_loss",
        "train/approx_kl",
        "train/clip_fraction",
        "train/explained_variance",
    ):
        assert key in header


def test_target_kl_stops_epochs_early():
    model = PPO(
        "MlpPolicy", "CartPole-v1", n_steps=64, batch_size=16, n_epochs=50, learning_rate=0.05, target_kl=1e-6, seed=0
    )
    model.learn(64)  # one rollout, then training stops early: far fewer than 50 epochs
    model.train()
    assert model._n_updates < 50


# ---------------------------------------------------------------------------- clear errors
class SpaceEnv(gym.Env):
    def __init__(self, observation_space, action_space=None):
        self.observation_space = observation_space
        self.action_space = action_space or spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize(
    "space",
    [
        spaces.Graph(spaces.Box(0, 1, (2,)), None),
        spaces.Sequence(spaces.Discrete(3)),
        spaces.Text(5),
        spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2))),
    ],
    ids=["graph", "sequence", "text", "tuple"],
)
def test_unsupported_observation_space_is_named(space):
    with pytest.raises(ValueError, match="Unsupported observation space"):
        PPO("MlpPolicy", SpaceEnv(space))


def test_unsupported_action_space_is_named():
    with pytest.raises(ValueError, match="Unsupported action space Tuple") as err:
        PPO("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (2,)), spaces.Tuple((spaces.Discrete(2),))))
    assert "Discrete parts as one MultiDiscrete, Box parts as one Box" in str(err.value)  # the way to one space
    both = spaces.Dict({"move": spaces.Discrete(3), "speed": spaces.Box(0, 1, (1,))})
    with pytest.raises(ValueError, match="Unsupported action space Dict.*Wrap the env so that its Dict of actions"):
        PPO("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (2,)), both))
    with pytest.raises(ValueError, match="Unsupported action space Text") as err:
        PPO("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (2,)), spaces.Text(3)))
    assert "Wrap the env" not in str(err.value)  # no composite space to take apart


@pytest.mark.parametrize("agent", ["PPO", "SAC", "POCA"])
def test_an_action_space_of_no_numbers_is_refused_at_the_constructor(agent):
    """A Box of shape (0,) was taken, and learn and predict then failed with NumPy's "cannot reshape array of size
    0"."""
    import covey

    empty = spaces.Box(-1, 1, (0,), np.float32)
    if agent == "POCA":
        from covey.envs import EarlyExitEnv

        class NoActions(EarlyExitEnv):
            def action_space(self, agent):
                return empty

        env = NoActions
    else:
        env = SpaceEnv(spaces.Box(-1, 1, (2,), np.float32), empty)
    with pytest.raises(ValueError, match=r"The action space Box\(.*\(0,\), float32\) holds no numbers"):
        getattr(covey, agent)("MlpPolicy", env)


def test_predict_with_wrong_shape_says_what_it_expected():
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32)
    with pytest.raises(ValueError, match=r"shape \(3,\).*expects a single observation of shape \(4,\)"):
        model.predict(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="env.reset\\(\\) returns both"):
        model.predict((np.zeros(4, dtype=np.float32), {}))
    with pytest.raises(ValueError, match="NaN"):
        model.predict(np.full(4, np.nan, dtype=np.float32))
    # A dict for an array space (e.g. a POCA-style {agent: obs}) names the keys, not a shape of ()
    with pytest.raises(ValueError, match=r"is a dict with keys \['agent_0'\], but the observation space is Box"):
        model.predict({"agent_0": np.zeros(4, dtype=np.float32)})
    with pytest.raises(ValueError, match=r"is a list of dict, not numbers: the observation space Box"):
        model.predict([{"a": 1}, {"a": 2}])


@pytest.mark.parametrize("n_steps", [0, -5])
def test_non_positive_n_steps(n_steps):
    with pytest.raises(ValueError, match="n_steps"):
        PPO("MlpPolicy", "CartPole-v1", n_steps=n_steps)


def test_batch_size_larger_than_rollout_warns_and_uses_the_whole_rollout():
    with pytest.warns(UserWarning, match="batch_size=512 is larger than the rollout"):
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=512, n_epochs=1, seed=0)
    model.learn(64)
    assert model._n_updates == 1


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
def test_an_interrupted_update_has_counted_the_epochs_it_finished(monkeypatch, manual):
    """As SB3 counts them (one update per epoch, as it ends): a KeyboardInterrupt in the second epoch leaves
    n_updates at 1, the first epoch having moved the weights; the hand-written update counted whole updates."""
    import covey.agents.base as base_module

    monkeypatch.setattr(PPO, "manual_gradients", manual)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0)
    assert (model._manual is not None) == manual
    steps = [0]
    step = base_module.FlatParameters.step

    def interrupted(self, *args, **kwargs):
        steps[0] += 1
        if steps[0] == 3:  # the first minibatch of the second epoch
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(base_module.FlatParameters, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.learn(64)
    assert model._n_updates == 1
    monkeypatch.setattr(base_module.FlatParameters, "step", step)
    model.learn(64, reset_num_timesteps=False)
    assert model._n_updates == 3 and model.logger.name_to_value["train/n_updates"] == 3


def test_the_batch_size_warning_is_the_constructors_and_loads_only_where_load_changes_the_rollout(tmp_path):
    """As SB3's: ``load(path, env=...)`` of a model whose constructor warned does not warn again (a continued
    training run, RL-Zoo's ``-i``, repeated it); where load's env or arguments change the rollout, it warns."""
    import warnings

    with pytest.warns(UserWarning, match="batch_size=512 is larger than the rollout"):
        PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=512).save(tmp_path / "m")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPO.load(tmp_path / "m.zip", env="CartPole-v1")
        PPO.load(tmp_path / "m.zip").set_env(make_vec_env("CartPole-v1", n_envs=1))
        PPO.load(tmp_path / "m.zip", env="CartPole-v1", n_steps=64, batch_size=512)  # RL-Zoo's -i passes them again
    with pytest.warns(UserWarning, match=r"batch_size=512 is larger than the rollout \(n_steps \* n_envs = 128\)"):
        PPO.load(tmp_path / "m.zip", env=make_vec_env("CartPole-v1", n_envs=2))
    with pytest.warns(UserWarning, match=r"batch_size=48 does not divide the rollout \(n_steps \* n_envs = 64\)"):
        PPO.load(tmp_path / "m.zip", env="CartPole-v1", batch_size=48)


def test_sb3_rollout_buffer_classes_stand_for_covey_buffer_and_others_are_refused():
    from stable_baselines3.common.buffers import DictRolloutBuffer, ReplayBuffer
    from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

    dict_env = SpaceEnv(spaces.Dict({"x": spaces.Box(-1, 1, (2,), np.float32)}), spaces.Discrete(2))
    for cls, policy, env in (
        (SB3RolloutBuffer, "MlpPolicy", "CartPole-v1"),
        (DictRolloutBuffer, "MultiInputPolicy", dict_env),
    ):
        model = PPO(policy, env, n_steps=16, batch_size=16, n_epochs=1, rollout_buffer_class=cls, seed=0).learn(16)
        assert model.rollout_buffer.rewards.shape == (16, 1)
    with pytest.raises(NotImplementedError, match="rollout_buffer_class=.*ReplayBuffer.*Remove rollout_buffer_class"):
        PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=ReplayBuffer)
    with pytest.raises(NotImplementedError, match="rollout_buffer_kwargs=.*n_steps, gamma, gae_lambda"):
        PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=SB3RolloutBuffer, rollout_buffer_kwargs={"gamma": 0.5})


def test_bad_hyperparameters_name_the_field():
    with pytest.raises(ValueError, match="gamma"):
        PPO("MlpPolicy", "CartPole-v1", gamma=1.5)
    with pytest.raises(ValueError, match="Unknown policy"):
        PPO("LstmPolicy", "CartPole-v1")
    with pytest.raises(ValueError, match="Unknown policy_kwargs"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arc=[64]))
    for key in ("n_critics", "clip_mean"):  # SAC's, which SB3's PPO refuses too
        with pytest.raises(ValueError, match=rf"policy_kwargs {key} is SAC's .*not a setting of this agent"):
            PPO("MlpPolicy", "CartPole-v1", policy_kwargs={key: 3})
    with pytest.raises(ValueError, match="net_arch"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=dict(pi=[64], critic=[64])))


@pytest.mark.parametrize("agent", ["PPO", "SAC", "POCA"])
def test_hyperparameters_that_are_no_numbers_are_refused_at_the_constructor(agent):
    """A string read from a file ("3e-4"), None or a bool where a number goes: a clear error, not a TypeError
    from inside; activations and optimizers must be classes."""
    import covey

    cls = getattr(covey, agent)
    env = {"PPO": "CartPole-v1", "SAC": "Pendulum-v1", "POCA": EarlyExitEnv}[agent]
    for name, value in (("learning_rate", "3e-4"), ("learning_rate", None), ("gamma", "0.99"), ("gamma", True)):
        with pytest.raises(ValueError, match=rf"{agent}: {name}={value!r} is invalid: it must be a number"):
            cls("MlpPolicy", env, **{name: value})
    assert cls("MlpPolicy", env, learning_rate=lambda p: 1e-3 * p).lr_schedule(0.5) == 5e-4  # schedules stay fine
    for key, value, example in (
        ("activation_fn", "relu", "torch.nn.ReLU"),
        ("activation_fn", torch.nn.ReLU(), "torch.nn.ReLU"),
        ("optimizer_class", "adam", "torch.optim.Adam"),
    ):
        with pytest.raises(ValueError, match=rf"policy_kwargs {key}=.* is invalid: pass the class itself.*{example}"):
            cls("MlpPolicy", env, policy_kwargs={key: value})


@pytest.mark.parametrize("agent", ["PPO", "SAC", "POCA"])
def test_a_schedule_that_returns_no_step_size_or_clip_range_is_named_at_learn(agent):
    """A schedule's value was taken as it came: a learning rate that turned negative mid-run trained on as gradient
    ascent (SB3 too), text failed inside Adam, a clip range of None after the first rollout. Each is named at the
    start of learn or at the update that reads it; a schedule that decays to 0, as RL-Zoo's lin_ do, trains, and a
    last rollout past the budget reads it at 0 (SB3 reads SB3's documented linear schedule below 0 there)."""
    import covey

    cls = getattr(covey, agent)
    env = {"PPO": "CartPole-v1", "SAC": "Pendulum-v1", "POCA": EarlyExitEnv}[agent]
    small = {"SAC": dict(learning_starts=16)}.get(agent, dict(n_steps=32, batch_size=32, n_epochs=1))
    model = cls("MlpPolicy", env, learning_rate=lambda p: "x" if p < 1 else 1e-3, seed=0, **small)
    with pytest.raises(ValueError, match=rf"{agent}: the learning_rate schedule returned 'x' at progress_remaining="):
        model.learn(128)
    with pytest.raises(ValueError, match=r"learning_rate schedule returned 'x' at progress_remaining=1: it must"):
        cls("MlpPolicy", env, learning_rate=lambda p: "x", seed=0, **small)  # the optimizer's first step size
    model = cls("MlpPolicy", env, learning_rate=lambda p: 1e-3 if p > 0.5 else -1e-3, seed=0, **small)
    with pytest.raises(ValueError, match=r"returned -0.001 at progress_remaining=0.\d+: it must return a finite"):
        model.learn(128)
    assert all(group["lr"] >= 0 for opt in model._optimizers().values() for group in opt.param_groups)
    schedules = {"learning_rate": lambda p: 1e-3 * p}
    if agent != "SAC":
        schedules["clip_range"] = lambda p: 0.2 * p
    model = cls("MlpPolicy", env, seed=0, **schedules, **small).learn(100)  # PPO, POCA: 128 steps, to progress -0.28
    assert model.logger.name_to_value["train/learning_rate"] == 0.0  # read at 0 at the last update, not below it
    if agent != "SAC":
        assert model.logger.name_to_value["train/clip_range"] == 0.0
    if agent == "SAC":
        return
    for name, value in (("clip_range", None), ("clip_range", -0.2)) + (
        (("clip_range_vf", float("nan")),) * (agent == "PPO")
    ):
        model = cls("MlpPolicy", env, seed=0, **small, **{name: lambda p, v=value: v})
        with pytest.raises(ValueError, match=rf"the {name} schedule returned {re.escape(repr(value))} at progress_r"):
            model.learn(64)
        assert model.num_timesteps == 0  # named at the start of learn, before a rollout


@pytest.mark.parametrize("agent", ["PPO", "SAC", "POCA"])
def test_switches_take_true_or_false_not_text(agent):
    """``use_sde="no"`` turned gSDE on, ``normalize_advantage="False"`` normalized (SB3 reads them so too): a
    switch takes True, False, 0 or 1 (NumPy's bool too) and is kept as a bool."""
    import covey

    cls = getattr(covey, agent)
    env = {"PPO": "CartPole-v1", "SAC": "Pendulum-v1", "POCA": EarlyExitEnv}[agent]
    name = {"PPO": "normalize_advantage", "SAC": "use_sde", "POCA": "groupmate_rewards"}[agent]
    for value in ("False", "no", None, 2):
        with pytest.raises(ValueError, match=rf"{agent}: {name}={value!r} is invalid: it must be True or False"):
            cls("MlpPolicy", env, **{name: value})
    for value, kept in ((0, False), (1, True), (np.bool_(False), False), (True, True)):
        model = cls("MlpPolicy", env, **{name: value})
        assert getattr(model.config, name) is kept


def test_load_takes_the_files_policy_kwargs_and_a_number_of_copies_as_sb3s_does(tmp_path):
    """SB3's load takes policy_kwargs equal to the file's (and refuses others by name) and sets n_envs; covey
    called both unknown keywords."""
    policy_kwargs = dict(net_arch=dict(pi=[32], vf=[16]), activation_fn=torch.nn.ReLU, ortho_init=False)
    PPO("MlpPolicy", "CartPole-v1", policy_kwargs=policy_kwargs, n_steps=64, batch_size=64).save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", policy_kwargs=dict(policy_kwargs))
    assert loaded.policy_kwargs["net_arch"] == {"pi": [32], "vf": [16]}
    with pytest.raises(
        ValueError, match=r"PPO.load: policy_kwargs net_arch=\[64\] differ from the file's \(net_arch=\{'pi': \[32\]"
    ):
        PPO.load(tmp_path / "m.zip", policy_kwargs=dict(net_arch=[64]))
    loaded = PPO.load(tmp_path / "m.zip", n_envs=4.0)  # the copies it is to run, as SB3 sets the attribute
    assert loaded.n_envs == 4 and loaded.rollout_buffer.n_envs == 4
    loaded.set_env(make_vec_env("CartPole-v1", n_envs=4))
    assert loaded.learn(256).num_timesteps == 256
    with pytest.raises(ValueError, match=r"n_envs=4, but the env has 2 copies: the model runs the env's copies"):
        PPO.load(tmp_path / "m.zip", env=make_vec_env("CartPole-v1", n_envs=2), n_envs=4)
    assert PPO.load(tmp_path / "m.zip", env=make_vec_env("CartPole-v1", n_envs=2), n_envs=2).n_envs == 2
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match=rf"PPO.load: n_envs={bad!r} is invalid: it must be an int >= 1"):
            PPO.load(tmp_path / "m.zip", n_envs=bad)


def test_load_takes_policy_kwargs_as_sb3_wrote_them_and_poca_the_copies_asked_for(tmp_path):
    """SB3's SAC writes use_sde into its policy_kwargs, and an sb3-contrib RecurrentPPO file's memory size is read
    off its weights: a script that passes its SB3 model's policy_kwargs again loads. POCA.load(path, n_envs=4)
    runs 4 copies, where it kept the file's."""
    import stable_baselines3 as sb3
    from sb3_contrib import RecurrentPPO

    from covey import POCA, SAC

    sb3_sac = sb3.SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[32, 32]))
    sb3_sac.save(tmp_path / "sac.zip")
    assert "use_sde" in sb3_sac.policy_kwargs
    assert SAC.load(tmp_path / "sac.zip", policy_kwargs=sb3_sac.policy_kwargs).policy_kwargs["net_arch"] == [32, 32]
    with pytest.raises(ValueError, match=r"SAC.load: policy_kwargs net_arch=\[64\] differ from the file's \(net_arch="):
        SAC.load(tmp_path / "sac.zip", policy_kwargs=dict(net_arch=[64]))
    with pytest.raises(ValueError, match=r"policy_kwargs log_std_init=-1 differ from the file's \(no log_std_init\)"):
        SAC.load(tmp_path / "sac.zip", policy_kwargs=dict(net_arch=[32, 32], log_std_init=-1))
    recurrent = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, policy_kwargs={})
    recurrent.save(tmp_path / "recurrent.zip")
    loaded = PPO.load(tmp_path / "recurrent.zip", policy_kwargs=recurrent.policy_kwargs)
    assert loaded.policy.actor.memory.hidden_size == 256  # read off the weights, beside the asked policy_kwargs
    POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0).save(tmp_path / "poca.zip")
    poca = POCA.load(tmp_path / "poca.zip", n_envs=4)
    assert poca.n_envs == 4 and poca.rollout_buffer.n_envs == 4
    poca.set_env(EarlyExitEnv)
    assert poca.env.num_envs == 4 and poca.learn(64).num_timesteps == 64


def test_load_with_mismatched_env_names_both_spaces(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match=r"Observation spaces do not match.*Box.*\(4,\).*Box.*\(3,\)"):
        PPO.load(tmp_path / "m.zip", env="Pendulum-v1")


def test_no_env_says_how_to_give_one():
    with pytest.raises(ValueError, match="needs an env"):
        PPO("MlpPolicy", None)


@pytest.mark.parametrize(
    "policy_kwargs, message",
    [
        ({"memory": True}, r"memory=True is invalid: pass a dict"),
        ({"memory": {"hidden_size": 8.9}}, r"memory hidden_size=8.9 is invalid: it must be an int >= 1"),
        ({"memory": {"sequence_length": 0}}, r"memory sequence_length=0 is invalid"),
        ({"memory": {"kind": "rnn"}}, r"memory kind='rnn' is invalid: use 'lstm' or 'gru'"),
        ({"value_head": "twohot", "num_buckets": 10.5}, r"num_buckets=10.5 is invalid: it must be an int >= 2"),
        ({"value_head": "twohot", "bucket_range": "(-5, 5)"}, r"bucket_range='\(-5, 5\)' is invalid"),
        ({"value_head": "twohot", "bucket_range": (5, -5)}, r"bucket_range=\(5, -5\) is invalid"),
        ({"critic_ema_decay": 0.9, "critic_ema_coef": -1.0}, r"critic_ema_coef=-1.0 is invalid"),
        ({"critic_ema_coef": 2.0}, r"critic_ema_coef weighs the regularizer that critic_ema_decay turns on"),
        ({"entity_encoder": "yes"}, r"entity_encoder='yes' is invalid"),
    ],
)
def test_coveys_own_policy_kwargs_are_checked_by_name(policy_kwargs, message):
    """SB3 has none of these keys to check: a value of the wrong kind is named at the constructor, where it
    failed inside torch or was truncated silently (hidden_size=8.9 became 8)."""
    with pytest.raises(ValueError, match=message):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=policy_kwargs)


@pytest.mark.parametrize("name", ["clip_range", "clip_range_vf"])
def test_clip_ranges_set_on_the_model_are_checked_and_read_back_as_schedules(name):
    """SB3 keeps clip_range as a schedule on the model; a number assigned there broke the next update ("'float'
    object is not callable"), and a bad one was taken. Now either form is checked, trained with and saved."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, clip_range_vf=0.5, seed=0)
    with pytest.raises(ValueError, match=rf"{name}=-1.0 is invalid"):
        setattr(model, name, -1.0)
    setattr(model, name, 0.15)
    assert getattr(model, name)(1.0) == 0.15 and getattr(model.config, name) == 0.15
    model.learn(64)
    if name == "clip_range":
        assert model.logger.name_to_value["train/clip_range"] == pytest.approx(0.15)
    setattr(model, name, lambda progress: 0.05 + 0.1 * progress)  # a schedule, as SB3's
    model.learn(32, reset_num_timesteps=False)
    assert getattr(model, name)(0.5) == pytest.approx(0.1)


def test_whole_floats_in_whole_number_settings_are_taken_and_others_are_named():
    """``buffer_size=1e6`` as YAML files and scientific notation write it (SB3 fails inside NumPy on it)."""
    from covey import SAC

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64.0, batch_size=32.0, n_epochs=2.0, stats_window_size=10.0)
    assert (model.n_steps, model.batch_size, model.n_epochs, model.stats_window_size) == (64, 32, 2, 10)
    assert all(type(v) is int for v in (model.n_steps, model.batch_size, model.n_epochs, model.stats_window_size))
    model.learn(64)
    assert model.rollout_buffer.n_steps == 64
    sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=1e4, learning_starts=1e2)
    assert sac.buffer_size == 10_000 and sac.replay_buffer.capacity == 10_000 and sac.learning_starts == 100
    with pytest.raises(ValueError, match=r"buffer_size=10000.5 is invalid: it must be a whole number"):
        SAC("MlpPolicy", "Pendulum-v1", buffer_size=1e4 + 0.5)
    with pytest.raises(ValueError, match=r"stats_window_size=2.5 is invalid: it must be a whole number"):
        PPO("MlpPolicy", "CartPole-v1", stats_window_size=2.5)


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
def test_a_target_kl_stop_is_printed_as_sb3_prints_it(manual, capsys, tmp_path, monkeypatch):
    """With verbose=1, SB3 prints its early-stop line whatever the logger writes to; covey sent its own wording to
    the logger, so a csv-only logger showed nothing."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.logger import configure

    monkeypatch.setattr(PPO, "manual_gradients", manual)
    lines = {}
    for agent in (PPO, sb3.PPO):
        model = agent("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=16, target_kl=1e-6, verbose=1, seed=0)
        model.set_logger(configure(str(tmp_path / agent.__module__), ["csv"]))
        capsys.readouterr()
        model.learn(128)
        out = capsys.readouterr().out.splitlines()
        lines[agent] = [line for line in out if line.startswith("Early stopping")]
    assert len(lines[PPO]) == len(lines[sb3.PPO]) == 2
    for line in lines[PPO]:
        assert re.fullmatch(r"Early stopping at step 0 due to reaching max kl: \d+\.\d\d", line), line


@pytest.mark.parametrize("which", ["lstm", "squashed-sde", "sac", "poca"])
def test_training_updates_whatever_grad_mode_the_process_is_in(which):
    """An interrupt can land inside a ``torch.no_grad()`` block after it switched gradients off and before its
    ``with`` body began, leaving them off for the process: the autograd updates then failed ("element 0 of
    tensors does not require grad"). Training turns them on for its updates."""
    from covey import POCA, SAC

    if which == "lstm":
        model = PPO("MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0)
    elif which == "squashed-sde":
        kwargs = dict(use_sde=True, policy_kwargs=dict(squash_output=True))
        model = PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, seed=0, **kwargs)
    elif which == "sac":
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10, batch_size=16, seed=0, use_sde=True)
    else:
        model = POCA("MlpPolicy", EarlyExitEnv, n_steps=16, batch_size=32, seed=0)
    before = [p.detach().clone() for p in model.policy.parameters()]
    torch.set_grad_enabled(False)
    try:
        model.learn(64)
    finally:
        torch.set_grad_enabled(True)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_a_rollout_of_one_sample_trains_without_warnings_as_sb3s_does():
    """SB3 takes n_steps * n_envs == 1 with normalize_advantage=False; covey's train/value_std of one value
    warned (torch's degrees of freedom) at every update and was logged as NaN."""
    import warnings

    from stable_baselines3.common.logger import KVWriter, Logger

    rows = []

    class Rows(KVWriter):
        def write(self, key_values, key_excluded, step=0):
            rows.append(dict(key_values))

        def close(self):
            pass

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=1, batch_size=1, normalize_advantage=False, n_epochs=2, seed=0)
    model.set_logger(Logger(None, [Rows()]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn(3)
    assert model._n_updates == 6 and len(rows) == 3
    assert all("train/value_std" not in row for row in rows) and "train/value_mean" in rows[-1]


def test_a_callback_can_assign_the_rollout_buffers_fields_as_in_sb3():
    """SB3's buffer fields are plain arrays, which callbacks reassign in ``_on_rollout_end``
    (``rb.advantages = ...``); covey's were read-only properties. An assignment goes into the buffer, and the update
    trains on it: zero advantages and no value or entropy loss leave the actor as it was."""
    import stable_baselines3

    import covey

    class Assign(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            rb = self.locals["rollout_buffer"]
            rb.returns = rb.returns + 1.0
            self.returns = rb.returns.copy()
            rb.advantages = np.zeros_like(rb.advantages)
            rb.log_probs = rb.log_probs  # every field takes its own values back
            rb.values, rb.actions, rb.observations = rb.values, rb.actions, rb.observations

    kwargs = dict(n_steps=32, batch_size=16, n_epochs=2, ent_coef=0.0, vf_coef=0.0, seed=0)
    for lib in (stable_baselines3, covey):
        model = lib.PPO("MlpPolicy", "CartPole-v1", **kwargs)
        actor = [p.detach().clone() for name, p in model.policy.named_parameters() if "value" not in name]
        assign = Assign()
        model.learn(32, callback=assign)
        after = [p.detach() for name, p in model.policy.named_parameters() if "value" not in name]
        assert all(torch.equal(a, b) for a, b in zip(actor, after)), lib.__name__
        np.testing.assert_array_equal(model.rollout_buffer.returns, assign.returns)
    with pytest.raises(ValueError, match=r"rollout_buffer.advantages = an array of shape \(3,\).*\(32, 1\)"):
        model.rollout_buffer.advantages = np.zeros(3)


def test_callbacks_see_the_policy_in_evaluation_mode_and_a_cleared_buffer_as_in_sb3():
    """During a rollout SB3's policy reads ``training`` False, and at ``_on_rollout_start`` its buffer holds nothing
    of the last rollout (covey's policy read True, and its buffer the last rollout's rewards and returns)."""
    import stable_baselines3

    import covey

    class Look(BaseCallback):
        def __init__(self):
            super().__init__()
            self.modes, self.sums = set(), []

        def _on_rollout_start(self) -> None:
            rb = self.model.rollout_buffer
            self.sums.append([float(np.abs(getattr(rb, k)).sum()) for k in ("rewards", "returns", "advantages")])

        def _on_step(self) -> bool:
            self.modes.add(self.model.policy.training)
            return True

    for lib in (stable_baselines3, covey):
        look = Look()
        model = lib.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, seed=0)
        model.learn(48, callback=look)
        assert look.modes == {False} and look.sums == [[0.0, 0.0, 0.0]] * 3, lib.__name__
        assert model.policy.training  # left in training mode after the update, as SB3 leaves it
