"""policy_kwargs ``normalize_observations=True``: running statistics of the collected observations, standardizing
them in front of every network's encoder, saved with the model (ALGORITHMS.md, "Observation normalization")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback

from covey import POCA, PPO, SAC
from covey.envs import EarlyExitEnv
from covey.networks.encoders import NormalizedEncoder, RunningNormalizer
from tests.envs import DictTeam, SpaceEnv, image_space, needs_onnx_exporter

NORMALIZED = dict(normalize_observations=True)
# A Box whose features sit far from 0 and at very different scales: what standardizing is for.
SCALED = spaces.Box(np.array([-1000, 4, 0], np.float32), np.array([3000, 6, 0.01], np.float32))


def standardized(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, clip: float = 10.0) -> torch.Tensor:
    scale = torch.rsqrt(var.float() + 1e-8)
    return ((x.float() - mean.float()) * scale).clamp(-clip, clip)


def encoders(model) -> list[NormalizedEncoder]:
    found = {id(m): m for net in model._networks().values() for m in net.modules() if isinstance(m, NormalizedEncoder)}
    return list(found.values())


class RolloutObservations(BaseCallback):
    """The observations of each rollout (as stored, before its update) and the statistics' count as it starts."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts, self.counts = [], []

    def _on_rollout_start(self) -> None:
        self.counts.append(float(encoders(self.model)[0].normalizer.count))

    def _on_rollout_end(self) -> None:
        self.rollouts.append(self.model._rollout_observations().clone())

    def _on_step(self) -> bool:
        return True


def test_the_running_statistics_are_those_of_all_batches_taken_together():
    """Chan et al.'s merge: batches of any sizes give the mean and (population) variance of their concatenation;
    positions outside the mask pass through bit for bit; values are clipped."""
    rng = np.random.default_rng(0)
    batches = [rng.normal([5.0, -300.0], [0.1, 40.0], size=(n, 2)).astype(np.float32) for n in (1, 7, 64, 3)]
    norm = RunningNormalizer((2,))
    for batch in batches:
        norm.update(torch.as_tensor(batch))
    norm.update(torch.zeros(0, 2))  # an empty batch changes nothing
    everything = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), everything.var(0), rtol=1e-10)
    assert float(norm.count) == len(everything)
    x = torch.tensor([[5.0, -300.0], [1e6, -1e6]])
    torch.testing.assert_close(norm(x), standardized(x, norm.mean, norm.var))
    assert norm(x)[1].tolist() == [10.0, -10.0]  # clipped
    masked = RunningNormalizer((2,), clip=3.0, positions=[False, True])
    masked.update(torch.as_tensor(everything))
    out = masked(x)
    assert torch.equal(out[:, 0], x[:, 0]) and out[1, 1] == -3.0


def test_ppo_acts_on_statistics_of_the_rollouts_before_and_takes_each_after_its_update():
    """The first rollout acts on the raw observations (mean 0, variance 1); each rollout's observations join the
    statistics after the update that trains on them (its log-probabilities and values were computed with the
    statistics it acted with). predict never changes them. Actor and critic encoders (separate here) agree."""
    env = SpaceEnv(SCALED, spaces.Discrete(2))
    seen = RolloutObservations()
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=32,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(NORMALIZED, share_features_extractor=False),
    )
    model.learn(96, callback=seen)
    assert seen.counts == [0.0, 32.0, 64.0]
    actor, critic = model.actor.encoder.normalizer, model.critic.encoder.normalizer
    assert actor is not critic and len(encoders(model)) == 2
    collected = torch.cat(seen.rollouts).double()
    torch.testing.assert_close(actor.mean, collected.mean(0), rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(actor.var, collected.var(0, unbiased=False), rtol=1e-9, atol=1e-12)
    assert torch.equal(actor.mean, critic.mean) and torch.equal(actor.var, critic.var)
    before = actor.mean.clone()
    model.predict(np.full((5, 3), 1e4, np.float32))
    assert torch.equal(actor.mean, before) and float(actor.count) == 96
    # the encoders standardize what they are given; the networks behind them see numbers near 0
    obs = torch.as_tensor(SCALED.sample()[None])
    torch.testing.assert_close(model.actor.encoder.normalize(obs), standardized(obs, actor.mean, actor.var))
    assert model.actor.encoder.normalize(collected.float()).abs().mean() < 2.0


def test_observations_pass_as_they_are_until_the_first_statistics_and_keep_their_shape():
    """Before any data the encoder is the identity (not a clip at +-10 of the raw values); observations of more
    than one dimension are standardized element by element, by the networks and by PPO's NumPy acting alike."""
    grid = spaces.Box(-1000.0, 1000.0, (3, 4), np.float32)
    model = PPO("MlpPolicy", SpaceEnv(grid, spaces.Discrete(2)), n_steps=32, batch_size=32, n_epochs=1, seed=0,
                policy_kwargs=NORMALIZED)  # fmt: skip
    obs = torch.as_tensor(np.array([grid.sample() for _ in range(4)]))
    assert torch.equal(model.actor.encoder.normalize(obs), obs)  # values up to 1000, as they are
    model.learn(64)
    normalizer = model.actor.encoder.normalizer
    assert normalizer.mean.shape == (3, 4) and float(normalizer.count) == 64
    torch.testing.assert_close(model.actor.encoder.normalize(obs), standardized(obs, normalizer.mean, normalizer.var))
    assert model._numpy_acting is not None
    with torch.no_grad():
        expected = model.actor.distribution_params(obs).numpy()
    np.testing.assert_allclose(model._numpy_acting.forward(obs.numpy()), expected, atol=1e-5)


def test_a_features_extractor_behind_the_statistics_is_still_sb3s_features_extractor():
    from tests.envs import NormExtractor

    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(NORMALIZED, features_extractor_class=NormExtractor))
    assert isinstance(model.policy.features_extractor, NormExtractor)
    assert model.policy.features_extractor_class is NormExtractor


class NaNAt(SpaceEnv):
    """SpaceEnv whose observation after its step ``at`` is NaN."""

    at = 12

    def step(self, action):
        obs, *rest = super().step(action)
        return (np.full_like(obs, np.nan) if self._t == self.at else obs), *rest


class NaNReset(SpaceEnv):
    """SpaceEnv whose second episode starts with a NaN observation."""

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        self.resets = getattr(self, "resets", 0) + 1
        return (np.full_like(obs, np.nan) if self.resets == 2 else obs), info


@pytest.mark.parametrize("where", ["step", "reset"])
def test_sac_statistics_take_no_observation_the_finiteness_check_refuses(where):
    """A NaN observation stops learn with its error before it reaches the statistics, which made every later
    prediction NaN; a reset's observation, checked only as the next step's, waits for that check too."""
    actions = spaces.Box(-1.0, 1.0, (1,), np.float32)
    env = NaNAt(SCALED, actions, episode_length=50) if where == "step" else NaNReset(SCALED, actions, episode_length=5)
    model = SAC("MlpPolicy", env, learning_starts=2, batch_size=4, seed=0, policy_kwargs=NORMALIZED)
    with pytest.raises(ValueError, match="NaN or infinite observations"):
        model.learn(20)
    normalizer = model.actor.encoder.normalizer
    assert float(normalizer.count) == (11 if where == "step" else 4) and torch.isfinite(normalizer.mean).all()
    assert np.isfinite(model.predict(SCALED.sample())[0]).all()


def test_sac_takes_every_collected_observation_into_every_networks_statistics():
    """SAC updates the statistics with each step's observations (warm-up steps too); its target critic and critic
    EMA hold the same statistics as the actor and the critic (each updated, not averaged)."""
    env = SpaceEnv(SCALED, spaces.Box(-1.0, 1.0, (1,), np.float32))
    observed = []

    class NewObservations(BaseCallback):
        def _on_step(self) -> bool:
            observed.append(np.array(self.locals["new_obs"]))
            return True

    model = SAC(
        "MlpPolicy",
        env,
        learning_starts=10,
        batch_size=8,
        seed=0,
        policy_kwargs=dict(NORMALIZED, critic_ema_decay=0.9),
    )
    model.learn(30, callback=NewObservations())
    found = encoders(model)
    assert len(found) == 4  # actor, critic, target critic, critic EMA
    collected = np.concatenate(observed).astype(np.float64)
    for encoder in found:
        np.testing.assert_allclose(encoder.normalizer.mean.numpy(), collected.mean(0), rtol=1e-12)
        np.testing.assert_allclose(encoder.normalizer.var.numpy(), collected.var(0), rtol=1e-9)
        assert float(encoder.normalizer.count) == 30


def test_poca_takes_the_observations_of_agents_that_acted_only():
    """Slots of agents that left hold zeros in the rollout: they are not observations, and stay out of the
    statistics; the actor's and the critic's agree."""
    seen = RolloutObservations()
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=16, n_epochs=1, seed=0,
                 policy_kwargs=NORMALIZED)  # fmt: skip
    model.learn(32, callback=seen)
    buffer = model.rollout_buffer
    assert (~buffer.present_tensor).any()  # agents left during the rollout
    acted = seen.rollouts[0].double()
    assert acted.shape[0] == int(buffer.present_tensor.sum()) < buffer.present_tensor.numel()
    actor, critic = model.actor.encoder.normalizer, model.critic.encoder.normalizer
    torch.testing.assert_close(actor.mean, acted.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(actor.var, acted.var(0, unbiased=False), rtol=1e-9, atol=1e-12)
    assert torch.equal(actor.mean, critic.mean) and float(critic.count) == acted.shape[0]


def test_dict_observations_standardize_their_box_keys_only():
    """Per observation key: a Box key is standardized; an image key and a Discrete key pass as they are (images
    are scaled by normalize_images). A team's flattened Dict keeps the other keys' positions untouched."""
    space = spaces.Dict(
        {"vec": SCALED, "image": image_space((36, 36, 1)), "slot": spaces.Discrete(3), "bits": spaces.MultiBinary(2)}
    )
    model = PPO("MultiInputPolicy", SpaceEnv(space, spaces.Discrete(2)), n_steps=16, batch_size=16, n_epochs=1,
                seed=0, policy_kwargs=NORMALIZED).learn(32)  # fmt: skip
    normalizers = model.actor.encoder.normalizer
    assert list(normalizers) == ["vec"] and float(normalizers["vec"].count) == 32
    obs = {key: torch.as_tensor(np.array([sub.sample()])) for key, sub in space.spaces.items()}
    out = model.actor.encoder.normalize(obs)
    for key in ("image", "slot", "bits"):
        assert out[key] is obs[key]
    torch.testing.assert_close(out["vec"], standardized(obs["vec"], normalizers["vec"].mean, normalizers["vec"].var))

    team = POCA("MultiInputPolicy", DictTeam(slot=True, view=True), n_steps=8, batch_size=8, n_epochs=1, seed=0,
                policy_kwargs=NORMALIZED).learn(16)  # fmt: skip
    flat = team.actor.encoder.encoder.flat
    positions = team.actor.encoder.normalizer.positions
    start, end = flat.bounds["obs"]
    assert positions[start:end].all() and int(positions.sum()) == end - start


def test_the_statistics_are_saved_and_loaded_with_the_model(tmp_path):
    """They are part of the weights: save/load, get_parameters/set_parameters and a saved policy act the same;
    a model loaded without them (another model's parameters) acts otherwise."""
    env = SpaceEnv(SCALED, spaces.Box(-1.0, 1.0, (2,), np.float32))
    kwargs = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=NORMALIZED)
    model = PPO("MlpPolicy", env, seed=0, **kwargs).learn(64)
    obs = np.array([SCALED.sample() for _ in range(16)])
    actions = model.predict(obs, deterministic=True)[0]
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model.zip")
    assert loaded.policy_kwargs["normalize_observations"] is True
    assert torch.equal(loaded.actor.encoder.normalizer.var, model.actor.encoder.normalizer.var)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], actions)
    fresh = PPO("MlpPolicy", env, seed=0, **kwargs)
    params = model.get_parameters()
    params["policy"] = {k: v for k, v in params["policy"].items() if "normalizer" not in k}
    fresh.set_parameters(params, exact_match=False)  # the weights alone: the statistics are fresh
    assert not np.array_equal(fresh.predict(obs, deterministic=True)[0], actions)
    fresh.set_parameters(model.get_parameters())
    np.testing.assert_array_equal(fresh.predict(obs, deterministic=True)[0], actions)


@needs_onnx_exporter()
def test_an_exported_policy_standardizes_as_the_model(tmp_path):
    pytest.importorskip("onnxruntime")
    from covey.export import export_onnx

    env = SpaceEnv(SCALED, spaces.Box(-1.0, 1.0, (2,), np.float32))
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=NORMALIZED)
    model.learn(64)
    assert float(model.actor.encoder.normalizer.count) == 64
    assert export_onnx(model, tmp_path / "policy.onnx")["verified"]


def test_settings_that_cannot_hold_are_refused_by_name():
    image_env = SpaceEnv(image_space((36, 36, 1)), spaces.Discrete(2))
    with pytest.raises(ValueError, match="normalize_observations=True has nothing to standardize"):
        PPO("CnnPolicy", image_env, policy_kwargs=NORMALIZED)
    with pytest.raises(ValueError, match="normalize_observations=True has nothing to standardize"):
        SAC("MlpPolicy", SpaceEnv(spaces.Discrete(4), spaces.Box(-1, 1, (1,))), policy_kwargs=NORMALIZED)
    with pytest.raises(ValueError, match="normalize_observations=True and entity_encoder=True cannot go together"):
        PPO("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (4, 3)), spaces.Discrete(2)),
            policy_kwargs=dict(NORMALIZED, entity_encoder=True))  # fmt: skip
    with pytest.raises(ValueError, match="observation_clip bounds the values that normalize_observations=True"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(observation_clip=5.0))
    with pytest.raises(ValueError, match="observation_clip=0 is invalid"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(NORMALIZED, observation_clip=0))
    with pytest.raises(ValueError, match="normalize_observations='yes' is invalid"):
        POCA("MlpPolicy", EarlyExitEnv(), policy_kwargs=dict(normalize_observations="yes"))
    clipped = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(NORMALIZED, observation_clip=2.5))
    clipped.actor.encoder.normalizer.update(torch.randn(16, 4))
    assert clipped.actor.encoder.normalizer(torch.full((1, 4), 100.0)).tolist() == [[2.5] * 4]


@pytest.mark.slow
def test_ppo_learns_cartpole_with_scaled_and_shifted_observations():
    """The statistics at work: CartPole's observations multiplied by up to 1000 and shifted by up to 500 (PPO
    without them ended at 182-281 here), the deterministic policy balancing the pole to the time limit."""
    import gymnasium as gym
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    class Scaled(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)

        def observation(self, obs):
            return (obs * np.array([100, 30, 1000, 30]) + np.array([500, -200, 50, 100])).astype(np.float32)

    model = PPO("MlpPolicy", Scaled(gym.make("CartPole-v1")), n_steps=256, batch_size=64, learning_rate=1e-3,
                seed=0, policy_kwargs=NORMALIZED)  # fmt: skip
    model.learn(30_000)
    mean, _ = evaluate_policy(model, Monitor(Scaled(gym.make("CartPole-v1"))), n_eval_episodes=10, deterministic=True)
    assert mean >= 475.0
